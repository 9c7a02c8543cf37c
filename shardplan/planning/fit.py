"""The capacity query: does a configuration fit, term by term, and what would make it fit.

``evaluate`` answers one configuration (a one-row sweep through ``estimate_memory``);
``fit`` answers one strategy or all of them; ``alternatives`` tries the cheapest changes.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from shardplan.formulas.accuracy_bands import BAND_CLASSES, AccuracyBands
from shardplan.formulas.columns import Columns
from shardplan.formulas.memory import BREAKDOWN_TERMS, PEAK_MOMENTS
from shardplan.formulas.model_states import trainable_params
from shardplan.formulas.overflow import check_one
from shardplan.formulas.verdict import ADVICE, PEAKS, VERDICTS
from shardplan.inputs import contradictions
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig, resolved_knob_values
from shardplan.inputs.hardware import Cluster, check_precision
from shardplan.inputs.model import ModelSpec
from shardplan.planning.evaluate import (
    cached_model_values,
    checked_time_columns,
    memory_verdict,
    query_values,
    require_query_types,
    resolved_query_values,
    rows_of,
    stack_queries,
    take_row,
)
from shardplan.support.errors import ShardplanError, safe_repr


class Alternative(BaseModel):
    model_config = ConfigDict(frozen=True)

    change: str
    fits: bool
    verdict: str
    band_bytes: int
    margin_bytes: int
    peak_allocated_bytes: int
    device_total_bytes: int
    world_size: int
    limit: str = ""
    config: dict[str, Any]


class PerGPU(BaseModel):
    model_config = ConfigDict(frozen=True)

    load_peak_bytes: int = 0        # while the weights reach the GPU (load.py), beside the training peak
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    non_torch_bytes: int
    device_total_bytes: int
    headroom_bytes: int
    peak_moment: str
    model_state_bytes: int
    breakdown: dict[str, int]


class PerNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    host_bytes: int
    host_ram_bytes: int
    host_offloaded_bytes_per_gpu: int


class FitResult(BaseModel):
    """``fits`` is the verdict's: peak + band under capacity (``verdict``, shardplan/formulas/verdict.py);
    ``fits_gpu`` compares the point estimate alone."""

    model_config = ConfigDict(frozen=True)

    fits: bool
    verdict: str
    margin_bytes: int
    band_bytes: int
    risk_term: str
    advice: str
    judged_peak: str
    judged_bytes: int
    band: dict[str, int]
    fits_gpu: bool
    fits_host: bool
    valid: bool
    strategy: str
    engine: str
    stack: str = "hf (Transformers + Trainer + PEFT + bitsandbytes)"
    fits_load: bool = True
    config: dict[str, Any]
    model: dict[str, Any]
    gpu: dict[str, Any]
    cluster: dict[str, Any]
    per_gpu: PerGPU
    per_node: PerNode
    alternatives: list[Alternative] = Field(default_factory=list)  # a new list, not a deep copy of a default
    notes: list[str] = []
    time: dict[str, float] | None = None
    # the efficiencies the step time used: name, value, status (measured / calibrated / nameplate), source
    efficiencies: list[dict[str, Any]] | None = None
    # what the published runs of the GPU's family say about the tokens/s band (ThroughputBand.evidence)
    time_band: dict[str, Any] | None = None


def check_config(spec: ModelSpec, cluster: Cluster, config: TrainingConfig) -> None:
    """Impossible configurations get a one-line error naming the field and value."""
    from shardplan.inputs.stacks import resolved_fields

    fields = resolved_fields(config, cluster.world_size)
    check_precision(cluster.gpu, fields.precision)
    knobs = resolved_knob_values(fields, cluster)
    if not bool(st.is_valid(knobs["strategy"], knobs["engine"])):
        raise ShardplanError("strategy", config.strategy, f"not expressible with engine {config.engine!r} "
                                                          f"(zero1/zero2 need --engine deepspeed)")
    st.check_world_size(config.strategy, cluster.world_size, config.shard_group_size)


def _check_arguments(spec, cluster, config) -> None:
    """The public entry points' arguments, by type: the one error type, not a TypeError inside a formula."""
    require_query_types(spec, cluster, config)


