"""Activation bytes: the Korthikanti et al. (2022) GPT layer, and the checkpointing rules."""

import numpy as np
import pytest

from shardplan import strategy as st
from shardplan.activations import (
    block_activation_bytes, compute_dtype_bytes, layer_bytes_per_token, logits_and_loss_bytes,
)
from tests.helpers import columns


@pytest.mark.parametrize("model,seq,batch", [("gpt3-175b", 2048, 1), ("gpt2", 1024, 8), ("gpt2-xl", 512, 4)])
def test_gpt_layer_matches_korthikanti_table_2(model, seq, batch):
    # Korthikanti et al. 2022 (arXiv 2205.05198) §4.1 / Table 2, no parallelism:
    # activations per layer = s·b·h·(34 + 5·a·s/h) bytes, for LayerNorm, GELU MLP (4h), eager
    # attention with dropout, 16-bit activations.
    c = columns(model, attention=st.EAGER, dropout=True, seq_len=seq, micro_batch=batch)
    h, a = int(c.hidden_size), int(c.num_heads)
    expected = seq * batch * h * (34 + 5 * a * seq / h)
    got = layer_bytes_per_token(c, compute_dtype_bytes(c.precision)) * seq * batch
    assert int(got) == pytest.approx(expected, rel=0, abs=0)


def test_selective_recompute_drops_the_quadratic_term_for_eager_attention():
    # Korthikanti §5: selective recomputation removes the 5as²b attention term.
    full = columns("gpt2", attention=st.EAGER, dropout=True, seq_len=1024, ac=st.AC_NONE)
    short = columns("gpt2", attention=st.EAGER, dropout=True, seq_len=512, ac=st.AC_SELECTIVE)
    long = columns("gpt2", attention=st.EAGER, dropout=True, seq_len=1024, ac=st.AC_SELECTIVE)
    # Without AC, doubling s more than doubles bytes (s² term); with selective it is linear in s
    # except for the one block recomputed in backward.
    assert block_activation_bytes(long) < block_activation_bytes(full)
    ratio = (block_activation_bytes(long) - 2 * block_activation_bytes(short))
    assert ratio > 0  # only the recomputed block keeps an s² term


def test_full_checkpointing_keeps_block_inputs_plus_one_layer():
    c = columns("llama-2-7b", ac=st.AC_FULL, seq_len=4096, micro_batch=1)
    tokens = 4096
    one_layer = int(layer_bytes_per_token(c, 2)) * tokens
    expected = 31 * 2 * 4096 * tokens + one_layer
    assert int(block_activation_bytes(c)) == expected


def test_llama_layer_counts_hf_rmsnorm_sdpa_swiglu():
    # Per token per layer for Llama-2-7B in bf16 (h = 4096, i = 11008, 32 heads, MHA):
    # 2 RMSNorms: (4 fp32 copy + 2 normalized + 2 output)·h each = 16h
    # SDPA: q, k (after RoPE), v, O + lse (fp32 per head) = 2·4h + 4·32; o_proj input copy 2h
    # SwiGLU: gate, act, up, product = 4·2·i
    c = columns("llama-2-7b")
    h, i = 4096, 11008
    expected = 16 * h + 2 * 4 * h + 4 * 32 + 2 * h + 8 * i
    assert int(layer_bytes_per_token(c, 2)) == expected


def test_logits_and_loss():
    # Llama-3.1-8B, seq 8192: (2 + 12)·s·V bytes = 14 · 8192 · 128256.
    c = columns("llama-3.1-8b", seq_len=8192)
    assert int(logits_and_loss_bytes(c)) == 14 * 8192 * 128256


@pytest.mark.parametrize("mode", [st.AC_FULL, st.AC_SELECTIVE, st.AC_EVERY_K])
@pytest.mark.parametrize("model", ["llama-2-7b", "gpt2", "mixtral-8x7b", "falcon-7b", "deepseek-v2-lite"])
def test_checkpointing_never_raises_activation_bytes(model, mode):
    for seq in (128, 2048, 8192):
        base = block_activation_bytes(columns(model, seq_len=seq))
        ckpt = block_activation_bytes(columns(model, seq_len=seq, ac=mode, ac_every_k=3))
        assert ckpt <= base
