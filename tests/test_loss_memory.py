"""The logits and the loss as each stack's loss code allocates them, measured on CPU.

Each stack's loss is run as its code writes it (tiny hidden size, frozen lm_head, so that every
vocabulary-proportional byte is the loss's), under a dispatch mode that sums the bytes of every
live storage after each op. The vocabulary-proportional part is isolated by running each shape at
two vocabulary sizes: (peak(V2) - peak(V1)) / (b·s·(V2 - V1)) is the bytes per token per
vocabulary entry, which must equal the same difference of shardplan's formula
(``activations.logits_forward_bytes`` / ``logits_backward_bytes`` and the chunked pair). Labels,
position ids and the hidden state's gradient do not scale with V and cancel. Shapes vary the
micro-batch and the sequence too, not only the vocabulary.
"""

import weakref

import pytest

from shardplan.formulas.activations import (
    chunked_logits_backward_bytes,
    chunked_logits_forward_bytes,
    logits_backward_bytes,
    logits_forward_bytes,
)
from shardplan.inputs import strategy as st
from tests.helpers import columns

torch = pytest.importorskip("torch")
F = torch.nn.functional
TorchDispatchMode = pytest.importorskip("torch.utils._python_dispatch").TorchDispatchMode
tree_flatten = pytest.importorskip("torch.utils._pytree").tree_flatten

HIDDEN = 16
SHAPES = [(1, 256), (2, 128), (4, 64)]  # (micro-batch, sequence)
VOCABS = (2048, 6144)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages alive since ``start``, sampled after every dispatched op."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.base = {}, 0, 0

    def add(self, *tensors):
        for t in tensors:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ref = self.live.get(storage._cdata)
                # a new storage at a freed one's address (same _cdata) replaces its dead entry
                if ref is None or ref() is None:
                    self.live[storage._cdata] = weakref.ref(storage)

    def now(self):
        alive = {k: r() for k, r in self.live.items()}
        self.live = {k: self.live[k] for k, s in alive.items() if s is not None}
        return sum(s.nbytes() for s in alive.values() if s is not None)

    def start(self):
        self.base = self.peak = self.now()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.add(*tree_flatten(out)[0])
        self.peak = max(self.peak, self.now())
        return out


def _inputs(b, s, vocab, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, HIDDEN, dtype=dtype, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, HIDDEN, dtype=dtype, generator=gen) * 0.02  # frozen: no V·h gradient
    labels = torch.randint(0, vocab, (b, s), generator=gen)
    return x, weight, labels


def hf_loss(x, weight, labels):
    # transformers LlamaForCausalLM.forward keeps ``logits`` (bf16) referenced while
    # loss/loss_utils.py ForCausalLMLoss runs: logits.float(), labels padded and shifted
    logits = F.linear(x, weight)
    upcast = logits.float()
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    return F.cross_entropy(upcast.view(-1, upcast.size(-1)), shift.view(-1), ignore_index=-100, reduction="sum")


def torchtitan_loss(x, weight, labels):
    # torchtitan components/loss.py cross_entropy_loss: F.cross_entropy(pred.flatten(0, 1).float(), ...)
    pred = F.linear(x, weight)
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def torchtune_loss(x, weight, labels, chunks=8):
    # torchtune: the model's output projection per chunk (h.tensor_split(C, dim=1)), then
    # modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss: each chunk .float() + CE (sum)
    logits = [F.linear(h, weight) for h in x.tensor_split(chunks, dim=1)]
    targets = [t.reshape(-1) for t in labels.tensor_split(chunks, dim=1)]
    total = sum(F.cross_entropy(l.reshape(-1, l.size(-1)).float(), t, reduction="sum") for l, t in zip(logits, targets))
    del logits  # the recipe's ``del logits`` before backward
    return total


def litgpt_loss(x, weight, labels):
    # LitGPT finetune/lora.py: model(input_ids, lm_head_chunk_size=128) (a list of bf16 logit chunks)
    # returned through Lightning Fabric's _FabricModule.forward, whose precision.convert_output casts
    # every floating output to torch.get_default_dtype() (float32) after the forward context and drops
    # the bf16 list; the last chunk shifted; utils.py chunked_cross_entropy: F.cross_entropy per chunk
    # (no .float() of its own); the loop's ``logits`` stays referenced through backward
    logits = [F.linear(h, weight) for h in x.split(128, dim=1)]
    logits = [chunk.to(torch.float32) for chunk in logits]  # Fabric's convert_output
    logits[-1] = logits[-1][..., :-1, :]
    targets = labels[..., 1:].split(logits[0].size(1), dim=1)
    losses = [F.cross_entropy(l.reshape(-1, l.size(-1)), t.reshape(-1), reduction="none") for l, t in zip(logits, targets)]
    return torch.cat(losses).sum(), logits


