"""Sweeps: the same formulas over the cartesian product of many knobs, as numpy arrays.

``sweep(models=[...], gpus=[...], gpu_counts=[...], strategies=[...], seq_len=[...], ...)``
returns a pandas DataFrame with one row per configuration, whose columns carry the names of the
record fields (``estimate_memory``'s terms, ``comm_volume`` / ``comm_times``, and step time /
tokens/s / MFU when ``shardplan.formulas.throughput`` provides them). No formula lives here: this module
only lays the product out and calls ``memory``, ``comm`` and ``throughput`` (docs/architecture.md,
principle 2: a single query is a one-row sweep).

How the product is evaluated, without a Python loop per configuration:

* every knob is an *axis* (its distinct values, in the order given); axes of one value are fixed
  scalars; the row order is the C order of the product (the last axis varies fastest);
* the product is cut into chunks of at most ``chunk_size`` rows: outer axes are fixed per chunk,
  the axis where the chunk boundary falls is sliced, and the inner axes stay a broadcast grid —
  each ``Columns`` field is an array shaped only along the axes it depends on (a model column
  varies along the model axis, a cluster column along GPU × nodes × GPU count), so numpy computes
  every intermediate at the size of the axes it really involves, and only the results that vary
  with everything are materialised at chunk size;
* the chosen columns are copied into preallocated arrays (labels as small integer codes, exposed
  as pandas categoricals), so memory is bounded by the output plus one chunk's temporaries.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass, fields
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from shardplan.formulas import comm

from shardplan.formulas import throughput
from shardplan.inputs import strategy as st
from shardplan.inputs import vocabulary
from shardplan.inputs.config import STACK_COLUMN_DEFAULTS, MODEL_FIELDS, Columns, cluster_values, model_values
from shardplan.support.errors import ShardplanError
from shardplan.inputs.hardware import Cluster, parse_gpus
from shardplan.formulas.accuracy_bands import BAND_CLASSES, AccuracyBands
from shardplan.formulas.memory import BREAKDOWN_TERMS, PEAK_MOMENTS, estimate_memory
from shardplan.formulas.verdict import DOES_NOT_FIT, FITS, VERDICTS, bounded_verdict, judge, throughput_band
from shardplan.support.limits import (MAX_AXIS_VALUES, MAX_SWEEP_CONFIGURATIONS, MAX_SWEEP_TABLE_CELLS, _shown,
                              approx_bytes, bounded_int)
from shardplan.inputs.models import resolve_model
from shardplan.support.overflow import OVERFLOW_NOTE, bad_results, quiet_numpy
from shardplan.inputs.units import parse_capacity_bytes

DEFAULT_CHUNK_ROWS = 1 << 20
# Bytes of the returned DataFrame per row with every column (measured: a 192,000-row sweep of all
# 114 columns holds 765 B a row; "summary" 136 B); the configuration bound's message uses it.
SWEEP_ROW_BYTES = 765


class _LazyStackTables(dict):
    """``stacks.stack_tables`` for one-GPU (True) and multi-GPU (False) rows, loaded on first use."""

    def __missing__(self, single: bool):
        from shardplan.inputs.stacks import stack_tables

        self[single] = stack_tables(single)
        return self[single]


_STACK_TABLES = _LazyStackTables()

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
STACK_KNOB_AXES = ("logits_fp32", "ce_chunks", "optimizer_in_backward", "activation_offload", "fp32_master",
                   "paged_optimizer", "lora_dropout", "reentrant_checkpointing", "quant_state_sharded",
                   "quant_format", "load_mode", "checkpoint_wrapper")
_STACK_KNOB_NAMES = {"quant_format": st.QUANT_FORMATS, "load_mode": st.LOAD_MODES}
INTEGER_KNOBS = ("ac_every_k", "micro_batch", "seq_len", "grad_accum")

# Axis order of the product (the last varies fastest) and the DataFrame column each axis fills.
AXES = ("models", "gpus", "nodes", "gpu_counts", "engines", "strategies", "method", "lora_rank", "lora_targets",
        "precision", "optimizer", "offload", "ac", "ac_every_k", "micro_batch", "seq_len", "grad_accum",
        "shard_group_size", "attention", "dropout", "reduce_dtype", "stack") + STACK_KNOB_AXES + ("sync_every_micro_batch",)
AXIS_COLUMN = {**{k: k for k in STACK_KNOB_AXES}, "stack": "stack", "models": "model", "gpus": "gpu", "nodes": "nodes", "gpu_counts": "world_size", "engines": "engine",
               "strategies": "strategy", "method": "method", "lora_rank": "lora_rank", "lora_targets": "lora_targets",
               "precision": "precision", "optimizer": "optimizer", "offload": "offload", "ac": "ac",
               "ac_every_k": "ac_every_k", "micro_batch": "micro_batch", "seq_len": "seq_len",
               "grad_accum": "grad_accum", "shard_group_size": "shard_group_size", "attention": "attention",
               "dropout": "dropout", "reduce_dtype": "reduce_dtype", "sync_every_micro_batch": "sync_every_micro_batch"}
LABEL_AXES = ("models", "gpus", "lora_targets") + tuple(CATEGORICAL_KNOBS) + ("reduce_dtype", "quant_format", "load_mode")

MEMORY_COLUMNS = BREAKDOWN_TERMS + (
    "peak_allocated_bytes", "peak_reserved_bytes", "stream_pool_bytes", "fragmentation_bytes", "allocator_band_bytes",
    "non_torch_bytes", "device_total_bytes", "gpu_memory_bytes", "headroom_bytes", "load_peak_bytes", "model_state_bytes", "host_offloaded_bytes_per_gpu", "host_bytes_per_node",
    "host_ram_bytes_per_node", "peak_moment", "valid", "fits_gpu", "fits_load", "fits_host", "fits",
)
# The verdict's columns (shardplan/formulas/verdict.py): ``fits`` is the verdict's too (peak + band under capacity).
VERDICT_COLUMNS = ("verdict", "band_bytes", "margin_bytes", "risk_term")
# Columns holding codes, exposed as pandas categoricals with these names.
CODED_COLUMNS = {"peak_moment": PEAK_MOMENTS, "verdict": VERDICTS, "risk_term": BAND_CLASSES}
# What ``columns="summary"`` keeps besides the configuration labels (those that exist).
SUMMARY_COLUMNS = ("fits", "verdict", "valid", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                   "load_peak_bytes", "headroom_bytes", "comm_bytes_per_step", "step_time_s", "tokens_per_s", "mfu")
CLUSTER_COLUMNS = ("gpus_per_node",)


# --- axes ---------------------------------------------------------------------------------------
def _as_list(value: Any) -> list:
    if value is None:
        return [None]
    if isinstance(value, (str, bytes, bool, int, np.integer)):
        return [value]
    if isinstance(value, Cluster):
        return [value]
    return list(value)


def _dedupe(values: Iterable) -> list:
    """Distinct values in first-seen order, by hashing (linear; equality as ``in`` has it: 1 == 1.0 == True)."""
    return list(dict.fromkeys(values))


def _bounded_axis(name: str, value: Any) -> Any:
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
class _Axis:
    name: str
    labels: tuple          # what the DataFrame shows (category names or integers)
    codes: np.ndarray      # what formulas read (codes for categorical knobs, integers otherwise)

    @property
    def size(self) -> int:
        return len(self.labels)


def _checked_ints(name: str, values: Iterable) -> list[int]:
    """Each value a whole number within ``limits.INT_RANGES[name]`` (the one table)."""
    from shardplan.support.limits import checked_int

    return _dedupe(checked_int(name, v) for v in values)


def _knob_axis(arg: str, values: Any, context: dict[str, Any] | None = None) -> _Axis:
    if arg in CATEGORICAL_KNOBS:
        field, names = CATEGORICAL_KNOBS[arg]
        raw = list(names) if values is None else _as_list(values)
        codes = _dedupe(names.index(_sweep_word(field, v, context or {})) for v in raw)
        return _Axis(arg, tuple(names[i] for i in codes), np.asarray(codes, dtype=np.int64))
    if arg == "dropout":
        flags = _dedupe(bool(v) for v in _as_list(values))
        return _Axis(arg, tuple(flags), np.asarray(flags, dtype=bool))
    ints = _checked_ints(arg, _as_list(values))
    if not ints:
        raise ShardplanError(arg, values, "needs at least one value")
    return _Axis(arg, tuple(ints), np.asarray(ints, dtype=np.int64))


def _sweep_word(field: str, word: Any, context: dict[str, Any]) -> str:
    """A sweep list's word through the one vocabulary (shardplan/inputs/vocabulary.py); a word whose
    meaning depends on the stack or engine must mean the same for every one swept."""
    also = vocabulary.also_sets(field, word)
    if also:
        raise ShardplanError(field, word, "also sets " + ", ".join(f"{k}={v}" for k, v in also.items())
                             + f"; in a sweep give {field}={vocabulary.canonical(field, word)!r} and those knobs")
    return vocabulary.canonical(field, word, **context)


# --- tables for model- and cluster-dependent columns ---------------------------------------------
CLUSTER_FIELDS = ("world_size", "gpus_per_node", "gpu_memory_bytes", "host_ram_bytes_per_node", "nccl_buffer_bytes")
RATE_FIELDS = ("intra_alpha_s", "intra_bus_bytes_per_s", "inter_alpha_s", "inter_nic_bytes_per_s", "nics_per_node")
COMPUTE_FIELDS = ("gemm_efficiency", "gemm_m_half", "gemm_p", "attention_efficiency", "hbm_bytes_per_s",
                  "host_link_bytes_per_s", "cpu_optimizer_bytes_per_s_per_node", "nccl_sm_fraction")
PEAK_FIELD = "peak_flops_by_precision"
OVERFLOW_KEY = "_overflow"  # evaluate_columns' per-row overflow mask (popped by sweep; counted in a note)


def _cluster_for(gpu: str, count: int, nodes: int | None, **link_options) -> tuple[Cluster | None, str]:
    """The cluster of ``count`` GPUs in all (spread over ``nodes`` nodes, or the GPU's usual node
    size when ``nodes`` is None), or None with the reason when that count cannot be laid out."""
    try:
        if nodes is None:
            return parse_gpus(f"{count}x{gpu}", **link_options), ""
        if count % nodes:
            return None, f"{count} GPUs do not split over {nodes} nodes"
        return parse_gpus(f"{nodes}x{count // nodes}x{gpu}", **link_options), ""
    except ShardplanError as err:
        if err.field == "gpus" and "whole" in err.reason:
            return None, err.reason
        raise


@dataclass
class _Plan:
    axes: list[_Axis]
    model_table: dict[str, np.ndarray]      # [model, lora_rank, lora_targets]
    cluster_table: dict[str, np.ndarray]    # [gpu, nodes, gpu_counts]
    cluster_notes: list[str]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def rows(self) -> int:
        return math.prod(self.shape)

    def axis(self, name: str) -> _Axis:
        return self.axes[AXES.index(name)]


def _check_cells(what: str, cells: int) -> None:
    """Refuse a model or cluster table past ``MAX_SWEEP_TABLE_CELLS`` (each cell is resolved in Python)."""
    if cells > MAX_SWEEP_TABLE_CELLS:
        raise ShardplanError(what, f"{cells:,} combinations", f"above the {MAX_SWEEP_TABLE_CELLS:,} a sweep resolves "
                                                              f"(each is a profile lookup in Python); split the sweep")


def _plan(args: dict[str, Any], link_options: dict[str, Any], max_configurations: int = MAX_SWEEP_CONFIGURATIONS) -> _Plan:
    axes: dict[str, _Axis] = {}
    # each distinct text is resolved once (a file read or a size search), so the count is bounded first
    texts, seen = [], set()
    for t in _as_list(args["models"]):
        key = id(t) if hasattr(t, "total_params") else str(t)
        if key not in seen:
            seen.add(key)
            texts.append(t)
    _check_cells("models", len(texts))
    by_name: dict[str, Any] = {}
    for text in texts:
        spec = text if hasattr(text, "total_params") else resolve_model(str(text)).spec
        by_name.setdefault(spec.name, spec)
    specs = list(by_name.values())
    axes["models"] = _Axis("models", tuple(s.name for s in specs), np.arange(len(specs)))
    gpu_texts = _dedupe(str(g).strip() for g in _as_list(args["gpus"]))
    axes["gpus"] = _Axis("gpus", tuple(gpu_texts), np.arange(len(gpu_texts)))
    nodes = [None] if args["nodes"] is None else _checked_ints("nodes", _as_list(args["nodes"]))
    axes["nodes"] = _Axis("nodes", tuple(nodes), np.arange(len(nodes)))
    counts = _checked_ints("gpu_counts", _as_list(args["gpu_counts"]))
    axes["gpu_counts"] = _Axis("gpu_counts", tuple(counts), np.asarray(counts, dtype=np.int64))
    for arg in CATEGORICAL_KNOBS:
        if arg == "strategies" and args[arg] is None:  # all; ``single`` only where a count is one GPU
            names = [n for n in st.STRATEGIES if n != "single" or 1 in counts]
            axes[arg] = _knob_axis(arg, names)
            continue
        axes[arg] = _knob_axis(arg, args[arg], {"stack": _as_list(args["stack"]), "engine": _as_list(args["engines"])})
    for arg in INTEGER_KNOBS + ("lora_rank", "dropout"):
        axes[arg] = _knob_axis(arg, args[arg])
    targets = _dedupe(vocabulary.canonical("lora_targets", t) for t in _as_list(args["lora_targets"]))
    axes["lora_targets"] = _Axis("lora_targets", tuple(targets), np.arange(len(targets)))
    if args["reduce_dtype"] is None:  # each engine's default (st.resolve_reduce_dtype); no label column
        axes["reduce_dtype"] = _Axis("reduce_dtype", (None,), np.asarray([-1]))
    else:
        codes = _dedupe(st.code(st.REDUCE_DTYPES, v, "reduce_dtype") for v in _as_list(args["reduce_dtype"]))
        axes["reduce_dtype"] = _Axis("reduce_dtype", tuple(st.REDUCE_DTYPES[i] for i in codes),
                                     np.asarray(codes, dtype=np.int64))
    for arg in STACK_KNOB_AXES:
        raw = args[arg]
        if raw is None:
            axes[arg] = _Axis(arg, (None,), np.asarray([-2]))
        elif arg in _STACK_KNOB_NAMES:
            codes = _dedupe(st.code(_STACK_KNOB_NAMES[arg], v, arg) for v in _as_list(raw))
            axes[arg] = _Axis(arg, tuple(_STACK_KNOB_NAMES[arg][i] for i in codes), np.asarray(codes, dtype=np.int64))
        elif arg == "ce_chunks":
            vals = _checked_ints(arg, _as_list(raw))  # 0 (off) is in ce_chunks' range
            axes[arg] = _Axis(arg, tuple(vals), np.asarray(vals, dtype=np.int64))
        elif arg == "lora_dropout":
            vals = _dedupe(float(v) for v in _as_list(raw))
            if any(not 0 <= v < 1 for v in vals):
                raise ShardplanError(arg, raw, "expected values in [0, 1)")
            axes[arg] = _Axis(arg, tuple(vals), np.asarray(vals, dtype=np.float64))
        else:
            flags = _dedupe(bool(v) for v in _as_list(raw))
            axes[arg] = _Axis(arg, tuple(flags), np.asarray(flags, dtype=bool))
    if args["sync_every_micro_batch"] is None:  # every micro-batch, the engines' default; no label column
        axes["sync_every_micro_batch"] = _Axis("sync_every_micro_batch", (None,), np.asarray([True]))
    else:
        flags = _dedupe(bool(v) for v in _as_list(args["sync_every_micro_batch"]))
        axes["sync_every_micro_batch"] = _Axis("sync_every_micro_batch", tuple(flags), np.asarray(flags, dtype=bool))
    groups = args["shard_group_size"]
    if groups is None:
        axes["shard_group_size"] = _Axis("shard_group_size", (None,), np.asarray([0]))
    else:
        g = _checked_ints("shard_group_size", _as_list(groups))
        axes["shard_group_size"] = _Axis("shard_group_size", tuple(g), np.asarray(g, dtype=np.int64))

    ranks = axes["lora_rank"].labels
    _check_cells("models x lora_rank x lora_targets", len(specs) * len(ranks) * len(targets))
    _check_cells("gpus x nodes x gpu_counts", len(gpu_texts) * len(nodes) * len(counts))
    rows = math.prod(axes[a].size for a in AXES)
    if rows > max_configurations:
        raise ShardplanError("max_configurations", max_configurations,
                             f"this sweep has {rows:,} configurations, above the bound (~{approx_bytes(rows * SWEEP_ROW_BYTES)} "
                             f"with all columns); narrow an axis, or raise it: sweep(..., max_configurations={rows}) "
                             f"or shardplan sweep --max-configurations {rows}")
    shape_m = (len(specs), len(ranks), len(targets))
    model_table = {f: np.zeros(shape_m, dtype=np.int64) for f in MODEL_FIELDS}
    for (i, spec), (j, rank), (k, tgt) in itertools.product(enumerate(specs), enumerate(ranks), enumerate(targets)):
        for f, v in model_values(spec, rank, tgt).items():
            model_table[f][i, j, k] = int(v)

    shape_c = (len(gpu_texts), len(nodes), len(counts))
    cluster_table = {f: np.zeros(shape_c, dtype=np.int64) for f in CLUSTER_FIELDS + ("nodes", "cluster_ok", "has_bf16")}
    cluster_table.update({f: np.zeros(shape_c, dtype=np.float64) for f in RATE_FIELDS + COMPUTE_FIELDS})
    cluster_table[PEAK_FIELD] = np.zeros(shape_c + (len(st.PRECISIONS),), dtype=np.float64)
    gpu_labels = list(gpu_texts)
    notes = []
    for (i, gpu), (j, n_nodes), (k, count) in itertools.product(enumerate(gpu_texts), enumerate(nodes), enumerate(counts)):
        cluster, why = _cluster_for(gpu, count, n_nodes, **link_options)
        ok = cluster is not None
        if not ok:  # laid out on one node so the formulas still run; the row is marked not valid
            notes.append(f"{count}x{gpu}" + (f" on {n_nodes} nodes" if n_nodes else "") + f": {why}")
            cluster = parse_gpus(f"1x{count}x{gpu}", **link_options)
        gpu_labels[i] = gpu if cluster.capacity_only else cluster.gpu.name
        for f, v in cluster_values(cluster).items():
            cluster_table[f][i, j, k] = v
        cluster_table["nodes"][i, j, k] = cluster.nodes
        cluster_table["cluster_ok"][i, j, k] = ok
        cluster_table["has_bf16"][i, j, k] = cluster.gpu.has_bf16  # V100/T4: bf16 rows are not valid
        if not cluster.gpu.has_bf16 and j == k == 0:
            notes.append(f"{gpu}: no bf16 tensor cores; its bf16 rows are marked not valid (hardware.check_precision)")
        rates = comm.link_rates(cluster)
        for f in RATE_FIELDS:
            cluster_table[f][i, j, k] = float(getattr(rates, f))
        compute = throughput.compute_rates(cluster)
        for f in COMPUTE_FIELDS:
            cluster_table[f][i, j, k] = float(getattr(compute, f))
        cluster_table[PEAK_FIELD][i, j, k] = getattr(compute, PEAK_FIELD)
    cluster_table["cluster_ok"] = cluster_table["cluster_ok"].astype(bool)
    cluster_table["has_bf16"] = cluster_table["has_bf16"].astype(bool)
    axes["gpus"] = _Axis("gpus", tuple(_dedupe_labels(gpu_labels)), axes["gpus"].codes)
    return _Plan([axes[a] for a in AXES], model_table, cluster_table, notes)


def _dedupe_labels(labels: list[str]) -> list[str]:
    """Two spellings of one GPU ('h100' and 'h100-sxm') keep distinct category names."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


