"""The verdict's two-sided band from out-of-source errors over published runs.

For a row with a measured peak, r = measured / predicted. The upper fraction of a group of rows is
the 90th percentile of r, less 1 (real runs held up to that much more than predicted; 0 when they
never held more), the lower fraction 1 minus the 10th percentile (up to that much less). A stack
gets its own fractions when its rows come from at least ``MIN_SOURCES`` sources and number at
least ``MIN_ROWS``; every other stack the fractions of all rows pooled (the default).

Leave-one-source-out: for each source s the fractions are fitted on the other sources' rows and
the rows of s are judged with them (``loso``); the report's verdict checks and coverage are those
out-of-source ones. The fractions shipped in ``shardplan/data/accuracy_bands.json`` are fitted on
every source (``fitted``). ASSUMPTION: the upper fraction multiplies the allocated peak (the
``unknown_stack`` class's base) and the lower one the judged device total; both are ratios of the
counter each row measured, so they carry the allocator's and the non-torch bytes' errors too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from shardplan.formulas.accuracy_bands import AccuracyBands, StackBand
from shardplan.support.quantiles import quantile

# rows are ``accuracy.Outcome``s (error, stack, source); typed Any here so that accuracy, which
# reports these bands, is the only one of the two modules importing the other
Outcome = Any


UPPER_QUANTILE = 0.9
LOWER_QUANTILE = 0.1
MIN_ROWS = 8
MIN_SOURCES = 2
MAX_LOWER = 0.9  # a lower band of 100 % would make nothing ever "does not fit"


@dataclass(frozen=True)
class Fractions:
    upper: float
    lower: float
    rows: int
    sources: tuple[str, ...]


def fractions(outcomes: Iterable[Outcome]) -> Fractions | None:
    """The band fractions of these rows' errors (None without a measured row)."""
    measured = [o for o in outcomes if o.error is not None]
    if not measured:
        return None
    ratios = [1.0 / (1.0 + o.error) for o in measured]
    return Fractions(upper=round(max(quantile(ratios, UPPER_QUANTILE) - 1.0, 0.0), 4),
                     lower=round(min(max(1.0 - quantile(ratios, LOWER_QUANTILE), 0.0), MAX_LOWER), 4),
                     rows=len(measured), sources=tuple(sorted({o.source for o in measured})))


def fitted(outcomes: list[Outcome]) -> tuple[Fractions | None, dict[str, Fractions]]:
    """(the pooled default, each stack's own) fitted on ``outcomes``."""
    stacks: dict[str, Fractions] = {}
    for stack in sorted({o.stack for o in outcomes}):
        f = fractions(o for o in outcomes if o.stack == stack)
        if f is not None and f.rows >= MIN_ROWS and len(f.sources) >= MIN_SOURCES:
            stacks[stack] = f
    return fractions(outcomes), stacks


def with_fractions(base: AccuracyBands, default: Fractions | None, stacks: dict[str, Fractions],
                   derivation: str) -> AccuracyBands:
    """``base`` with the unknown-stack class's upper and lower fractions replaced."""
    data = base.model_dump(by_alias=True)
    unknown = data["classes"]["unknown_stack"]
    if default is not None:
        unknown.update(relative_error=default.upper, lower_relative_error=default.lower, status="measured",
                       source="tests/data/published_runs/runs.csv (its README names each row's source)",
                       derivation=f"{derivation}: all rows pooled ({default.rows} rows, sources "
                                  f"{', '.join(default.sources)})")
    unknown["stacks"] = {name: StackBand(relative_error=f.upper, lower_relative_error=f.lower, status="measured",
                                         derivation=f"{derivation}: {f.rows} rows of sources {', '.join(f.sources)}",
                                         source="tests/data/published_runs/runs.csv").model_dump()
                         for name, f in stacks.items()}
    return AccuracyBands.model_validate(data)


def loso(outcomes: list[Outcome], base: AccuracyBands) -> dict[str, AccuracyBands]:
    """Per source: the bands fitted on every other source's rows."""
    out = {}
    for source in sorted({o.source for o in outcomes}):
        default, stacks = fitted([o for o in outcomes if o.source != source])
        out[source] = with_fractions(base, default, stacks, f"fitted without source {source}")
    return out


def coverage(outcomes: list[Outcome], bands_of: dict[str, AccuracyBands]) -> dict[str, float | int]:
    """Out-of-source coverage: the share of measured rows whose measured peak lies within
    [predicted × (1 − lower), predicted × (1 + upper)] of the band fitted without their source."""
    inside = under = over = 0
    measured = [o for o in outcomes if o.error is not None]
    for o in measured:
        bands = bands_of[o.source]
        upper, lower = bands.stack_error(o.stack), bands.stack_lower_error(o.stack)
        ratio = 1.0 / (1.0 + o.error)
        over += ratio > 1.0 + upper
        under += ratio < 1.0 - lower
        inside += 1.0 - lower <= ratio <= 1.0 + upper
    n = len(measured)
    return {"rows": n, "inside": inside, "above_upper": over, "below_lower": under,
            "coverage": inside / n if n else float("nan")}
