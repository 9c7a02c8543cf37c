"""A Hugging Face config whose ``model_type`` no family reader knows (``inputs/hf_config.py``),
read from the module tree transformers builds for it on the meta device.

``transformers.AutoConfig.for_model(model_type, **config)`` makes the configuration object and
``AutoModelForCausalLM.from_config(..., trust_remote_code=False)`` builds the model under
``torch.device("meta")``: every parameter has its shape and no storage, so a 405B config builds in
seconds without memory. Nothing from the file becomes code: ``model_type`` must name a class
transformers ships (its ``CONFIG_MAPPING``), ``auto_map`` and other private keys are dropped,
repository code is never run (``trust_remote_code=False``), and neither call reads a file or the
network (the config is the dict shardplan's bounded reader already read; ``local_files_only`` has
nothing to guard). torch and transformers are imported through ``support.extras`` when a config
needs them; without them the error names the ``hf`` extra.

What the spec takes from the tree (``ModelSpec.module_tree``): every tensor's shape, per decoder
block (the longest ``nn.ModuleList`` of one class) and for the root (the rest, a tied tensor once),
the norm modules' parameters, and the largest module. The counts, FSDP's padding and ZeRO-3's unit
follow exactly. ASSUMPTION: activations (what a block saves for backward) are the Llama-like
formulas' with the config's widths and the layout flags read off the tree (norm kind, gated MLP,
fused QKV, biases); an architecture that saves other tensors is approximate, as the answer says.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from pydantic import ValidationError

from shardplan.inputs.hf_config import _ACTIVATIONS, MODULE_TREE_EXTRA, unknown_type_error
from shardplan.inputs.model import ModelSpec, ModuleTree
from shardplan.support.errors import ShardplanError
from shardplan.support.extras import require
from shardplan.support.limits import MAX_PARAMS


def spec_from_module_tree(config: dict[str, Any], name: str, origin: str, **extra: Any) -> ModelSpec:
    """The ModelSpec of the causal LM ``config`` describes, from its module tree on the meta device."""
    try:
        torch = require("torch", MODULE_TREE_EXTRA)
        transformers = require("transformers", MODULE_TREE_EXTRA)
    except ShardplanError:
        raise unknown_type_error(origin, config.get("model_type"), "it is read from its module tree with torch "
                                 f"and transformers: pip install \"shardplan[{MODULE_TREE_EXTRA}]\"") from None
    built, model = _build(config, origin, torch, transformers)
    tree, layout = _tree(model, torch, built, transformers.__version__)
    fields = {**_dimensions(built, tree, origin), **layout}
    fields.update(_positions(built, tree, fields))
    notes = _notes(config, built, tree, fields)
    try:
        return ModelSpec(name=name, display_name=extra.pop("display_name", name), family="module_tree",
                         module_tree=tree, assumed=notes, **fields, **extra)
    except ValidationError as err:
        first = err.errors()[0]
        raise ShardplanError(f"{origin}: {'.'.join(str(p) for p in first['loc']) or 'config'}", "{...}"
                             if isinstance(first.get("input"), dict) else first.get("input"),
                             first["msg"].removeprefix("Value error, ")) from None


def _build(config: dict[str, Any], origin: str, torch, transformers):
    """(configuration object, model on the meta device); a one-line error when transformers does
    not ship the model_type or cannot build it as a causal LM."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    version = transformers.__version__
    if model_type not in CONFIG_MAPPING:
        raise unknown_type_error(origin, model_type, f"transformers {version} does not ship it either, and shardplan "
                                                     "never runs a repository's own code (trust_remote_code)")
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "auto_map") and not k.startswith("_")}
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its config warnings are not the answer's
    try:
        built = transformers.AutoConfig.for_model(model_type, **kwargs)
        _check_size(built, origin)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(built, trust_remote_code=False)
    except ShardplanError:
        raise
    except Exception as err:  # no causal-LM class for it, or its validators reject a value: one line
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        raise unknown_type_error(origin, model_type, f"transformers {version} cannot build it as a causal LM: "
                                                     f"{(lines[-1] if lines else type(err).__name__)[:200]}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    return built, model


def _check_size(built, origin: str) -> None:
    """Refuse before building a config whose attention matrices alone (4·h² per block) pass
    limits.MAX_PARAMS: building 10^4 blocks of width 2^20 takes minutes even on the meta device."""
    h, layers = _int(built, "hidden_size", "d_model", "n_embd"), _int(built, "num_hidden_layers", "n_layer")
    if h and layers and 4 * h * h * layers > MAX_PARAMS:
        raise ShardplanError(f"{origin}: hidden_size", h, f"with {layers} layers, more than the {MAX_PARAMS:,} "
                                                          "parameters shardplan plans for (limits.MAX_PARAMS)")


def _is_norm(module) -> bool:
    return "norm" in type(module).__name__.lower()


def _tree(model, torch, built, version: str) -> tuple[ModuleTree, dict[str, Any]]:
    """The tensors per unit, and the layout flags read off block 0 (norm kind and count, fused QKV)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)
             and len({type(b) for b in m}) == 1 and any(True for _ in m.parameters())]
    if not lists:
        raise ShardplanError("model", type(model).__name__, "no list of decoder blocks in its module tree")
    blocks = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    inside = {id(p) for p in blocks.parameters()}
    first = blocks[0]
    norms = [m for m in first.modules() if _is_norm(m) and any(True for _ in m.parameters(recurse=False))]
    own = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()]
    tree = ModuleTree(
        source=f"transformers {version} {type(model).__name__} on the meta device",
        root=tuple(tuple(p.shape) for p in model.parameters() if id(p) not in inside),
        blocks=tuple(tuple(tuple(p.shape) for p in b.parameters()) for b in blocks),
        block_norm_params=sum(p.numel() for m in norms for p in m.parameters(recurse=False)),
        largest_module_params=max(own))
    layout = dict(block_class=type(first).__name__, num_layers=len(blocks),
                  norm="layernorm" if any(getattr(m, "bias", None) is not None for m in norms) else "rmsnorm",
                  norms_per_block=max(1, min(16, sum(1 for m in norms if m.weight.dim() == 1))) if norms else 1,
                  tie_word_embeddings=_tied(model))
    return tree, layout


def _tied(model) -> bool:
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    return inp is not None and out is not None and inp.weight is out.weight


def _int(built, *keys: str) -> int | None:
    for key in keys:
        value = getattr(built, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _dimensions(built, tree: ModuleTree, origin: str) -> dict[str, Any]:
    """The widths the activation formulas read, from the configuration object (its attribute_map
    aliases included: GPT-2's n_embd is hidden_size), checked against block 0's tensors."""
    h = _int(built, "hidden_size", "d_model", "n_embd")
    heads = _int(built, "num_attention_heads", "n_head", "num_heads")
    vocab = _int(built, "vocab_size")
    for key, value in (("hidden_size", h), ("num_attention_heads", heads), ("vocab_size", vocab)):
        if value is None:
            raise ShardplanError(f"{origin}: {key}", None, "missing: the activations need it")
    kv = _int(built, "num_key_value_heads", "num_kv_heads") or heads
    head_dim = _int(built, "head_dim")
    two_d = [s for s in tree.blocks[0] if len(s) == 2]
    inter = _int(built, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff") \
        or _mlp_width(two_d, h) or 4 * h
    q, kv_w = heads * (head_dim or h // heads), kv * (head_dim or h // heads)
    fused_up = (2 * inter, h) in two_d
    gated = fused_up or sum(1 for s in two_d if inter in s) >= 3
    act = getattr(built, "hidden_act", None) or getattr(built, "activation_function", None)
    plain = {"gelu": "gelu", "relu": "relu"}.get(_ACTIVATIONS.get(act, "gelu") if isinstance(act, str) else "gelu", "gelu")
    one_d = Counter(s[0] for s in tree.blocks[0] if len(s) == 1)
    return dict(hidden_size=h, num_heads=heads, num_kv_heads=kv if heads % kv == 0 else heads, head_dim=head_dim,
                vocab_size=vocab, intermediate_size=inter, mlp=("geglu" if "gelu" in str(act) else "swiglu")
                if gated else plain, fused_qkv=(q + 2 * kv_w, h) in two_d, fused_gate_up=fused_up,
                qkv_bias=one_d[q + 2 * kv_w] > 0 or one_d[q] > (1 if q == h else 0), mlp_bias=one_d[inter] > 0)


def _mlp_width(two_d: list[tuple[int, ...]], h: int) -> int | None:
    """The widest dimension of block 0's matrices other than h (the MLP's, where the config names none)."""
    other = [d for s in two_d for d in s if d != h]
    return max(other) if other else None


def _positions(built, tree: ModuleTree, fields: dict[str, Any]) -> dict[str, Any]:
    """Context length, and learned position embeddings: a root matrix of width h that is neither
    the token embedding nor the lm_head (GPT-2's wpe, OPT's embed_positions with its offset)."""
    h, vocab = fields["hidden_size"], fields["vocab_size"]
    positions = _int(built, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length") or 4096
    rows = [s[0] for s in tree.root if len(s) == 2 and s[1] == h and s[0] != vocab]
    out: dict[str, Any] = {"max_position_embeddings": positions}
    if rows:
        out.update(learned_position_embeddings=True, max_position_embeddings=min(positions, rows[0]),
                   position_embedding_offset=max(0, rows[0] - positions))
    window = getattr(built, "sliding_window", None)
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        out["sliding_window"] = window
    return out


def _notes(config: dict[str, Any], built, tree: ModuleTree, fields: dict[str, Any]) -> tuple[str, ...]:
    """What the answer says about a spec read this way."""
    total = sum(math.prod(s) for s in tree.root) + sum(math.prod(s) for b in tree.blocks for s in b)
    notes = [f"model_type {config.get('model_type')!r} read from its module tree ({tree.source}: {total:,} "
             "parameters, every tensor's shape; no weights, no download, no repository code)",
             f"ASSUMPTION: activations from Llama-like formulas with its widths (h={fields['hidden_size']}, "
             f"{fields['num_heads']} heads, {fields['num_kv_heads']} kv heads, MLP {fields['intermediate_size']} "
             f"{fields['mlp']}, {fields['norm']} x{fields['norms_per_block']}): approximate for another block design"]
    experts = _int(built, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    if experts and experts > 1:
        notes.append(f"ASSUMPTION: {experts} experts per MoE block all counted as active (time and MFU count every "
                     "parameter; memory is exact)")
    return tuple(notes)
