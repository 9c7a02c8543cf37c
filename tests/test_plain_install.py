"""What a plain `pip install .` user meets: commands work without the optional extras or say in
one line which extra they need (exit 2, no traceback). The extras are hidden from a fresh
interpreter the way an absent package is (``sys.modules[name] = None``)."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HIDE = ("yaml", "torch", "pyarrow", "accelerate", "transformers", "deepspeed", "matplotlib", "peft", "bitsandbytes")
RUN = ("import runpy, sys\n"
       f"for m in {HIDE!r}:\n    sys.modules[m] = None\n"
       "sys.argv = ['shardplan', *sys.argv[1:]]\nrunpy.run_module('shardplan', run_name='__main__')\n")


REPO = Path(__file__).resolve().parents[1]


def shardplan_without_extras(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's shardplan, whatever is installed
    p = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=env)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("fmt", ["fsdp2", "deepspeed", "torchrun"])
def test_exports_without_a_library_work(tmp_path, fmt):
    code, _, err = shardplan_without_extras(tmp_path, "fit", "llama-3.1-8b on 8xh100-sxm ac full full_shard",
                                            "--export", f"{fmt}={tmp_path / 'out'}")
    assert code == 0 and (tmp_path / "out").stat().st_size > 0 and "Traceback" not in err


@pytest.mark.parametrize("args, extra", [
    (("fit", "llama-3.1-8b on 8xh100-sxm ac full full_shard", "--export", "accelerate=a.yaml"), "export"),
    (("calibrate", "compute", "--out", "c.json"), "calibrate"),
    (("calibrate", "fsdp", "--out", "f.jsonl"), "calibrate"),
    (("calibrate", "collectives", "--out", "co.json"), "calibrate"),
    (("fit", "--model", str(REPO / "tests" / "data" / "unknown_model_type"), "--gpus", "1xrtx4090"), "hf"),
])
def test_commands_needing_an_extra_name_it_in_one_line(tmp_path, args, extra):
    code, out, err = shardplan_without_extras(tmp_path, *args)
    assert code == 2 and "Traceback" not in out + err
    assert err.strip().count("\n") == 0 and f'shardplan[{extra}]' in err
    assert not (tmp_path / "f.jsonl").exists()  # nothing recorded


def test_sweep_to_parquet_without_pyarrow_names_the_extra(tmp_path):
    code, out, err = shardplan_without_extras(tmp_path, "sweep", "-o", "s.parquet", "--no-progress")
    assert code == 2 and "Traceback" not in out + err
    assert err.strip().count("\n") == 0 and 'pip install "shardplan[parquet]"' in err
    assert list(tmp_path.iterdir()) == []  # refused before the sweep ran: no file, no temp


def test_calibrate_fsdp_without_torch_leaves_an_existing_resume_file_alone(tmp_path):
    resume = tmp_path / "f.jsonl"
    resume.write_text('{"key": "earlier", "status": "ok"}\n')
    before = resume.read_bytes()
    code, _, err = shardplan_without_extras(tmp_path, "calibrate", "fsdp", "--out", "f.jsonl")
    assert code == 2 and 'shardplan[calibrate]' in err
    assert resume.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["f.jsonl"]


# --- the plain-install smoke (tools/smoke_plain.py, .ci/run stage 1) -------------------------------
SMOKE = REPO / "tools" / "smoke_plain.py"


def smoke(*args, source=REPO):
    p = subprocess.run([sys.executable, str(SMOKE), "--hide-extras", "--jobs", "2", "--source", str(source), *args],
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def test_smoke_passes_on_this_checkout():
    """Every check, as .ci/run stage 1 runs them (a subset here let a changed ``hardware show``
    output reach CI unnoticed)."""
    code, out = smoke()
    assert code == 0, out
    checks = re.search(r"smoke: (\d+) of (\d+) checks passed", out)
    assert checks and checks[1] == checks[2] and int(checks[2]) >= 46, out


def test_smoke_fails_when_export_imports_yaml_at_the_top_again(tmp_path):
    """The regression this stage exists for: a top-level ``import yaml`` in export.py (as before
    issue 11) made every export crash on a plain install. The smoke must fail on such a copy."""
    shutil.copytree(REPO / "shardplan", tmp_path / "shardplan", ignore=shutil.ignore_patterns("__pycache__"))
    export_py = tmp_path / "shardplan" / "export.py"
    text = export_py.read_text()
    assert "from __future__ import annotations\n" in text
    export_py.write_text(text.replace("from __future__ import annotations\n",
                                      "from __future__ import annotations\nimport yaml  # the old import\n", 1))
    code, out = smoke("--only", "fit --export", source=tmp_path)
    assert code == 1, out
    # cli.main reports the unexpected ModuleNotFoundError as a bug: one line, exit 3 (docs/errors.md)
    assert out.count("FAIL") == 7 and out.count("why: a bug (exit 3") == 7, out  # 6 formats + to stdout
    assert "ModuleNotFoundError: No module named 'yaml'" in out or "import of yaml halted" in out, out


def test_smoke_plain_refuses_an_environment_with_extras():
    missing = [m for m in HIDE if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"this environment lacks {missing}")
    p = subprocess.run([sys.executable, str(SMOKE), "--plain"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "not a plain install" in p.stdout


@pytest.mark.parametrize("extra, code, err, plain, ok", [
    (None, 0, "", True, True),
    (None, 2, "shardplan: error: x", True, False),  # needs no extra: must work
    ("export", 2, 'shardplan: error: dependency=\'yaml\': not installed; pip install "shardplan[export]"', True, True),
    ("export", 2, 'line one\npip install "shardplan[export]"', True, False),  # two lines
    ("export", 2, 'pip install "shardplan[calibrate]"', True, False),  # the wrong extra
    ("export", 0, "", True, False),  # a plain install cannot have done it
    ("export", 0, "", False, True),  # with the extras installed it may
    (None, 0, "Traceback (most recent call last):", False, False),
])
def test_smoke_judge(tmp_path, extra, code, err, plain, ok):
    from tools.smoke_plain import Check, judge

    why = judge(Check("x", [], extra=extra), code, "", err, tmp_path, plain)
    assert (why is None) == ok, why
