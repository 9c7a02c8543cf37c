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

import types
from dataclasses import fields
from typing import Any, Sequence

import numpy as np

from shardplan.formulas import comm, scalar_twin, throughput
from shardplan.formulas import verdict as verdict_module
from shardplan.formulas.accuracy_bands import AccuracyBands
from shardplan.formulas.comm import link_rates
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.throughput import compute_rates
from shardplan.formulas.verdict import DOES_NOT_FIT, FITS, judge
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
    with quiet_numpy():  # overflowed rows are judged by the guard, never shown as warnings
        m = estimate_memory(c)
        verdict = judge(m, c, bands)
    out = {**m, **time_columns(c, cluster, sync, calibration, bands), **verdict, "fits": verdict["verdict"] == FITS}
    overflow = bad_results(c, out)  # an overflowed row is not a candidate (overflow.py)
    out["overflow"] = overflow
    out["valid"] = out["valid"] & ~overflow
    out["fits"] = out["fits"] & ~overflow
    out["verdict"] = np.where(overflow, DOES_NOT_FIT, out["verdict"]).astype(np.asarray(out["verdict"]).dtype)
    return out


def time_columns(c: Columns, cluster: Cluster, sync=None, calibration=None,
                 bands: AccuracyBands | None = None) -> dict[str, np.ndarray]:
    """Communication volume and time, step time, tokens/s (with its band, ``*_low`` / ``*_high``) and
    MFU of every row of ``c`` on ``cluster``: nameplate link and compute rates, or a calibration's.
    ``sync``: gradients reduced every micro-batch (None: each row's ``sync_every_micro_batch``)."""
    links, rates = link_rates(cluster, calibration), compute_rates(cluster, calibration)
    with quiet_numpy():
        return _timed(_ARRAY_FORMULAS, c, links, rates, sync, bands)


# The formula modules a step time reads: the arrays' own, or their scalar twins (``_timed``).
_ARRAY_FORMULAS = types.SimpleNamespace(comm=comm, throughput=throughput, verdict=verdict_module)


def _scalar_formulas() -> types.SimpleNamespace:
    twins = scalar_twin.twin()
    return types.SimpleNamespace(**{name: twins[f"shardplan.formulas.{name}"] for name in ("comm", "throughput", "verdict")})


def _timed(formulas, c, links, rates, sync, bands) -> dict[str, Any]:
    """``time_columns`` through ``formulas`` (the arrays' modules or the twin's)."""
    volume = formulas.comm.comm_volume(c, sync)
    times = formulas.throughput.step_time(c, links, rates, sync, volume=volume)
    out = {**volume, **times, "calibrated": bool(links.calibrated or rates.calibrated)}
    for name in ("tokens_per_s", "tokens_per_s_per_gpu"):
        out[f"{name}_low"], out[f"{name}_high"] = formulas.verdict.throughput_band(times[name], bands)
    return out


_nameplate_rates = IdentityCache(64)  # the twin's (link, compute) rates per cluster


def scalar_time_columns(c: Columns, cluster: Cluster, bands: AccuracyBands | None = None) -> dict[str, Any] | None:
    """``time_columns`` of one configuration (``scalar_columns``) in Python numbers through the
    formulas' scalar twin, at nameplate rates (a calibration's per-size tables are evaluated with
    arrays), each configuration's own sync; None where Python's arithmetic raises."""
    formulas = _scalar_formulas()
    links, rates = _nameplate_rates.get(cluster, None, lambda: (formulas.comm.link_rates(cluster),
                                                                formulas.throughput.compute_rates(cluster)))
    try:
        return _timed(formulas, c, links, rates, None, bands)
    except SCALAR_ARITHMETIC_ERRORS:
        return None


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

    return resolved_query_values(spec, cluster, resolved_fields(config, cluster.world_size))


def resolved_query_values(spec: ModelSpec, cluster: Cluster, fields) -> dict[str, Any]:
    """``query_values`` of a configuration its stack has resolved already (``stacks.resolved_fields``)."""
    return {**cached_model_values(spec, fields.lora_rank, fields.lora_targets),
            **_per_cluster.get(cluster, None, lambda: cluster_values(cluster)), **resolved_knob_values(fields, cluster)}


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
                   bands: AccuracyBands | None = None, *, time: bool = False, calibration=None) -> dict[str, Any]:
    """Memory and verdict of ONE configuration as Python numbers: the columns ``evaluate_queries``
    gives (and ``overflow``), through the formulas' scalar twin (no arrays: ~15x faster than a
    one-row batch) from a process's second single query on (``scalar_twin_pays``); the first, and
    a configuration whose Python arithmetic raises, go through the arrays. ``time``: also the
    ``time_columns`` (step time, tokens/s with its band, MFU, communication) at nameplate rates,
    or ``calibration``'s (an overlay, ``calibrate.overlay.load_calibration``: its per-size tables
    are evaluated with arrays)."""
    values = query_values(*_checked_query((spec, cluster, config)))
    one = None if time and calibration is not None else scalar_evaluation(values, allocator, bands)
    if one is not None:
        c, m, verdict, overflow = one
        times = checked_scalar_time_columns(c, cluster, bands) if time else {"overflow": False}
        if times is not None:
            return {**m, **verdict, **times, "overflow": overflow or times["overflow"]}
    c = stack_queries([values])
    m, verdict, overflow = memory_verdict(c, allocator, bands)
    times = checked_time_columns(c, cluster, calibration, bands) if time else {"overflow": False}
    return rows_of({**m, **verdict, **times, "overflow": overflow | times["overflow"]}, 1)[0]


def query_time(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, calibration=None,
               bands: AccuracyBands | None = None) -> dict[str, Any]:
    """The ``time_columns`` of ONE configuration as Python numbers, and ``overflow`` (the guard on
    its inputs and times): through the scalar twin at nameplate rates once it pays
    (``scalar_twin_pays``), else (a calibration, a process's first query, arithmetic Python
    refuses) as a one-row batch."""
    values = query_values(*_checked_query((spec, cluster, config)))
    if calibration is None and scalar_twin_pays():
        times = checked_scalar_time_columns(scalar_columns(values), cluster, bands)
        if times is not None:
            return times
    return rows_of(checked_time_columns(stack_queries([values]), cluster, calibration, bands), 1)[0]


def checked_scalar_time_columns(c: Columns, cluster: Cluster, bands) -> dict[str, Any] | None:
    """``scalar_time_columns`` with ``overflow`` (the twin's guard on its inputs and times), or None
    (evaluate it with arrays)."""
    times = scalar_time_columns(c, cluster, bands)
    if times is None:
        return None
    return {**times, "overflow": bool(scalar_twin.module("support.overflow").bad_results(c, times))}


def checked_time_columns(c: Columns, cluster: Cluster, calibration, bands) -> dict[str, Any]:
    """``time_columns`` of ``c``'s rows (each its own sync) with ``overflow`` (the guard on their
    inputs and times)."""
    times = time_columns(c, cluster, None, calibration, bands)
    return {**times, "overflow": bad_results(c, times)}


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
