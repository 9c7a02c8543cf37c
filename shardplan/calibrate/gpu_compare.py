"""Predicted vs measured on the GPU campaign's records (benchmarks/gpu_campaign.py).

Each record is one training configuration run on one CUDA GPU: Hugging Face models built from
their published configs with random weights, PEFT LoRA / bitsandbytes QLoRA on one GPU, or
FSDP2 / FSDP1 with a fake process group on real CUDA tensors (rank 0 of W ranks). Measured:
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the last step and NVML's used
memory less the process's baseline. This module maps a record to a shardplan configuration and
puts the three predictions beside them. torch-free.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from shardplan.formulas.columns import Columns, columns_for
from shardplan.formulas.memory import estimate_memory
from shardplan.inputs import strategy as st
from shardplan.inputs.allocator_profile import default_allocator
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.hf_config import spec_from_hf_config
from shardplan.inputs.model import ModelSpec

# Llama-3.2-1B has no built-in profile; the campaign's copy of its published config.
LLAMA_32_1B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
               "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
               "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True}


def campaign_spec(name: str) -> ModelSpec:
    """The campaign's model names (Hugging Face names of built-in profiles, and Llama-3.2-1B)."""
    from shardplan.inputs.models import resolve_model

    if name == "Llama-3.2-1B":
        return spec_from_hf_config(dict(LLAMA_32_1B), name)
    return resolve_model(name).spec


def kbit_prep(record: dict) -> bool:
    """QLoRA prepared with PEFT's ``prepare_model_for_kbit_training`` (the campaign's default): every
    non-4-bit parameter cast to fp32 (``peft/utils/other.py``), so the stream, the attention and the
    logits run in fp32 over the 4-bit base — shardplan's fp32 precision with QLoRA (model_states.py)."""
    cfg = record["config"]
    return cfg.get("method") == "qlora" and cfg.get("kbit_prep", True)


def campaign_held_logits_bytes(record: dict, c: Columns) -> int:
    """The campaign's loop keeps ``out`` (with the logits, a·b·s·V) alive through ``backward`` and the
    step (``out = model(...); out.loss.backward()``), unlike the HF Trainer's ``compute_loss``."""
    a = 4 if int(c.precision) == st.FP32 else 2
    return int(a * c.micro_batch * c.seq_len * c.vocab_size)


def training_config(cfg: dict) -> TrainingConfig:
    """The shardplan knobs of one campaign configuration."""
    fsdp = cfg["kind"] == "fsdp"
    ac = cfg.get("ac", "none")
    optimizer = {"adamw_8bit": "adamw-8bit"}.get(cfg.get("optimizer", "adamw_foreach"), "adamw")
    return TrainingConfig(
        stack="hf", strategy=cfg.get("strategy", "full_shard") if fsdp else "single",
        precision="fp32" if kbit_prep({"config": cfg}) else "bf16-mixed",
        engine=cfg.get("engine", "fsdp2"), method=cfg["method"], optimizer=optimizer,
        ac="full" if ac.startswith("full") else "none", reentrant_checkpointing=ac == "full_reentrant",
        micro_batch=cfg["micro_batch"], seq_len=cfg["seq_len"], lora_rank=cfg.get("lora_rank", 16),
        lora_targets=cfg.get("lora_targets", "all-linear"), lora_dropout=cfg.get("lora_dropout", 0.0),
        reduce_dtype=cfg.get("reduce_dtype", "fp32") if fsdp else None,
        load_mode="meta_init" if fsdp else None,
        expandable_segments=bool(cfg.get("expandable_segments", False)),
        # the campaign checkpoints FSDP runs with torch's apply_activation_checkpointing (checkpoint_wrapper)
        checkpoint_wrapper=fsdp and ac != "none",
        # its training loop left the model config's use_cache on (transformers' default): the KV cache
        # under the wrapper is what its FSDP + AC runs held beyond the model (memory.kv_cache_leftover_bytes)
        use_cache=fsdp and ac != "none",
        # the campaign's own loop builds torch.optim.AdamW(foreach=...) or (fused=...) (gpu_campaign._optimizer)
        optimizer_impl="fused" if cfg.get("optimizer") == "adamw_fused" else "foreach",
    )


