"""The evaluator the capacity query (``planning/fit.py``) and the search (``planning/planner.py``)
share: ``Columns`` in, memory + communication + time + verdict arrays out.

Single configurations go through the same vectorized formulas as the planner's grid and the
sweep's chunks: ``query_values`` turns one (model, cluster, config) into the numbers formulas read
(the per-model part, which walks every parameter tensor, cached: it is the same for every query
about one model), ``stack_queries`` lays any number of such queries out as one ``Columns`` (one row
each), and ``memory_verdict`` / ``evaluate_queries`` evaluate them in one pass. A query about one
configuration is a one-row batch; many unrelated queries (``fit``'s alternatives, a notebook loop)
cost one formula evaluation, not one each.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Sequence

import numpy as np

from shardplan.formulas import scalar_twin
from shardplan.formulas.accuracy_bands import AccuracyBands
from shardplan.formulas.comm import comm_volume, link_rates
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.throughput import compute_rates, step_time
from shardplan.formulas.verdict import DOES_NOT_FIT, FITS, judge, throughput_band
from shardplan.inputs.config import Columns, TrainingConfig, cluster_values, model_values, resolved_knob_values
from shardplan.inputs.hardware import Cluster
from shardplan.inputs.model import ModelSpec
from shardplan.support.errors import ShardplanError, require_type, safe_repr
from shardplan.support.identity_cache import IdentityCache
from shardplan.support.overflow import bad_results, quiet_numpy


def evaluate_grid(c: Columns, sync, cluster: Cluster, calibration=None,
                  bands: AccuracyBands | None = None) -> dict[str, np.ndarray]:
    """Memory, communication and time for every row, each computed once over the whole grid.
    ``fits`` is the verdict's (peak + band under capacity; shardplan/formulas/verdict.py), the no_sync
    gradients counted in the peak by ``estimate_memory``; tokens/s carries its band (``*_low`` / ``*_high``)."""
    links, rates = link_rates(cluster, calibration), compute_rates(cluster, calibration)
    with quiet_numpy():  # overflowed rows are judged by the guard, never shown as warnings
        m = estimate_memory(c)
        v = comm_volume(c, sync)
        t = step_time(c, links, rates, sync, volume=v)
        verdict = judge(m, c, bands)
    out = {**m, **v, **t, **verdict, "fits": verdict["verdict"] == FITS,
           "calibrated": np.asarray(links.calibrated or rates.calibrated)}
    overflow = bad_results(c, out)  # an overflowed row is not a candidate (overflow.py)
    out["overflow"] = overflow
    out["valid"] = out["valid"] & ~overflow
    out["fits"] = out["fits"] & ~overflow
    out["verdict"] = np.where(overflow, DOES_NOT_FIT, out["verdict"]).astype(np.asarray(out["verdict"]).dtype)
    for name in ("tokens_per_s", "tokens_per_s_per_gpu"):
        out[f"{name}_low"], out[f"{name}_high"] = throughput_band(t[name], bands)
    return out


# --- single configurations, as rows of one vectorized evaluation ---------------------------------
_per_model = IdentityCache(64)     # model values per (spec, LoRA rank, targets)
_per_cluster = IdentityCache(64)   # cluster values per cluster


def cached_model_values(spec: ModelSpec, lora_rank: int = 16, lora_targets: str = "all-linear") -> dict[str, Any]:
    """``config.model_values`` of one model, computed once per (spec, rank, targets): it walks
    every parameter tensor (padding groups, NF4 quant_state sizes), the same for every query about
    that model (a spec is a frozen model: ``support/identity_cache.py``)."""
    return _per_model.get(spec, (lora_rank, lora_targets), lambda: model_values(spec, lora_rank, lora_targets))


def query_values(spec: ModelSpec, cluster: Cluster, config: TrainingConfig) -> dict[str, Any]:
    """The numbers the formulas read for one configuration (knobs it leaves unstated from its
    stack, ``stacks.resolve_stack``): ``config.columns_for``'s values, model part cached."""
    from shardplan.inputs.stacks import resolved_fields

    config = resolved_fields(config, cluster.world_size)
    return {**cached_model_values(spec, config.lora_rank, config.lora_targets),
            **_per_cluster.get(cluster, None, lambda: cluster_values(cluster)), **resolved_knob_values(config, cluster)}


def stack_queries(rows: Sequence[dict[str, Any]]) -> Columns:
    """``query_values`` rows as one ``Columns`` of shape (len(rows),): row i is query i."""
    if not rows:
        raise ShardplanError("queries", "[]", "no configurations: give at least one (spec, cluster, config)")
    names = rows[0].keys()
    return Columns.build(**{name: np.array([row[name] for row in rows]) for name in names})


def take_row(c: Columns, i: int) -> Columns:
    """Row ``i`` of a one-dimensional ``Columns`` as 0-d columns (a single query's own columns)."""
    return Columns(**{f.name: getattr(c, f.name)[i] for f in fields(Columns)})


