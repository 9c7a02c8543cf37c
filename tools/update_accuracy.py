"""docs/accuracy.md's generated memory report and the numbers CI holds the project to.

``python tools/update_accuracy.py`` runs ``shardplan accuracy`` over the development set
(tests/data/published_runs/runs.csv), writes its table between the markers of the section named
``memory-report`` in docs/accuracy.md (other generated sections have their own names and are left
alone), and writes the headline numbers to tests/data/published_runs/accuracy_committed.json,
which tests/test_accuracy_report.py compares each run with: a change that makes any of them worse
fails. ``--check`` only reports whether the two files are current (exit 1 when not).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "tests" / "data" / "published_runs" / "runs.csv"
DOC = ROOT / "docs" / "accuracy.md"
COMMITTED = ROOT / "tests" / "data" / "published_runs" / "accuracy_committed.json"
SECTION = "memory-report"
COMMAND = "shardplan accuracy"


def generated() -> tuple[str, dict]:
    """(the markdown table, the headline numbers) of the current tree."""
    from shardplan.validation import accuracy
    from shardplan.validation.runs import read_runs

    data = accuracy.report(accuracy.judge_all(read_runs(RUNS)))
    return accuracy.render(data, COMMAND), accuracy.headline(data)


def main(argv: list[str]) -> int:
    from shardplan.support.atomic_write import write_text_atomic as write_text
    from shardplan.validation.accuracy import replace_section

    table, numbers = generated()
    doc = replace_section(DOC.read_text(), SECTION, table)
    committed = json.dumps(numbers, indent=1, sort_keys=True) + "\n"
    stale = [p.name for p, text in ((DOC, doc), (COMMITTED, committed)) if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        print("stale: " + ", ".join(stale) if stale else "current")
        return 1 if stale else 0
    write_text(DOC, doc)
    write_text(COMMITTED, committed)
    print(f"wrote {', '.join(stale) or 'nothing (current)'}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
