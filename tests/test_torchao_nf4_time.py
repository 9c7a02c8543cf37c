"""torchtune's QLoRA dequantizes torchao ``NF4Tensor`` weights (``nf4_torchao``), not bitsandbytes'
(``throughput.torchao_nf4_dequant_bytes_per_weight``, ``qlora_dequant_s``): eager, plain torch ops
moving 33 B per weight plus 11 B per block at each of the forward, input-gradient and recompute
uses; compiled, one fused kernel (2.5 B plus 1 B per block) at the forward and the recompute only.

The byte counts are checked against their op-by-op arithmetic while the quantization block varies;
the step time against bitsandbytes' while the parameter count, the checkpointing and compile vary;
the stack and the torchtune rows against their sources; and, where torchao is installed, the counts
against the measurement (``calibrate/nf4_dequant_bytes.py``).
"""

from __future__ import annotations

import pytest

from shardplan.formulas import throughput as tp
from shardplan.inputs import strategy as st
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.stacks import resolve_stack, stack_knobs
from shardplan.validation.runs import read_runs
from tests.helpers import columns


@pytest.mark.parametrize("blocksize", [32, 64, 128, 4096])
def test_dequant_bytes_per_weight_follow_the_block_size(blocksize):
    eager = float(tp.torchao_nf4_dequant_bytes_per_weight(False, blocksize))
    compiled = float(tp.torchao_nf4_dequant_bytes_per_weight(True, blocksize))
    assert eager == pytest.approx(33.0 + (11.0 + 2 / 256) / blocksize)
    assert compiled == pytest.approx(2.5 + (1.0 + 2 / 256) / blocksize)
    # eager is a dozen times bitsandbytes' kernel; the fused kernel reads a 1 B scaler, not 17 B
    bnb = float(tp.qlora_dequant_bytes_per_weight(blocksize))
    assert compiled < bnb < eager


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-2-7b", "llama-3.1-70b"])
@pytest.mark.parametrize("ac, recompute", [(st.AC_NONE, 0.0), (st.AC_FULL, 1.0)])
@pytest.mark.parametrize("compiled", [False, True])
def test_dequant_time_against_bitsandbytes(model, ac, recompute, compiled):
    rates = tp.compute_rates(parse_gpus("1xa100-80gb"))
    knobs = dict(method=st.QLORA, ac=ac, compile=compiled)
    bnb = columns(model, **knobs)
    tao = columns(model, nf4_torchao=True, **knobs)
    per_weight = float(tp.torchao_nf4_dequant_bytes_per_weight(compiled))
    uses = (1.0 if compiled else 2.0) + recompute
    expected = float(tao.quantizable_params) * per_weight * uses / float(rates.hbm_bytes_per_s)
    assert float(tp.qlora_dequant_s(tao, rates)) == pytest.approx(expected)
    ratio = per_weight * uses / (float(tp.qlora_dequant_bytes_per_weight()) * (2.0 + recompute))
    assert float(tp.qlora_dequant_s(tao, rates) / tp.qlora_dequant_s(bnb, rates)) == pytest.approx(ratio)
    assert (ratio > 10) if not compiled else (ratio < 0.61)
    # bitsandbytes' kernel is a custom op torch.compile leaves alone; LoRA has nothing to dequantize
    assert float(tp.qlora_dequant_s(bnb, rates)) == pytest.approx(float(tp.qlora_dequant_s(columns(model, **{
        **knobs, "compile": not compiled}), rates)))
    assert float(tp.qlora_dequant_s(columns(model, nf4_torchao=True, method=st.LORA, ac=ac), rates)) == 0.0


def test_only_torchtune_runs_torchao_nf4():
    for stack in st.STACKS:
        knobs = dict(stack_knobs(stack, 1, "qlora"))
        assert knobs.get("nf4_torchao", False) is (stack == "torchtune"), stack


@pytest.mark.parametrize("row_id", ["TTN010", "TTN021", "TTN034"])
def test_torchtune_qlora_rows_are_compiled_torchao_nf4(row_id):
    row = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}[row_id]
    config = resolve_stack(row.config, 1)
    assert config.nf4_torchao is True and config.compile is True and config.method == "qlora"


@pytest.mark.parametrize("compiled", [False, True])
def test_counts_match_the_measurement(compiled):
    pytest.importorskip("torchao")
    from shardplan.calibrate import nf4_dequant_bytes as m

    formula = float(tp.torchao_nf4_dequant_bytes_per_weight(compiled))
    if not compiled:
        assert m.eager_bytes_per_weight(256, 512) == pytest.approx(formula, rel=1e-3)
        return
    assert m.compiled_bytes_per_weight(256, 512, checkpoint=False) == pytest.approx([formula, 0.0], abs=1e-3)
    assert m.compiled_bytes_per_weight(256, 512, checkpoint=True) == pytest.approx([formula] * 2, abs=1e-3)
