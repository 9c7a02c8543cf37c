"""HBM bytes of one eager decoder block's element-wise kernels, measured from the code that runs
(issue 23: ``throughput.BACKWARD_ELEMENTWISE_FACTOR`` and the per-op counts in
``throughput.layer_forward_elementwise_bytes``). A torchtitan-style block (``models/norms.py``
RMSNorm with its fp32 upcast, ``models/llama/model.py`` ``apply_rotary_emb`` through complex fp32,
``repeat_kv``, SDPA, SwiGLU, two residual adds) runs forward and backward in bf16 on the CPU under
a ``TorchDispatchMode`` that adds up, for every aten operator autograd actually calls, the bytes of
its tensor inputs and outputs. The GEMMs and the attention kernel are left out (priced as FLOPs),
as are views and allocations (no traffic). ``matrix_rope``: the same block with foundation-model-stack's
RoPE instead (``fms/modules/positions.py`` ``RotaryEmbedding.adjusted_qk`` at v0.0.5: a 2×2 fp32
rotation per pair, ``freqs[position_ids]`` ``.mul(q.float().view(..., -1, 2).unsqueeze(-2)).sum(5)``
``.type_as(q)``); the fms LLaMA block's other element-wise code (``LayerNormParameterized`` with
``use_high_precision_pow``, ``GatedLinearUnit``, the expand-and-flatten of k/v, the output's
``.contiguous()``, two residual adds) is the torchtitan block's op for op.

    python -m shardplan.calibrate.elementwise_bytes     # measured vs modelled, per token per block

ASSUMPTION: a kernel reads each input and writes each output once (no cache reuse across kernels,
no re-reads inside one); a broadcast operand counts its storage, not its expanded size.
"""

from __future__ import annotations

import sys

# priced as FLOPs (matmuls, the attention core) or moving nothing (allocations, aliases)
NOT_ELEMENTWISE = {"mm", "bmm", "addmm", "linear", "matmul", "empty", "empty_like", "empty_strided",
                   "new_empty_strided", "detach", "alias", "lift_fresh", "_unsafe_view",
                   "_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_flash_attention_for_cpu_backward",
                   "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"}
SHAPES = ((256, 8, 2, 768), (512, 8, 8, 1536), (512, 16, 4, 1792), (1024, 16, 8, 2816))


def _tensor_bytes(t) -> int:
    """A tensor's traffic: its elements, or its storage when broadcast (a stride of 0)."""
    full = t.numel() * t.element_size()
    return min(full, t.untyped_storage().nbytes()) if 0 in t.stride() else full


def byte_counter():
    """A dispatch mode adding each element-wise operator's input + output bytes into ``.bytes[phase]``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.bytes = "forward", {"forward": 0, "backward": 0}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view or func.overloadpacket.__name__ in NOT_ELEMENTWISE:
                return out
            leaves = torch.utils._pytree.tree_leaves((args, kwargs, out))
            self.bytes[self.phase] += sum(_tensor_bytes(t) for t in leaves if isinstance(t, torch.Tensor))
            return out

    return Counting()


def torchtitan_block(h: int, heads: int, kv_heads: int, ffn: int, matrix_rope: bool = False,
                     torchtune_rope: bool = False):
    """A decoder block as torchtitan's Llama writes it (the element-wise code paths; widths toy);
    ``matrix_rope``: fms's 2×2-matrix RoPE (``matrix_rope_qk``) in place of the complex one;
    ``torchtune_rope``: torchtune's real-arithmetic RoPE (``torchtune_rope_qk``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):  # torchtitan models/norms.py: _norm(x.float()).type_as(x) * weight
            y = x.float()
            return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    def complex_rope(x, freqs):  # apply_rotary_emb: view_as_complex(x.float()) * freqs, view_as_real().type_as(x)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)

    def rope_qk(q, k, freqs):
        if torchtune_rope:
            return torchtune_rope_qk(q, k, freqs)
        return matrix_rope_qk(q, k, freqs) if matrix_rope else (complex_rope(q, freqs), complex_rope(k, freqs))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = h // heads
            self.d, self.n1, self.n2 = d, RMSNorm(), RMSNorm()
            self.wq, self.wk, self.wv = (nn.Linear(h, n * d, bias=False) for n in (heads, kv_heads, kv_heads))
            self.wo = nn.Linear(heads * d, h, bias=False)
            self.w1, self.w3, self.w2 = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False), nn.Linear(ffn, h, bias=False)

        def forward(self, x, freqs):
            b, t, _ = x.shape
            y = self.n1(x)
            q, k = rope_qk(self.wq(y).view(b, t, heads, self.d), self.wk(y).view(b, t, kv_heads, self.d), freqs)
            v = self.wv(y).view(b, t, kv_heads, self.d)
            rep = heads // kv_heads  # repeat_kv: expand + reshape materialises k and v at the query width
            k, v = (z[:, :, :, None, :].expand(b, t, kv_heads, rep, self.d).reshape(b, t, heads, self.d) for z in (k, v))
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.wo(o.transpose(1, 2).contiguous().view(b, t, -1))
            z = self.n2(x)
            return x + self.w2(F.silu(self.w1(z)) * self.w3(z))

    return Block()


