"""A sweep's product in chunks: each chunk's ``Columns`` (fields shaped only along the axes they
vary with, so numpy works at the size each intermediate really needs) and its evaluation
(memory, verdict, communication and step time, computed only as far as the wanted columns need)."""

from __future__ import annotations

import itertools
import math
from dataclasses import fields
from typing import Any, Iterator

import numpy as np

from shardplan.formulas import comm, throughput
from shardplan.formulas.accuracy_bands import AccuracyBands
from shardplan.formulas.columns import MODEL_FIELDS, STACK_COLUMN_DEFAULTS, Columns, untied_head_values
from shardplan.formulas.memory import BREAKDOWN_TERMS, estimate_memory
from shardplan.formulas.overflow import bad_results, quiet_numpy
from shardplan.formulas.verdict import DOES_NOT_FIT, FITS, bounded_verdict, judge, throughput_band
from shardplan.inputs import strategy as st
from shardplan.planning.sweep_axes import AXES, CATEGORICAL_KNOBS, INTEGER_KNOBS, STACK_KNOB_AXES, STACK_KNOB_NAMES
from shardplan.planning.sweep_plan import CLUSTER_FIELDS, COMPUTE_FIELDS, PEAK_FIELD, RATE_FIELDS, SweepPlan

# The verdict's columns (shardplan/formulas/verdict.py): ``fits`` is the verdict's too (peak + band under capacity).
VERDICT_COLUMNS = ("verdict", "band_bytes", "margin_bytes", "risk_term")
OVERFLOW_KEY = "_overflow"  # evaluate_columns' per-row overflow mask (popped by sweep; counted in a note)


class _LazyStackTables(dict):
    """``stacks.stack_tables`` for one-GPU (True) and multi-GPU (False) rows, loaded on first use."""

    def __missing__(self, single: bool):
        from shardplan.inputs.stacks import stack_tables

        self[single] = stack_tables(single)
        return self[single]


# stack knobs whose table values are not on/off: the named-value ones (STACK_KNOB_NAMES: codes) and these
NON_BOOL_STACK_KNOBS = ("lora_dropout", "ce_chunks", "fp32_master")
_STACK_TABLES = _LazyStackTables()


class _PeakByPrecision:
    """``ComputeRates.peak_flops_by_precision`` for many GPUs at once: ``throughput.step_time``
    indexes it with the precision codes (``peak[c.precision]``), which for a single GPU is a
    4-vector; here the lookup is [cluster cell, precision], broadcast like every other column."""

    def __init__(self, table: np.ndarray, cell: tuple):
        self.table, self.cell = table, cell

    def __getitem__(self, precision):
        return self.table[self.cell + (np.asarray(precision),)]


def chunks(shape: tuple[int, ...], chunk_rows: int) -> Iterator[tuple[int, list, tuple[int, ...]]]:
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


def axis_index(index: list, plan: SweepPlan) -> tuple[dict[str, Any], tuple[int, ...]]:
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


def chunk_columns(plan: SweepPlan, ix: dict[str, Any]) -> tuple[Columns, dict[str, Any]]:
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
            if arg not in (*STACK_KNOB_NAMES, *NON_BOOL_STACK_KNOBS):
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
    extra = {f: plan.cluster_table[f][cl] for f in RATE_FIELDS + COMPUTE_FIELDS + ("nodes", "cluster_ok", "has_bf16", "gpu_family")}
    extra[PEAK_FIELD] = _PeakByPrecision(plan.cluster_table[PEAK_FIELD], cl)
    values = {**STACK_COLUMN_DEFAULTS, **values}  # knob columns the sweep does not vary
    values.update(untied_head_values(values))  # as Columns.build does (columns.completed_values)
    return Columns(**{f.name: values[f.name] for f in fields(Columns)}), extra


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
        out.update(throughput.step_time(c, links, rates, volume=volume, memory=out))
    out["tokens_per_s_low"], out["tokens_per_s_high"] = throughput_band(out["tokens_per_s"], bands, extra["gpu_family"])
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
        verdict.reshape(-1)[rows] = judge(m, sub, bands, per_class=False, with_advice=False, with_risk=False)["verdict"]
    return verdict


def _take(a, index: tuple[np.ndarray, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Values of a broadcastable array at flat positions of ``shape`` (without broadcasting it)."""
    a = np.asarray(a)
    a = a.reshape((1,) * (len(shape) - a.ndim) + a.shape)
    return a[tuple(i if n > 1 else np.zeros_like(i) for i, n in zip(index, a.shape))]
