"""LitGPT on Lightning Fabric builds its own model: a separate lm_head beside a tied embedding
(``untied_head``) and, under ``--quantize bnb.nf4``, a 4-bit lm_head quantized from an fp16 copy
(``quant_head``). Each is checked against what the code allocates, with the vocabulary and the
hidden size varied (the head is V·h)."""

from __future__ import annotations

import pytest

from shardplan.formulas.activations import chunked_head_dequant_moment_bytes
from shardplan.formulas.buffers import engine_buffers
from shardplan.formulas.columns import untied_head_values
from shardplan.formulas.model_states import frozen_base, nf4_quant_state_bytes, quant_bytes_per_param
from shardplan.inputs import strategy as st
from tests.helpers import columns

SHAPES = [("llama-3.2-1b", 128256, 2048), ("llama-3.2-1b", 32000, 2048), ("llama-3.2-1b", 128256, 1024)]


@pytest.mark.parametrize("model,vocab,hidden", SHAPES)
def test_a_separate_head_adds_one_vocab_by_hidden_tensor_to_a_tied_model(model, vocab, hidden):
    tied = columns(model, vocab_size=vocab, hidden_size=hidden)
    untied = columns(model, vocab_size=vocab, hidden_size=hidden, untied_head=True)
    assert bool(tied.tied_embeddings) and not bool(untied.tied_embeddings)
    assert int(untied.total_params) - int(tied.total_params) == vocab * hidden
    assert int(untied.root_params) - int(tied.root_params) == vocab * hidden
    assert int(untied.param_tensors) == int(tied.param_tensors) + 1
    pads = sum(int(getattr(untied, f"pad_model_{k}")) - int(getattr(tied, f"pad_model_{k}")) for k in range(6))
    assert pads in (hidden, vocab * hidden)  # h in the dim0-V group, or V·h in the remainder
    again = untied_head_values({**vars(untied), "untied_head": True})  # idempotent: already untied
    assert int(again["total_params"]) == int(untied.total_params)


def test_an_untied_model_is_left_as_it_is():
    base = columns("llama-2-7b")
    assert not bool(base.tied_embeddings)
    assert int(columns("llama-2-7b", untied_head=True).total_params) == int(base.total_params)


@pytest.mark.parametrize("model,vocab,hidden", SHAPES)
def test_lightning_quantizes_the_head_and_dequantizes_from_fp16(model, vocab, hidden):
    knobs = dict(vocab_size=vocab, hidden_size=hidden, method=st.QLORA, precision=st.BF16_PURE)
    plain, quant = columns(model, **knobs), columns(model, **knobs, quant_head=True)
    (f0, q0, s0), (f1, q1, s1) = frozen_base(plain), frozen_base(quant)
    head = vocab * hidden
    packed = -(-head * quant_bytes_per_param(st.NF4) // 1)
    assert int(q1) - int(q0) == packed
    assert int(f1) - int(f0) == packed - 2 * head       # 16-bit head replaced by the 4-bit one
    assert int(s1) - int(s0) == int(nf4_quant_state_bytes(head, 1))
    # bitsandbytes dequantizes to the quant_state's fp16, then casts to bf16: 2 + 2 bytes per weight
    assert int(engine_buffers(quant)["qlora_dequant"]) == 2 * int(engine_buffers(plain)["qlora_dequant"])


@pytest.mark.parametrize("b,s", [(1, 512), (2, 256), (2, 1024)])
def test_the_head_dequantization_moment(b, s):
    knobs = dict(method=st.QLORA, precision=st.BF16_PURE, micro_batch=b, seq_len=s, logits_fp32=True)
    logits, weight = chunked_head_dequant_moment_bytes(columns("llama-3.2-1b", **knobs, quant_head=True, chunked_head=True))
    chunks = -(-s // 128)
    assert int(weight) == 4 * 128256 * 2048
    assert int(logits) == pytest.approx(b * s * 128256 * (8 - 2 / chunks), abs=1)
    for off in (dict(quant_head=True), dict(chunked_head=True)):
        assert chunked_head_dequant_moment_bytes(columns("llama-3.2-1b", **knobs, **off)) == (0, 0)
