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

from shardplan.formulas import comm, throughput
from shardplan.formulas.accuracy_bands import AccuracyBands
from shardplan.formulas.columns import Columns, cluster_values, model_values
from shardplan.formulas.comm import link_rates
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.overflow import bad_results, quiet_numpy
from shardplan.formulas.throughput import compute_rates
from shardplan.formulas.verdict import DOES_NOT_FIT, FITS, judge, throughput_band
from shardplan.inputs import time_calibration
from shardplan.inputs.config import TrainingConfig, resolved_knob_values
from shardplan.inputs.hardware import Cluster, gpu_family
from shardplan.inputs.model import ModelSpec
from shardplan.support.errors import ShardplanError, require_type, safe_repr
from shardplan.support.identity_cache import IdentityCache
from shardplan.support.limits import INT_RANGES


def evaluate_grid(c: Columns, sync, cluster: Cluster, calibration=None,
                  bands: AccuracyBands | None = None) -> dict[str, np.ndarray]:
    """Memory, communication and time for every row, each computed once over the whole grid.
    ``fits`` is the verdict's (peak + band under capacity; shardplan/formulas/verdict.py), the no_sync
    gradients counted in the peak by ``estimate_memory``; tokens/s carries its band (``*_low`` / ``*_high``)."""
    with quiet_numpy():  # overflowed rows are judged by the guard, never shown as warnings
        m = estimate_memory(c)
        verdict = judge(m, c, bands)
    out = {**m, **time_columns(c, cluster, sync, calibration, bands, memory=m), **verdict, "fits": verdict["verdict"] == FITS}
    overflow = bad_results(c, out)  # an overflowed row is not a candidate (overflow.py)
    out["overflow"] = overflow
    out["valid"] = out["valid"] & ~overflow
    out["fits"] = out["fits"] & ~overflow
    out["verdict"] = np.where(overflow, DOES_NOT_FIT, out["verdict"]).astype(np.asarray(out["verdict"]).dtype)
    return out


def time_columns(c: Columns, cluster: Cluster, sync=None, calibration=None,
                 bands: AccuracyBands | None = None, memory=None,
                 window_factor: float | None = None) -> dict[str, np.ndarray]:
    """Communication volume and time, step time, tokens/s (with its band, ``*_low`` / ``*_high``) and
    MFU of every row of ``c`` on ``cluster``: nameplate link and compute rates, or a calibration's.
    ``sync``: gradients reduced every micro-batch (None: each row's ``sync_every_micro_batch``).
    ``memory``: the rows' ``estimate_memory`` columns where the caller has them (the paged optimizer
    states the device cannot hold cost step time); computed here otherwise. ``window_factor``: the
    GPU seconds' factor (None: the calibrated one answers use, ``time_calibration.window_factor``; 1:
    kernel rates, a warm GPU's fastest step)."""
    k = time_calibration.window_factor(window_factor)
    links, rates = link_rates(cluster, calibration), compute_rates(cluster, calibration, window_factor=k)
    with quiet_numpy():
        memory = estimate_memory(c, breakdown=False) if memory is None else memory
        return _timed(c, links, rates, sync, bands, memory, gpu_family(cluster.gpu.name))


def _timed(c, links, rates, sync, bands, memory, family=None) -> dict[str, Any]:
    """``time_columns`` of ``c`` at the given link and compute rates; the tokens/s band is the one
    for the GPU ``family`` (``verdict.throughput_band``)."""
    volume = comm.comm_volume(c, sync)
    times = throughput.step_time(c, links, rates, sync, volume=volume, memory=memory)
    out = {**volume, **times, "calibrated": bool(links.calibrated or rates.calibrated)}
    for name in ("tokens_per_s", "tokens_per_s_per_gpu"):
        out[f"{name}_low"], out[f"{name}_high"] = throughput_band(times[name], bands, family)
    return out


# --- single configurations, as rows of one vectorized evaluation ---------------------------------
_per_model = IdentityCache(64)     # model values per (spec, LoRA rank, targets)
_per_cluster = IdentityCache(64)   # cluster values per cluster


def cached_model_values(spec: ModelSpec, lora_rank: int = 16, lora_targets: str = "all-linear") -> dict[str, Any]:
    """``config.model_values`` of one model, computed once per (spec, rank, targets): it walks
    every parameter tensor (padding groups, NF4 quant_state sizes), the same for every query about
    that model (a spec is a frozen model: ``support/identity_cache.py``)."""
    return _per_model.get(spec, (lora_rank, lora_targets), lambda: model_values(revalidated(spec), lora_rank, lora_targets))


def revalidated(model):
    """``model`` after its schema's checks, or the one-line error: a frozen pydantic object can hold
    unchecked values (``spec.model_copy(update={"num_layers": 0})`` does not validate), which the
    formulas would turn into numbers. Run once per object (the callers cache per object)."""
    from pydantic import ValidationError

    from shardplan.support.errors import from_validation_error

    try:
        type(model).model_validate(dict(model.__dict__))
    except ValidationError as err:
        raise from_validation_error(err) from None
    return model


