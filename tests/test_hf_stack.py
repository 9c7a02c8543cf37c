"""The real Hugging Face stack (transformers + PEFT + bitsandbytes) against shardplan's memory model.

Most tests read the committed measurements (data/calibration/hf_stack_cpu.jsonl, produced by
``benchmarks/calibrate_hf_stack.py``: MemTracker / FSDPMemTracker / StorageTracker on CPU) and hold
the *current* formulas against them: model states exact, activations and the peak within 2 %.
Each mechanism test turns one knob column off on the records that exercise it and shows the
prediction then misses by more than its tolerance. A few live runs (skipped only when torch,
transformers, peft or bitsandbytes are missing) re-measure configurations and check that the
committed table is what the libraries produce today.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from shardplan.calibrate.compare_hf import CATEGORIES, EXACT, compare_records, measured, predict, record_columns
from shardplan.calibrate.results import read_jsonl
from shardplan.inputs import strategy as st

TABLE = Path(__file__).resolve().parents[1] / "data" / "calibration" / "hf_stack_cpu.jsonl"
RECORDS = [r for r in read_jsonl(TABLE) if r.get("status") == "ok"]
TOLERANCE = 0.02  # activations and peak (issue 9: "within 2 %")


def _err(record, columns=None, category="total_peak"):
    p, m = predict(record, columns)[category], measured(record)[category]
    return (p - m) / m


def _with(record, **knobs):
    c = record_columns(record)
    return dataclasses.replace(c, **{k: np.asarray(v) for k, v in knobs.items()})


def _pick(**conds):
    out = [r for r in RECORDS if all(r["config"].get(k) == v for k, v in conds.items())]
    assert out, f"no committed record with {conds}"
    return out


def test_committed_grid_covers_every_axis():
    assert len(RECORDS) >= 24
    axes = {"family": {"llama", "mistral", "qwen2"}, "method": {"full", "lora", "qlora"},
            "gradient_checkpointing": {False, True}, "lora_dropout": {0.0, 0.1}, "wrapper": {"single", "fsdp1", "fsdp2"},
            "lora_targets": {"qv", "all-linear"}}
    for axis, values in axes.items():
        assert {r["config"][axis] for r in RECORDS} >= values, axis
    assert {r["config"]["use_reentrant"] for r in RECORDS if r["config"]["gradient_checkpointing"]} == {False, True}
    peft = [r for r in RECORDS if r["config"]["method"] != "full"]
    assert {r["config"]["lora_dropout"] for r in peft} == {0.0, 0.1}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r['config']['family']}-{r['key']}")
def test_predicted_vs_measured_per_category(record):
    rows = {r["category"]: r for r in compare_records([record])}
    assert set(rows) == set(CATEGORIES)
    for cat in EXACT:  # params (+ quant_state), grads, optimizer states: byte for byte
        assert rows[cat]["predicted_bytes"] == rows[cat]["measured_bytes"], (cat, rows[cat])
    for cat in ("activations", "total_peak"):
        assert abs(rows[cat]["error"]) <= TOLERANCE, (cat, rows[cat])


# --- one test per mechanism: ignoring it breaks the agreement ----------------------------------
def test_logits_fp32_upcast():
    """ForCausalLMLoss upcasts the bf16 logits (4·bsV more at the loss): without it LoRA's
    activations miss by more than the tolerance."""
    for r in _pick(method="lora", wrapper="single", gradient_checkpointing=False):
        assert abs(_err(r, category="activations")) < 0.001
        assert _err(r, _with(r, logits_fp32=False), "activations") < -TOLERANCE


def test_lora_dropout_copies():
    """lora_dropout > 0: each adapted layer's own dropout output and mask are saved (blocks that are
    not checkpointed: a checkpointed block keeps only its input through the forward)."""
    records = [r for r in _pick(lora_dropout=0.1) if not r["config"]["gradient_checkpointing"]]
    assert {r["config"]["wrapper"] for r in records} == {"single", "fsdp2"}
    for r in records:
        assert abs(_err(r, category="activations")) < 0.001
        assert _err(r, _with(r, lora_dropout=0.0), "activations") < -TOLERANCE


def test_dropout_mask_width_on_cpu():
    """On CPU torch's composite dropout saves a noise tensor in the input's dtype (4 B in fp32),
    not CUDA's 1-byte mask: predicting the fused kernel for these CPU runs misses."""
    records = [r for r in _pick(lora_dropout=0.1, wrapper="single") if not r["config"]["gradient_checkpointing"]]
    for r in records:
        assert _err(r, _with(r, fused_dropout=True), "activations") < -TOLERANCE


