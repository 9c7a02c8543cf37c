"""RoPE as foundation-model-stack writes it (``matrix_rope``: ``RotaryEmbedding.adjusted_qk``, a 2×2
fp32 rotation per pair): every pass over q and k moves ``ROPE_MATRIX_EXTRA_BYTES`` more per element
than the complex form, and a compiled block keeps ``COMPILED_MATRIX_ROPE_BLOCK_FRACTION`` of its
bytes. The counts are checked against the CPU byte counter (eager) and inductor (compiled) on the
same block with fms's RoPE; fms-fsdp's rows run it, no other source does."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.comm import link_rates
from shardplan.inputs import strategy as st
from shardplan.inputs.hardware import parse_gpus
from shardplan.validation.runs import read_runs
from tests.helpers import columns


def _extra(ac=st.AC_NONE, compile=False, **widths) -> float:
    """Element-wise bytes per token the matrix form adds (its model's count, all layers)."""
    off, on = (columns("llama-2-7b", ac=ac, compile=compile, matrix_rope=m, **widths) for m in (False, True))
    return float(tp.elementwise_bytes_per_token(on) - tp.elementwise_bytes_per_token(off))


@pytest.mark.parametrize("q, kv", [(4096, 4096), (4096, 1024), (8192, 1024)])
@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL])
def test_eager_extra_scales_with_the_rotated_width_and_the_passes(q, kv, ac):
    # heads × head_dim of q plus of k: 16 B per element forward, backward, and again when recomputed
    passes = 2 if ac == st.AC_NONE else 3
    layers = float(columns("llama-2-7b").num_layers)
    assert _extra(ac, q_width=q, kv_width=kv) == pytest.approx(
        tp.ROPE_MATRIX_EXTRA_BYTES * (q + kv) * passes * layers)


def test_compiled_blocks_keep_the_matrix_fraction():
    eager_tt = columns("llama-2-7b")
    compiled_tt, compiled_fms = (columns("llama-2-7b", compile=True, matrix_rope=m) for m in (False, True))
    eager_fms = columns("llama-2-7b", matrix_rope=True)
    head = float(tp.elementwise_bytes_per_token(columns("llama-2-7b", num_layers=0)))
    blocks = {k: float(tp.elementwise_bytes_per_token(c)) - head
              for k, c in (("tt", eager_tt), ("fms", eager_fms), ("tt_c", compiled_tt), ("fms_c", compiled_fms))}
    assert blocks["tt_c"] == pytest.approx(tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION * blocks["tt"])
    assert blocks["fms_c"] == pytest.approx(tp.COMPILED_MATRIX_ROPE_BLOCK_FRACTION * blocks["fms"])
    # fused, fms's real-arithmetic RoPE moves fewer bytes than the complex block, eager it moves more
    assert blocks["fms_c"] < blocks["tt_c"] and blocks["fms"] > blocks["tt"]


@pytest.mark.parametrize("seq", [2048, 4096, 8192])
def test_step_time_grows_by_the_extra_bytes_of_every_token(seq):
    cluster = parse_gpus("8xh100-sxm")
    rates, links = tp.compute_rates(cluster), link_rates(cluster)
    off, on = (columns("llama-2-7b", seq_len=seq, matrix_rope=m) for m in (False, True))
    per_token = float(tp.elementwise_bytes_per_token(on) - tp.elementwise_bytes_per_token(off))
    assert per_token == pytest.approx(_extra())  # bytes per token do not depend on the sequence
    dt = float(tp.step_time(on, links, rates)["compute_s"] - tp.step_time(off, links, rates)["compute_s"])
    tokens = float(np.asarray(off.micro_batch) * seq)
    assert dt == pytest.approx(per_token * tokens / float(rates.hbm_bytes_per_s), rel=1e-6)


def test_learned_positions_and_the_default_stacks_are_unchanged():
    assert _extra(rope_dim=0) == 0.0  # no RoPE, no matrix
    base = columns("llama-3.1-8b")
    assert not bool(np.any(base.matrix_rope))
    assert float(tp.elementwise_bytes_per_token(base)) == float(
        tp.elementwise_bytes_per_token(columns("llama-3.1-8b", matrix_rope=False)))


def test_fms_fsdp_rows_run_the_matrix_form():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    fms = [r for i, r in rows.items() if i.startswith("FMS") and hasattr(r, "config")]
    assert fms and all(r.config.matrix_rope is True for r in fms)
    for other in ("TT001", "MF001", "TTN010", "AO001"):
        assert rows[other].config.matrix_rope is None


@pytest.mark.parametrize("h, heads, kv_heads, ffn", [(256, 8, 2, 768), (512, 8, 8, 1536)])
def test_the_counter_measures_the_extra_on_an_fms_block(h, heads, kv_heads, ffn):
    """Eager fms block against the torchtitan-style block: the difference per q/k element, per pass,
    is the constant within 20 % (the rest is the gather of the fp32 table rows), and the model's
    whole fms block (forward × (1 + factor) + extra) is within 5 % of the measured one."""
    pytest.importorskip("torch")
    from shardplan.calibrate.elementwise_bytes import measure

    tt_f, tt_b = measure(h, heads, kv_heads, ffn)
    fms_f, fms_b = measure(h, heads, kv_heads, ffn, matrix_rope=True)
    rotated = h + kv_heads * h // heads
    assert (fms_f - tt_f) / rotated == pytest.approx(tp.ROPE_MATRIX_EXTRA_BYTES, rel=0.20)
    assert (fms_b - tt_b) / rotated == pytest.approx(tp.ROPE_MATRIX_EXTRA_BYTES, rel=0.20)
    layer = float(tp.layer_forward_elementwise_bytes(2, h, h, rotated - h, ffn))
    model = layer * (1 + tp.BACKWARD_ELEMENTWISE_FACTOR) + 2 * tp.ROPE_MATRIX_EXTRA_BYTES * rotated
    assert model == pytest.approx(fms_f + fms_b, rel=0.05)


def test_the_fraction_covers_what_inductor_leaves_of_an_fms_block():
    """CPU inductor on the fms-RoPE block (``calibrate.compiled_bytes --matrix-rope``): 0.257 at this
    shape, 0.228 at h 512 / ffn 1536; the complex block keeps 0.37-0.40, because its multiply stays
    an aten fallback kernel while fms's real arithmetic fuses."""
    pytest.importorskip("torch")
    from shardplan.calibrate.compiled_bytes import fraction

    measured = fraction(256, 8, 2, 768, matrix_rope=True)
    assert 0.15 <= measured <= tp.COMPILED_MATRIX_ROPE_BLOCK_FRACTION < tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION
