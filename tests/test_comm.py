"""Communication volumes and α-β times (shardplan/formulas/comm.py)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from shardplan.formulas.columns import columns_for
from shardplan.formulas.comm import (
    algbw_to_busbw,
    busbw_to_algbw,
    collective_time_s,
    comm_times,
    comm_volume,
    link_rates,
    no_sync_grad_bytes,
    ring_bus_bytes_per_s,
    ring_factor,
)
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model

SPEC = resolve_model("llama-3.1-8b").spec


def cols(gpus="8xh100-sxm", **kw):
    cluster = parse_gpus(gpus)
    return columns_for(SPEC, cluster, TrainingConfig(**kw)), cluster


def no_root(c):
    """The ZeRO paper's accounting has no root unit kept unsharded between forward and backward."""
    return dataclasses.replace(c, root_params=np.zeros_like(c.root_params))


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_full_shard_moves_1_5x_ddp_and_shard_grad_op_1x(precision):
    """ZeRO paper §7: DDP 2Ψ, stage 3 3Ψ (1.5×), SHARD_GRAD_OP 2Ψ — with one dtype throughout."""
    ddp = comm_volume(no_root(cols(strategy="ddp", precision=precision)[0]))["comm_bytes_per_step"]
    fs = comm_volume(no_root(cols(strategy="full_shard", precision=precision)[0]))["comm_bytes_per_step"]
    sgo = comm_volume(no_root(cols(strategy="shard_grad_op", precision=precision)[0]))["comm_bytes_per_step"]
    assert float(fs / ddp) == pytest.approx(1.5, rel=1e-9)
    assert float(sgo / ddp) == pytest.approx(1.0, rel=1e-9)


def test_fsdp_root_skips_backward_all_gather():
    c, _ = cols(strategy="full_shard", precision="fp32")
    v = comm_volume(c)
    assert int(v["ag_fwd_bytes"]) - int(v["ag_bwd_bytes"]) == pytest.approx(7 / 8 * 4 * SPEC.root_params, rel=1e-9)


@given(n=hs.integers(2, 4096), algbw=hs.floats(1e6, 1e12))
def test_busbw_algbw_round_trip(n, algbw):
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert float(busbw_to_algbw(algbw_to_busbw(algbw, op, n), op, n)) == pytest.approx(algbw, rel=1e-12)


def test_nccl_tests_factors():
    """nccl-tests doc/PERFORMANCE.md: AG/RS busbw = algbw·(n−1)/n, AR busbw = algbw·2(n−1)/n."""
    assert float(algbw_to_busbw(100.0, "all_gather", 8)) == pytest.approx(87.5)
    assert float(algbw_to_busbw(100.0, "reduce_scatter", 4)) == pytest.approx(75.0)
    assert float(algbw_to_busbw(100.0, "all_reduce", 8)) == pytest.approx(175.0)
    assert float(ring_factor("all_gather", 1)) == 0.0


def test_hsdp_cross_node_bytes():
    """HSDP: 2·(r−1)/r·Ψ·b/g bytes per GPU per sync across replicas."""
    c, _ = cols("4x8xh100-sxm", strategy="hybrid_shard", precision="bf16-mixed")
    v = comm_volume(c)
    g, r, b = 8, 4, 4  # fp32 reduce dtype under bf16-mixed
    assert int(v["ar_replica_bytes"]) == pytest.approx(2 * (r - 1) / r * SPEC.total_params * b / g, rel=1e-9)
    assert int(v["replicas"]) == r and int(v["rs_grad_group"]) == g


def test_grad_accumulation_sync_modes_and_no_sync_memory():
    c, _ = cols(strategy="full_shard", grad_accum=4)
    every, once = comm_volume(c, True), comm_volume(c, False)
    assert int(every["rs_grad_bytes"]) == 4 * int(once["rs_grad_bytes"])
    assert int(every["ag_fwd_bytes"]) == int(once["ag_fwd_bytes"])  # params are gathered every micro-batch anyway
    assert int(no_sync_grad_bytes(c, False)) == 4 * SPEC.total_params and int(no_sync_grad_bytes(c, True)) == 0
    ddp, _ = cols(strategy="ddp", grad_accum=4)
    assert int(no_sync_grad_bytes(ddp, False)) == 0  # DDP gradients are unsharded anyway


def test_lora_reduces_only_adapters_but_gathers_base():
    full = comm_volume(cols(strategy="full_shard")[0])
    lora = comm_volume(cols(strategy="full_shard", method="lora")[0])
    assert int(lora["rs_grad_bytes"]) < int(full["rs_grad_bytes"]) / 100
    assert int(lora["ag_fwd_bytes"]) > int(full["ag_fwd_bytes"]) / 2


def test_deepspeed_zero2_all_gathers_after_step():
    v = comm_volume(cols(strategy="zero2", engine="deepspeed")[0])
    assert int(v["ag_post_step_bytes"]) == pytest.approx(7 / 8 * 2 * SPEC.total_params, rel=1e-9)
    assert int(v["ag_fwd_bytes"]) == 0 and int(v["ar_grad_bytes"]) == 0


def test_flat_ring_limited_by_slowest_hop():
    _, cluster = cols("2x8xa100-80gb")
    rates = link_rates(cluster.model_copy(update={"nics_per_node": 4, "inter_link": cluster.inter_link}))
    # 8 A100 + 4 HDR NICs: 4 × 24 GB/s = 96 GB/s (nccl-tests issue #119)
    assert float(ring_bus_bytes_per_s(16, 8, rates)) == pytest.approx(96e9)
    assert float(ring_bus_bytes_per_s(8, 8, rates)) == pytest.approx(240e9)


def test_time_alpha_beta_and_single_rank():
    assert float(collective_time_s("all_gather", 1e9, 1, 1e-5, 1e11)) == 0.0
    t = float(collective_time_s("all_reduce", 1e9, 8, 1.08e-5, 1e11))
    assert t == pytest.approx(1.08e-5 * 2 + 1.75e9 / 1e11, rel=0.05)
    c, cluster = cols(strategy="full_shard")
    times = comm_times(c, link_rates(cluster))
    assert all(float(v) >= 0 for v in times.values())


# --- reduce dtype knob ------------------------------------------------------------------------
def test_default_reduce_dtype_per_engine():
    """fp32 under FSDP/DDP mixed precision (torchtitan), 16-bit for DeepSpeed, param dtype when pure."""
    assert int(columns_for(SPEC, parse_gpus("8xh100-sxm"), TrainingConfig()).reduce_dtype) == st.REDUCE_FP32
    assert int(cols(engine="deepspeed")[0].reduce_dtype) == st.REDUCE_PARAM
    assert int(cols(strategy="ddp")[0].reduce_dtype) == st.REDUCE_FP32
    assert int(cols(precision="bf16-pure")[0].reduce_dtype) == st.REDUCE_PARAM


@pytest.mark.parametrize("strategy,engine,name", [("full_shard", "fsdp2", "rs_grad"), ("full_shard", "fsdp1", "rs_grad"),
                                                   ("ddp", "fsdp2", "ar_grad"), ("hybrid_shard", "fsdp1", "ar_replica"),
                                                   ("zero2", "deepspeed", "rs_grad")])
def test_bf16_reduce_halves_gradient_bytes_only(strategy, engine, name):
    """reduce_dtype=bf16: gradient collectives move 2 B/element instead of 4; all-gathers unchanged.
    DeepSpeed's default is already 16-bit, so its fp32 knob doubles instead."""
    fp32 = comm_volume(cols("16xh100-sxm", strategy=strategy, engine=engine, reduce_dtype="fp32")[0])
    bf16 = comm_volume(cols("16xh100-sxm", strategy=strategy, engine=engine, reduce_dtype="bf16")[0])
    assert int(bf16[f"{name}_message_bytes"]) * 2 == int(fp32[f"{name}_message_bytes"]) > 0
    assert int(bf16["ag_fwd_bytes"]) == int(fp32["ag_fwd_bytes"])
    default = comm_volume(cols("16xh100-sxm", strategy=strategy, engine=engine)[0])
    assert int(default[f"{name}_message_bytes"]) == int((bf16 if engine == "deepspeed" else fp32)[f"{name}_message_bytes"])


def test_hsdp_cross_node_bytes_follow_reduce_dtype():
    """HSDP replica all-reduce per GPU = 2(r−1)/r·Ψ·b/g with b the reduce dtype's bytes."""
    c, _ = cols("4x8xh100-sxm", strategy="hybrid_shard", reduce_dtype="bf16")
    v = comm_volume(c)
    r, g = 4, 8
    assert int(v["ar_replica_bytes"]) == pytest.approx(2 * (r - 1) / r * SPEC.total_params * 2 / g, rel=1e-9)


def test_reduce_dtype_param_is_compute_dtype_and_unknown_is_an_error():
    from shardplan.support.errors import ShardplanError
    c, _ = cols(reduce_dtype="param")
    assert int(comm_volume(c)["rs_grad_message_bytes"]) == SPEC.total_params * 2
    c, _ = cols(precision="fp32", reduce_dtype="param")
    assert int(comm_volume(c)["rs_grad_message_bytes"]) == SPEC.total_params * 4
    with pytest.raises(ShardplanError, match="reduce_dtype"):
        cols(reduce_dtype="fp8")
