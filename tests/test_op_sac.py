"""torchtitan's op-level selective activation checkpointing (``ac = selective-op``): what a block
keeps between forward and backward, measured on CPU against ``selective_op_layer_bytes_per_token``.

The block is torchtitan's Llama block (``torchtitan/models/llama/model.py`` at 9dec370: wq, wk, wv,
RoPE, ``repeat_kv``, SDPA, wo; ``w2(silu(w1(x)) * w3(x))``; RMSNorm), checkpointed with
torchtitan's policy (``parallelisms/parallelize_llama.py`` ``_get_custom_policy``: save mm and
SDPA outputs except every second mm, the count restarting in every block). The policy's SDPA ops
are CUDA's; on CPU the flash kernel is ``_scaled_dot_product_flash_attention_for_cpu`` (same
outputs: O and the fp32 log-sum-exp), added to the save list here.
"""

from __future__ import annotations

import gc
import weakref
from collections import defaultdict

import pytest

from shardplan.formulas.activations import (
    block_activation_bytes,
    op_sac_recomputed_params_per_layer,
    selective_layer_bytes_per_token,
    selective_op_layer_bytes_per_token,
)
from shardplan.inputs import strategy as st
from tests.helpers import columns

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


class _RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return out.type_as(x) * self.weight


class _Block(nn.Module):
    """torchtitan's TransformerBlock (attention + feed-forward), RoPE as a real rotation."""

    def __init__(self, h, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, h // heads
        self.wq, self.wk = nn.Linear(h, h, bias=False), nn.Linear(h, kv_heads * self.d, bias=False)
        self.wv, self.wo = nn.Linear(h, kv_heads * self.d, bias=False), nn.Linear(h, h, bias=False)
        self.w1, self.w3 = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)
        self.attention_norm, self.ffn_norm = _RMSNorm(h), _RMSNorm(h)

    def _rope(self, x, cos, sin):
        a, b = x[..., : self.d // 2], x[..., self.d // 2:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def _attention(self, x, cos, sin):
        bs, s, _ = x.shape
        q = self._rope(self.wq(x).view(bs, s, self.heads, self.d), cos, sin)
        k = self._rope(self.wk(x).view(bs, s, self.kv_heads, self.d), cos, sin)
        v = self.wv(x).view(bs, s, self.kv_heads, self.d)
        rep = self.heads // self.kv_heads  # torchtitan repeat_kv
        k, v = (t.repeat_interleave(rep, dim=2) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, s, -1))

    def forward(self, x, cos, sin):
        h = x + self._attention(self.attention_norm(x), cos, sin)
        return h + self.w2(F.silu(self.w1(self.ffn_norm(h))) * self.w3(self.ffn_norm(h)))


def _torchtitan_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default}
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        to_save = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _kept_bytes(block, x, cos, sin):
    """Bytes of the storages created during the checkpointed forward that are still alive after it
    (its output excluded): what the policy saved for backward."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    made = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    made.append(weakref.ref(t.untyped_storage()))
            return out

    with _Record():
        out = checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=_torchtitan_context)
    gc.collect()
    # keyed by address: a storage's Python object is not the same on every access; the weights'
    # transposes (aten.t) are views of the parameters, and the output is the next block's input
    alive = {s.data_ptr(): s.nbytes() for s in (r() for r in made) if s is not None}
    for t in (*block.parameters(), out):
        alive.pop(t.untyped_storage().data_ptr(), None)
    total = sum(alive.values())
    assert out.requires_grad  # the graph (and what it saved) is alive while we counted
    return total


@pytest.mark.parametrize("dtype,a", [(torch.bfloat16, 2), (torch.float32, 4)])
@pytest.mark.parametrize("h,heads,kv_heads,ffn,seq,batch", [
    (64, 4, 4, 160, 32, 1), (64, 4, 2, 160, 32, 1), (64, 4, 1, 160, 32, 1),   # n_kv varies
    (64, 4, 2, 256, 32, 1), (64, 4, 2, 160, 64, 1), (64, 4, 2, 160, 32, 3),   # ffn, sequence, micro-batch
    (128, 8, 2, 352, 16, 2),
])
def test_op_sac_block_keeps_its_input_odd_matmuls_and_attention_outputs(dtype, a, h, heads, kv_heads, ffn, seq, batch):
    torch.manual_seed(0)
    block = _Block(h, heads, kv_heads, ffn).to(dtype)
    x = torch.randn(batch, seq, h, dtype=dtype, requires_grad=True)
    d = h // heads
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * torch.arange(d // 2, dtype=torch.float32)[None] / d
    cos, sin = (f(angles)[None, :, None, :].to(dtype) for f in (torch.cos, torch.sin))
    measured = _kept_bytes(block, x, cos, sin)
    c = columns("llama-2-7b", hidden_size=h, q_width=h, kv_width=kv_heads * d, attn_out_width=h, num_heads=heads,
                mlp_width=ffn, ac=st.AC_SELECTIVE_OP)
    # the block input is the checkpoint's argument (the caller's x here, not created inside)
    expected = batch * seq * (int(selective_op_layer_bytes_per_token(c, a)) - a * h)
    assert measured == expected


def test_op_sac_keeps_less_than_saving_every_matmul_and_scales_with_tokens_and_layers():
    # Llama-3.1-8B bf16: input 2h + q, v, gate, down outputs 2(q + kv + i + h) + O 2q + lse 4·heads
    c = columns("llama-3.1-8b", ac=st.AC_SELECTIVE_OP, seq_len=8192, micro_batch=2)
    per_token = 2 * 4096 + 2 * (4096 + 1024 + 14336 + 4096) + 2 * 4096 + 4 * 32
    assert int(selective_op_layer_bytes_per_token(c, 2)) == per_token == 63616
    assert int(selective_layer_bytes_per_token(c, 2)) > per_token
    assert int(block_activation_bytes(c)) == 32 * 2 * 8192 * per_token
    longer = columns("llama-3.1-8b", ac=st.AC_SELECTIVE_OP, seq_len=4096, micro_batch=2)
    assert 2 * int(block_activation_bytes(longer)) == int(block_activation_bytes(c))
    # recomputed matmuls: k (h·kv), o (q·h), up (h·i)
    assert int(op_sac_recomputed_params_per_layer(c)) == 4096 * (1024 + 4096 + 14336)
