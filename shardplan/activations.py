"""Activation bytes saved for backward, counted tensor by tensor.

Per decoder layer and per token, each term is a tensor that autograd keeps alive from forward to
backward, at the compute dtype's width ``a`` bytes (2 for 16-bit, 4 for fp32):

* norm input — LayerNorm (torch native kernel) saves its input: a·h. Hugging Face's eager
  RMSNorm upcasts to fp32 and saves that copy (4·h) plus the normalized 16-bit tensor that the
  weight multiply saves (a·h).
* norm output, saved by the next Linear for its weight gradient: a·h.
* attention, SDPA/flash (DESIGN.md §4): q and k after RoPE, v, the output O and the per-head
  log-sum-exp (fp32): a·(q + 2·kv + q) + 4·heads; the ``transpose().contiguous()`` copy of O that
  ``o_proj`` saves: a·q.
* attention, eager (Korthikanti et al. 2022, arXiv 2205.05198, §4.1): Q and K for QKᵀ, V, the
  softmax output (a·heads·s), and with dropout its 1-byte mask and its output (a·heads·s).
* MLP, gated (SwiGLU/GeGLU): gate output, activation output, up output, their product: 4·a·i.
  Non-gated (GELU/ReLU): fc1 output and activation output: 2·a·i.
* dropout masks (1 byte per element) after attention and after the MLP when dropout is on.

Under the paper's assumptions (LayerNorm, GELU MLP with i = 4h, eager attention, dropout, a = 2)
the sum is s·b·h·(34 + 5·a_heads·s/h), Korthikanti et al. Table 2 — pinned in
tests/test_activations.py. Logits and the cross-entropy loss are counted separately.
"""

from __future__ import annotations

import numpy as np

from shardplan import strategy as st


def compute_dtype_bytes(precision):
    return np.where(np.asarray(precision) == st.FP32, 4, 2)


def norm_saved_bytes_per_token(c, a):
    """What one norm saves of its input (see module docstring)."""
    return np.where(c.layernorm, a * c.hidden_size, (4 + a) * c.hidden_size)


def attention_saved_bytes_per_token(c, a):
    """Attention core + projections' saved inputs, per token (the s² part of eager separately)."""
    sdpa = a * (2 * c.q_width + 2 * c.kv_width) + 4 * c.num_heads + a * c.attn_out_width
    eager = a * (c.q_width + 2 * c.kv_width) + a * c.attn_out_width
    return np.where(c.attention == st.SDPA, sdpa, eager)


def attention_quadratic_bytes_per_token(c, a):
    """Eager attention's softmax output (+ dropout mask and output): per token, grows with s."""
    per_score = np.where(c.dropout, 2 * a + 1, a)
    return np.where(c.attention == st.EAGER, per_score * c.num_heads * c.seq_len, 0)


def mlp_saved_bytes_per_token(c, a):
    return np.where(c.gated_mlp, 4 * a * c.mlp_width, 2 * a * c.mlp_width)


def dropout_mask_bytes_per_token(c):
    return np.where(c.dropout, 2 * c.hidden_size, 0)


def layer_bytes_per_token(c, a):
    """One layer without checkpointing: two norms with their outputs, attention, MLP, masks."""
    norms = 2 * (norm_saved_bytes_per_token(c, a) + a * c.hidden_size)
    return (norms + attention_saved_bytes_per_token(c, a) + attention_quadratic_bytes_per_token(c, a)
            + mlp_saved_bytes_per_token(c, a) + dropout_mask_bytes_per_token(c))


def selective_layer_bytes_per_token(c, a):
    """Selective checkpointing keeps matmul and attention-kernel outputs and the block input;
    it recomputes norms, RoPE, activation functions and dropout, and (eager) the s² softmax
    (Korthikanti et al. 2022, §5: "selective activation recomputation")."""
    h = c.hidden_size
    attn = a * (c.q_width + 2 * c.kv_width) + np.where(c.attention == st.SDPA, a * c.attn_out_width + 4 * c.num_heads, 0)
    mlp = np.where(c.gated_mlp, 2 * a * c.mlp_width, a * c.mlp_width)
    return a * h + attn + a * h + mlp + a * h


def checkpointed_layers(c):
    """How many blocks are checkpointed: all (full, selective), every k-th (ceil(L/k)), none."""
    every_k = -(-c.num_layers // np.maximum(c.ac_every_k, 1))
    return np.select([c.ac == st.AC_NONE, c.ac == st.AC_EVERY_K], [0, every_k], c.num_layers)


def block_activation_bytes(c):
    """Saved activations of all blocks at the start of backward, for one micro-batch.

    Checkpointed blocks keep only what the policy saves; the block being recomputed in backward
    holds its full set again, in place of its checkpoint (so AC never exceeds no AC).
    """
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    full = layer_bytes_per_token(c, a)
    kept = np.where(c.ac == st.AC_SELECTIVE, selective_layer_bytes_per_token(c, a), a * c.hidden_size)
    n_ckpt = checkpointed_layers(c)
    with_ckpt = (n_ckpt - 1) * kept + full + (c.num_layers - n_ckpt) * full
    per_token = np.where(n_ckpt > 0, with_ckpt, c.num_layers * full)
    return (tokens * per_token).astype(np.int64)


def head_activation_bytes(c):
    """Final norm (input and output) saved before the lm_head."""
    a = compute_dtype_bytes(c.precision)
    return (c.micro_batch * c.seq_len * (norm_saved_bytes_per_token(c, a) + a * c.hidden_size)).astype(np.int64)


def logits_and_loss_bytes(c):
    """Logits and cross-entropy at their peak, at the start of backward: (a + 12)·b·s·V.

    Hugging Face causal-LM heads return the 16-bit logits (a·bsV, held by the output), upcast them
    with ``.float()`` and call ``cross_entropy``, whose log-softmax saves its fp32 output (4·bsV).
    Its backward then holds the incoming gradient and its own result in fp32 (4 + 4)·bsV before the
    saved output is freed. ASSUMPTION: no chunked/fused cross-entropy (e.g. Liger) is used.
    """
    a = compute_dtype_bytes(c.precision)
    return (c.micro_batch * c.seq_len * c.vocab_size * (a + 12)).astype(np.int64)