def matrix_rope_qk(q, k, table):
    """fms ``RotaryEmbedding.adjusted_qk`` (v0.0.5, q and k B L H D, the layout from #191 on): the
    table's rows gathered once at the positions, each pair of q and of k rotated by its 2×2 fp32
    matrix (a broadcast multiply into a 2×-wide fp32 tensor, summed over its last axis), cast back."""
    import torch

    positions = torch.arange(0, q.size(1)).repeat(q.size(0), 1)
    freqs = table[positions].float()

    def rotate(x):
        pairs = x.float().view(*x.size()[:-1], -1, 2)
        return freqs[:, -x.size(1):, None].mul(pairs.unsqueeze(-2)).sum(5).flatten(3).type_as(x).view_as(x)

    return rotate(q), rotate(k)


def torchtune_rope_qk(q, k, cache):
    """torchtune ``RotaryPositionalEmbeddings.forward`` (``modules/position_embeddings.py``; the same in
    ``Llama3ScaledRoPE``, 0217d44c2 and 9bafd16fc) on q and k (B L H D): each pair rotated with real
    fp32 arithmetic on the cached cos / sin (L × D/2 × 2), stacked and cast back."""
    import torch

    def rotate(x):
        xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
        rc = cache.view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
        out = torch.stack([xshaped[..., 0] * rc[..., 0] - xshaped[..., 1] * rc[..., 1],
                           xshaped[..., 1] * rc[..., 0] + xshaped[..., 0] * rc[..., 1]], -1)
        return out.flatten(3).type_as(x)

    return rotate(q), rotate(k)


def block_inputs(h: int, heads: int, kv_heads: int, ffn: int, tokens: int, matrix_rope: bool = False,
                 torchtune_rope: bool = False):
    """(block, x, freqs): one seeded bf16 torchtitan-style block, its input and its RoPE table (complex,
    fms's ``compute_freqs_cis`` stack of cos, -sin, sin, cos viewed as L × D/2 × 2 × 2, or torchtune's
    cos / sin cache L × D/2 × 2), the same for the eager count (``measure``) and the compiled one
    (``compiled_bytes``)."""
    import torch

    torch.manual_seed(0)
    block = torchtitan_block(h, heads, kv_heads, ffn, matrix_rope, torchtune_rope).to(torch.bfloat16)
    d = h // heads
    angles = torch.rand(tokens, d // 2)
    if torchtune_rope:
        freqs = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)
    elif matrix_rope:
        cos, sin = torch.cos(angles), torch.sin(angles)
        freqs = torch.stack([cos, -sin, sin, cos], dim=2).view(tokens, d // 2, 2, 2)
    else:
        freqs = torch.polar(torch.ones(tokens, d // 2), angles).view(1, tokens, 1, d // 2)
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    return block, x, freqs


def measure(h: int, heads: int, kv_heads: int, ffn: int, tokens: int = 64,
            matrix_rope: bool = False, torchtune_rope: bool = False) -> tuple[float, float]:
    """(forward, backward) element-wise bytes per token of one bf16 block."""
    import torch

    block, x, freqs = block_inputs(h, heads, kv_heads, ffn, tokens, matrix_rope, torchtune_rope)
    counter = byte_counter()
    with counter:
        y = block(x, freqs)
        counter.phase = "backward"
        y.backward(torch.ones_like(y))
    return counter.bytes["forward"] / tokens, counter.bytes["backward"] / tokens


def main(argv=None) -> int:
    from shardplan.formulas.throughput import BACKWARD_ELEMENTWISE_FACTOR, layer_forward_elementwise_bytes

    print("h heads kv ffn | measured fwd, bwd (bwd/fwd) | modelled fwd, bwd")
    for h, heads, kv, ffn in SHAPES:
        fwd, bwd = measure(h, heads, kv, ffn)
        model = float(layer_forward_elementwise_bytes(2, h, h, kv * h // heads, ffn))
        print(f"{h} {heads} {kv} {ffn} | {fwd:.0f}, {bwd:.0f} ({bwd / fwd:.2f}) | {model:.0f}, "
              f"{BACKWARD_ELEMENTWISE_FACTOR * model:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
