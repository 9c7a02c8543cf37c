"""torch.compile fuses a block's element-wise kernels (``compile``; throughput
``COMPILED_BLOCK_ELEMENTWISE_FRACTION``): the blocks' bytes shrink to the fraction inductor leaves,
recompute included; the LoRA adapter path's element-wise ops inside the compiled blocks shrink to
``COMPILED_ADAPTER_ELEMENTWISE_FRACTION`` (the rank-r GEMMs' own reads and writes do not); the loss
head and FSDP's copies stay eager; the published rows say which runs compiled; and each constant covers
what CPU inductor leaves of the code it prices."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.activations import stream_dtype_bytes
from shardplan.formulas.columns import columns_for
from shardplan.formulas.comm import link_rates
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.validation.runs import read_runs
from tests.helpers import columns


def _block_bytes(c) -> float:
    """Eager element-wise bytes of the blocks, forward + backward + recompute (the formula's count),
    with the stack's RoPE form's extra (``rope_form``: torchtune's fp32 pairs for ``_tune_lora``)."""
    a = stream_dtype_bytes(c)
    layer = tp.layer_forward_elementwise_bytes(a, c.hidden_size, c.q_width, c.kv_width,
                                               c.mlp_width, c.gated_mlp, np.asarray(c.rope_dim) > 0)
    frac = np.where(c.ac == st.AC_NONE, 0.0, tp.recompute_fraction(c))
    fwd, bwd = tp.ROPE_FORM_EXTRA_BYTES[int(np.asarray(c.rope_form))]
    rope = (fwd * (1 + frac) + bwd) * (a / 2.0) * (c.q_width + c.kv_width)
    return float(c.num_layers * (layer * (1 + tp.BACKWARD_ELEMENTWISE_FACTOR + frac) + rope))


@pytest.mark.parametrize("ac", [st.AC_NONE, st.AC_FULL, st.AC_SELECTIVE_OP])
@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3.1-8b"])
def test_compiled_blocks_move_the_fraction_inductor_leaves(model, ac):
    eager, compiled = (columns(model, ac=ac, compile=on) for on in (False, True))
    saved = float(tp.elementwise_bytes_per_token(eager) - tp.elementwise_bytes_per_token(compiled))
    assert saved == pytest.approx((1 - tp.COMPILED_BLOCK_ELEMENTWISE_FRACTION) * _block_bytes(eager), rel=1e-9)
    # the recomputed forward is compiled with its block: full AC saves more than none
    assert saved > 0


def test_compile_leaves_an_unfused_head_alone():
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


def _adapter_gemm_io(c) -> float:
    """The rank-r GEMMs' own reads and writes of a 16-bit adapter path (d = a, no cast), per token:
    d·in + d·out forward (recompute repeats it), 2d·out + d·in backward."""
    a = float(stream_dtype_bytes(c))
    layers = float(c.num_layers)
    rank = float(c.lora_rank_out / c.lora_adapted_linears)
    ins = float(c.lora_adapted_in)
    outs = float(c.lora_params / (layers * rank)) - ins
    frac = float(np.where(c.ac == st.AC_NONE, 0.0, tp.recompute_fraction(c)))
    return layers * (a * (ins + outs) * (1 + frac) + a * (2 * outs + ins))


def _tune_lora(**knobs):
    """A torchtune LoRA run of Llama-3.1-8B on one RTX 4090 (the TTN019 setting), as Columns."""
    config = TrainingConfig(**{"strategy": "single", "method": "lora", "stack": "torchtune", "micro_batch": 2,
                               "seq_len": 2048, "lora_dropout": 0.0, **knobs})
    return columns_for(resolve_model("llama-3.1-8b").spec, parse_gpus("1xrtx4090"), config)


@pytest.mark.parametrize("ac", ["none", "full"])
@pytest.mark.parametrize("targets", ["qv", "all-linear"])
def test_compiled_adapters_move_the_fraction_inductor_leaves(targets, ac):
    """torchtune's LoRALinear sits inside the layer training.compile_model compiles: its element-wise
    ops fuse, its rank-r GEMMs' reads and writes do not."""
    eager, compiled = (_tune_lora(lora_targets=targets, ac=ac, compile=on) for on in (False, True))
    adapters = [float(tp.lora_adapter_bytes_per_token(c)) for c in (eager, compiled)]
    pointwise = adapters[0] - _adapter_gemm_io(eager)
    assert 0 < pointwise < adapters[0]
    assert adapters[1] == pytest.approx(_adapter_gemm_io(eager) + tp.COMPILED_ADAPTER_ELEMENTWISE_FRACTION * pointwise,
                                        rel=1e-9)
    saved = float(tp.elementwise_bytes_per_token(eager) - tp.elementwise_bytes_per_token(compiled))
    fraction = float(tp.compiled_block_fraction(eager.rope_form))  # torchtune's pairs_fp32 form
    assert saved == pytest.approx((1 - fraction) * _block_bytes(eager) + adapters[0] - adapters[1], rel=1e-9)


def test_compiled_adapter_saving_grows_with_the_adapted_widths_and_the_recompute():
    def saving(**kw):
        return float(tp.lora_adapter_bytes_per_token(_tune_lora(**kw))
                     - tp.lora_adapter_bytes_per_token(_tune_lora(compile=True, **kw)))

    assert 0 < saving(lora_targets="qv") < saving(lora_targets="all-linear")
    assert saving(ac="none") < saving(ac="full")  # the recomputed forward is compiled with its layer


def test_the_adapter_constant_covers_what_inductor_leaves_of_torchtunes_lora_path():
    """CPU inductor, torchtune's LoRALinear on q, v, o and the MLP of a frozen bf16 block: 0.42 at
    this shape, 0.44 at h 512 / ffn 1536 (the constant is the larger)."""
    pytest.importorskip("torch")
    from shardplan.calibrate.compiled_bytes import adapter_fraction

    measured = adapter_fraction(256, 8, 2, 768)
    assert 0.30 <= measured <= tp.COMPILED_ADAPTER_ELEMENTWISE_FRACTION



@pytest.mark.parametrize("vocab", [32000, 128256])
def test_a_fused_loss_moves_the_fused_bytes_per_vocabulary_entry(vocab):
    eager, fused = (columns("llama-3.1-8b", vocab_size=vocab, fused_ce=on) for on in (False, True))
    saved = float(tp.elementwise_bytes_per_token(eager) - tp.elementwise_bytes_per_token(fused))
    a = float(stream_dtype_bytes(eager))
    per_vocab = tp.CROSS_ENTROPY_BYTES_PER_VOCAB - tp.FUSED_CROSS_ENTROPY_BYTES_PER_VOCAB
    assert saved == pytest.approx(per_vocab * a / 2 * vocab, rel=1e-9)


def test_the_fused_loss_constant_is_what_inductor_moves_plus_the_logits_write():
    pytest.importorskip("torch")
    from shardplan.calibrate.compiled_bytes import cross_entropy_bytes_per_vocab

    logits_write = 2.0  # the output GEMM writes the 16-bit logits (not an inductor kernel)
    assert logits_write + cross_entropy_bytes_per_vocab() == pytest.approx(tp.FUSED_CROSS_ENTROPY_BYTES_PER_VOCAB, abs=0.1)