def _measure(loss_fn, b, s, vocab, dtype):
    """(forward peak, backward peak) bytes above what existed before the loss's forward."""
    x, weight, labels = _inputs(b, s, vocab, dtype)
    mode = LiveBytes()
    with mode:
        mode.add(x, weight, labels)
        mode.start()
        out = loss_fn(x, weight, labels)
        loss, held = out if isinstance(out, tuple) else (out, None)
        forward, mode.peak = mode.peak - mode.base, 0
        loss.backward()
        backward = mode.peak - mode.base
    del held
    return forward, backward


def _per_entry(measure, b, s):
    (f1, b1), (f2, b2) = (measure(v) for v in VOCABS)
    entries = b * s * (VOCABS[1] - VOCABS[0])
    return (f2 - f1) / entries, (b2 - b1) / entries


def _formula_per_entry(forward, backward, b, s, **knobs):
    cols = [columns("llama-2-7b", vocab_size=v, micro_batch=b, seq_len=s, **knobs) for v in VOCABS]
    entries = b * s * (VOCABS[1] - VOCABS[0])
    return ((int(forward(cols[1])) - int(forward(cols[0]))) / entries,
            (int(backward(cols[1])) - int(backward(cols[0]))) / entries)


@pytest.mark.parametrize("b,s", SHAPES)
@pytest.mark.parametrize("loss_fn", [hf_loss, torchtitan_loss])
def test_fp32_upcast_losses_hold_what_the_formula_counts(loss_fn, b, s):
    # HF and torchtitan: bf16 logits + fp32 copy + fp32 log-softmax = 10 forward; saved log-softmax
    # + nll_loss's gradient + log-softmax's gradient, all fp32 = 12 at the start of backward
    measured = _per_entry(lambda v: _measure(loss_fn, b, s, v, torch.bfloat16), b, s)
    counted = _formula_per_entry(logits_forward_bytes, logits_backward_bytes, b, s,
                                 precision=st.BF16_PURE, logits_fp32=True)
    assert measured == pytest.approx(counted, abs=1e-3) and counted == (10, 12)


@pytest.mark.parametrize("b,s", SHAPES)
def test_torchtune_chunked_loss_holds_at_most_what_the_formula_counts(b, s):
    # forward: the 16-bit chunks (2) + every chunk's fp32 log-softmax (4) + one chunk's fp32 copy
    # (4/C), as counted. Start of backward: the saved chunks (4) + one chunk's nll_loss and
    # log-softmax gradients (8/C); the formula also counts the chunk's cast back to bf16 (2/C), which
    # runs after the engine released that chunk's saved log-softmax and nll gradient: over by 2/C
    measured = _per_entry(lambda v: _measure(torchtune_loss, b, s, v, torch.bfloat16), b, s)
    counted = _formula_per_entry(chunked_logits_forward_bytes, chunked_logits_backward_bytes, b, s,
                                 precision=st.BF16_PURE, logits_fp32=True, ce_chunks=8)
    assert counted == pytest.approx((2 + 4 + 4 / 8, 4 + (8 + 2) / 8))
    assert measured == pytest.approx((counted[0], counted[1] - 2 / 8), abs=1e-3)


@pytest.mark.parametrize("b,s", [(1, 512), (2, 512), (4, 256), (2, 1024)])
def test_litgpt_loss_on_fabric_is_fp32_and_its_chunking_is_bounded(b, s):
    # Fabric casts LitGPT's bf16 logit chunks to fp32, so the loss is fp32 (logits_fp32): inside the
    # loss the fp32 logits (4) + every chunk's fp32 log-softmax (4, over s - 1 of the s tokens) = 8 (+ the shifted last chunk's
    # fp32 reshape copy, 4·(1/C - 1/s), when b > 1; the cast itself holds 2 + 4); at the start of
    # backward the loop's fp32 logits (4) + the saved log-softmax (4) + one chunk's two fp32
    # gradients (8/C) = 8 + 8/C. Counted as one unchunked fp32 cross-entropy: 10 and 12, above both
    # (LitGPT's 128-token chunks are listed as not modelled in lightning.json).
    chunks = s // 128
    measured = _per_entry(lambda v: _measure(litgpt_loss, b, s, v, torch.bfloat16), b, s)
    counted = _formula_per_entry(logits_forward_bytes, logits_backward_bytes, b, s,
                                 precision=st.BF16_PURE, logits_fp32=True)
    assert counted == (10, 12)
    copy = 4 * (1 / chunks - 1 / s) if b > 1 else 0
    assert measured[0] == pytest.approx(4 + 4 * (s - 1) / s + copy, abs=1e-3) and measured[0] <= counted[0]
    assert measured[1] == pytest.approx(8 + 8 / chunks, abs=12 / s) and measured[1] <= counted[1]


