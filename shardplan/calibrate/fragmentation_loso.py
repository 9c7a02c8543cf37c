"""The fragmentation coefficient and its band (allocator.py mechanism 3), fitted and judged
leave-one-source-out.

A *source* is one file of GPU runs that read both ``max_memory_allocated`` and
``max_memory_reserved``: each in-house campaign file (data/calibration/gpu/*.jsonl,
benchmarks/gpu_campaign.py) and the *train* split of the user-script runs (never the held-out
third: tests/test_gpu_heldout.py). No published row reads both counters, so none is a source.

Per run, slack = measured reserved − measured allocated − the predicted side-stream pools
(mechanism 2): what the fragmentation term must carry, judged alone (the allocated peak's own
error is left out). The coefficient k of an allocator group minimises the squared relative
error of the reserved peak over the group's runs, k = Σ x·y / Σ x² with x = regressor / reserved
and y = slack / reserved (least squares through the origin; clipped at 0). A group with no run in
the fitted sources takes the fit of every fitted run.

Out of source: for each source, k is fitted on the other sources and the source's runs are
predicted with it. The band of a group is the 0.9 (upper) and 0.1 (lower) nearest-rank quantile
of the out-of-source residual (measured − predicted slack) / regressor over the group's runs: 90 %
of the runs no source of the fit had seen held at most ``band_upper`` × regressor more slack than
predicted. ASSUMPTION: the residual scales with the regressor (the step-2 growth of the campaign's
FSDP runs is 3–5.5 loss blocks, whatever their allocated peak; docs/accuracy.md).

``python -m shardplan.calibrate.fragmentation_loso`` prints the table docs/accuracy.md shows;
``--write`` rewrites allocator.json's ``fragmentation_per_transient`` from the records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from shardplan.calibrate import gpu_split
from shardplan.calibrate.gpu_compare import campaign_columns, load_file
from shardplan.calibrate.gpu_heldout import user_columns
from shardplan.formulas.allocator import CLASSES, allocator_class, largest_transient_bytes
from shardplan.formulas.memory import estimate_memory
from shardplan.support.quantiles import error_stats, quantile

CAMPAIGN = Path(__file__).resolve().parents[2] / "data" / "calibration" / "gpu"
ALLOCATOR_FILE = Path(__file__).resolve().parents[1] / "data" / "allocator.json"
USER_SOURCE = "userscripts_train"
UPPER_QUANTILE, LOWER_QUANTILE = 0.9, 0.1
# What the slack is regressed on: the shipped one first (allocator.fragmentation_bytes); the other is
# the alternative the docs table judges beside it.
REGRESSORS = ("transient", "allocated")
# FSDP1 and FSDP2 are fitted apart: in both sources FSDP1 leaves more slack than FSDP2 at the same
# configuration (its flat unit-sized parameter and gradient blocks; campaign W=8 AC full 12.0 vs
# 7.3-8.2 GiB, user scripts W=8 no AC 2.6 vs 2.2 GiB), and apart they predict the left-out sources
# better than pooled (docs/accuracy.md, "Why the FSDP sources disagree").
GROUPS = {"no_side_streams": "one GPU", "fsdp2": "FSDP2", "fsdp1": "FSDP1", "expandable_segments": "expandable segments"}


def sources(folder: Path = CAMPAIGN) -> dict[str, list[dict]]:
    """Each source's completed runs as ``slack_row``s: the campaign files by name, then the user
    scripts' train split."""
    out: dict[str, list[dict]] = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        if path.name in ("probes.jsonl", "load.jsonl"):
            continue
        out[path.stem] = [slack_row(r, campaign_columns(r, "h100-sxm")) for r in load_file(path) if r.get("status") == "ok"]
    train = gpu_split.read(gpu_split.FOLDER / gpu_split.TRAIN_NAME)
    out[USER_SOURCE] = [slack_row(r, user_columns(r["config"])) for r in train if r.get("status") == "ok"]
    return out


def slack_row(rec: dict, c) -> dict:
    """What the fit reads of one run: its allocator group, the measured counters, the predicted
    pools and both regressors (the largest transient; the predicted allocated peak)."""
    m = estimate_memory(c)
    cls = CLASSES[int(allocator_class(c, c.expandable_segments))]
    allocated, reserved = rec["max_allocated_bytes"], rec["max_reserved_bytes"]
    return {"cls": cls, "group": GROUPS[cls], "allocated": allocated, "reserved": reserved,
            "slack": reserved - allocated - int(m["stream_pool_bytes"]),
            "transient": int(largest_transient_bytes(c)), "allocated_predicted": int(m["peak_allocated_bytes"])}


def _x(row: dict, regressor: str) -> int:
    return row["transient"] if regressor == "transient" else row["allocated_predicted"]


