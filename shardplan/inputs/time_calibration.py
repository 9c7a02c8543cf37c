"""The calibrated window factor (``shardplan/data/time_calibration.json``): what a published
tokens/s — a window average over many steps of a run — takes beyond the kernel rates the time
model prices (``throughput.ComputeRates.window_factor``; 1 = the fastest step of a warm GPU).

Nothing in the time model's mechanisms says where it comes from; it is *calibrated*: fitted on
the development set's published tokens/s and judged leave-one-source-out
(``shardplan.validation.window_factor``, which writes this file; docs/accuracy.md "Time"). Answers
label it so (``formulas.efficiencies``: ``window … (calibrated)``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, PositiveFloat

from shardplan.inputs.profiles import load_profile

TIME_CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "data" / "time_calibration.json"


class WindowFactor(BaseModel):
    """The ``window_factor`` entry: the value answers use, how it was fitted, each source's own
    factor and the one fitted without it."""

    model_config = ConfigDict(extra="forbid")
    value: PositiveFloat
    status: str
    derivation: str
    per_source: dict[str, float]
    loso: dict[str, float]


class TimeCalibrationFile(BaseModel):
    """The file: one ``window_factor`` entry."""

    model_config = ConfigDict(extra="forbid")
    window_factor: WindowFactor


def load(path: Path) -> WindowFactor:
    """The file's entry, validated like every shipped profile (``profiles.load_profile``: one-line
    error naming the field)."""
    return load_profile(Path(path), TimeCalibrationFile).window_factor


@lru_cache(maxsize=1)
def time_calibration() -> dict:
    """The shipped file's ``window_factor`` entry: value, derivation, per-source and leave-one-out values."""
    return load(TIME_CALIBRATION_FILE).model_dump()


def window_factor(stated: float | None = None) -> float:
    """The factor on a step's GPU seconds: ``stated`` where the caller states one (1: kernel rates),
    else the calibrated one answers use (≥ 1 as fitted). The one place where "none stated" means
    the calibrated factor; ``throughput.compute_rates`` itself defaults to 1, so the kernel-rate
    comparisons (the H100 campaign) stay at kernel rates."""
    return float(time_calibration()["value"]) if stated is None else float(stated)
