"""Collective benchmarks (nccl-tests conventions), an nccl-tests output parser, and α-β fits.

Conventions (nccl-tests ``doc/PERFORMANCE.md`` and ``src/common.cu``): S is the full buffer
(all-gather output, reduce-scatter input, all-reduce tensor); each size is run ``warmup`` times,
then ``iters`` (≥ 20 by default) back-to-back iterations timed as one batch — between two CUDA
events on GPUs, one host timer around the batch on CPU — and the time per iteration is averaged
over ranks, as nccl-tests does. Out-of-place (separate input and output) and in-place (all-gather
input = this rank's slice of the output; reduce-scatter output = this rank's slice of the input;
torch's all-reduce is always in place) are both measured; fits use out-of-place where measured.
algbw = S/t; busbw = algbw·(n−1)/n for all-gather and reduce-scatter, algbw·2(n−1)/n for all-reduce.
Sizes run up to where links saturate: 1 GiB by default on GPUs.

Link tier: an nccl-tests file tells it by its ``# Rank ... on HOST device D`` lines (ranks on more
than one host: ``inter_node``); a benchmark by torchrun's rendezvous (``WORLD_SIZE`` >
``LOCAL_WORLD_SIZE``: ``inter_node``). Neither known: the caller must say.

Model fitted per (op, world size, link tier): t = α + S·f(n)/B with f = (n−1)/n (AG/RS) or
2(n−1)/n (AR), i.e. B is the bus bandwidth. Least squares weighted by 1/t (minimises relative
error), α ≥ 0; split into two segments at the best breakpoint when one line leaves large residuals
(protocol / algorithm changes); R² in log space and the max relative error are reported, and a
fit worse than the thresholds raises ShardplanError. Fitting needs numpy only; the benchmark
imports torch.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shardplan.calibrate.timing import seconds_per_call
from shardplan.formulas.comm import OPS, ring_factor
from shardplan.support.atomic_write import write_text_atomic
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import (
    MAX_BYTES,
    MAX_FIT_POINTS,
    MAX_GPUS,
    MAX_ITERS,
    MAX_LINK_BYTES_PER_S,
    MAX_LOCAL_CPU_RANKS,
    MAX_SIZE_LADDER,
    bounded_float,
    bounded_int,
)
from shardplan.support.names import lookup

MIN_R2_LOG = 0.90
MAX_REL_ERR = 0.50
MAX_SAMPLE_TIME_S = 3600.0  # one collective call; nccl-tests' slowest rows are seconds
PIECEWISE_TRIGGER = 0.10  # try a breakpoint when a single line's max relative error exceeds this


@dataclass
class Sample:
    op: str
    world_size: int
    size_bytes: int
    time_s: float
    tier: str = "intra_node"
    dtype: str = "float32"
    in_place: bool = False

    def __post_init__(self) -> None:
        """Each field checked where a sample is made (files, nccl-tests logs, the API), so a fit never
        meets a NaN time or a text world size (a wrong type would fail deep inside the fit)."""
        if self.op not in OPS:
            raise ShardplanError("samples.op", self.op, f"expected one of {', '.join(OPS)}")
        bounded_int(self.world_size, "samples.world_size", 1, MAX_GPUS)
        bounded_int(self.size_bytes, "samples.size_bytes", 0, MAX_BYTES)
        bounded_float(self.time_s, "samples.time_s", 0.0, 1e6)
        if not isinstance(self.tier, str) or not isinstance(self.dtype, str) or not isinstance(self.in_place, bool):
            raise ShardplanError("samples", (self.tier, self.dtype, self.in_place), "tier and dtype are names; in_place a bool")

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.size_bytes / self.time_s

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * float(ring_factor(self.op, self.world_size))


# --- fitting ---------------------------------------------------------------------------------
@dataclass
class Segment:
    min_bytes: int
    max_bytes: int
    alpha_s: float
    bandwidth_bytes_per_s: float | None  # bus bandwidth B; None: latency-bound regime, t = α (see fit_link)


@dataclass
class LinkFit:
    op: str
    world_size: int
    tier: str
    segments: list[Segment]
    r2_log: float
    max_rel_err: float
    n_points: int
    residuals: list[float] = field(default_factory=list)  # relative, per sample, sorted by size

    def predict_s(self, size_bytes) -> np.ndarray:
        s = np.asarray(size_bytes, dtype=float)
        f = float(ring_factor(self.op, self.world_size))
        out = np.empty_like(s)
        for i, seg in enumerate(self.segments):
            lo = -np.inf if i == 0 else seg.min_bytes
            mask = s >= lo
            seconds_per_byte = 0.0 if seg.bandwidth_bytes_per_s is None else 1.0 / seg.bandwidth_bytes_per_s
            out = np.where(mask, seg.alpha_s + s * f * seconds_per_byte, out)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def _wls_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Minimise Σ((α + βx − t)/t)² with α ≥ 0, β ≥ 0 (β = 0: the time does not grow with size)."""
    w = 1.0 / t
    a = np.stack([w, x * w], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha = 0.0
        beta = float(np.sum(x * w * w * t) / np.sum((x * w) ** 2))
    if beta <= 0:  # latency-only range: no bandwidth information
        beta = 0.0
        alpha = float(np.sum(w) / np.sum(w * w))
    return float(alpha), float(beta)


def _rel(x, t, alpha, beta):
    return (alpha + beta * x - t) / t


def _segment(x, t, k: int):
    """Best split of the size-sorted points into k contiguous segments (each >= 3 points), by
    exhaustive search over breakpoints (sizes are few: tens of points)."""
    import itertools

    n = len(t)
    best = None
    for cuts in itertools.combinations(range(3, n - 2), k - 1):
        bounds = (0, *cuts, n)
        if any(b - a < 3 for a, b in zip(bounds, bounds[1:])):
            continue
        segs, sse = [], 0.0
        for a, b in zip(bounds, bounds[1:]):
            al, be = _wls_line(x[a:b], t[a:b])
            segs.append((a, b, al, be))
            sse += float(np.sum(_rel(x[a:b], t[a:b], al, be) ** 2))
        if best is None or sse < best[1]:
            best = (segs, sse)
    return best


def _max_rel(x, t, segs) -> float:
    return max(float(np.max(np.abs(_rel(x[a:b], t[a:b], al, be)))) for a, b, al, be in segs)


def fit_link(samples: list[Sample], min_r2_log: float = MIN_R2_LOG, max_rel_err: float = MAX_REL_ERR,
             piecewise: bool = True, max_segments: int = 3) -> LinkFit:
    """Fit t = α + S·f(n)/B to the samples of one (op, world size, tier). A NaN threshold is
    refused: every comparison with NaN is false, so it would switch the quality check off (±inf
    switches it off on purpose)."""
    for name, value in (("min_r2_log", min_r2_log), ("max_rel_err", max_rel_err)):
        if value != value:
            raise ShardplanError(name, value, "a threshold must be a number (NaN would switch the check off)")
    if not samples:
        raise ShardplanError("samples", 0, "no measurements to fit")
    keys = {(s.op, s.world_size, s.tier) for s in samples}
    if len(keys) != 1:
        raise ShardplanError("samples", sorted(keys), "fit one (op, world_size, tier) at a time")
    op, n, tier = keys.pop()
    if n < 2:
        raise ShardplanError("world_size", n, "a collective needs at least 2 ranks")
    pts = sorted((s.size_bytes, s.time_s) for s in samples if s.time_s > 0 and s.size_bytes > 0)
    if len({p[0] for p in pts}) < 3:  # one size repeated has no slope: no bandwidth
        raise ShardplanError("samples", len(pts), "need at least 3 distinct positive (size, time) points")
    if len(pts) > MAX_FIT_POINTS:  # the breakpoint search below is exhaustive (limits.py)
        raise ShardplanError("samples", len(pts), f"more than {MAX_FIT_POINTS} (size, time) points for "
                                                  f"{op} on {n} ranks ({tier}); fit one size ladder at a time")
    size = np.array([p[0] for p in pts], dtype=float)
    t = np.array([p[1] for p in pts], dtype=float)
    x = size * float(ring_factor(op, n))

    best = _segment(x, t, 1)
    for k in range(2, max_segments + 1 if piecewise else 2):
        if _max_rel(x, t, best[0]) <= PIECEWISE_TRIGGER or len(t) < 3 * k:
            break
        cand = _segment(x, t, k)
        if cand[1] >= 0.5 * best[1]:  # a breakpoint must at least halve the squared relative error
            break
        best = cand
    segments, pred = [], np.empty_like(t)
    for lo, hi, a, b in best[0]:
        # a slope below 1/MAX_LINK_BYTES_PER_S is no bandwidth any link has (the time hardly grows with
        # size): the regime is latency-bound, t = α, recorded as B = None rather than B -> 1e30 B/s
        flat = b * MAX_LINK_BYTES_PER_S < 1.0
        segments.append(Segment(int(size[lo]), int(size[hi - 1]), a, None if flat else 1.0 / b))
        pred[lo:hi] = a + (0.0 if flat else b) * x[lo:hi]
    if segments[-1].bandwidth_bytes_per_s is None:  # the large-message bandwidth every plan uses
        raise ShardplanError(f"fit[{op}, n={n}, {tier}]", f"sizes {segments[-1].min_bytes:,}..{segments[-1].max_bytes:,} B",
                             "the time does not grow with the message size up to the largest size measured: no "
                             "bandwidth to fit; measure larger sizes (--max-bytes) or check the timings")
    rel = (pred - t) / t
    lt, lp = np.log(t), np.log(pred)
    ss_tot = float(np.sum((lt - lt.mean()) ** 2))
    r2 = 1.0 - float(np.sum((lt - lp) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    fit = LinkFit(op, int(n), tier, segments, r2, float(np.max(np.abs(rel))), len(t), [float(r) for r in rel])
    if r2 < min_r2_log or fit.max_rel_err > max_rel_err:
        raise ShardplanError(f"fit[{op}, n={n}, {tier}]", f"R2_log={r2:.3f}, max_rel_err={fit.max_rel_err:.2f}",
                             f"too poor to use (need R2_log >= {min_r2_log} and max relative error <= "
                             f"{max_rel_err}); measure more iterations or a narrower size range")
    return fit


def fit_all(samples: list[Sample], **kw) -> list[LinkFit]:
    """One fit per (op, world size, tier), on its out-of-place samples where there are any (the
    nccl-tests default column), else its in-place ones."""
    if isinstance(samples, (str, bytes)) or not all(isinstance(s, Sample) for s in samples):
        raise ShardplanError("samples", type(samples).__name__, "expected a list of collectives.Sample "
                                                                "(load_samples, parse_nccl_tests_file)")
    groups: dict[tuple, list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.op, s.world_size, s.tier), []).append(s)
    fits = []
    for _, v in sorted(groups.items()):
        out_of_place = [s for s in v if not s.in_place]
        fits.append(fit_link(out_of_place or v, **kw))
    return fits


# --- nccl-tests output -------------------------------------------------------------------------
_PREFIX = re.compile(r"^\s*(\[\d+,\d+\]<stdout>:)?")


def _op_from_text(text: str) -> str | None:
    m = re.search(r"(all_?gather|reduce_?scatter|all_?reduce)_perf", text)
    return lookup(m.group(1), OPS) if m else None


_RANK_HOST = re.compile(r"^#\s*Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
TIERS = ("intra_node", "inter_node")


def tier_from_nccl_tests(text: str, source: str = "<text>") -> str:
    """``inter_node`` when the ``# Rank N Group G Pid P on HOST device D`` lines name more than one
    host, ``intra_node`` when they name one; no such lines: a one-line error asking for ``--tier``."""
    hosts = {m.group(1) for ln in text.splitlines() if (m := _RANK_HOST.match(_PREFIX.sub("", ln)))}
    if not hosts:
        raise ShardplanError("tier", None, f"{source}: no '# Rank ... on HOST device' lines tell which link tier "
                                           f"this is; pass --tier intra_node or inter_node")
    return "inter_node" if len(hosts) > 1 else "intra_node"


def tier_from_env(environ=None) -> str | None:
    """The tier a benchmark's ring spans, from torchrun's rendezvous variables: ``inter_node``
    when ``WORLD_SIZE`` > ``LOCAL_WORLD_SIZE`` (ranks on several nodes), ``intra_node`` when equal;
    None when they are not set."""
    import os

    env = os.environ if environ is None else environ
    try:
        world, local = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return "inter_node" if world > local else "intra_node"


def parse_nccl_tests(text: str, op: str | None = None, world_size: int | None = None, tier: str | None = None,
                     in_place: bool = False, source: str = "<text>") -> list[Sample]:
    """Parse the table printed by nccl-tests' ``all_gather_perf`` / ``reduce_scatter_perf`` /
    ``all_reduce_perf``. Handles the layouts with and without the ``root`` column and the
    ``error`` / ``#wrong`` column, and ``mpirun --tag-output`` prefixes. ``op`` defaults to the
    binary named in the text; ``world_size`` to the number of ``#  Rank`` lines (× nGpus lines if
    ranks are threads); ``tier`` to what the rank lines' host names say (``tier_from_nccl_tests``)."""
    if not isinstance(text, str):
        raise ShardplanError("nccl_tests", type(text).__name__, "expected the text of an nccl-tests log")
    if world_size is not None:
        world_size = bounded_int(world_size, "world_size", 2, MAX_GPUS)
    if tier is None:
        tier = tier_from_nccl_tests(text, source)
    if tier not in TIERS:
        raise ShardplanError("tier", tier, f"expected one of {', '.join(TIERS)}")
    lines = [_PREFIX.sub("", ln) for ln in text.splitlines()]
    op = op or _op_from_text(text)
    if op is None:
        raise ShardplanError("op", None, f"{source}: cannot tell which collective this is; pass --op")
    op = lookup(op, OPS) or op  # the one name rule: "all-gather", "AllGather", "all_gather"
    if op not in OPS:
        raise ShardplanError("op", op, f"expected one of {', '.join(OPS)}")
    if world_size is None:
        ranks = [ln for ln in lines if re.match(r"^#\s+Rank\s+\d+", ln)]
        world_size = len(ranks) or None
    if not world_size or world_size < 2:
        raise ShardplanError("world_size", world_size, f"{source}: cannot find >= 2 '# Rank' lines; pass --world-size")
    samples = []
    for ln in lines:
        if ln.lstrip().startswith("#") or not ln.strip():
            continue
        tok = ln.split()
        if len(tok) < 10 or not tok[0].isdigit() or not tok[1].isdigit() or len(tok[0]) > 19:
            continue
        try:
            tail = [float(v) for v in tok[-8:]]
        except ValueError:
            continue
        size = int(tok[0])
        t_us = tail[4] if in_place else tail[0]
        # a time printed as nan/inf (a failed size) or a size past MAX_BYTES is not a measurement
        if 0 < size <= MAX_BYTES and 0 < t_us <= MAX_SAMPLE_TIME_S * 1e6:
            samples.append(Sample(op, int(world_size), size, t_us * 1e-6, tier, dtype=tok[2], in_place=in_place))
    if not samples:
        raise ShardplanError("nccl_tests", source, "no result rows found (expected the nccl-tests table)")
    return samples


def parse_nccl_tests_file(path, **kw) -> list[Sample]:
    from shardplan.support.input_files import read_bytes
    from shardplan.support.limits import MAX_RECORDS_FILE_BYTES

    p = Path(path)
    # nccl-tests logs are ASCII; other bytes (a GPU name in another locale) are replaced, not refused
    text = read_bytes(p, "nccl_tests", MAX_RECORDS_FILE_BYTES).decode("utf-8", errors="replace")
    kw.setdefault("op", _op_from_text(p.name))
    return parse_nccl_tests(text, source=str(path), **kw)


# --- benchmark (torch) -------------------------------------------------------------------------
GPU_MAX_BYTES = 1 << 30   # links saturate near 1 GiB (nccl-tests tables: busbw flat from ~1 GiB on)
CPU_MAX_BYTES = 1 << 24
DEFAULT_ITERS = 20        # nccl-tests' default ``-n 20``
DEFAULT_WARMUP = 5        # nccl-tests' default ``-w 5``


def default_sizes(min_bytes: int = 1 << 10, max_bytes: int | None = None, factor: int = 2, cuda: bool | None = None
                  ) -> list[int]:
    """Sizes min, min·factor, ... up to ``max_bytes`` (default 1 GiB on GPUs, 16 MiB on CPU).

    Bounded: whole numbers with 1 <= min <= max <= limits.MAX_BYTES and 2 <= factor (a factor of 1
    or less, NaN or a fraction never reaches max), and at most limits.MAX_SIZE_LADDER sizes; the
    ladder's length is computed before it is built."""
    if max_bytes is None:
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        max_bytes = GPU_MAX_BYTES if cuda else CPU_MAX_BYTES
    min_bytes = bounded_int(min_bytes, "min_bytes", 1, MAX_BYTES)
    max_bytes = bounded_int(max_bytes, "max_bytes", 1, MAX_BYTES)
    factor = bounded_int(factor, "factor", 2, MAX_BYTES)
    if max_bytes < min_bytes:
        raise ShardplanError("sizes", f"{min_bytes}..{max_bytes} x{factor}", "need 1 <= min <= max and factor >= 2")
    rungs = 1 + int(math.floor(math.log(max_bytes / min_bytes, factor) + 1e-9))
    if rungs > MAX_SIZE_LADDER:
        raise ShardplanError("sizes", f"{min_bytes}..{max_bytes} x{factor}",
                             f"{rungs} sizes; at most {MAX_SIZE_LADDER} (raise --min-bytes or --factor)")
    sizes, s = [], min_bytes
    while s <= max_bytes and len(sizes) < MAX_SIZE_LADDER:
        sizes.append(s)
        s *= factor
    return sizes


def _buffers(op: str, numel: int, n: int, rank: int, in_place: bool, dtype, dev):
    """(output, input) of one collective, nccl-tests layout: S = the full buffer."""
    import torch

    full = torch.ones(numel, dtype=dtype, device=dev)
    k = numel // n
    if op == "all_reduce":
        return full, full
    if in_place:
        return (full, full.narrow(0, rank * k, k)) if op == "all_gather" else (full.narrow(0, rank * k, k), full)
    part = torch.ones(k, dtype=dtype, device=dev)
    return (full, part) if op == "all_gather" else (part, full)


def _timed_batch(once, iters: int, dev) -> float:
    """Seconds per iteration of ``iters`` back-to-back collectives (``timing.seconds_per_call``)."""
    return seconds_per_call(once, iters, dev.type)


def benchmark_rank(ops=OPS, sizes=None, warmup: int = DEFAULT_WARMUP, iters: int = DEFAULT_ITERS,
                   dtype: str = "float32", tier: str | None = None, in_place=(False, True)) -> list[Sample]:
    """Run on every rank of an initialised process group; returns the samples (same on all ranks):
    per op, size and placement, ``warmup`` calls, a barrier, then ``iters`` back-to-back calls
    timed as one batch (``_timed_batch``), averaged over ranks. ``tier`` defaults to the
    rendezvous's (``tier_from_env``); unknown: ``intra_node`` only if every rank is local."""
    import torch
    import torch.distributed as dist

    iters = bounded_int(iters, "iters", 1, MAX_ITERS)
    warmup = bounded_int(warmup, "warmup", 0, MAX_ITERS)
    n, rank = dist.get_world_size(), dist.get_rank()
    tier = tier or tier_from_env()
    if tier is None:
        raise ShardplanError("tier", None, "cannot tell from the rendezvous (no WORLD_SIZE / LOCAL_WORLD_SIZE); pass it")
    tdtype = getattr(torch, dtype)
    esize = torch.empty((), dtype=tdtype).element_size()
    cuda = dist.get_backend() == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sizes = sizes or default_sizes(cuda=cuda)
    samples = []
    for op in ops:
        placements = (True,) if op == "all_reduce" else tuple(in_place)
        for s in sizes:
            numel = max(n, (s // esize) // n * n)
            for inplace in placements:
                out, inp = _buffers(op, numel, n, rank, inplace, tdtype, dev)

                def once():
                    if op == "all_gather":
                        dist.all_gather_into_tensor(out, inp)
                    elif op == "reduce_scatter":
                        dist.reduce_scatter_tensor(out, inp)
                    else:
                        dist.all_reduce(out)

                for _ in range(warmup):
                    once()
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize()
                t = torch.tensor([_timed_batch(once, iters, dev)], dtype=torch.float64, device=dev)
                dist.all_reduce(t)  # sum over ranks -> mean below (nccl-tests averages over ranks)
                samples.append(Sample(op, n, numel * esize, float(t.item()) / n, tier, dtype, inplace))
    return samples


def _bench_worker(rank: int, world: int, port: int, kw: dict, outdir: str) -> None:
    import json
    import os
    import traceback
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 deprecates *_into_tensor names
    # every rank of a spawned benchmark is on this machine: the ring is intra-node
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        kwargs = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            kwargs["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
        try:
            samples = benchmark_rank(**kw)
            if rank == 0:
                write_text_atomic(Path(outdir, "samples.json"), json.dumps([asdict(s) for s in samples]))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # the parent turns the first line into a one-line error
        write_text_atomic(Path(outdir, f"rank{rank}.err"),
                          f"{type(exc).__name__}: {exc}".splitlines()[0] + "\n" + traceback.format_exc())
        raise


def check_devices(world_size: int, what: str = "world_size") -> None:
    """Refuse, up front, more local ranks than visible CUDA devices (each rank needs its own GPU;
    two ranks on one GPU hang or fail inside NCCL). Without CUDA, at most
    limits.MAX_LOCAL_CPU_RANKS ranks (gloo processes)."""
    import torch

    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if world_size > visible:
            raise ShardplanError(what, world_size, f"exceeds the {visible} visible CUDA device(s); one rank per GPU "
                                                   f"(use the fake process group for larger world sizes)")
    elif world_size > MAX_LOCAL_CPU_RANKS:  # each CPU rank is a process importing torch (limits.py)
        raise ShardplanError(what, world_size, f"above the {MAX_LOCAL_CPU_RANKS} local CPU ranks shardplan starts "
                                               f"(each is a process importing torch)")


def benchmark_spawn(world_size: int, timeout_s: float = 600.0, **kw) -> list[Sample]:
    """Start ``world_size`` local ranks (gloo on CPU, nccl on GPUs, one GPU per rank) and benchmark.
    A rank's exception comes back as a one-line ShardplanError."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    from shardplan.calibrate.launch import free_port

    if world_size < 2:
        raise ShardplanError("world_size", world_size, "a collective needs at least 2 ranks")
    check_devices(world_size)
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_bench_worker, args=(world_size, free_port(), kw, d), nprocs=world_size,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise ShardplanError("timeout_s", timeout_s, "collective benchmark did not finish")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            errs = sorted(Path(d).glob("rank*.err"))
            first = errs[0].read_text().splitlines()[0] if errs else str(exc).strip().splitlines()[-1]
            rank = errs[0].stem[4:] if errs else getattr(exc, "error_index", "?")
            raise ShardplanError("collectives", f"rank {rank}", first) from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        out = Path(d, "samples.json")
        if not out.exists():
            raise ShardplanError("collectives", f"{world_size} ranks", "rank 0 wrote no samples")
        return [Sample(**x) for x in json.loads(out.read_text())]


class _SampleRecord(BaseModel):
    """One imported sample, as ``Sample`` with its ranges: what a samples file may hold."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    op: Literal["all_gather", "reduce_scatter", "all_reduce"]
    world_size: int = Field(ge=2, le=MAX_GPUS)
    size_bytes: int = Field(gt=0, le=MAX_BYTES)
    time_s: float = Field(gt=0, le=MAX_SAMPLE_TIME_S)
    tier: Literal["intra_node", "inter_node"] = "intra_node"
    dtype: str = Field("float32", max_length=64)
    in_place: bool = False


def sample_from_dict(data: object, where: str) -> Sample:
    """A ``Sample`` from one JSON object of a samples file, or a one-line error naming it."""
    try:
        return Sample(**_SampleRecord.model_validate(data).model_dump())
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(sample)"
        value = first.get("input")
        raise ShardplanError(f"samples: {where}.{field}", "{...}" if isinstance(value, dict) else value,
                             first["msg"]) from None


def load_samples(path) -> list[Sample]:
    """Samples written by ``torchrun ... -m shardplan.calibrate.collectives --out FILE``."""
    from shardplan.support.input_files import read_json
    from shardplan.support.limits import MAX_RECORDS_FILE_BYTES

    data = read_json(path, "samples", MAX_RECORDS_FILE_BYTES)
    if not isinstance(data, list) or not data:
        raise ShardplanError("samples", str(path), "not a samples file: expected a non-empty JSON list of samples")
    return [sample_from_dict(x, f"{path}[{i}]") for i, x in enumerate(data)]


def torchrun_main(argv: list[str] | None = None) -> int:
    """Under torchrun (one rank per GPU, any number of nodes): benchmark every rank; rank 0 writes
    the samples (JSON, atomically) for ``shardplan calibrate collectives --samples FILE``.
    The tier comes from the rendezvous (``tier_from_env``)."""
    import argparse
    import json
    import os

    import torch
    import torch.distributed as dist


    ap = argparse.ArgumentParser(prog="python -m shardplan.calibrate.collectives")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-bytes", type=int, default=1 << 10)
    ap.add_argument("--max-bytes", type=int, default=None)
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    kwargs = {}
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        kwargs["device_id"] = torch.device("cuda", local)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", **kwargs)
    try:
        sizes = default_sizes(args.min_bytes, args.max_bytes, args.factor, cuda=torch.cuda.is_available())
        samples = benchmark_rank(sizes=sizes, iters=args.iters, warmup=args.warmup, dtype=args.dtype)
        if dist.get_rank() == 0:
            write_text_atomic(args.out, json.dumps([asdict(s) for s in samples], indent=1) + "\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(torchrun_main())
