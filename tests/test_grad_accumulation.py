"""Gradient accumulation without sync is a memory term of ``estimate_memory``: ``fit``, ``plan``
and ``sweep`` count the same bytes for the same configuration (the knob is the
``sync_every_micro_batch`` column), and the term is the whole model's unsharded gradients
(``comm.no_sync_grad_bytes``) in every forward and backward moment."""

import numpy as np
import pytest

from shardplan.formulas.columns import columns_for
from shardplan.formulas.comm import no_sync_grad_bytes
from shardplan.formulas.memory import estimate_memory
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.planning.fit import evaluate
from shardplan.planning.grid_sweep import sweep
from shardplan.planning.planner import build_grid, evaluate_grid, resolve_workload

MODEL, GPUS = "llama-3.1-8b", "8xh100-sxm"
ACCUM, MICRO, SEQ = 4, 1, 2048
TOTALS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes")


def _config(sync: bool, engine: str = "fsdp2", strategy: str = "full_shard") -> TrainingConfig:
    return TrainingConfig(strategy=strategy, engine=engine, ac="full", micro_batch=MICRO, seq_len=SEQ,
                          grad_accum=ACCUM, sync_every_micro_batch=sync)


def _fit(sync, engine, strategy):
    r = evaluate(resolve_model(MODEL).spec, parse_gpus(GPUS), _config(sync, engine, strategy))
    return {k: getattr(r.per_gpu, k) for k in TOTALS}


def _sweep(sync, engine, strategy):
    df = sweep(models=MODEL, gpus="h100-sxm", gpu_counts=8, strategies=strategy, engines=engine, ac="full",
               micro_batch=MICRO, seq_len=SEQ, grad_accum=ACCUM, sync_every_micro_batch=sync)
    assert len(df) == 1
    return {k: int(df[k].iloc[0]) for k in TOTALS}


def _plan(sync, engine, strategy):
    """The planner's own evaluator over its candidate grid, at the row of this configuration."""
    cluster = parse_gpus(GPUS)
    base = TrainingConfig(strategy=strategy, engine=engine, ac="full", micro_batch=MICRO, seq_len=SEQ, offload="none")
    workload = resolve_workload(SEQ, cluster.world_size, global_batch_sequences=MICRO * ACCUM * cluster.world_size)
    c, extra = build_grid(resolve_model(MODEL).spec, cluster, base, workload)
    r = evaluate_grid(c, extra["sync_every_micro_batch"], cluster)
    row = np.flatnonzero((extra["sync_every_micro_batch"] == sync) & (c.grad_accum == ACCUM) & (c.micro_batch == MICRO))
    assert len(row) == 1, row
    return {k: int(r[k][row[0]]) for k in TOTALS}


@pytest.mark.parametrize("engine,strategy", [("fsdp2", "full_shard"), ("fsdp1", "full_shard"), ("fsdp2", "shard_grad_op")])
@pytest.mark.parametrize("sync", [True, False])
def test_fit_plan_and_sweep_count_the_same_bytes(engine, strategy, sync):
    fit, plan, swept = _fit(sync, engine, strategy), _plan(sync, engine, strategy), _sweep(sync, engine, strategy)
    assert fit == plan == swept


def test_no_sync_adds_the_unsharded_gradients_to_forward_and_backward():
    """Llama-3.1-8B on 8 GPUs, FSDP2 full_shard, bf16 with fp32 reduction, 4 micro-batches: no_sync
    holds 4 B x 8,030,261,248 trainable parameters = 32,121,044,992 B more in every forward and
    backward moment (comm.no_sync_grad_bytes; the FSDP ``no_sync`` docstring), none at the step."""
    spec, cluster = resolve_model(MODEL).spec, parse_gpus(GPUS)
    synced = estimate_memory(columns_for(spec, cluster, _config(True)))
    held_c = columns_for(spec, cluster, _config(False))
    held = estimate_memory(held_c)
    extra = int(no_sync_grad_bytes(held_c))
    assert extra == 4 * spec.total_params == 32_121_044_992
    for phase in ("forward_peak_bytes", "backward_peak_bytes"):
        assert int(held[phase]) - int(synced[phase]) == extra, phase
    assert int(held["optimizer_step_peak_bytes"]) == int(synced["optimizer_step_peak_bytes"])
    assert int(held["unsharded_grads"]) - int(synced["unsharded_grads"]) == extra


def test_sync_default_is_every_micro_batch_and_deepspeed_and_ddp_hold_nothing_more():
    spec, cluster = resolve_model(MODEL).spec, parse_gpus(GPUS)
    assert TrainingConfig().sync_every_micro_batch is True
    for engine, strategy in (("deepspeed", "zero1"), ("fsdp2", "ddp")):  # gradients unsharded anyway
        a = estimate_memory(columns_for(spec, cluster, _config(True, engine, strategy)))
        b = estimate_memory(columns_for(spec, cluster, _config(False, engine, strategy)))
        assert int(a["peak_allocated_bytes"]) == int(b["peak_allocated_bytes"]), (engine, strategy)
