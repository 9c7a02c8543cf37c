"""Achieved matmul throughput per dtype and size, and the efficiency curve the throughput model uses.

Measurement: C = A @ B with square m×m operands (FLOPs = 2m³), ``warmup`` untimed runs, median of
``iters`` timed runs (CUDA: synchronised; CPU: one thread per process unless told otherwise).

Curve (documented form, a log-logistic / Hill saturation):

    achieved(m) = F_max / (1 + (m_half / m)^p)          eff(m) = eff_max / (1 + (m_half / m)^p)

with eff_max = F_max / peak when a nameplate peak is given. p = 1 is the classic
"overhead + under-filled machine" curve F_max·m/(m + m_half); measured CPU and GPU GEMMs rise
faster than that at small m (tiles not filled, kernel launch), so p is fitted too. For each p on a
grid (0.5 … 4) the fit is linear in m^-p: 1/achieved = 1/F_max + (m_half^p/F_max)·m^-p, weighted to
minimise relative error; the p with the smallest squared relative error wins. For a GEMM of shape
(M, N, K) the planner may use m = (M·N·K)^(1/3).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from shardplan.errors import ShardplanError


@dataclass
class MatmulSample:
    dtype: str
    m: int
    time_s: float
    device: str = "cpu"

    @property
    def flops(self) -> float:
        return 2.0 * self.m**3

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s


@dataclass
class ComputeFit:
    dtype: str
    device: str
    f_max_flops_per_s: float
    m_half: float
    p: float
    peak_flops_per_s: float | None
    eff_max: float | None
    max_rel_err: float
    n_points: int
    residuals: list[float] = field(default_factory=list)

    def achieved_flops_per_s(self, m):
        m = np.asarray(m, dtype=float)
        return self.f_max_flops_per_s / (1.0 + (self.m_half / m) ** self.p)

    def to_dict(self) -> dict:
        return asdict(self)


def fit_efficiency(samples: list[MatmulSample], peak_flops_per_s: float | None = None,
                   max_rel_err: float = 0.5) -> ComputeFit:
    if len(samples) < 3:
        raise ShardplanError("samples", len(samples), "need at least 3 matmul sizes to fit")
    if len({(s.dtype, s.device) for s in samples}) != 1:
        raise ShardplanError("samples", "mixed", "fit one dtype and device at a time")
    m = np.array([s.m for s in samples], dtype=float)
    f = np.array([s.flops_per_s for s in samples], dtype=float)
    best = None
    for p in np.arange(0.5, 4.01, 0.1):
        mp = m ** -p
        a = np.stack([f, f * mp], axis=1)  # minimise Σ((c0 + c1·m^-p)·f − 1)²
        (c0, c1), *_ = np.linalg.lstsq(a, np.ones_like(f), rcond=None)
        if c0 <= 0:  # no saturation inside the measured range: anchor F_max at the best rate seen
            c0 = 1.0 / f.max()
            c1 = float(np.sum((1 - c0 * f) * f * mp) / np.sum((f * mp) ** 2))
        c1 = max(float(c1), 0.0)
        pred = 1.0 / (c0 + c1 * mp)
        sse = float(np.sum(((pred - f) / f) ** 2))
        if best is None or sse < best[0]:
            best = (sse, round(float(p), 2), float(c0), c1, pred)
    _, p, c0, c1, pred = best
    f_max, m_half = 1.0 / c0, (c1 / c0) ** (1.0 / p) if c1 > 0 else 0.0
    rel = (pred - f) / f
    fit = ComputeFit(samples[0].dtype, samples[0].device, float(f_max), float(m_half), p, peak_flops_per_s,
                     float(f_max / peak_flops_per_s) if peak_flops_per_s else None,
                     float(np.max(np.abs(rel))), len(m), [float(r) for r in rel])
    if fit.max_rel_err > max_rel_err:
        raise ShardplanError(f"fit[matmul {fit.dtype}]", f"max_rel_err={fit.max_rel_err:.2f}",
                             f"the curve F_max/(1+(m_half/m)^p) does not describe the measurements "
                             f"(limit {max_rel_err}); measure more iterations")
    return fit


def measure_matmul(dtypes=("float32", "bfloat16"), sizes=(64, 128, 256, 512, 1024), warmup: int = 2,
                   iters: int = 5, device: str | None = None, progress=None) -> list[MatmulSample]:
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = []
    for dt in dtypes:
        tdtype = getattr(torch, dt)
        for m in sizes:
            a = torch.randn(m, m, device=device).to(tdtype)
            b = torch.randn(m, m, device=device).to(tdtype)
            for _ in range(warmup):
                a @ b
            times = []
            for _ in range(iters):
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                a @ b
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            s = MatmulSample(dt, m, statistics.median(times), device)
            out.append(s)
            if progress:
                progress(f"matmul {dt} m={m}: {s.flops_per_s / 1e9:.2f} GFLOP/s")
    return out
