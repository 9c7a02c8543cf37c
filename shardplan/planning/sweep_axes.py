"""A sweep's axes: each knob's list of values, checked and deduplicated, as labels (what the
DataFrame shows) and codes (what the formulas read); the axis order of the product."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from shardplan.inputs import strategy as st
from shardplan.inputs import vocabulary
from shardplan.inputs.hardware import Cluster
from shardplan.support.errors import ShardplanError, safe_repr
from shardplan.support.limits import MAX_AXIS_VALUES, _shown

# Categorical knob axes: sweep argument -> (Columns field, the names tuple that codes index).
CATEGORICAL_KNOBS = {
    "engines": ("engine", st.ENGINES),
    "strategies": ("strategy", st.STRATEGIES),
    "method": ("method", st.METHODS),
    "precision": ("precision", st.PRECISIONS),
    "optimizer": ("optimizer", st.OPTIMIZERS),
    "offload": ("offload", st.OFFLOADS),
    "ac": ("ac", st.AC_MODES),
    "attention": ("attention", st.ATTENTIONS),
    "stack": ("stack", st.STACKS),
}
# Stack knobs: None (the default) takes each row's stack default (``stacks.stack_tables``, one-GPU
# rows their ``single_gpu`` values); values given make an axis of their own.
STACK_KNOB_AXES = ("logits_fp32", "ce_chunks", "fused_ce", "optimizer_in_backward", "activation_offload", "fp32_master",
                   "paged_optimizer", "lora_dropout", "reentrant_checkpointing", "quant_state_sharded",
                   "quant_format", "load_mode", "checkpoint_wrapper", "use_cache", "kbit_prep", "fused_lm_head",
                   "optimizer_impl", "quant_saves_input", "quant_head", "untied_head", "chunked_head",
                   "quant_buffers_sharded", "loop_keeps_logits", "nf4_whole_quantize", "nf4_torchao", "autocast", "compile",
                   "lowp_norm", "rope_form", "sac_saves_attention", "metric_ce")
STACK_KNOB_NAMES = {"quant_format": st.QUANT_FORMATS, "load_mode": st.LOAD_MODES, "optimizer_impl": st.OPTIMIZER_IMPLS,
                    "rope_form": st.ROPE_FORMS}
INTEGER_KNOBS = ("ac_every_k", "micro_batch", "seq_len", "grad_accum")

# Axis order of the product (the last varies fastest) and the DataFrame column each axis fills.
AXES = ("models", "gpus", "nodes", "gpu_counts", "engines", "strategies", "method", "lora_rank", "lora_targets",
        "precision", "optimizer", "offload", "ac", "ac_every_k", "micro_batch", "seq_len", "grad_accum",
        "shard_group_size", "attention", "dropout", "reduce_dtype", "stack") + STACK_KNOB_AXES + ("sync_every_micro_batch",)
AXIS_COLUMN = {**{k: k for k in STACK_KNOB_AXES}, "stack": "stack", "models": "model", "gpus": "gpu", "nodes": "nodes",
               "gpu_counts": "world_size", "engines": "engine",
               "strategies": "strategy", "method": "method", "lora_rank": "lora_rank", "lora_targets": "lora_targets",
               "precision": "precision", "optimizer": "optimizer", "offload": "offload", "ac": "ac",
               "ac_every_k": "ac_every_k", "micro_batch": "micro_batch", "seq_len": "seq_len",
               "grad_accum": "grad_accum", "shard_group_size": "shard_group_size", "attention": "attention",
               "dropout": "dropout", "reduce_dtype": "reduce_dtype", "sync_every_micro_batch": "sync_every_micro_batch"}
LABEL_AXES = ("models", "gpus", "lora_targets") + tuple(CATEGORICAL_KNOBS) + ("reduce_dtype", "quant_format", "load_mode", "optimizer_impl",
                                                                           "rope_form")


def as_list(value: Any) -> list:
    if value is None:
        return [None]
    if isinstance(value, (str, bytes, bool, int, np.integer)):
        return [value]
    if isinstance(value, Cluster):
        return [value]
    return list(value)


def dedupe(values: Iterable) -> list:
    """Distinct values in first-seen order, by hashing (linear; equality as ``in`` has it: 1 == 1.0 == True)."""
    return list(dict.fromkeys(values))


def bounded_axis(name: str, value: Any) -> Any:
    """``value`` with at most ``MAX_AXIS_VALUES`` items: a sized list or range is measured before it
    is copied, an iterator read no further than one item past the bound."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        _check_item(name, value)
    if value is None or isinstance(value, (str, bytes, bool, int, np.integer, Cluster)) or hasattr(value, "total_params"):
        return value
    if hasattr(value, "__len__"):
        n = len(value)
    elif not hasattr(value, "__iter__"):  # a float, None-like or any other scalar: not an axis value
        raise ShardplanError(name, _shown(value), "expected a name, a whole number, or a list of them")
    else:
        value = list(itertools.islice(iter(value), MAX_AXIS_VALUES + 1))
        n = len(value)
    if n > MAX_AXIS_VALUES:
        raise ShardplanError(name, _shown(value), f"lists {'more than ' if n == MAX_AXIS_VALUES + 1 else ''}{n:,} "
                                                  f"values; a sweep axis holds at most {MAX_AXIS_VALUES:,}")
    if n == 0:
        raise ShardplanError(name, _shown(value), "an empty list: give at least one value (or leave it out)")
    if not isinstance(value, range):
        for item in value:
            _check_item(name, item)
    return value