def test_lora_intermediates():
    """x·A (rank wide) is saved for lora_B's backward; the fp32 cast of each adapted input for lora_A."""
    for r in _pick(method="lora", lora_targets="all-linear", wrapper="single", gradient_checkpointing=False):
        assert _err(r, _with(r, lora_rank_out=0, lora_adapted_in=0, lora_unique_in=0), "activations") < -TOLERANCE


def test_quant_state_replicated_under_fsdp():
    """bitsandbytes keeps quant_state as a module attribute: FSDP shards the packed weight only."""
    for r in _pick(method="qlora", wrapper="fsdp2"):
        assert predict(r)["params"] == measured(r)["params"]
        assert predict(r, _with(r, quant_state_sharded=True))["params"] < measured(r)["params"]


def test_reentrant_checkpointing_holds_the_recomputed_output():
    """use_reentrant=True holds one more a·h tensor inside a block's backward: the predicted
    difference between the flavours equals the measured one (within 2 %)."""
    pairs = {}
    for r in RECORDS:
        cfg = r["config"]
        if cfg["gradient_checkpointing"] and cfg["vocab_size"] == 256:
            key = tuple(sorted((k, v) for k, v in cfg.items() if k != "use_reentrant"))
            pairs.setdefault(key, {})[cfg["use_reentrant"]] = r
    checked = 0
    for key, pair in pairs.items():
        if set(pair) != {False, True}:
            continue
        re, non = pair[True], pair[False]
        meas = measured(re)["total_peak"] - measured(non)["total_peak"]
        pred = predict(re)["total_peak"] - predict(non)["total_peak"]
        if dict(key)["wrapper"] == "fsdp2":
            assert meas > 0, key
            assert abs(pred - meas) <= 0.02 * meas, (key, pred, meas)
            assert predict(re, _with(re, reentrant_checkpointing=False))["total_peak"] - predict(non)["total_peak"] == 0
            checked += 1
    assert checked >= 2


def test_single_device_block_backward_moment():
    """Unwrapped runs whose peak is inside a block's backward (small vocabulary): gradients land in
    .grad as backward goes and the block is recomputed — the loss moment alone misses."""
    records = [r for r in _pick(wrapper="single", vocab_size=256)]
    for r in records:
        assert abs(_err(r)) <= TOLERANCE
        # as a DDP-less, FSDP-less run without block moments would be predicted: the loss moment
        c = record_columns(r)
        from shardplan.formulas.activations import block_activation_bytes, head_activation_bytes, logits_backward_bytes
        from shardplan.formulas.model_states import model_states
        s = model_states(c, optimizer_step_on_device=True)
        loss_moment = int(s["params"] + s["optimizer_states"] + block_activation_bytes(c) + head_activation_bytes(c)
                          + logits_backward_bytes(c))
        assert loss_moment < (1 - TOLERANCE) * measured(r)["total_peak"]


def test_per_tensor_adamw_temporaries_off_cuda():
    """torch's AdamW loops over tensors off CUDA: two copies of the largest tensor, not one copy of all."""
    records = [r for r in _pick(method="full", wrapper="single") if r["config"]["family"] in ("mistral", "qwen2")]
    for r in records:
        assert abs(_err(r)) <= TOLERANCE
    assert any(_err(r, _with(r, optimizer_impl=st.OPT_FOREACH)) > TOLERANCE for r in records)


