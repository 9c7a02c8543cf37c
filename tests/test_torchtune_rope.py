"""RoPE as torchtune writes it (the ``torchtune`` stack: ``RotaryPositionalEmbeddings.forward``, real
fp32 arithmetic on a cos/sin cache, stacked and cast back): each forward (and recompute) over q and k
moves ``ROPE_TORCHTUNE_EXTRA_FORWARD_BYTES`` more per element than the complex form the block count
holds, each backward ``ROPE_TORCHTUNE_EXTRA_BACKWARD_BYTES`` more, and a compiled torchtune block keeps
``COMPILED_TORCHTUNE_ROPE_BLOCK_FRACTION`` of its bytes. The counts are checked against the CPU byte
counter (eager) and inductor (compiled) on the same block with torchtune's RoPE."""

from __future__ import annotations

import pytest

from shardplan.formulas import throughput as tp
from shardplan.inputs import strategy as st
from shardplan.validation.runs import read_runs
from tests.helpers import columns


def _extra(ac=st.AC_NONE, compile=False, **knobs) -> float:
    """Element-wise bytes per token the torchtune stack adds over the hf stack (all layers)."""
    hf, tune = (columns("llama-2-7b", ac=ac, compile=compile, stack=s, **knobs) for s in (st.HF, st.TORCHTUNE))
    return float(tp.elementwise_bytes_per_token(tune) - tp.elementwise_bytes_per_token(hf))


@pytest.mark.parametrize("q, kv", [(4096, 4096), (4096, 1024), (8192, 1024)])
@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL])
def test_eager_extra_scales_with_the_rotated_width_and_the_passes(q, kv, ac):
    forwards = 1 if ac == st.AC_NONE else 2  # the recompute repeats the forward's
    layers = float(columns("llama-2-7b").num_layers)
    per_element = tp.ROPE_TORCHTUNE_EXTRA_FORWARD_BYTES * forwards + tp.ROPE_TORCHTUNE_EXTRA_BACKWARD_BYTES
    assert _extra(ac, q_width=q, kv_width=kv) == pytest.approx(per_element * (q + kv) * layers)


def test_no_rope_no_extra_and_the_fms_form_wins_over_the_stack():
    assert _extra(rope_dim=0) == 0.0  # learned positions: nothing rotated
    assert _extra(matrix_rope=True) == 0.0  # a row that names fms's RoPE is priced as fms's


def test_compiled_torchtune_blocks_keep_their_fraction():
    def blocks(**kw):
        head = float(tp.elementwise_bytes_per_token(columns("llama-2-7b", num_layers=0, **kw)))
        return float(tp.elementwise_bytes_per_token(columns("llama-2-7b", **kw))) - head

    eager_hf, eager_tune = blocks(stack=st.HF), blocks(stack=st.TORCHTUNE)
    compiled_hf, compiled_tune = blocks(stack=st.HF, compile=True), blocks(stack=st.TORCHTUNE, compile=True)
    assert compiled_tune == pytest.approx(tp.COMPILED_TORCHTUNE_ROPE_BLOCK_FRACTION * eager_tune)
    # eager, torchtune's RoPE moves more than the complex form; fused, less (it is real arithmetic)
    assert eager_tune > eager_hf and compiled_tune < compiled_hf


def test_torchtune_rows_run_the_torchtune_stack():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    for row_id in ("TTN010", "TTN011", "TTN019", "TTN021", "TTN033"):
        assert rows[row_id].config.stack == "torchtune"


def test_the_constants_are_what_the_byte_counter_measures():
    pytest.importorskip("torch")
    from shardplan.calibrate.elementwise_bytes import measure

    h, heads, kv_heads, ffn = 256, 8, 2, 768
    rotated = (heads + kv_heads) * (h // heads)
    complex_f, complex_b = measure(h, heads, kv_heads, ffn)
    tune_f, tune_b = measure(h, heads, kv_heads, ffn, torchtune_rope=True)
    assert (tune_f - complex_f) / rotated == pytest.approx(tp.ROPE_TORCHTUNE_EXTRA_FORWARD_BYTES, rel=0.05)
    assert (tune_b - complex_b) / rotated == pytest.approx(tp.ROPE_TORCHTUNE_EXTRA_BACKWARD_BYTES, rel=0.05)


def test_the_compiled_constant_covers_what_inductor_leaves_of_the_torchtune_block():
    pytest.importorskip("torch")
    from shardplan.calibrate.compiled_bytes import fraction

    measured = fraction(256, 8, 2, 768, torchtune_rope=True)
    assert 0.15 <= measured <= tp.COMPILED_TORCHTUNE_ROPE_BLOCK_FRACTION < tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION
