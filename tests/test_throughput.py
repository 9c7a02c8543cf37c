"""Compute, step time, MFU (shardplan/throughput.py)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as hs

from shardplan import strategy as st
from shardplan.comm import link_rates
from shardplan.config import TrainingConfig, columns_for
from shardplan.hardware import parse_gpus
from shardplan.models import resolve_model
from shardplan.throughput import compute_rates, flops_per_token, model_flops_per_token, step_time, training_cost

SPEC = resolve_model("llama-3.1-8b").spec


def run(gpus="8xh100-sxm", scale_bw=1.0, **kw):
    cluster = parse_gpus(gpus)
    c = columns_for(SPEC, cluster, TrainingConfig(**kw))
    links = link_rates(cluster)
    links = dataclasses.replace(links, intra_bus_bytes_per_s=links.intra_bus_bytes_per_s * scale_bw,
                                inter_nic_bytes_per_s=links.inter_nic_bytes_per_s * scale_bw)
    return c, step_time(c, links, compute_rates(cluster))


def test_flops_match_palm_and_model_spec():
    c, _ = run(seq_len=4096)
    f = flops_per_token(c)
    six_n = float(f["fwd_matmul"] + f["bwd_matmul"])
    assert six_n == pytest.approx(6 * SPEC.matmul_params_per_token, rel=1e-3)
    # causal attention = half of PaLM's 12·L·s·q
    assert float(f["fwd_attention"] * 3) == pytest.approx(SPEC.attention_flops_per_token(4096) * 3 / 2)


def test_full_ac_adds_a_forward_and_lora_skips_weight_grads():
    c0, _ = run(ac="none")
    c1, _ = run(ac="full")
    cl, _ = run(method="lora")
    mm = lambda c: float(flops_per_token(c)["fwd_matmul"] + flops_per_token(c)["bwd_matmul"])
    head = SPEC.vocab_size * SPEC.hidden_size
    blocks = SPEC.matmul_params_per_token - head
    assert mm(c1) - mm(c0) == pytest.approx(2 * blocks, rel=1e-3)   # 8Ψ instead of 6Ψ for blocks
    assert mm(cl) / mm(c0) == pytest.approx(4 / 6, rel=0.02)       # ≈ 4Ψ + adapters


@settings(max_examples=30, deadline=None)
@given(strategy=hs.sampled_from(["ddp", "full_shard", "shard_grad_op", "hybrid_shard"]),
       ac=hs.sampled_from(["none", "selective", "full"]), mb=hs.integers(1, 4), accum=hs.integers(1, 4),
       gpus=hs.sampled_from(["8xh100-sxm", "4x8xa100-80gb", "4xrtx4090", "2x8xh100-sxm"]))
def test_step_at_least_compute_and_mfu_at_most_one(strategy, ac, mb, accum, gpus):
    _, t = run(gpus, strategy=strategy, ac=ac, micro_batch=mb, grad_accum=accum, seq_len=2048)
    assert float(t["step_time_s"]) >= float(t["compute_s"])
    assert 0 < float(t["mfu"]) <= float(t["hfu"]) <= 1
    assert float(t["exposed_comm_s"]) >= 0


@pytest.mark.parametrize("strategy", ["ddp", "full_shard", "hybrid_shard", "zero2"])
def test_step_time_falls_as_bandwidth_rises(strategy):
    engine = "deepspeed" if strategy == "zero2" else "fsdp2"
    steps = [float(run("4x8xa100-80gb", bw, strategy=strategy, engine=engine, seq_len=1024)[1]["step_time_s"])
             for bw in (0.01, 0.1, 1.0, 10.0)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))
    assert steps[0] > steps[-1]


def test_offload_costs_time():
    _, base = run(strategy="full_shard")
    _, off = run(strategy="full_shard", offload="optimizer+params")
    assert float(off["step_time_s"]) > float(base["step_time_s"])
    assert float(off["offload_transfer_s"]) > 0 and float(off["optimizer_s"]) > 0


def test_tokens_per_s_counts_grad_accumulation():
    _, one = run(grad_accum=1)
    _, four = run(grad_accum=4)
    assert float(four["tokens_per_step_per_gpu"]) == 4 * float(one["tokens_per_step_per_gpu"])
    assert float(four["tokens_per_s_per_gpu"]) >= float(one["tokens_per_s_per_gpu"])


def test_training_cost():
    out = training_cost(1e6, 8, 3.6e9, price_per_gpu_hour=2.0)
    assert out["time_to_train_s"] == pytest.approx(3600) and out["gpu_hours"] == pytest.approx(8)
    assert out["cost"] == pytest.approx(16)
