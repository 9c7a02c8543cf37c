"""TRL's chunked LM head (``fused_lm_head``), measured on CPU against what shardplan counts.

TRL 1.16's ``SFTTrainer`` patches the model with ``add_fused_lm_head``; the loss then comes from
``trl/kernels/chunked_logprob.py`` ``ChunkedLogProbFunction``, which projects the hidden state
through the LM head in [TOKEN_CHUNK_SIZE, chunk_size] tiles of one buffer. Run on CPU (the torch
fold instead of the Triton one) with small tiles — the module's ``TOKEN_CHUNK_SIZE`` and the
``chunk_size`` argument, and shardplan's ``FUSED_HEAD_*_TILE`` set to the same values — at two token
counts and two vocabulary sizes, the bytes it allocates beyond its inputs must scale as the formula
says: nothing with the vocabulary for a frozen head (no logits), 4·V·h (+ the cast to a 16-bit
weight) for a trainable one, and per token the kernel's statistics in forward and the fp32 hidden
gradient (+ its cast) in backward. The CPU stand-ins of the Triton fold are replaced by no-ops
(``small_tiles``), so the peak is where it is on CUDA: at the end of each pass.
"""

import contextlib
import sys
import types

import pytest

from shardplan.formulas import activations as act
from shardplan.inputs import strategy as st
from tests.helpers import columns
from tests.test_loss_memory import LiveBytes

torch = pytest.importorskip("torch")
chunked = pytest.importorskip("trl.kernels.chunked_logprob")

HIDDEN = 128
TOKEN_TILE, VOCAB_TILE = 16, 32
TOKENS = (512, 1024)
VOCABS = (128, 256)


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(chunked, "TOKEN_CHUNK_SIZE", TOKEN_TILE)
    monkeypatch.setattr(act, "FUSED_HEAD_TOKEN_TILE", TOKEN_TILE)
    monkeypatch.setattr(act, "FUSED_HEAD_VOCAB_TILE", VOCAB_TILE)
    # the CUDA fold (``_forward_kernel`` / ``_backward_kernel``, Triton) works in registers and in the
    # tile itself; its CPU stand-ins allocate tile-sized fp32 temporaries. Replaced by no-ops, what
    # is left is what the CUDA path allocates through torch (the values do not matter here)
    monkeypatch.setattr(chunked, "_forward_tile", lambda *args, **kwargs: None)
    monkeypatch.setattr(chunked, "_backward_tile", lambda *args, **kwargs: None)
    # the backward imports trl.trainer.utils for a DeepSpeed ZeRO-3 gather that is a null context
    # without ZeRO-3; that module pulls in `datasets`, which the CPU test environment lacks
    stub = types.ModuleType("trl.trainer.utils")
    stub.maybe_gather_lm_head_ctx = lambda *params: contextlib.nullcontext()
    monkeypatch.setitem(sys.modules, "trl.trainer.utils", stub)


def _measure(tokens, vocab, dtype, trainable):
    """(forward, backward) peak bytes above the inputs (hidden, weight, targets)."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, HIDDEN, dtype=dtype, generator=gen, requires_grad=True)
    weight = (torch.randn(vocab, HIDDEN, dtype=dtype, generator=gen) * 0.02).requires_grad_(trainable)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    mode = LiveBytes()
    with mode:
        mode.add(hidden, weight, targets)
        mode.start()
        out = chunked.ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, VOCAB_TILE, None, 1.0,
                                                   ("log_probs",))
        loss = -out[0].sum()
        del out  # the trainer keeps the loss only
        forward, mode.peak = mode.peak - mode.base, 0
        # autograd.grad, not backward(): a leaf's AccumulateGrad would copy the returned gradient,
        # which in the model flows on into the final norm's backward instead
        torch.autograd.grad(loss, [hidden, weight] if trainable else [hidden])
        backward = mode.peak - mode.base
    return forward, backward


def _formula(tokens, vocab, precision, strategy, method):
    c = columns("llama-2-7b", hidden_size=HIDDEN, vocab_size=vocab, micro_batch=1, seq_len=tokens,
                precision=st.code(st.PRECISIONS, precision, "precision"),
                strategy=st.code(st.STRATEGIES, strategy, "strategy"),
                method=st.code(st.METHODS, method, "method"), fused_lm_head=True)
    return int(act.fused_lm_head_forward_bytes(c)), int(act.fused_lm_head_backward_bytes(c))


# (torch dtype, shardplan precision, strategy): fp32 training; bf16 weights as FSDP's unsharded
# mixed-precision parameters are (a 16-bit weight: its gradient is cast back)
DTYPES = [(torch.float32, "fp32", "single"), (torch.bfloat16, "bf16-mixed", "full_shard")]


@pytest.mark.parametrize("dtype,precision,strategy", DTYPES)
@pytest.mark.parametrize("trainable", [False, True])
def test_no_logits_the_vocabulary_costs_only_a_trainable_heads_gradient(small_tiles, dtype, precision, strategy,
                                                                        trainable):
    (f1, b1), (f2, b2) = (_measure(TOKENS[0], v, dtype, trainable) for v in VOCABS)
    method = "full" if trainable else "lora"
    (pf1, pb1), (pf2, pb2) = (_formula(TOKENS[0], v, precision, strategy, method) for v in VOCABS)
    assert f2 - f1 == pf2 - pf1 == 0  # forward: no [N, V] tensor at all
    assert b2 - b1 == pb2 - pb1  # backward: the fp32 grad_weight (+ its 16-bit cast), or nothing
    assert (b2 - b1 > 0) == trainable


@pytest.mark.parametrize("dtype,precision,strategy", DTYPES)
@pytest.mark.parametrize("trainable", [False, True])
def test_per_token_bytes_are_the_kernels_statistics_and_the_hidden_gradient(small_tiles, dtype, precision, strategy,
                                                                            trainable):
    (f1, b1), (f2, b2) = (_measure(t, VOCABS[0], dtype, trainable) for t in TOKENS)
    dt = TOKENS[1] - TOKENS[0]
    assert (f2 - f1) / dt == act.FUSED_HEAD_KERNEL_ROW_BYTES
    # a full fine-tune's formula holds no hidden copy of its own (head_activation_bytes counts it),
    # as here, where the hidden state is an input made before the measurement
    (_, pb1), (_, pb2) = (_formula(t, VOCABS[0], precision, strategy, "full") for t in TOKENS)
    assert (b2 - b1) / dt == (pb2 - pb1) / dt


def test_the_knob_drops_the_logits_from_the_answer():
    base = dict(vocab_size=128256, micro_batch=2, seq_len=2048, method=st.code(st.METHODS, "lora", "method"))
    eager, fused = (columns("llama-2-7b", **base, fused_lm_head=flag) for flag in (False, True))
    assert int(act.logits_forward_bytes(eager)) > 10 * 2 * 2048 * 128256  # 10 B per token and entry
    # the chunked head: a tile, per-token rows and hidden copies; under 10 % of the logits here
    assert int(act.fused_lm_head_forward_bytes(fused)) < 0.1 * int(act.logits_forward_bytes(eager))
