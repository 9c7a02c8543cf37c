"""A norm that is one 16-bit kernel (``lowp_norm``: llm-foundry's ``LPLayerNorm``, a single
``F.layer_norm`` in the autocast dtype) moves ``LOWP_NORM_BYTES`` per element, not the fp32-upcast
RMSNorm's ``RMSNORM_EAGER_BYTES``; llm-foundry's benchmark rows run it."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.inputs import strategy as st
from shardplan.validation.runs import read_runs
from tests.helpers import columns


@pytest.mark.parametrize("hidden", [2048, 4096, 8192])
@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL])
def test_norm_bytes_scale_with_the_hidden_width(hidden, ac):
    rms, lowp = (columns("llama-2-7b", hidden_size=hidden, ac=ac, lowp_norm=on) for on in (False, True))
    frac = 0.0 if ac == st.AC_NONE else 1.0
    layers = float(rms.num_layers)
    # 2 norms per block, bf16 stream (a = 2), forward + backward (×2) + recompute
    expected = 2 * (tp.RMSNORM_EAGER_BYTES - tp.LOWP_NORM_BYTES) * hidden * layers \
        * (1 + tp.BACKWARD_ELEMENTWISE_FACTOR + frac)
    assert float(tp.elementwise_bytes_per_token(rms) - tp.elementwise_bytes_per_token(lowp)) == pytest.approx(expected)


def test_the_block_count_takes_the_norm_bytes():
    base = float(tp.layer_forward_elementwise_bytes(2, 512, 512, 512, 1536))
    lowp = float(tp.layer_forward_elementwise_bytes(2, 512, 512, 512, 1536, norm=tp.LOWP_NORM_BYTES))
    assert base - lowp == pytest.approx(2 * (36 - 4) * 512)
    assert float(tp.layer_forward_elementwise_bytes(4, 512, 512, 512, 1536, norm=np.float64(4.0))) == pytest.approx(2 * lowp)


def test_llm_foundry_benchmark_rows_run_the_16bit_layernorm():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    mf = [r for i, r in rows.items() if i.startswith("MF") and hasattr(r, "config")]
    assert mf and all(r.config.lowp_norm is True for r in mf)
    assert rows["TT001"].config.lowp_norm is None  # torchtitan: its stack's RMSNorm
