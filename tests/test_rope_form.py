"""RoPE as each stack's code writes it (``rope_form``): Transformers' ``rotate_half`` + ``cat``,
torchtune's fp32 pairs and foundation-model-stack's 2×2 matrix each move
``ROPE_FORM_EXTRA_BYTES`` more per q/k element than torchtitan's complex multiply (forward, and
recomputed forward, and backward), and a compiled block keeps ``compiled_block_fraction`` of its
bytes (issue 23)."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.comm import link_rates
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.stacks import knob_values
from shardplan.validation.runs import read_runs
from tests.helpers import columns

FORMS = (st.ROPE_ROTATE_HALF, st.ROPE_PAIRS_FP32, st.ROPE_MATRIX)


def _extra(form, ac=st.AC_NONE, compile=False, **widths) -> float:
    """Element-wise bytes per token a form adds over the complex one (its model's count, all layers)."""
    off, on = (columns("llama-2-7b", ac=ac, compile=compile, rope_form=f, **widths) for f in (st.ROPE_COMPLEX, form))
    return float(tp.elementwise_bytes_per_token(on) - tp.elementwise_bytes_per_token(off))


def test_the_table_follows_the_form_names():
    forward, backward = zip(*tp.ROPE_FORM_EXTRA_BYTES)
    assert st.ROPE_FORMS[int(np.argmax(backward))] == "pairs_fp32"
    assert forward[st.ROPE_COMPLEX] == backward[st.ROPE_COMPLEX] == 0.0
    assert tp.ROPE_FORM_EXTRA_BYTES[st.ROPE_ROTATE_HALF] == (0.0, tp.ROPE_ROTATE_HALF_BACKWARD_EXTRA_BYTES)
    assert tp.ROPE_FORM_EXTRA_BYTES[st.ROPE_MATRIX] == (tp.ROPE_MATRIX_EXTRA_BYTES,) * 2
    assert float(tp.compiled_block_fraction(st.ROPE_COMPLEX)) == tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("q, kv", [(4096, 4096), (4096, 1024), (8192, 1024)])
@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL])
def test_eager_extra_scales_with_the_rotated_width_and_the_passes(form, q, kv, ac):
    # per q/k element: the forward's extra once per forward pass (twice under full AC), the backward's once
    fwd, bwd = tp.ROPE_FORM_EXTRA_BYTES[form]
    forwards = 1 if ac == st.AC_NONE else 2
    layers = float(columns("llama-2-7b").num_layers)
    assert _extra(form, ac, q_width=q, kv_width=kv) == pytest.approx((fwd * forwards + bwd) * (q + kv) * layers)


@pytest.mark.parametrize("form", FORMS)
def test_compiled_blocks_keep_their_forms_fraction(form):
    head = float(tp.elementwise_bytes_per_token(columns("llama-2-7b", num_layers=0)))
    blocks = {(f, c): float(tp.elementwise_bytes_per_token(columns("llama-2-7b", compile=c, rope_form=f))) - head
              for f in (st.ROPE_COMPLEX, form) for c in (False, True)}
    assert blocks[(st.ROPE_COMPLEX, True)] == pytest.approx(
        tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION * blocks[(st.ROPE_COMPLEX, False)])
    assert blocks[(form, True)] == pytest.approx(float(tp.compiled_block_fraction(form)) * blocks[(form, False)])
    # fused, real-arithmetic RoPE moves fewer bytes than the complex block, eager at least as many
    assert blocks[(form, True)] < blocks[(st.ROPE_COMPLEX, True)]
    assert blocks[(form, False)] > blocks[(st.ROPE_COMPLEX, False)]


