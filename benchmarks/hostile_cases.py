"""Hostile-case driver for issue 22 items 2-5 and 10: runs each class of hostile case as a user (or an
attacker) would, in subprocesses of ``python -m shardplan`` (process-level cases need a real
process: closed descriptors, /dev/full, a pipe closed by ``head``) or through the Python API, and
counts how each case ended, per class.

    PYTHONPATH=$PWD python benchmarks/hostile_cases.py            # table of counts per class
    PYTHONPATH=$PWD python benchmarks/hostile_cases.py --json out.json --verbose

Outcomes (one per case):
  clean         what the policy asks: a one-line error with exit 2, or exit 0 with the announcement
                the class asks for (a warning line, the mode kept ...)
  wrong-exit    an exit code or stderr the promise does not allow (internal error, exit 1/120/3,
                several error lines, no announcement where one is due, silently accepted)
  traceback     a Python traceback reached the user (or the API raised another exception type)
  unsafe-write  a file outside what was asked was written, a mode loosened, a read-only file or a
                symlink's target replaced, a temporary file left behind
  wrong-answer  a number no answer may show (MFU above 100 %, fits=True for a NaN batch)

Every file is made and written under one temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
FIT = "llama-3.1-8b on 8xh100-sxm"
SWEEP = ["sweep", "--models", "gpt2", "--gpus", "h100-sxm", "--gpu-counts", "1,2", "--strategies", "ddp"]


def shardplan(*args, env=None, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              cwd=None, shell_suffix=None, timeout=120):
    """Run ``python -m shardplan ARGS``; with ``shell_suffix`` through ``sh -c`` (redirections)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    if shell_suffix is not None:
        import shlex
        line = " ".join(shlex.quote(a) for a in [PY, "-m", "shardplan", *map(str, args)]) + " " + shell_suffix
        proc = subprocess.run(["sh", "-c", line], env=full_env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                              timeout=timeout)
    else:
        proc = subprocess.run([PY, "-m", "shardplan", *map(str, args)], env=full_env, cwd=cwd, stdin=stdin,
                              stdout=stdout, stderr=stderr, timeout=timeout)
    out = proc.stdout.decode("utf-8", "replace") if isinstance(proc.stdout, bytes) else ""
    err = proc.stderr.decode("utf-8", "replace") if isinstance(proc.stderr, bytes) else ""
    return proc.returncode, out, err


def exit_class(code: int, err: str, *, allow_ok=True, allow_error=True) -> str:
    """The outcome of an exit that must be exit 0 or a one-line exit 2."""
    if "Traceback" in err:
        return "traceback"
    if "internal error" in err or "Exception ignored" in err:
        return "wrong-exit"
    errors = [ln for ln in err.splitlines() if ln.startswith("shardplan: error:")]
    if code == 0 and allow_ok:
        return "clean"
    if code == 2 and allow_error and len(errors) <= 1 and len(err.strip().splitlines()) <= max(1, len(errors)) + 2:
        return "clean"
    return "wrong-exit"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- class: output-links-modes (item 2) ----------------------------------------------------------------

def _secret(folder: Path, perm: int = 0o600) -> Path:
    s = folder / "secret.txt"
    s.write_text("do not touch\n")
    os.chmod(s, perm)
    return s


def _link_case(folder: Path, command: list[str], link_name: str, sticky: bool = False) -> str:
    where = folder / "shared" if sticky else folder
    where.mkdir(exist_ok=True)
    if sticky:
        os.chmod(where, 0o1777)
    secret = _secret(folder)
    link = where / link_name
    link.symlink_to(secret)
    code, out, err = shardplan(*[str(link) if a == "{out}" else a for a in command], cwd=folder)
    if secret.read_text() != "do not touch\n" or mode(secret) != 0o600:
        return "unsafe-write"
    if not link.is_symlink():
        return "unsafe-write"  # the link itself replaced: nothing leaked, but not what the user named either
    return exit_class(code, err, allow_ok=False)


def _mode_case(folder: Path, command: list[str], name: str, perm: int, force: bool) -> str:
    target = folder / name
    target.write_text("old\n")
    os.chmod(target, perm)
    code, out, err = shardplan(*[str(target) if a == "{out}" else a for a in command], *(["--force"] if force else []),
                               cwd=folder)
    changed = target.read_text() != "old\n"
    if mode(target) & ~perm:
        return "unsafe-write"  # a mode loosened
    read_only = not perm & 0o222
    if read_only and not force:
        return "unsafe-write" if changed else exit_class(code, err, allow_ok=False)
    if code != 0 or not changed:
        return "wrong-exit"
    return "clean" if mode(target) == perm else "unsafe-write"


