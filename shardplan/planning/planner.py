"""``shardplan plan``: search strategy × engine × AC × micro-batch × grad accumulation × offload ×
HSDP shard-group size × gradient-sync mode as one vectorized evaluation, keep what fits, rank by
throughput (ties: more headroom), and explain the winners and the rejected families.

The whole grid is one ``Columns`` with one row per candidate; ``estimate_memory``, ``comm_volume``
and ``step_time`` each run once over it (docs/architecture.md, principle 2).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import fields
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from shardplan.formulas.accuracy_bands import BAND_CLASSES, AccuracyBands
from shardplan.formulas.columns import Columns, cluster_values, model_values
from shardplan.formulas.comm import COLLECTIVES
from shardplan.formulas.memory import BREAKDOWN_TERMS
from shardplan.formulas.overflow import OVERFLOW_NOTE, check_one
from shardplan.formulas.throughput import training_cost
from shardplan.formulas.verdict import ADVICE, TIGHT, VERDICTS, throughput_band
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.engines import tables as engine_tables
from shardplan.inputs.hardware import Cluster, check_precision
from shardplan.inputs.model import ModelSpec
from shardplan.inputs.stacks import knob_values, stack_label
from shardplan.planning.evaluate import evaluate_grid, require_query_types
from shardplan.planning.workload import Workload, resolve_workload  # noqa: F401  (planner.resolve_workload, as before)
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import INT64_SAFE, MAX_DIVISOR_TRIALS, MAX_PLAN_CONFIGURATIONS, approx_bytes, bounded_int

PLAN_AC = ("none", "selective", "full")
PLAN_OFFLOADS = ("none", "optimizer", "optimizer+params")
PLAN_ROW_BYTES = 1_900  # peak memory one candidate row takes while the grid is evaluated (measured; limits.py)


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    rank: int
    strategy: str
    engine: str
    method: str = "full"          # the fine-tuning method (plan searches full, lora, qlora unless fixed)
    micro_batch: int
    grad_accum: int
    ac: str
    offload: str
    shard_group_size: int
    sync_every_micro_batch: bool
    reduce_dtype: str = "fp32"   # gradient reduction dtype (st.REDUCE_DTYPES, "param" resolved to the compute dtype)
    fits: bool
    verdict: str
    band_bytes: int
    margin_bytes: int
    risk_term: str
    peak_allocated_bytes: int
    device_total_bytes: int
    headroom_bytes: int
    load_peak_bytes: int = 0      # while the weights reach the GPU (load.py); counted in ``fits``
    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_gpu_low: float
    tokens_per_s_per_gpu_high: float
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float
    mfu: float
    hfu: float
    comm_bytes_per_step: dict[str, int]
    comm_s: dict[str, float]
    no_sync_grad_bytes: int
    time_to_train_s: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    why: list[str] = []
    config: dict[str, Any] = {}   # the whole TrainingConfig of this plan (what `shardplan export` writes)
    equal_to_best: bool = False   # its tokens/s band overlaps #1's: ranked among equals by the second criterion
    moving_parts: int = 0         # CPU offload, AC, HSDP, no_sync accumulation it uses (SECOND_CRITERION)


class Rejected(BaseModel):
    model_config = ConfigDict(frozen=True)

    strategy: str
    engine: str
    method: str = "full"
    reason: str
    largest_term: str
    largest_term_bytes: int
    device_total_bytes: int
    gpu_memory_bytes: int


class PlanResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: dict[str, Any]
    cluster: dict[str, Any]
    workload: Workload
    candidates: int
    fitting: int
    plans: list[Plan]
    tight_count: int = 0
    tight: list[Plan] = []       # best tight candidates (peak under capacity, peak + band not): shown, not ranked
    rejected: list[Rejected]
    calibrated: bool
    explanation: str = ""
    notes: list[str] = []
    stack: str = ""               # the training stack the numbers assume (stacks.stack_label)
    methods: list[str] = []       # the fine-tuning methods searched
    method: str = "full"          # the method asked for (the query's, else full fine-tuning): ``plans`` rank it alone
    method_fitting: int = 0       # candidates of the asked method that fit
    other_methods: list[Plan] = []  # the best plan of each other method searched ("if you would accept LoRA/QLoRA")


def divisors(n: int, up_to: int | None = None) -> list[int]:
    """The divisors of ``n`` not above ``up_to`` (default: all), ascending.

    Tries candidates up to min(``up_to``, isqrt(n)) at once in numpy (each d <= sqrt(n) also gives
    n // d), so the micro-batch search of a 15 T-token batch (1.8·10^9 sequences per GPU, up to 64)
    tries 64 values and a GPU count <= limits.MAX_GPUS at most 1,000. A search that would try more
    than limits.MAX_DIVISOR_TRIALS is refused rather than run."""
    n = bounded_int(n, "divisors", 1, INT64_SAFE)
    limit = n if up_to is None else max(0, min(int(up_to), n))
    trials = min(limit, math.isqrt(n))
    if trials > MAX_DIVISOR_TRIALS:
        raise ShardplanError("divisors", n, f"a divisor search of {trials:,} candidates is above the "
                                            f"{MAX_DIVISOR_TRIALS:,} shardplan runs")
    small = np.arange(1, trials + 1, dtype=np.int64)
    small = small[n % small == 0]
    large = n // small[::-1]            # the partner of each small divisor, ascending
    found = np.concatenate([small, large[large > trials]]) if limit > trials else small
    return [int(d) for d in found if d <= limit]


def shard_group_sizes(cluster: Cluster) -> list[int]:
    """HSDP shard groups: divisors of the world size from 2 up to it, powers of two and the node size."""
    n = cluster.world_size
    sizes = {d for d in divisors(n) if d >= 2 and (d & (d - 1) == 0 or d % cluster.gpus_per_node == 0)}
    return sorted(sizes) or [n]


# Knobs a user may fix for the search (the rest are searched): stated in the base TrainingConfig.
SEARCHED_KNOBS = ("strategy", "engine", "ac", "offload", "micro_batch", "shard_group_size")


def method_configs(base: TrainingConfig, cluster: Cluster, methods: Sequence[str] | None = None) -> list[TrainingConfig]:
    """One resolved base per fine-tuning method searched (the stack's knobs differ per method:
    torchtune's LoRA recipes set their own targets, rank and checkpointing). ``methods`` None:
    the base's own method."""
    from shardplan.inputs.stacks import resolve_stack

    stated = base.model_dump(exclude_unset=True)
    names = [base.method] if methods is None else [st.METHODS[st.code(st.METHODS, m, "method")] for m in methods]
    return [resolve_stack(TrainingConfig(**{**stated, "method": m}), cluster.world_size) for m in dict.fromkeys(names)]


def _candidate_rows(cluster: Cluster, base: TrainingConfig, workload: Workload, max_micro_batch: int,
                    methods: int = 1, max_configurations: int = MAX_PLAN_CONFIGURATIONS) -> np.ndarray:
    """(strategy, engine, ac, offload, micro-batch, accumulation, group, sync) of every candidate;
    knobs stated in ``base`` (SEARCHED_KNOBS) are fixed to their value. A strategy the engine runs
    as another (``st.runs_as``: DeepSpeed's shard_grad_op is its stage 2 = zero2) is planned once,
    under the canonical name. The candidates (× ``methods``, the grid is stacked once per method)
    are counted first; more than ``max_configurations`` is refused before any row is built."""
    fixed = base.model_fields_set
    strategies = ([st.code(st.STRATEGIES, base.strategy, "strategy")] if "strategy" in fixed
                  else range(len(st.STRATEGIES)))
    engines = ([st.code(st.ENGINES, base.engine, "engine")] if "engine" in fixed
               else np.flatnonzero(engine_tables().searched_by_planner).tolist())
    acs = [st.code(st.AC_MODES, a, "ac") for a in ([base.ac] if "ac" in fixed else PLAN_AC)]
    offloads = [st.code(st.OFFLOADS, o, "offload") for o in ([base.offload] if "offload" in fixed else PLAN_OFFLOADS)]
    micro = divisors(workload.sequences_per_gpu, up_to=max_micro_batch)
    if "micro_batch" in fixed:
        workload.accumulation(base.micro_batch)  # a fixed micro-batch must divide the batch
        micro = [base.micro_batch]
    groups = shard_group_sizes(cluster)
    if "shard_group_size" in fixed and base.shard_group_size:
        groups = [base.shard_group_size]
    families = []
    for s, e in itertools.product(strategies, engines):
        if not bool(st.is_valid(s, e)) or not bool(st.valid_world_size(s, cluster.world_size)):
            continue
        # no wrapper: plan it once, under the first engine that states it
        if s == st.SINGLE and e != int(np.flatnonzero(engine_tables().valid[:, st.SINGLE])[0]) and "engine" not in fixed:
            continue
        if st.runs_as(s, e) != s and st.runs_as(s, e) in strategies:
            continue
        hybrid = s in (st.HYBRID_SHARD, st.HYBRID_SHARD_ZERO2)
        # HSDP with one replica is FULL_SHARD / SHARD_GRAD_OP: only groups smaller than the world.
        families.append((s, e, [x for x in groups if x < cluster.world_size] if hybrid else [cluster.world_size]))
    # counted before any row is built: (micro-batch, sync) pairs per family, no_sync where it differs
    accumulating = sum(workload.sequences_per_gpu // mb > 1 for mb in micro)
    count = sum(len(g) * len(acs) * len(offloads) * (len(micro) + (accumulating if engine_tables().accumulates_without_sync[e] else 0))
                for _, e, g in families) * methods
    if count > max_configurations:
        raise ShardplanError("max_configurations", max_configurations,
                             f"this plan searches {count:,} candidates, above the bound (one array of about "
                             f"{approx_bytes(PLAN_ROW_BYTES * count)}); fix a knob (--method, --strategy, --engine, "
                             f"--micro-batch, --shard-group-size) or raise it: --max-configurations {count} "
                             f"(plan(..., max_configurations={count}))")
    rows: list[tuple] = []
    for s, e, family_groups in families:
        for g in family_groups:
            for ac, off, mb, sync in itertools.product(acs, offloads, micro, (True, False)):
                k = workload.sequences_per_gpu // mb
                # no_sync only where the engine offers it (DeepSpeed ZeRO-2/3 rejects no_sync) and it differs
                if not sync and (k == 1 or not engine_tables().accumulates_without_sync[e]):
                    continue
                rows.append((s, e, ac, off, mb, k, g, sync))
    if not rows:
        stated = ", ".join(f"{k}={getattr(base, k)}" for k in SEARCHED_KNOBS if k in fixed)
        raise ShardplanError("plan", stated or "(nothing fixed)",
                             f"no candidate on {cluster.world_size} GPU(s): the fixed knobs leave no valid combination")
    return np.array(rows, dtype=np.int64)


def _grid_for(spec: ModelSpec, cluster: Cluster, base: TrainingConfig, workload: Workload, arr: np.ndarray) -> Columns:
    knobs = knob_values(base.model_copy(update={"seq_len": workload.seq_len}), cluster)
    knobs.update(strategy=arr[:, 0], engine=arr[:, 1], ac=arr[:, 2], offload=arr[:, 3], micro_batch=arr[:, 4],
                 grad_accum=arr[:, 5], shard_group_size=arr[:, 6], sync_every_micro_batch=arr[:, 7].astype(bool))
    if base.reduce_dtype is None:  # the engine's own default (DeepSpeed reduces in 16-bit)
        knobs["reduce_dtype"] = st.resolve_reduce_dtype(None, knobs["precision"], arr[:, 1])
    return Columns.build(**model_values(spec, base.lora_rank, base.lora_targets), **cluster_values(cluster), **knobs)


def build_grid(spec: ModelSpec, cluster: Cluster, base: TrainingConfig, workload: Workload,
               max_micro_batch: int = 64, methods: Sequence[str] | None = None,
               max_configurations: int = MAX_PLAN_CONFIGURATIONS) -> tuple[Columns, dict[str, np.ndarray]]:
    """All candidate rows as one ``Columns`` (plus the sync-mode column): the candidate grid once
    per fine-tuning method searched (``method_configs``), stacked; at most ``max_configurations``
    rows (a larger search is refused with its count)."""
    bases = method_configs(base, cluster, methods)
    arr = _candidate_rows(cluster, base, workload, max_micro_batch, len(bases), max_configurations)
    parts = [_grid_for(spec, cluster, b, workload, arr) for b in bases]
    c = parts[0] if len(parts) == 1 else Columns(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                                                    for f in fields(Columns)})
    return c, {"sync_every_micro_batch": np.tile(arr[:, 7].astype(bool), len(parts))}


def _why(i: int, r: dict, c: Columns, order: np.ndarray, pos: int, equal: bool = False) -> list[str]:
    reasons = []
    exposed, step = float(r["exposed_comm_s"][i]), float(r["step_time_s"][i])
    reasons.append(f"exposed communication {exposed * 1e3:,.0f} ms of a {step:,.2f} s step "
                   f"({100 * exposed / step:.1f} %)")
    if int(c.ac[i]) == st.AC_NONE:
        reasons.append("no activation recomputation")
    else:
        reasons.append(f"AC {st.AC_MODES[int(c.ac[i])]} recomputes {100 * float(r['recompute_extra'][i]):.0f} % extra FLOPs")
    if int(c.offload[i]) != st.OFFLOAD_NONE:
        reasons.append(f"CPU offload costs {float(r['offload_transfer_s'][i]) + float(r['optimizer_s'][i]):,.2f} s per step")
    reasons.append(f"micro-batch {int(c.micro_batch[i])} → GEMM efficiency {float(r['gemm_efficiency'][i]):.2f}")
    if pos > 0 and equal:
        reasons.append("an equal of #1 (tokens/s bands overlap)")
    elif pos > 0:
        best = order[0]
        reasons.append(f"{100 * (1 - float(r['tokens_per_s'][i]) / float(r['tokens_per_s'][best])):.1f} % slower than #1")
    return reasons


def _name(codes, names, i):
    return names[int(codes[i])]


# Among plans whose tokens/s bands overlap #1's (equal within the model's error), the order is by fewer
# moving parts, then by memory margin: each moving part (CPU offload, activation recomputation, an HSDP
# replica group, gradient sync deferred across micro-batches) is one more thing to configure and to go
# wrong, and margin is what a longer sequence or a fragmenting allocator eats first.
SECOND_CRITERION = "fewer moving parts (CPU offload, AC, HSDP, no_sync), then more memory margin"


def moving_parts(c: Columns, sync: np.ndarray) -> np.ndarray:
    """How many of SECOND_CRITERION's moving parts each row uses (0-4)."""
    hybrid = (c.strategy == st.HYBRID_SHARD) | (c.strategy == st.HYBRID_SHARD_ZERO2)
    return ((c.offload != st.OFFLOAD_NONE).astype(np.int64) + (c.ac != st.AC_NONE) + hybrid
            + (~np.asarray(sync, dtype=bool) & (c.grad_accum > 1)))


def rank_rows(rows: np.ndarray, r: dict, c: Columns, sync: np.ndarray,
              bands: AccuracyBands | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (fitting candidates) in plan order, and which of them are equal to the first: the
    fastest row's tokens/s band [low, point] decides; every row whose band reaches it (its high end
    at or above the fastest one's low end) is its equal, and equals are ordered by SECOND_CRITERION.
    The rest follow by tokens/s. The band here is the all-runs one (``throughput_band`` without a
    family): a GPU family's widening (``ThroughputBand.fractions``) is what all its published runs
    shared, the same for every plan on that GPU, so it does not blur their order."""
    if rows.size == 0:
        return rows, np.zeros(0, dtype=bool)
    tps = r["tokens_per_s"][rows]
    low, high = throughput_band(tps, bands)
    equal = high >= low[np.argmax(tps)]
    parts = moving_parts(c, sync)[rows]
    # lexsort: last key first -> (not equal, then parts or -tokens/s, then -margin)
    first = np.where(equal, parts, 0).astype(np.float64)
    speed = np.where(equal, 0.0, -r["tokens_per_s"][rows])
    order = np.lexsort((-r["margin_bytes"][rows], speed, first, ~equal))
    return rows[order], equal[order]


def _best_per_family(order: np.ndarray, c: Columns, top: int) -> list[int]:
    """One row per distinct (method, strategy, engine, ac, offload, group) family member: the first in ``order``."""
    seen, chosen = set(), []
    for i in order:
        key = (int(c.method[i]), int(c.strategy[i]), int(c.engine[i]), int(c.ac[i]), int(c.offload[i]),
               int(c.shard_group_size[i]))
        if key in seen:
            continue
        seen.add(key)
        chosen.append(int(i))
        if len(chosen) == top:
            break
    return chosen


def _row_config(i: int, c: Columns, bases: dict[int, TrainingConfig]) -> dict[str, Any]:
    """Row ``i`` as the TrainingConfig it is (its method's resolved base + the searched knobs)."""
    knobs = dict(strategy=_name(c.strategy, st.STRATEGIES, i), engine=_name(c.engine, st.ENGINES, i),
                 ac=_name(c.ac, st.AC_MODES, i), offload=_name(c.offload, st.OFFLOADS, i),
                 micro_batch=int(c.micro_batch[i]), grad_accum=int(c.grad_accum[i]),
                 shard_group_size=int(c.shard_group_size[i]), seq_len=int(c.seq_len[i]),
                 reduce_dtype=st.reduce_dtype_name(c.reduce_dtype[i], c.precision[i]))
    return bases[int(c.method[i])].model_copy(update=knobs).model_dump(mode="json")


def _plan_entry(i: int, rank: int, r: dict, c: Columns, sync, cluster: Cluster, why: list[str],
                train_tokens: float | None, price_per_gpu_hour: float | None,
                bases: dict[int, TrainingConfig] | None = None) -> Plan:
    cost = (training_cost(float(r["tokens_per_s"][i]), cluster.world_size, train_tokens, price_per_gpu_hour)
            if train_tokens else {})
    return Plan(
        rank=rank, strategy=_name(c.strategy, st.STRATEGIES, i), engine=_name(c.engine, st.ENGINES, i),
        method=_name(c.method, st.METHODS, i), config=_row_config(i, c, bases) if bases else {},
        micro_batch=int(c.micro_batch[i]), grad_accum=int(c.grad_accum[i]), ac=_name(c.ac, st.AC_MODES, i),
        offload=_name(c.offload, st.OFFLOADS, i), shard_group_size=int(c.shard_group_size[i]),
        sync_every_micro_batch=bool(sync[i]), reduce_dtype=st.reduce_dtype_name(c.reduce_dtype[i], c.precision[i]),
        fits=bool(r["fits"][i]), verdict=VERDICTS[int(r["verdict"][i])], band_bytes=int(r["band_bytes"][i]),
        margin_bytes=int(r["margin_bytes"][i]), risk_term=BAND_CLASSES[int(r["risk_term"][i])],
        peak_allocated_bytes=int(r["peak_allocated_bytes"][i]), device_total_bytes=int(r["device_total_bytes"][i]),
        headroom_bytes=int(r["headroom_bytes"][i]), load_peak_bytes=int(r["load_peak_bytes"][i]),
        step_time_s=float(r["step_time_s"][i]),
        compute_s=float(r["compute_s"][i]), exposed_comm_s=float(r["exposed_comm_s"][i]),
        tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"][i]),
        tokens_per_s_per_gpu_low=float(r["tokens_per_s_per_gpu_low"][i]),
        tokens_per_s_per_gpu_high=float(r["tokens_per_s_per_gpu_high"][i]), tokens_per_s=float(r["tokens_per_s"][i]),
        tokens_per_s_low=float(r["tokens_per_s_low"][i]), tokens_per_s_high=float(r["tokens_per_s_high"][i]),
        mfu=float(r["mfu"][i]), hfu=float(r["hfu"][i]),
        comm_bytes_per_step={n: int(r[f"{n}_bytes"][i]) for n in COLLECTIVES},
        comm_s={n: float(r[f"{n}_s"][i]) for n in COLLECTIVES},
        no_sync_grad_bytes=int(r["no_sync_grad_bytes"][i]),
        time_to_train_s=float(cost["time_to_train_s"]) if cost else None,
        gpu_hours=float(cost["gpu_hours"]) if cost else None,
        cost=float(cost["cost"]) if cost.get("cost") is not None else None,
        why=why,
    )


def _tight_why(i: int, r: dict, c: Columns) -> list[str]:
    risk = BAND_CLASSES[int(r["risk_term"][i])]
    return [f"tight: {int(r['judged_bytes'][i]) / 2**30:,.1f} ± {int(r['band_bytes'][i]) / 2**30:,.1f} GiB of "
            f"{int(c.gpu_memory_bytes[i]) / 2**30:,.1f} GiB; {risk.replace('_', ' ')} "
            f"±{int(r[f'band_{risk}_bytes'][i]) / 2**30:,.1f} GiB carries the risk: try {ADVICE[int(r['advice'][i])]}"]


def plan(spec: ModelSpec, cluster: Cluster, base: TrainingConfig, workload: Workload, *, top: int = 5,
         train_tokens: float | None = None, price_per_gpu_hour: float | None = None, calibration=None,
         notes: list[str] | None = None, bands: AccuracyBands | None = None,
         methods: Sequence[str] | None = None, max_configurations: int = MAX_PLAN_CONFIGURATIONS) -> PlanResult:
    """Rank every ``fits`` candidate (peak + band under capacity) by tokens/s (ties: headroom);
    list the best ``tight`` ones apart, unranked; explain rejected families. ``methods``: the
    fine-tuning methods to search (None: the base's); knobs the base states are not searched.
    ``max_configurations``: the most candidates evaluated (limits.MAX_PLAN_CONFIGURATIONS; the
    whole grid is one array, so the bound is a memory bound); a larger search is refused, naming
    its count and this argument."""
    from shardplan.support.errors import require_type
    from shardplan.support.limits import MAX_TOKENS, bounded_float, checked_float, checked_int

    require_query_types(spec, cluster, base, "base")
    require_type(workload, Workload, "workload", "shardplan.resolve_workload(...)")
    top = checked_int("top", top)
    train_tokens = None if train_tokens is None else bounded_float(train_tokens, "train_tokens", 1, MAX_TOKENS)
    price_per_gpu_hour = None if price_per_gpu_hour is None else checked_float("price_per_gpu_hour", price_per_gpu_hour)
    max_configurations = bounded_int(max_configurations, "max_configurations", 1, 10**9)
    from shardplan.inputs.stacks import resolve_stack

    check_precision(cluster.gpu, resolve_stack(base, cluster.world_size).precision)
    bases = {st.METHODS.index(b.method): b for b in method_configs(base, cluster, methods)}
    c, extra = build_grid(spec, cluster, base, workload, methods=methods, max_configurations=max_configurations)
    sync = extra["sync_every_micro_batch"]
    r = evaluate_grid(c, sync, cluster, calibration, bands)
    if bool(np.all(r["overflow"])):
        check_one(c, r, base)
    overflow_rows = int(np.count_nonzero(r["overflow"]))
    if overflow_rows:
        notes = [*(notes or []), f"{overflow_rows:,} of {c.shape[0]:,} candidates left out: {OVERFLOW_NOTE}"]
    fitting = np.flatnonzero(r["fits"])
    asked = st.METHODS.index(base.method)  # the query's method, else TrainingConfig's: full fine-tuning
    plans = _ranked(fitting[c.method[fitting] == asked], top, r, c, sync, cluster, train_tokens,
                    price_per_gpu_hour, bases, bands)
    others = [p for m in sorted(bases) if m != asked
              for p in _ranked(fitting[c.method[fitting] == m], 1, r, c, sync, cluster, train_tokens,
                               price_per_gpu_hour, bases, bands)]
    tight_rows = np.flatnonzero((r["verdict"] == TIGHT) & (c.method == asked))
    tight_order = tight_rows[np.lexsort((-r["margin_bytes"][tight_rows], -r["tokens_per_s"][tight_rows]))]
    tight = [_plan_entry(i, 0, r, c, sync, cluster, _tight_why(i, r, c), train_tokens, price_per_gpu_hour, bases)
             for i in _best_per_family(tight_order, c, top)]
    asked_rows = c.method == asked
    explanation = "" if plans else _nothing_fits(c, r, cluster, bool(tight), asked_rows)
    return PlanResult(
        model={"name": spec.name, "display_name": spec.display_name, "params": spec.total_params,
               "block_class": spec.block_class, "hf_id": next((a for a in spec.aliases if "/" in a), None)},
        cluster={"label": cluster.label, "world_size": cluster.world_size, "gpu": cluster.gpu.name,
                 "intra_link": cluster.intra_link.name, "inter_link": cluster.inter_link.name, "nodes": cluster.nodes,
                 "gpus_per_node": cluster.gpus_per_node},
        workload=workload, candidates=int(c.shape[0]), fitting=int(fitting.size), plans=plans,
        tight_count=int(tight_rows.size), tight=tight, rejected=rejected_families(c, r),
        calibrated=bool(r["calibrated"]), explanation=explanation, notes=list(notes or []) + workload.notes,
        stack=stack_label(base.stack), methods=[st.METHODS[m] for m in sorted(bases)],
        method=base.method, method_fitting=int(np.count_nonzero(asked_rows[fitting])), other_methods=others,
    )


def _ranked(rows: np.ndarray, top: int, r: dict, c: Columns, sync, cluster: Cluster, train_tokens, price_per_gpu_hour,
            bases, bands: AccuracyBands | None = None) -> list[Plan]:
    """The best ``top`` plans of ``rows`` (one per family) in ``rank_rows``' order, explained."""
    order, equal = rank_rows(rows, r, c, sync, bands)
    is_equal = dict(zip(order.tolist(), equal.tolist()))
    chosen = _best_per_family(order, c, top)
    chosen_arr = np.array(chosen, dtype=np.int64)
    parts = moving_parts(c, sync)
    return [_plan_entry(i, pos + 1, r, c, sync, cluster, _why(i, r, c, chosen_arr, pos, is_equal[i]), train_tokens,
                        price_per_gpu_hour, bases).model_copy(update={"equal_to_best": is_equal[i],
                                                                      "moving_parts": int(parts[i])})
            for pos, i in enumerate(chosen)]


def _nothing_fits(c: Columns, r: dict, cluster: Cluster, tight: bool, among: np.ndarray | None = None) -> str:
    """Why no candidate (of ``among``: the asked method's rows) fits: the smallest footprint, its
    largest term, and what to try."""
    among = np.ones(c.shape[0], dtype=bool) if among is None else among
    smallest = int(np.argmin(np.where(r["valid"] & among, r["device_total_bytes"], np.iinfo(np.int64).max)))
    term = max(BREAKDOWN_TERMS, key=lambda t: int(r[t][smallest]))
    band = (f" ± {int(r['band_bytes'][smallest]) / 2**30:,.1f} GiB band" if tight else "")
    return (f"nothing fits{' once its error band is counted' if tight else ''}: of "
            f"{int(np.count_nonzero(among)):,} {_name(c.method, st.METHODS, smallest)} candidates the smallest footprint "
            f"({_name(c.strategy, st.STRATEGIES, smallest)}/{_name(c.engine, st.ENGINES, smallest)}, AC "
            f"{_name(c.ac, st.AC_MODES, smallest)}, offload {_name(c.offload, st.OFFLOADS, smallest)}, "
            f"micro-batch {int(c.micro_batch[smallest])}) needs {int(r['device_total_bytes'][smallest]) / 2**30:,.1f} GiB"
            f"{band} per GPU of {cluster.gpu.memory_bytes / 2**30:,.1f} GiB"
            + ("" if bool(r["fits_host"][smallest]) else
               f" and {int(r['host_bytes_per_node'][smallest]) / 2**30:,.0f} GiB host RAM per node")
            + f"; its largest term is {term} ({int(r[term][smallest]) / 2**30:,.1f} GiB). "
            f"Try more GPUs, LoRA/QLoRA, or a shorter sequence (`shardplan fit` lists alternatives).")


def rejected_families(c: Columns, r: dict) -> list[Rejected]:
    """Valid (strategy, engine) families with no ``fits`` row: the closest row's largest term (a
    family whose best rows are ``tight`` says so, with the band)."""
    out = []
    fam = (c.method * len(st.STRATEGIES) + c.strategy) * len(st.ENGINES) + c.engine
    for key in np.unique(fam):
        rows = np.flatnonzero((fam == key) & r["valid"])
        if rows.size == 0 or r["fits"][rows].any():
            continue
        i = rows[np.argmin(r["device_total_bytes"][rows])]
        term = max(BREAKDOWN_TERMS, key=lambda t: int(r[t][i]))
        if not bool(r["fits_host"][i]) and bool(r["fits_gpu"][i]):
            reason = f"host RAM: needs {int(r['host_bytes_per_node'][i]) / 2**30:,.0f} GiB per node"
        elif not bool(r["fits_load"][i]) and bool(r["fits_gpu"][i]):
            reason = (f"loading the weights: {int(r['load_peak_bytes'][i]) / 2**30:,.1f} GiB of "
                      f"{int(c.gpu_memory_bytes[i]) / 2**30:,.1f} GiB")
        elif (r["verdict"][rows] == TIGHT).any():
            i = rows[r["verdict"][rows] == TIGHT][np.argmax(r["margin_bytes"][rows][r["verdict"][rows] == TIGHT])]
            term = max(BREAKDOWN_TERMS, key=lambda t: int(r[t][i]))
            reason = (f"only tight: best case {int(r['device_total_bytes'][i]) / 2**30:,.1f} ± "
                      f"{int(r['band_bytes'][i]) / 2**30:,.1f} GiB of {int(c.gpu_memory_bytes[i]) / 2**30:,.1f} GiB")
        else:
            reason = (f"GPU memory: best case {int(r['device_total_bytes'][i]) / 2**30:,.1f} GiB of "
                      f"{int(c.gpu_memory_bytes[i]) / 2**30:,.1f} GiB")
        out.append(Rejected(strategy=_name(c.strategy, st.STRATEGIES, i), engine=_name(c.engine, st.ENGINES, i),
                            method=_name(c.method, st.METHODS, i),
                            reason=reason, largest_term=term, largest_term_bytes=int(r[term][i]),
                            device_total_bytes=int(r["device_total_bytes"][i]), gpu_memory_bytes=int(c.gpu_memory_bytes[i])))
    return out
