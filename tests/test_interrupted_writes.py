"""Issue 12, item 4: writes survive interruption. A target is whole or absent after SIGKILL at any
point; the killed writer's temporary file (which no process can remove at its own death) is removed
by the next write into the same folder; a torn JSONL tail resumes without losing earlier records.
The symlink / mode / read-only policy (issue 22) is tested in tests/test_output_policy.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardplan.support.atomic_write import _host_tag, _temp_prefix, atomic_path, clean_stale_temps, write_text_atomic
from tests.helpers import dead_pid, run_cli

posix = pytest.mark.skipif(os.name != "posix" or not hasattr(os, "fork"), reason="SIGKILL and fork are POSIX")


def _temps(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".shardplan-" in n and n.endswith(".tmp"))


# --- stale temporary files ----------------------------------------------------------------------
@posix
def test_the_next_write_removes_temps_of_dead_writers_only(tmp_path):
    target = tmp_path / "out.csv"
    prefix = _temp_prefix(target.name)
    dead = tmp_path / f"{prefix}{_host_tag()}-{dead_pid()}-00aa11bb22cc.tmp"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = tmp_path / f"{prefix}{_host_tag()}-{sleeper.pid}-00aa11bb22cc.tmp"
        elsewhere = tmp_path / f"{prefix}ffffff-{dead_pid()}-00aa11bb22cc.tmp"  # another host's writer
        other = tmp_path / ".notes.txt.tmp"                                       # not shardplan's
        for p in (dead, alive, elsewhere, other):
            p.write_text("half a fi")
        write_text_atomic(target, "whole\n")
        assert target.read_text() == "whole\n"
        assert not dead.exists()
        assert alive.exists() and elsewhere.exists() and other.exists()
        sleeper.kill()
        sleeper.wait()
        assert clean_stale_temps(target) == [alive]  # its writer is gone now
    finally:
        sleeper.kill()
        sleeper.wait()


def test_temp_names_fit_a_path_component_and_long_targets_are_refused(tmp_path):
    name = "é" * 100 + "x.csv"  # 205 bytes: target fits, target + temp decoration would not
    path = write_text_atomic(tmp_path / name, "a")
    assert path.read_text() == "a" and sorted(os.listdir(tmp_path)) == [name]
    result = run_cli("fit", "llama-3.1-8b on 8xh100-sxm", "--export", f"fsdp2={tmp_path / ('y' * 256 + '.py')}")
    assert result.exit_code == 2, result.output
    # refused before anything is evaluated (the export target check), in one line naming the length
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "255 bytes" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.output
    assert sorted(os.listdir(tmp_path)) == [name]


def test_a_folder_at_the_target_is_one_line_and_no_temp(tmp_path):
    (tmp_path / "out.csv").mkdir()
    result = run_cli("sweep", "-o", tmp_path / "out.csv", "--strategies", "full_shard")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    # refused before the sweep runs (output_path.writable_output); the writer's own refusal of a
    # folder at the target (path=...: cannot write) stays for API callers (test_the_writer_itself_refuses_a_folder_at_the_target_in_one_line)
    assert line.startswith("shardplan: error: output=") and "is a folder" in line
    assert _temps(tmp_path) == []



def test_the_writer_itself_refuses_a_folder_at_the_target_in_one_line(tmp_path):
    # API callers skip the CLI's output check; the atomic writer's own refusal names the path
    from shardplan.support.errors import ShardplanError

    (tmp_path / "out.csv").mkdir()
    with pytest.raises(ShardplanError, match="cannot write") as info:
        write_text_atomic(tmp_path / "out.csv", "a")
    assert info.value.field == "path" and _temps(tmp_path) == []

# --- torn JSONL ---------------------------------------------------------------------------------
def test_a_torn_last_line_resumes_without_losing_earlier_records(tmp_path):
    from shardplan.calibrate.results import append_jsonl, done_keys, read_jsonl

    lines = (Path(__file__).parents[1] / "data" / "calibration" / "grid_cpu.jsonl").read_text().splitlines()[:4]
    torn = tmp_path / "grid.jsonl"
    torn.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])  # killed mid-append
    whole = tmp_path / "whole.jsonl"
    whole.write_text("\n".join(lines[:3]) + "\n")
    assert read_jsonl(torn) == read_jsonl(whole) and len(read_jsonl(torn)) == 3
    assert done_keys(torn) == {json.loads(line)["key"] for line in lines[:3]}
    # through the CLI: the compare table of the torn file is the one of its three whole records
    a, b = run_cli("calibrate", "compare", torn), run_cli("calibrate", "compare", whole)
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout
    # the next append rewrites the whole records and adds the new one: every line is JSON again
    append_jsonl(torn, json.loads(lines[3]))
    assert [json.loads(line) for line in torn.read_text().splitlines()] == [json.loads(line) for line in lines]
    # a bad line that is not the torn tail is still an error naming the line
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    bad = run_cli("calibrate", "compare", tmp_path / "bad.jsonl")
    assert bad.exit_code == 2 and "bad.jsonl:2" in bad.stderr


# --- SIGKILL at random points ---------------------------------------------------------------------
def _forked(argv: list[str]) -> int:
    """Run ``shardplan ARGV`` in a forked child (the imports are already done: it starts at once)."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            from shardplan.cli.app import main

            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                code = main(argv)
        except BaseException:
            code = 3
        os._exit(code)
    return pid