def output_cases() -> list[tuple[str, callable]]:
    sweep = [*SWEEP, "-o", "{out}"]
    return [
        ("sweep -o link-to-0600", lambda f: _link_case(f, sweep, "out.csv")),
        ("fit --export fsdp2=link-to-0600", _fit_export_link),
        ("sweep -o link in sticky 1777 folder", lambda f: _link_case(f, sweep, "out.csv", sticky=True)),
        ("sweep -o existing 0600 keeps 0600", lambda f: _mode_case(f, sweep, "out.csv", 0o600, False)),
        ("sweep -o existing 0640 keeps 0640", lambda f: _mode_case(f, sweep, "out.csv", 0o640, False)),
        ("sweep -o read-only 0444 refused", lambda f: _mode_case(f, sweep, "out.csv", 0o444, False)),
        ("sweep -o read-only 0444 --force", lambda f: _mode_case(f, sweep, "out.csv", 0o444, True)),
        ("export -o read-only 0400 refused", lambda f: _export_mode_case(f, 0o400, False)),
        ("export -o read-only 0400 --force", lambda f: _export_mode_case(f, 0o400, True)),
        ("export -o link-to-0600", _export_link_case),
    ]


def _plan_file(folder: Path) -> Path:
    code, out, err = shardplan("fit", FIT, "--strategy", "full_shard", "--json")
    p = folder / "plan.json"
    p.write_text(out)
    return p


def _export_mode_case(folder: Path, perm: int, force: bool) -> str:
    plan = _plan_file(folder)
    return _mode_case(folder, ["export", str(plan), "--to", "fsdp2", "-o", "{out}"], "train.py", perm, force)


def _export_link_case(folder: Path) -> str:
    plan = _plan_file(folder)
    return _link_case(folder, ["export", str(plan), "--to", "fsdp2", "-o", "{out}"], "train.py")


def _fit_export_link(folder: Path) -> str:
    secret = _secret(folder)
    link = folder / "train.py"
    link.symlink_to(secret)
    code, out, err = shardplan("fit", FIT, "--strategy", "full_shard", "--export", f"fsdp2={link}", cwd=folder)
    if secret.read_text() != "do not touch\n" or mode(secret) != 0o600 or not link.is_symlink():
        return "unsafe-write"
    return exit_class(code, err, allow_ok=False)


# --- class: stale-temps (item 2) -------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _host_tag() -> str:
    import hashlib
    import socket
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:6]


def _stale_other_name(folder: Path) -> str:
    """A killed writer's temporary file beside another target; the next write into the folder removes it."""
    stale = folder / f".other.csv.shardplan-{_host_tag()}-{_dead_pid()}-0123456789ab.tmp"
    stale.write_bytes(b"x" * 1024)
    code, out, err = shardplan(*SWEEP, "-o", str(folder / "out.csv"), cwd=folder)
    if stale.exists():
        return "unsafe-write"
    return exit_class(code, err, allow_error=False)


