"""Issue 22 item 2: what shardplan does to a file it is told to write (docs/input-files.md, "Files
shardplan writes"): never through a symbolic link; the replaced file's mode kept; a read-only file
only with --force; temporary files of killed writers removed by the next write into the folder."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardplan.support.atomic_write import _host_tag, write_text_atomic
from shardplan.support.errors import ShardplanError
from tests.helpers import dead_pid, one_line_error, run_cli

posix = pytest.mark.skipif(os.name != "posix", reason="POSIX links, modes and signals")
REPO = Path(__file__).resolve().parents[1]
SWEEP = ["sweep", "--models", "gpt2", "--gpus", "h100-sxm", "--gpu-counts", "1,2", "--strategies", "ddp"]
FIT_EXPORT = ["fit", "llama-3.1-8b on 8xh100-sxm", "--strategy", "full_shard", "--export"]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def secret(folder: Path) -> Path:
    s = folder / "secret.txt"
    s.write_text("do not touch\n")
    os.chmod(s, 0o600)
    return s


def untouched(s: Path) -> bool:
    return s.read_text() == "do not touch\n" and mode(s) == 0o600


# --- symbolic links ----------------------------------------------------------------------------------
@posix
@pytest.mark.parametrize("how", ["sweep", "fit --export", "export -o", "api", "dangling", "sticky"])
def test_a_symlink_is_never_written_through(tmp_path, how):
    s = secret(tmp_path)
    where = tmp_path
    if how == "sticky":  # a link planted in a world-writable sticky folder (/tmp's attack)
        where = tmp_path / "shared"
        where.mkdir()
        os.chmod(where, 0o1777)
    link = where / ("out.csv" if how in ("sweep", "sticky", "api", "dangling") else "train.py")
    link.symlink_to(tmp_path / "nowhere.csv" if how == "dangling" else s)
    if how in ("api", "dangling"):
        with pytest.raises(ShardplanError, match="symbolic link"):
            write_text_atomic(link, "x")
    else:
        argv = {"sweep": [*SWEEP, "-o", link], "sticky": [*SWEEP, "-o", link],
                "fit --export": [*FIT_EXPORT, f"fsdp2={link}"]}.get(how)
        if how == "export -o":
            plan = tmp_path / "plan.json"
            plan.write_text(run_cli(*FIT_EXPORT[:-1], "--json").stdout)
            argv = ["export", plan, "--to", "fsdp2", "-o", link]
        one_line_error(run_cli(*argv), "symbolic link", "name the file itself")
    assert untouched(s) and link.is_symlink() and not (tmp_path / "nowhere.csv").exists()
    assert [p for p in os.listdir(where) if p.endswith(".tmp")] == []


@posix
def test_naming_the_links_target_writes_it(tmp_path):
    """The user asked for the target when they name it; a link in a parent folder is followed."""
    real = tmp_path / "runs"
    real.mkdir()
    (tmp_path / "latest").symlink_to(real)
    assert run_cli(*SWEEP, "-o", tmp_path / "latest" / "out.csv").exit_code == 0
    assert (real / "out.csv").read_text().startswith("model,")


# --- modes -------------------------------------------------------------------------------------------
@posix
@pytest.mark.parametrize("perm", [0o600, 0o640, 0o660, 0o604])
def test_a_replaced_file_keeps_its_mode(tmp_path, perm):
    old = os.umask(0o022)  # a umask that would give 0644 to a new file
    try:
        target = tmp_path / "out.csv"
        target.write_text("old\n")
        os.chmod(target, perm)
        assert run_cli(*SWEEP, "-o", target).exit_code == 0
        assert target.read_text() != "old\n" and mode(target) == perm
        write_text_atomic(target, "api\n")
        assert mode(target) == perm
    finally:
        os.umask(old)


@posix
@pytest.mark.parametrize("perm", [0o444, 0o400])
def test_a_read_only_file_needs_force_and_stays_read_only(tmp_path, perm):
    target = tmp_path / "train.py"
    target.write_text("old\n")
    os.chmod(target, perm)
    one_line_error(run_cli(*FIT_EXPORT, f"fsdp2={target}"), "read-only", "--force")
    assert target.read_text() == "old\n"
    with pytest.raises(ShardplanError, match="read-only"):
        write_text_atomic(target, "api\n")
    result = run_cli(*FIT_EXPORT, f"fsdp2={target}", "--force")
    assert result.exit_code == 0, result.output
    assert "fully_shard" in target.read_text() and mode(target) == perm
    csv = tmp_path / "out.csv"
    csv.write_text("old\n")
    os.chmod(csv, perm)
    one_line_error(run_cli(*SWEEP, "-o", csv), "read-only")
    assert csv.read_text() == "old\n"
    assert run_cli(*SWEEP, "-o", csv, "--force").exit_code == 0 and mode(csv) == perm and csv.read_text() != "old\n"


# --- temporary files of killed writers ----------------------------------------------------------------
@posix
def test_the_next_write_into_the_folder_removes_any_dead_writers_temp(tmp_path):
    """Not only the same target's: a killed sweep's 200 MB temp beside other outputs goes at the next write."""
    stale = tmp_path / f".other.csv.shardplan-{_host_tag()}-{dead_pid()}-0123456789ab.tmp"
    stale.write_bytes(b"x" * 1000)
    foreign = tmp_path / f".other.csv.shardplan-ffffff-{dead_pid()}-0123456789ab.tmp"  # another host's
    foreign.write_bytes(b"x")
    write_text_atomic(tmp_path / "unrelated.json", "{}")
    assert not stale.exists() and foreign.exists()


@posix
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_sweep_leaves_nothing_after_the_next_write(tmp_path, sig):
    big = ["sweep", "--models", "llama-3.1-8b,gpt2,opt-125m", "--gpus", "h100-sxm,a100-80gb", "--gpu-counts", "1-64",
           "--seq-len", "512,1024,2048,4096", "--micro-batch", "1,2,4", "-o", str(tmp_path / "big.csv")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "shardplan", *big], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not list(tmp_path.glob(".*.tmp")):
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("the sweep finished before a temporary file was seen")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0 and (tmp_path / "big.csv").exists():
        # the temp seen was the last one: the sweep renamed it and exited before the signal came
        pytest.skip("the sweep finished between the temporary file and the signal")
    assert b"Traceback" not in err
    if sig == signal.SIGTERM:  # turned into SystemExit: the writer removed its own temp
        assert proc.returncode == 128 + signal.SIGTERM and list(tmp_path.glob(".*.tmp")) == []
    assert not (tmp_path / "big.csv").exists()
    write_text_atomic(tmp_path / "small.json", "{}")
    assert list(tmp_path.glob(".*.tmp")) == []


# --- the calibrate commands keep the same policy ---------------------------------------------------
RECORDS = REPO / "data" / "calibration" / "grid_cpu.jsonl"
NCCL_LOG = REPO / "tests" / "data" / "nccl_tests_sample_all_gather_perf.txt"


@posix
@pytest.mark.parametrize("option", ["--csv", "--json", "--md"])
def test_calibrate_compare_refuses_links_and_read_only_files_without_force(tmp_path, option):
    s = secret(tmp_path)
    link = tmp_path / "out"
    link.symlink_to(s)
    for force in ([], ["--force"]):  # --force never writes through a link
        one_line_error(run_cli("calibrate", "compare", RECORDS, option, link, *force), "symbolic link")
    assert untouched(s) and link.is_symlink()
    target = tmp_path / "ro"
    target.write_text("old\n")
    os.chmod(target, 0o444)
    one_line_error(run_cli("calibrate", "compare", RECORDS, option, target), "read-only", "--force")
    assert target.read_text() == "old\n"
    result = run_cli("calibrate", "compare", RECORDS, option, target, "--force")
    assert result.exit_code == 0, result.output
    assert target.read_text() != "old\n" and mode(target) == 0o444


@posix
def test_calibrate_collectives_overlay_is_forced_like_any_output(tmp_path):
    overlay = tmp_path / "cal.json"
    assert run_cli("calibrate", "collectives", "--nccl-tests", NCCL_LOG, "--out", overlay).exit_code == 0
    os.chmod(overlay, 0o440)
    before = overlay.read_text()
    one_line_error(run_cli("calibrate", "collectives", "--nccl-tests", NCCL_LOG, "--out", overlay), "read-only")
    assert overlay.read_text() == before
    result = run_cli("calibrate", "collectives", "--nccl-tests", NCCL_LOG, "--out", overlay, "--force")
    assert result.exit_code == 0, result.output
    assert mode(overlay) == 0o440 and '"links"' in overlay.read_text()


@posix
def test_an_appended_records_file_needs_force_when_read_only(tmp_path):
    """``calibrate fsdp --out`` appends through results.append_jsonl, one atomic rewrite per record."""
    from shardplan.calibrate.results import append_jsonl, read_jsonl

    out = tmp_path / "runs.jsonl"
    append_jsonl(out, {"key": "a"})
    os.chmod(out, 0o444)
    with pytest.raises(ShardplanError, match="read-only"):
        append_jsonl(out, {"key": "b"})
    append_jsonl(out, {"key": "b"}, force=True)
    assert [r["key"] for r in read_jsonl(out)] == ["a", "b"] and mode(out) == 0o444
    link = tmp_path / "link.jsonl"
    link.symlink_to(out)
    with pytest.raises(ShardplanError, match="symbolic link"):
        append_jsonl(link, {"key": "c"}, force=True)