def test_hf_rope_is_shared_over_the_batch():
    """transformers builds cos/sin from one row of position ids: with b rows the prediction
    over-counts (the b = 2 runs, full fine-tuning, no checkpointing)."""
    for r in _pick(method="full", wrapper="single", micro_batch=2, gradient_checkpointing=False):
        assert abs(_err(r, category="activations")) < 0.001
        assert _err(r, _with(r, rope_shared_batch=False), "activations") > 0.003


# --- live runs --------------------------------------------------------------------------------
def _have_stack() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft", "bitsandbytes"))


live = pytest.mark.skipif(not _have_stack(), reason="needs torch + the 'stacks' extra (transformers, peft, bitsandbytes)")


@live
@pytest.mark.parametrize("label", ["lora-dropout-single", "qlora-fsdp2-reentrant", "full-fsdp1"])
def test_live_run_reproduces_the_committed_table(label):
    from shardplan.calibrate.hf_stack import HFStackConfig, default_hf_grid, run_hf

    pick = {"lora-dropout-single": dict(method="lora", lora_dropout=0.1, wrapper="single"),
            "qlora-fsdp2-reentrant": dict(method="qlora", wrapper="fsdp2", use_reentrant=True),
            "full-fsdp1": dict(method="full", wrapper="fsdp1")}[label]
    cfg = next(c for c in default_hf_grid() if c.family == "llama"
               and all(getattr(c, k) == v for k, v in pick.items()))
    assert isinstance(cfg, HFStackConfig)
    rec = run_hf(cfg)
    assert rec["status"] == "ok", rec.get("error")
    committed = next(r for r in RECORDS if r["key"] == cfg.key())
    assert measured(rec) == measured(committed)  # the libraries allocate what the table says
    rows = {r["category"]: r for r in compare_records([rec])}
    for cat in EXACT:
        assert rows[cat]["error"] == 0, rows[cat]
    for cat in ("activations", "total_peak"):
        assert abs(rows[cat]["error"]) <= TOLERANCE, rows[cat]


def test_lora_recompute_moment(monkeypatch):
    """A checkpointed LoRA block recomputed at the start of its backward holds PEFT's fp32
    transients (lora_B's output and its scaled copy) on top of its saved set: without that moment
    the small-vocabulary LoRA runs' peaks are missed by more than the tolerance."""
    import shardplan.formulas.memory as memory

    records = [r for r in _pick(vocab_size=256, gradient_checkpointing=True) if r["config"]["method"] == "lora"
               and r["config"]["lora_targets"] == "all-linear"]
    assert len(records) >= 4
    for r in records:
        assert abs(_err(r)) <= TOLERANCE
    monkeypatch.setattr(memory, "lora_recompute_bytes_per_token", lambda c, a: np.zeros_like(c.hidden_size))
    assert min(_err(r) for r in records) < -TOLERANCE


def test_unadapted_mlp_backward_holds_the_product_gradient():
    """LoRA on q,v: the frozen down projection never saved the MLP product, so its gradient comes on
    top in the MLP backward; treating the MLP as adapted (product saved) misses the peak."""
    for r in _pick(vocab_size=256, lora_targets="qv", method="lora"):
        assert abs(_err(r)) < 0.005
        assert abs(_err(r, _with(r, lora_mlp_adapted=1))) > TOLERANCE


# --- the lead's H100 runs of the same stack (benchmarks/gpu_campaign.py) -------------------------
GPU = [TABLE.parent / "gpu" / "hf.jsonl", TABLE.parent / "gpu" / "qlora.jsonl"]


