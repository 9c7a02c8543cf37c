"""Read a Hugging Face ``config.json`` into a ModelSpec.

Each family's mapping mirrors the defaults of its ``transformers`` configuration class (5.x):
a key the file omits takes the class default, so a minimal config counts like the real model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from shardplan.errors import ShardplanError
from shardplan.model import MLASpec, ModelSpec, MoESpec
from shardplan.profiles import read_json

_ACTIVATIONS = {
    "silu": "swiglu", "swish": "swiglu",
    "gelu_pytorch_tanh": "geglu", "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
    "relu": "relu",
}


class _Reader:
    """Typed access to config keys with one-line errors naming the missing or bad key."""

    def __init__(self, config: dict[str, Any], origin: str):
        self.config = config
        self.origin = origin

    def int(self, key: str, default: Any = ...) -> int:
        value = self.config.get(key, default)
        if value is ...:
            raise ShardplanError(f"{self.origin}: {key}", None, "missing from config.json")
        if value is None and default is None:
            return None  # type: ignore[return-value]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ShardplanError(f"{self.origin}: {key}", value, "must be a positive integer")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    def activation(self, *keys: str, default: str) -> str:
        for key in keys:
            if self.config.get(key):
                name = self.config[key]
                if name not in _ACTIVATIONS:
                    raise ShardplanError(f"{self.origin}: {key}", name, f"unsupported activation; known: {sorted(_ACTIVATIONS)}")
                return _ACTIVATIONS[name]
        return _ACTIVATIONS[default]


def _llama_like(r: _Reader, family: str, block_class: str, *, qkv_bias: bool | None = None,
                tie_default: bool = False, window_key: str | None = "sliding_window") -> dict[str, Any]:
    heads = r.int("num_attention_heads")
    bias = bool(r.get("attention_bias", False))
    spec = dict(
        family=family, block_class=block_class,
        vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"), num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", heads) or heads,
        head_dim=r.int("head_dim", None),
        intermediate_size=r.int("intermediate_size"),
        max_position_embeddings=r.int("max_position_embeddings", 4096),
        mlp=r.activation("hidden_act", default="silu"), norm="rmsnorm",
        qkv_bias=bias if qkv_bias is None else qkv_bias, out_proj_bias=bias,
        mlp_bias=bool(r.get("mlp_bias", False)),
        tie_word_embeddings=bool(r.get("tie_word_embeddings", tie_default)),
    )
    if window_key and r.get(window_key):
        spec["sliding_window"] = r.int(window_key)
    return spec


def _llama(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, "llama", "LlamaDecoderLayer", window_key=None)


def _mistral(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, "mistral", "MistralDecoderLayer")


def _mixtral(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, "mixtral", "MixtralDecoderLayer")
    spec["moe"] = MoESpec(num_experts=r.int("num_local_experts", 8), experts_per_token=r.int("num_experts_per_tok", 2),
                          intermediate_size=spec["intermediate_size"])
    return spec


def _qwen2(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, "qwen2", "Qwen2DecoderLayer", qkv_bias=True, window_key=None)
    spec["out_proj_bias"] = False
    if r.get("use_sliding_window", False) and r.get("sliding_window"):
        spec["sliding_window"] = r.int("sliding_window")
    return spec


def _gemma2(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, "gemma2", "Gemma2DecoderLayer", tie_default=True)
    spec["head_dim"] = r.int("head_dim", 256)
    spec["mlp"] = r.activation("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    spec["norms_per_block"] = 4  # input, post-attention, pre- and post-feedforward RMSNorms
    return spec


def _gpt2(r: _Reader) -> dict[str, Any]:
    hidden = r.int("n_embd", 768)
    return dict(
        family="gpt2", block_class="GPT2Block",
        vocab_size=r.int("vocab_size", 50257), hidden_size=hidden,
        num_layers=r.int("n_layer", 12), num_heads=r.int("n_head", 12), num_kv_heads=r.int("n_head", 12),
        intermediate_size=r.int("n_inner", None) or 4 * hidden,
        max_position_embeddings=r.int("n_positions", 1024),
        mlp=r.activation("activation_function", default="gelu_new"), norm="layernorm",
        qkv_bias=True, out_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(r.get("tie_word_embeddings", True)),
        learned_position_embeddings=True,
    )


def _opt(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size", 768)
    if r.get("word_embed_proj_dim", hidden) != hidden:
        raise ShardplanError(f"{r.origin}: word_embed_proj_dim", r.get("word_embed_proj_dim"),
                             "OPT with projected embeddings (350m) is not supported")
    if not r.get("do_layer_norm_before", True):
        raise ShardplanError(f"{r.origin}: do_layer_norm_before", False, "post-LN OPT (350m) is not supported")
    bias = bool(r.get("enable_bias", True))
    heads = r.int("num_attention_heads", 12)
    return dict(
        family="opt", block_class="OPTDecoderLayer",
        vocab_size=r.int("vocab_size", 50272), hidden_size=hidden,
        num_layers=r.int("num_hidden_layers", 12), num_heads=heads, num_kv_heads=heads,
        intermediate_size=r.int("ffn_dim", 3072), max_position_embeddings=r.int("max_position_embeddings", 2048),
        mlp=r.activation("activation_function", default="relu"), norm="layernorm",
        qkv_bias=bias, out_proj_bias=bias, mlp_bias=bias,
        tie_word_embeddings=bool(r.get("tie_word_embeddings", True)),
        learned_position_embeddings=True, position_embedding_offset=2,
    )


def _falcon(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size", 4544)
    heads = r.int("num_attention_heads", 71)
    new_arch = bool(r.get("new_decoder_architecture", False))
    if new_arch:
        kv_heads = r.int("num_kv_heads", heads)
    else:
        kv_heads = 1 if r.get("multi_query", True) else heads
    bias = bool(r.get("bias", False))
    parallel = bool(r.get("parallel_attn", True))
    return dict(
        family="falcon", block_class="FalconDecoderLayer",
        vocab_size=r.int("vocab_size", 65024), hidden_size=hidden,
        num_layers=r.int("num_hidden_layers", 32), num_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=r.int("ffn_hidden_size", None) or 4 * hidden,
        max_position_embeddings=r.int("max_position_embeddings", 2048),
        mlp=r.activation("activation", default="gelu"), norm="layernorm",
        norms_per_block=2 if (new_arch or not parallel) else 1,
        qkv_bias=bias, out_proj_bias=bias, mlp_bias=bias,
        tie_word_embeddings=bool(r.get("tie_word_embeddings", True)),
    )


def _deepseek_v2(r: _Reader) -> dict[str, Any]:
    if r.get("moe_layer_freq", 1) != 1:
        raise ShardplanError(f"{r.origin}: moe_layer_freq", r.get("moe_layer_freq"), "only 1 is supported")
    heads = r.int("num_attention_heads")
    spec = dict(
        family="deepseek_v2", block_class="DeepseekV2DecoderLayer",
        vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=r.int("num_key_value_heads", heads),
        intermediate_size=r.int("intermediate_size"),
        max_position_embeddings=r.int("max_position_embeddings", 2048),
        mlp=r.activation("hidden_act", default="silu"), norm="rmsnorm",
        tie_word_embeddings=bool(r.get("tie_word_embeddings", False)),
        mla=MLASpec(kv_lora_rank=r.int("kv_lora_rank"), q_lora_rank=r.int("q_lora_rank", None),
                    qk_rope_head_dim=r.int("qk_rope_head_dim"), qk_nope_head_dim=r.int("qk_nope_head_dim"),
                    v_head_dim=r.int("v_head_dim")),
    )
    if r.get("n_routed_experts"):
        spec["moe"] = MoESpec(num_experts=r.int("n_routed_experts"), experts_per_token=r.int("num_experts_per_tok"),
                              intermediate_size=r.int("moe_intermediate_size"),
                              shared_experts=r.get("n_shared_experts", 0) or 0,
                              first_dense_layers=r.get("first_k_dense_replace", 0) or 0)
    return spec


FAMILIES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "gemma2": _gemma2,
    "gpt2": _gpt2, "opt": _opt, "falcon": _falcon, "deepseek_v2": _deepseek_v2,
}


def spec_from_hf_config(config: dict[str, Any], name: str, origin: str = "config.json", **extra: Any) -> ModelSpec:
    """Map one HF config dict to a ModelSpec; ``extra`` adds name-level fields (aliases, source)."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ShardplanError(f"{origin}: model_type", model_type, f"unsupported; supported: {', '.join(sorted(FAMILIES))}")
    fields = FAMILIES[model_type](_Reader(config, origin))
    try:
        return ModelSpec(name=name, display_name=extra.pop("display_name", name), **fields, **extra)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        raise ShardplanError(f"{origin}: {field}", first.get("input") if not isinstance(first.get("input"), dict) else "{...}",
                             first["msg"].removeprefix("Value error, ")) from None


def spec_from_hf_config_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    config = read_json(path, field="model")
    name = config.get("_name_or_path") or path.parent.name or path.stem
    return spec_from_hf_config(config, name=str(name), origin=path.name, source=f"config.json at {path}")
