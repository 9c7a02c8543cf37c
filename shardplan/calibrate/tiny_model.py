"""Small decoder transformers built from a ModelSpec, op for op like Hugging Face eager code.

Two block styles:

* ``llama`` (RMSNorm models: Llama, Mistral, Qwen2, ...) mirrors ``transformers``'
  ``modeling_llama`` eager path so that autograd saves the same tensors HF does:
  ``LlamaRMSNorm`` (x.to(float32); pow(2).mean(-1, keepdim); x * rsqrt(var + eps);
  weight * x.to(input_dtype)), separate q/k/v/o ``nn.Linear``, HF RoPE
  (q * cos + rotate_half(q) * sin, cos/sin computed once in the root in float32 and cast
  to the hidden dtype), ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``
  (HF's ``sdpa_attention_forward`` with ``use_gqa_in_sdpa``: no repeat_kv), then
  ``.transpose(1, 2).contiguous().reshape(...)`` before ``o_proj``; SwiGLU/GeGLU MLP
  ``down(act(gate(x)) * up(x))``; residual adds.
* ``gpt`` (LayerNorm models: GPT-2, OPT) mirrors ``modeling_gpt2``'s eager path: ``nn.LayerNorm``,
  fused ``c_attn`` (h -> q + 2·kv) with bias, explicit attention softmax(QK^T/sqrt(d)) with a causal
  ``torch.where`` mask and optional dropout, GELU(tanh) or ReLU MLP with biases, learned
  position embeddings, tied lm_head when the spec ties.

The root holds embeddings, final norm and lm_head; each block is its own ``nn.Module`` (the FSDP
unit). The loss follows HF ``ForCausalLMLoss``: logits stay in the parameter dtype, are upcast
with ``.float()``, labels are shifted by padding with -100, and ``F.cross_entropy`` is applied.

ASSUMPTION: GPT-2's ``NewGELUActivation`` (a chain of elementwise ops, each saving its input) is
replaced by ``nn.GELU(approximate="tanh")`` (one op, same values, saves only its input).
Importing this module imports torch; ``import shardplan`` does not.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.calibrate.config import TINY_DEFAULTS, tiny_spec  # noqa: F401  (re-exported)
from shardplan.inputs.model import ModelSpec
from shardplan.support.errors import ShardplanError


def block_style(spec: ModelSpec) -> str:
    if spec.moe is not None or spec.mla is not None:
        raise ShardplanError("model", spec.name, "the calibration harness builds dense blocks only (no MoE/MLA)")
    if spec.qk_norm != "none":
        raise ShardplanError("model", spec.name, "the calibration harness builds blocks without q/k norms")
    return "llama" if spec.norm == "rmsnorm" else "gpt"


# --- Llama style -------------------------------------------------------------------------------
class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, hd = spec.hidden_size, spec.resolved_head_dim
        self.head_dim = hd
        self.q_proj = nn.Linear(h, spec.num_heads * hd, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=spec.out_proj_bias)

    def forward(self, hidden_states, cos, sin):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos_u, sin_u = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos_u) + (rotate_half(q) * sin_u)
        k = (k * cos_u) + (rotate_half(k) * sin_u)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).contiguous()
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


class GatedMLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, i = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=spec.mlp_bias)
        self.up_proj = nn.Linear(h, i, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=spec.mlp_bias)
        self.act_fn = nn.SiLU() if spec.mlp == "swiglu" else nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class PlainMLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, i = spec.hidden_size, spec.intermediate_size
        self.up_proj = nn.Linear(h, i, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=spec.mlp_bias)
        self.act_fn = nn.ReLU() if spec.mlp == "relu" else nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)))


class _Block(nn.Module):
    """A decoder block (FSDP unit) whose forward may run under activation checkpointing.

    ``checkpoint_mode``: ``"none"``; ``"full"`` = ``torch.utils.checkpoint`` (non-reentrant) of the
    whole block; ``"selective"`` = the same with ``create_selective_checkpoint_contexts`` and a
    policy that saves matmul and SDPA outputs (``selective_policy``). Set by the runner; the class
    stays the same so FSDP1's ``ModuleWrapPolicy`` and the memory trackers see one block type.
    """

    checkpoint_mode: str = "none"

    def forward(self, hidden_states, cos=None, sin=None):
        if self.checkpoint_mode == "none":
            return self._forward(hidden_states, cos, sin)
        from torch.utils.checkpoint import checkpoint

        kwargs = {}
        if self.checkpoint_mode == "selective":
            kwargs["context_fn"] = selective_context_fn
        return checkpoint(self._forward, hidden_states, cos, sin, use_reentrant=False, **kwargs)


def _sac_save_ops():
    aten = torch.ops.aten
    names = ["mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"]
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


def selective_policy(ctx, op, *args, **kwargs):
    """Selective AC policy: keep matmul and attention outputs, recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAC_SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    from functools import partial

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(partial(selective_policy))


_SAC_SAVE = _sac_save_ops()


