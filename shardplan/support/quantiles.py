"""The one quantile behind every stated error and band in shardplan (accuracy reports, memory and
tokens/s bands, collective and GEMM errors, the GPU held-out report), and the one summary of a
list of errors every report states (``error_stats``).

Nearest rank (numpy's ``inverted_cdf``): the q-quantile is the smallest value with at least a
fraction q of the values at or below it. Why this convention: most classes of published runs hold
2–10 rows, where interpolating between order statistics states an error no run had; with nearest
rank a stated "p90 = 23 %" is an error a real run made, and "90 % of runs within it" holds as
written. Assumption: the values are a sample of out-of-source errors; no weighting by source.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np


def quantile(values: Iterable[float], q: float) -> float:
    """The nearest-rank q-quantile of ``values`` (NaN when there are none)."""
    v = np.asarray(list(values), dtype=float)
    return float(np.quantile(v, q, method="inverted_cdf")) if v.size else math.nan


def median(values: Iterable[float]) -> float:
    """The median (the mean of the two middle values for an even count; NaN when there are none)."""
    v = np.asarray(list(values), dtype=float)
    return float(np.median(v)) if v.size else math.nan


def error_stats(errors: Iterable[float]) -> dict[str, Any]:
    """n, median |error|, signed median, p90 |error| (nearest rank), largest |error| and the signed
    error of that largest one (``worst``), for errors given as fractions."""
    e = [float(x) for x in errors]
    absolute = [abs(x) for x in e]
    return {"n": len(e), "median_abs": median(absolute), "signed_median": median(e),
            "p90_abs": quantile(absolute, 0.9), "max_abs": max(absolute) if e else math.nan,
            "worst": max(e, key=abs) if e else math.nan}