def _check_item(name: str, item: Any) -> None:
    """An axis item the later steps can handle: an int within int64 (past it, even str() fails at
    4,300 digits), a name, or a float; a dict or other container is not an axis value."""
    if isinstance(item, (int, np.integer)) and not isinstance(item, bool) and int(item).bit_length() > 62:
        raise ShardplanError(name, _shown(item), "a value far past every stated range (limits.py)")
    if isinstance(item, (dict, list, tuple, set)):
        raise ShardplanError(name, _shown(item), "expected a name or a number, not a container")


@dataclass(frozen=True)
class Axis:
    name: str
    labels: tuple          # what the DataFrame shows (category names or integers)
    codes: np.ndarray      # what formulas read (codes for categorical knobs, integers otherwise)

    @property
    def size(self) -> int:
        return len(self.labels)


def checked_ints(name: str, values: Iterable) -> list[int]:
    """Each value a whole number within ``limits.INT_RANGES[name]`` (the one table)."""
    from shardplan.support.limits import checked_int

    return dedupe(checked_int(name, v) for v in values)


def checked_flags(name: str, values: Iterable) -> list[bool]:
    """Each value True or False: ``bool("no")`` is True, so a word or a number is refused, not read
    as a flag."""
    out = []
    for v in values:
        if not isinstance(v, (bool, np.bool_)):
            raise ShardplanError(name, safe_repr(v)[:40], "expected True or False")
        out.append(bool(v))
    return dedupe(out)


def knob_axis(arg: str, values: Any, context: dict[str, Any] | None = None) -> Axis:
    if arg in CATEGORICAL_KNOBS:
        field, names = CATEGORICAL_KNOBS[arg]
        raw = list(names) if values is None else as_list(values)
        codes = dedupe(names.index(_sweep_word(field, v, context or {})) for v in raw)
        return Axis(arg, tuple(names[i] for i in codes), np.asarray(codes, dtype=np.int64))
    if arg == "dropout":
        flags = checked_flags(arg, as_list(values))
        return Axis(arg, tuple(flags), np.asarray(flags, dtype=bool))
    ints = checked_ints(arg, as_list(values))
    if not ints:
        raise ShardplanError(arg, values, "needs at least one value")
    return Axis(arg, tuple(ints), np.asarray(ints, dtype=np.int64))


