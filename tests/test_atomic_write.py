"""One atomic writer for every file shardplan writes: whole or not at all, with the user's umask."""

import json
import os
import stat

import pytest

from shardplan.support.atomic_write import atomic_path, write_text_atomic
from tests.helpers import run_cli

posix_modes = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


@pytest.fixture
def umask():
    """Set the process umask for one test, then restore it."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda value: os.umask(value)
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_replaces_whole_and_leaves_no_temp(tmp_path):
    p = tmp_path / "x.txt"
    write_text_atomic(p, "one")
    write_text_atomic(p, "two\r\n")
    assert p.read_bytes() == b"two\r\n"  # newlines as given
    assert sorted(os.listdir(tmp_path)) == ["x.txt"]


def test_creates_missing_folders(tmp_path):
    p = write_text_atomic(tmp_path / "a" / "b" / "x.json", "{}")
    assert p.read_text() == "{}"


@posix_modes
@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_mode_follows_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    p = write_text_atomic(tmp_path / "x.txt", "a")
    assert mode(p) == expected  # 0o666 & ~umask, as open(path, "w") gives; mkstemp would give 0o600
    write_text_atomic(p, "b")  # a replacement gets the same
    assert mode(p) == expected


def test_an_exception_leaves_the_old_file_and_no_temp(tmp_path):
    p = tmp_path / "x.csv"
    write_text_atomic(p, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_text("half a fi")
            raise RuntimeError("writer failed")
    assert p.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["x.csv"]


def test_an_unencodable_text_leaves_nothing(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(tmp_path / "x.txt", "\udcff")  # a lone surrogate cannot be UTF-8
    assert os.listdir(tmp_path) == []


@posix_modes
def test_files_the_cli_writes_get_the_umask_mode(tmp_path, umask):
    umask(0o022)
    query = "llama-3.1-8b on 8xh100-sxm ac full"
    assert run_cli("fit", query, "--export", f"fsdp2={tmp_path / 'train.py'}").exit_code == 0
    fit_json = tmp_path / "fit.json"
    fit_json.write_text(run_cli("fit", query, "--json").stdout)
    assert run_cli("export", fit_json, "--to", "deepspeed", "-o", tmp_path / "ds.json").exit_code == 0
    assert run_cli("sweep", "-o", tmp_path / "s.csv", "--gpu-counts", "8", "--no-progress").exit_code == 0
    nccl = os.path.join(os.path.dirname(__file__), "data", "nccl_tests_sample_all_gather_perf.txt")
    assert run_cli("calibrate", "collectives", "--nccl-tests", nccl, "--out", tmp_path / "cal.json",
                   "--fits-json", tmp_path / "fits.json").exit_code == 0
    written = ["train.py", "ds.json", "s.csv", "cal.json", "fits.json"]
    assert {n: oct(mode(tmp_path / n)) for n in written} == {n: oct(0o644) for n in written}
    assert "zero_optimization" in json.loads((tmp_path / "ds.json").read_text())  # whole, parseable
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
