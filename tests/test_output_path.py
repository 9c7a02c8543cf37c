"""Output paths that cannot be written are one-line errors (exit 2) naming the option and the path,
raised before any work is done (shardplan/support/output_path.py; issue 12, found by tests/test_fuzz_cli.py)."""

import os
from pathlib import Path

import pytest

from shardplan.support.errors import ShardplanError
from shardplan.support.output_path import writable_output
from tests.helpers import run_cli

NCCL = Path(__file__).parent / "data" / "nccl_tests_sample_all_gather_perf.txt"
RECORDS = Path(__file__).parents[1] / "data" / "calibration" / "grid_cpu.jsonl"


def one_error_line(result, field: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"shardplan: error: {field}="), result.stderr
    return lines[0]


def test_sweep_to_an_existing_folder_is_refused_before_the_sweep(tmp_path):
    (tmp_path / "out.csv").mkdir()  # main: the whole sweep ran, then IsADirectoryError from os.replace
    line = one_error_line(run_cli("sweep", "-o", tmp_path / "out.csv", "--gpu-counts", "1-8"), "output")
    assert "is a folder" in line
    assert sorted(os.listdir(tmp_path / "out.csv")) == []  # no temporary file left inside or beside it
    assert sorted(os.listdir(tmp_path)) == ["out.csv"]


def test_export_names_up_to_the_file_system_limit_are_written_and_longer_ones_refused(tmp_path):
    # a 250-byte name is legal (NAME_MAX 255): the atomic writer shortens its temporary name to fit
    # beside it (atomic_write._new_temp; main raised OSError ENAMETOOLONG with a traceback); 256 is not
    plan = tmp_path / "plan.json"
    plan.write_text(run_cli("fit", "llama-3.1-8b on 8xh100-sxm", "--strategy", "full_shard", "--json").stdout)
    fits = "e" * 247 + ".py"
    assert run_cli("export", plan, "--to", "fsdp2", "-o", tmp_path / fits).exit_code == 0
    too_long = "e" * 253 + ".py"
    line = one_error_line(run_cli("export", plan, "--to", "fsdp2", "-o", tmp_path / too_long), "output")
    assert "256 bytes is longer than the 255 bytes" in line
    assert sorted(os.listdir(tmp_path)) == sorted(["plan.json", fits])


def test_fit_export_into_a_path_under_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    result = run_cli("fit", "llama-3.1-8b on 8xh100-sxm", "--strategy", "full_shard",
                     "--export", f"fsdp2={tmp_path / 'afile' / 'train.py'}")
    assert "is not a folder" in one_error_line(result, "export")


def test_calibrate_outputs_are_checked_before_anything_runs(tmp_path):
    fifo = tmp_path / "fits.json"
    os.mkfifo(fifo)  # main: the atomic writer silently replaced the FIFO with a regular file
    result = run_cli("calibrate", "collectives", "--nccl-tests", NCCL, "--out", tmp_path / "cal.json",
                     "--fits-json", fifo)
    assert "not a regular file" in one_error_line(result, "fits_json")
    assert not (tmp_path / "cal.json").exists()
    (tmp_path / "md").mkdir()
    result = run_cli("calibrate", "compare", RECORDS, "--md", tmp_path / "md")
    assert "is a folder" in one_error_line(result, "md")


def test_writable_paths_pass(tmp_path):
    assert writable_output(None) is None
    assert writable_output(tmp_path / "new" / "deeper" / "x.csv") == tmp_path / "new" / "deeper" / "x.csv"
    (tmp_path / "real.csv").write_text("old")
    assert writable_output(tmp_path / "real.csv") == tmp_path / "real.csv"
    longest = "n" * (255 - 4) + ".csv"
    assert writable_output(tmp_path / longest).name == longest
    result = run_cli("sweep", "-o", tmp_path / "a" / "b" / "out.csv")
    assert result.exit_code == 0 and (tmp_path / "a" / "b" / "out.csv").is_file()


@pytest.mark.parametrize("bad, reason", [("", "empty"), ("x\x00y", "NUL"), ("folder/", "names a folder"),
                                         ("/dev/null", "not a regular file")])
def test_unwritable_names(bad, reason):
    with pytest.raises(ShardplanError, match=reason) as info:
        writable_output(bad, "out")
    assert info.value.field == "out" and "\n" not in str(info.value)
