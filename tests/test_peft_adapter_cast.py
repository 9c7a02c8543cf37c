"""PEFT's fp32 adapter path in the step time (``throughput.peft_adapter_cast``,
``throughput.lora_adapter_bytes_per_token``): an unwrapped LoRA built by PEFT keeps fp32 adapters
over the 16-bit base and casts each adapted Linear's input to them (peft ``tuners/lora/layer.py``
``Linear.forward``), so the adapter path moves fp32 elements plus the casts. Stacks that build their
own adapters (torchtune, LitGPT), FSDP-wrapped runs (adapters gathered in the param dtype) and
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
