"""HBM bytes of one eager decoder block's element-wise kernels, measured from the code that runs
(issue 23: ``throughput.BACKWARD_ELEMENTWISE_FACTOR`` and the per-op counts in
``throughput.layer_forward_elementwise_bytes``). A torchtitan-style block (``models/norms.py``
RMSNorm with its fp32 upcast, ``models/llama/model.py`` ``apply_rotary_emb`` through complex fp32,
``repeat_kv``, SDPA, SwiGLU, two residual adds) runs forward and backward in bf16 on the CPU under
a ``TorchDispatchMode`` that adds up, for every aten operator autograd actually calls, the bytes of
its tensor inputs and outputs. The GEMMs and the attention kernel are left out (priced as FLOPs),
as are views and allocations (no traffic). ``rope_form`` puts another stack's RoPE in the same block
(``throughput.ROPE_FORM_EXTRA_BYTES``):

- ``matrix``: foundation-model-stack's (``fms/modules/positions.py`` ``RotaryEmbedding.adjusted_qk``
  at v0.0.5: a 2×2 fp32 rotation per pair, ``freqs[position_ids]``
  ``.mul(q.float().view(..., -1, 2).unsqueeze(-2)).sum(5).type_as(q)``); the fms LLaMA block's other
  element-wise code (``LayerNormParameterized`` with ``use_high_precision_pow``, ``GatedLinearUnit``,
  the expand-and-flatten of k/v, the output's ``.contiguous()``, two residual adds) is the torchtitan
  block's op for op;
- ``rotate_half``: Transformers' Llama/Mistral ``apply_rotary_pos_emb`` (``q * cos + rotate_half(q) * sin``,
  ``rotate_half`` = ``cat((-x2, x1), -1)``, cos and sin cast to the activations' dtype by
  ``LlamaRotaryEmbedding.forward``);
- ``pairs_fp32``: torchtune's ``RotaryPositionalEmbeddings.forward`` (q in fp32 pairs, four products,
  a difference and a sum against the fp32 cache, ``torch.stack``, ``type_as``).

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


def torchtitan_block(h: int, heads: int, kv_heads: int, ffn: int, rope_form: str = "complex"):
    """A decoder block as torchtitan's Llama writes it (the element-wise code paths; widths toy), with
    the RoPE of ``rope_form`` (``ROPE_QK``) in place of the complex one."""
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

    rope_qk = ROPE_QK[rope_form]

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


def complex_rope_qk(q, k, freqs):
    """torchtitan ``apply_rotary_emb``: ``view_as_complex(x.float())`` × freqs, ``view_as_real(...).type_as(x)``."""
    import torch

    def rotate(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)

    return rotate(q), rotate(k)


def rotate_half_rope_qk(q, k, cos_sin):
    """Transformers ``apply_rotary_pos_emb`` (Llama, Mistral, Mixtral at v4.48.1; the same code since
    v4.38): ``q * cos + rotate_half(q) * sin``, ``rotate_half(x) = cat((-x[..., D/2:], x[..., :D/2]), -1)``,
    cos and sin in the activations' dtype (here B L 1 D against q's B L H D; Transformers' B 1 L D
    against B H L D moves the same bytes)."""
    import torch

    cos, sin = cos_sin

    def rotate(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    return rotate(q), rotate(k)


def pairs_fp32_rope_qk(q, k, cache):
    """torchtune ``RotaryPositionalEmbeddings.forward`` (``modules/position_embeddings.py``): x as fp32
    pairs, ``stack([x0 c - x1 s, x1 c + x0 s], -1)`` against the fp32 cos/sin cache, ``.flatten(3).type_as(x)``."""
    import torch

    def rotate(x):
        xs = x.float().reshape(*x.shape[:-1], -1, 2)
        rc = cache.view(-1, xs.size(1), 1, xs.size(3), 2)
        out = torch.stack([xs[..., 0] * rc[..., 0] - xs[..., 1] * rc[..., 1],
                           xs[..., 1] * rc[..., 0] + xs[..., 0] * rc[..., 1]], -1)
        return out.flatten(3).type_as(x)

    return rotate(q), rotate(k)


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


ROPE_QK = {"complex": complex_rope_qk, "rotate_half": rotate_half_rope_qk, "pairs_fp32": pairs_fp32_rope_qk,
           "matrix": matrix_rope_qk}


def rope_table(rope_form: str, tokens: int, d: int):
    """The RoPE table each form reads, as its stack builds it: torchtitan's complex fp32 ``freqs_cis``;
    Transformers' cos and sin of ``cat((freqs, freqs), -1)`` cast to bf16; torchtune's fp32 (cos, sin)
    cache; fms's ``compute_freqs_cis`` stack of cos, -sin, sin, cos viewed as L × D/2 × 2 × 2."""
    import torch

    angles = torch.rand(tokens, d // 2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    if rope_form == "matrix":
        return torch.stack([cos, -sin, sin, cos], dim=2).view(tokens, d // 2, 2, 2)
    if rope_form == "rotate_half":
        emb = torch.cat((angles, angles), dim=-1).view(1, tokens, 1, d)
        return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    if rope_form == "pairs_fp32":
        return torch.stack([cos, sin], dim=-1)
    return torch.polar(torch.ones(tokens, d // 2), angles).view(1, tokens, 1, d // 2)


def block_inputs(h: int, heads: int, kv_heads: int, ffn: int, tokens: int, rope_form: str = "complex"):
    """(block, x, table): one seeded bf16 torchtitan-style block with the RoPE of ``rope_form``, its
    input and its RoPE table (``rope_table``), the same for the eager count (``measure``) and the
    compiled one (``compiled_bytes``)."""
    import torch

    torch.manual_seed(0)
    block = torchtitan_block(h, heads, kv_heads, ffn, rope_form).to(torch.bfloat16)
    table = rope_table(rope_form, tokens, h // heads)
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    return block, x, table


def measure(h: int, heads: int, kv_heads: int, ffn: int, tokens: int = 64,
            rope_form: str = "complex") -> tuple[float, float]:
    """(forward, backward) element-wise bytes per token of one bf16 block."""
    import torch

    block, x, freqs = block_inputs(h, heads, kv_heads, ffn, tokens, rope_form)
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
