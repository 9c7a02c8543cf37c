"""Activation bytes: the Korthikanti et al. (2022) GPT layer, and the checkpointing rules."""

import pytest

from shardplan.formulas.activations import (
    block_activation_bytes,
    compute_dtype_bytes,
    layer_bytes_per_token,
    logits_and_loss_bytes,
    logits_backward_bytes,
    logits_forward_bytes,
)
from shardplan.inputs import strategy as st
from tests.helpers import columns


@pytest.mark.parametrize("model,seq,batch", [("gpt3-175b", 2048, 1), ("gpt2", 1024, 8), ("gpt2-xl", 512, 4)])
def test_gpt_layer_matches_korthikanti_table_2(model, seq, batch):
    # Korthikanti et al. 2022 (arXiv 2205.05198) §4.1 / Table 2, no parallelism:
    # activations per layer = s·b·h·(34 + 5·a·s/h) bytes, for LayerNorm, GELU MLP (4h), eager
    # attention with dropout, 16-bit activations. The paper leaves out LayerNorm's saved
    # statistics; torch's native layer_norm saves an fp32 mean and rstd per token (8 bytes), for
    # each of the layer's 2 norms: + s·b·2·8 (measured by the calibration harness).
    c = columns(model, attention=st.EAGER, dropout=True, seq_len=seq, micro_batch=batch)
    h, a = int(c.hidden_size), int(c.num_heads)
    expected = seq * batch * h * (34 + 5 * a * seq / h) + seq * batch * 2 * 8
    got = layer_bytes_per_token(c, compute_dtype_bytes(c.precision)) * seq * batch
    assert int(got) == pytest.approx(expected, rel=0, abs=0)


def test_selective_recompute_drops_the_quadratic_term_for_eager_attention():
    # Korthikanti §5: selective recomputation removes the 5as²b attention term.
    full = columns("gpt2", attention=st.EAGER, dropout=True, seq_len=1024, ac=st.AC_NONE)
    short = columns("gpt2", attention=st.EAGER, dropout=True, seq_len=512, ac=st.AC_SELECTIVE)
    long = columns("gpt2", attention=st.EAGER, dropout=True, seq_len=1024, ac=st.AC_SELECTIVE)
    # Without AC, doubling s more than doubles bytes (s² term); with selective the blocks' kept
    # tensors are linear in s (the recomputed block's s² term exists only inside its own backward,
    # memory.py's block-backward moment).
    assert block_activation_bytes(long) < block_activation_bytes(full)
    assert block_activation_bytes(long) == 2 * block_activation_bytes(short)


def test_full_checkpointing_keeps_block_inputs():
    # Measured (data/calibration/fake_7b.jsonl, torch 2.13 non-reentrant checkpoint): during forward
    # and at the start of backward every block holds only its bf16 input; the recomputed block's
    # full set exists only inside its own backward (memory.py's block-backward moment).
    c = columns("llama-2-7b", ac=st.AC_FULL, seq_len=4096, micro_batch=1)
    tokens = 4096
    assert int(block_activation_bytes(c)) == 32 * 2 * 4096 * tokens


def test_llama_layer_counts_hf_rmsnorm_sdpa_swiglu():
    # Per token per layer for Llama-2-7B in bf16 (h = 4096, i = 11008, 32 heads, MHA):
    # 2 RMSNorms: (4 fp32 copy + 2 normalized + 2 output)·h + 4 (fp32 rstd) each = 16h + 8
    # SDPA: q, k (after RoPE), v, O + lse (fp32 per head) = 2·4h + 4·32; O is also o_proj's input
    # (the kernel returns (b, s, heads, d) layout, so .contiguous() copies nothing)
    # SwiGLU: gate, act, up, product = 4·2·i
    # = 16h + 8 + 4q + 4kv + 4·heads + 8i, measured per token per layer (fsdp2_facts.json: 2712 B at
    # h=q=64, kv=32, 4 heads, i=160).
    c = columns("llama-2-7b")
    h, i = 4096, 11008
    expected = 16 * h + 8 + 2 * 4 * h + 4 * 32 + 8 * i
    assert int(layer_bytes_per_token(c, 2)) == expected
    tiny = columns("llama-2-7b", hidden_size=64, q_width=64, kv_width=32, num_heads=4, mlp_width=160)
    assert int(layer_bytes_per_token(tiny, 2)) == 2712
    assert int(layer_bytes_per_token(c, 2)) == expected


