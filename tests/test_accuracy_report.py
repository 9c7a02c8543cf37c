"""The memory accuracy report over the published development set (shardplan/validation/accuracy.py,
``shardplan accuracy``): it may not get worse than the committed numbers, and docs/accuracy.md
shows the table the current tree generates."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardplan.support.quantiles import median, quantile  # noqa: E402
from shardplan.validation import accuracy  # noqa: E402
from tools import update_accuracy  # noqa: E402


@pytest.fixture(scope="module")
def current():
    return update_accuracy.generated()


def test_not_worse_than_the_committed_numbers(current):
    _, numbers, _ = current
    committed = json.loads(update_accuracy.COMMITTED.read_text())
    assert not accuracy.worse(numbers, committed), (
        "the memory report got worse (tools/update_accuracy.py rewrites the committed numbers once a "
        "change is meant): " + "; ".join(accuracy.worse(numbers, committed)))


def test_the_shipped_band_is_the_one_fitted_on_the_published_runs(current):
    assert update_accuracy.BANDS.read_text() == current[2], "run python tools/update_accuracy.py"


def test_docs_show_the_generated_table(current):
    table, _, _ = current
    assert accuracy.replace_section(update_accuracy.DOC.read_text(), update_accuracy.SECTION, table) == \
        update_accuracy.DOC.read_text(), "docs/accuracy.md is stale: run python tools/update_accuracy.py"


def test_worse_sees_each_direction():
    committed = {"allocated.median_abs": 0.1, "false_fits": 0, "expressed": 300}
    assert accuracy.worse({"allocated.median_abs": 0.1, "false_fits": 0, "expressed": 301}, committed) == []
    assert len(accuracy.worse({"allocated.median_abs": 0.2, "false_fits": 1, "expressed": 299}, committed)) == 3
    assert accuracy.worse({}, committed)  # a number that disappears is worse


def test_statistics():
    assert quantile([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], 0.9) == 0.9
    assert median([3.0, 1.0, 2.0, 10.0]) == 2.5 and math.isnan(median([]))
    s = accuracy.error_stats([-0.2, 0.1, 0.3])
    assert (s["n"], s["median_abs"], s["signed_median"]) == (3, 0.2, 0.1)


def test_replace_section_keeps_other_sections():
    text = "intro\n<!-- BEGIN generated: other -->\nA\n<!-- END generated: other -->\n"
    once = accuracy.replace_section(text, "memory-report", "T1")
    twice = accuracy.replace_section(once, "memory-report", "T2")
    assert "A" in twice and "T2" in twice and "T1" not in twice and twice.count("BEGIN generated") == 2


def test_cli_on_a_users_csv(tmp_path):
    rows = (ROOT / "tests" / "data" / "published_runs" / "runs.csv").read_text().splitlines()
    picked = [rows[0]] + [r for r in rows if r.startswith(("LGC001,", "FMA029,", "FMA037,", "QW001,"))]
    mine = tmp_path / "mine.csv"
    mine.write_text("\n".join(picked) + "\n")
    out = subprocess.run([sys.executable, "-m", "shardplan", "accuracy", str(mine), "--json"], capture_output=True,
                         text=True, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["rows"] == 4 and data["expressed"] == 3 and data["verdicts"]["ooms"] == 1
    assert data["unexpressible"] == {"architecture_not_stated": 1}
    # the same report carries tokens/s: FMA029 (the one row with a rate) predicted as the development
    # set's report predicts it, at the window factor fitted without its source
    from shardplan.validation import tokens

    t = data["tokens"]
    assert t["runs"] == 1 and set(t["source"]) == {"FMA"} and set(t["gpu_family"]) == {"a100"}
    fma = next(r for r in tokens.dev_set_rows() if r.row_id == "FMA029")
    assert t["overall"]["signed_median"] == pytest.approx(fma.error)
    text = subprocess.run([sys.executable, "-m", "shardplan", "accuracy", str(mine)], capture_output=True,
                          text=True, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert "## Tokens/s" in text and "1 run with tokens/s" in text and "| FMA | 1 |" in text
    bad = subprocess.run([sys.executable, "-m", "shardplan", "accuracy", str(tmp_path / "none.csv")], capture_output=True,
                         text=True, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