# knobs a TrainingConfig built without validation can hold out of range (model_copy(update=...)):
# checked on every query, cheaply, against the one table of ranges (limits.INT_RANGES)
_CHECKED_KNOBS = ("seq_len", "micro_batch", "grad_accum", "lora_rank", "ac_every_k", "ce_chunks", "shard_group_size")


def checked_knobs(fields) -> None:
    """A one-line error for an integer knob of ``fields`` that is not an integer in its range."""
    for name in _CHECKED_KNOBS:
        value = getattr(fields, name, None)
        if value is None:
            continue
        lo, hi = INT_RANGES[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
            raise ShardplanError(name, safe_repr(value)[:40], f"must be an integer from {lo:,} to {hi:,}")


def query_values(spec: ModelSpec, cluster: Cluster, config: TrainingConfig) -> dict[str, Any]:
    """The numbers the formulas read for one configuration (knobs it leaves unstated from its
    stack, ``stacks.resolve_stack``): ``config.columns_for``'s values, model part cached."""
    from shardplan.inputs.stacks import resolved_fields

    return resolved_query_values(spec, cluster, resolved_fields(config, cluster.world_size))


def resolved_query_values(spec: ModelSpec, cluster: Cluster, fields) -> dict[str, Any]:
    """``query_values`` of a configuration its stack has resolved already (``stacks.resolved_fields``)."""
    checked_knobs(fields)
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
    lists = {k: _as_list(np.asarray(v), n) for k, v in columns.items()}
    return [{k: values[i] for k, values in lists.items()} for i in range(n)]


def _as_list(a: np.ndarray, n: int) -> list:
    """A column of ``n`` rows as a list of Python scalars (a 0-d or one-element column repeated:
    cheaper than ``np.broadcast_to``, which a one-row answer would pay for each of ~90 columns)."""
    if a.shape == (n,):
        return a.tolist()
    if a.size == 1:
        return [a.reshape(-1)[0].item()] * n
    return np.broadcast_to(a, (n,)).tolist()


def memory_verdict(c: Columns, allocator=None, bands: AccuracyBands | None = None,
                   per_class: bool = True) -> tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray]:
    """``estimate_memory``, the verdict (``verdict.judge``: peak + band under capacity) and the
    overflow mask (``overflow.bad_results``: rows whose results passed int64) of every row of ``c``."""
    with quiet_numpy():  # overflowed rows are marked by the mask, never shown as warnings
        m = estimate_memory(c, allocator=allocator)
        verdict = judge(m, c, bands, per_class=per_class)
    return m, verdict, bad_results(c, m)


def evaluate_query(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, allocator=None,
                   bands: AccuracyBands | None = None, *, time: bool = False, calibration=None) -> dict[str, Any]:
    """Memory and verdict of ONE configuration as Python numbers: a one-row ``evaluate_queries``
    (the same formulas, the same columns, and ``overflow``). ``time``: also the ``time_columns``
    (step time, tokens/s with its band, MFU, communication) at nameplate rates, or
    ``calibration``'s (an overlay, ``calibrate.overlay.load_calibration``)."""
    c = stack_queries([query_values(*_checked_query((spec, cluster, config)))])
    m, verdict, overflow = memory_verdict(c, allocator, bands)
    times = checked_time_columns(c, cluster, calibration, bands, memory=m) if time else {"overflow": False}
    return rows_of({**m, **verdict, **times, "overflow": overflow | times["overflow"]}, 1)[0]


def checked_time_columns(c: Columns, cluster: Cluster, calibration, bands, memory=None,
                         window_factor=None) -> dict[str, Any]:
    """``time_columns`` of ``c``'s rows (each its own sync) with ``overflow`` (the guard on their
    inputs and times)."""
    times = time_columns(c, cluster, None, calibration, bands, memory, window_factor)
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
    require_query_types(spec, cluster, config)
    return spec, cluster, config


# How a user builds each argument, by the public names (``import shardplan``; docs/api.md), for
# the one-line error an argument of the wrong type gets.
BUILT_WITH = {ModelSpec: "shardplan.resolve_model(NAME).spec", Cluster: "shardplan.parse_gpus('8xh100-sxm')",
              TrainingConfig: "shardplan.TrainingConfig(...)"}


def require_query_types(spec, cluster, config, config_field: str = "config") -> None:
    """A public entry point's (spec, cluster, config) by type: the one error type, naming the
    argument and the public call that builds it, not a TypeError inside a formula."""
    for value, expected, field in ((spec, ModelSpec, "spec"), (cluster, Cluster, "cluster"),
                                   (config, TrainingConfig, config_field)):
        require_type(value, expected, field, BUILT_WITH[expected])