def _sweep_word(field: str, word: Any, context: dict[str, Any]) -> str:
    """A sweep list's word through the one vocabulary (shardplan/inputs/vocabulary.py); a word whose
    meaning depends on the stack or engine must mean the same for every one swept."""
    also = vocabulary.also_sets(field, word)
    if also:
        raise ShardplanError(field, word, "also sets " + ", ".join(f"{k}={v}" for k, v in also.items())
                             + f"; in a sweep give {field}={vocabulary.canonical(field, word)!r} and those knobs")
    return vocabulary.canonical(field, word, **context)



def knob_axes(args: dict[str, Any], counts: list[int]) -> dict[str, Axis]:
    """The axes of every knob but the model and cluster ones (``counts``: the GPU counts swept)."""
    axes: dict[str, Axis] = {}
    for arg in CATEGORICAL_KNOBS:
        if arg == "strategies" and args[arg] is None:  # all; ``single`` only where a count is one GPU
            names = [n for n in st.STRATEGIES if n != "single" or 1 in counts]
            axes[arg] = knob_axis(arg, names)
            continue
        axes[arg] = knob_axis(arg, args[arg], {"stack": as_list(args["stack"]), "engine": as_list(args["engines"])})
    for arg in INTEGER_KNOBS + ("lora_rank", "dropout"):
        axes[arg] = knob_axis(arg, args[arg])
    targets = dedupe(vocabulary.canonical("lora_targets", t) for t in as_list(args["lora_targets"]))
    axes["lora_targets"] = Axis("lora_targets", tuple(targets), np.arange(len(targets)))
    if args["reduce_dtype"] is None:  # each engine's default (st.resolve_reduce_dtype); no label column
        axes["reduce_dtype"] = Axis("reduce_dtype", (None,), np.asarray([-1]))
    else:
        codes = dedupe(st.code(st.REDUCE_DTYPES, v, "reduce_dtype") for v in as_list(args["reduce_dtype"]))
        axes["reduce_dtype"] = Axis("reduce_dtype", tuple(st.REDUCE_DTYPES[i] for i in codes),
                                    np.asarray(codes, dtype=np.int64))
    for arg in STACK_KNOB_AXES:
        axes[arg] = stack_knob_axis(arg, args[arg])
    if args["sync_every_micro_batch"] is None:  # every micro-batch, the engines' default; no label column
        axes["sync_every_micro_batch"] = Axis("sync_every_micro_batch", (None,), np.asarray([True]))
    else:
        flags = checked_flags("sync_every_micro_batch", as_list(args["sync_every_micro_batch"]))
        axes["sync_every_micro_batch"] = Axis("sync_every_micro_batch", tuple(flags), np.asarray(flags, dtype=bool))
    groups = args["shard_group_size"]
    if groups is None:
        axes["shard_group_size"] = Axis("shard_group_size", (None,), np.asarray([0]))
    else:
        g = checked_ints("shard_group_size", as_list(groups))
        axes["shard_group_size"] = Axis("shard_group_size", tuple(g), np.asarray(g, dtype=np.int64))
    return axes


def stack_knob_axis(arg: str, raw: Any) -> Axis:
    """A stack knob's axis; None (one label None, code -2) takes each row's stack default."""
    if raw is None:
        return Axis(arg, (None,), np.asarray([-2]))
    if arg in STACK_KNOB_NAMES:
        codes = dedupe(st.code(STACK_KNOB_NAMES[arg], v, arg) for v in as_list(raw))
        return Axis(arg, tuple(STACK_KNOB_NAMES[arg][i] for i in codes), np.asarray(codes, dtype=np.int64))
    if arg == "ce_chunks":
        vals = checked_ints(arg, as_list(raw))  # 0 (off) is in ce_chunks' range
        return Axis(arg, tuple(vals), np.asarray(vals, dtype=np.int64))
    if arg == "lora_dropout":
        floats = dedupe(float(v) for v in as_list(raw))
        if any(not 0 <= v < 1 for v in floats):
            raise ShardplanError(arg, raw, "expected values in [0, 1)")
        return Axis(arg, tuple(floats), np.asarray(floats, dtype=np.float64))
    flags = checked_flags(arg, as_list(raw))
    return Axis(arg, tuple(flags), np.asarray(flags, dtype=bool))