@pytest.mark.parametrize("seq", [2048, 4096, 8192])
def test_step_time_grows_by_the_extra_bytes_of_every_token(seq):
    cluster = parse_gpus("8xh100-sxm")
    rates, links = tp.compute_rates(cluster), link_rates(cluster)
    off, on = (columns("llama-2-7b", seq_len=seq, rope_form=f) for f in (st.ROPE_COMPLEX, st.ROPE_PAIRS_FP32))
    per_token = float(tp.elementwise_bytes_per_token(on) - tp.elementwise_bytes_per_token(off))
    assert per_token == pytest.approx(_extra(st.ROPE_PAIRS_FP32))  # bytes per token do not depend on the sequence
    dt = float(tp.step_time(on, links, rates)["compute_s"] - tp.step_time(off, links, rates)["compute_s"])
    tokens = float(np.asarray(off.micro_batch) * seq)
    assert dt == pytest.approx(per_token * tokens / float(rates.hbm_bytes_per_s), rel=1e-6)


@pytest.mark.parametrize("form", FORMS)
def test_learned_positions_rotate_nothing(form):
    assert _extra(form, rope_dim=0) == 0.0
    assert _extra(form, compile=True, rope_dim=0) == 0.0


@pytest.mark.parametrize("stack, form", [("hf", "rotate_half"), ("torchtune", "pairs_fp32"),
                                         ("torchtitan", "complex"), ("plain", "complex")])
def test_each_stack_rotates_as_its_code_does(stack, form):
    values = knob_values(TrainingConfig(stack=stack), parse_gpus("8xh100-sxm"))
    assert values["rope_form"] == st.ROPE_FORMS.index(form)


def test_fms_fsdp_rows_run_the_matrix_form_and_others_their_stacks():
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    fms = [r for i, r in rows.items() if i.startswith("FMS") and hasattr(r, "config")]
    assert fms and all(r.config.rope_form == "matrix" for r in fms)
    for other in ("TT001", "MF001", "TTN010", "AO001", "FMA005"):
        assert rows[other].config.rope_form is None  # the stack's own default


@pytest.mark.parametrize("form", ["rotate_half", "pairs_fp32", "matrix"])
@pytest.mark.parametrize("h, heads, kv_heads, ffn", [(256, 8, 2, 768), (512, 8, 8, 1536)])
def test_the_counter_measures_each_forms_extra(form, h, heads, kv_heads, ffn):
    """The block with each stack's RoPE against the complex one: the difference per q/k element is
    the counted constant within 2 B forward and backward (the rest is the table's reads, which scale
    with 1/heads), and the model's whole block is within 5 % of the measured one."""
    pytest.importorskip("torch")
    from shardplan.calibrate.elementwise_bytes import measure

    tt_f, tt_b = measure(h, heads, kv_heads, ffn)
    f, b = measure(h, heads, kv_heads, ffn, rope_form=form)
    rotated = h + kv_heads * h // heads
    fwd, bwd = tp.ROPE_FORM_EXTRA_BYTES[st.ROPE_FORMS.index(form)]
    assert (f - tt_f) / rotated == pytest.approx(fwd, abs=2.6)
    assert (b - tt_b) / rotated == pytest.approx(bwd, abs=2.6)
    layer = float(tp.layer_forward_elementwise_bytes(2, h, h, rotated - h, ffn))
    model = layer * (1 + tp.BACKWARD_ELEMENTWISE_FACTOR) + (fwd + bwd) * rotated
    assert model == pytest.approx(f + b, rel=0.05)


@pytest.mark.parametrize("form", ["pairs_fp32", "rotate_half"])
def test_the_fraction_covers_what_inductor_leaves_of_the_block(form):
    """CPU inductor (``calibrate.compiled_bytes --rope-form``): at this shape pairs_fp32 0.234,
    rotate_half 0.294 (matrix 0.257); the complex block keeps 0.37-0.40, its multiply an aten fallback."""
    pytest.importorskip("torch")
    from shardplan.calibrate.compiled_bytes import fraction

    measured = fraction(256, 8, 2, 768, rope_form=form)
    code = st.ROPE_FORMS.index(form)
    assert 0.15 <= measured <= float(tp.compiled_block_fraction(code)) < tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION
