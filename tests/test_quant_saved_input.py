"""bitsandbytes <= 0.43.1 keeps every 4-bit Linear's input (``quant_saves_input``), measured on CPU.

The block is a LitGPT / Llama decoder block with LoRA on q and v (dropout 0.05): RMSNorm, a fused
qkv Linear, SDPA, an output projection and a gated MLP, every frozen Linear a 4-bit one run through
an autograd function written as bitsandbytes' ``MatMul4Bit`` is: 0.42.0 stores ``ctx.tensors = (A, B)``
when A or B needs a gradient, 0.43.2 (PR #1270) ``(None, B)``. The packed weight is a uint8 buffer
that the function dequantizes to fp16 and casts to the input's dtype, as LitGPT's Fabric plugin
makes bitsandbytes do. What one block keeps after the forward is the live storage difference
between models of three and two blocks (the first block differs: its input needs no gradient);
the two versions' difference must be ``quant_saved_input_bytes_per_token`` per token, for hidden
sizes, MLP widths, micro-batches and sequence lengths varied.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from shardplan.formulas.activations import layer_bytes_per_token, quant_saved_input_bytes_per_token
from shardplan.inputs import strategy as st
from shardplan.validation import runs
from tests.helpers import columns

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional
TorchDispatchMode = pytest.importorskip("torch.utils._python_dispatch").TorchDispatchMode
tree_flatten = pytest.importorskip("torch.utils._pytree").tree_flatten


class _Live(TorchDispatchMode):
    """The storages every dispatched op returns, by identity; a recycled address is a new storage."""

    def __init__(self):
        super().__init__()
        self.seen: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                known = self.seen.get(storage._cdata)
                if known is None or known() is None:
                    self.seen[storage._cdata] = weakref.ref(storage)
        return out

    def bytes(self) -> int:
        gc.collect()
        return sum(s.nbytes() for s in (r() for r in self.seen.values()) if s is not None)


class _MatMul4Bit(torch.autograd.Function):
    """bitsandbytes ``MatMul4Bit``: dequantize, matmul; ``keeps_input`` as 0.42.0 (True) or 0.43.2."""

    @staticmethod
    def forward(ctx, a, packed, shape, keeps_input):
        weight = packed.to(torch.float16).repeat_interleave(2).view(shape).to(a.dtype)  # fp16, then the cast
        ctx.tensors = (a if keeps_input else None, packed)
        ctx.shape = shape
        return F.linear(a, weight)

    @staticmethod
    def backward(ctx, grad):
        _, packed = ctx.tensors
        weight = packed.to(torch.float16).repeat_interleave(2).view(ctx.shape).to(grad.dtype)
        return grad @ weight, None, None, None


class _Linear4bit(nn.Module):
    def __init__(self, i, o, keeps_input):
        super().__init__()
        self.register_buffer("packed", torch.randint(0, 255, (i * o // 2,), dtype=torch.uint8))
        self.shape, self.keeps_input = (o, i), keeps_input

    def forward(self, x):
        return _MatMul4Bit.apply(x, self.packed, self.shape, self.keeps_input)


class _RMSNorm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        up = x.float()
        return (up * torch.rsqrt((up * up).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight


class _Block(nn.Module):
    """LitGPT's Block (Llama config) with LoRAQKVLinear on q and v and 4-bit frozen Linears."""

    def __init__(self, h, f, heads, keeps_input, r=8):
        super().__init__()
        self.h, self.heads = h, heads
        self.norm_1, self.norm_2 = _RMSNorm(h), _RMSNorm(h)
        self.qkv, self.proj = _Linear4bit(h, 3 * h, keeps_input), _Linear4bit(h, h, keeps_input)
        self.fc_1, self.fc_2, self.mlp_proj = (_Linear4bit(h, f, keeps_input), _Linear4bit(h, f, keeps_input),
                                               _Linear4bit(f, h, keeps_input))
        self.lora_a = nn.Parameter(torch.randn(2 * r, h, dtype=torch.bfloat16) * 0.01)
        self.lora_b = nn.Parameter(torch.randn(2 * h, r, dtype=torch.bfloat16) * 0.01)
        self.dropout = nn.Dropout(0.05)
        self.register_buffer("qv", torch.cat([torch.arange(h), torch.arange(2 * h, 3 * h)]))

    def _qkv(self, x):
        after_a = F.linear(self.dropout(x), self.lora_a)
        after_b = F.conv1d(after_a.transpose(-2, -1), self.lora_b.unsqueeze(-1), groups=2).transpose(-2, -1)
        padded = after_b.new_zeros(*after_b.shape[:-1], 3 * self.h).index_copy_(-1, self.qv, after_b)
        return self.qkv(x) + padded * 0.5

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self._qkv(self.norm_1(x)).split(self.h, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, self.h)
        x = x + self.proj(y)
        n = self.norm_2(x)
        return x + self.mlp_proj(F.silu(self.fc_1(n)) * self.fc_2(n))


def _kept_bytes(blocks, h, f, b, s, keeps_input):
    torch.manual_seed(0)
    model = nn.Sequential(*(_Block(h, f, 4, keeps_input) for _ in range(blocks)))
    x = torch.randn(b, s, h, dtype=torch.bfloat16)
    mode = _Live()
    with mode:
        out = model(x)
        kept = mode.bytes()
    del out
    return kept


@pytest.mark.parametrize("h,f,b,s", [(64, 176, 2, 128), (128, 176, 1, 256), (64, 352, 2, 128), (128, 352, 4, 64)])
def test_a_block_keeps_its_linears_inputs_under_bitsandbytes_0_42(h, f, b, s):
    per_block = {keeps: _kept_bytes(3, h, f, b, s, keeps) - _kept_bytes(2, h, f, b, s, keeps) for keeps in (True, False)}
    cols = columns("llama-2-7b", hidden_size=h, mlp_width=f, method=st.QLORA, quant_saves_input=True)
    counted = int(quant_saved_input_bytes_per_token(cols, 2))
    assert counted == 2 * (2 * h + f)
    assert per_block[True] - per_block[False] == counted * b * s


def test_only_a_bitsandbytes_4bit_base_with_the_old_version_keeps_inputs():
    on = columns("llama-2-7b", method=st.QLORA, quant_saves_input=True)
    assert int(quant_saved_input_bytes_per_token(on, 2)) == 2 * (2 * 4096 + 11008)
    assert int(layer_bytes_per_token(on, 2)) - int(layer_bytes_per_token(columns("llama-2-7b", method=st.QLORA), 2)) \
        == 2 * (2 * 4096 + 11008)
    for off in (dict(method=st.QLORA), dict(method=st.LORA, quant_saves_input=True),
                dict(method=st.QLORA, quant_saves_input=True, quant_format=st.GPTQ)):
        assert int(quant_saved_input_bytes_per_token(columns("llama-2-7b", **off), 2)) == 0


@pytest.mark.parametrize("stack,locator,url,expected", [
    ("lightning", "", "git 26857050 (table last edited 00af8b0d, 2024-09-27)", True),   # LitGPT pinned 0.42.0
    ("lightning", "", "git d2ed13c3 (2025-01-10)", False),
    ("hf", "", "wiki revision of 2024-04-15", True),                                   # before 0.43.2
    ("hf", "table of 2024-08-01", "", False),
    ("hf", "", "git 876e2ed6", False),                                                  # no date: unknown
    ("torchtune", "", "git abc (2024-04-15)", False),                                   # torchao's NF4
])
def test_runs_read_the_bitsandbytes_version_from_the_revision_date(stack, locator, url, expected):
    row = {"source_locator": locator, "source_commit_or_url": url}
    assert runs._bnb_keeps_input(stack, runs._dating(row, stack)).get("quant_saves_input", False) is expected