@pytest.mark.parametrize("b,s", [(1, 512), (2, 512), (4, 256), (2, 1024)])
def test_litgpt_chunked_head_formula_is_what_the_loop_holds(b, s):
    # ``chunked_head``: inside the loss 8 per logit (the shifted token and the last chunk's reshape
    # copy aside), at the start of backward 8 + 8/C, C = ceil(s/128)
    from shardplan.formulas.activations import chunked_head_backward_bytes, chunked_head_forward_bytes

    measured = _per_entry(lambda v: _measure(litgpt_loss, b, s, v, torch.bfloat16), b, s)
    counted = _formula_per_entry(chunked_head_forward_bytes, chunked_head_backward_bytes, b, s,
                                 precision=st.BF16_PURE, logits_fp32=True, chunked_head=True)
    assert counted == pytest.approx((8, 8 + 8 / (s // 128)))
    copy = 4 * (1 / (s // 128) - 1 / s) if b > 1 else 0
    assert measured[0] == pytest.approx(counted[0] - 4 / s + copy, abs=1e-3)
    assert measured[1] == pytest.approx(counted[1], abs=12 / s)


def test_lightning_stack_runs_its_loss_in_fp32():
    # the stack profile says what Fabric's convert_output does: the loss of a lightning run is fp32
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.stacks import resolved_fields

    for method in ("full", "lora", "qlora"):
        assert resolved_fields(TrainingConfig(stack="lightning", method=method), 1).logits_fp32 is True


def autocast_loss(x, weight, labels):
    # a plain loop under torch.autocast: F.cross_entropy on the bf16 logits, no explicit upcast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(x, weight)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))


@pytest.mark.parametrize("b,s", SHAPES)
def test_autocast_runs_the_loss_in_fp32(b, s):
    # autocast casts cross_entropy's input to fp32 (an fp32 copy, as .float() does): a loop whose
    # loss runs under autocast holds what the HF loss holds, so its stack states logits_fp32
    measured = _per_entry(lambda v: _measure(autocast_loss, b, s, v, torch.float32), b, s)
    counted = _formula_per_entry(logits_forward_bytes, logits_backward_bytes, b, s,
                                 precision=st.BF16_MIXED, logits_fp32=True)
    # + the bf16 copy of the lm_head weight autocast makes for the matmul, which saves it for
    # backward: 2·V·h bytes, the ``autocast_weight_copies`` term (memory.py), not the loss's
    weight_copy = 2 * HIDDEN / (b * s)
    assert measured == pytest.approx((counted[0] + weight_copy, counted[1] + weight_copy), abs=1e-3)
    assert counted == (10, 12)


def torchtune_2024_loss(x, weight, labels):
    # torchtune before its chunked loss (4fba6cd44, 2024-08-28) and "del logits" (#1046, #1235):
    # TransformerDecoder returns ``self.output(h).float()``; the recipe shifts with
    # ``logits[..., :-1, :].contiguous()``, transposes, runs torch.nn.CrossEntropyLoss and calls
    # ``loss.backward()`` with ``logits`` still referenced
    logits = F.linear(x, weight).float()
    logits = logits[..., :-1, :].contiguous()
    logits = logits.transpose(1, 2)
    return torch.nn.CrossEntropyLoss()(logits, labels[..., 1:].contiguous()), logits


@pytest.mark.parametrize("b,s", SHAPES + [(2, 512)])
def test_torchtune_2024_loop_keeps_its_fp32_logits_through_backward(b, s):
    # ``loop_keeps_logits`` with the whole fp32 loss: the kept logits (4) + the saved log-softmax (4)
    # + nll_loss's and log-softmax's gradients (8) = 16 during backward, some over s - 1 of the s
    # tokens (the shift: 16 - 12/s measured at b = 1, 16·(s - 1)/s above). Inside the forward the bf16 output is already gone
    # (8 measured, 10 counted)
    measured = _per_entry(lambda v: _measure(torchtune_2024_loss, b, s, v, torch.bfloat16), b, s)
    counted = _formula_per_entry(logits_forward_bytes, logits_backward_bytes, b, s,
                                 precision=st.BF16_PURE, logits_fp32=True, loop_keeps_logits=True)
    plain = _formula_per_entry(logits_forward_bytes, logits_backward_bytes, b, s, precision=st.BF16_PURE, logits_fp32=True)
    assert counted == (10, 16) and plain == (10, 12)
    assert measured[1] == pytest.approx(counted[1], abs=16 / s + 1e-3) and measured[1] <= counted[1]
    assert measured[0] == pytest.approx(8 - 4 / s, abs=1e-3) and measured[0] <= counted[0]  # .float() out + shifted copy
