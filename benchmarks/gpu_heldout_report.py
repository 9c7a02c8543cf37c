"""Predicted vs measured on the held-out third of the GPU runs of the scripts users launch (issue 25).

    python benchmarks/gpu_heldout_report.py          # rewrites the files below and docs/accuracy.md's section

Writes, in data/calibration/gpu/userscripts/:
  heldout_errors.json  the summary per counter and per class (tests/test_gpu_heldout.py checks it)
  heldout_errors.csv   one row per held-out run: configuration, measured / predicted bytes, error per
                       counter, for the band classes (memtruth's out-of-source band derivation)
  train_errors.csv     the same for the train split (what any fit may look at)
and the table between the ``gpu-heldout`` markers of docs/accuracy.md. Evaluates only: fits nothing.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardplan.calibrate import gpu_split  # noqa: E402
from shardplan.calibrate.gpu_heldout import COUNTERS, compare_file, summary  # noqa: E402
from shardplan.support.atomic_write import write_text_atomic  # noqa: E402

DOC = ROOT / "docs" / "accuracy.md"
BEGIN, END = "<!-- gpu-heldout:begin -->", "<!-- gpu-heldout:end -->"
COMMAND = "python benchmarks/gpu_heldout_report.py"


def rows_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def table(stats: list[dict], first: str) -> list[str]:
    lines = [f"| {first} | counter | runs | signed median | median \\|error\\| | p90 \\|error\\| | worst |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in stats:
        lines.append(f"| {s['group']} | {s['counter']} | {s['runs']} | {pct(s['signed_median'])} | "
                     f"{abs(s['median_abs']) * 100:.1f} % | {s['p90_abs'] * 100:.1f} % | {pct(s['worst'])} |")
    return lines


def section(held: list[dict], train: list[dict]) -> str:
    overall, by_class = summary(held), summary(held, by="class")
    tr = summary(train)
    return "\n".join([
        BEGIN, "", f"Regenerate: `{COMMAND}` (reads only data/calibration/gpu/userscripts/; fits nothing).", "",
        f"Held-out third: {len(held)} runs (train split: {len(train)}). error = (predicted − measured) / measured.",
        "", "**Held out, all runs, per counter**", "", *table(overall, "split"), "",
        "**Held out, per class (stack × method × engine)**", "", *table(by_class, "class"), "",
        "**Train split, per counter (for comparison; not out of sample)**", "", *table(tr, "split"), "", END])


def main() -> int:
    held = compare_file(gpu_split.FOLDER / gpu_split.HELDOUT_NAME)
    train = compare_file(gpu_split.FOLDER / gpu_split.TRAIN_NAME)
    stats = summary(held) + summary(held, by="class")
    write_text_atomic(gpu_split.FOLDER / "heldout_errors.json",
                      json.dumps({"command": COMMAND, "counters": list(COUNTERS), "summary": stats}, indent=1) + "\n")
    write_text_atomic(gpu_split.FOLDER / "heldout_errors.csv", rows_csv(held))
    write_text_atomic(gpu_split.FOLDER / "train_errors.csv", rows_csv(train))
    doc = DOC.read_text()
    new = section(held, train)
    if BEGIN in doc:
        doc = doc[:doc.index(BEGIN)] + new + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## GPU runs of the scripts users launch: held-out third (issue 25)\n\n" + new + "\n"
    write_text_atomic(DOC, doc)
    print("\n".join(table(stats, "group")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
