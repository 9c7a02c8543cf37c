"""docs/accuracy.md's generated sections and the numbers CI holds the project to.

``python tools/update_accuracy.py`` runs ``shardplan accuracy`` over the development set
(tests/data/published_runs/runs.csv) and writes its table between the markers of the section named
``memory-report`` in docs/accuracy.md; the band's unknown-stack fractions fitted on every source into
shardplan/data/accuracy_bands.json (``validation/bands.py``); the time half (the tokens/s section and
the throughput band from its 10th/90th percentiles, ``validation/tokens.py``; the calibrated window
factor in shardplan/data/time_calibration.json, ``validation/window_factor.py``); the collectives table
(``validation/collectives.py``); and the headline numbers to
tests/data/published_runs/accuracy_committed.json, which tests/test_accuracy_report.py compares each
run with: a change that makes any of them worse fails. ``--check`` only reports whether the files are
current (exit 1 when not).
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "tests" / "data" / "published_runs" / "runs.csv"
DOC = ROOT / "docs" / "accuracy.md"
COMMITTED = ROOT / "tests" / "data" / "published_runs" / "accuracy_committed.json"
SECTION = "memory-report"
COMMAND = "shardplan accuracy"


BANDS = ROOT / "shardplan" / "data" / "accuracy_bands.json"
TIME_CALIBRATION = ROOT / "shardplan" / "data" / "time_calibration.json"


def generated() -> tuple[str, dict, str]:
    """(the markdown table, the headline numbers, the band file with the fractions fitted on
    every source) of the current tree."""
    from shardplan.formulas.accuracy_bands import load_bands
    from shardplan.validation import accuracy, bands

    judged, bands_of = accuracy.judge_out_of_source(runs())
    data = accuracy.report(judged, bands_of)
    default, stacks = bands.fitted([o for o in judged if isinstance(o, accuracy.Outcome)])
    shipped = bands.with_fractions(load_bands(BANDS), default, stacks,
                                   f"q{bands.UPPER_QUANTILE:g} / q{bands.LOWER_QUANTILE:g} of measured / predicted "
                                   f"over the published runs (tools/update_accuracy.py)")
    band = shipped.model_dump(by_alias=True)
    band["throughput"] = throughput_band(band["throughput"])
    text = json.dumps(band, indent=2, ensure_ascii=False) + "\n"
    return accuracy.render(data, COMMAND), accuracy.headline(data), text


def throughput_band(shipped: dict) -> dict:
    """The shipped throughput entry with its fractions, counts and derivation from the tokens/s
    report's out-of-source errors (``tokens.band_quantiles``; tests/test_verdict.py re-derives it)."""
    from shardplan.validation import tokens

    rows = token_rows()
    slower, faster = tokens.band_quantiles(rows)
    s = tokens.stats(r.error for r in rows)
    derivation = (f"error = predicted / published - 1 of tokens/s/GPU over the {len(rows)} development-set runs with "
                  f"tokens/s that shardplan expresses (median |error| {s['median_abs']:.1%}, signed median "
                  f"{s['signed_median']:+.1%}, p90 {s['p90_abs']:.1%}, nearest-rank quantiles); nothing in the time "
                  "model but the window factor is fitted on them, and each source is predicted with the factor fitted on "
                  "the other sources (shardplan.validation.window_factor), so each error is out of source. Two-sided: low = estimate / (1 + p90 "
                  f"error) = estimate / (1 + {slower:.3f}); high = estimate x (1 + {faster:.3f}), 1 / (1 + p10 error) "
                  "- 1: runs faster than predicted exist. The middle 80 % of runs lie inside. gpu_families: the same "
                  "percentiles over each GPU family's runs (hardware.gpu_family); an answer on a family gets the wider "
                  "of the two on each side (ThroughputBand.fractions)")
    return {**shipped, "slower_than_predicted": round(slower, 3), "faster_than_predicted": round(faster, 3),
            "runs": len(rows), "median_error": round(s["signed_median"], 3), "derivation": derivation,
            "gpu_families": family_bands(rows)}


def family_bands(rows: list) -> dict[str, dict]:
    """The band file's ``gpu_families`` (``tokens.family_bands``), rounded as the all-runs entry is."""
    from shardplan.validation import tokens

    return {family: {k: round(v, 3) if isinstance(v, float) else v for k, v in band.model_dump().items()}
            for family, band in tokens.family_bands(rows).items()}


COLLECTIVES = ("<!-- collectives:begin -->", "<!-- collectives:end -->")


@lru_cache(maxsize=1)
def runs() -> tuple:
    """The development set read once per run (the memory report and the tokens/s rows use it)."""
    from shardplan.validation.runs import read_runs

    return tuple(read_runs(RUNS))


@lru_cache(maxsize=1)
def _at_one() -> tuple[list, list]:
    """The development set's tokens/s queries and their predictions at k = 1, predicted once per
    run: the window factor's fit and the out-of-source rows both start from them."""
    from shardplan.validation import tokens

    queries = tokens.with_tokens(runs())
    return queries, tokens.predict(queries, window_factor=1.0)


@lru_cache(maxsize=1)
def token_rows() -> tuple:
    """The development set's tokens/s rows, predicted out of source once per run (the band and the
    section read them)."""
    from shardplan.validation import tokens

    return tuple(tokens.out_of_source(*_at_one()))


def window_factor_text() -> str:
    """shardplan/data/time_calibration.json as fitted on the tokens/s rows predicted at k = 1
    (``validation/window_factor.py``)."""
    from shardplan.validation import window_factor

    return window_factor.calibration_text(_at_one()[1])


def between(doc: str, begin: str, end: str, section: str) -> str:
    """``doc`` with its ``begin`` … ``end`` section (markers included) replaced by ``section``."""
    head, rest = doc.split(begin, 1)
    return head + section + rest.split(end, 1)[1]


def main(argv: list[str]) -> int:
    from shardplan.support.atomic_write import write_generated
    from shardplan.validation.accuracy import replace_section

    table, numbers, band_file = generated()
    from shardplan.calibrate import sustained
    from shardplan.validation import collectives, tokens

    doc = replace_section(DOC.read_text(), SECTION, table)
    doc = between(doc, tokens.BEGIN, tokens.END, tokens.report_markdown(list(token_rows())))
    begin, end = COLLECTIVES
    doc = between(doc, begin, end, f"{begin}\n{collectives.report_markdown().rstrip()}\n{end}")
    doc = between(doc, sustained.BEGIN, sustained.END, sustained.report_markdown())
    committed = json.dumps(numbers, indent=1, sort_keys=True) + "\n"
    files = {DOC: doc, COMMITTED: committed, BANDS: band_file, TIME_CALIBRATION: window_factor_text()}
    stale = write_generated(files, check="--check" in argv)
    if "--check" in argv:
        print("stale: " + ", ".join(stale) if stale else "current")
        return 1 if stale else 0
    print(f"wrote {', '.join(stale) or 'nothing (current)'}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