class _PeakByPrecision:
    """``ComputeRates.peak_flops_by_precision`` for many GPUs at once: ``throughput.step_time``
    indexes it with the precision codes (``peak[c.precision]``), which for a single GPU is a
    4-vector; here the lookup is [cluster cell, precision], broadcast like every other column."""

    def __init__(self, table: np.ndarray, cell: tuple):
        self.table, self.cell = table, cell

    def __getitem__(self, precision):
        return self.table[self.cell + (np.asarray(precision),)]


# --- chunks -------------------------------------------------------------------------------------
def _chunks(shape: tuple[int, ...], chunk_rows: int) -> Iterator[tuple[int, list, tuple[int, ...]]]:
    """Yield (first row, per-axis index (int, or (start, stop) for a grid axis), grid shape).

    Axes after the split axis are whole; the split axis is sliced; axes before it are fixed."""
    k = len(shape)
    inner = 1
    split = k  # axes[split:] are whole inside a chunk
    while split > 0 and inner * shape[split - 1] <= chunk_rows:
        split -= 1
        inner *= shape[split]
    start = 0
    if split == 0:
        yield 0, [(0, n) for n in shape], shape
        return
    step = max(1, chunk_rows // inner)
    s = split - 1
    for outer in itertools.product(*(range(n) for n in shape[:s])):
        for lo in range(0, shape[s], step):
            hi = min(lo + step, shape[s])
            index = list(outer) + [(lo, hi)] + [(0, n) for n in shape[split:]]
            grid = (hi - lo,) + tuple(shape[split:])
            yield start, index, grid
            start += math.prod(grid)


def _axis_index(index: list, plan: _Plan) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Per axis: a scalar index, or an arange shaped to broadcast along its own grid dimension.
    Grid dimensions of size one are dropped (fixed scalars)."""
    grid_axes = [i for i, ix in enumerate(index) if isinstance(ix, tuple) and ix[1] - ix[0] > 1]
    ndim = len(grid_axes)
    out: dict[str, Any] = {}
    for i, ix in enumerate(index):
        name = AXES[i]
        if i in grid_axes:
            shape = [1] * ndim
            shape[grid_axes.index(i)] = ix[1] - ix[0]
            out[name] = np.arange(ix[0], ix[1]).reshape(shape)
        else:
            out[name] = ix[0] if isinstance(ix, tuple) else ix
    grid = tuple(index[i][1] - index[i][0] for i in grid_axes)
    return out, grid


def _chunk_columns(plan: _Plan, ix: dict[str, Any]) -> tuple[Columns, dict[str, Any]]:
    """``Columns`` whose fields are shaped along the axes they depend on (not broadcast)."""
    m = (ix["models"], ix["lora_rank"], ix["lora_targets"])
    cl = (ix["gpus"], ix["nodes"], ix["gpu_counts"])
    values: dict[str, Any] = {f: plan.model_table[f][m] for f in MODEL_FIELDS}
    values.update({f: plan.cluster_table[f][cl] for f in CLUSTER_FIELDS})
    for arg, (field, _) in CATEGORICAL_KNOBS.items():
        values[field] = plan.axis(arg).codes[ix[arg]]
    for arg in INTEGER_KNOBS + ("dropout", "sync_every_micro_batch"):
        values[arg] = plan.axis(arg).codes[ix[arg]]
    if plan.axis("shard_group_size").labels == (None,):
        values["shard_group_size"] = values["gpus_per_node"]
    else:
        values["shard_group_size"] = plan.axis("shard_group_size").codes[ix["shard_group_size"]]
    for arg in STACK_KNOB_AXES:
        if plan.axis(arg).labels == (None,):
            at = (np.asarray(values["method"]), np.asarray(values["stack"]))
            one = np.asarray(values["world_size"]) == 1
            values[arg] = np.where(one, _STACK_TABLES[True][arg][at], _STACK_TABLES[False][arg][at])
            if arg not in ("lora_dropout", "ce_chunks", "quant_format", "load_mode", "fp32_master"):
                values[arg] = values[arg].astype(bool)
        else:
            values[arg] = plan.axis(arg).codes[ix[arg]]
    # fp32_master: -1 = derived from the precision; no fp32 master under bf16-mixed is bf16-pure
    master = np.asarray(values["fp32_master"])
    values["precision"] = np.where((master == 0) & (np.asarray(values["precision"]) == st.BF16_MIXED),
                                   st.BF16_PURE, values["precision"])
    values["fp32_master"] = np.where(master < 0, np.asarray(values["precision"]) != st.BF16_PURE, master != 0)
    values["reduce_dtype"] = st.resolve_reduce_dtype(plan.axis("reduce_dtype").codes[ix["reduce_dtype"]],
                                                     values["precision"], values["engine"])
    values = {f: np.asarray(v) for f, v in values.items()}
    extra = {f: plan.cluster_table[f][cl] for f in RATE_FIELDS + COMPUTE_FIELDS + ("nodes", "cluster_ok", "has_bf16")}
    extra[PEAK_FIELD] = _PeakByPrecision(plan.cluster_table[PEAK_FIELD], cl)
    values = {**STACK_COLUMN_DEFAULTS, **values}  # knob columns the sweep does not vary
    return Columns(**{f.name: values[f.name] for f in fields(Columns)}), extra


# --- evaluation -----------------------------------------------------------------------------------
def evaluate_columns(c: Columns, extra: dict[str, Any], want: set[str] | None = None,
                     bands: AccuracyBands | None = None) -> dict[str, Any]:
    """Every column the library computes for ``c``: ``memory.estimate_memory``, the verdict
    (``shardplan.formulas.verdict``), then ``comm.comm_volume`` and ``throughput.step_time`` (gradients
    synchronised as the ``sync_every_micro_batch`` column says) when a wanted column needs them (``want``
    None: everything). ``fits`` and ``verdict`` are the verdict's rule (peak + band under capacity).

    The band's exact bytes need the per-term breakdown at the peak; when only ``fits`` / ``verdict``
    are wanted, ``verdict.bounded_verdict`` decides from the totals and the breakdown is computed
    only for the rows the totals leave undecided (same answers, without the breakdown's cost).
    """
    judged = want is None or bool(want & (set(VERDICT_COLUMNS) | {"fits"}))
    exact = want is None or bool(want & (set(VERDICT_COLUMNS) - {"verdict"}))
    with quiet_numpy():  # overflowed rows are marked by the guard below, never shown as warnings
        out = dict(estimate_memory(c, breakdown=exact or bool(want & set(BREAKDOWN_TERMS))))
    overflow = bad_results(c, out)  # results past int64 are not answers (overflow.py)
    out[OVERFLOW_KEY] = overflow
    # a row is runnable when its cluster is and its precision exists on the GPU (no bf16 on V100/T4)
    bf16 = (np.asarray(c.precision) == st.BF16_MIXED) | (np.asarray(c.precision) == st.BF16_PURE)
    usable = extra["cluster_ok"] & (extra.get("has_bf16", True) | ~bf16) & ~overflow
    out["valid"] = out["valid"] & usable
    if judged and exact:
        v = judge(out, c, bands, per_class=False, with_advice=False)
        out.update(verdict=v["verdict"], band_bytes=v["band_bytes"], margin_bytes=v["margin_bytes"],
                   risk_term=v["risk_term"])
    elif judged:
        out["verdict"] = _bounded_verdict(c, out, bands)
    if judged:
        out["verdict"] = np.where(usable, out["verdict"], DOES_NOT_FIT).astype(np.int8)
        out["fits"] = out["verdict"] == FITS
    else:
        out["fits"] = out["fits"] & usable
    out["nodes"] = extra["nodes"]
    out["gpus_per_node"] = c.gpus_per_node
    if want is not None and not (want - set(out)):
        return out
    volume = comm.comm_volume(c)
    out.update(volume)
    if want is not None and not (want - set(out)):
        return out
    links = comm.LinkRates(**{f: extra[f] for f in RATE_FIELDS})
    rates = throughput.ComputeRates(**{f: extra[f] for f in COMPUTE_FIELDS + (PEAK_FIELD,)})
    with quiet_numpy():
        out.update(throughput.step_time(c, links, rates, volume=volume))
    out["tokens_per_s_low"], out["tokens_per_s_high"] = throughput_band(out["tokens_per_s"], bands)
    return out


def _bounded_verdict(c: Columns, out: dict[str, Any], bands: AccuracyBands | None) -> np.ndarray:
    """Verdict codes from the totals; the rows they leave undecided are judged with the breakdown,
    evaluated on those rows alone (``verdict.bounded_verdict``)."""
    verdict, undecided = bounded_verdict(out, c, bands)
    shape = np.broadcast(verdict, undecided, out["peak_allocated_bytes"]).shape
    verdict = np.array(np.broadcast_to(verdict, shape))
    rows = np.flatnonzero(np.broadcast_to(undecided, shape))
    if rows.size:
        index = np.unravel_index(rows, shape)
        sub = Columns(**{f.name: _take(getattr(c, f.name), index, shape) for f in fields(Columns)})
        with quiet_numpy():
            m = estimate_memory(sub)
        m["valid"] = _take(out["valid"], index, shape)
        verdict.reshape(-1)[rows] = judge(m, sub, bands, per_class=False, with_advice=False)["verdict"]
    return verdict


def _take(a, index: tuple[np.ndarray, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Values of a broadcastable array at flat positions of ``shape`` (without broadcasting it)."""
    a = np.asarray(a)
    a = a.reshape((1,) * (len(shape) - a.ndim) + a.shape)
    return a[tuple(i if n > 1 else np.zeros_like(i) for i, n in zip(index, a.shape))]


class _Progress:
    """A one-line stderr bar, redrawn at most ten times a second."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < self.total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / max(self.total, 1)
        rate = done / max(now - self.t0, 1e-9)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\rsweep [{bar:<30}] {frac:6.1%} {done:,}/{self.total:,} rows, {rate / 1e6:.2f} M rows/s")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _label_dtype(n: int):
    return np.int8 if n < 127 else np.int16 if n < 32767 else np.int32


def _column_names(columns, available: Sequence[str]) -> list[str]:
    if columns is None or columns == "all":
        return list(available)
    if columns == "summary":
        return [c for c in SUMMARY_COLUMNS if c in available]
    if not isinstance(columns, (str, list, tuple)) or not all(isinstance(c, str) for c in
                                                              ([columns] if isinstance(columns, str) else columns)):
        raise ShardplanError("columns", _shown(columns), "expected 'all', 'summary', or column names")
    wanted = [c.strip() for c in columns.split(",") if c.strip()] if isinstance(columns, str) else list(columns)
    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise ShardplanError("columns", ",".join(unknown), f"unknown; available: {', '.join(available)}")
    return wanted


def sweep(
    models: Any = "llama-3.1-8b",
    gpus: Any = "h100-sxm",
    gpu_counts: Any = 8,
    nodes: Any = None,
    strategies: Any = None,
    engines: Any = "fsdp2",
    precision: Any = "bf16-mixed",
    optimizer: Any = "adamw",
    ac: Any = "none",
    micro_batch: Any = 1,
    seq_len: Any = 1024,
    offload: Any = "none",
    method: Any = "full",
    lora_rank: Any = 16,
    *,
    lora_targets: Any = "all-linear",
    grad_accum: Any = 1,
    ac_every_k: Any = 2,
    shard_group_size: Any = None,
    attention: Any = "sdpa",
    dropout: Any = False,
    reduce_dtype: Any = None,
    stack: Any = "hf",
    logits_fp32: Any = None,
    ce_chunks: Any = None,
    optimizer_in_backward: Any = None,
    activation_offload: Any = None,
    fp32_master: Any = None,
    paged_optimizer: Any = None,
    lora_dropout: Any = None,
    reentrant_checkpointing: Any = None,
    quant_state_sharded: Any = None,
    quant_format: Any = None,
    load_mode: Any = None,
    checkpoint_wrapper: Any = None,
    sync_every_micro_batch: Any = None,
    intra_link: str | None = None,
    inter_link: str | None = None,
    host_ram: str | int | None = None,
    columns: Any = None,
    valid_only: bool = False,
    bands: AccuracyBands | None = None,
    chunk_size: int = DEFAULT_CHUNK_ROWS,
    progress: bool | None = None,
    max_configurations: int = MAX_SWEEP_CONFIGURATIONS,
) -> pd.DataFrame:
    """Evaluate every configuration of the product of the knobs given; one DataFrame row each.

    Every knob takes a scalar or a list/range. ``gpu_counts`` is the total GPU count; ``nodes``
    None lays it out on the GPU's usual node size (as ``parse_gpus('16xh100-sxm')`` does), an
    integer spreads it over that many nodes. Counts that cannot be laid out (12 GPUs in 8-GPU
    nodes) give rows with ``valid`` False. ``strategies`` None sweeps all eight; combinations an
    engine cannot express have ``valid`` False (``valid_only=True`` drops them).
    ``columns``: None/"all", "summary", or a list of column names (the configuration labels are
    always kept). ``reduce_dtype`` None uses each engine's default (fp32 for FSDP/DDP under mixed
    precision, 16-bit for DeepSpeed); names (fp32, bf16, fp16, param) add a ``reduce_dtype`` axis.
    ``stack`` (default "hf"; a list adds a ``stack`` column) fills the stack knobs (``ce_chunks``,
    ``optimizer_in_backward``, ``load_mode``, ...) that are left None from each stack's profile
    (one-GPU rows take its ``single_gpu`` values); the other knobs keep the values given here.
    ``progress`` None: a stderr bar when stderr is a terminal and the sweep is big. ``bands``: the
    verdict's band data (default the built-in ``accuracy_bands.json``; ``load_bands().with_overlay``
    for a calibration's). ``fits`` / ``verdict`` are the verdict's (peak + band under capacity);
    ``band_bytes``, ``margin_bytes``, ``risk_term`` by name or with "all". ``sync_every_micro_batch``
    None: gradients reduced every micro-batch (the engines' default); False (or [True, False]) holds
    the unsharded gradients until the last micro-batch (no_sync), counted in the memory columns.
    ``max_configurations`` (default ``limits.MAX_SWEEP_CONFIGURATIONS``, 10^7): the DataFrame is held
    in memory (~765 B a row with all columns), so a larger product is refused before anything is
    evaluated, naming its count; pass a larger value to allow it. Each axis holds at most
    ``limits.MAX_AXIS_VALUES`` values and the model / cluster tables ``MAX_SWEEP_TABLE_CELLS`` cells.
    """
    args = dict(models=models, gpus=gpus, gpu_counts=gpu_counts, nodes=nodes, strategies=strategies, engines=engines,
                precision=precision, optimizer=optimizer, ac=ac, micro_batch=micro_batch, seq_len=seq_len,
                offload=offload, method=method, lora_rank=lora_rank, lora_targets=lora_targets,
                grad_accum=grad_accum, ac_every_k=ac_every_k, shard_group_size=shard_group_size,
                attention=attention, dropout=dropout, reduce_dtype=reduce_dtype, stack=stack,
                logits_fp32=logits_fp32, ce_chunks=ce_chunks, optimizer_in_backward=optimizer_in_backward,
                activation_offload=activation_offload, fp32_master=fp32_master, paged_optimizer=paged_optimizer,
                lora_dropout=lora_dropout, reentrant_checkpointing=reentrant_checkpointing,
                quant_state_sharded=quant_state_sharded, quant_format=quant_format, load_mode=load_mode,
                checkpoint_wrapper=checkpoint_wrapper, sync_every_micro_batch=sync_every_micro_batch)
    from shardplan.support.limits import checked_int

    link_options = dict(intra_link=intra_link, inter_link=inter_link,
                        host_ram_bytes_per_node=(parse_capacity_bytes(host_ram, "host_ram") if isinstance(host_ram, str)
                                                 else None if host_ram is None else checked_int("host_ram", host_ram)))
    chunk_size = bounded_int(chunk_size, "chunk_size", 1, MAX_SWEEP_CONFIGURATIONS)
    max_configurations = bounded_int(max_configurations, "max_configurations", 1, 10**12)
    args = {name: _bounded_axis(name, value) for name, value in args.items()}
    plan = _plan(args, link_options, max_configurations)
    total = plan.rows
    show = (sys.stderr.isatty() and total >= 2 * DEFAULT_CHUNK_ROWS) if progress is None else bool(progress)
    bar = _Progress(total, show)

    label_cols = [AXIS_COLUMN[a] for a in AXES
                  if not (a == "nodes" or (a in ("shard_group_size", "reduce_dtype", "sync_every_micro_batch") + STACK_KNOB_AXES
                                           and plan.axis(a).labels == (None,)))]
    store: dict[str, np.ndarray | list] = {}
    names: list[str] | None = None
    want: set[str] | None = None
    keep_lists = valid_only
    overflow_rows = 0

    for start, index, grid in _chunks(plan.shape, int(chunk_size)):
        ix, grid = _axis_index(index, plan)
        n = math.prod(grid)
        c, extra = _chunk_columns(plan, ix)
        out = evaluate_columns(c, extra, want, bands)
        overflow_rows += int(np.count_nonzero(np.broadcast_to(out.pop(OVERFLOW_KEY), grid)))
        if names is None:
            available = ["gpus_per_node", "nodes"] + [k for k in out if k not in ("gpus_per_node", "nodes", "world_size")]
            names = _column_names(columns, available)
            want = set(names) | {"valid"}
            for name in names:
                store[name] = [] if keep_lists else _empty(out[name], total)
            if keep_lists:  # with valid_only the labels are gathered per chunk; otherwise tiled at the end
                for a in AXES:
                    if AXIS_COLUMN[a] in label_cols:
                        store["__ix_" + a] = []
        mask = np.broadcast_to(out["valid"], grid).ravel() if valid_only else None

        def put(key: str, value, dtype=None):
            value = np.broadcast_to(np.asarray(value, dtype=dtype), grid)
            if keep_lists:
                store[key].append(value.ravel()[mask] if mask is not None else value.ravel())
            else:
                np.copyto(store[key][start:start + n].reshape(grid), value, casting="unsafe")

        for name in names:
            put(name, out[name])
        for a in AXES:
            if keep_lists and AXIS_COLUMN[a] in label_cols:
                put("__ix_" + a, ix[a], dtype=_label_dtype(plan.axis(a).size))
        bar.update(start + n)

    frame: dict[str, Any] = {}
    for a in AXES:
        col = AXIS_COLUMN[a]
        if col not in label_cols:
            continue
        axis = plan.axis(a)
        if keep_lists:
            codes = np.concatenate(store.pop("__ix_" + a))
        else:
            codes = _tiled_codes(plan.shape, AXES.index(a), _label_dtype(axis.size))
        if a in LABEL_AXES:
            frame[col] = pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(list(axis.labels)), validate=False)
        elif a == "gpu_counts":
            frame[col] = axis.codes[codes]
        else:
            frame[col] = np.asarray(axis.labels)[codes]
    for name in names or []:
        values = store[name]
        values = np.concatenate(values) if keep_lists else values
        if name in CODED_COLUMNS:
            frame[name] = pd.Categorical.from_codes(values.astype(np.int8), categories=list(CODED_COLUMNS[name]))
        else:
            frame[name] = values
    df = pd.DataFrame(frame, copy=False)
    df.attrs["notes"] = plan.cluster_notes + ([f"{overflow_rows:,} rows: {OVERFLOW_NOTE}"] if overflow_rows else [])
    return df


def _tiled_codes(shape: tuple[int, ...], i: int, dtype) -> np.ndarray:
    """Index along axis ``i`` of every row of the C-ordered product: a repeat then a tile."""
    stride = math.prod(shape[i + 1:])
    period = np.repeat(np.arange(shape[i], dtype=dtype), stride)
    return np.tile(period, math.prod(shape[:i]))


def _empty(value, total: int) -> np.ndarray:
    return np.empty(total, dtype=np.asarray(value).dtype)


# --- helpers on a sweep's DataFrame --------------------------------------------------------------
def pareto(df: pd.DataFrame, x: str = "device_total_bytes", y: str = "tokens_per_s", *, minimize_x: bool = True,
           maximize_y: bool = True, by: str | Sequence[str] | None = None, only_fitting: bool = True) -> pd.DataFrame:
    """Rows no other row beats on both ``x`` and ``y`` (default: less memory, more tokens/s),
    sorted by ``x``; per group of ``by`` when given. Rows that do not fit are left out unless
    ``only_fitting`` is False."""
    for col in (x, y):
        if col not in df.columns:
            raise ShardplanError("pareto", col, f"no such column; have {', '.join(map(str, df.columns))}")
    data = df[df["fits"]] if only_fitting and "fits" in df.columns else df
    if by is not None:
        keys = [by] if isinstance(by, str) else list(by)
        parts = [_front(g, x, y, minimize_x, maximize_y) for _, g in data.groupby(keys, observed=True, sort=False)]
        return pd.concat(parts) if parts else data.iloc[:0]
    return _front(data, x, y, minimize_x, maximize_y)


def _front(data: pd.DataFrame, x: str, y: str, minimize_x: bool, maximize_y: bool) -> pd.DataFrame:
    xs = data[x].to_numpy(dtype=np.float64) * (1 if minimize_x else -1)
    ys = data[y].to_numpy(dtype=np.float64) * (1 if maximize_y else -1)
    ok = ~(np.isnan(xs) | np.isnan(ys))
    pos = np.flatnonzero(ok)
    order = pos[np.lexsort((-ys[pos], xs[pos]))]      # x ascending, best y first among equal x
    best = np.maximum.accumulate(ys[order])
    previous = np.concatenate(([-np.inf], best[:-1]))
    keep = order[ys[order] > previous]
    return data.iloc[keep]


def minimum_gpus(df: pd.DataFrame, by: str | Sequence[str] = ("model", "strategy")) -> pd.DataFrame:
    """Smallest ``world_size`` at which each group (default model × strategy) has a fitting row;
    ``<NA>`` where none fits. Add other labels (``gpu``, ``method``, ``seq_len``) to ``by`` to
    split further."""
    keys = [by] if isinstance(by, str) else list(by)
    world = df["world_size"].where(df["fits"].astype(bool))
    result = world.groupby([df[k] for k in keys], observed=True, sort=True).min()
    return result.astype("Int64").rename("minimum_gpus").reset_index()


__all__ = ["sweep", "pareto", "minimum_gpus", "evaluate_columns", "SUMMARY_COLUMNS", "MEMORY_COLUMNS"]