def _run_whole(argv: list[str]) -> float:
    t0 = time.perf_counter()
    _, status = os.waitpid(_forked(argv), 0)
    assert os.waitstatus_to_exitcode(status) == 0, argv
    return time.perf_counter() - t0


def _kill_at_random(argv: list[str], target: Path, kills: int, rng: random.Random) -> dict[str, int]:
    """Kill ``shardplan ARGV`` ``kills`` times at random points (half spread over the whole run,
    half just after its temporary file appears); after each kill the target must be absent or
    exactly the complete output, and the folder clean once the stale temps are collected (every
    fourth time by running the command again to completion, otherwise by ``clean_stale_temps``)."""
    folder = target.parent
    seconds = _run_whole(argv)
    reference = target.read_bytes()
    seen = {"temp_left": 0, "target_absent": 0, "target_whole": 0}
    for k in range(kills):
        if k % 3 == 0:
            target.unlink(missing_ok=True)  # sometimes there is no old file to fall back to
        pid = _forked(argv)
        if k % 2:  # aim at the write: wait for the temporary file, then kill within the write
            deadline = time.monotonic() + 5 * seconds + 5
            while not _temps(folder) and time.monotonic() < deadline:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    pid = None
                    break
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, 0.02))
        else:
            time.sleep(rng.uniform(0, 1.1 * seconds))
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if target.exists():
            assert target.read_bytes() == reference, f"kill {k}: a partial {target.name}"
            seen["target_whole"] += 1
        else:
            seen["target_absent"] += 1
        left = _temps(folder)
        seen["temp_left"] += bool(left)
        if k % 4 == 3:
            _run_whole(argv)
            assert target.read_bytes() == reference
        else:
            clean_stale_temps(target)
        assert _temps(folder) == [], f"kill {k}: {left} left behind"
        assert sorted(os.listdir(folder)) in ([], [target.name])
    return seen


@posix
def test_sigkill_during_sweep_output_leaves_no_partial_file_and_no_temp(tmp_path):
    target = tmp_path / "sweep.csv"
    argv = ["sweep", "-o", str(target), "--gpu-counts", "8,16,32,64", "--seq-len", "512,1024,2048,4096",
            "--micro-batch", "1,2,4", "--no-progress"]
    seen = _kill_at_random(argv, target, 50, random.Random(4))
    assert seen["target_whole"] + seen["target_absent"] == 50
    print(seen)


@posix
def test_sigkill_during_fit_export_leaves_no_partial_file_and_no_temp(tmp_path):
    target = tmp_path / "train_fsdp2.py"
    argv = ["fit", "llama-3.1-8b on 8xh100-sxm", "--strategy", "full_shard", "--export", f"fsdp2={target}"]
    seen = _kill_at_random(argv, target, 50, random.Random(5))
    assert seen["target_whole"] + seen["target_absent"] == 50
    print(seen)


@posix
def test_atomic_path_survives_a_killed_pandas_writer(tmp_path):
    """The writer sweep uses (pandas to a temp file, then a rename), killed mid-write many times on
    a bigger frame: the target is never half a CSV."""
    import numpy as np
    import pandas as pd

    df = pd.DataFrame(np.arange(400_000, dtype=np.int64).reshape(-1, 4), columns=list("abcd"))
    target = tmp_path / "big.csv"
    rng = random.Random(6)
    for k in range(10):
        pid = os.fork()
        if pid == 0:
            with atomic_path(target) as tmp:
                df.to_csv(tmp, index=False)
            os._exit(0)
        time.sleep(rng.uniform(0, 0.3))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if target.exists():
            assert len(pd.read_csv(target)) == 100_000
        clean_stale_temps(target)
        assert _temps(tmp_path) == []
