"""The honest verdict: fits / tight / does not fit, with an error band derived per term class.

The band is the sum over term classes of (the class's relative error × the bytes it applies to at
the peak moment); the errors, how each was derived and its source live in
``shardplan/data/accuracy_bands.json`` (``shardplan.formulas.accuracy_bands``; docs/accuracy.md):

    band = ceil(Σ_k e_k · B_k)        B_k ∈ {model states, activations (+ logits), engine buffers,
                                         allocated peak, reserved − allocated, non-torch bytes}

ASSUMPTION (docs/accuracy.md, "Combining the classes"): errors add linearly. Each e_k is the
largest error seen (a bound over the measured runs, not a standard deviation), and the classes are
not independent (a stack that holds more transients also fragments the allocator more), so a
root-sum-square would claim a coverage nothing measured supports.

Rule (two-sided: real runs were seen to hold both more and less than predicted; the lower
fraction is the ``unknown_stack`` class's ``lower_relative_error``, per stack, fitted on published
runs by ``validation/bands.py``):

* ``fits``          — peak + band ≤ capacity (and host RAM fits, and the combination is valid);
* ``tight``         — floor × (1 − lower) ≤ capacity < peak + band: it may or may not fit;
* ``does_not_fit``  — floor × (1 − lower) > capacity (even the runs that held least would not fit),
  or host RAM, or an invalid combination.

The peak judged is the training device total, or the load-time peak (``load_peak_bytes``, when
the memory output has that column) when that one, with its own band, is higher. The floor of the
training side is its allocated peak + the bytes outside torch (``retry_floor_bytes``): the
allocator's cached slack gives way under pressure, so it decides ``fits``, never ``does_not_fit``.
``risk_term`` is the class carrying the most band bytes; ``advice`` the cheapest knob that
shrinks it (codes into ``ADVICE``). Everything is numpy-broadcastable: no Python ``if`` on values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from shardplan.formulas.accuracy_bands import BAND_CLASSES, BASES, AccuracyBands, load_bands
from shardplan.formulas.memory import ACTIVATION_TERMS, STATE_TERMS
from shardplan.inputs import strategy as st
from shardplan.support.identity_cache import IdentityCache

VERDICTS = ("fits", "tight", "does_not_fit")
FITS, TIGHT, DOES_NOT_FIT = range(len(VERDICTS))

ADVICE = (
    "--ac full",
    "a smaller --micro-batch with more gradient accumulation",
    "chunked cross-entropy (ce_chunks)",
    "a shorter --seq-len",
    "more GPUs or CPU offload",
    "meta-device or rank-0 loading (load_mode)",
    "smaller NCCL buffers (NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS)",
)
(ADVICE_AC, ADVICE_MICRO_BATCH, ADVICE_CHUNKED_CE, ADVICE_SEQ, ADVICE_SCALE, ADVICE_LOAD,
 ADVICE_NCCL) = range(len(ADVICE))
PEAKS = ("training", "load")
BAND_COLUMNS = tuple((k, f"band_{k}_bytes") for k in BAND_CLASSES)  # (class, its column in judge's output)


def class_bytes(m) -> dict[str, np.ndarray]:
    """The bytes each relative error applies to, at the peak moment (``BASES``).

    ``m`` is ``estimate_memory``'s output with its breakdown. Engine buffers are the allocated
    peak minus model states and activations, so a term added to the breakdown later is counted
    somewhere and the three add up to the allocated peak (gradients held by accumulation without
    sync are in ``unsharded_grads``, an engine buffer).
    """
    states = sum(map(m.__getitem__, STATE_TERMS), np.int64(0))
    acts = sum(map(m.__getitem__, ACTIVATION_TERMS), np.int64(0))
    allocated = np.asarray(m["peak_allocated_bytes"])
    return {"model_states": states, "activations": acts, "engine_buffers": allocated - states - acts,
            "peak_allocated": allocated,
            "allocator_slack": np.asarray(m["peak_reserved_bytes"]) - np.asarray(m["peak_allocated_bytes"]),
            "allocator_band": np.asarray(m.get("allocator_band_bytes", 0)),
            "non_torch": np.asarray(m["non_torch_bytes"])}


def load_class_bytes(m) -> dict[str, np.ndarray]:
    """The same bases for the load-time peak (``load_peak_bytes``, device bytes): weights being
    loaded are model states, no activations or buffers, and the non-torch bytes are the same.
    ASSUMPTION: the load peak includes the non-torch bytes, as the training device total does."""
    non_torch = np.asarray(m["non_torch_bytes"])
    loaded = np.maximum(np.asarray(m["load_peak_bytes"]) - non_torch, 0)
    zero = np.zeros_like(loaded)
    return {"model_states": loaded, "activations": zero, "engine_buffers": zero, "peak_allocated": loaded,
            "allocator_slack": zero, "allocator_band": zero, "non_torch": non_torch}


def stack_relative_error(c, bands: AccuracyBands):
    """Unknown-stack relative error per row: the stack's measured error, else the default.
    Columns without a ``stack`` field (or a build without ``strategy.STACKS``) take the default."""
    stacks = getattr(st, "STACKS", ())
    codes = getattr(c, "stack", None) if c is not None else None
    if codes is None or not stacks:
        return np.float64(bands.classes.unknown_stack.relative_error)
    return stack_error_table(bands, stacks)[np.asarray(codes, dtype=np.int64)]


def stack_lower_fraction(c, bands: AccuracyBands):
    """Lower-band fraction per row: how much less than predicted the row's stack was seen to hold
    (``AccuracyBands.stack_lower_error``); columns without a stack take the default."""
    stacks = getattr(st, "STACKS", ())
    codes = getattr(c, "stack", None) if c is not None else None
    if codes is None or not stacks:
        return np.float64(bands.classes.unknown_stack.lower_relative_error)
    table = once_per_bands(bands, ("stack lower", tuple(stacks), np.__name__),
                           lambda: np.array([bands.stack_lower_error(name) for name in stacks], dtype=np.float64))
    return table[np.asarray(codes, dtype=np.int64)]


def retry_floor_bytes(m):
    """The least a training step needs on the device: its allocated peak + the bytes outside torch's
    allocator (CUDA context, NCCL, resident paged states). The cached slack above the allocated peak
    (fragmentation, FSDP's side-stream pools: ``allocator.reserved_terms``) is not needed to run it:
    when ``cudaMalloc`` fails, torch's caching allocator frees its cached blocks and retries before it
    raises an OOM (pytorch ``c10/cuda/CUDACachingAllocator.cpp`` ``DeviceCachingAllocator::malloc``
    at 001074d2: ``alloc_block`` || ``release_available_cached_blocks`` + ``alloc_block`` ||
    ``release_cached_blocks`` — "Free all non-split cached blocks and retry alloc" — + ``alloc_block``),
    so a run whose reserved peak on a larger card would exceed a smaller one can complete on it, its
    cache trimmed. ASSUMPTION: all of that slack can be released; a segment split by a live block
    cannot (the OOM message's own note: "the only remaining 'cached' memory is split from a larger
    block that is partially in-use"), so this is the optimistic end — the one the lower point needs (``does_not_fit`` only when
    even the runs that held least would not fit). ``fits`` keeps the device total and its band."""
    return np.asarray(m["peak_allocated_bytes"]) + np.asarray(m["non_torch_bytes"])


def lower_point(peak, lower):
    """The peak less its lower band, floor(peak × (1 − lower)): ``does_not_fit`` only when this
    is over capacity (real runs of the stack were seen to hold up to ``lower`` less than predicted)."""
    return np.asarray(np.floor(np.asarray(peak) * (1.0 - lower)), dtype=np.int64)


def stack_error_table(bands: AccuracyBands, stacks):
    """Each stack's relative error (``bands.stack_error``), in ``stacks`` order (``once_per_bands``)."""
    return once_per_bands(bands, ("stack errors", tuple(stacks)),
                          lambda: np.array([bands.stack_error(name) for name in stacks], dtype=np.float64))


_per_bands = IdentityCache(256)


def once_per_bands(bands: AccuracyBands, what: tuple | str, build):
    """``build()``, a table read from ``bands``, computed once per bands object and ``what`` (the
    bands are frozen data; every judge reads its tables)."""
    return _per_bands.get(bands, what, build)


class RowErrors(NamedTuple):
    """What a band reads (``row_errors``): each class's (name, base, relative error), and the
    coefficient of each base with a nonzero one, in ``BASES`` order."""
    classes: tuple
    coefficients: tuple


def row_errors(c, bands: AccuracyBands) -> RowErrors:
    """What the band of the rows of ``c`` reads, once per judge: each class's (name, base,
    relative error), the unknown stack's being the row's stack's (``stack_relative_error``), and
    the coefficient of each base (classes sharing a base add their errors first, in
    ``BAND_CLASSES`` order), for every base some class applies to, in ``BASES`` order (a zero
    coefficient adds an exact 0.0: no test of its value).
    One configuration's are its stack's, read once per bands object and stack."""
    stack = getattr(c, "stack", None) if c is not None else None
    if stack is not None and np.ndim(stack) == 0:
        return once_per_bands(bands, ("row errors", int(stack)), lambda: _row_errors(c, bands))
    return _row_errors(c, bands)


def _row_errors(c, bands: AccuracyBands):
    stack_rel = stack_relative_error(c, bands)
    errors = tuple((name, of, stack_rel if name == "unknown_stack" else rel) for name, of, rel in class_errors(bands))
    coef: dict[str, Any] = {}
    for _, of, rel in errors:
        coef[of] = coef.get(of, 0.0) + rel
    return RowErrors(errors, tuple((base, coef[base]) for base in BASES if base in coef))


def class_bands(bases: dict[str, np.ndarray], errors: RowErrors) -> dict[str, np.ndarray]:
    """Band bytes per class, ceil(relative error × its base): what each class contributes (the
    report's breakdown and ``risk_term``); they add up to ``band_bytes`` within a byte per class.
    ``errors``: ``row_errors``."""
    return {name: np.asarray(np.ceil(rel * bases[of]), dtype=np.int64) for name, of, rel in errors.classes}


def class_errors(bands: AccuracyBands) -> tuple[tuple[str, str, float], ...]:
    """(class, the base it applies to, relative error) for each of ``BAND_CLASSES`` (``once_per_bands``)."""
    return once_per_bands(bands, "class errors",
                          lambda: tuple((name, bands.cls(name).of, bands.cls(name).relative_error) for name in BAND_CLASSES))


def band_bytes(bases: dict[str, np.ndarray], errors: RowErrors) -> np.ndarray:
    """The band: ceil(Σ_k e_k · B_k) (``band_sum``, rounded up to whole bytes)."""
    return np.asarray(np.ceil(band_sum(bases, errors)), dtype=np.int64)


def band_sum(bases: dict[str, np.ndarray], errors: RowErrors):
    """Σ_k e_k · B_k in float, summed base by base in ``BASES`` order (``row_errors``' coefficients):
    one expression for every caller, so the same bases give the same bytes; monotone in every base
    (errors ≥ 0), which ``bounded_verdict`` relies on.
    ASSUMPTION: every base is ≥ 0 (sums of byte terms; allocated ≥ model states + activations)."""
    total = np.float64(0.0)
    for base, coefficient in errors.coefficients:
        total = total + coefficient * bases[base]
    return total


# Bases only the per-term breakdown at the peak gives; the rest come from totals.
BREAKDOWN_BASES = ("model_states", "activations", "engine_buffers")


def bounded_verdict(m, c=None, bands: AccuracyBands | None = None):
    """Verdict codes from ``estimate_memory`` output *without* its breakdown (sweeps), and the rows
    those totals cannot decide. The bases only the breakdown gives lie between 0 and the allocated
    peak. A row is ``fits`` when its band with them at the allocated peak fits, not ``fits`` when
    its band with them at 0 does not, and undecided in between (``judge`` on those rows gives the
    same answer as on all rows: the band is monotone in every base). Exact: for an integer room
    r = capacity − total, ceil(x) ≤ r ⇔ x ≤ r. ``tight`` / ``does_not_fit`` depend only on the lower
    band. Returns (verdict codes, undecided mask); undecided rows carry ``TIGHT`` for now."""
    bands = bands or load_bands()
    allocated = np.asarray(m["peak_allocated_bytes"])
    exact = {"peak_allocated": allocated,
             "allocator_slack": np.asarray(m["peak_reserved_bytes"]) - allocated,
             "allocator_band": np.asarray(m.get("allocator_band_bytes", 0)),
             "non_torch": np.asarray(m["non_torch_bytes"])}
    zero = np.int64(0)
    errors = row_errors(c, bands)
    band_low = band_sum(dict(exact, model_states=zero, activations=zero, engine_buffers=zero), errors)
    band_high = band_sum(dict(exact, model_states=allocated, activations=allocated, engine_buffers=allocated), errors)
    capacity = np.asarray(m["gpu_memory_bytes"])
    room = capacity - np.asarray(m["device_total_bytes"])
    ok = np.asarray(m["fits_host"]) & np.asarray(m["valid"])
    lower = stack_lower_fraction(c, bands)
    under = lower_point(retry_floor_bytes(m), lower) <= capacity
    if "load_peak_bytes" in m:
        load_peak = np.asarray(m["load_peak_bytes"])
        ok = ok & (load_peak + band_bytes(load_class_bytes(m), errors) <= capacity)  # fits needs the load side too
        under = under & (lower_point(load_peak, lower) <= capacity)
    sure = (band_high <= room) & ok
    undecided = np.logical_not(sure) & (band_low <= room) & ok
    tight_or_better = under & (np.asarray(m["fits_host"]) & np.asarray(m["valid"]))
    verdict = np.asarray(DOES_NOT_FIT - np.asarray(tight_or_better, dtype=np.int8) - np.asarray(sure, dtype=np.int8), dtype=np.int8)
    return verdict, undecided


def judge(m, c=None, bands: AccuracyBands | None = None, *, per_class: bool = True,
          with_advice: bool = True, with_risk: bool = True) -> dict[str, np.ndarray]:
    """Verdict columns for ``estimate_memory`` output ``m`` (with its breakdown) and the ``Columns``
    ``c`` it came from (read for the stack and the knobs the advice names; None: defaults).

    Every device byte is in ``m`` (no_sync gradients included: ``estimate_memory``). Returns
    ``verdict`` (codes into ``VERDICTS``), ``band_bytes``, ``margin_bytes`` (capacity − judged peak
    − band: the room left once the band is counted), ``judged_bytes``, ``judged_peak``
    (codes into ``PEAKS``), ``risk_term`` (codes into ``BAND_CLASSES``; left out with
    ``with_risk=False`` when neither advice nor ``per_class`` asks for the classes), ``advice``
    (codes into ``ADVICE``; left out with ``with_advice=False``) and, with ``per_class``,
    ``band_<class>_bytes``.
    """
    bands = bands or load_bands()
    total = np.asarray(m["device_total_bytes"])
    floor = retry_floor_bytes(m)  # the training side's lower point (its cached slack can be released)
    train_bases, errors = class_bytes(m), row_errors(c, bands)
    lower = stack_lower_fraction(c, bands)
    train_band = band_bytes(train_bases, errors)
    capacity = np.asarray(m["gpu_memory_bytes"])
    load_bases = load_class_bytes(m) if "load_peak_bytes" in m else None
    if load_bases is not None:
        load_band = band_bytes(load_bases, errors)
        load_peak = np.asarray(m["load_peak_bytes"])
        # the side with less room left decides; both points must be under capacity for "tight"
        binding = load_peak + load_band > total + train_band
        judged = np.where(binding, load_peak, total)
        band = np.where(binding, load_band, train_band)
        points_under = (lower_point(floor, lower) <= capacity) & (lower_point(load_peak, lower) <= capacity)
    else:
        binding = np.zeros(np.shape(total), dtype=bool)
        judged, band = total, train_band
        points_under = lower_point(floor, lower) <= capacity
    other_ok = np.asarray(m["fits_host"]) & np.asarray(m["valid"])
    fits = (judged + band <= capacity) & other_ok
    tight = np.logical_not(fits) & points_under & other_ok
    verdict = np.asarray(np.where(fits, FITS, np.where(tight, TIGHT, DOES_NOT_FIT)), dtype=np.int8)
    shape = np.broadcast(verdict, judged).shape
    out = {
        "verdict": verdict + np.zeros(shape, dtype=np.int8),
        "band_bytes": np.asarray(band, dtype=np.int64) + np.zeros(shape, dtype=np.int64),
        "margin_bytes": np.asarray(capacity - judged - band, dtype=np.int64) + np.zeros(shape, dtype=np.int64),
        "judged_bytes": np.asarray(judged, dtype=np.int64) + np.zeros(shape, dtype=np.int64),
        "judged_peak": np.asarray(binding, dtype=np.int8) + np.zeros(shape, dtype=np.int8),
    }
    if not (with_risk or with_advice or per_class):
        return out
    chosen = chosen_class_bands(train_bases, load_bases, binding, errors)
    risk = np.asarray(np.argmax(np.stack([np.broadcast_to(chosen[k], shape) for k in BAND_CLASSES]), axis=0), dtype=np.int8)
    out["risk_term"] = risk
    if with_advice:
        out["advice"] = advice(risk, binding, m, c, train_bases["model_states"])
    if per_class:
        out.update({column: np.asarray(chosen[k], dtype=np.int64) + np.zeros(shape, dtype=np.int64)
                    for k, column in BAND_COLUMNS})
    return out


def chosen_class_bands(train_bases, load_bases, binding, errors: RowErrors) -> dict[str, np.ndarray]:
    """Band bytes per class (``class_bands``) of the side that decides each row: the load side's
    where the load peak binds, the training side's elsewhere (``load_bases`` None: no load peak)."""
    train = class_bands(train_bases, errors)
    if load_bases is None:
        return train
    load = class_bands(load_bases, errors)
    return {k: np.where(binding, load[k], train[k]) for k in BAND_CLASSES}


def advice(risk, load_binding, m, c, states=None):
    """The cheapest knob that shrinks the class carrying the risk (codes into ``ADVICE``).

    Classes that scale with the whole peak (unknown stack, allocator, unmodelled sub-moments) and
    the activation class shrink with the largest transient at the peak: logits → chunked
    cross-entropy when it is off; otherwise activation checkpointing, then a smaller micro-batch,
    then a shorter sequence. When model states outweigh activations, or the risk is in model
    states or engine buffers, only more GPUs or offload shrink them. Non-torch bytes: NCCL's
    buffers. A binding load-time peak: load without a full copy per GPU. ``states``: the model
    state bytes at the peak (``class_bytes``), summed from ``m`` when not given.
    """
    risk = np.asarray(risk)
    if states is None:
        states = sum(map(m.__getitem__, STATE_TERMS), np.int64(0))
    acts, logits = np.asarray(m["activations"]), np.asarray(m["logits_and_loss"])
    ac = np.asarray(c.ac) if c is not None else st.AC_NONE
    micro = np.asarray(c.micro_batch) if c is not None else 1
    ce_chunks = np.asarray(getattr(c, "ce_chunks", 0)) if c is not None else 0
    activation_knob = np.select([(logits > acts) & (ce_chunks == 0), ac != st.AC_FULL, micro > 1],
                                [ADVICE_CHUNKED_CE, ADVICE_AC, ADVICE_MICRO_BATCH], ADVICE_SEQ)
    code = {name: i for i, name in enumerate(BAND_CLASSES)}
    whole_peak = np.isin(risk, [code["unknown_stack"], code["allocator"], code["peak_moments"]])
    transient = (risk == code["activations"]) | (whole_peak & (acts + logits >= states))
    out = np.select([load_binding, risk == code["non_torch"], transient],
                    [ADVICE_LOAD, ADVICE_NCCL, activation_knob], ADVICE_SCALE)
    return np.asarray(out, dtype=np.int8)


def throughput_band(tokens_per_s, bands: AccuracyBands | None = None, family=None):
    """(low, high) tokens/s: estimate / (1 + slower), estimate × (1 + faster), the out-of-source
    error quantiles of the published runs (``ThroughputBand``), widened for a GPU ``family`` whose
    own runs erred further (``ThroughputBand.fractions``). ``family``: None (all runs), a family
    name, or an array of them broadcastable against ``tokens_per_s`` (a sweep's cluster cells)."""
    t = (bands or load_bands()).throughput
    tps = np.asarray(tokens_per_s, dtype=np.float64)
    lookup = np.frompyfunc(t.fractions, 1, 2)  # per family name: a sweep has a few cells, not a row each
    slower, faster = (np.asarray(x, dtype=np.float64) for x in lookup(np.asarray(family, dtype=object)))
    return tps / (1 + slower), tps * (1 + faster)
