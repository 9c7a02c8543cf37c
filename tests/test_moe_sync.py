"""The eager MoE expert loop's per-expert host syncs (``formulas/moe_sync.py``, issue 23): one
sync-delimited interval per expert, MoE block and forward pass (the recompute again, backward
none), each exposing max(host − GPU, lead). Checked while the experts, the MoE blocks, the tokens
(micro-batch), the method and the recompute vary, against a dense model (no term) and in the step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shardplan.formulas import eager_host as eh
from shardplan.formulas import moe_sync as ms
from shardplan.formulas import throughput as tp
from shardplan.formulas.columns import columns_for
from shardplan.formulas.comm import link_rates
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model

CLUSTER = parse_gpus("1xa100-80gb")
OP = eh.HOST_OP_S


def _cols(model="mixtral-8x7b", **knobs):
    config = TrainingConfig(**{"method": "lora", "ac": "none", "micro_batch": 1, "seq_len": 4096, **knobs})
    return columns_for(resolve_model(model).spec, CLUSTER, config)


def _forward(c, gpu_s):
    return float(ms.sync_exposure_s(c, gpu_s)[0])


@pytest.mark.parametrize("experts, blocks", [(8, 32), (16, 32), (8, 16), (64, 48)])
def test_gpu_bound_exposure_is_the_lead_per_expert_and_block(experts, blocks):
    """A GPU-bound interval (GPU ≫ host) exposes only the lead: blocks · E · 4 operations."""
    c = dataclasses.replace(_cols(), moe_experts=np.asarray(experts), moe_blocks=np.asarray(blocks))
    assert _forward(c, 1.0) == pytest.approx(blocks * experts * ms.EXPERT_LEAD_OPS * OP)


def test_host_bound_exposure_is_host_less_gpu():
    """With no GPU work an interval exposes the whole expert's host operations; between the two
    the exposure falls 1:1 with the GPU seconds until it reaches the lead."""
    c = _cols()
    n = float(c.moe_blocks) * float(c.moe_experts)
    assert _forward(c, 0.0) == pytest.approx(n * ms.EXPERT_FORWARD_OPS * OP)
    gpu = 5 * OP
    assert _forward(c, gpu) == pytest.approx(n * (ms.EXPERT_FORWARD_OPS * OP - gpu))


def test_exposure_falls_with_tokens_to_the_lead():
    """The expert's GEMM seconds grow with the micro-batch's tokens; a short sequence is host-bound
    (exposure above the lead), a long one GPU-bound (exactly the lead)."""
    rates = tp.compute_rates(CLUSTER)
    # seconds × the GEMM efficiency (which rises with the micro-batch's tokens) / tokens: constant
    per_token = [float(tp.expert_gemm_s(c, rates) * tp.gemm_efficiency(c, rates)) / (mb * 64)
                 for mb, c in ((mb, _cols(micro_batch=mb, seq_len=64)) for mb in (1, 2, 4))]
    assert per_token[1] == pytest.approx(per_token[0]) and per_token[2] == pytest.approx(per_token[0])
    short, long_ = _cols(seq_len=64), _cols(micro_batch=4, seq_len=4096)
    lead = float(short.moe_blocks) * float(short.moe_experts) * ms.EXPERT_LEAD_OPS * OP
    assert _forward(short, tp.expert_gemm_s(short, rates)) > 1.5 * lead
    assert _forward(long_, tp.expert_gemm_s(long_, rates)) == pytest.approx(lead)


def test_qlora_experts_add_the_4bit_operations():
    """A 4-bit expert's three Linears each add eager_host's per-Linear 4-bit operations, its first
    one's before the first GEMM."""
    q = eh.QUANT4_FORWARD / eh.LLAMA_LINEARS
    host, lead = ms.expert_operations(_cols(method="qlora"))
    assert float(host) == pytest.approx(ms.EXPERT_FORWARD_OPS + 3 * q)
    assert float(lead) == pytest.approx(ms.EXPERT_LEAD_OPS + q)


def test_backward_syncs_only_in_the_recompute():
    none, full = _cols(), _cols(ac="full")
    assert float(ms.sync_exposure_s(none, 1.0)[1]) == 0.0
    fwd, bwd = (float(x) for x in ms.sync_exposure_s(full, 1.0))
    assert bwd == pytest.approx(float(tp.recompute_fraction(full)) * fwd) and bwd > 0


def test_no_term_for_a_dense_model_or_another_stack():
    assert _forward(_cols("llama-3.1-8b"), 0.0) == 0.0
    assert float(tp.expert_gemm_s(_cols("llama-3.1-8b"), tp.compute_rates(CLUSTER))) == 0.0
    assert _forward(_cols(stack="torchtitan"), 0.0) == 0.0


def _step_s(c):
    return float(tp.step_time(c, link_rates(CLUSTER), tp.compute_rates(CLUSTER))["step_time_s"])


@pytest.mark.parametrize("model, adds", [("mixtral-8x7b", True), ("llama-3.1-8b", False)])
def test_the_step_carries_the_exposure(model, adds, monkeypatch):
    """The step with the term less the step without it: the forward's and the recompute's
    exposure for Mixtral (GPU-bound at 4096 tokens: the lead), nothing for a dense model."""
    c = _cols(model, ac="full")
    with_term = _step_s(c)
    monkeypatch.setattr(tp, "sync_exposure_s", lambda c_, g: (np.zeros(np.shape(c_.num_layers)),) * 2)
    added = with_term - _step_s(c)
    if adds:
        want = sum(float(x) for x in ms.sync_exposure_s(c, tp.expert_gemm_s(c, tp.compute_rates(CLUSTER))))
        assert added == pytest.approx(want, rel=1e-6) and added > 0
    else:
        assert added == 0.0
