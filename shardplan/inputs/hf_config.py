"""Read a Hugging Face ``config.json`` into a ModelSpec.

A key the file omits takes its configuration class's default. When ``transformers`` is installed
the defaults come from it (``AutoConfig.for_model(model_type, **config).to_dict()``, no network);
otherwise from each family's mapping below, which mirrors the transformers 5.23 classes. Either
way the spec lists every key the file left out and the value it took (``ModelSpec.assumed``), so a
report can say what was not read from the user's file. Multimodal configs (Gemma 3, Llama 4) are
read through their ``text_config``: the decoder a causal-LM fine-tune trains.

A ``model_type`` no family reader knows goes to the reader of module trees the layer above
installs (``support.extras.installed_reader("module_tree")``; ``calibrate/module_tree.py`` builds
the model on the meta device with torch and transformers, the ``hf`` extra). Without that reader, or without those
libraries, it is a one-line error naming the extra: a guessed layout would answer for another
architecture (GPT-NeoX read as Llama: +30.6 % parameters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from shardplan.inputs.model import MLASpec, ModelSpec, MoESpec
from shardplan.inputs.profiles import read_json
from shardplan.support.errors import ShardplanError
from shardplan.support.extras import installed_reader
from shardplan.support.limits import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, _shown

_ACTIVATIONS = {
    "silu": "swiglu", "swish": "swiglu",
    "gelu_pytorch_tanh": "geglu", "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu",
    "relu": "relu",
}


# The range of each integer key a family reader takes (limits.py says why each bound); other
# integer keys (widths, ranks, head dims) are bounded by MAX_HIDDEN. Checked on the file's own values
# before transformers completes the config, so 10**12 layers never reaches a per-layer list.
INT_RANGES: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "decoder_sparse_step", "interleave_moe_layer_step",
                     "first_k_dense_replace"), MAX_LAYERS),
    **dict.fromkeys(("vocab_size",), MAX_VOCAB),
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "num_kv_heads", "n_head"), MAX_HEADS),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                     "n_shared_experts"), MAX_EXPERTS),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "sliding_window"), MAX_POSITIONS),
}
WIDTH_KEYS = ("hidden_size", "n_embd", "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size",
              "moe_intermediate_size", "intermediate_size_mlp", "head_dim", "word_embed_proj_dim",
              "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def check_int_ranges(config: dict[str, Any], origin: str) -> None:
    """Every integer-valued key a reader takes, when the file gives it, within its range (whole
    numbers only: a string, float or boolean where a count goes is refused here, by name)."""
    for key in (*INT_RANGES, *WIDTH_KEYS):
        value = config.get(key)
        if value is None:
            continue
        hi = INT_RANGES.get(key, MAX_HIDDEN)
        lo = 0 if key in ("n_shared_experts", "first_k_dense_replace") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ShardplanError(f"{origin}: {key}", _shown(value), f"must be a whole number in [{lo}, {hi:,}]")


class _Reader:
    """Typed access to config keys with one-line errors naming the missing or bad key; records
    each key read that the user's file did not give (``provided``) and the value it took."""

    def __init__(self, config: dict[str, Any], origin: str, provided: set[str] | None = None,
                 class_keys: set[str] | None = None):
        self.config = config
        self.origin = origin
        self.provided = set(config) if provided is None else provided
        # With transformers' completed config, a key its class does not have is no assumption
        # (Qwen3 has no mlp_bias: it never has MLP biases); without it, every default is one.
        self.class_keys = class_keys
        self.defaulted: dict[str, Any] = {}

    def class_defaults(self, **values: Any) -> None:
        """Defaults of this family's configuration class that differ from the generic reader's
        (used when transformers is absent; its completed config already has every key)."""
        self.config = {**{k: v for k, v in values.items() if k not in self.config}, **self.config}

    def _note(self, key: str, value: Any) -> None:
        if key in self.provided or value is ... or value is None:
            return
        if self.class_keys is None or key in self.class_keys:
            self.defaulted[key] = value

    def int(self, key: str, default: Any = ...) -> int:
        value = self.config.get(key)
        value = default if value is None else value
        self._note(key, value)
        if value is ...:
            raise ShardplanError(f"{self.origin}: {key}", None, "missing from config.json")
        if value is None:
            return None  # type: ignore[return-value]
        hi = INT_RANGES.get(key, MAX_HIDDEN)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= hi:
            raise ShardplanError(f"{self.origin}: {key}", _shown(value), f"must be a whole number in [1, {hi:,}]")
        return value

    def count(self, key: str, default: int, hi: int) -> int:
        """A count that may be 0 (shared experts, leading dense blocks); null takes ``default``."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
            raise ShardplanError(f"{self.origin}: {key}", _shown(value), f"must be a whole number in [0, {hi:,}]")
        return value

    def bool(self, key: str, default: bool) -> bool:
        """A JSON boolean, strictly: ``"false"`` (a string) is refused rather than read as true, the
        way Python's truthiness -- and transformers, which keeps the string -- would read it."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ShardplanError(f"{self.origin}: {key}", _shown(value),
                                 "must be a JSON boolean, true or false without quotes (a non-empty string "
                                 "would read as true)")
        return value

    def layer_list(self, key: str, num_layers: int) -> tuple[int, ...]:
        """A list of block indices in [0, num_layers) (Qwen3-MoE ``mlp_only_layers``, Llama 4 ``moe_layers``)."""
        value = self.get(key, [])
        if not isinstance(value, list) or len(value) > num_layers or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in value):
            raise ShardplanError(f"{self.origin}: {key}", _shown(value),
                                 f"must be a list of block indices in [0, {num_layers - 1}]")
        return tuple(value)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        value = default if value is None else value
        self._note(key, value)
        return value

    def activation(self, *keys: str, default: str) -> str:
        for key in keys:
            if self.config.get(key):
                name = self.config[key]
                if not isinstance(name, str) or name not in _ACTIVATIONS:
                    raise ShardplanError(f"{self.origin}: {key}", name, f"unsupported activation; known: {sorted(_ACTIVATIONS)}")
                self._note(key, name)
                return _ACTIVATIONS[name]
        self._note(keys[0], default)
        return _ACTIVATIONS[default]


