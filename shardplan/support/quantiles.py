"""The one quantile behind every stated error and band in shardplan (accuracy reports, memory and
tokens/s bands, collective and GEMM errors, the GPU held-out report).

Nearest rank (numpy's ``inverted_cdf``): the q-quantile is the smallest value with at least a
fraction q of the values at or below it. Why this convention: most classes of published runs hold
2–10 rows, where interpolating between order statistics states an error no run had; with nearest
rank a stated "p90 = 23 %" is an error a real run made, and "90 % of runs within it" holds as
written. Assumption: the values are a sample of out-of-source errors; no weighting by source.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np


def quantile(values: Iterable[float], q: float) -> float:
    """The nearest-rank q-quantile of ``values`` (NaN when there are none)."""
    v = np.asarray(list(values), dtype=float)
    return float(np.quantile(v, q, method="inverted_cdf")) if v.size else math.nan
