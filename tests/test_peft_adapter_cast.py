"""PEFT's fp32 adapter path in the step time (``throughput.peft_adapter_cast``,
``throughput.lora_adapter_bytes_per_token``): an unwrapped LoRA built by PEFT keeps fp32 adapters
over the 16-bit base and casts each adapted Linear's input to them (peft ``tuners/lora/layer.py``
``Linear.forward``), so the adapter path moves fp32 elements plus the casts. Stacks that build their
own adapters (torchtune, LitGPT), FSDP-wrapped runs under the Trainer's mixed precision (adapters
gathered in the param dtype; without it, ``autocast`` off, they stay fp32 and the input is cast) and
bitsandbytes QLoRA (cast only without autocast) keep the 16-bit path.

The bytes are checked against their arithmetic while the adapted widths (model), the number of
layers, recompute and dropout vary; the lever against the H100 campaign's single-GPU HF LoRA
compute-only steps (``data/calibration/gpu/hf.jsonl``; nothing fitted on them).
"""

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.columns import columns_for
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model


def _cols(model="llama-3.1-8b", gpus="1xh100-sxm", **knobs):
    config = TrainingConfig(**{"method": "lora", "lora_targets": "all-linear", "lora_dropout": 0.0,
                               "ac": "none", "micro_batch": 1, "seq_len": 4096, "strategy": "single", **knobs})
    return columns_for(resolve_model(model).spec, parse_gpus(gpus), config)


def _widths(spec):
    """Σ input and Σ output widths of one block's adapted Linears (all-linear: q, k, v, o, gate, up, down)."""
    h, q, kv, i = spec.hidden_size, spec.q_width, spec.kv_width, spec.intermediate_size
    return 3 * h + q + 2 * h + i, q + 2 * kv + h + 2 * i + h


def test_only_unwrapped_peft_lora_casts():
    d, cast = tp.peft_adapter_cast(_cols(), 2)
    assert (int(d), float(cast)) == (4, 1.0)
    for c in (_cols(stack="torchtune"), _cols(stack="lightning"), _cols(gpus="8xh100-sxm", strategy="full_shard"),
              _cols(method="qlora")):
        d, cast = tp.peft_adapter_cast(c, 2)
        assert (int(d), float(cast)) == (2, 0.0)


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b", "llama-2-70b"])
def test_cast_path_bytes_follow_layers_and_widths(model):
    """a = 2, d = 4, no dropout, no recompute, per layer: forward 10·in + 28·out (casts 6·in and
    6·out, d·in, 3d + a + d + d per out), backward 16·in + 28·out; the 16-bit path 10·in + 20·out."""
    spec = resolve_model(model).spec
    ins, outs = _widths(spec)
    peft = float(tp.lora_adapter_bytes_per_token(_cols(model)))
    own = float(tp.lora_adapter_bytes_per_token(_cols(model, stack="torchtune")))
    assert peft == pytest.approx(spec.num_layers * (26 * ins + 56 * outs))
    assert own == pytest.approx(spec.num_layers * (10 * ins + 20 * outs))


def test_dropout_and_recompute_add_at_the_adapter_dtype():
    spec = resolve_model("llama-3.1-8b").spec
    ins, _ = _widths(spec)
    base = float(tp.lora_adapter_bytes_per_token(_cols()))
    drop = float(tp.lora_adapter_bytes_per_token(_cols(lora_dropout=0.1)))
    assert drop - base == pytest.approx(spec.num_layers * 2 * (2 * 4 + 1) * ins)  # fp32 copy + 1-byte mask, fwd + bwd
    c_full = _cols(ac="full")
    frac = float(tp.recompute_fraction(c_full))
    ins, outs = _widths(spec)
    assert float(tp.lora_adapter_bytes_per_token(c_full)) == pytest.approx(
        spec.num_layers * ((10 * ins + 28 * outs) * (1 + frac) + 16 * ins + 28 * outs))