def campaign_columns(record: dict, gpu: str = "h100-sxm") -> Columns:
    """One campaign record as shardplan's columns (W = the run's world size of ``gpu``)."""
    cfg = record["config"]
    c = columns_for(campaign_spec(cfg["model"]), parse_gpus(f"{cfg.get('world_size', 1)}x{gpu}"), training_config(cfg))
    # the campaign's loop autocasts only HF full fine-tunes (gpu_campaign.run_one: autocast = hf and full)
    # and builds FSDP's MixedPrecision policy itself (gpu_campaign: MixedPrecisionPolicy / MixedPrecision),
    # except where a configuration says mixed_precision "no" (bf16 weights, no policy: fsdp1world)
    return dataclasses.replace(c, autocast=np.asarray(cfg["kind"] == "hf" and cfg["method"] == "full"),
                               fsdp_mp_policy=np.asarray(cfg.get("mixed_precision") != "no"))


def compute_step_s(record: dict, gpu: str = "h100-sxm") -> float:
    """The time model's compute + GPU optimizer seconds for one campaign record at kernel rates
    (window factor 1): what a compute-only step on the fake process group measures."""
    from shardplan.formulas import throughput as tp
    from shardplan.formulas.comm import link_rates

    cluster = parse_gpus(f"{record['config'].get('world_size', 1)}x{gpu}")
    t = tp.step_time(campaign_columns(record, gpu), link_rates(cluster), tp.compute_rates(cluster))
    return float(t["compute_s"] + t["optimizer_s"])


def compare_record(rec: dict, gpu: str = "h100-sxm") -> dict | None:
    """One row: the configuration, measured and predicted allocated / reserved / device total."""
    if rec.get("status") != "ok":
        return None
    cfg = rec["config"]
    c = campaign_columns(rec, gpu)
    m = estimate_memory(c)
    # the campaign's loop keeps ``out`` (its bf16 logits) alive through backward and the step
    # (``compare_hf.campaign_held_logits_bytes``): a harness artifact, added to the prediction
    held = campaign_held_logits_bytes(rec, c)
    allocated = max(int(m["forward_peak_bytes"]), int(m["backward_peak_bytes"]) + held,
                    int(m["optimizer_step_peak_bytes"]) + held)
    reserved = allocated + int(m["stream_pool_bytes"]) + int(m["fragmentation_bytes"])
    baseline = rec.get("nvml_before") or 0
    measured_device = rec["nvml_used_after_steps"] - baseline if rec.get("nvml_used_after_steps") else None
    # A fake process group creates no NCCL communicator: the device total without NCCL buffers.
    predicted_device = reserved + default_allocator().cuda_context_bytes
    row = {
        "kind": cfg["kind"], "model": cfg["model"], "engine": cfg.get("engine", "-") if cfg["kind"] == "fsdp" else "single",
        "world_size": cfg.get("world_size", 1), "method": cfg["method"], "ac": cfg.get("ac", "none"),
        "lora_dropout": cfg.get("lora_dropout", 0.0), "lora_targets": cfg.get("lora_targets", ""),
        "micro_batch": cfg["micro_batch"], "seq_len": cfg["seq_len"], "optimizer": cfg.get("optimizer", "adamw_foreach"),
        "strategy": cfg.get("strategy", "full_shard" if cfg["kind"] == "fsdp" else "single"),
        "expandable_segments": bool(cfg.get("expandable_segments", False)),
        "measured_allocated_bytes": rec["max_allocated_bytes"], "predicted_allocated_bytes": allocated,
        "measured_reserved_bytes": rec["max_reserved_bytes"], "predicted_reserved_bytes": reserved,
        "measured_device_bytes": measured_device, "predicted_device_bytes": predicted_device,
        "predicted_band_bytes": int(m["allocator_band_bytes"]),
    }
    for what in ("allocated", "reserved", "device"):
        meas, pred = row[f"measured_{what}_bytes"], row[f"predicted_{what}_bytes"]
        row[f"{what}_error"] = None if not meas else (pred - meas) / meas
    return row


def load_records(folder: Path) -> list[dict]:
    """Every record of the campaign's JSONL files, with ``expandable_segments`` set on the reruns."""
    return [rec for path in sorted(Path(folder).glob("*.jsonl")) if path.name not in ("probes.jsonl", "load.jsonl")
            for rec in load_file(path)]


def load_file(path: Path) -> list[dict]:
    """One campaign file's records (``expandable_segments`` set on the reruns' file)."""
    out = []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if Path(path).name == "expandable_segments.jsonl":
            rec["config"]["expandable_segments"] = True
        out.append(rec)
    return out


def compare_folder(folder: Path) -> list[dict]:
    rows = (compare_record(r) for r in load_records(folder))
    return [r for r in rows if r is not None]