def test_logits_and_loss():
    # Llama-3.1-8B, seq 8192, bf16. Forward peak (inside log-softmax): bf16 logits + fp32 upcast +
    # fp32 log-softmax = 10·s·V, plus the int64 labels HF pads/shifts and the position ids.
    # Start of backward: saved log-softmax + its incoming and outgoing fp32 gradients = 12·s·V
    # (measured on the 7B runs: Temp = 8·s·V, Activation = saved + 4·s·V).
    c = columns("llama-3.1-8b", seq_len=8192)
    assert int(logits_forward_bytes(c)) == 10 * 8192 * 128256 + 8 * (2 * 8192 + 1) + 8 * 8192
    assert int(logits_backward_bytes(c)) == 12 * 8192 * 128256
    assert int(logits_and_loss_bytes(c)) == 12 * 8192 * 128256
    fp32 = columns("llama-3.1-8b", seq_len=8192, precision=st.FP32)  # .float() is a no-op: 4 + 4
    assert int(logits_forward_bytes(fp32)) == 8 * 8192 * 128256 + 8 * (2 * 8192 + 1) + 8 * 8192


@pytest.mark.parametrize("vocab", [32000, 50368, 256000])
@pytest.mark.parametrize("seq,batch", [(512, 1), (2048, 4), (32768, 3)])
def test_fused_cross_entropy_holds_the_16_bit_logits_and_their_gradient(vocab, seq, batch):
    # flash-attn's fused kernel (llm-foundry's default loss): the forward keeps the a-byte logits
    # and writes an fp32 loss and log-sum-exp per row; the backward writes the logits' gradient in
    # their dtype next to the saved logits. Eager fp32 loss: 10·bsV forward, 12·bsV backward.
    labels = 8 * batch * (2 * seq + 1) + 8 * seq
    for precision, a in ((st.BF16_MIXED, 2), (st.FP32, 4)):
        fused = columns("llama-2-7b", vocab_size=vocab, seq_len=seq, micro_batch=batch, precision=precision,
                        fused_ce=True)
        eager = columns("llama-2-7b", vocab_size=vocab, seq_len=seq, micro_batch=batch, precision=precision)
        entries = batch * seq * vocab
        assert int(logits_forward_bytes(fused)) == a * entries + 8 * batch * seq + labels
        assert int(logits_backward_bytes(fused)) == 2 * a * entries
        assert int(logits_backward_bytes(eager)) == 12 * entries  # the fp32 loss, whatever the compute dtype
        # the kernel's saving grows with the vocabulary and the tokens alike: (12 - 2a)·bsV
        assert int(logits_and_loss_bytes(eager)) - int(logits_and_loss_bytes(fused)) == (12 - 2 * a) * entries


@pytest.mark.parametrize("mode", [st.AC_FULL, st.AC_SELECTIVE, st.AC_EVERY_K])
@pytest.mark.parametrize("model", ["llama-2-7b", "gpt2", "mixtral-8x7b", "falcon-7b", "deepseek-v2-lite"])
def test_checkpointing_never_raises_activation_bytes(model, mode):
    for seq in (128, 2048, 8192):
        base = block_activation_bytes(columns(model, seq_len=seq))
        ckpt = block_activation_bytes(columns(model, seq_len=seq, ac=mode, ac_every_k=3))
        assert ckpt <= base