def test_h100_lora_and_qlora_runs_within_two_percent():
    """Llama-3.1-8B / Mistral-7B LoRA and QLoRA on one H100 (torch.cuda allocated peak): the same
    formulas with CUDA's defaults (1-byte dropout mask, foreach AdamW, Adam step on the host)."""
    from shardplan.calibrate.compare_hf import campaign_peft_records
    from shardplan.calibrate.gpu_compare import campaign_columns, campaign_held_logits_bytes
    from shardplan.formulas.memory import BACKWARD, estimate_memory

    records = campaign_peft_records(GPU)
    assert len(records) >= 10
    for r in records:
        c = campaign_columns(r)
        m = estimate_memory(c)
        assert int(m["peak_moment"]) == BACKWARD
        assert int(c.lora_params) == r["trainable_params"]
        predicted = int(m["peak_allocated_bytes"]) + campaign_held_logits_bytes(r, c)
        measured_peak = r["steps"][-1]["allocated_bytes.all.peak"]
        assert abs(predicted - measured_peak) <= TOLERANCE * measured_peak, (r["config"], predicted, measured_peak)


def test_h100_lora_dropout_delta_is_the_mask_and_copy():
    """LoRA dropout 0.1 vs 0 on the H100 (no checkpointing): +1 byte (bool mask) per adapted input
    element, less block 0's q/k/v masks: predicted to within 0.01 % of the measured 2.52 GB."""
    from shardplan.calibrate.compare_hf import campaign_peft_records
    from shardplan.calibrate.gpu_compare import campaign_columns
    from shardplan.formulas.memory import estimate_memory

    runs = {(r["config"]["method"], r["config"]["lora_dropout"]): r for r in campaign_peft_records(GPU[:1])
            if r["config"]["ac"] == "none" and r["config"]["micro_batch"] == 1}
    on, off = runs[("lora", 0.1)], runs[("lora", 0.0)]
    measured_delta = on["steps"][-1]["allocated_bytes.all.peak"] - off["steps"][-1]["allocated_bytes.all.peak"]
    predicted_delta = (int(estimate_memory(campaign_columns(on))["peak_allocated_bytes"])
                       - int(estimate_memory(campaign_columns(off))["peak_allocated_bytes"]))
    assert abs(predicted_delta - measured_delta) <= 1e-4 * measured_delta, (predicted_delta, measured_delta)


def test_h100_kbit_prep_fp32_stream_and_sdpa_math_fallback():
    """QLoRA after prepare_model_for_kbit_training runs the stream in fp32 (fp32 precision over the
    4-bit base), and fp32 with grouped-query attention sends SDPA to its math backend, which keeps
    the softmax probabilities (4·heads·s per token): without that fallback the run without
    checkpointing is missed by far more than the tolerance."""
    from shardplan.calibrate.compare_hf import campaign_peft_records
    from shardplan.calibrate.gpu_compare import campaign_columns, campaign_held_logits_bytes, kbit_prep
    from shardplan.formulas.memory import estimate_memory

    runs = [r for r in campaign_peft_records(GPU) if kbit_prep(r)]
    assert len(runs) >= 4
    for r in runs:
        c = campaign_columns(r)
        measured_peak = r["steps"][-1]["allocated_bytes.all.peak"]
        predicted = int(estimate_memory(c)["peak_allocated_bytes"]) + campaign_held_logits_bytes(r, c)
        assert abs(predicted - measured_peak) <= TOLERANCE * measured_peak, (r["config"], predicted, measured_peak)
    no_ac = [r for r in runs if r["config"]["ac"] == "none"]
    for r in no_ac:
        c = dataclasses.replace(campaign_columns(r), sdpa_fp32_gqa_math=np.asarray(False))
        predicted = int(estimate_memory(c)["peak_allocated_bytes"]) + campaign_held_logits_bytes(r, c)
        assert predicted < (1 - 0.2) * r["steps"][-1]["allocated_bytes.all.peak"]