def evaluate(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, notes: list[str] | None = None,
             allocator=None, bands: AccuracyBands | None = None) -> FitResult:
    """One configuration's capacity verdict, term by term (a one-row ``evaluate_many``)."""
    return evaluate_many(spec, [(cluster, config, notes)], allocator=allocator, bands=bands)[0]


def evaluate_many(spec: ModelSpec, queries: Sequence[tuple], allocator=None,
                  bands: AccuracyBands | None = None) -> list[FitResult]:
    """``evaluate`` of several configurations of one model, (cluster, config) or (cluster, config,
    notes) each, in one vectorized pass (``planning/evaluate.py``); the same results as one call each."""
    return _evaluated(spec, queries, allocator, bands)


def _evaluated(spec: ModelSpec, queries: Sequence[tuple], allocator, bands, timed_on=None) -> list[FitResult]:
    """``evaluate_many``; with ``timed_on`` (cluster, calibration), every query on that cluster, each
    result also carries its ``time`` (``step_timings``' record), priced from the same memory columns
    (the paged optimizer's spill) and not from a second memory estimate."""
    from shardplan.inputs.stacks import resolved_fields

    if isinstance(queries, (str, bytes)) or not hasattr(queries, "__iter__"):
        raise ShardplanError("queries", safe_repr(queries)[:60], "expected a list of (cluster, config) tuples")
    queries = [_with_notes(q) for q in queries]
    if not queries:  # fit(..., strategies=[]) asks for nothing
        return []
    resolved = []  # each config's fields with its stack's knobs (read-only; no pydantic copy)
    for cluster, config, _ in queries:
        _check_arguments(spec, cluster, config)
        resolved.append(resolved_fields(config, cluster.world_size))
    values = [resolved_query_values(spec, q[0], config) for q, config in zip(queries, resolved)]
    judged = _judged_rows(values, allocator, bands, timed_on)
    results = []
    for i, ((cluster, _, notes), config) in enumerate(zip(queries, resolved)):
        if judged.overflow[i]:  # an overflowed result is an error, never a verdict
            check_one(judged.columns(i), {**judged.memory[i], **judged.time[i]}, config)
        results.append(_fit_result(spec, cluster, config, judged.memory[i], judged.verdict[i], list(notes or []),
                                   int(judged.trainable[i]), _time_record(judged.time[i]) if timed_on else None))
    return results


def _with_notes(query: Any) -> tuple[Cluster, TrainingConfig, list[str] | None]:
    """(cluster, config, notes) of a query given as (cluster, config) or (cluster, config, notes)."""
    if not isinstance(query, (tuple, list)) or len(query) not in (2, 3):
        raise ShardplanError("queries", safe_repr(query)[:60], "expected (Cluster, TrainingConfig[, notes]) tuples")
    return (query[0], query[1], query[2] if len(query) == 3 else None)


class _Judged(NamedTuple):
    """``_judged_rows``' answer: per row, its memory, verdict and time columns (empty when not
    timed) as dicts, overflow flag and trainable parameters; ``columns(i)``: row i's ``Columns``."""

    memory: list[dict[str, Any]]
    verdict: list[dict[str, Any]]
    time: list[dict[str, Any]]
    overflow: list[bool]
    trainable: list[int]
    columns: Callable[[int], Columns]