def _killed(folder: Path, sig: int) -> str:
    """A sweep killed while it writes; then another write into the folder: no temporary file remains."""
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    big = ["sweep", "--models", "llama-3.1-8b,gpt2,opt-125m", "--gpus", "h100-sxm,a100-80gb", "--gpu-counts", "1-64",
           "--seq-len", "512,1024,2048,4096", "--micro-batch", "1,2,4", "-o", str(folder / "big.csv")]
    proc = subprocess.Popen([PY, "-m", "shardplan", *big], env=full, cwd=folder, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    seen = False
    while time.time() < deadline and proc.poll() is None:
        if any(p.name.endswith(".tmp") for p in folder.iterdir()):
            seen = True
            time.sleep(0.05)
            proc.send_signal(sig)
            break
        time.sleep(0.01)
    proc.wait()
    if not seen:
        return "skipped"
    code, out, err = shardplan(*SWEEP, "-o", str(folder / "small.csv"), cwd=folder)
    left = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    if left:
        return "unsafe-write"
    return exit_class(code, err, allow_error=False)


def temp_cases():
    return [
        ("stale temp of another name, dead writer", _stale_other_name),
        ("sweep SIGKILLed while writing, next write", lambda f: _killed(f, signal.SIGKILL)),
        ("sweep SIGTERMed while writing, next write", lambda f: _killed(f, signal.SIGTERM)),
    ]


# --- class: foreign-overlay (item 3) ---------------------------------------------------------------------

def _overlay(folder: Path, device="NVIDIA H100 80GB HBM3", f_max=7.9e14, measured_on=None) -> Path:
    data = {"schema": "shardplan.calibration/1", "created": "2026-01-01T00:00:00+00:00",
            "source": {"device": "cuda", "gpu": device, "torch": "2.5.1", "cuda": "12.4"},
            "links": [], "bandwidth": [], "allocator": None, "accuracy": None,
            "compute": [{"dtype": "bfloat16", "device": device, "f_max_flops_per_s": f_max, "m_half": 500.0, "p": 1.0,
                         "max_rel_err": 0.05, "n_points": 8, "calibrated": True}]}
    if measured_on is not None:
        data["measured_on"] = measured_on
    p = folder / "h100_overlay.json"
    p.write_text(json.dumps(data))
    return p


def _mfu_values(out: str) -> list[float]:
    try:
        doc = json.loads(out)
    except ValueError:
        return []
    rows = doc if isinstance(doc, list) else [doc]
    return [r["time"]["mfu"] for r in rows if isinstance(r, dict) and isinstance(r.get("time"), dict)
            and isinstance(r["time"].get("mfu"), (int, float))]


def _foreign_fit(folder: Path, gpus: str, force: bool) -> str:
    cal = _overlay(folder)
    code, out, err = shardplan("fit", f"llama-3.1-8b on {gpus}", "--global-batch-tokens", "1M", "--calibration", cal,
                               "--json", *(["--force"] if force else []), cwd=folder)
    if any(m > 1.0 for m in _mfu_values(out)):
        return "wrong-answer"
    if not force:
        if code == 0:
            return "wrong-exit"  # applied silently
        named = "h100" in err.lower() and gpus.split("x", 1)[1].replace("-", "") in err.lower().replace("-", "")
        return exit_class(code, err, allow_ok=False) if named else "wrong-exit"
    warned = any("warning" in ln.lower() and "calibration" in ln.lower() for ln in err.splitlines())
    return "clean" if code == 0 and warned else "wrong-exit"


def _own_fit(folder: Path) -> str:
    cal = _overlay(folder)
    code, out, err = shardplan("fit", "llama-3.1-8b on 8xh100-sxm", "--global-batch-tokens", "1M", "--calibration", cal,
                               "--json", cwd=folder)
    if any(m > 1.0 for m in _mfu_values(out)):
        return "wrong-answer"
    return "clean" if code == 0 else exit_class(code, err, allow_error=False)


def _foreign_plan(folder: Path) -> str:
    cal = _overlay(folder)
    code, out, err = shardplan("plan", "llama-3.1-8b on 8xrtx4090", "--global-batch-tokens", "1M", "--calibration", cal,
                               cwd=folder)
    if code == 0:
        return "wrong-exit"
    return exit_class(code, err, allow_ok=False)


def _mfu_sweep(folder: Path, method: str) -> str:
    """MFU over a sweep (GPUs x models x counts x sequence lengths) with an overlay measured on a
    faster GPU, through the Python API (which applies what it is handed): never above 1."""
    cal = _overlay(folder, f_max=2.5e15)
    line = _api_line(folder, f"mfu_sweep({str(cal)!r}, {method!r})")
    if not line.startswith("returned: "):
        return "traceback" if line.startswith("raises:") else "wrong-exit"
    return "wrong-answer" if float(line.split()[1]) > 1.0 else "clean"


def overlay_cases():
    return [
        ("h100 overlay on 8xrtx4090 (fit)", lambda f: _foreign_fit(f, "8xrtx4090", False)),
        ("h100 overlay on 8xa100-80gb (fit)", lambda f: _foreign_fit(f, "8xa100-80gb", False)),
        ("h100 overlay on 8xrtx4090 --force", lambda f: _foreign_fit(f, "8xrtx4090", True)),
        ("h100 overlay on 8xrtx4090 (plan)", _foreign_plan),
        ("h100 overlay on its own GPU", _own_fit),
        ("MFU over a sweep, full fine-tuning, fast overlay", lambda f: _mfu_sweep(f, "full")),
        ("MFU over a sweep, LoRA, fast overlay", lambda f: _mfu_sweep(f, "lora")),
        ("MFU over a sweep, LoRA, no overlay", lambda f: _mfu_sweep(f, "lora-nameplate")),
    ]


# --- class: shadowing-profiles and duplicate keys (item 4) -----------------------------------------------

TINY_GPU = {"name": "tiny-card", "display_name": "a 1 GiB card", "aliases": ["a100-80gb"], "vendor": "nvidia",
            "memory_bytes": 2**30, "nominal_memory_gb": 1, "peak_flops": {"bf16": 1e14, "fp32": 1e13},
            "memory_bandwidth_bytes_per_s": 1e12, "default_intra_link": "nvlink3", "default_inter_link": "ib-hdr",
            "default_gpus_per_node": 8, "default_host_ram_bytes": 2**40, "gemm_efficiency": 0.7,
            "attention_efficiency": 0.3, "sm_count": 108, "host_link": "pcie4"}


def _profile_dir(folder: Path, kind: str, name: str, text: str) -> dict:
    d = folder / "profiles" / kind
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
    return {"SHARDPLAN_PROFILE_PATH": str(folder / "profiles")}


def _base_gpu() -> dict:
    data = json.loads((REPO / "shardplan/data/hardware_profiles/gpus/a100-80gb.json").read_text())
    return data


def _shadow(folder: Path, by: str, json_out: bool) -> str:
    gpu = {**_base_gpu(), "memory_bytes": 2**30, "nominal_memory_gb": 1}
    if by == "alias":
        gpu = {**gpu, "name": "tiny-card", "aliases": ["a100-80gb"], "generic_aliases": []}
    env = _profile_dir(folder, "hardware_profiles/gpus", "tiny.json", json.dumps(gpu))
    code, out, err = shardplan("fit", "llama-3.1-8b on 8xa100-80gb", *(["--json"] if json_out else []), env=env,
                               cwd=folder)
    said = [ln for ln in (err + out).splitlines() if "shadow" in ln.lower() or "SHARDPLAN_PROFILE_PATH" in ln]
    if code != 0:
        return exit_class(code, err)
    return "clean" if said else "wrong-exit"


def _shadow_model(folder: Path) -> str:
    spec = json.loads((REPO / "shardplan/data/model_profiles/llama-3.1-8b.json").read_text())
    spec = {**spec, "name": "my-llama", "aliases": ["llama-3.1-8b"], "num_layers": 2}
    env = _profile_dir(folder, "model_profiles", "mine.json", json.dumps(spec))
    code, out, err = shardplan("fit", FIT, env=env, cwd=folder)
    said = [ln for ln in (err + out).splitlines() if "shadow" in ln.lower() or "SHARDPLAN_PROFILE_PATH" in ln]
    return ("clean" if said else "wrong-exit") if code == 0 else exit_class(code, err)


def _dup_text(data: dict, key: str, value) -> str:
    text = json.dumps(data)
    return text[:-1] + f', "{key}": {json.dumps(value)}}}'


def _dup_validate(folder: Path) -> str:
    p = folder / "gpu.json"
    p.write_text(_dup_text(_base_gpu(), "memory_bytes", 2**30))
    code, out, err = shardplan("profiles", "validate", p, cwd=folder)
    if code == 0:
        return "wrong-exit"
    return exit_class(code, err, allow_ok=False) if "duplicate" in err.lower() else "wrong-exit"


def _dup_overlay(folder: Path) -> str:
    cal = _overlay(folder)
    data = json.loads(cal.read_text())
    cal.write_text(_dup_text(data, "schema", "shardplan.calibration/1"))
    code, out, err = shardplan("fit", FIT, "--calibration", cal, cwd=folder)
    if code == 0:
        return "wrong-exit"
    return exit_class(code, err, allow_ok=False) if "duplicate" in err.lower() else "wrong-exit"


def _dup_hf_config(folder: Path) -> str:
    cfg = json.loads((REPO / "tests/data/hf_configs.json").read_text())["models"]["Llama-3.1-8B"]["kwargs"]
    cfg = {"model_type": "llama", **cfg}
    p = folder / "config.json"
    p.write_text(_dup_text(cfg, "num_hidden_layers", 2))
    code, out, err = shardplan("fit", "--model", p, "--gpus", "8xh100-sxm", cwd=folder)
    if code == 0:
        return "wrong-exit"
    return exit_class(code, err, allow_ok=False) if "duplicate" in err.lower() else "wrong-exit"


def _dup_profile_path(folder: Path) -> str:
    env = _profile_dir(folder, "hardware_profiles/gpus", "dup.json",
                       _dup_text({**_base_gpu(), "name": "dup-card", "aliases": []}, "memory_bytes", 2**30))
    code, out, err = shardplan("fit", "llama-3.1-8b on 8xdup-card", env=env, cwd=folder)
    if code == 0:
        return "wrong-exit"
    return exit_class(code, err, allow_ok=False) if "duplicate" in err.lower() else "wrong-exit"


def profile_cases():
    return [
        ("user GPU aliased a100-80gb answers 8xa100-80gb", lambda f: _shadow(f, "alias", False)),
        ("user GPU named a100-80gb, --json", lambda f: _shadow(f, "name", True)),
        ("user model aliased llama-3.1-8b", _shadow_model),
        ("profiles validate: duplicate key", _dup_validate),
        ("--calibration: duplicate key", _dup_overlay),
        ("HF config.json: duplicate key", _dup_hf_config),
        ("SHARDPLAN_PROFILE_PATH profile: duplicate key", _dup_profile_path),
    ]


# --- class: process-exits (item 5) -----------------------------------------------------------------------

def _devfull(folder: Path) -> str:
    code, out, err = shardplan("fit", FIT, stdout=open("/dev/full", "wb"), cwd=folder)
    return exit_class(code, err, allow_ok=False)


def _closed(folder: Path, which: str) -> str:
    args = ["fit", FIT] if which != "stdin-export" else ["export", "-", "--to", "fsdp2"]
    suffix = {"stdin": "<&-", "stderr": "2>&-", "stdout": ">&-", "stdin-export": "<&-"}[which]
    if which == "stderr":
        args = ["fit", "nonsense-model on 8xh100-sxm"]  # an error with nowhere to print it
    code, out, err = shardplan(*args, shell_suffix=suffix, cwd=folder)
    if which == "stderr":
        return "clean" if code == 2 else "wrong-exit"
    return exit_class(code, err)


def _latin1(folder: Path, args: list[str]) -> str:
    code, out, err = shardplan(*args, env={"PYTHONIOENCODING": "latin-1"}, cwd=folder)
    return exit_class(code, err)


def _huge_memory(folder: Path, validate: bool) -> str:
    gpu = {**_base_gpu(), "name": "huge-card", "aliases": [], "generic_aliases": [], "memory_bytes": 2**70}
    env = _profile_dir(folder, "hardware_profiles/gpus", "huge.json", json.dumps(gpu))
    if validate:
        code, out, err = shardplan("profiles", "validate", folder / "profiles/hardware_profiles/gpus/huge.json")
        return exit_class(code, err, allow_ok=False)
    code, out, err = shardplan("fit", "llama-3.1-8b on 8xhuge-card", env=env, cwd=folder)
    return exit_class(code, err)


def _head(folder: Path, args: list[str]) -> str:
    code, out, err = shardplan(*args, shell_suffix="| head -1", cwd=folder)
    return exit_class(code, err)


def process_cases():
    return [
        ("fit > /dev/full", _devfull),
        ("fit <&- (stdin closed)", lambda f: _closed(f, "stdin")),
        ("export - <&- (stdin closed)", lambda f: _closed(f, "stdin-export")),
        ("fit >&- (stdout closed)", lambda f: _closed(f, "stdout")),
        ("fit error 2>&- (stderr closed)", lambda f: _closed(f, "stderr")),
        ("PYTHONIOENCODING=latin-1 fit", lambda f: _latin1(f, ["fit", FIT])),
        ("PYTHONIOENCODING=latin-1 plan", lambda f: _latin1(f, ["plan", FIT, "--global-batch-tokens", "1M"])),
        ("PYTHONIOENCODING=latin-1 fit 70B on 4x24GB", lambda f: _latin1(f, ["fit", "70B on 4x24GB"])),
        ("PYTHONIOENCODING=latin-1 models", lambda f: _latin1(f, ["models"])),
        ("profile memory_bytes 2**70 (fit)", lambda f: _huge_memory(f, False)),
        ("profile memory_bytes 2**70 (validate)", lambda f: _huge_memory(f, True)),
        ("--help | head -1", lambda f: _head(f, ["--help"])),
        ("fit --help | head -1", lambda f: _head(f, ["fit", "--help"])),
        ("models | head -1", lambda f: _head(f, ["models"])),
        ("fit 70B on 4x24GB | head -1", lambda f: _head(f, ["fit", "70B on 4x24GB"])),
    ]


# --- class: api-bad-input (item 5) ------------------------------------------------------------------------

API_CASES = {  # values a caller can hand past validation: model_copy(update=...) does not validate
    "fit, TrainingConfig(micro_batch=nan)": "fit(micro_batch=float('nan'))",
    "fit, TrainingConfig(seq_len=0)": "fit(seq_len=0)",
    "fit, config.model_copy(micro_batch=nan)": "fit_copied(micro_batch=float('nan'))",
    "fit, config.model_copy(seq_len=0)": "fit_copied(seq_len=0)",
    "evaluate, config.model_copy(micro_batch=nan)": "evaluate_copied(micro_batch=float('nan'))",
    "evaluate_queries, config.model_copy(seq_len=0)": "queries_copied(seq_len=0)",
    "fit, spec_from_hf_config(num_hidden_layers=0)": "fit_hf(num_hidden_layers=0)",
    "fit, spec.model_copy(num_layers=0)": "fit_spec_copied(num_layers=0)",
    "evaluate_queries, spec.model_copy(num_layers=0)": "queries_spec_copied(num_layers=0)",
    "sweep(dropout='no')": "sweep(dropout='no')",
    "sweep(micro_batch=nan)": "sweep(micro_batch=float('nan'))",
    "sweep(seq_len=0)": "sweep(seq_len=0)",
    "step_timing, config.model_copy(micro_batch=nan)": "timing_copied(micro_batch=float('nan'))",
}

API_RUNNER = r'''
import sys
from shardplan.support.errors import ShardplanError

def _parts():
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import resolve_model
    return resolve_model("llama-3.1-8b").spec, parse_gpus("8xh100-sxm"), TrainingConfig()

def fit(**kw):
    from shardplan.inputs.config import TrainingConfig
    from shardplan.planning.fit import fit as f
    spec, cluster, _ = _parts()
    return f(spec, cluster, TrainingConfig(**kw), ["full_shard"])

def fit_copied(**kw):
    from shardplan.planning.fit import fit as f
    spec, cluster, config = _parts()
    return f(spec, cluster, config.model_copy(update=kw), ["full_shard"])

def evaluate_copied(**kw):
    from shardplan.planning.fit import evaluate
    spec, cluster, config = _parts()
    return evaluate(spec, cluster, config.model_copy(update=kw))

def queries_copied(**kw):
    import shardplan
    spec, cluster, config = _parts()
    return shardplan.evaluate_queries([(spec, cluster, config.model_copy(update=kw))])

def timing_copied(**kw):
    from shardplan.planning.fit import step_timing
    spec, cluster, config = _parts()
    return step_timing(spec, cluster, config.model_copy(update={"grad_accum": 64, **kw}))

def fit_hf(**kw):
    from shardplan.inputs.hf_config import spec_from_hf_config
    from shardplan.planning.fit import fit as f
    _, cluster, config = _parts()
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, **kw}
    return f(spec_from_hf_config(cfg, "hostile"), cluster, config, ["full_shard"])

def fit_spec_copied(**kw):
    from shardplan.planning.fit import fit as f
    spec, cluster, config = _parts()
    return f(spec.model_copy(update=kw), cluster, config, ["full_shard"])

def queries_spec_copied(**kw):
    import shardplan
    spec, cluster, config = _parts()
    return shardplan.evaluate_queries([(spec.model_copy(update=kw), cluster, config)])

def mfu_sweep(path, method):
    from shardplan.calibrate.overlay import load_calibration
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import resolve_model
    from shardplan.planning.fit import step_timing
    cal = None if method.endswith("nameplate") else load_calibration(path)
    worst = 0.0
    for gpu in ("rtx4090", "t4", "a100-80gb", "h100-sxm", "l4"):
        for model in ("gpt2", "llama-3.2-1b", "llama-3.1-8b"):
            for n in (1, 8):
                for seq in (512, 4096):
                    config = TrainingConfig(seq_len=seq, micro_batch=4, grad_accum=8, method=method.split("-")[0])
                    t = step_timing(resolve_model(model).spec, parse_gpus(f"{n}x{gpu}"), config, cal)
                    worst = max(worst, t["mfu"])
    return worst

def sweep(**kw):
    import shardplan
    return shardplan.sweep(models="gpt2", gpus="h100-sxm", gpu_counts=[8], strategies="full_shard", progress=False, **kw)

try:
    got = eval(sys.argv[1])
except ShardplanError as err:
    print("error" if "\n" not in str(err) else "multi-line")
except Exception as exc:
    print("raises:" + type(exc).__name__ + ": " + str(exc)[:120].replace("\n", " "))
else:
    print("returned: " + repr(got)[:160].replace("\n", " "))
'''


def _api_line(folder: Path, expr: str) -> str:
    """What API_RUNNER printed for ``expr``: error, raises:TYPE..., or returned: VALUE."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([PY, "-c", API_RUNNER, expr], env=full_env, cwd=folder, capture_output=True, text=True,
                          timeout=300)
    return (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-200:]])[-1]


def _api(folder: Path, expr: str) -> str:
    line = _api_line(folder, expr)
    if line == "error":
        return "clean"
    if line.startswith("raises:"):
        return "traceback"
    return "wrong-answer" if line.startswith("returned") else "wrong-exit"


def api_cases():
    return [(name, lambda f, e=expr: _api(f, e)) for name, expr in API_CASES.items()]



# --- class: calibrate-outputs (session 2: the calibrate commands' files under the same policy) ------------

RECORDS = str(REPO / "data" / "calibration" / "grid_cpu.jsonl")
NCCL_LOG = str(REPO / "tests" / "data" / "nccl_tests_sample_all_gather_perf.txt")


def _overlay_mode_case(folder: Path, force: bool) -> str:
    """An overlay made read-only, then merged into again by ``calibrate collectives``."""
    out = folder / "cal.json"
    code, _, err = shardplan("calibrate", "collectives", "--nccl-tests", NCCL_LOG, "--out", out, cwd=folder)
    if code != 0:
        return exit_class(code, err)
    os.chmod(out, 0o440)
    before = out.read_text()
    code, _, err = shardplan("calibrate", "collectives", "--nccl-tests", NCCL_LOG, "--out", out,
                             *(["--force"] if force else []), cwd=folder)
    if mode(out) != 0o440:
        return "unsafe-write"
    if not force:
        return "unsafe-write" if out.read_text() != before else exit_class(code, err, allow_ok=False)
    return "clean" if code == 0 else "wrong-exit"


def calibrate_output_cases():
    compare = ["calibrate", "compare", RECORDS]
    return [
        ("calibrate compare --csv link-to-0600", lambda f: _link_case(f, [*compare, "--csv", "{out}"], "out.csv")),
        ("calibrate compare --json link-to-0600 --force",
         lambda f: _link_case(f, [*compare, "--json", "{out}", "--force"], "out.json")),
        ("calibrate compare --md link in sticky 1777 folder",
         lambda f: _link_case(f, [*compare, "--md", "{out}"], "out.md", sticky=True)),
        ("calibrate compare --md read-only 0444 refused",
         lambda f: _mode_case(f, [*compare, "--md", "{out}"], "out.md", 0o444, False)),
        ("calibrate compare --csv read-only 0444 --force",
         lambda f: _mode_case(f, [*compare, "--csv", "{out}"], "out.csv", 0o444, True)),
        ("calibrate compare --csv existing 0600 keeps 0600",
         lambda f: _mode_case(f, [*compare, "--csv", "{out}"], "out.csv", 0o600, False)),
        ("calibrate collectives --out read-only overlay refused", lambda f: _overlay_mode_case(f, False)),
        ("calibrate collectives --out read-only overlay --force", lambda f: _overlay_mode_case(f, True)),
    ]


# --- class: invalid-user-profiles (session 2: a skipped profile is announced, naming file and field) -------

def _invalid_gpu(folder: Path, change: dict, field: str) -> str:
    gpu = {**_base_gpu(), "name": "bad-card", "aliases": [], "generic_aliases": [], **change}
    env = _profile_dir(folder, "hardware_profiles/gpus", "bad.json", json.dumps(gpu))
    code, out, err = shardplan("fit", "llama-3.1-8b on 8xbad-card", env=env, cwd=folder)
    said = [ln for ln in err.splitlines() if "bad.json" in ln and f"{field}=" in ln]
    if "Traceback" in err:
        return "traceback"
    return exit_class(code, err) if said else "wrong-exit"


def _invalid_model_flat(folder: Path) -> str:
    """A flat folder: an invalid model profile beside a valid GPU profile; a fit on built-ins."""
    flat = folder / "flat"
    flat.mkdir()
    spec = json.loads((REPO / "shardplan/data/model_profiles/llama-3.1-8b.json").read_text())
    (flat / "model.json").write_text(json.dumps({**spec, "name": "my-model", "aliases": [], "num_layers": -1}))
    (flat / "gpu.json").write_text(json.dumps({**_base_gpu(), "name": "ok-card", "aliases": [], "generic_aliases": []}))
    code, out, err = shardplan("fit", FIT, env={"SHARDPLAN_PROFILE_PATH": str(flat)}, cwd=folder)
    warned = [ln for ln in err.splitlines() if "SHARDPLAN_PROFILE_PATH" in ln]
    if code != 0:
        return exit_class(code, err)
    if any("gpu.json" in ln for ln in warned):  # a valid profile of another kind must stay silent
        return "wrong-exit"
    return "clean" if any("model.json" in ln and "num_layers=" in ln for ln in warned) else "wrong-exit"


def invalid_profile_cases():
    return [
        ("user GPU memory_bytes 2**70 (out of range)", lambda f: _invalid_gpu(f, {"memory_bytes": 2**70}, "memory_bytes")),
        ("user GPU misspelt key memroy_gb", lambda f: _invalid_gpu(f, {"memroy_gb": 80}, "memroy_gb")),
        ("user GPU memory_bytes 'lots' (wrong type)", lambda f: _invalid_gpu(f, {"memory_bytes": "lots"}, "memory_bytes")),
        ("flat folder: invalid model beside a valid GPU", _invalid_model_flat),
    ]


# --- class: unknown-model-type (session 2: item 10, a config no family reader knows) -----------------------

NEOX = {"model_type": "gpt_neox", "hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 8,
        "intermediate_size": 1024, "vocab_size": 5000, "max_position_embeddings": 2048, "tie_word_embeddings": False}
HIDE_EXTRAS = ("import runpy, sys\nfor m in ('torch', 'transformers'):\n    sys.modules[m] = None\n"
               "sys.argv = ['shardplan', *sys.argv[1:]]\nrunpy.run_module('shardplan', run_name='__main__')\n")


def _neox_total(c: dict) -> int:
    """GPT-NeoX's parameters by hand (transformers GPTNeoXLayer: LayerNorms with bias, fused QKV, biases)."""
    h, i, v, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    return 2 * v * h + 2 * h + L * (4 * h + 3 * h * h + 3 * h + h * h + h + h * i + i + i * h + h)


def _config_folder(folder: Path, config: dict) -> Path:
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "never_run.Config",
                                                                          "AutoModelForCausalLM": "never_run.Model"}}))
    (model / "never_run.py").write_text(f"open({str(folder / 'RAN')!r}, 'w').write('ran')\n")
    return model