def _llama_like(r: _Reader, family: str, block_class: str, *, qkv_bias: bool | None = None,
                tie_default: bool = False, window_key: str | None = "sliding_window",
                activation_keys: tuple[str, ...] = ("hidden_act",), activation: str = "silu") -> dict[str, Any]:
    heads = r.int("num_attention_heads")
    bias = r.bool("attention_bias", False)
    spec = dict(
        family=family, block_class=block_class,
        vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"), num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", heads) or heads,
        head_dim=r.int("head_dim", None),
        intermediate_size=r.int("intermediate_size"),
        max_position_embeddings=r.int("max_position_embeddings", 4096),
        mlp=r.activation(*activation_keys, default=activation), norm="rmsnorm",
        qkv_bias=bias if qkv_bias is None else qkv_bias, out_proj_bias=bias,
        mlp_bias=r.bool("mlp_bias", False),
        tie_word_embeddings=r.bool("tie_word_embeddings", tie_default),
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
                          intermediate_size=spec["intermediate_size"], lora_adapts_experts=True)
    return spec


def _qwen2(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, "qwen2", "Qwen2DecoderLayer", qkv_bias=True, window_key=None)
    spec["out_proj_bias"] = False
    if r.bool("use_sliding_window", False) and r.get("sliding_window"):
        spec["sliding_window"] = r.int("sliding_window")
    return spec


def _gemma2(r: _Reader) -> dict[str, Any]:
    spec = _llama_like(r, "gemma2", "Gemma2DecoderLayer", tie_default=True,
                       activation_keys=("hidden_activation", "hidden_act"), activation="gelu_pytorch_tanh")
    spec["head_dim"] = r.int("head_dim", 256)
    spec["norm_multiply_fp32"] = True  # Gemma2RMSNorm: x.float() normalized, times (1 + weight.float())
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
        qkv_bias=True, out_proj_bias=True, mlp_bias=True, fused_qkv=True,
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        learned_position_embeddings=True,
    )