def _judged_rows(values: list[dict[str, Any]], allocator, bands, timed_on=None) -> _Judged:
    """Memory, verdict (and with ``timed_on``, (cluster, calibration), time) of ``query_values`` rows
    (one configuration or many, one vectorized batch): one memory estimate, which the time reads."""
    c = stack_queries(values)
    m, judged, overflow = memory_verdict(c, allocator, bands)
    n = len(values)
    times = checked_time_columns(c, *timed_on, bands, memory=m) if timed_on else {}
    overflow = overflow | times.get("overflow", False)
    return _Judged(rows_of(m, n), rows_of(judged, n), rows_of(times, n) if times else [{}] * n,
                   np.broadcast_to(overflow, c.shape).tolist(), np.broadcast_to(trainable_params(c), c.shape).tolist(),
                   lambda i: take_row(c, i))


def _fit_result(spec: ModelSpec, cluster: Cluster, config, row: dict[str, Any],
                verdict: dict[str, Any], notes: list[str], trainable: int, time: dict[str, float] | None = None) -> FitResult:
    """One row of the memory model and its verdict as the ``FitResult`` record (``config``: the
    configuration's fields with its stack's knobs, ``stacks.resolved_fields``)."""
    from shardplan.inputs.stacks import stack_label

    model = cached_model_values(spec, config.lora_rank, config.lora_targets)  # spec.total_params walks every block
    if not row["valid"]:
        notes.append(f"{config.strategy} with engine {config.engine}, offload {config.offload}, "
                     f"method {config.method} is not a combination the framework offers")
    return FitResult(
        fits=verdict["verdict"] == 0, verdict=VERDICTS[verdict["verdict"]], margin_bytes=verdict["margin_bytes"],
        band_bytes=verdict["band_bytes"], risk_term=BAND_CLASSES[verdict["risk_term"]], advice=ADVICE[verdict["advice"]],
        judged_peak=PEAKS[verdict["judged_peak"]], judged_bytes=verdict["judged_bytes"],
        band={k: verdict[f"band_{k}_bytes"] for k in BAND_CLASSES},
        fits_gpu=bool(row["fits_gpu"]), fits_host=bool(row["fits_host"]),
        valid=bool(row["valid"]), strategy=config.strategy, engine=config.engine,
        stack=stack_label(config.stack), fits_load=bool(row["fits_load"]),
        config=dict(vars(config)),  # every field, as resolve_stack(...).model_dump() gives them
        model={"name": spec.name, "display_name": spec.display_name, "params": model["total_params"],
               "trainable_params": trainable},
        gpu={"name": cluster.gpu.name, "memory_bytes": cluster.gpu.memory_bytes, "capacity_only": cluster.capacity_only},
        cluster={"label": cluster.label, "world_size": cluster.world_size, "gpus_per_node": cluster.gpus_per_node,
                 "nodes": cluster.nodes, "intra_link": cluster.intra_link.name, "inter_link": cluster.inter_link.name},
        per_gpu=PerGPU(
            load_peak_bytes=int(row["load_peak_bytes"]), peak_allocated_bytes=int(row["peak_allocated_bytes"]),
            peak_reserved_bytes=int(row["peak_reserved_bytes"]),
            non_torch_bytes=int(row["non_torch_bytes"]), device_total_bytes=int(row["device_total_bytes"]),
            headroom_bytes=int(row["headroom_bytes"]), peak_moment=PEAK_MOMENTS[int(row["peak_moment"])],
            model_state_bytes=int(row["model_state_bytes"]),
            breakdown={term: int(row[term]) for term in BREAKDOWN_TERMS},
        ),
        per_node=PerNode(host_bytes=int(row["host_bytes_per_node"]), host_ram_bytes=int(row["host_ram_bytes_per_node"]),
                         host_offloaded_bytes_per_gpu=int(row["host_offloaded_bytes_per_gpu"])),
        notes=notes, time=time,
    )


