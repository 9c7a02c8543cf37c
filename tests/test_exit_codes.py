"""Exit codes a script can rely on, through ``shardplan.cli.app.main`` as the ``shardplan`` script runs it:
0 done, 1 ``fit --check`` found nothing that fits, 2 bad input or a refused result (one stderr line)."""

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers import one_line_error, run_cli

DATA = Path(__file__).parent / "data"
NCCL = DATA / "nccl_tests_sample_all_gather_perf.txt"


# --- --version ------------------------------------------------------------------------------------
def test_version():
    res = run_cli("--version")
    assert res.exit_code == 0 and res.stdout == f"shardplan {version('shardplan')}\n"


# --- fit --check ------------------------------------------------------------------------------------
@pytest.mark.parametrize("query, expected", [
    ("70B on 4x24GB", "does_not_fit"),  # README command 1: full fine-tuning of 70B fits nowhere
    ("8B on 1x24GB lora seq 512", "tight"),  # its one strategy's peak fits, peak + band does not
    ("llama-3.1-8b on 8xh100-sxm ac full", "fits"),
])
def test_fit_check_exits_1_unless_something_fits(query, expected):
    verdicts = {r["verdict"] for r in json.loads(run_cli("fit", query, "--json").stdout)}
    best = "fits" if "fits" in verdicts else "tight" if "tight" in verdicts else "does_not_fit"
    assert best == expected, verdicts  # the case this parameter stands for
    plain, checked = run_cli("fit", query), run_cli("fit", query, "--check")
    assert checked.exit_code == (0 if expected == "fits" else 1)  # 'tight' does not count
    assert (checked.stdout, checked.stderr) == (plain.stdout, plain.stderr) and plain.exit_code == 0


def test_fit_check_is_explained_in_help():
    assert "--check" in run_cli("fit", "--help").stdout


# --- --calibration FILE that does not exist -----------------------------------------------------------
@pytest.mark.parametrize("argv", [("fit", "8B on 8xh100-sxm"), ("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm")])
def test_missing_calibration_file_is_an_error(tmp_path, argv):
    missing = tmp_path / "nope.json"
    one_line_error(run_cli(*argv, "--calibration", missing), "calibration", "nope.json", "no such file")


# --- calibrate: refused fits and samples too small exit 2 ----------------------------------------------
def _nccl_rows(path: Path, keep: int) -> Path:
    """The sample nccl-tests table with only its first ``keep`` result rows."""
    lines, rows = [], 0
    for line in NCCL.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            rows += 1
            if rows > keep:
                continue
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_collectives_with_too_few_sizes_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "cal.json"
    res = run_cli("calibrate", "collectives", "--nccl-tests", _nccl_rows(tmp_path / "two.txt", 2), "--out", out)
    one_line_error(res, "samples", "need at least 3")
    assert not out.exists()


def test_collectives_refused_fit_exits_2(tmp_path):
    out = tmp_path / "cal.json"  # the sample fits within 3 %; demanding 0.1 % refuses it
    res = run_cli("calibrate", "collectives", "--nccl-tests", NCCL, "--out", out, "--max-rel-err", "0.001")
    one_line_error(res, "fit[all_gather", "max_rel_err")
    assert not out.exists()


def test_collectives_unreadable_table_exits_2(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("not an nccl-tests table\n")
    one_line_error(run_cli("calibrate", "collectives", "--nccl-tests", bad, "--tier", "intra_node",
                           "--world-size", "8", "--op", "all_gather"), "nccl_tests", "no result rows")


def test_compare_with_nothing_to_compare_exits_2(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_line_error(run_cli("calibrate", "compare", empty), "nothing to compare")
    failed = tmp_path / "failed.jsonl"
    failed.write_text(json.dumps({"key": "k", "status": "oom", "config": {"engine": "fsdp2"}}) + "\n")
    one_line_error(run_cli("calibrate", "compare", failed), "nothing to compare")


def test_compare_of_a_missing_or_broken_file_exits_2(tmp_path):
    one_line_error(run_cli("calibrate", "compare", tmp_path / "missing.jsonl"), "missing.jsonl", "no such file")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"key": "a", "status": "ok"}\n{not json\n')
    one_line_error(run_cli("calibrate", "compare", broken), "broken.jsonl:2", "not a JSON record")


def test_fsdp_with_no_configuration_measured_exits_2(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from shardplan.calibrate import launch

    def failing(cfg, **_kw):  # every run fails, recorded as a crashed rank is
        return {**launch._failed(cfg, "error", RuntimeError("boom")), "wall_s": 0.0}

    monkeypatch.setattr(launch, "run_one", failing)
    out = tmp_path / "r.jsonl"
    res = run_cli("calibrate", "fsdp", "--out", out, "--world-size", "2", "--no-isolate", "--launch", "fake")
    assert res.exit_code == 2 and "Traceback" not in res.output
    errors = [l for l in res.stderr.splitlines() if not l.startswith("[1/1] ")]  # the progress line
    assert len(errors) == 1 and errors[0].startswith("shardplan: error: out=") and "none of the 1" in errors[0]
    assert [json.loads(l)["status"] for l in out.read_text().splitlines()] == ["error"]  # recorded for the record
    argv = ("calibrate", "fsdp", "--out", out, "--world-size", "2", "--no-isolate", "--launch", "fake")
    assert run_cli(*argv).exit_code == 2  # resumed: the failed configuration is skipped, still nothing measured
    monkeypatch.undo()  # the real harness again
    res = run_cli(*argv, "--retry-failed")
    assert res.exit_code == 0, res.output
    assert [json.loads(l)["status"] for l in out.read_text().splitlines()] == ["error", "ok"]


def test_fsdp_bad_config_file_exits_2(tmp_path):
    pytest.importorskip("torch")
    cfg = tmp_path / "cfg.json"
    cfg.write_text("{broken")
    out = tmp_path / "r.jsonl"
    one_line_error(run_cli("calibrate", "fsdp", "--config", cfg, "--out", out, "--launch", "fake"), "config")
    assert not out.exists()
