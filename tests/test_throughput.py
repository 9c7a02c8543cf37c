"""Compute, step time, MFU (shardplan/formulas/throughput.py)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from shardplan.formulas.columns import columns_for
from shardplan.formulas.comm import link_rates
from shardplan.formulas.throughput import compute_rates, flops_per_token, step_time, training_cost
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model

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



def test_recompute_extra_counts_hardware_flops_not_the_mfu_convention():
    # full AC re-runs each block's forward (2Ψ_blocks per token): on top of full fine-tuning's
    # 6Ψ that is ~1/3; under LoRA the frozen base skips weight gradients (4Ψ), so ~1/2 — the
    # planner's "recomputes N % extra FLOPs" read 0 % for LoRA while it used hfu/mfu
    head = SPEC.vocab_size * SPEC.hidden_size
    blocks = SPEC.matmul_params_per_token - head
    _, full = run(ac="full", seq_len=1024)
    _, lora = run(ac="full", seq_len=1024, method="lora")
    _, none = run(ac="none", seq_len=1024)
    assert float(none["recompute_extra"]) == 0.0
    assert float(full["recompute_extra"]) == pytest.approx(2 * blocks / (6 * (blocks + head)), rel=0.05)
    assert float(lora["recompute_extra"]) == pytest.approx(2 * blocks / (4 * (blocks + head)), rel=0.05)

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


def test_contended_interval():
    from shardplan.formulas.throughput import contended_interval_s
    # compute-bound: overlapped compute pays φ × the overlapped communication time
    assert float(contended_interval_s(1.0, 0.2, 0.5)) == pytest.approx(1.1)
    # communication-bound: the collective hides the (stretched) compute
    assert float(contended_interval_s(1.0, 0.2, 2.0)) == pytest.approx(2.0)
    # φ = 0 is the old max(compute, comm); never below either
    x = np.linspace(0, 3, 31)
    assert np.allclose(contended_interval_s(1.0, 0.0, x), np.maximum(1.0, x))
    assert np.all(contended_interval_s(1.0, 0.22, x, x / 2) >= np.maximum(1.0, x))


def test_nccl_sm_fraction_from_sm_count():
    from shardplan.formulas.throughput import NCCL_CTAS, nccl_sm_fraction
    a100, h100 = compute_rates(parse_gpus("8xa100-80gb")), compute_rates(parse_gpus("8xh100-sxm"))
    assert float(a100.nccl_sm_fraction) == pytest.approx(NCCL_CTAS / 108)
    assert float(h100.nccl_sm_fraction) == pytest.approx(NCCL_CTAS / 132)
    assert float(nccl_sm_fraction(8, 24)) == 1.0


def test_elementwise_eager_count():
    """RMSNorm 36 B and RoPE 20 B per element (16-bit), GQA repeat_kv, fp32 cross-entropy 42 B/V; the hf
    stack's rotate_half RoPE moves 8 B more per q/k element in the backward (28 B against 20)."""
    from shardplan.formulas.throughput import elementwise_bytes_per_token
    c, _ = run(seq_len=4096)
    h, q, kv, i, L, V = 4096, 4096, 1024, 14336, 32, SPEC.vocab_size
    layer = 2 * 36 * h + 20 * (q + kv) + 2 * 2 * (kv + q) + 2 * 2 * q + 6 * 2 * h + 5 * 2 * i
    assert c.stack == st.HF
    assert float(elementwise_bytes_per_token(c)) == pytest.approx(L * (layer * 3 + 8 * (q + kv)) + 42 * V)


def test_fsdp_copies_by_engine():
    from shardplan.formulas.comm import gathered_param_bytes
    from shardplan.formulas.throughput import fsdp_copy_bytes
    c2, _ = run(strategy="full_shard", engine="fsdp2")
    f, b, rs = fsdp_copy_bytes(c2)
    blocks, root = gathered_param_bytes(c2)
    assert float(f) == pytest.approx(2 * float(blocks + root)) and float(b) == pytest.approx(2 * float(blocks))
    assert float(rs) == pytest.approx((2 + 4) * SPEC.total_params, rel=1e-6)   # bf16 grads → fp32 RS input
    c1, _ = run(strategy="full_shard", engine="fsdp1")
    f1, b1, rs1 = fsdp_copy_bytes(c1)
    assert float(f1) == 0 and float(b1) == 0 and float(rs1) == float(rs)  # FlatParameter: cast only
    cd, _ = run(strategy="ddp")
    assert all(float(x) == 0 for x in fsdp_copy_bytes(cd))


def test_bf16_reduce_is_never_slower_and_cuts_reduce_time():
    """reduce_dtype=bf16 halves the reduce-scatter and replica all-reduce bytes and the chunk_cat
    write; the cast back to fp32 is 1/N of that. Step time falls (or stays) for every strategy."""
    for strategy in ("full_shard", "hybrid_shard", "shard_grad_op", "ddp"):
        _, fp32 = run("4x8xa100-80gb", strategy=strategy, reduce_dtype="fp32")
        _, bf16 = run("4x8xa100-80gb", strategy=strategy, reduce_dtype="bf16")
        assert float(bf16["step_time_s"]) <= float(fp32["step_time_s"])
        for k in ("rs_grad_s", "ar_grad_s", "ar_replica_s"):
            assert float(bf16[k]) <= float(fp32[k])
