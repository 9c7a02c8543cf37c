"""Transformers' eager expert loop in the step time (``throughput.moe_dispatch_bytes_per_token``):
per MoE block the zero buffer, each token's k gathered / scaled / index-added rows, and in backward
each expert's full-size gather gradient and its accumulation. Checked against its arithmetic while
the experts E, the experts per token k, the MoE blocks and recompute vary, and against the
development set's Mixtral rows (fms-acceleration, HF Trainer): nothing fitted on them.
"""

import dataclasses

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.columns import columns_for
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.validation import tokens


def _cols(model="mixtral-8x7b", **knobs):
    config = TrainingConfig(**{"method": "full", "ac": "none", "micro_batch": 1, "seq_len": 4096, **knobs})
    return columns_for(resolve_model(model).spec, parse_gpus("8xa100-80gb"), config)


@pytest.mark.parametrize("experts, top_k", [(8, 2), (16, 2), (64, 6), (128, 8)])
def test_dispatch_bytes_follow_experts_and_top_k(experts, top_k):
    """a·h·(1 + 7k) forward + a·h·(4E + 11k) backward per MoE block (a = 2, no recompute)."""
    c = dataclasses.replace(_cols(), moe_experts=np.asarray(experts), moe_top_k=np.asarray(top_k))
    h, blocks = float(c.hidden_size), float(c.moe_blocks)
    assert float(tp.moe_dispatch_bytes_per_token(c)) == pytest.approx(blocks * 2 * h * (1 + 7 * top_k + 4 * experts + 11 * top_k))


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"])
def test_dispatch_bytes_per_model_and_recompute(model):
    spec = resolve_model(model).spec
    e, k, h, blocks = spec.moe.num_experts, spec.moe.experts_per_token, spec.hidden_size, spec.num_moe_blocks
    assert blocks > 0
    none = float(tp.moe_dispatch_bytes_per_token(_cols(model)))
    assert none == pytest.approx(blocks * 2 * h * (1 + 7 * k + 4 * e + 11 * k))
    c_full = _cols(model, ac="full")
    frac = float(tp.recompute_fraction(c_full))
    full = float(tp.moe_dispatch_bytes_per_token(c_full))
    assert full - none == pytest.approx(blocks * 2 * h * (1 + 7 * k) * frac)  # recompute repeats the forward only


def test_no_dispatch_bytes_for_dense_models_or_other_stacks():
    assert float(tp.moe_dispatch_bytes_per_token(_cols("llama-3.1-8b"))) == 0.0
    assert float(tp.moe_dispatch_bytes_per_token(_cols(stack="torchtitan"))) == 0.0
    dense_in_elementwise = float(tp.elementwise_bytes_per_token(_cols())) - float(tp.moe_dispatch_bytes_per_token(_cols()))
    # the same block bytes once both rotate q and k as Transformers does (rope_form rotate_half)
    other = _cols(stack="torchtitan", rope_form="rotate_half")
    assert dense_in_elementwise == pytest.approx(float(tp.elementwise_bytes_per_token(other)))


def test_mixtral_dev_set_rows_closer_with_the_loop(monkeypatch):
    """The fms-acceleration Mixtral rows (HF Trainer, eager expert loop): median |error| falls."""
    from shardplan.validation.runs import RunQuery, read_runs

    queries = [q for q in read_runs(tokens.RUNS) if isinstance(q, RunQuery) and q.measured_tokens_per_s_per_gpu
               and q.spec.moe is not None and q.config.stack == "hf"]
    assert len(queries) >= 10
    with_loop = np.median([abs(r.error) for r in tokens.predict(queries)])
    monkeypatch.setattr(tp, "moe_dispatch_bytes_per_token", lambda c: 0.0)
    without = np.median([abs(r.error) for r in tokens.predict(queries)])
    assert with_loop < without