def limiting_resource(r: FitResult) -> str:
    """Which capacity a result exceeds, in words (empty when it fits)."""
    over = []
    if not r.fits_load:
        over.append(f"GPU memory while loading ({r.per_gpu.load_peak_bytes / 2**30:,.1f} GiB, load mode "
                    f"{r.config.get('load_mode')})")
    if not r.fits_gpu:
        over.append(f"GPU memory (over by {(-r.per_gpu.headroom_bytes) / 2**30:,.1f} GiB)")
    if not r.fits_host:
        over.append(f"host RAM ({r.per_node.host_bytes / 2**30:,.0f} of {r.per_node.host_ram_bytes / 2**30:,.0f} GiB per node)")
    return "; ".join(over)


TIME_FIELDS = ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "mfu", "hfu", "compute_s", "comm_s",
               "exposed_comm_s", "optimizer_s", "offload_transfer_s", "host_wait_s", "gemm_efficiency")
TIME_BAND_FIELDS = tuple(f"{name}_{end}" for name in ("tokens_per_s", "tokens_per_s_per_gpu") for end in ("low", "high"))


def step_timing(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, calibration=None,
                bands: AccuracyBands | None = None) -> dict[str, float]:
    """Step time, tokens/s and MFU of one configuration, with tokens/s's band (``tokens_per_s_low/high``,
    ``tokens_per_s_per_gpu_low/high``): a one-row ``step_timings`` (the formulas the planner's grid
    runs; gradients reduced as the configuration's ``sync_every_micro_batch`` says)."""
    _check_arguments(spec, cluster, config)
    return step_timings(spec, cluster, [config], calibration, bands)[0]


def step_timings(spec: ModelSpec, cluster: Cluster, configs: Sequence[TrainingConfig], calibration=None,
                 bands: AccuracyBands | None = None, window_factor: float | None = None) -> list[dict[str, float]]:
    """``step_timing`` of several configurations of one model on one cluster in one vectorized pass
    (``evaluate.checked_time_columns``; the tokens/s report predicts each published run with it).
    ``window_factor`` None: the calibrated one (``time_calibration.window_factor``)."""
    if not configs:
        return []
    c = stack_queries([query_values(spec, cluster, config) for config in configs])
    rows = rows_of(checked_time_columns(c, cluster, calibration, bands, window_factor=window_factor), len(configs))
    for i, (config, row) in enumerate(zip(configs, rows)):
        if row["overflow"]:
            check_one(take_row(c, i), row, config)  # the one-line error of an overflowed result
    return [_time_record(row) for row in rows]


def _time_record(times: dict[str, Any]) -> dict[str, float]:
    """The time columns ``step_timing`` reports, as floats."""
    return {name: float(times[name]) for name in TIME_FIELDS + TIME_BAND_FIELDS}


def default_offload(engine: str) -> str:
    """What ``engine`` usually offloads (the vocabulary's "offload auto")."""
    from shardplan.inputs.vocabulary import canonical
    return canonical("offload", "auto", engine=engine)


def _with(config: TrainingConfig, **changes: Any) -> TrainingConfig:
    return config.model_copy(update=changes)


def fewest_gpus_that_fit(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, limit: int = 4096,
                         allocator=None, bands: AccuracyBands | None = None) -> int | None:
    """Smallest GPU count (same GPU, same node size, whole nodes beyond one) at which one
    configuration fits (the verdict's rule: peak + band under capacity); None up to ``limit``."""
    return _fewest_gpus_of(spec, cluster, [config], limit, allocator, bands)[0]


