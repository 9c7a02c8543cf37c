"""Predicted vs measured for the real Hugging Face stack (``hf_stack`` records). No torch import.

Each record carries the HF config dict it was built from; shardplan reads it with
``hf_config.spec_from_hf_config`` and maps the run to one row of ``Columns``:

* full fine-tuning unwrapped: ``single``, fp32; under FSDP: ``full_shard``, bf16-mixed (fp32
  sharded master, bf16 compute, fp32 reduce);
* LoRA / QLoRA: bf16 base, fp32 adapters (PEFT ``autocast_adapter_dtype``): bf16-mixed, method
  lora / qlora, the run's rank and targets, ``lora_dropout``;
* HF gradient checkpointing: ``ac="full"`` with ``reentrant_checkpointing`` = use_reentrant;
* the HF loss: ``logits_fp32`` (``ForCausalLMLoss`` upcasts);
* bitsandbytes: ``quant_state_sharded=False`` (the quant_state is a module attribute, replicated).

Harness specifics (stated, not fitted): a CPU run is one memory pool, so Adam's ``step`` scalars
count (``optimizer_step_on_device``; on CUDA they are host memory); CPU runs get torch's CPU
kernels (``fused_dropout=False``, ``optimizer_impl`` for_loop); ``MemTracker`` (unwrapped) does not
count the inputs, ``FSDPMemTracker`` and ``StorageTracker`` do (ids + labels, 2·8·b·s); the
model's buffers (RoPE ``inv_freq`` and ``original_inv_freq``, head_dim/2 each) are tracked;
bitsandbytes' quant_state is untracked, so the measured params and peak add the walked
``quant_state_bytes``.
"""

from __future__ import annotations

import statistics
from typing import Iterable

from shardplan.formulas.activations import block_activation_bytes, head_activation_bytes, logits_forward_bytes
from shardplan.formulas.columns import Columns, model_values
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.model_states import model_states
from shardplan.inputs import strategy as st
from shardplan.inputs.hf_config import spec_from_hf_config
from shardplan.inputs.model import ModelSpec

# The peak is the tracker's overall maximum; the trackers' module-level phase peaks are not compared
# (FSDPMemTracker's root PEAK_BW is taken at its post-backward hook, not over the whole backward).
CATEGORIES = ("params", "grads", "optimizer", "activations", "total_peak")
EXACT = ("params", "grads", "optimizer")


def record_spec(record: dict) -> ModelSpec:
    return spec_from_hf_config(record["hf_config"], name=f"hf-{record['config']['family']}-tiny")


def record_columns(record: dict, spec: ModelSpec | None = None) -> Columns:
    cfg = record["config"]
    spec = spec or record_spec(record)
    wrapped = cfg["wrapper"] != "single"
    full = cfg["method"] == "full"
    # full fine-tuning unwrapped: fp32; QLoRA after prepare_model_for_kbit_training: an fp32 stream
    precision = "fp32" if (full or cfg.get("kbit_prep")) and not wrapped else "bf16-mixed"
    engine = cfg["wrapper"] if wrapped else "fsdp2"
    return Columns.build(
        **model_values(spec, cfg["lora_rank"], cfg["lora_targets"]), world_size=cfg["world_size"],
        gpus_per_node=cfg["world_size"], gpu_memory_bytes=1 << 50, host_ram_bytes_per_node=1 << 50,
        nccl_buffer_bytes=0, strategy=st.code(st.STRATEGIES, "full_shard" if wrapped else "single", "strategy"),
        engine=st.code(st.ENGINES, engine, "engine"), precision=st.code(st.PRECISIONS, precision, "precision"),
        optimizer=st.ADAMW, ac=st.AC_FULL if cfg["gradient_checkpointing"] else st.AC_NONE, ac_every_k=1,
        offload=st.OFFLOAD_NONE, method=st.code(st.METHODS, cfg["method"], "method"),
        micro_batch=cfg["micro_batch"], seq_len=cfg["seq_len"], grad_accum=1, shard_group_size=cfg["world_size"],
        attention=st.SDPA, dropout=False, reduce_dtype=None, logits_fp32=True, lora_dropout=cfg["lora_dropout"],
        reentrant_checkpointing=bool(cfg["gradient_checkpointing"] and cfg["use_reentrant"]),
        quant_state_sharded=False, rope_shared_batch=True,
        fused_dropout=on_cuda(record), autocast=False,  # hf_stack runs no torch.autocast
        fsdp_mp_policy=True,  # but gives FSDP1/FSDP2 a MixedPrecision policy itself (hf_stack.py)
        optimizer_impl=st.OPT_FOREACH if on_cuda(record) else st.OPT_FOR_LOOP, sdpa_fp32_gqa_math=on_cuda(record),
    )


def on_cuda(record: dict) -> bool:
    """CUDA runs get the fused dropout kernel and foreach AdamW (torch defaults); CPU runs not."""
    return str(record.get("env", {}).get("device", "cpu")).startswith("cuda")


