"""torch.compile fuses a block's element-wise kernels (``compile``; throughput
``COMPILED_BLOCK_ELEMENTWISE_FRACTION``): the blocks' bytes shrink to the fraction inductor leaves,
recompute included; the loss head, adapters and FSDP's copies do not; the published rows say
which runs compiled; and the constant covers what inductor leaves of a torchtitan-style block."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.activations import stream_dtype_bytes
from shardplan.formulas.comm import link_rates
from shardplan.inputs import strategy as st
from shardplan.inputs.hardware import parse_gpus
from shardplan.validation.runs import read_runs
from tests.helpers import columns


def _block_bytes(c) -> float:
    """Eager element-wise bytes of the blocks, forward + backward + recompute (the formula's count)."""
    layer = tp.layer_forward_elementwise_bytes(stream_dtype_bytes(c), c.hidden_size, c.q_width, c.kv_width,
                                               c.mlp_width, c.gated_mlp, np.asarray(c.rope_dim) > 0)
    frac = np.where(c.ac == st.AC_NONE, 0.0, tp.recompute_fraction(c))
    return float(c.num_layers * layer * (1 + tp.BACKWARD_ELEMENTWISE_FACTOR + frac))


@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL, st.AC_SELECTIVE_OP])
@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3.1-8b"])
def test_compiled_blocks_move_the_fraction_inductor_leaves(model, ac):
    eager, compiled = (columns(model, ac=ac, compile=on) for on in (False, True))
    saved = float(tp.elementwise_bytes_per_token(eager) - tp.elementwise_bytes_per_token(compiled))
    assert saved == pytest.approx((1 - tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION) * _block_bytes(eager), rel=1e-9)
    # the recomputed forward is compiled with its block: full AC saves more than none
    assert saved > 0


def test_compile_leaves_the_head_and_adapters_alone():
    # a model with a 4x wider vocabulary: the compiled saving is the blocks' alone, the same
    narrow, wide = (columns("llama-2-7b", vocab_size=v, compile=True) for v in (32000, 128000))
    narrow_e, wide_e = (columns("llama-2-7b", vocab_size=v) for v in (32000, 128000))
    saving = [float(tp.elementwise_bytes_per_token(e) - tp.elementwise_bytes_per_token(c))
              for e, c in ((narrow_e, narrow), (wide_e, wide))]
    assert saving[0] == pytest.approx(saving[1], rel=1e-9)


def test_compile_shortens_the_step_by_the_fused_bytes_time():
    cluster = parse_gpus("8xh100-sxm")
    rates, links = tp.compute_rates(cluster), link_rates(cluster)
    eager, compiled = (columns("llama-3.1-8b", compile=on, seq_len=4096) for on in (False, True))
    te, tc = (tp.step_time(c, links, rates) for c in (eager, compiled))
    tokens = 4096.0
    fused_s = (1 - tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION) * _block_bytes(eager) * tokens / float(rates.hbm_bytes_per_s)
    assert float(te["compute_s"] - tc["compute_s"]) == pytest.approx(fused_s, rel=1e-6)


def test_rows_read_their_compile_column():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    assert rows["TT001"].config.compile is False   # torchtitan 9dec370 table, eager row
    assert rows["TT002"].config.compile is True    # the same run compiled
    assert rows["TTN010"].config.compile is True   # "yes (** = uses torch compile)"
    assert rows["MF001"].config.compile is False   # llm-foundry benchmark table: no compile
    assert rows["AO001"].config.compile is True


def test_the_constant_covers_what_inductor_leaves_of_a_block():
    """CPU inductor on the torchtitan-style bf16 block (``calibrate.compiled_bytes``): 0.37 at this
    shape, 0.40 at h 512 / ffn 1536 (the constant is the larger)."""
    pytest.importorskip("torch")
    from shardplan.calibrate.compiled_bytes import fraction

    measured = fraction(256, 8, 2, 768)
    assert 0.25 <= measured <= tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION
