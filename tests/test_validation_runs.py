"""Published runs as queries (shardplan/validation/runs.py): every row becomes a query or a named
reason, and the free-text settings are read as the README describes them."""

import csv
from pathlib import Path

import pytest

from shardplan.support.errors import ShardplanError
from shardplan.validation.runs import COUNTER_CLASSES, GIB, REASONS, RunQuery, Unexpressible, express, read_runs, summary

RUNS = Path(__file__).parent / "data" / "published_runs" / "runs.csv"


def _row(**changes):
    base = dict(row_id="X001", row_type="measured_run", model="Llama 3.1 8B", params_b="8.03", n_layers="32",
                hidden="4096", n_heads="32", n_kv_heads="8", ffn="14336", vocab="128256",
                framework="HF Trainer + accelerate FSDP (fsdp1)", strategy="FULL_SHARD", dp_shard="4", dp_replicate="1",
                tp="1", pp="1", cp="1", offload="none", precision="bf16 mixed", act_ckpt="full", optimizer="AdamW",
                gpu="A100 SXM4 80GB", n_gpus="4", n_nodes="1", gpus_per_node="4", seq_len="4096", micro_batch="2",
                grad_accum="1", measured_mem_gib="40.0", mem_counter="torch.cuda.max_memory_allocated() GiB",
                measured_tokens_per_s_per_gpu="1000")
    return {**base, **changes}


def test_every_row_is_a_query_or_a_named_reason():
    rows = read_runs(RUNS)
    with RUNS.open() as handle:
        assert len(rows) == sum(1 for _ in csv.DictReader(handle))
    counts = summary(rows)
    assert sum(counts.values()) == len(rows)
    assert all(r.reason in REASONS for r in rows if isinstance(r, Unexpressible))
    queries = [r for r in rows if isinstance(r, RunQuery)]
    assert {r.counter for r in queries if r.counter} <= set(COUNTER_CLASSES)
    # the measured OOMs are what a false fit is counted over: nearly all of them must be expressible
    ooms = [r for r in rows if r.row_type == "measured_oom"]
    assert sum(isinstance(r, RunQuery) for r in ooms) >= 0.9 * len(ooms)


def test_a_stated_row_reads_as_stated():
    q = express(_row(precision="QLoRA (bitsandbytes 4-bit) LoRA r16 on q_proj k_proj v_proj o_proj; bf16 autocast"))
    assert isinstance(q, RunQuery)
    c = q.config
    assert (c.stack, c.strategy, c.engine, c.method, c.lora_rank, c.lora_targets) == (
        "hf", "full_shard", "fsdp1", "qlora", 16, "attention")
    assert (c.precision, c.ac, c.seq_len, c.micro_batch) == ("bf16-mixed", "full", 4096, 2)
    assert q.cluster.world_size == 4 and q.cluster.gpu.name == "a100-80gb"
    assert q.counter == "allocated" and q.measured_bytes == 40 * GIB
    assert q.spec.name == "llama-3.1-8b"  # the catalogue profile whose dimensions agree


@pytest.mark.parametrize("changes, strategy, engine", [
    (dict(strategy="zero3", framework="HF Trainer + DeepSpeed"), "full_shard", "deepspeed"),
    (dict(strategy="zero2", framework="DeepSpeed"), "zero2", "deepspeed"),
    (dict(strategy="FULL_SHARD (FSDP2 fully_shard)", framework="torchtitan (FSDP2)"), "full_shard", "fsdp2"),
    (dict(strategy="HYBRID_SHARD", dp_shard="2"), "hybrid_shard", "fsdp1"),
])
def test_strategies_and_engines(changes, strategy, engine):
    q = express(_row(**changes))
    assert (q.config.strategy, q.config.engine) == (strategy, engine)


