"""Training stacks (shardplan/inputs/stacks.py) and the knobs they set: every knob is a memory term, and
each test here fails if its knob is ignored. Expected values are derived in the comments from the
formulas' cited mechanisms; integer byte counts compare exactly unless a tolerance is stated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tomllib

from shardplan.formulas.columns import columns_for, model_values
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.model_states import (
    AWQ_BYTES_PER_PARAM,
    GPTQ_BYTES_PER_PARAM,
    GPTQ_SHARDABLE_BYTES_PER_PARAM,
    NF4_BYTES_PER_PARAM,
)
from shardplan.inputs import strategy as st
from shardplan.inputs.allocator_profile import default_allocator
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import get_model
from shardplan.inputs.query import parse_query
from shardplan.inputs.stacks import ENGINE_DEFAULTS, resolve_stack, stack_profiles
from shardplan.planning.fit import evaluate, fit
from shardplan.support.errors import ShardplanError

ROOT = Path(__file__).resolve().parents[1]
SPEC = get_model("llama-2-7b")


def mem(config: TrainingConfig, gpus: str = "1xh100-sxm", spec=SPEC):
    cluster = parse_gpus(gpus)
    return estimate_memory(columns_for(spec, cluster, config)), cluster


# --- profiles ------------------------------------------------------------------------------------
def test_every_stack_has_a_profile_with_sources_and_ships_as_package_data():
    names = [p.name for p in stack_profiles()]
    assert names == list(st.STACKS)
    for p in stack_profiles():
        for d in list(p.defaults.values()) + [d for rule in p.overrides for d in rule.set.values()]:
            assert len(d.source) > 20, (p.name, d)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["shardplan"]
    assert "data/stack_profiles/*.json" in package_data


def test_unknown_stack_is_a_one_line_error():
    with pytest.raises(ShardplanError, match="stack"):
        resolve_stack(TrainingConfig(stack="deepspeed-chat"), 1)


def test_explicit_knobs_beat_the_stack_and_single_gpu_defaults_apply_on_one_gpu():
    tt = TrainingConfig(stack="torchtune")
    one, eight = resolve_stack(tt, 1), resolve_stack(tt, 8)
    # torchtune 8B_full_single_device.yaml: PagedAdamW8bit + optimizer_in_bwd; distributed: neither
    assert one.optimizer == "adamw-8bit" and one.paged_optimizer and one.optimizer_in_backward
    assert eight.optimizer == "adamw" and not eight.paged_optimizer and not eight.optimizer_in_backward
    assert one.ce_chunks == 8 and one.ac == "full"
    # torchtune's recipes train in pure bf16 (dtype: bf16): no fp32 master, whatever the GPU count
    assert one.precision == eight.precision == "bf16-pure" and eight.fp32_master is False
    # its LoRA recipes: q,v adapters of rank 8 without checkpointing on several GPUs (8B_lora.yaml)
    lora = resolve_stack(TrainingConfig(stack="torchtune", method="lora"), 8)
    assert (lora.lora_targets, lora.lora_rank, lora.ac, lora.optimizer_in_backward) == ("qv", 8, "none", False)
    lora1 = resolve_stack(TrainingConfig(stack="torchtune", method="lora"), 1)
    assert lora1.optimizer == "adamw" and not lora1.optimizer_in_backward and lora1.lora_targets == "all-linear"
    mine = resolve_stack(TrainingConfig(stack="torchtune", ce_chunks=0, optimizer="adamw", ac="none"), 1)
    assert mine.ce_chunks == 0 and mine.optimizer == "adamw" and mine.ac == "none"
    assert resolve_stack(one, 1) == one  # idempotent
    stated = resolve_stack(TrainingConfig(stack="torchtune", precision="bf16-mixed"), 8)
    assert stated.precision == "bf16-mixed" and stated.fp32_master  # the user's precision wins
    kept = resolve_stack(TrainingConfig(stack="lightning", fp32_master=True), 8)
    assert kept.precision == "bf16-mixed" and kept.fp32_master  # ... and so does a stated master copy
    hf = resolve_stack(TrainingConfig(), 4)
    assert hf.stack == "hf" and hf.load_mode == "rank0_broadcast" and hf.precision == "bf16-mixed" and hf.fp32_master
    assert resolve_stack(TrainingConfig(), 1).load_mode == "full_per_gpu"


def test_plain_stack_with_knobs_off_reproduces_the_stackless_numbers():
    """Columns built without stack knobs (the numbers before stacks) equal an explicit config
    with every knob at ENGINE_DEFAULTS."""
    from shardplan.formulas.columns import Columns, cluster_values
    cluster = parse_gpus("4xh100-sxm")
    cfg = TrainingConfig(strategy="full_shard", **{k: v for k, v in ENGINE_DEFAULTS.items() if v is not None})
    with_knobs = estimate_memory(columns_for(SPEC, cluster, cfg))
    from shardplan.inputs.stacks import knob_values
    knobs = {k: v for k, v in knob_values(cfg, cluster).items()
             if k not in ENGINE_DEFAULTS and k != "stack"}
    bare = estimate_memory(Columns.build(**model_values(SPEC), **cluster_values(cluster), **knobs))
    for key in ("peak_allocated_bytes", "device_total_bytes", "host_bytes_per_node"):
        assert int(with_knobs[key]) == int(bare[key])


# --- single --------------------------------------------------------------------------------------
def test_one_gpu_defaults_to_single_with_no_wrapper_buffers():
    cluster = parse_gpus("1xh100-sxm")
    results = fit(SPEC, cluster, TrainingConfig(method="lora"))
    assert [r.strategy for r in results] == ["single"]
    m, _ = mem(TrainingConfig(strategy="single", method="lora", ac="full"))
    for term in ("unsharded_params", "all_gather_buffers", "reduce_scatter_buffers", "root_unsharded", "grad_buckets"):
        assert int(m[term]) == 0, term
    # CUDA context only (allocator.json, measured), no NCCL communicator
    assert int(m["non_torch_bytes"]) == default_allocator().cuda_context_bytes
    full = estimate_memory(columns_for(SPEC, cluster, TrainingConfig(strategy="single")))
    assert int(full["params"]) == 4 * SPEC.total_params  # the fp32 weights whole on the one GPU
    ddp = estimate_memory(columns_for(SPEC, cluster, TrainingConfig(strategy="ddp")))
    assert int(ddp["grad_buckets"]) > 0 and int(full["grad_buckets"]) == 0


def test_single_needs_one_gpu():
    with pytest.raises(ShardplanError, match="one GPU"):
        fit(SPEC, parse_gpus("2xh100-sxm"), TrainingConfig(), strategies=["single"])
    m, _ = mem(TrainingConfig(strategy="single"), "2xh100-sxm")
    assert not bool(m["valid"])


# --- optimizer in backward -----------------------------------------------------------------------
def test_optimizer_in_backward_frees_the_full_gradient_but_keeps_optimizer_states():
    base = TrainingConfig(strategy="single", ac="full", stack="plain")
    off, _ = mem(base)
    on, _ = mem(base.model_copy(update={"optimizer_in_backward": True}))
    assert int(on["optimizer_states"]) == int(off["optimizer_states"]) == 8 * SPEC.total_params
    # without: the step holds every fp32 gradient (4Ψ) and foreach AdamW's sqrt(v) copy (4Ψ); with
    # it, one parameter's gradient and temporaries (the largest module: the 32000x4096 embedding)
    one_param = math.ceil(4 * SPEC.total_params * SPEC.largest_module_params / SPEC.total_params)
    assert int(off["optimizer_step_peak_bytes"]) - int(on["optimizer_step_peak_bytes"]) == 8 * SPEC.total_params - 2 * one_param
    assert int(on["optimizer_step_peak_bytes"]) == int(on["params"]) + int(on["optimizer_states"]) + 2 * one_param
    bad, _ = mem(base.model_copy(update={"optimizer_in_backward": True, "grad_accum": 4}))
    assert not bool(bad["valid"])


# --- chunked cross-entropy -----------------------------------------------------------------------
def test_chunked_ce_holds_one_chunk_upcast():
    """bf16, C = 8: 16-bit logits (2) + saved fp32 log-softmax of every chunk (4) + one chunk's fp32
    upcast (4/8) = 6.5 bytes per logit, vs 2 + 4 + 4 = 10 unchunked."""
    from shardplan.formulas.activations import (
        chunked_logits_backward_bytes,
        chunked_logits_forward_bytes,
        logits_backward_bytes,
        logits_forward_bytes,
    )
    # unchunked, the loss upcasts the whole logits (logits_fp32, as HF does); chunked, one chunk's
    base = TrainingConfig(strategy="single", method="lora", ac="full", seq_len=4096, stack="plain", logits_fp32=True)
    cluster = parse_gpus("1xh100-sxm")
    off = columns_for(SPEC, cluster, base.model_copy(update={"ce_chunks": 0}))
    on = columns_for(SPEC, cluster, base.model_copy(update={"ce_chunks": 8}))
    logits = 4096 * SPEC.vocab_size
    assert int(logits_forward_bytes(off)) - int(chunked_logits_forward_bytes(on)) == round(3.5 * logits)
    # start of backward: 12 bytes per logit unchunked, 4 + (8 + 2)/8 = 5.25 chunked
    assert int(logits_backward_bytes(off)) - int(chunked_logits_backward_bytes(on)) == round(6.75 * logits)
    # and the knob reaches the peak: the chunked run's backward peak is lower
    assert int(mem(base.model_copy(update={"ce_chunks": 8}))[0]["backward_peak_bytes"]) < \
        int(mem(base.model_copy(update={"ce_chunks": 0}))[0]["backward_peak_bytes"])


# --- activation offloading -----------------------------------------------------------------------
def test_activation_offload_keeps_two_layers_on_the_gpu_and_moves_the_rest_to_host():
    base = TrainingConfig(strategy="single", method="lora", seq_len=2048, stack="plain")
    off, cluster = mem(base)
    on, _ = mem(base.model_copy(update={"activation_offload": True}))
    L = SPEC.num_layers
    from shardplan.formulas.activations import block_activation_bytes, offloaded_activation_bytes
    c = columns_for(SPEC, cluster, base.model_copy(update={"activation_offload": True}))
    c_off = columns_for(SPEC, cluster, base)
    per_blocks = int(block_activation_bytes(c_off))  # every block's saved set (no AC), all on the GPU
    moved = int(offloaded_activation_bytes(c))
    assert moved == pytest.approx(per_blocks * (L - 2) / L, abs=2)
    # the saved set on the GPU shrinks by exactly what moved; the forward peak drops (with the
    # HF-stack moments it may then sit at another moment, so it need not drop by exactly that)
    assert int(block_activation_bytes(c_off)) - int(block_activation_bytes(c)) == pytest.approx(moved, abs=2)
    assert int(on["forward_peak_bytes"]) < int(off["forward_peak_bytes"]) - moved // 2
    assert int(on["host_offloaded_bytes_per_gpu"]) - int(off["host_offloaded_bytes_per_gpu"]) == moved


# --- paged optimizer -----------------------------------------------------------------------------
@pytest.mark.parametrize("model,optimizer", [("llama-2-7b", "adamw-8bit"), ("llama-3.1-8b", "adamw-8bit"),
                                             ("llama-2-7b", "adamw")])
def test_paged_optimizer_states_are_outside_torchs_counters_but_on_the_device(model, optimizer):
    # Paged states live in unified memory (cudaMallocManaged): torch's allocator counters never
    # see them, so peak allocated and reserved drop by exactly the states, which move to the
    # bytes outside torch. On a card with room they are resident (device total unchanged); on a
    # card without, the driver evicts them to the host and the device total stops at capacity,
    # as long as torch's own peak fits. The states scale with the parameters and the optimizer.
    base = TrainingConfig(strategy="single", optimizer=optimizer, method="full", ac="full", stack="plain",
                          seq_len=512)
    off, _ = mem(base, gpus="1xh200", spec=get_model(model))
    on, _ = mem(base.model_copy(update={"paged_optimizer": True}), gpus="1xh200", spec=get_model(model))
    states = int(off["optimizer_states"])
    assert states > 0 and int(on["optimizer_states"]) == 0
    assert int(on["peak_allocated_bytes"]) == int(off["peak_allocated_bytes"]) - states
    assert int(on["peak_reserved_bytes"]) == int(off["peak_reserved_bytes"]) - states
    assert int(on["non_torch_bytes"]) == int(off["non_torch_bytes"]) + states
    assert int(on["device_total_bytes"]) == int(off["device_total_bytes"])
    capacity = int(on["peak_reserved_bytes"]) + int(off["non_torch_bytes"]) + states // 2  # half the states fit
    h200 = parse_gpus("1xh200")
    small = h200.model_copy(update={"gpu": h200.gpu.model_copy(update={"memory_bytes": capacity})})
    squeezed = estimate_memory(columns_for(get_model(model), small, base.model_copy(update={"paged_optimizer": True})))
    assert int(squeezed["peak_reserved_bytes"]) == int(on["peak_reserved_bytes"])
    assert int(squeezed["device_total_bytes"]) == capacity
    assert bool(squeezed["fits_gpu"])


# --- LoRA targets --------------------------------------------------------------------------------
def test_lora_targets_as_the_stacks_name_them():
    # PEFT on Llama-2-7B, r=8, q_proj+v_proj: "trainable params: 4,194,304" (PEFT README/quicktour);
    # r=16 doubles it. all-linear adds k, o and the MLP; +embeddings adds 2·r·(V + h).
    assert model_values(SPEC, 8, "qv")["lora_params"] == 4_194_304
    assert model_values(SPEC, 16, "q,v")["lora_params"] == 8_388_608
    all_linear = model_values(SPEC, 16, "all-linear")["lora_params"]
    assert model_values(SPEC, 16, "all-linear+embeddings")["lora_params"] == all_linear + 2 * 16 * (32000 + 4096)
    with pytest.raises(ShardplanError, match="lora_targets"):
        model_values(SPEC, 16, "mlp-only")


# --- GPTQ / AWQ ----------------------------------------------------------------------------------
def test_quant_formats_bytes_and_gptq_buffers_are_not_sharded():
    assert GPTQ_BYTES_PER_PARAM == AWQ_BYTES_PER_PARAM == 0.5 + 0.5 / 128 + 2 / 128  # 0.51953125
    assert NF4_BYTES_PER_PARAM == pytest.approx(0.5159, abs=1e-4)
    base = TrainingConfig(strategy="full_shard", method="qlora", ac="full")
    nf4, _ = mem(base.model_copy(update={"quant_format": "nf4"}), "4xh100-sxm")
    gptq, _ = mem(base.model_copy(update={"quant_format": "gptq"}), "4xh100-sxm")
    q = model_values(SPEC)["quantizable_params"]
    # NF4 (float quant_storage) packs 0.5 B/weight split 4 ways, plus its measured quant_state
    # (model_states.nf4_quant_state_bytes; replicated per rank unless sharded); GPTQ's int32 buffers (scales and
    # zeros inside its 0.5195 B/weight) stay whole on every rank
    c = columns_for(SPEC, parse_gpus("4xh100-sxm"), base)
    quant_state = int(c.quant_state_bytes) / (4 if bool(c.quant_state_sharded) else 1)  # hf: replicated (measured)
    expected = q * GPTQ_BYTES_PER_PARAM - q * 0.5 / 4 - quant_state
    assert int(gptq["params"]) - int(nf4["params"]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-2-70b"])
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_gptq_plugin_shards_qweight_and_qzeros_one_over_n(model, gpus):
    # fms-acceleration's GPTQ plugin makes qweight and qzeros float parameters under FSDP
    # (autogptq_utils.py PATCH_FOR_FSDP_TRITON_V2); the fp16 scales (2/128 B per weight) stay
    # buffers. Per rank the knob saves exactly the shardable part's (1 - 1/N), at every N and size.
    spec = get_model(model)
    base = TrainingConfig(strategy="full_shard", method="qlora", ac="full", quant_format="gptq")
    cluster = f"{gpus}xh100-sxm"
    whole, _ = mem(base, cluster, spec)
    split, _ = mem(base.model_copy(update={"quant_buffers_sharded": True}), cluster, spec)
    shardable = model_values(spec)["quantizable_params"] * GPTQ_SHARDABLE_BYTES_PER_PARAM
    saved = int(whole["params"]) - int(split["params"])
    assert saved == pytest.approx(shardable * (1 - 1 / gpus), abs=gpus)  # floors of the shards
    # the load-time peak (rank-0 broadcast: the shard plus one unit) saves the same bytes
    assert int(whole["load_peak_bytes"]) - int(split["load_peak_bytes"]) == pytest.approx(saved, abs=2 * gpus)


@pytest.mark.parametrize("update", [
    dict(strategy="single"),                          # one GPU: nothing to shard
    dict(strategy="ddp"),                             # DDP replicates parameters and buffers alike
    dict(engine="deepspeed", strategy="zero3"),        # the plugin patches only under accelerate FSDP
    dict(quant_format="awq"),                          # the plugin's QuantLinear is GPTQ's triton-v2
    dict(quant_format="nf4"),                          # NF4 shards with its float quant_storage anyway
])
def test_gptq_plugin_knob_changes_nothing_where_the_plugin_does_not_shard(update):
    base = TrainingConfig(strategy="full_shard", method="qlora", ac="full", quant_format="gptq").model_copy(update=update)
    cluster = "1xh100-sxm" if update.get("strategy") == "single" else "4xh100-sxm"
    off, _ = mem(base, cluster)
    on, _ = mem(base.model_copy(update={"quant_buffers_sharded": True}), cluster)
    assert int(on["params"]) == int(off["params"]) and int(on["load_peak_bytes"]) == int(off["load_peak_bytes"])


def test_fms_gptq_query_word_turns_the_plugin_on_and_fit_answers_with_it(capsys):
    from shardplan.cli.app import main

    q = parse_query("mixtral-8x7b on 2x80GB fms-gptq full_shard").options
    assert q == {"quant_buffers_sharded": True, "quant_format": "gptq", "method": "qlora", "strategy": "full_shard"}
    # a stated format wins over the word's default
    assert parse_query("8b on 2x80GB fms-gptq awq").options["quant_format"] == "awq"
    params = {}
    for word in ("gptq", "fms-gptq"):
        assert main(["fit", f"mixtral-8x7b on 2x80GB {word} full_shard", "--json"]) == 0
        params[word] = json.loads(capsys.readouterr().out)["per_gpu"]["breakdown"]["params"]
    spec = get_model("mixtral-8x7b")
    shardable = model_values(spec)["quantizable_params"] * GPTQ_SHARDABLE_BYTES_PER_PARAM
    assert params["gptq"] - params["fms-gptq"] == pytest.approx(shardable / 2, abs=4)


# --- load-time peak ------------------------------------------------------------------------------
def test_load_peak_per_load_mode_and_counted_in_fits():
    base = TrainingConfig(strategy="full_shard", method="lora", ac="full")
    out = {}
    for mode in st.LOAD_MODES:
        m, cluster = mem(base.model_copy(update={"load_mode": mode}), "4xh100-sxm")
        out[mode] = int(m["load_peak_bytes"]) - int(m["non_torch_bytes"])
    whole = 2 * SPEC.total_params
    shard = math.ceil(whole / 4)
    unit = 2 * max(SPEC.root_params, SPEC.largest_block_params)
    assert out == {"full_per_gpu": whole + unit, "rank0_broadcast": shard + unit, "meta_init": shard}
    # with parameter offload the shard goes to host RAM: only the unit being broadcast is on the GPU
    m, _ = mem(base.model_copy(update={"load_mode": "rank0_broadcast", "offload": "optimizer+params"}), "4xh100-sxm")
    assert int(m["load_peak_bytes"]) - int(m["non_torch_bytes"]) == unit
    # 70B QLoRA on 4x24GB trains within 24 GB, but not if every GPU first loads the whole 4-bit model
    big = get_model("llama-3.1-70b")
    cfg = TrainingConfig(strategy="full_shard", method="qlora", ac="full", checkpoint_wrapper=False)
    ok = evaluate(big, parse_gpus("4x24GB"), cfg.model_copy(update={"load_mode": "rank0_broadcast"}))
    bad = evaluate(big, parse_gpus("4x24GB"), cfg.model_copy(update={"load_mode": "full_per_gpu"}))
    # trains within 24 GB (fits, or tight once the verdict's band is counted); the full-per-GPU load does not
    assert ok.verdict in ("fits", "tight") and ok.fits_gpu and ok.fits_load
    assert bad.fits_gpu and not bad.fits_load and not bad.fits
    assert bad.per_gpu.load_peak_bytes > 35 * 2**30


# --- fp32 master ---------------------------------------------------------------------------------
def test_lightning_bf16_true_has_no_fp32_master():
    cluster = parse_gpus("4xh100-sxm")
    light = resolve_stack(TrainingConfig(stack="lightning", strategy="full_shard"), 4)
    assert light.precision == "bf16-pure" and light.fp32_master is False and light.engine == "fsdp1"
    mixed = resolve_stack(TrainingConfig(stack="hf", strategy="full_shard", fp32_master=False), 4)
    assert mixed.precision == "bf16-pure"  # no fp32 copy under bf16-mixed is bf16-pure
    a = estimate_memory(columns_for(SPEC, cluster, TrainingConfig(strategy="full_shard")))
    b = estimate_memory(columns_for(SPEC, cluster, TrainingConfig(strategy="full_shard", fp32_master=False)))
    assert int(b["params"]) * 2 == int(a["params"])  # 2-byte weights instead of 4


# --- query, CLI, sweep ---------------------------------------------------------------------------
def test_query_words():
    q = parse_query("llama-3.1-8b on 1x24GB torchtune oib chunked-ce paged offload-activations load meta_init").options
    assert q == {"stack": "torchtune", "optimizer_in_backward": True, "ce_chunks": 8, "paged_optimizer": True,
                 "optimizer": "adamw-8bit", "activation_offload": True, "load_mode": "meta_init"}
    q = parse_query("70B on 4x24GB stack hf gptq targets qv single").options
    assert q == {"stack": "hf", "quant_format": "gptq", "method": "qlora", "lora_targets": "qv", "strategy": "single"}
    assert parse_query("7B on 1x24GB litgpt").options == {"stack": "lightning"}


def test_cli_states_the_stack_and_the_load_peak(capsys):
    from shardplan.cli.app import main
    assert main(["fit", "llama-2-7b on 1x24GB lora", "--stack", "torchtune", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)[0]
    assert data["stack"].startswith("torchtune (") and data["strategy"] == "single"
    assert data["per_gpu"]["load_peak_bytes"] > 13 * 2**30 and data["config"]["ce_chunks"] == 8
    assert main(["fit", "70B on 4x24GB qlora gc", "--strategy", "full_shard"]) == 0
    out = capsys.readouterr().out
    assert "stack: hf (Transformers + Trainer + PEFT + bitsandbytes)" in out and "load-time peak" in out
    assert main(["fit", "70B on 4x24GB", "--stack", "megatron"]) == 2
    assert "stack='megatron'" in capsys.readouterr().err


def test_sweep_stack_column_fills_each_rows_knobs():
    import shardplan
    df = shardplan.sweep(models="llama-2-7b", gpus="h100-sxm", gpu_counts=[1, 4], strategies=["single", "full_shard"],
                         stack=["hf", "torchtune"], method="lora", ac="full", seq_len=4096)
    assert set(df["stack"].astype(str)) == {"hf", "torchtune"} and "load_peak_bytes" in df and "fits_load" in df
    row = df[(df.world_size == 4) & (df.strategy == "full_shard")].set_index(df["stack"].astype(str)[
        (df.world_size == 4) & (df.strategy == "full_shard")])
    # torchtune's chunked CE (8 chunks) makes its logits term smaller at equal knobs
    one = evaluate(SPEC, parse_gpus("4xh100-sxm"), TrainingConfig(strategy="full_shard", method="lora", ac="full",
                                                                  lora_rank=16, lora_targets="all-linear",
                                                                  seq_len=4096, stack="torchtune"))
    assert int(row.loc["torchtune", "peak_allocated_bytes"]) == one.per_gpu.peak_allocated_bytes
    forced = shardplan.sweep(models="llama-2-7b", gpus="h100-sxm", gpu_counts=4, strategies="full_shard",
                             stack="torchtune", method="lora", ac="full", seq_len=4096, ce_chunks=0)
    assert int(forced["peak_allocated_bytes"].iloc[0]) >= int(row.loc["torchtune", "peak_allocated_bytes"])
    single_multi = df[(df.world_size == 4) & (df.strategy == "single")]
    assert not single_multi["valid"].any()


def test_plan_states_the_stack_and_counts_the_load_peak():
    from shardplan.planning.planner import plan, resolve_workload
    cluster = parse_gpus("4x24GB")
    workload = resolve_workload(1024, cluster.world_size)
    base = TrainingConfig(method="qlora", stack="plain")  # plain loads the whole model on every GPU
    result = plan(get_model("llama-3.1-70b"), cluster, base, workload)
    assert result.stack.startswith("plain (")
    # the 4-bit 70B (~36 GiB) cannot even be placed whole on a 24 GB GPU: nothing fits, and the
    # rejected families say loading is the reason where training alone would fit
    assert not result.plans
    assert any(r.reason.startswith("loading the weights") for r in result.rejected)
    ok = plan(get_model("llama-3.1-70b"), cluster, base.model_copy(update={"load_mode": "rank0_broadcast"}), workload)
    assert ok.plans and all(p.load_peak_bytes < 24 * 10**9 for p in ok.plans)


def test_columns_without_an_fp32_master_are_bf16_pure():
    """A library caller building Columns directly gets the same fold as resolve_stack."""
    from shardplan.formulas.columns import Columns, cluster_values
    from shardplan.inputs.stacks import knob_values
    cluster = parse_gpus("4xh100-sxm")
    knobs = knob_values(TrainingConfig(strategy="full_shard", stack="plain"), cluster)
    knobs.pop("reduce_dtype")
    mixed = estimate_memory(Columns.build(**model_values(SPEC), **cluster_values(cluster), **knobs))
    pure = estimate_memory(Columns.build(**model_values(SPEC), **cluster_values(cluster), **{**knobs, "fp32_master": False}))
    assert int(pure["params"]) * 2 == int(mixed["params"])


def test_a_bad_stack_profile_is_a_one_line_error(tmp_path, capsys):
    from shardplan.cli.app import main
    good = json.loads((ROOT / "shardplan/data/stack_profiles/torchtune.json").read_text())
    bad = dict(good, defaults={**good["defaults"], "ce_chunkz": {"value": 4, "source": "a typo, no such knob"}})
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert main(["profiles", "validate", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "ce_chunkz" in err and "\n" not in err
    worse = dict(good, overrides=[{"when": {"gpus": "one"}, "set": {"load_mode": {"value": "mmap", "source": "x"}}}])
    (tmp_path / "worse.json").write_text(json.dumps(worse))
    assert main(["profiles", "validate", str(tmp_path / "worse.json")]) == 2
    assert "load_mode='mmap'" in capsys.readouterr().err


@pytest.mark.parametrize("stack", st.STACKS)
def test_a_knob_stated_as_none_is_the_stacks_default(stack):
    """``TrainingConfig(lora_dropout=None, ...)`` (a loop passing optional values through) means what
    leaving the knobs out means: the stack's defaults, not a None inside a formula."""
    knobs = ("logits_fp32", "ce_chunks", "optimizer_in_backward", "activation_offload", "fp32_master",
             "paged_optimizer", "lora_dropout", "reentrant_checkpointing", "checkpoint_wrapper",
             "quant_state_sharded", "quant_buffers_sharded", "quant_format", "load_mode")
    stated = resolve_stack(TrainingConfig(stack=stack, method="lora", **{k: None for k in knobs}), 8)
    left_out = resolve_stack(TrainingConfig(stack=stack, method="lora"), 8)
    assert {k: getattr(stated, k) for k in knobs} == {k: getattr(left_out, k) for k in knobs}
    assert all(getattr(stated, k) is not None for k in knobs if getattr(left_out, k) is not None)
    spec, cluster = get_model("llama-3.1-8b"), parse_gpus("8xh100-sxm")
    assert evaluate(spec, cluster, stated).per_gpu == evaluate(spec, cluster, left_out).per_gpu


def test_resolved_fields_read_as_resolve_stack_writes_them():
    """``stacks.resolved_fields`` (a query's read-only view, no pydantic copy) holds exactly the
    fields ``resolve_stack`` gives, in the same order, of the same types: fit.evaluate reports
    ``config`` from it. 500 configurations drawing every knob, every stack."""
    import warnings

    from shardplan.inputs.stacks import resolved_fields
    from tests.test_one_row import _every_knob_queries

    warnings.simplefilter("ignore", RuntimeWarning)
    stacks = set()
    for _, cluster, config in _every_knob_queries(500, seed=5):
        expected = resolve_stack(config, cluster.world_size).model_dump()
        got = dict(vars(resolved_fields(config, cluster.world_size)))
        assert list(got.items()) == list(expected.items()), config
        assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
        stacks.add(config.stack)
    assert stacks == set(st.STACKS)