def _unknown_type(folder: Path, config: dict, hidden: bool) -> str:
    """exit 0 with transformers' own count, or one line naming the extra (hidden) or the model_type;
    any other answer is for another architecture (wrong-answer); the auto_map module running is unsafe."""
    model = _config_folder(folder, config)
    args = ["fit", "--model", str(model), "--gpus", "1xrtx4090"]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{model}"}  # auto_map's module importable: must not run
    cmd = [PY, "-c", HIDE_EXTRAS, *args] if hidden else [PY, "-m", "shardplan", *args]
    proc = subprocess.run(cmd, env=env, cwd=folder, capture_output=True, text=True, timeout=300)
    if (folder / "RAN").exists():
        return "unsafe-write"
    if proc.returncode == 0:
        return "clean" if f"{_neox_total(config):,} params" in proc.stdout and not hidden else "wrong-answer"
    if hidden and 'shardplan[hf]' not in proc.stderr:
        return "wrong-exit"
    return exit_class(proc.returncode, proc.stderr, allow_ok=False)


def unknown_type_cases():
    made_up = {**NEOX, "model_type": "made_up_lm"}
    return [
        ("gpt_neox config.json + auto_map, transformers installed", lambda f: _unknown_type(f, NEOX, False)),
        ("gpt_neox config.json, torch/transformers absent", lambda f: _unknown_type(f, NEOX, True)),
        ("model_type transformers does not ship (standard keys)", lambda f: _unknown_type(f, made_up, False)),
        ("gpt_neox 10,000 layers of width 2**20", lambda f: _unknown_type(
            f, {**NEOX, "hidden_size": 2**20, "num_hidden_layers": 10_000}, False)),
    ]