@pytest.mark.parametrize("changes, reason", [
    (dict(tp="4"), "model_parallel"),
    (dict(precision="float8 rowwise linears + bf16 elsewhere"), "fp8_training"),
    (dict(precision="int4 weight-only magic"), "unrecognised_precision"),
    (dict(n_layers="", hidden="", model="Some Unknown Model"), "architecture_not_stated"),
    (dict(seq_len=""), "seq_len_not_stated"),
    (dict(gpu="A100 (40/80GB not stated)"), "gpu_capacity_not_stated"),
    (dict(row_type="capacity_claim"), "not_a_run"),
])
def test_rows_that_cannot_be_expressed_say_why(changes, reason):
    r = express(_row(**changes))
    assert isinstance(r, Unexpressible) and r.reason == reason


@pytest.mark.parametrize("counter, expected", [
    ("torchtitan memory log = peak reserved GiB", "reserved"),
    ("nvidia-smi peak 81166 MiB", "device_total"),
    ("'Peak Memory per GPU' (which counter not stated)", "unnamed"),
    ("'Peak Memory Active (GiB)' = active_bytes.all.peak/1024**3 (stated)", "allocated"),
])
def test_counter_classes(counter, expected):
    assert express(_row(mem_counter=counter)).counter == expected


def test_an_unstated_setting_is_left_to_the_stack_and_said():
    q = express(_row(act_ckpt="not stated", precision="QLoRA: 4-bit base, LoRA r8; bf16/fp16 compute not stated"))
    assert "ac" not in q.config.model_fields_set and "precision" not in q.config.model_fields_set
    assert any("checkpointing" in a for a in q.assumed) and any("precision" in a for a in q.assumed)


def test_a_file_without_the_columns_is_a_one_line_error(tmp_path):
    bad = tmp_path / "runs.csv"
    bad.write_text("row_id,model\nA1,llama\n")
    with pytest.raises(ShardplanError, match="missing"):
        read_runs(bad)


@pytest.mark.parametrize("changes, knobs", [
    # llm-foundry: init_device meta (yamls/pretrain/mpt-*.yaml), loss_fn fused_crossentropy (ComposerMPTCausalLM)
    (dict(framework="Composer + PyTorch FSDP (fsdp1)", precision="bf16 autocast (Composer amp_bf16)"),
     dict(stack="plain", load_mode="meta_init", fused_ce=True)),
    # Megatron-DeepSpeed builds the model inside deepspeed.zero.Init when ZeRO-3 is on
    (dict(framework="DeepSpeed 0.6.2 + Megatron-DeepSpeed", strategy="zero3"),
     dict(stack="plain", load_mode="meta_init", fused_ce=None)),
    # ... and not under ZeRO-2, where nothing is partitioned at construction
    (dict(framework="DeepSpeed 0.6.2 + Megatron-DeepSpeed", strategy="zero2"),
     dict(stack="plain", load_mode=None, fused_ce=None)),
    # fms-fsdp: a CPU (or meta) model sharded unit by unit by FSDP1 with device_id
    (dict(framework="PyTorch FSDP (fsdp1) via fms-fsdp"), dict(stack="plain", load_mode="rank0_broadcast", fused_ce=None)),
    (dict(), dict(stack="hf", load_mode=None, fused_ce=None)),
])
def test_a_framework_without_a_profile_gets_the_knobs_its_code_sets(changes, knobs):
    q = express(_row(**changes))
    assert isinstance(q, RunQuery)
    assert {k: getattr(q.config, k) for k in knobs} == knobs
    assert any("stack knobs" in a for a in q.assumed) == (knobs["load_mode"] is not None)


def _floor_share(row):
    """The share of the GPU's dense 16-bit peak the row's rate needs, from the public floor."""
    from shardplan.inputs.stacks import resolve_stack
    from shardplan.validation.runs import min_flops_per_token

    q = express({**row, "measured_tokens_per_s_per_gpu": "1"})
    config = resolve_stack(q.config, q.cluster.world_size)
    peak = max(q.cluster.gpu.peak_flops.get(d, 0.0) for d in ("bf16", "fp16"))
    return float(min_flops_per_token(q.spec, config)) / peak


@pytest.mark.parametrize("changes", [{}, {"precision": "LoRA r16 on q_proj v_proj; bf16 frozen base"},
                                     {"act_ckpt": "none"}, {"seq_len": "16384"}, {"gpu": "H100 SXM5 80GB"}])
