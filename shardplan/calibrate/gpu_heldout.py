"""Predicted vs measured for the GPU runs of the scripts users launch (benchmarks/gpu_userscripts.py;
issue 25), per counter and per class, on the train split or the held-out third
(``gpu_split``: the rule, the files). This module *evaluates*; it fits nothing, and no fit may
call it (tests/test_gpu_heldout.py).

A record maps to shardplan's knobs as its script sets them: Trainer / SFTTrainer -> stack ``hf``,
accelerate's FSDP plugin (param and reduce dtype bf16, ``MixedPrecisionPolicy`` from
``FullyShardedDataParallelPlugin.set_mixed_precision``), torchtitan's loop -> stack ``torchtitan``
(bf16 params, fp32 reduce). The Transformers KV cache left per finished block under a
non-reentrant ``checkpoint_wrapper`` with ``use_cache`` on (issue 21) is the ``checkpoint_wrapper``
knob. Only torchtitan's loop keeps the model config's ``use_cache``: ``Trainer.__init__`` sets
``model.config.use_cache = args.use_cache`` (transformers 5.17 ``trainer.py``; TrainingArguments'
``use_cache`` defaults to False), which the runs confirm (``use_cache_at_train`` False, and the same
bytes with the config's ``use_cache`` on or off). Counters:
``max_memory_allocated`` / ``max_memory_reserved`` over the steps after the first, NVML used less
NVML before the process (device), and the forward / backward / optimizer phase peaks.
torch-free.
"""

from __future__ import annotations

from pathlib import Path

from shardplan.calibrate import gpu_split
from shardplan.formulas.columns import Columns, columns_for
from shardplan.formulas.memory import estimate_memory
from shardplan.inputs.allocator_profile import default_allocator
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.support.quantiles import error_stats

COUNTERS = ("allocated", "reserved", "device", "forward", "backward", "optimizer")


def user_training_config(cfg: dict) -> TrainingConfig:
    """The shardplan knobs of one configuration of ``gpu_userscripts.user_grid``."""
    titan = cfg["script"] == "titan"
    sharded = titan or bool(cfg.get("fsdp"))
    checkpointed = cfg["ac"] != "none"
    qlora = cfg["method"] == "qlora"  # prepare_model_for_kbit_training: non-4-bit params in fp32
    return TrainingConfig(
        stack="torchtitan" if titan else "hf", strategy="full_shard" if sharded else "single",
        engine="fsdp1" if cfg.get("fsdp") == 1 else "fsdp2", method=cfg["method"],
        precision="fp32" if qlora else "bf16-mixed", optimizer="adamw",
        ac="full" if checkpointed else "none", reentrant_checkpointing=False if checkpointed else None,
        micro_batch=cfg["micro_batch"], seq_len=cfg["seq_len"], lora_rank=16,
        lora_targets=cfg.get("lora_targets", "all-linear"), lora_dropout=0.05 if cfg["method"] != "full" else None,
        reduce_dtype=("fp32" if titan else "bf16") if sharded else None,
        load_mode="meta_init" if titan else None,
        checkpoint_wrapper=cfg["ac"] in ("fsdp", "full") and bool(cfg["use_cache"]) and titan,
        kbit_prep=qlora or None,
        expandable_segments=False,  # the harness runs torchtitan's loop itself, not run_train.sh (which sets it)
        fused_lm_head=cfg["script"] == "sft" or None,  # TRL 1.16 SFTTrainer (record env): add_fused_lm_head
    )


def user_columns(cfg: dict, gpu: str = "h100-sxm") -> Columns:
    from shardplan.calibrate.gpu_compare import campaign_spec

    return columns_for(campaign_spec(cfg["model"]), parse_gpus(f"{cfg.get('world_size', 1)}x{gpu}"),
                       user_training_config(cfg))


def _class(cfg: dict) -> str:
    """The band class of a run: stack x method x engine (memtruth's report groups the same way)."""
    engine = "titan-fsdp2" if cfg["script"] == "titan" else (f"fsdp{cfg['fsdp']}" if cfg.get("fsdp") else "single")
    return f"{'torchtitan' if cfg['script'] == 'titan' else 'hf'} {cfg['method']} {engine}"


def predicted(cfg: dict) -> dict:
    m = estimate_memory(user_columns(cfg))
    allocated = int(m["peak_allocated_bytes"])
    reserved = allocated + int(m["stream_pool_bytes"]) + int(m["fragmentation_bytes"])
    # a fake process group creates no NCCL communicator: the device total without NCCL buffers
    return {"allocated": allocated, "reserved": reserved, "device": reserved + default_allocator().cuda_context_bytes,
            "forward": int(m["forward_peak_bytes"]), "backward": int(m["backward_peak_bytes"]),
            "optimizer": int(m["optimizer_step_peak_bytes"])}


def measured(rec: dict) -> dict:
    device = rec["nvml_used_after_steps"] - (rec.get("nvml_before") or 0) if rec.get("nvml_used_after_steps") else None
    return {"allocated": rec["max_allocated_bytes"], "reserved": rec["max_reserved_bytes"], "device": device,
            "forward": rec.get("forward_peak_allocated_bytes"), "backward": rec.get("backward_peak_allocated_bytes"),
            "optimizer": rec.get("optimizer_peak_allocated_bytes")}


def compare(rec: dict) -> dict | None:
    """One row: configuration, measured and predicted per counter, error = (predicted - measured) / measured."""
    if rec.get("status") != "ok":
        return None
    cfg = rec["config"]
    row = {"class": _class(cfg), **{k: cfg.get(k) for k in ("script", "model", "method", "fsdp", "ac", "use_cache",
                                                             "world_size", "micro_batch", "seq_len")}}
    pred, meas = predicted(cfg), measured(rec)
    for k in COUNTERS:
        row[f"measured_{k}_bytes"], row[f"predicted_{k}_bytes"] = meas[k], pred[k]
        row[f"{k}_error"] = (pred[k] - meas[k]) / meas[k] if meas[k] else None
    return row


def compare_file(path: Path) -> list[dict]:
    rows = (compare(r) for r in gpu_split.read(path))
    return [r for r in rows if r is not None]


def summary(rows: list[dict], by: str | None = None) -> list[dict]:
    """Per counter (and per ``by`` group): runs, signed median, median |error|, p90 |error|, worst."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r[by] if by else "all", []).append(r)
    out = []
    for name, g in sorted(groups.items()):
        for k in COUNTERS:
            e = [r[f"{k}_error"] for r in g if r[f"{k}_error"] is not None]
            if e:
                s = error_stats(e)
                out.append({"group": name, "counter": k, "runs": s["n"],
                            **{f: s[f] for f in ("signed_median", "median_abs", "p90_abs", "worst")}})
    return out