def harness_extra_bytes(record: dict, spec: ModelSpec) -> int:
    """What the tracker counts beyond the training memory model: RoPE buffers, and the inputs
    (ids + labels) where the tracker registers them (FSDPMemTracker, StorageTracker)."""
    cfg = record["config"]
    buffers = 2 * 4 * (spec.resolved_head_dim // 2)
    inputs = 0 if cfg["wrapper"] == "single" else 2 * 8 * cfg["micro_batch"] * cfg["seq_len"]
    return buffers + inputs


def predict(record: dict, columns: Columns | None = None) -> dict[str, int]:
    """Predicted bytes per category for one record (``columns``: the record's own by default;
    tests pass them with one knob changed to show what the knob's mechanism is worth)."""
    spec = record_spec(record)
    c = columns if columns is not None else record_columns(record, spec)
    # Adam's ``step`` scalars: device memory on CPU runs, host memory on CUDA (torch's default
    # non-fused, non-capturable AdamW keeps them on the CPU)
    step_on_device = not on_cuda(record)
    m = estimate_memory(c, optimizer_step_on_device=step_on_device)
    states = model_states(c, optimizer_step_on_device=step_on_device)
    extra = harness_extra_bytes(record, spec)
    return {
        "params": int(states["params"]),
        "grads": int(states["grads"]),
        "optimizer": int(states["optimizer_states"]),
        "activations": int(block_activation_bytes(c) + head_activation_bytes(c) + logits_forward_bytes(c)),
        "forward_peak": int(m["forward_peak_bytes"]) + extra,
        "backward_peak": int(m["backward_peak_bytes"]) + extra,
        "total_peak": int(m["peak_allocated_bytes"]) + extra,
    }


def measured(record: dict) -> dict[str, int]:
    """Measured bytes per category; the untracked bitsandbytes quant_state is added to the params
    and to the peak (it is alive all the time). Activations: the tracker's category maximum
    (FSDPMemTracker, StorageTracker) or, for MemTracker, the category at the forward peak."""
    m = record["measured"]
    qs = int(m.get("quant_state_bytes", 0))
    acts = int(m["activations_bytes"])
    if record.get("tracker") == "MemTracker":
        # MemTracker files what checkpointing recomputes inside backward under "Activation" too;
        # the forward's activations are those at the forward peak
        acts = int(next(iter(record["forward_peak_breakdown"].values()))["Activation"])
    return {"params": int(m["params_bytes"]) + qs, "grads": int(m["grads_bytes"]),
            "optimizer": int(m["optimizer_state_bytes"]), "activations": acts,
            "forward_peak": int(record["forward_peak_bytes"]) + qs,
            "backward_peak": int(record["backward_peak_bytes"]) + qs,
            "total_peak": int(record["total_peak_bytes"]) + qs}


def config_label(record: dict) -> str:
    from shardplan.calibrate.hf_stack import HFStackConfig

    return HFStackConfig(**record["config"]).label()


def compare_records(records: Iterable[dict]) -> list[dict]:
    rows = []
    for rec in records:
        if rec.get("status") != "ok":
            continue
        pred, meas = predict(rec), measured(rec)
        for cat in CATEGORIES:
            p, mv = pred[cat], meas[cat]
            err = 0.0 if p == mv else (float("inf") if mv == 0 else (p - mv) / mv)
            rows.append(dict(key=rec["key"], configuration=config_label(rec), family=rec["config"]["family"],
                             method=rec["config"]["method"], wrapper=rec["config"]["wrapper"], category=cat,
                             predicted_bytes=p, measured_bytes=mv, error=err))
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["category"], []).append(abs(r["error"]))
    return [dict(category=cat, n=len(groups[cat]), max_abs_error=max(groups[cat]),
                 median_abs_error=statistics.median(groups[cat])) for cat in CATEGORIES if cat in groups]


def summary_markdown(rows: list[dict], command: str = "") -> str:
    lines = ["# Real Hugging Face stack: predicted vs measured", ""]
    if command:
        lines += [f"Produced by `{command}` from `data/calibration/hf_stack_cpu.jsonl` (transformers + PEFT + "
                  "bitsandbytes on CPU; MemTracker / FSDPMemTracker / StorageTracker; FSDP on the fake process group).", ""]
    n = len({r["key"] for r in rows})
    lines += [f"{n} configurations.", "", "| category | n | max abs error | median abs error |", "| --- | ---: | ---: | ---: |"]
    for s in summarize(rows):
        lines.append(f"| {s['category']} | {s['n']} | {100 * s['max_abs_error']:.3f} % | {100 * s['median_abs_error']:.3f} % |")
    lines += ["", "| configuration | category | predicted | measured | error |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['configuration']} | {r['category']} | {r['predicted_bytes']:,} | {r['measured_bytes']:,} "
                     f"| {100 * r['error']:+.3f} % |")
    return "\n".join(lines) + "\n"


def write_outputs(rows: list[dict], csv_path=None, md_path=None, command: str = "") -> None:
    from shardplan.calibrate.results import write_csv_atomic
    from shardplan.support.atomic_write import write_text_atomic

    if csv_path:
        write_csv_atomic(csv_path, rows, columns=["key", "configuration", "family", "method", "wrapper", "category",
                                                  "predicted_bytes", "measured_bytes", "error"])
    if md_path:
        write_text_atomic(md_path, summary_markdown(rows, command))


# --- the GPU campaign's HF + PEFT runs (data/calibration/gpu/hf.jsonl, qlora.jsonl) ---------------
def campaign_peft_records(paths) -> list[dict]:
    """The campaign's LoRA and QLoRA runs (QLoRA with and without ``prepare_model_for_kbit_training``)."""
    from shardplan.calibrate.results import read_jsonl

    out = []
    for path in paths:
        for r in read_jsonl(path):
            cfg = r.get("config", {})
            if r.get("status") != "ok" or cfg.get("kind") != "hf" or cfg.get("method") not in ("lora", "qlora"):
                continue
            out.append(r)
    return out
