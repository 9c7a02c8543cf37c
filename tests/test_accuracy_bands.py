"""``formulas/accuracy_bands.py``'s measured classes recomputed from their cited source,
data/calibration/predicted_vs_measured.csv: each is the largest under-prediction (measured above
predicted, relative) of its categories over the committed runs, rounded up to two significant digits."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from shardplan.formulas.accuracy_bands import load_bands

ROWS = list(csv.DictReader((Path(__file__).resolve().parent.parent / "data/calibration/predicted_vs_measured.csv").open()))
CATEGORIES = {"model_states": ("params_sharded", "grads_sharded", "optimizer"),
              "activations": ("activations",),
              "engine_buffers": ("all_gather_buffers", "reduce_scatter_buffers", "unsharded_params", "unsharded_grads"),
              "peak_moments": ("forward_peak", "backward_peak", "total_peak")}


def _rounded_up(x: float) -> float:
    if x <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(round(x / step, 9)) * step


@pytest.mark.parametrize("band_class", sorted(CATEGORIES))
def test_measured_class_is_the_largest_under_prediction(band_class):
    worst = max((int(r["measured_bytes"]) - int(r["predicted_bytes"])) / int(r["predicted_bytes"])
                for r in ROWS if r["category"] in CATEGORIES[band_class] and int(r["predicted_bytes"]) > 0)
    band = load_bands().cls(band_class)
    assert band.status == "measured"
    assert math.isclose(band.relative_error, _rounded_up(worst), rel_tol=1e-9, abs_tol=1e-12), (band_class, worst)


def test_the_source_covers_every_committed_run():
    assert len({r["key"] for r in ROWS}) >= 56 and {c for cats in CATEGORIES.values() for c in cats} <= {r["category"] for r in ROWS}