class LlamaBlock(_Block):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(spec.hidden_size)
        self.self_attn = LlamaAttention(spec)
        self.post_attention_layernorm = LlamaRMSNorm(spec.hidden_size)
        self.mlp = GatedMLP(spec) if spec.gated_mlp else PlainMLP(spec)

    def _forward(self, hidden_states, cos, sin):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, cos, sin)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


# --- GPT style ---------------------------------------------------------------------------------
class GPTAttention(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float):
        super().__init__()
        h, hd = spec.hidden_size, spec.resolved_head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, hd
        self.split = (spec.num_heads * hd, spec.num_kv_heads * hd, spec.num_kv_heads * hd)
        self.c_attn = nn.Linear(h, sum(self.split), bias=spec.qkv_bias)
        self.c_proj = nn.Linear(spec.num_heads * hd, h, bias=spec.out_proj_bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mp = spec.max_position_embeddings
        self.register_buffer("bias", torch.tril(torch.ones((mp, mp), dtype=torch.bool)).view(1, 1, mp, mp),
                             persistent=False)

    def forward(self, hidden_states):
        b, s, _ = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(self.split, dim=2)
        q = q.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        attn_weights = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        causal_mask = self.bias[:, :, :s, :s]
        mask_value = torch.full([], torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype,
                                device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        out = torch.matmul(attn_weights, v)
        out = out.transpose(1, 2).contiguous().reshape(b, s, -1)
        return self.resid_dropout(self.c_proj(out))


class GPTBlock(_Block):
    def __init__(self, spec: ModelSpec, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.hidden_size, eps=1e-5)
        self.attn = GPTAttention(spec, dropout)
        self.ln_2 = nn.LayerNorm(spec.hidden_size, eps=1e-5)
        self.mlp = GatedMLP(spec) if spec.gated_mlp else PlainMLP(spec)
        self.dropout = nn.Dropout(dropout)

    def _forward(self, hidden_states, cos=None, sin=None):
        residual = hidden_states
        hidden_states = self.attn(self.ln_1(hidden_states))
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.dropout(self.mlp(self.ln_2(hidden_states)))
        return residual + hidden_states


# --- the decoder -------------------------------------------------------------------------------
class TinyDecoder(nn.Module):
    """Root module: embeddings (+ learned positions), blocks, final norm, lm_head, HF-style loss."""

    def __init__(self, spec: ModelSpec, dropout: float = 0.0):
        super().__init__()
        self.spec = spec
        self.style = block_style(spec)
        h = spec.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, h)
        self.embed_positions = None
        if spec.learned_position_embeddings:
            self.embed_positions = nn.Embedding(spec.max_position_embeddings + spec.position_embedding_offset, h)
        self.rotary_emb = RotaryEmbedding(spec.resolved_head_dim) if self.style == "llama" else None
        if self.style == "llama":
            self.layers = nn.ModuleList(LlamaBlock(spec) for _ in range(spec.num_layers))
            self.norm = LlamaRMSNorm(h)
        else:
            self.layers = nn.ModuleList(GPTBlock(spec, dropout) for _ in range(spec.num_layers))
            self.norm = nn.LayerNorm(h, eps=1e-5)
        self.drop = nn.Dropout(dropout)
        self.lm_head = nn.Linear(h, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        with torch.no_grad():  # GPT-2/Llama initializer range, so that tied logits stay sane
            self.embed_tokens.weight.normal_(0.0, 0.02)
            if self.embed_positions is not None:
                self.embed_positions.weight.normal_(0.0, 0.02)

    def set_checkpointing(self, mode: str) -> None:
        if mode not in ("none", "full", "selective"):
            raise ShardplanError("ac", mode, "expected none, full or selective")
        for layer in self.layers:
            layer.checkpoint_mode = mode

    @property
    def block_class(self) -> type[nn.Module]:
        return LlamaBlock if self.style == "llama" else GPTBlock

    def forward(self, input_ids, labels=None):
        b, s = input_ids.shape
        hidden = self.embed_tokens(input_ids)
        position_ids = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, -1)
        cos = sin = None
        if self.embed_positions is not None:
            hidden = hidden + self.embed_positions(position_ids + self.spec.position_embedding_offset)
        hidden = self.drop(hidden)
        if self.rotary_emb is not None:
            cos, sin = self.rotary_emb(hidden, position_ids)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        hidden = self.norm(hidden)
        logits = self.lm_head(hidden)
        if labels is None:
            return logits
        return causal_lm_loss(logits, labels, self.spec.vocab_size)


def causal_lm_loss(logits, labels, vocab_size: int):
    """HF ``ForCausalLMLoss``: upcast logits, shift labels by padding, mean cross-entropy."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=-100)
    shift_labels = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, vocab_size), shift_labels.view(-1), ignore_index=-100,
                           reduction="mean")


def build_tiny_model(spec: ModelSpec, dropout: float = 0.0, device=None) -> TinyDecoder:
    if device is None:
        return TinyDecoder(spec, dropout)
    with torch.device(device):
        return TinyDecoder(spec, dropout)