def _gpu_counts(cluster: Cluster, limit: int) -> np.ndarray:
    """The GPU counts tried: 1, 2, 4, 8 within a node, then whole nodes up to ``limit``."""
    counts = [n for n in (1, 2, 4, 8) if n <= cluster.gpus_per_node] if cluster.gpus_per_node < 8 else [1, 2, 4, 8]
    counts += [cluster.gpus_per_node * k for k in range(1, limit // cluster.gpus_per_node + 1)]
    return np.array(sorted(set(c for c in counts if c <= limit)))


# GPU counts are searched in stages up to these bounds: the first fitting count of a stage is the
# answer, so a configuration that fits on a few nodes is not evaluated at a thousand counts.
COUNT_STAGES = (64, 512)


def _fewest_gpus_of(spec: ModelSpec, cluster: Cluster, configs: Sequence[TrainingConfig], limit: int = 4096,
                    allocator=None, bands: AccuracyBands | None = None) -> list[int | None]:
    """``fewest_gpus_that_fit`` of several configurations: per stage of counts (``COUNT_STAGES``),
    one evaluation of the configurations still without an answer at every count of the stage."""
    if not configs:
        return []
    world = _gpu_counts(cluster, limit)
    rows = stack_queries([query_values(spec, cluster, config) for config in configs])  # row i: configs[i]
    found: list[int | None] = [None] * len(configs)
    pending, low = list(range(len(configs))), 0
    for high in (*COUNT_STAGES, max(limit, 1)):
        counts = world[(world > low) & (world <= high)]
        low = high
        if not pending or not counts.size:
            continue
        fits = _fits_at(rows, pending, cluster, counts, allocator, bands)
        for i, row in zip(pending, fits):
            found[i] = int(counts[row][0]) if row.any() else None
        pending = [i for i in pending if found[i] is None]
    return found


def _fits_at(rows: Columns, which: list[int], cluster: Cluster, counts: np.ndarray, allocator=None,
             bands: AccuracyBands | None = None) -> np.ndarray:
    """Whether each configuration ``which`` (rows of ``rows``, one per configuration) fits at each
    GPU count: [configuration, count]. The configurations are a column axis and the counts a row
    axis, each field shaped only along the axis it varies with (as the sweep lays its product
    out), so numpy works at the size each needs."""
    c = {f.name: np.broadcast_to(getattr(rows, f.name), rows.shape)[which].reshape(-1, 1) for f in fields(Columns)}
    c["world_size"] = counts.reshape(1, -1)
    c["gpus_per_node"] = np.minimum(counts, cluster.gpus_per_node).reshape(1, -1)
    c["shard_group_size"] = np.minimum(c["shard_group_size"], c["world_size"])
    _, judged, overflow = memory_verdict(Columns(**c), allocator, bands, per_class=False)
    return np.broadcast_to((judged["verdict"] == 0) & ~overflow, (len(which), counts.size))


def minimum_gpus(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, limit: int = 4096,
                 allocator=None, bands: AccuracyBands | None = None) -> int | None:
    """Deprecated name of ``fewest_gpus_that_fit`` (``shardplan.minimum_gpus`` is the sweep's
    per-group table, ``sweep_analysis.fewest_gpus_per_group``)."""
    import warnings

    warnings.warn("shardplan.planning.fit.minimum_gpus is now fewest_gpus_that_fit", DeprecationWarning, stacklevel=2)
    return fewest_gpus_that_fit(spec, cluster, config, limit, allocator, bands)


def _same_training_changes(config: TrainingConfig) -> list[tuple[str, TrainingConfig]]:
    """Changes that keep the training identical: checkpointing, a smaller micro-batch with more
    accumulation, sharding, offload (with checkpointing)."""
    candidates: list[tuple[str, TrainingConfig]] = []
    if config.ac != "full":
        candidates.append(("activation checkpointing (--ac full)", _with(config, ac="full")))
    if config.micro_batch > 1:
        candidates.append((f"micro-batch 1 with {config.micro_batch}x gradient accumulation",
                           _with(config, micro_batch=1, grad_accum=config.grad_accum * config.micro_batch)))
    if config.strategy != "full_shard":
        candidates.append(("full sharding (--strategy full_shard)", _with(config, strategy="full_shard",
                                                                          engine="fsdp2" if config.strategy in ("zero1", "zero2") else config.engine)))
    sharded = _sharded(config)
    if config.offload == "none":
        candidates.append((f"CPU offload (--offload {default_offload(config.engine)}, --strategy {sharded})",
                           _with(config, strategy=sharded, offload=default_offload(config.engine))))
        candidates.append(("CPU offload + activation checkpointing",
                           _with(config, strategy=sharded, offload=default_offload(config.engine), ac="full")))
    return candidates


def _sharded(config: TrainingConfig) -> str:
    """The config's strategy, or full_shard where it shards nothing at rest."""
    return "full_shard" if config.strategy in ("ddp", "no_shard", "zero1", "zero2", "single") else config.strategy


def _method_changes(config: TrainingConfig, cluster: Cluster) -> list[tuple[str, TrainingConfig]]:
    """LoRA / QLoRA (with checkpointing); where the run leaves ``use_cache`` on under a
    non-reentrant checkpoint wrapper, also each with ``use_cache=False``, which frees the KV cache
    every finished block keeps (memory.kv_cache_leftover_bytes)."""
    from shardplan.inputs.stacks import resolve_stack

    sharded = _sharded(config)
    changes: list[tuple[str, TrainingConfig]] = []
    if config.method == "full":
        changes.append(("LoRA (--method lora) + activation checkpointing",
                        _with(config, method="lora", ac="full", strategy=sharded)))
    if config.method != "qlora":
        changes.append(("QLoRA (--method qlora) + activation checkpointing",
                        _with(config, method="qlora", ac="full", strategy=sharded)))
    resolved = resolve_stack(_with(config, ac="full"), cluster.world_size)
    if resolved.use_cache and resolved.checkpoint_wrapper and not resolved.reentrant_checkpointing:
        no_cache = "use_cache=False (--no-use-cache)"
        changes += [(f"{change} + {no_cache}", _with(candidate, use_cache=False)) for change, candidate in changes]
        changes.insert(0, (f"set {no_cache}" + ("" if config.ac == "full" else " + activation checkpointing"),
                           _with(config, ac="full", use_cache=False)))
    return changes


def _tried(spec: ModelSpec, changes: list[tuple[str, Cluster, TrainingConfig]], allocator=None,
           bands: AccuracyBands | None = None) -> list[Alternative | None]:
    """Each change evaluated (one pass for all), as an ``Alternative``; None for a combination
    the framework does not offer."""
    if not changes:
        return []
    evaluated = evaluate_many(spec, [(cluster, candidate, None) for _, cluster, candidate in changes],
                              allocator=allocator, bands=bands)
    return [Alternative(change=change, fits=r.fits, verdict=r.verdict, band_bytes=r.band_bytes,
                        margin_bytes=r.margin_bytes, peak_allocated_bytes=r.per_gpu.peak_allocated_bytes,
                        device_total_bytes=r.per_gpu.device_total_bytes, world_size=cluster.world_size,
                        limit=limiting_resource(r), config=candidate.model_dump()) if r.valid else None
            for (change, cluster, candidate), r in zip(changes, evaluated)]


def _more_gpus_of(spec: ModelSpec, cluster: Cluster, configs: Sequence[TrainingConfig], allocator=None,
                  bands: AccuracyBands | None = None) -> list[list[tuple[str, Cluster, TrainingConfig]]]:
    """Per configuration, the fewest GPUs at which the same settings (else the same with
    checkpointing) fit, as a change (none when that is the cluster's own count); one evaluation."""
    tries = [[("same settings", config)] + ([("with activation checkpointing", _with(config, ac="full"))]
                                            if config.ac != "full" else []) for config in configs]
    needs = iter(_fewest_gpus_of(spec, cluster, [candidate for t in tries for _, candidate in t],
                                 allocator=allocator, bands=bands))
    out = []
    for t in tries:
        found = [(label, candidate, next(needs)) for label, candidate in t]
        changes = []
        for label, candidate, need in found:
            if need is not None and need != cluster.world_size:
                bigger = cluster.model_copy(update={"gpus_per_node": min(need, cluster.gpus_per_node),
                                                    "nodes": max(1, need // cluster.gpus_per_node)})
                changes = [(f"{need} GPUs instead of {cluster.world_size} ({label})", bigger, candidate)]
                break
        out.append(changes)
    return out


def alternatives(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, allocator=None,
                 bands: AccuracyBands | None = None) -> list[Alternative]:
    """Cheapest changes first: ones that keep the training identical (checkpointing, a smaller
    micro-batch with more accumulation, sharding, offload), then more GPUs, then LoRA/QLoRA.
    Each is judged by the verdict's rule (``fits`` only when peak + band is under capacity)."""
    return _alternatives_of(spec, cluster, [config], allocator, bands)[0]


def _alternatives_of(spec: ModelSpec, cluster: Cluster, configs: list[TrainingConfig], allocator=None,
                     bands: AccuracyBands | None = None) -> list[list[Alternative]]:
    """``alternatives`` of several configurations: every change of all of them is a row of one
    evaluation (the GPU-count search one more)."""
    more = _more_gpus_of(spec, cluster, configs, allocator, bands)
    per_config = [[(label, cluster, candidate) for label, candidate in _same_training_changes(config)] + gpus
                  + [(label, cluster, candidate) for label, candidate in _method_changes(config, cluster)]
                  for config, gpus in zip(configs, more)]
    tried = iter(_tried(spec, [change for changes in per_config for change in changes], allocator, bands))
    return [[a for a in (next(tried) for _ in changes) if a is not None] for changes in per_config]


def fit(spec: ModelSpec, cluster: Cluster, config: TrainingConfig, strategies: list[str] | None = None,
        notes: list[str] | None = None, allocator=None, bands: AccuracyBands | None = None, *,
        time: bool = False, calibration=None) -> list[FitResult]:
    """One result per strategy (all valid ones for the engine when ``strategies`` is None; on one
    GPU that is ``single``: no wrapper, as a one-GPU run is launched); alternatives for every one
    that is not ``fits`` (``tight`` included). ``allocator``: an ``allocator_profile.AllocatorModel`` (a
    calibration overlay's), else the measured defaults; ``bands``: the verdict's band data. ``time``:
    each result also carries its step time, tokens/s and MFU (``FitResult.time``, ``step_timings``'
    record) at nameplate rates or ``calibration``'s (an overlay), from the result's own memory columns."""
    _check_arguments(spec, cluster, config)
    if strategies is not None and (isinstance(strategies, str) or not all(isinstance(x, str) for x in strategies)):
        raise ShardplanError("strategies", safe_repr(strategies)[:60], "expected a list of strategy names")
    searched = ("strategy",) if strategies is None else ()  # fit over every strategy lists invalid ones as such
    if strategies is None and cluster.world_size == 1:
        strategies = ["single"]
    elif strategies is None:
        engine = st.code(st.ENGINES, config.engine, "engine")
        strategies = [name for i, name in enumerate(st.STRATEGIES)
                      if bool(st.is_valid(i, engine)) and bool(st.valid_world_size(i, cluster.world_size))]
    from shardplan.inputs.vocabulary import canonical

    queries = []
    for name in strategies:
        cfg = _with(config, strategy=canonical("strategy", name))  # model_copy does not validate: resolve aliases here
        check_config(spec, cluster, cfg)
        rule_notes = contradictions.check(cfg, cluster, spec, searched=searched)  # errors raise here
        queries.append((cluster, cfg, [*(notes or []), *rule_notes]))
    results = _evaluated(spec, queries, allocator, bands, (cluster, calibration) if time else None)
    missing = [i for i, r in enumerate(results) if not r.fits]
    found = _alternatives_of(spec, cluster, [queries[i][1] for i in missing], allocator, bands)
    for i, alts in zip(missing, found):
        results[i] = results[i].model_copy(update={"alternatives": alts})
    return results