def test_a_rate_above_the_dense_peak_is_refused_and_one_below_is_kept(changes):
    # the boundary moves with the method, the recompute, the sequence and the GPU: a rate 2 % under
    # the floor's limit is a query, 2 % over it is refused with the share it would need
    per_token = _floor_share(_row(**changes))
    limit = 1.0 / per_token
    kept = express(_row(**changes, measured_tokens_per_s_per_gpu=f"{0.98 * limit:.3f}"))
    refused = express(_row(**changes, measured_tokens_per_s_per_gpu=f"{1.02 * limit:.3f}"))
    assert isinstance(kept, RunQuery)
    assert isinstance(refused, Unexpressible) and refused.reason == "rate_above_peak"
    assert "1.02x" in refused.detail


def test_a_card_measured_above_its_nameplate_is_held_to_the_measured_rate():
    # the RTX 4090 runs GEMMs at 1.082 of its datasheet peak (its MAMF maximum): a rate needing 1.05x
    # the nameplate is what the card was measured to do, 1.10x is beyond it and refused
    from shardplan.inputs.hardware import get_gpu

    row = _row(gpu="RTX 4090 24GB", precision="LoRA r16 on q_proj v_proj; bf16 frozen base", seq_len="2048")
    limit = 1.0 / _floor_share(row)
    assert get_gpu("rtx4090").gemm_efficiency > 1.05
    assert isinstance(express({**row, "measured_tokens_per_s_per_gpu": f"{1.05 * limit:.3f}"}), RunQuery)
    refused = express({**row, "measured_tokens_per_s_per_gpu": f"{1.10 * limit:.3f}"})
    assert isinstance(refused, Unexpressible) and refused.reason == "rate_above_peak"


def test_the_flop_floor_scales_with_what_each_run_must_compute():
    from shardplan.inputs.stacks import resolve_stack
    from shardplan.validation.runs import min_flops_per_token

    def floor(**changes):
        q = express(_row(**changes))
        return float(min_flops_per_token(q.spec, resolve_stack(q.config, q.cluster.world_size)))

    n = express(_row()).spec.matmul_params_per_token
    lora = "LoRA r16 on q_proj v_proj; bf16 frozen base"
    # a full fine-tune adds the weight gradient (2N) to a LoRA run's forward + input gradient
    assert floor(act_ckpt="none") - floor(act_ckpt="none", precision=lora) == pytest.approx(2 * n)
    # full checkpointing recomputes the forward: 2N of matmuls plus one causal attention forward
    attention = floor(act_ckpt="none", seq_len="8192") - floor(act_ckpt="none", seq_len="4096")
    assert attention > 0
    assert floor(seq_len="8192") - floor(act_ckpt="none", seq_len="8192") > 2 * n
    # attention per token grows linearly with the sequence: doubling it again doubles the step
    assert floor(act_ckpt="none", seq_len="16384") - floor(act_ckpt="none", seq_len="8192") == pytest.approx(2 * attention)


def test_llama_factory_rows_read_its_own_defaults_not_trls():
    """LLaMA-Factory's own entry point (finetuning_args.py / patcher.py of April 2024): LoRA
    dropout 0.0 and no PEFT kbit preparation, where the hf stack's defaults (TRL's ModelConfig
    lora_dropout 0.05) would apply to any other Transformers row."""
    from shardplan.inputs.stacks import resolve_stack

    stated = dict(framework="LLaMA-Factory (HF Transformers + PEFT + bitsandbytes)", strategy="none (1 GPU)",
                  dp_shard="1", n_gpus="1", gpus_per_node="1", gpu="A100 40GB", micro_batch="1",
                  precision="QLoRA: 4-bit base, LoRA r8 on all linear modules; bf16/fp16 compute not stated")
    factory = express(_row(**stated))
    trainer = express(_row(**{**stated, "framework": "HF Transformers + PEFT + bitsandbytes"}))
    assert isinstance(factory, RunQuery) and isinstance(trainer, RunQuery)
    ours = resolve_stack(factory.config, 1)
    theirs = resolve_stack(trainer.config, 1)
    assert (ours.lora_dropout, ours.kbit_prep) == (0.0, False)
    assert theirs.lora_dropout == 0.05  # the hf stack's default, TRL's ModelConfig
    assert any("LLaMA-Factory" in a for a in factory.assumed)
    assert not any("LLaMA-Factory" in a for a in trainer.assumed)


