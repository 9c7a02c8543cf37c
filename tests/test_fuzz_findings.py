"""Classes the fuzz tests (tests/test_fuzz_cli.py) found outside the other issue-12 fixes, each
through the CLI, each failing on the code before its fix (named per test)."""

import pytest

from shardplan.calibrate.compute import MatmulSample, fit_efficiency
from shardplan.support.errors import ShardplanError
from tests.helpers import run_cli

pytest.importorskip("torch")


def one_error_line(result, field_prefix: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("shardplan: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"shardplan: error: {field_prefix}"), result.stderr
    assert result.stderr.rstrip().endswith(errors[0])  # the error is the last line: nothing after it
    return errors[0]


@pytest.mark.parametrize("sizes, field", [(("0", "16", "32"), "size="),  # --size's range (limits), before any run
                                          (("16", "16", "32"), "samples=")])
def test_calibrate_compute_on_degenerate_sizes_is_one_line(tmp_path, sizes, field):
    # before: --size 0 ended in numpy's LinAlgError "SVD did not converge" (m^-p infinite), and
    # two distinct sizes gave a fit from noise refused with a misleading "max_rel_err" message
    argv = ["calibrate", "compute", "--no-bandwidth", "--dtype", "float32", "--iters", "2",
            "--out", tmp_path / "c.json"]
    for m in sizes:
        argv += ["--size", m]
    line = one_error_line(run_cli(*argv), field)
    assert ("out of range [1," in line) if "0" in sizes else ("3 distinct" in line)
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("time_s", [0.0, -1.0, float("nan"), float("inf")])
def test_fit_efficiency_refuses_unmeasured_times(time_s):
    good = [MatmulSample("float32", m, 2 * m**3 / 1e11) for m in (64, 128, 256, 512)]
    with pytest.raises(ShardplanError, match="time_s") as info:
        fit_efficiency(good + [MatmulSample("float32", 1024, time_s)])
    assert "\n" not in str(info.value)


def test_profiles_validate_walks_a_bounded_folder(tmp_path, monkeypatch):
    # found by the 10,000-case fuzz run: `profiles validate /` walked the whole file system (a hang)
    from shardplan.support import limits

    monkeypatch.setattr(limits, "MAX_VALIDATE_ENTRIES", 20)
    for i in range(30):
        (tmp_path / f"f{i}.txt").write_text("x")
    line = one_error_line(run_cli("profiles", "validate", tmp_path), "path")
    assert "more than 20 entries" in line


def test_an_empty_sweep_range_is_one_line(tmp_path):
    # found by the 10,000-case fuzz run: '--nodes 8-1' reached the sweep as an empty axis (IndexError, exit 3)
    line = one_error_line(run_cli("sweep", "-o", tmp_path / "s.csv", "--nodes", "8-1"), "nodes")
    assert "empty range" in line and not (tmp_path / "s.csv").exists()
