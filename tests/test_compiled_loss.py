"""A compiled cross-entropy allocates as a fused kernel does (``fused_ce``): measured on CPU with
torch.compile's AOTAutograd min-cut partitioner (``aot_eager_decomp_partition``: the partitioner
inductor uses, without code generation), against ``logits_forward_bytes`` /
``chunked_logits_*_bytes``; and which published rows are read as compiled losses."""

from __future__ import annotations

import pytest

from shardplan.formulas.activations import chunked_logits_backward_bytes, chunked_logits_forward_bytes, logits_backward_bytes, logits_forward_bytes
from shardplan.validation.runs import read_runs
from tests.helpers import columns

torch = pytest.importorskip("torch")


def _loss(pred, labels):  # torchtitan components/loss.py cross_entropy_loss; torchtune's chunk loss
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


@pytest.mark.parametrize("batch,seq,vocab", [(1, 32, 500), (2, 32, 500), (1, 64, 500), (1, 32, 1200)])
def test_compiled_cross_entropy_saves_its_16bit_input_and_two_fp32_rows(batch, seq, vocab):
    """The partitioner keeps the bf16 logits (the input itself: the loop's ``del pred`` frees
    nothing) and two fp32 per-row statistics (max and log-sum-exp) instead of eager's fp32
    log-softmax (4·bsV), and the gradient comes back in bf16."""
    torch._dynamo.reset()
    compiled = torch.compile(_loss, backend="aot_eager_decomp_partition")
    pred = torch.randn(batch, seq, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(pred, labels)
    float_rows = sum(n for p, n in saved.items() if p not in (pred.untyped_storage().data_ptr(), labels.untyped_storage().data_ptr()))
    assert pred.untyped_storage().data_ptr() in saved
    tokens = batch * seq
    assert 8 * tokens <= float_rows <= 8 * tokens + 16  # + the scalar normaliser
    loss.backward()
    assert pred.grad.dtype == torch.bfloat16
    # the formula: a·bsV logits + 8·bs rows (+ labels, position ids) forward; 2·a·bsV backward
    c = columns("llama-2-7b", vocab_size=vocab, seq_len=seq, micro_batch=batch, fused_ce=True)
    eager = columns("llama-2-7b", vocab_size=vocab, seq_len=seq, micro_batch=batch)
    labels_ids = 8 * batch * (2 * seq + 1) + 8 * seq
    assert int(logits_forward_bytes(c)) == 2 * tokens * vocab + 8 * tokens + labels_ids
    assert int(logits_backward_bytes(c)) == 4 * tokens * vocab
    assert int(logits_backward_bytes(eager)) == 12 * tokens * vocab


@pytest.mark.parametrize("chunks", [1, 4, 8, 16])
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_compiled_chunked_loss_keeps_every_chunk_and_one_chunk_gradient(chunks, vocab):
    # torchtune CEWithChunkedOutputLoss with compile_loss: every chunk's 16-bit logits saved by
    # its compiled loss (a·bsV), one chunk's 16-bit gradient at a time (a·bsV/C)
    seq, batch = 2048, 2
    c = columns("llama-3.1-8b", vocab_size=vocab, seq_len=seq, micro_batch=batch, ce_chunks=chunks, fused_ce=True)
    tokens = seq * batch
    assert int(chunked_logits_backward_bytes(c)) == int(2 * tokens * vocab * (1 + 1 / chunks)) + 8 * tokens
    forward = int(chunked_logits_forward_bytes(c))
    assert forward == 2 * tokens * vocab + 8 * tokens + 8 * batch * (2 * seq + 1) + 8 * seq
    eager = columns("llama-3.1-8b", vocab_size=vocab, seq_len=seq, micro_batch=batch, ce_chunks=chunks)
    assert int(chunked_logits_backward_bytes(eager)) > int(chunked_logits_backward_bytes(c))


def test_rows_compile_their_loss_from_the_revision_that_does():
    # compile_loss arrived in torchtune c169bcddd (2024-09-07): the Nov 2024 README tables ran
    # compiled losses, the May 2024 one compiled the model only; torchtitan compiles its loss from
    # bbb1b616e (2025-04-02), its rows dated by the revision they name (runs.TORCHTITAN_REVISION_DATES)
    rows = {r.row_id: r for r in read_runs("tests/data/published_runs/runs.csv")}
    assert rows["TTN017"].config.fused_ce is True   # rev 9bafd16fc, 2024-11-14, compile yes
    assert rows["TTN027"].config.fused_ce is True   # rev 1814feb17, 2024-11-18, + Compile
    assert rows["TTN026"].config.fused_ce is None   # same table, before + Compile
    assert rows["TTN010"].config.fused_ce is None   # rev 0217d44c2, 2024-05-09, compile yes
    assert rows["TT002"].config.fused_ce is None    # torchtitan 9dec370 (2024-12-26): loss compile commented out
    assert rows["AO004"].config.fused_ce is True    # torchtitan 2c8b5947, 2025-08-08, compile yes
    assert rows["AO008"].config.fused_ce is True    # torchtitan 6fc499f6, 2025-08-14, compile yes
    assert rows["TTQ001"].config.fused_ce is True   # nvfp4.md, first added 2026-08-05, compile yes
    assert rows["AO001"].config.fused_ce is None    # "torchtitan 0.0.2": 2024-04-16 .. 2025-06-17, undated