def rows_of(columns: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """A result over ``n`` rows as one dict per row, of Python scalars (a column that does not
    vary, e.g. a term that is 0 for every row, broadcast first); each column converted once."""
    lists = {k: np.broadcast_to(np.asarray(v), (n,)).tolist() for k, v in columns.items()}
    return [{k: values[i] for k, values in lists.items()} for i in range(n)]


def memory_verdict(c: Columns, allocator=None, bands: AccuracyBands | None = None,
                   per_class: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray]:
    """``estimate_memory``, the verdict (``verdict.judge``: peak + band under capacity) and the
    overflow mask (``overflow.bad_results``: rows whose results passed int64) of every row of ``c``."""
    with quiet_numpy():  # overflowed rows are marked by the mask, never shown as warnings
        m = estimate_memory(c, allocator=allocator)
        verdict = judge(m, c, bands, per_class=per_class)
    return m, verdict, bad_results(c, m)


# Python's arithmetic raises where numpy's gives inf or nan with a warning (a division by zero,
# int(inf), ceil(nan)): such a configuration is evaluated again as a one-row array.
SCALAR_ARITHMETIC_ERRORS = (ArithmeticError, ValueError)


_single_queries = 0


def scalar_twin_pays() -> bool:
    """Whether this single configuration goes through the scalar twin: from the second one a process
    asks about on. Building the twin compiles the formula modules again (~8 ms from its cache beside
    the bytecode, ~0.2 s where none can be written), which a loop of queries earns back at once and
    a one-shot command (``shardplan fit ... --strategy X``) never does. The answers are the same."""
    global _single_queries
    _single_queries += 1
    return _single_queries > 1 or scalar_twin.twin.cache_info().currsize > 0


def scalar_columns(values: dict[str, Any]) -> Columns:
    """``query_values`` of one configuration as a ``Columns`` of Python numbers (``Columns.build``'s
    completion, twinned: formulas/scalar_twin.py)."""
    c = object.__new__(Columns)  # completed_values checked every field is there; its extra keys are unread
    object.__setattr__(c, "__dict__", scalar_twin.module("inputs.config").completed_values(values))  # a new dict
    return c


def scalar_memory_verdict(c: Columns, allocator=None, bands: AccuracyBands | None = None,
                          per_class: bool = True) -> tuple[dict[str, Any], dict[str, Any], bool] | None:
    """``memory_verdict`` of one configuration (``scalar_columns``) in Python numbers, through the
    formulas' scalar twin; None where Python's arithmetic raises (``SCALAR_ARITHMETIC_ERRORS``)."""
    twins = scalar_twin.twin()
    memory, verdict, overflow = (twins["shardplan.formulas.memory"], twins["shardplan.formulas.verdict"],
                                 twins["shardplan.support.overflow"])
    try:
        m = memory.estimate_memory(c, allocator=allocator)
        judged = verdict.judge(m, c, bands, per_class=per_class)
        return m, judged, bool(overflow.bad_results(c, m))
    except SCALAR_ARITHMETIC_ERRORS:
        return None


def scalar_evaluation(values: dict[str, Any], allocator=None, bands: AccuracyBands | None = None):
    """(columns, memory, verdict, overflow) of one configuration's ``query_values`` through the
    scalar twin, or None where the twin does not pay yet (``scalar_twin_pays``) or Python's
    arithmetic raises: the caller evaluates it as a one-row batch."""
    if not scalar_twin_pays():
        return None
    c = scalar_columns(values)
    one = scalar_memory_verdict(c, allocator, bands)
    return None if one is None else (c, *one)


def evaluate_query(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, allocator=None,
                   bands: AccuracyBands | None = None) -> dict[str, Any]:
    """Memory and verdict of ONE configuration as Python numbers: the columns ``evaluate_queries``
    gives (and ``overflow``), through the formulas' scalar twin (no arrays: ~15x faster than a
    one-row batch) from a process's second single query on (``scalar_twin_pays``); the first, and
    a configuration whose Python arithmetic raises, go through the arrays."""
    values = query_values(*_checked_query((spec, cluster, config)))
    one = scalar_evaluation(values, allocator, bands)
    if one is None:
        m, verdict, overflow = memory_verdict(stack_queries([values]), allocator, bands)
        return rows_of({**m, **verdict, "overflow": overflow}, 1)[0]
    _, m, verdict, overflow = one
    return {**m, **verdict, "overflow": overflow}


def evaluate_queries(queries: Sequence[tuple[ModelSpec, Cluster, TrainingConfig]], allocator=None,
                     bands: AccuracyBands | None = None) -> dict[str, np.ndarray]:
    """Memory and verdict of any number of single configurations (each its own model, cluster and
    knobs) in one vectorized pass: one array per column, element i for query i; ``overflow`` marks
    rows whose results are not answers. The same columns ``fit.evaluate`` reports one at a time."""
    if isinstance(queries, (str, bytes)) or not hasattr(queries, "__iter__"):
        raise ShardplanError("queries", safe_repr(queries)[:60], "expected a list of (spec, cluster, config) tuples")
    c = stack_queries([query_values(*_checked_query(q)) for q in queries])
    m, verdict, overflow = memory_verdict(c, allocator, bands)
    return {**m, **verdict, "overflow": overflow}


def _checked_query(query: Any) -> tuple[ModelSpec, Cluster, TrainingConfig]:
    """One (spec, cluster, config) query, by type: the one error type, not a TypeError in a formula."""
    if not isinstance(query, (tuple, list)) or len(query) != 3:
        raise ShardplanError("queries", safe_repr(query)[:60], "expected (ModelSpec, Cluster, TrainingConfig) tuples")
    spec, cluster, config = query
    require_type(spec, ModelSpec, "spec", "shardplan.inputs.models.resolve_model(NAME).spec")
    require_type(cluster, Cluster, "cluster", "shardplan.inputs.hardware.parse_gpus('8xh100-sxm')")
    require_type(config, TrainingConfig, "config", "shardplan.inputs.config.TrainingConfig(...)")
    return spec, cluster, config
