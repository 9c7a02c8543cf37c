"""The README by construction (tools/update_readme.py): every example output block equals the real
output of its command, every listed `shardplan` command runs, every Python snippet runs on its own.
When one fails after a change: `python tools/update_readme.py` (outputs), or fix the README's text."""

import json
from pathlib import Path

import pytest

from tests.test_plain_install import shardplan_without_extras
from tools.update_readme import EACH_LINE, README, blocks, mismatch, output_blocks, regenerate, run_command, run_python

TEXT = README.read_text(encoding="utf-8")
ALL = blocks(TEXT)
OUTPUTS = output_blocks(TEXT)
PYTHON = [b for b in ALL if b.info == "python"]
COMMANDS = [(b, line.strip()) for b in ALL if b.marker == EACH_LINE
            for line in b.lines if line.strip().startswith("shardplan ")]
DATA = Path(__file__).parent / "data"
HF_CONFIGS = DATA / "hf_configs.json"
ROOT = Path(__file__).parent.parent


def test_the_readme_has_tested_blocks():
    # the README's main example is among them, and every kind of check has something to check
    assert any(b.marker == 'shardplan fit "70B on 4x24GB"' for b in OUTPUTS)
    assert len(PYTHON) >= 3 and len(COMMANDS) >= 10


@pytest.mark.parametrize("block", OUTPUTS, ids=[f"line{b.line_number}" for b in OUTPUTS])
def test_example_output_is_the_real_output(tmp_path, block):
    proc = run_command(block.marker, tmp_path)
    problem = mismatch(list(block.lines), proc.stdout.splitlines())
    assert problem is None, (f"README.md:{block.line_number} `{block.marker}`: {problem} "
                             f"(run: python tools/update_readme.py)")


@pytest.mark.parametrize("block", PYTHON, ids=[f"line{b.line_number}" for b in PYTHON])
def test_python_snippet_runs_on_its_own(tmp_path, block):
    proc = run_python("\n".join(block.lines), tmp_path)
    assert proc.returncode == 0, f"README.md:{block.line_number}: {proc.stderr[-2000:]}"


@pytest.mark.parametrize("block, command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_listed_command_runs(tmp_path, block, command):
    if "path/to/config.json" in command:  # the README's stand-in for the reader's own Hugging Face config
        model = json.loads(HF_CONFIGS.read_text())["models"]["Llama-3.1-8B"]["kwargs"]
        (tmp_path / "path" / "to").mkdir(parents=True)
        (tmp_path / "path" / "to" / "config.json").write_text(json.dumps({"model_type": "llama", **model}))
    proc = run_command(command, tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"README.md:{block.line_number}: {proc.stderr[-2000:]}"


# "What needs an extra": what the README says a plain `pip install .` runs (fit and the exports
# without a library are tests/test_plain_install.py's)
PLAIN = [("plan", "llama-3.1-8b", "--gpus", "8xh100-sxm"), ("models",), ("hardware",),
         ("profiles", "validate", str(ROOT / "model_profiles")), ("sweep", "-o", "s.csv", "--gpu-counts", "1-2"),
         ("calibrate", "compare", str(ROOT / "data" / "calibration" / "grid_cpu.jsonl")),
         ("calibrate", "collectives", "--nccl-tests", str(DATA / "nccl_tests_sample_all_gather_perf.txt"), "--out", "c.json")]


def test_the_plain_install_claims_hold():
    assert "A plain `pip install .`" in TEXT and "`calibrate compare`" in TEXT and "--nccl-tests FILE" in TEXT


@pytest.mark.parametrize("args", PLAIN, ids=[" ".join(a[:2]) for a in PLAIN])
def test_command_runs_without_extras(tmp_path, args):
    code, _, err = shardplan_without_extras(tmp_path, *args)
    assert code == 0 and "Traceback" not in err, err[-2000:]


def test_mismatch_and_regenerate_follow_the_elision_rule():
    out = ["a 1", "b 2", "c 3", "d 4", "e 5"]
    assert mismatch(["a 1", "...", "e 5"], out) is None
    assert mismatch(["a 1", "...", "c 3", "...", "e 5"], out) is None
    assert mismatch(["...", "d 4", "e 5"], out) is None
    assert mismatch(out, out) is None and mismatch(["a 1  "], ["a 1"]) is None  # trailing spaces aside
    assert "line 2" in mismatch(["a 1", "b 9", "...", "e 5"], out)  # a changed number is caught
    assert mismatch(["a 1", "b 2"], out) is not None                 # without '...' every line is shown
    assert mismatch(["a 1", "...", "d 4"], out) is not None          # the tail must be the output's end
    assert mismatch(["a 1", "...", "c 3", "b 2", "...", "e 5"], out) is not None  # order matters
    new = ["a 10", "b 20", "x", "c 30", "y", "d 40", "e 50", "f"]
    # head: as many first lines; a middle part from a line like its first to one like its last; the tail to the end
    assert regenerate(["a 1", "...", "c 3", "d 4", "...", "e 5"], new) == ["a 10", "...", "c 30", "y", "d 40", "...",
                                                                         "e 50", "f"]
    assert regenerate(["a 1", "b 2"], new) == new
    with pytest.raises(ValueError):
        regenerate(["a 1", "...", "z"], new)
