"""GEMM efficiency as a function of the problem shape, fitted on measured matmul probes.

Probes (``benchmarks/gpu_campaign.py probes``; ``data/calibration/gpu/probes.jsonl`` on one H100):
C[m, n] = A[m, k] @ B[k, n], 50 (or 20) back-to-back products between CUDA events, rotating
operands. Efficiency = achieved TFLOP/s / the dtype's dense peak.

Model: a power law eff(m, n, k) = A · m^a · n^b · k^c, least squares on ln eff over the 16-bit
probes (bf16 and fp16 share the peak and, measured, the shape dependence: one fit), clipped to
[``EFF_FLOOR``, the best measured efficiency] so that shapes outside the probes never exceed what
was measured. Probes whose time per product is under ``LAUNCH_FLOOR_FACTOR`` × the fastest probe's
are excluded: at 512³ and 1024³ every product takes the same ~21 µs, the host launching them, not
the GEMM (training's GEMMs take ≥ 100 µs).

Leave-one-shape-out: each (m, n, k) is predicted by the fit on the other shapes (both dtypes of it
left out); the median and 90th percentile of |predicted / measured − 1| are the stated error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shardplan.support.quantiles import quantile

SIXTEEN_BIT = ("bf16", "fp16")
LAUNCH_FLOOR_FACTOR = 2.0
EFF_FLOOR = 0.05
PEAK_TFLOPS_16BIT = {"h100-sxm": 989.4}  # the profile's dense bf16/fp16 peak (H100 whitepaper)


def gemm_points(probes_path: str | Path) -> list[tuple[int, int, int, float, str]]:
    """(m, n, k, TFLOP/s, dtype) of the 16-bit GEMM probes that are not launch-bound."""
    recs = [json.loads(line) for line in Path(probes_path).read_text().splitlines() if line.strip()]
    gemms = [r for r in recs if r.get("probe") == "gemm" and r.get("dtype") in SIXTEEN_BIT]
    floor = min(r["time_s"] for r in gemms)
    return [(r["m"], r["n"], r["k"], r["tflops"], r["dtype"]) for r in gemms
            if r["time_s"] >= LAUNCH_FLOOR_FACTOR * floor]


def _design(points) -> np.ndarray:
    return np.array([[1.0, np.log(m), np.log(n), np.log(k)] for m, n, k, *_ in points])


def fit_shape_coefficients(points, peak_tflops: float) -> np.ndarray:
    """(A, a, b, c) by least squares on ln efficiency."""
    y = np.log([p[3] / peak_tflops for p in points])
    coef, *_ = np.linalg.lstsq(_design(points), y, rcond=None)
    return np.array([np.exp(coef[0]), coef[1], coef[2], coef[3]])


def predict(coef, m, n, k, eff_max):
    """eff(m, n, k) = A · m^a · n^b · k^c, clipped to [EFF_FLOOR, eff_max]; broadcasts."""
    return np.clip(coef[0] * m ** coef[1] * n ** coef[2] * k ** coef[3], EFF_FLOOR, eff_max)


def leave_one_shape_out(points, peak_tflops: float) -> list[float]:
    """predicted / measured − 1 of every probe, each shape predicted by the fit on the others."""
    errors = []
    for shape in sorted({p[:3] for p in points}):
        train = [p for p in points if p[:3] != shape]
        coef = fit_shape_coefficients(train, peak_tflops)
        eff_max = max(p[3] for p in train) / peak_tflops
        errors += [float(predict(coef, *shape, eff_max)) / (p[3] / peak_tflops) - 1 for p in points if p[:3] == shape]
    return errors


def fit_table(probes_path: str | Path, gpu: str) -> dict:
    """A GPU profile's ``gemm_shape_fit`` (``inputs.hardware.GemmShapeFit``) from its probes."""
    points = gemm_points(probes_path)
    peak = PEAK_TFLOPS_16BIT[gpu]
    errors = np.abs(leave_one_shape_out(points, peak))
    return {"coefficients": [round(float(c), 7) for c in fit_shape_coefficients(points, peak)],
            "eff_max": round(max(p[3] for p in points) / peak, 4),
            "shapes": len({p[:3] for p in points}), "probes": len(points),
            "loso_median_abs_error": round(float(np.median(errors)), 4),
            "loso_p90_abs_error": round(quantile(errors, 0.9), 4)}

