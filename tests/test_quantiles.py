"""One quantile convention for every stated error and band (shardplan.support.quantiles)."""

import math
import re
from pathlib import Path

import pytest

from shardplan.support.quantiles import quantile

ROOT = Path(__file__).resolve().parents[1]


def test_nearest_rank_is_a_value_a_run_had():
    values = [0.30, 0.05, 0.12]
    # with three runs the 90th percentile is the worst of them, not a value interpolated below it
    assert quantile(values, 0.9) == 0.30
    assert quantile(values, 0.5) == 0.12
    assert quantile(values, 0.1) == 0.05
    assert quantile([0.1 * k for k in range(1, 11)], 0.9) == pytest.approx(0.9)
    assert all(quantile(values, q) in values for q in (0.05, 0.25, 0.5, 0.75, 0.95))


def test_at_least_q_of_the_values_lie_at_or_below_it():
    values = [float(v) for v in (7, 1, 9, 3, 3, 12, 5, 8)]
    for q in (0.1, 0.2, 0.5, 0.8, 0.9, 1.0):
        x = quantile(values, q)
        assert sum(v <= x for v in values) >= q * len(values)
        smaller = [v for v in values if v < x]
        assert not smaller or sum(v <= max(smaller) for v in values) < q * len(values)


def test_no_values():
    assert math.isnan(quantile([], 0.9))


def test_no_other_quantile_implementation():
    """Every module states its errors and bands with the one function: no direct numpy quantile or
    percentile, and no hand-rolled nearest-rank, anywhere else in the package, tools or benchmarks."""
    pattern = re.compile(r"np\.(nan)?(quantile|percentile)\(|statistics\.quantiles\(|def quantile\(")
    own = ROOT / "shardplan" / "support" / "quantiles.py"
    offenders = [str(p.relative_to(ROOT)) for folder in ("shardplan", "tools", "benchmarks")
                 for p in (ROOT / folder).rglob("*.py") if p != own and pattern.search(p.read_text())]
    assert offenders == []