def fit(rows: list[dict], regressor: str = "transient") -> dict[str, float]:
    """k per group: least squares of the relative reserved error through the origin (module doc)."""
    def k(group_rows):
        x = np.array([_x(r, regressor) / r["reserved"] for r in group_rows])
        y = np.array([r["slack"] / r["reserved"] for r in group_rows])
        return max(float(x @ y / (x @ x)), 0.0)

    every = k(rows)
    return {g: (k(got) if (got := [r for r in rows if r["group"] == g]) else every) for g in sorted(set(GROUPS.values()))}


def out_of_source(src: dict[str, list[dict]], regressor: str = "transient") -> list[dict]:
    """Every run predicted with k fitted on the other sources: its source, group, residual
    (measured − predicted slack) / regressor and reserved error (predicted / measured − 1, with
    the measured allocated peak)."""
    out = []
    for name, rows in src.items():
        k = fit([r for other, got in src.items() if other != name for r in got], regressor)
        for r in rows:
            predicted = k[r["group"]] * _x(r, regressor)
            out.append({"source": name, "group": r["group"], "residual": (r["slack"] - predicted) / _x(r, regressor),
                        "error": (r["allocated"] + (r["reserved"] - r["allocated"] - r["slack"]) + predicted) / r["reserved"] - 1})
    return out


def refit_fragmentation(train: list[dict]) -> dict[str, float]:
    """The allocator's k per allocator group (reserved slack per byte of the largest transient)
    fitted on the *train* split only, the way allocator.json's is fitted
    (``fit``): the fit the held-out third then judges."""
    rows = [slack_row(r, user_columns(r["config"])) for r in train if r.get("status") == "ok"]
    present = {r["group"] for r in rows}
    return {g: k for g, k in fit(rows).items() if g in present}


def reserved_with(rec: dict, k_by_group: dict[str, float]) -> int | None:
    """The reserved prediction with ``k_by_group`` in place of allocator.json's k (None when the
    run's group had no train run)."""
    c = user_columns(rec["config"])
    k = k_by_group.get(GROUPS[CLASSES[int(allocator_class(c, c.expandable_segments))]])
    if k is None:
        return None
    m = estimate_memory(c)
    return int(m["peak_allocated_bytes"]) + int(m["stream_pool_bytes"]) + int(k * int(largest_transient_bytes(c)))


def coefficients(src: dict[str, list[dict]]) -> dict[str, dict]:
    """allocator.json's ``fragmentation_per_transient``: per class, k fitted on every source, and
    the band fractions of the transient from the out-of-source residuals of its group."""
    every = [r for rows in src.values() for r in rows]
    k = fit(every)
    judged = out_of_source(src)
    out = {}
    for cls, group in GROUPS.items():
        res = [j["residual"] for j in judged if j["group"] == group]
        out[cls] = {"k": round(k[group], 4),
                    "band_upper": round(max(quantile(res, UPPER_QUANTILE), 0.0), 4),
                    "band_lower": round(max(-quantile(res, LOWER_QUANTILE), 0.0), 4),
                    "runs": sum(r["group"] == group for r in every)}
    return out


def summary(judged: list[dict]) -> list[dict]:
    """Per left-out source (then all): runs, signed median, median and p90 |reserved error|."""
    def stats(name, errors):
        s = error_stats(errors)
        return {"source": name, "runs": s["n"], **{k: s[k] for k in ("signed_median", "median_abs", "p90_abs")}}
    names = list(dict.fromkeys(j["source"] for j in judged))
    return [stats(n, [j["error"] for j in judged if j["source"] == n]) for n in names] + \
        [stats("all", [j["error"] for j in judged])]


def render(src: dict[str, list[dict]]) -> str:
    """The markdown table docs/accuracy.md shows (tests/test_allocator.py compares them): each
    source's reserved error under k fitted without it, for the shipped regressor and the other."""
    cols = {reg: summary(out_of_source(src, reg)) for reg in REGRESSORS}
    lines = ["| left-out source | runs | largest transient (shipped): signed median / median / p90 abs error | "
             "allocated peak: signed median / median / p90 abs error |", "| --- | ---: | ---: | ---: |"]
    for a, b in zip(cols["transient"], cols["allocated"], strict=True):
        lines.append(f"| {a['source']} | {a['runs']} | " + " | ".join(
            f"{100 * s['signed_median']:+.1f} % / {100 * s['median_abs']:.1f} % / {100 * s['p90_abs']:.1f} %" for s in (a, b)) + " |")
    return "\n".join(lines)


def write(path: Path = ALLOCATOR_FILE) -> dict:
    """Rewrite allocator.json's ``fragmentation_per_transient`` from the records (atomically)."""
    from shardplan.support.atomic_write import write_text_atomic

    data = json.loads(path.read_text())
    data["fragmentation_per_transient"] = coefficients(sources())
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return data["fragmentation_per_transient"]


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        print(json.dumps(write(), indent=1))
    print(render(sources()))