@pytest.mark.parametrize("precision, sharded", [
    # fms-acceleration's GPTQ plugin re-registers each QuantLinear's qweight and qzeros as float parameters
    ("GPTQ-LoRA (4-bit GPTQ base via fms-acceleration autogptq plugin), fp16; LoRA r16 on q_proj k_proj", True),
    # a GPTQ base loaded without the plugin keeps them as buffers (the stack's default)
    ("GPTQ-LoRA (4-bit GPTQ base), fp16; LoRA r16 on q_proj k_proj", None),
])
def test_fms_acceleration_gptq_rows_read_the_plugins_sharded_buffers(precision, sharded):
    q = express(_row(framework="HF Trainer + accelerate FSDP (fsdp1) + fms-acceleration plugin", precision=precision,
                     model="TheBloke/Mistral-7B-v0.1-GPTQ", hidden="4096", n_kv_heads="8", vocab="32000",
                     params_b="7.24", n_gpus="2", dp_shard="2", gpus_per_node="2"))
    assert isinstance(q, RunQuery) and q.config.quant_format == "gptq"
    assert q.config.quant_buffers_sharded is sharded
    assert any("PATCH_FOR_FSDP_TRITON_V2" in a for a in q.assumed) == bool(sharded)


def test_fms_acceleration_rows_run_as_its_harness_launched_them():
    """benchmark.py @24bdadb launches one-GPU runs with plain ``python`` (no FSDP) and multi-GPU runs
    with accelerate.yaml (no activation-checkpointing wrapper); transformers 4.48.1's Trainer
    checkpoints reentrantly."""
    harness = dict(source="foundation-model-stack/fms-acceleration scripts/benchmarks/refs/a100_80gb.csv",
                   act_ckpt="full (gradient_checkpointing True)",
                   precision="QLoRA (bitsandbytes 4-bit via fms-acceleration accelerated-peft plugin) LoRA r16 on q_proj")
    one = express(_row(**harness, strategy="FULL_SHARD (world size 1)", n_gpus="1", gpus_per_node="1", dp_shard="1"))
    two = express(_row(**harness, n_gpus="2", gpus_per_node="2", dp_shard="2"))
    other = express(_row(act_ckpt=harness["act_ckpt"], n_gpus="2", gpus_per_node="2", dp_shard="2"))
    assert one.config.strategy == "single"
    assert two.config.strategy == "full_shard" and two.config.engine == "fsdp1"
    assert (two.config.reentrant_checkpointing, two.config.checkpoint_wrapper) == (True, False)
    assert (other.config.reentrant_checkpointing, other.config.checkpoint_wrapper) == (None, None)


@pytest.mark.parametrize("precision, autocast", [
    # the Trainer's bf16 left unset over a bf16-loaded model: accelerate's mixed precision stays "no"
    ("LoRA r16 alpha16 on q_proj k_proj v_proj o_proj (bfloat16 frozen base, HF bf16=unset)", False),
    # bf16 = True (the QLoRA rows): autocast and FSDP's MixedPrecision, the stack's default
    ("QLoRA (bitsandbytes 4-bit, HF/PEFT baseline loading) LoRA r16 on q_proj k_proj; bf16 autocast", None),
])
def test_rows_without_the_trainers_bf16_run_without_autocast(precision, autocast):
    q = express(_row(precision=precision, n_gpus="2", dp_shard="2", gpus_per_node="2"))
    assert isinstance(q, RunQuery) and q.config.method in ("lora", "qlora")
    assert q.config.autocast is autocast
    assert any("state.py gives FSDP a MixedPrecision" in a for a in q.assumed) == (autocast is False)
