"""Collective benchmarks (nccl-tests conventions), an nccl-tests output parser, and α-β fits.

Conventions (nccl-tests ``doc/PERFORMANCE.md``): S is the full buffer (all-gather output,
reduce-scatter input, all-reduce tensor); each size is run ``warmup`` times, then ``iters`` timed
iterations separated by a barrier; an iteration's time is the max over ranks; the reported time is
the median over iterations. algbw = S/t; busbw = algbw·(n−1)/n for all-gather and reduce-scatter,
algbw·2(n−1)/n for all-reduce.

Model fitted per (op, world size, link tier): t = α + S·f(n)/B with f = (n−1)/n (AG/RS) or
2(n−1)/n (AR), i.e. B is the bus bandwidth. Least squares weighted by 1/t (minimises relative
error), α ≥ 0; split into two segments at the best breakpoint when one line leaves large residuals
(protocol / algorithm changes); R² in log space and the max relative error are reported, and a
fit worse than the thresholds raises ShardplanError. Fitting needs numpy only; the benchmark
imports torch.
"""

from __future__ import annotations

import time
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from shardplan.errors import ShardplanError

OPS = ("all_gather", "reduce_scatter", "all_reduce")
MIN_R2_LOG = 0.90
MAX_REL_ERR = 0.50
PIECEWISE_TRIGGER = 0.10  # try a breakpoint when a single line's max relative error exceeds this


def bus_factor(op: str, n) -> float:
    """f(n): bytes each rank moves per byte of S, ring algorithm (nccl-tests PERFORMANCE.md)."""
    n = np.asarray(n, dtype=float)
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "all_reduce":
        return 2 * (n - 1) / n
    raise ShardplanError("op", op, f"expected one of {', '.join(OPS)}")


@dataclass
class Sample:
    op: str
    world_size: int
    size_bytes: int
    time_s: float
    tier: str = "intra_node"
    dtype: str = "float32"

    @property
    def algbw_bytes_per_s(self) -> float:
        return self.size_bytes / self.time_s

    @property
    def busbw_bytes_per_s(self) -> float:
        return self.algbw_bytes_per_s * float(bus_factor(self.op, self.world_size))