def _opt(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size", 768)
    if r.get("word_embed_proj_dim", hidden) != hidden:
        raise ShardplanError(f"{r.origin}: word_embed_proj_dim", r.get("word_embed_proj_dim"),
                             "OPT with projected embeddings (350m) is not supported")
    if not r.bool("do_layer_norm_before", True):
        raise ShardplanError(f"{r.origin}: do_layer_norm_before", False, "post-LN OPT (350m) is not supported")
    bias = r.bool("enable_bias", True)
    heads = r.int("num_attention_heads", 12)
    return dict(
        family="opt", block_class="OPTDecoderLayer",
        vocab_size=r.int("vocab_size", 50272), hidden_size=hidden,
        num_layers=r.int("num_hidden_layers", 12), num_heads=heads, num_kv_heads=heads,
        intermediate_size=r.int("ffn_dim", 3072), max_position_embeddings=r.int("max_position_embeddings", 2048),
        mlp=r.activation("activation_function", default="relu"), norm="layernorm",
        qkv_bias=bias, out_proj_bias=bias, mlp_bias=bias,
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        learned_position_embeddings=True, position_embedding_offset=2,
    )


def _falcon(r: _Reader) -> dict[str, Any]:
    hidden = r.int("hidden_size", 4544)
    heads = r.int("num_attention_heads", 71)
    new_arch = r.bool("new_decoder_architecture", False)
    if new_arch:
        kv_heads = r.int("num_kv_heads", heads)
    else:
        kv_heads = 1 if r.bool("multi_query", True) else heads
    bias = r.bool("bias", False)
    parallel = r.bool("parallel_attn", True)
    return dict(
        family="falcon", block_class="FalconDecoderLayer",
        vocab_size=r.int("vocab_size", 65024), hidden_size=hidden,
        num_layers=r.int("num_hidden_layers", 32), num_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=r.int("ffn_hidden_size", None) or 4 * hidden,
        max_position_embeddings=r.int("max_position_embeddings", 2048),
        mlp=r.activation("activation", default="gelu"), norm="layernorm",
        norms_per_block=2 if (new_arch or not parallel) else 1,
        qkv_bias=bias, out_proj_bias=bias, mlp_bias=bias, fused_qkv=True,
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
    )


def _deepseek(r: _Reader, family: str, block_class: str, q_lora_default: int | None,
              max_positions: int) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA attention (``q_a_proj``/``q_a_layernorm``/``q_b_proj`` when
    ``q_lora_rank`` is set, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``)
    and, from ``first_k_dense_replace`` on, routed experts + shared experts + a bias-free router
    (V3's ``e_score_correction_bias`` is a buffer, not a parameter)."""
    if r.get("moe_layer_freq", 1) != 1:
        raise ShardplanError(f"{r.origin}: moe_layer_freq", r.get("moe_layer_freq"), "only 1 is supported")
    if r.bool("attention_bias", False):
        raise ShardplanError(f"{r.origin}: attention_bias", True, "MLA with biases is not supported")
    heads = r.int("num_attention_heads")
    spec = dict(
        family=family, block_class=block_class,
        vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=r.int("num_key_value_heads", heads),
        intermediate_size=r.int("intermediate_size"),
        max_position_embeddings=r.int("max_position_embeddings", max_positions),
        mlp=r.activation("hidden_act", default="silu"), norm="rmsnorm",
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        # an explicit null q_lora_rank means a plain q_proj (DeepSeek-V2-Lite), not the class default
        mla=MLASpec(kv_lora_rank=r.int("kv_lora_rank", 512),
                    q_lora_rank=r.int("q_lora_rank", None if "q_lora_rank" in r.config else q_lora_default),
                    qk_rope_head_dim=r.int("qk_rope_head_dim", 64), qk_nope_head_dim=r.int("qk_nope_head_dim", 128),
                    v_head_dim=r.int("v_head_dim", 128)),
    )
    if r.get("n_routed_experts"):
        spec["moe"] = MoESpec(num_experts=r.int("n_routed_experts"), experts_per_token=r.int("num_experts_per_tok"),
                              intermediate_size=r.int("moe_intermediate_size"),
                              shared_experts=r.count("n_shared_experts", 0, MAX_EXPERTS),
                              first_dense_layers=r.count("first_k_dense_replace", 0, MAX_LAYERS), lora_adapts_experts=True)
    return spec


def _deepseek_v2(r: _Reader) -> dict[str, Any]:
    return _deepseek(r, "deepseek_v2", "DeepseekV2DecoderLayer", q_lora_default=None, max_positions=2048)


def _deepseek_v3(r: _Reader) -> dict[str, Any]:
    """DeepseekV3Config defaults are DeepSeek-V3's own (61 layers, 256 experts, q_lora_rank 1536)."""
    r.class_defaults(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                     num_hidden_layers=61, num_attention_heads=128, n_routed_experts=256, num_experts_per_tok=8,
                     n_shared_experts=1, first_k_dense_replace=3)
    return _deepseek(r, "deepseek_v3", "DeepseekV3DecoderLayer", q_lora_default=1536, max_positions=4096)


def _qwen3(r: _Reader) -> dict[str, Any]:
    """Qwen3: Llama layout without biases (``attention_bias``) plus ``q_norm``/``k_norm`` RMSNorms of
    head_dim (transformers ``Qwen3Attention``); Qwen3Config's head_dim defaults to 128, not h/heads."""
    r.class_defaults(vocab_size=151936, intermediate_size=22016, num_attention_heads=32, num_key_value_heads=32,
                     head_dim=128, max_position_embeddings=32768)
    spec = _llama_like(r, "qwen3", "Qwen3DecoderLayer", window_key=None)
    spec["qk_norm"] = "head"
    if r.bool("use_sliding_window", False) and r.get("sliding_window"):
        spec["sliding_window"] = r.int("sliding_window")
    return spec


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    """Qwen3-MoE: Qwen3 attention; block i holds 128 experts + a router unless it is in
    ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step != 0`` (``Qwen3MoeDecoderLayer``); no
    shared expert. head_dim defaults to h/heads (``Qwen3MoeAttention``)."""
    r.class_defaults(vocab_size=151936, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4,
                     max_position_embeddings=32768)
    spec = _llama_like(r, "qwen3_moe", "Qwen3MoeDecoderLayer", window_key=None)
    spec["qk_norm"] = "head"
    if r.get("num_experts", 128):
        spec["moe"] = MoESpec(num_experts=r.int("num_experts", 128), experts_per_token=r.int("num_experts_per_tok", 8),
                              intermediate_size=r.int("moe_intermediate_size", 768),
                              layer_step=r.int("decoder_sparse_step", 1),
                              dense_layers=r.layer_list("mlp_only_layers", spec["num_layers"]), lora_adapts_experts=True)
    return spec


def _gemma3_text(r: _Reader) -> dict[str, Any]:
    """Gemma 3 text decoder: Gemma 2's four RMSNorms per block plus ``q_norm``/``k_norm`` of head_dim
    (``Gemma3Attention``); Gemma3TextConfig defaults (transformers 5.23): vocab 262208, 8 heads,
    4 kv heads, head_dim 256, tied embeddings."""
    r.class_defaults(vocab_size=262208, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                     max_position_embeddings=131072)
    spec = _gemma2(r)
    spec.update(family="gemma3_text", block_class="Gemma3DecoderLayer", qk_norm="head")
    return spec


def _phi3(r: _Reader) -> dict[str, Any]:
    """Phi-3 / Phi-4: fused ``qkv_proj`` and ``gate_up_proj`` Linears without biases (``Phi3Attention``,
    ``Phi3MLP``); the parameter count equals Llama's, the tensors differ."""
    spec = _llama_like(r, "phi3", "Phi3DecoderLayer", qkv_bias=False)
    spec.update(out_proj_bias=False, fused_qkv=True, fused_gate_up=True)
    return spec


def _llama4_text(r: _Reader) -> dict[str, Any]:
    """Llama 4 text decoder: MoE blocks (``moe_layers``, default every ``interleave_moe_layer_step``-th)
    hold ``num_local_experts`` experts of ``intermediate_size``, a bias-free router and one shared
    expert of the same width; the other blocks a dense MLP of ``intermediate_size_mlp``
    (``Llama4TextDecoderLayer``). Its q/k norm is a weightless L2 norm."""
    r.class_defaults(vocab_size=202048, intermediate_size=8192, num_attention_heads=40, num_key_value_heads=8,
                     head_dim=128, max_position_embeddings=131072)
    spec = _llama_like(r, "llama4_text", "Llama4TextDecoderLayer", window_key=None)
    expert_width = spec["intermediate_size"]
    spec["intermediate_size"] = r.int("intermediate_size_mlp", 16384)
    layers, step = spec["num_layers"], r.int("interleave_moe_layer_step", 1)
    # transformers derives moe_layers from the step; only a file's own list overrides it
    moe_layers = (r.layer_list("moe_layers", layers) if "moe_layers" in r.provided else None) or range(step - 1, layers, step)
    spec["moe"] = MoESpec(num_experts=r.int("num_local_experts", 16), experts_per_token=r.int("num_experts_per_tok", 1),
                          intermediate_size=expert_width, shared_experts=1,
                          dense_layers=tuple(i for i in range(layers) if i not in set(moe_layers)))
    return spec


def _olmo2(r: _Reader) -> dict[str, Any]:
    """OLMo 2: no input norm; ``post_attention_layernorm`` and ``post_feedforward_layernorm`` per block,
    and ``q_norm``/``k_norm`` RMSNorms over the whole q and k projections (``Olmo2Attention``)."""
    spec = _llama_like(r, "olmo2", "Olmo2DecoderLayer", window_key=None)
    spec.update(qk_norm="width", norm_multiply_fp32=True)  # Olmo2RMSNorm: (weight * x_fp32).to(dtype)
    return spec


def _granite(r: _Reader) -> dict[str, Any]:
    """Granite 3: the Llama layout; its multipliers (embedding, attention, residual, logits) are
    scalars, not parameters."""
    return _llama_like(r, "granite", "GraniteDecoderLayer", window_key=None)


FAMILIES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "gemma2": _gemma2,
    "gpt2": _gpt2, "opt": _opt, "falcon": _falcon, "deepseek_v2": _deepseek_v2,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "gemma3_text": _gemma3_text, "phi3": _phi3,
    "llama4_text": _llama4_text, "olmo2": _olmo2, "granite": _granite, "deepseek_v3": _deepseek_v3,
}

# Multimodal wrappers whose ``text_config`` is the decoder (its model_type when the file omits it).
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral"}

# A file must state its own size; every other key may take its class default.
SIZE_KEYS = {"gpt2": ("n_embd", "n_layer")}
SIZE_KEYS_DEFAULT = ("hidden_size", "num_hidden_layers")

# A config of a model_type no family reader knows is read by the "module_tree" reader, when the layer
# that may import torch installed it (support/extras.py; calibrate/module_tree.py); this extra has
# torch and transformers (pyproject.toml).
MODULE_TREE_EXTRA = "hf"


def unknown_type_error(origin: str, model_type: Any, why: str) -> ShardplanError:
    """The one line for a model_type no family reader knows, and why its module tree was not read."""
    return ShardplanError(f"{origin}: model_type", _shown(model_type),
                          f"no shardplan reader (supported: {', '.join(sorted(FAMILIES))}); {why}")


def complete_config(config: dict[str, Any], origin: str) -> tuple[dict[str, Any], str]:
    """``config`` with its class's defaults filled in by transformers when it is installed, and
    where the defaults come from (shardplan's copy when transformers is absent or rejects the file,
    so shardplan's own one-line errors name the bad field). transformers' ``AutoConfig.for_model`` builds the class locally
    (no network) and ``to_dict`` lists every attribute under its canonical name; the class's
    ``attribute_map`` aliases (Qwen3-MoE ``num_experts`` -> ``num_local_experts``) are added back
    so the family readers find the names config.json files use."""
    fallback = "shardplan's copy of the transformers 5.23 defaults; transformers is not installed"
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return config, fallback
    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return config, f"shardplan's defaults; transformers {transformers.__version__} does not know {model_type!r}"
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    try:
        completed = transformers.AutoConfig.for_model(model_type, **kwargs)
    except Exception as err:  # its validators reject the file: shardplan's checks name the field below
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = lines[-1] if lines else type(err).__name__
        return config, f"shardplan's copy of the transformers 5.23 defaults; transformers rejected the config: {reason}"
    full = completed.to_dict()
    for alias, canonical in getattr(completed, "attribute_map", {}).items():
        if canonical in full:
            full[alias] = full[canonical]
    full["_attribute_map"] = dict(getattr(completed, "attribute_map", {}))
    return full, f"transformers {transformers.__version__} {type(completed).__name__}"


def _decoder_config(config: dict[str, Any], origin: str) -> tuple[dict[str, Any], list[str]]:
    """The decoder's own config: ``text_config`` of a multimodal wrapper, else the config."""
    text = config.get("text_config")
    outer = config.get("model_type")
    if isinstance(outer, str) and outer in TEXT_MODEL_TYPES and not isinstance(text, dict):
        raise ShardplanError(f"{origin}: text_config", "{...}" if isinstance(text, list) else _shown(text),
                             f"a {outer} config reads its decoder from text_config, which must be a JSON object")
    if not isinstance(text, dict):
        return config, []
    inner = {"model_type": TEXT_MODEL_TYPES.get(outer, outer), **text}
    return inner, [f"text decoder only: the {outer} config's vision tower and projector are not counted"]


def spec_from_hf_config(config: dict[str, Any], name: str, origin: str = "config.json", **extra: Any) -> ModelSpec:
    """Map one HF config dict to a ModelSpec; ``extra`` adds name-level fields (aliases, source).

    ``ModelSpec.assumed`` says what the file did not: notes (text decoder only) and one entry
    naming where defaults came from (transformers' class, or shardplan's copy of it) with each key
    the file left out and the value it took. An unknown model_type goes to the module-tree reader."""
    if not isinstance(config, dict):
        raise ShardplanError(origin, type(config).__name__, "a Hugging Face config must be a JSON object")
    config, notes = _decoder_config(config, origin)
    model_type = config.get("model_type")
    if not isinstance(model_type, (str, type(None))):
        raise ShardplanError(f"{origin}: model_type", _shown(model_type), "must be a string such as \"llama\"")
    check_int_ranges(config, origin)
    if model_type not in FAMILIES:
        read_tree = installed_reader("module_tree")
        if read_tree is None:
            raise unknown_type_error(origin, model_type, "any model transformers knows is read from its module tree "
                                                         f"with torch and transformers: pip install \"shardplan[{MODULE_TREE_EXTRA}]\"")
        spec = read_tree(config, name, origin, **extra)
        return spec.model_copy(update={"assumed": (*notes, *spec.assumed)}) if notes else spec
    for key in SIZE_KEYS.get(model_type, SIZE_KEYS_DEFAULT):
        if config.get(key) is None:
            raise ShardplanError(f"{origin}: {key}", None, "missing from config.json (the model's size is not assumed)")
    provided = set(config)
    completed, provenance = complete_config(config, origin)
    for alias, canonical in completed.get("_attribute_map", {}).items():  # a key given under either name
        if alias in provided or canonical in provided:
            provided |= {alias, canonical}
    reader = _Reader(completed, origin, provided, class_keys=set(completed) if completed is not config else None)
    fields = FAMILIES[model_type](reader)
    defaults = ", ".join(f"{k}={v!r}" for k, v in sorted(reader.defaulted.items()))
    assumed = tuple(notes) + ((f"defaults ({provenance}): {defaults}",) if defaults else ())
    try:
        return ModelSpec(name=name, display_name=extra.pop("display_name", name), assumed=assumed, **fields, **extra)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "config"
        raise ShardplanError(f"{origin}: {field}", first.get("input") if not isinstance(first.get("input"), dict) else "{...}",
                             first["msg"].removeprefix("Value error, ")) from None


def how_read(spec: ModelSpec, path: str | Path) -> str:
    """One line for reports: the file, and what it did not say."""
    if not spec.assumed:
        return f"Hugging Face config {path}"
    return f"Hugging Face config {path}; ASSUMED: " + "; ".join(spec.assumed)


def spec_from_hf_config_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    config = read_json(path, field="model")
    given = config.get("_name_or_path")
    name = given if isinstance(given, str) and given.strip() else path.parent.name or path.stem
    return spec_from_hf_config(config, name=str(name), origin=path.name, source=f"config.json at {path}")
