"""DeepSpeed config JSON (keys as ``deepspeed.runtime.config.DeepSpeedConfig`` and
``deepspeed.runtime.zero.config.DeepSpeedZeroConfig`` accept them).

Stage per strategy from the engine's declaration (``zero_stage``, docs/engines.md); ``hybrid_shard`` is ZeRO-3 with ZeRO++ hpZ
(``zero_hpz_partition_size``: a secondary copy of the parameters sharded within the group, so the
forward/backward all-gathers stay inside it). MiCS (``mics_shard_size``), the closer match to HSDP,
was removed in DeepSpeed 0.19 (deepspeedai/DeepSpeed#8489). ASSUMPTION noted for the memory
model: hpZ still shards optimizer states and gradients over all ranks. Buckets: the engine's
declared ones (data/engine_profiles/deepspeed.json ``collectives``: DeepSpeed's own defaults, 5e8
elements, ``runtime/zero/config.py``), the numbers shardplan's buffer and call-count terms assume.
An engine whose declaration quantizes its collectives (ZeRO++, Wang et al. 2023, arXiv 2306.10209)
gets DeepSpeed's switches for them: ``zero_quantized_weights`` (qwZ, int8 weight all-gather) and
``zero_quantized_gradients`` (qgZ, int4 all-to-all gradient reduction); ``read_back`` names that
engine again. train_batch_size = micro × accum × world.
"""

from __future__ import annotations

import json
from typing import Any

from shardplan.exporters.spec import PlanSpec
from shardplan.inputs.engine_lookup import get_engine, runs_deepspeed
from shardplan.inputs.engines import engine_profiles
from shardplan.support.errors import ShardplanError

OPTIMIZER_TYPES = {"adamw": "AdamW", "sgd": "SGD", "sgd-plain": "SGD", "lion": "Lion"}  # DeepSpeed-native; others: client optimizer


def _buckets(spec: PlanSpec) -> tuple[int, int]:
    """(reduce, all-gather) bucket elements the plan's numbers assumed: its engine's declaration
    when DeepSpeed runs it, else DeepSpeed's."""
    c = get_engine(spec.engine if runs_deepspeed(spec.engine) else "deepspeed").collectives
    gather = c.param_gather_bucket or c.gradient_bucket
    return c.gradient_bucket.value, gather.value


def _zero_section(spec: PlanSpec, stage: int) -> dict[str, Any]:
    """``zero_optimization`` without offload: stage, buckets, stage-3 prefetch/persistence, hpZ
    and the quantized collectives the engine declares."""
    reduce_bucket, gather_bucket = _buckets(spec)
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 1:
        zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=reduce_bucket)
    if stage in (1, 2):
        zero.update(allgather_partitions=True, allgather_bucket_size=gather_bucket, reduce_scatter=True)
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * reduce_bucket),
                    stage3_param_persistence_threshold=100_000, stage3_max_live_parameters=1_000_000_000,
                    stage3_max_reuse_distance=1_000_000_000, stage3_gather_16bit_weights_on_model_save=True)
        if spec.hybrid and spec.shard_size < spec.world_size:
            zero["zero_hpz_partition_size"] = spec.shard_size
    if runs_deepspeed(spec.engine):
        c = get_engine(spec.engine).collectives
        if c.weight_gather_quantization is not None:
            zero["zero_quantized_weights"] = True
        if c.gradient_quantization is not None:
            zero["zero_quantized_gradients"] = True
    return zero


def deepspeed_config(spec: PlanSpec) -> dict[str, Any]:
    stage = spec.zero_stage
    if spec.offload != "none" and stage == 0:
        raise ShardplanError("offload", spec.offload, "DeepSpeed offloads only at ZeRO stage 1-3")
    if spec.offload == "optimizer+params" and stage != 3:
        raise ShardplanError("offload", spec.offload, "DeepSpeed offloads parameters only at ZeRO stage 3; "
                                                      "use --offload optimizer")
    zero = _zero_section(spec, stage)
    if spec.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if spec.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_batch_size": spec.global_batch,
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "gradient_clipping": 1.0,
    }
    if spec.precision in ("bf16-mixed", "bf16-pure"):
        config["bf16"] = {"enabled": True}
    elif spec.precision == "fp16-mixed":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    if spec.reduce_dtype in ("fp32", "bf16", "fp16"):
        # the gradient reduction dtype the plan assumed (DeepSpeed config docs: communication_data_type)
        config["communication_data_type"] = spec.reduce_dtype
    config["zero_optimization"] = zero
    if spec.optimizer in OPTIMIZER_TYPES:
        params: dict[str, Any] = {"lr": 1e-5}
        if spec.optimizer == "adamw":
            params.update(betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0)
        if spec.optimizer == "sgd":
            params["momentum"] = 0.9
        config["optimizer"] = {"type": OPTIMIZER_TYPES[spec.optimizer], "params": params}
    config["steps_per_print"] = 100
    config["wall_clock_breakdown"] = False
    return config


def deepspeed_json(spec: PlanSpec) -> str:
    """JSON has no comments, so the file carries only DeepSpeed keys (the plan summary is in
    the other exports and in ``shardplan fit``'s report)."""
    return json.dumps(deepspeed_config(spec), indent=2) + "\n"


def _engine_of(zero: dict[str, Any]) -> str:
    """The DeepSpeed-run engine whose declared quantized collectives match the config's switches."""
    wanted = (bool(zero.get("zero_quantized_weights")), bool(zero.get("zero_quantized_gradients")))
    for e in engine_profiles():
        c = e.collectives
        if runs_deepspeed(e.name) and (c.weight_gather_quantization is not None,
                                       c.gradient_quantization is not None) == wanted:
            return e.name
    raise ShardplanError("zero_optimization", f"zero_quantized_weights={wanted[0]}, zero_quantized_gradients={wanted[1]}",
                         "no declared engine quantizes exactly these collectives")


def read_back(text: str) -> dict[str, Any]:
    """Knobs a DeepSpeed config states: engine, stage (as a strategy), precision, offload, batch sizes, optimizer."""
    c = json.loads(text)
    z = c.get("zero_optimization", {})
    stage = z.get("stage", 0)
    world = c["train_batch_size"] // (c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"])
    hpz = z.get("zero_hpz_partition_size")
    strategy = "hybrid_shard" if hpz else {0: "ddp", 1: "zero1", 2: "zero2", 3: "full_shard"}[stage]
    offload = ("optimizer+params" if "offload_param" in z else "optimizer" if "offload_optimizer" in z else "none")
    precision = ("bf16-mixed" if c.get("bf16", {}).get("enabled") else
                 "fp16-mixed" if c.get("fp16", {}).get("enabled") else "fp32")
    return {"engine": _engine_of(z), "zero_stage": stage, "strategy": strategy, "precision": precision,
            "offload": offload, "micro_batch": c["train_micro_batch_size_per_gpu"],
            "grad_accum": c["gradient_accumulation_steps"], "world_size": world,
            "shard_group_size": hpz or (world if stage == 3 else 1 if stage == 0 else world),
            "optimizer": _optimizer_name(c.get("optimizer", {}))}


def _optimizer_name(optimizer: dict[str, Any]) -> str | None:
    """The plan's optimizer for a config's ``optimizer`` section: SGD with momentum is ``sgd``."""
    if optimizer.get("type") == "SGD":
        return "sgd" if optimizer.get("params", {}).get("momentum") else "sgd-plain"
    return {v: k for k, v in OPTIMIZER_TYPES.items()}.get(optimizer.get("type"))