# --- fitting ---------------------------------------------------------------------------------
@dataclass
class Segment:
    min_bytes: int
    max_bytes: int
    alpha_s: float
    bandwidth_bytes_per_s: float  # bus bandwidth B


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
        f = float(bus_factor(self.op, self.world_size))
        out = np.empty_like(s)
        for i, seg in enumerate(self.segments):
            lo = -np.inf if i == 0 else seg.min_bytes
            mask = s >= lo
            out = np.where(mask, seg.alpha_s + s * f / seg.bandwidth_bytes_per_s, out)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def _wls_line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Minimise Σ((α + βx − t)/t)² with α ≥ 0, β > 0."""
    w = 1.0 / t
    a = np.stack([w, x * w], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha = 0.0
        beta = float(np.sum(x * w * w * t) / np.sum((x * w) ** 2))
    if beta <= 0:  # latency-only range: no bandwidth information
        beta = 1e-30
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
    """Fit t = α + S·f(n)/B to the samples of one (op, world size, tier)."""
    if not samples:
        raise ShardplanError("samples", 0, "no measurements to fit")
    keys = {(s.op, s.world_size, s.tier) for s in samples}
    if len(keys) != 1:
        raise ShardplanError("samples", sorted(keys), "fit one (op, world_size, tier) at a time")
    op, n, tier = keys.pop()
    if n < 2:
        raise ShardplanError("world_size", n, "a collective needs at least 2 ranks")
    pts = sorted((s.size_bytes, s.time_s) for s in samples if s.time_s > 0 and s.size_bytes > 0)
    if len(pts) < 3:
        raise ShardplanError("samples", len(pts), "need at least 3 positive (size, time) points")
    size = np.array([p[0] for p in pts], dtype=float)
    t = np.array([p[1] for p in pts], dtype=float)
    x = size * float(bus_factor(op, n))

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
        segments.append(Segment(int(size[lo]), int(size[hi - 1]), a, 1.0 / b))
        pred[lo:hi] = a + b * x[lo:hi]
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
    groups: dict[tuple, list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.op, s.world_size, s.tier), []).append(s)
    return [fit_link(v, **kw) for _, v in sorted(groups.items())]


# --- nccl-tests output -------------------------------------------------------------------------
_PREFIX = re.compile(r"^\s*(\[\d+,\d+\]<stdout>:)?")
_OP_NAMES = {"all_gather": "all_gather", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
             "reducescatter": "reduce_scatter", "all_reduce": "all_reduce", "allreduce": "all_reduce"}


def _op_from_text(text: str) -> str | None:
    m = re.search(r"(all_?gather|reduce_?scatter|all_?reduce)_perf", text)
    return _OP_NAMES[m.group(1).replace("__", "_")] if m else None


def parse_nccl_tests(text: str, op: str | None = None, world_size: int | None = None, tier: str = "intra_node",
                     in_place: bool = False, source: str = "<text>") -> list[Sample]:
    """Parse the table printed by nccl-tests' ``all_gather_perf`` / ``reduce_scatter_perf`` /
    ``all_reduce_perf``. Handles the layouts with and without the ``root`` column and the
    ``error`` / ``#wrong`` column, and ``mpirun --tag-output`` prefixes. ``op`` defaults to the
    binary named in the text; ``world_size`` to the number of ``#  Rank`` lines (× nGpus lines if
    ranks are threads)."""
    lines = [_PREFIX.sub("", ln) for ln in text.splitlines()]
    op = op or _op_from_text(text)
    if op is None:
        raise ShardplanError("op", None, f"{source}: cannot tell which collective this is; pass --op")
    op = _OP_NAMES.get(op.replace("-", "_"), op)
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
        if len(tok) < 10 or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        try:
            tail = [float(v) for v in tok[-8:]]
        except ValueError:
            continue
        size = int(tok[0])
        t_us = tail[4] if in_place else tail[0]
        if size > 0 and t_us > 0:
            samples.append(Sample(op, int(world_size), size, t_us * 1e-6, tier, dtype=tok[2]))
    if not samples:
        raise ShardplanError("nccl_tests", source, "no result rows found (expected the nccl-tests table)")
    return samples


def parse_nccl_tests_file(path, **kw) -> list[Sample]:
    p = Path(path)
    if not p.is_file():
        raise ShardplanError("nccl_tests", str(path), "no such file")
    kw.setdefault("op", _op_from_text(p.name))
    return parse_nccl_tests(p.read_text(errors="replace"), source=str(path), **kw)


# --- benchmark (torch) -------------------------------------------------------------------------
def default_sizes(min_bytes: int = 1 << 10, max_bytes: int = 1 << 24, factor: int = 4) -> list[int]:
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def benchmark_rank(ops=OPS, sizes=None, warmup: int = 2, iters: int = 5, dtype: str = "float32",
                   tier: str = "intra_node") -> list[Sample]:
    """Run on every rank of an initialised process group; returns the samples (same on all ranks)."""
    import torch
    import torch.distributed as dist

    sizes = sizes or default_sizes()
    n = dist.get_world_size()
    tdtype = getattr(torch, dtype)
    esize = torch.empty((), dtype=tdtype).element_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    samples = []
    for op in ops:
        for s in sizes:
            numel = max(n, (s // esize) // n * n)
            full = torch.ones(numel, dtype=tdtype, device=dev)
            part = torch.ones(numel // n, dtype=tdtype, device=dev)

            def once():
                if op == "all_gather":
                    dist.all_gather_into_tensor(full, part)
                elif op == "reduce_scatter":
                    dist.reduce_scatter_tensor(part, full)
                else:
                    dist.all_reduce(full)

            for _ in range(warmup):
                once()
            times = []
            for _ in range(iters):
                dist.barrier()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                once()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            tt = torch.tensor(times, dtype=torch.float64, device=dev)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # max over ranks, per iteration
            samples.append(Sample(op, n, numel * esize, statistics.median(tt.tolist()), tier, dtype))
    return samples


def _bench_worker(rank: int, world: int, port: int, kw: dict, out: str) -> None:
    import json
    import os

    import torch
    import torch.distributed as dist

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 deprecates *_into_tensor names
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        samples = benchmark_rank(**kw)
        if rank == 0:
            Path(out).write_text(json.dumps([asdict(s) for s in samples]))
    finally:
        dist.destroy_process_group()


def benchmark_spawn(world_size: int, timeout_s: float = 300.0, **kw) -> list[Sample]:
    """Start ``world_size`` local ranks (gloo on CPU, nccl on GPUs) and benchmark."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    from shardplan.calibrate.launch import free_port

    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d, "samples.json"))
        ctx = mp.start_processes(_bench_worker, args=(world_size, free_port(), kw, out), nprocs=world_size,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise ShardplanError("timeout_s", timeout_s, "collective benchmark did not finish")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [Sample(**d) for d in json.loads(Path(out).read_text())]



