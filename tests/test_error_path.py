"""Issue 12, the one error path: ``shardplan.cli.app.main`` turns every ShardplanError, pydantic
ValidationError and click usage error into one stderr line and exit 2 (calibrate included); any
other exception is a bug, reported in one line with exit 3, never a traceback."""

import pytest

import tests.test_bad_values as values
import tests.test_contradictions as contradictions
from tests.helpers import run_cli


def _cases(function, argnames="argv"):
    """The CLI invocations a parametrized test of this issue runs."""
    mark = next(m for m in function.pytestmark if m.name == "parametrize")
    names = [n.strip() for n in mark.args[0].split(",")]
    return [case[names.index(argnames)] if len(names) > 1 else case for case in mark.args[1]]


CASES = (_cases(values.test_out_of_range_numbers_are_one_line_errors)
         + _cases(contradictions.test_contradictions_are_one_line_errors)
         + _cases(contradictions.test_consistent_settings_still_run)
         + [("calibrate", "collectives", "--nccl-tests", "tests/data/nccl_tests_sample_all_gather_perf.txt",
             "--out", "{tmp}/c.json", "--min-r2-log", "nan"),
            ("calibrate", "compute", "--out", "{tmp}/c.json", "--iters", "0"),
            ("calibrate", "fsdp", "--out", "{tmp}/f.jsonl", "--timeout", "nan"),
            ("calibrate", "fsdp", "--out", "{tmp}/f.jsonl", "--world-size", "0"),
            ("fit", "--seq-len", "x"), ("plan", "--bogus"), ("sweep",)])


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a)[:60])
def test_only_the_expected_outcomes_leave_main(tmp_path, argv):
    res = run_cli(*(str(a).format(tmp=tmp_path) for a in argv))  # main itself must not raise
    assert res.exit_code in (0, 2), res.output
    assert "Traceback" not in res.output and "internal error" not in res.output
    if res.exit_code == 2:
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_calibrate_value_errors_write_nothing(tmp_path):
    out = tmp_path / "c.json"
    res = run_cli("calibrate", "collectives", "--nccl-tests", "tests/data/nccl_tests_sample_all_gather_perf.txt",
                  "--out", out, "--min-r2-log", "nan")
    assert res.exit_code == 2 and "min_r2_log=nan" in res.stderr and not out.exists()


def test_a_bug_is_one_line_with_exit_3(monkeypatch):
    import shardplan.cli.fit_command as fit_command

    def broken(*args, **kwargs):
        raise KeyError("an unexpected failure")

    monkeypatch.setattr(fit_command, "parse_query", broken)
    res = run_cli("fit", "8B on 8xh100-sxm")
    assert res.exit_code == 3 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" in lines[0] and "KeyError" in lines[0], res.stderr


def test_a_bug_shows_its_traceback_when_asked(monkeypatch):
    import shardplan.cli.app as cli
    import shardplan.cli.fit_command as fit_command

    monkeypatch.setattr(fit_command, "parse_query", lambda *a, **k: 1 / 0)
    monkeypatch.setenv("SHARDPLAN_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["fit", "8B on 8xh100-sxm"])