CLASSES = {
    "output-links-modes": output_cases,
    "stale-temps": temp_cases,
    "foreign-overlay": overlay_cases,
    "shadow-and-duplicate-keys": profile_cases,
    "process-exits": process_cases,
    "api-bad-input": api_cases,
    "calibrate-outputs": calibrate_output_cases,
    "invalid-user-profiles": invalid_profile_cases,
    "unknown-model-type": unknown_type_cases,
}
OUTCOMES = ("clean", "wrong-exit", "traceback", "unsafe-write", "wrong-answer", "skipped")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the counts and each case's outcome here")
    parser.add_argument("--verbose", action="store_true", help="print each case's outcome")
    parser.add_argument("--only", help="run only this class")
    args = parser.parse_args()
    counts: dict[str, collections.Counter] = {}
    cases_out = []
    with tempfile.TemporaryDirectory(prefix="shardplan-hostile-") as root:
        for cls, make in CLASSES.items():
            if args.only and args.only != cls:
                continue
            counts[cls] = collections.Counter()
            for name, run in make():
                folder = Path(tempfile.mkdtemp(dir=root))
                try:
                    outcome = run(folder)
                except Exception as exc:  # noqa: BLE001 - the driver's own failure, shown as such
                    outcome = f"driver-error:{type(exc).__name__}:{exc}"[:200]
                counts[cls][outcome.split(":")[0]] += 1
                cases_out.append({"class": cls, "case": name, "outcome": outcome})
                if args.verbose:
                    print(f"  {cls:28s} {outcome:14s} {name}", file=sys.stderr)
    header = f"{'class':28s} " + " ".join(f"{o:>12s}" for o in OUTCOMES) + f" {'total':>6s}"
    print(header)
    for cls, c in counts.items():
        print(f"{cls:28s} " + " ".join(f"{c.get(o, 0):12d}" for o in OUTCOMES) + f" {sum(c.values()):6d}")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": {k: dict(v) for k, v in counts.items()}, "cases": cases_out},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