def test_campaign_lora_steps_closer_with_the_cast(monkeypatch):
    """The H100 campaign's single-GPU HF LoRA runs (unwrapped PEFT): the cast path brings the
    predicted compute + optimizer time nearer the measured step than the 16-bit path does."""
    from tests.test_step_times_h100 import RECORDS, errors

    lora = [r for r in RECORDS if r["config"]["kind"] == "hf" and r["config"]["method"] == "lora"]
    assert len(lora) >= 5
    with_cast = np.median(np.abs(errors(lora)))
    monkeypatch.setattr(tp, "peft_adapter_cast", lambda c, a: (a, np.zeros_like(np.asarray(a, dtype=np.float64))))
    without = np.median(np.abs(errors(lora)))
    assert with_cast < without


def _fsdp(engine="fsdp1", **knobs):
    return _cols(gpus="2xa100-80gb", strategy="full_shard", engine=engine, **knobs)


@pytest.mark.parametrize("engine", ["fsdp1", "fsdp2"])
def test_fsdp_without_the_trainers_mixed_precision_casts_like_one_gpu(engine):
    """The hf stack's FSDP gets a MixedPrecision policy from accelerate's mixed precision, the switch
    that also turns autocast on (accelerate 1.0.1 ``state.py``): with ``autocast`` off the fp32
    adapter units are gathered in fp32 and PEFT casts each adapted input, exactly as unwrapped."""
    assert [float(x) for x in tp.peft_adapter_cast(_fsdp(engine), 2)] == [2.0, 0.0]
    assert [float(x) for x in tp.peft_adapter_cast(_fsdp(engine, autocast=False), 2)] == [4.0, 1.0]
    assert float(tp.lora_adapter_bytes_per_token(_fsdp(engine, autocast=False))) == pytest.approx(
        float(tp.lora_adapter_bytes_per_token(_cols(autocast=False))))
    # stacks whose FSDP policy is their own (torchtune builds 16-bit adapters) and DeepSpeed, which
    # casts the whole module to 16 bits, keep the 16-bit path; QLoRA's bnb path is not this one
    for c in (_fsdp(engine, autocast=False, stack="torchtune"), _fsdp(engine, autocast=False, method="qlora"),
              _cols(gpus="2xa100-80gb", strategy="zero3", engine="deepspeed", autocast=False)):
        assert [float(x) for x in tp.peft_adapter_cast(c, 2)] == [2.0, 0.0]


@pytest.mark.parametrize("targets", ["attention", "all-linear"])
def test_the_fsdp_cast_time_scales_with_tokens_and_adapted_widths(targets, monkeypatch):
    """The step time autocast-off adds under FSDP1 is the cast path's extra bytes: it doubles with
    the micro-batch and follows the adapted widths (attention-only vs all-linear targets). FSDP1's
    rate-limiter exposure (``fsdp1_limiter``), which the same bytes partly hide, is held at 0 here:
    ``tests/test_fsdp1_limiter.py`` tests it."""
    from shardplan.planning.fit import step_timings

    monkeypatch.setattr(tp, "limiter_exposure_s", lambda c, *a: (np.zeros(np.shape(c.num_layers)),) * 2)

    spec, cluster = resolve_model("llama-3.1-8b").spec, parse_gpus("2xa100-80gb")

    def added(mb, t=targets):
        cfgs = [TrainingConfig(method="lora", lora_targets=t, lora_dropout=0.0, ac="full", micro_batch=mb,
                               seq_len=4096, strategy="full_shard", engine="fsdp1", autocast=a) for a in (True, False)]
        on, off = (float(r["step_time_s"]) for r in step_timings(spec, cluster, cfgs))
        return off - on

    def extra_bytes(t):
        kw = dict(gpus="2xa100-80gb", strategy="full_shard", engine="fsdp1", ac="full", lora_targets=t)
        return float(tp.lora_adapter_bytes_per_token(_cols(autocast=False, **kw))
                     - tp.lora_adapter_bytes_per_token(_cols(**kw)))

    assert added(1) > 0
    assert added(2) == pytest.approx(2 * added(1), rel=0.05)
    other = "all-linear" if targets == "attention" else "attention"
    assert added(1) / added(1, other) == pytest.approx(extra_bytes(targets) / extra_bytes(other), rel=0.05)
