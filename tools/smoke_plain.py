"""Smoke test of every ``shardplan`` subcommand and export format, as a plain-install user meets them.

Run it with the Python of the environment to check (``.ci/run`` runs it with ``.venv-plain``, which
holds only ``pip install .``)::

    .venv-plain/bin/python tools/smoke_plain.py --plain

Each command runs in its own process, in a scratch folder (so the *installed* package is imported,
not the checkout), and must either exit 0, or — for what truly needs an optional extra — exit 2
with exactly one stderr line naming it (``pip install "shardplan[EXTRA]"``). No output may contain
"Traceback". Formats that need no library (fsdp2, fsdp1, deepspeed, trainer, torchrun) must work.

``--plain``: the extras must be absent, so the commands that need one must give that one line
(exit 0 is a failure: the check would prove nothing). Without it, either answer is accepted.
``--hide-extras``: hide the extras from each child interpreter the way an absent package is
(``sys.modules[name] = None``), to run the smoke from a development environment; implies --plain.

Exit status: 0 when every check passed, 1 otherwise (each failure printed with its output).
Standard library only: it must run in the plain environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
# optional packages and the extra (pyproject.toml) that brings each
EXTRAS = {"yaml": "export", "accelerate": "export", "transformers": "export", "deepspeed": "export",
          "torch": "calibrate", "pyarrow": "parquet", "matplotlib": "notebooks", "peft": "stacks",
          "bitsandbytes": "stacks"}
FORMATS = ("fsdp2", "fsdp1", "accelerate", "deepspeed", "trainer", "torchrun")
NEEDS = {"accelerate": "export"}  # export formats that need an extra (YAML); the rest are plain text
README_QUERY = "70B on 4x24GB"  # README command 1
FITS_QUERY = "llama-3.1-8b on 8xh100-sxm ac full"  # strategies that fit, to export
HIDE = ("import runpy, sys\n"
        "for m in {names!r}:\n    sys.modules[m] = None\n"
        "sys.argv = ['shardplan', *sys.argv[1:]]\nrunpy.run_module('shardplan', run_name='__main__')\n")


@dataclass
class Check:
    """One command: ``args`` after ``shardplan``; ``extra``: the extra it truly needs (None: none);
    ``code``: its exit code when it works; ``then``: further assertions on (stdout, folder)."""
    name: str
    args: list[str]
    extra: Optional[str] = None
    code: int = 0
    then: Optional[Callable[[str, Path], Optional[str]]] = None
    save_stdout: Optional[str] = None
    absent: list[str] = field(default_factory=list)  # files a refusal (exit 2) must not leave behind


def _nonempty(*names: str) -> Callable[[str, Path], Optional[str]]:
    def check(_out: str, folder: Path) -> Optional[str]:
        for n in names:
            p = folder / n
            if not p.is_file() or p.stat().st_size == 0:
                return f"{n} was not written"
        return None
    return check


def _json(kind: type) -> Callable[[str, Path], Optional[str]]:
    def check(out: str, _folder: Path) -> Optional[str]:
        try:
            data = json.loads(out)
        except json.JSONDecodeError as err:
            return f"stdout is not JSON ({err.msg})"
        return None if isinstance(data, kind) else f"stdout is JSON {type(data).__name__}, expected {kind.__name__}"
    return check


def _contains(text: str) -> Callable[[str, Path], Optional[str]]:
    return lambda out, _folder: None if text in out else f"stdout lacks {text!r}"


def checks() -> tuple[list[Check], list[Check]]:
    """Two waves: the second reads files (fit.json, plan.json, cal.json) that the first writes."""
    nccl = str(REPO / "tests" / "data" / "nccl_tests_sample_all_gather_perf.txt")
    records = str(REPO / "data" / "calibration" / "grid_cpu.jsonl")
    unknown_type = str(REPO / "tests" / "data" / "unknown_model_type")
    first = [
        Check("--version", ["--version"], then=_contains("shardplan ")),
        Check("--help", ["--help"], then=_contains("fit")),
        Check("README command 1", ["fit", README_QUERY], then=_contains("DOES NOT FIT")),
        Check("fit --check (nothing fits: exit 1)", ["fit", README_QUERY, "--check"], code=1),
        Check("fit --check (fits: exit 0)", ["fit", FITS_QUERY, "--check"]),
        Check("fit --json", ["fit", FITS_QUERY, "--json"], then=_json(list), save_stdout="fit.json"),
        Check("fit --strategy --json", ["fit", FITS_QUERY, "--strategy", "full_shard", "--json"], then=_json(dict)),
        *[Check(f"fit --export {f}", ["fit", FITS_QUERY, "--export", f"{f}=fit-export.{f}"], extra=NEEDS.get(f),
                then=_nonempty(f"fit-export.{f}"), absent=[f"fit-export.{f}"]) for f in FORMATS],
        Check("fit --export to stdout", ["fit", FITS_QUERY, "--strategy", "full_shard", "--export", "torchrun"],
              then=_contains("torchrun")),
        Check("plan", ["plan", "llama-3.1-8b", "--gpus", "8xh100-sxm"]),
        Check("plan --json", ["plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--json"], then=_json(dict),
              save_stdout="plan.json"),
        Check("fit an unknown model_type (module tree)", ["fit", "--model", unknown_type, "--gpus", "1xrtx4090"],
              extra="hf", then=_contains("module tree")),
        Check("models", ["models"], then=_contains("llama-3.1-8b")),
        Check("models show", ["models", "show", "llama-3.1-8b"]),
        Check("models show --json", ["models", "show", "llama-3.1-8b", "--json"], then=_json(dict)),
        Check("hardware", ["hardware"], then=_contains("h100-sxm")),
        Check("hardware show (GPU)", ["hardware", "show", "h100-sxm"], then=_contains("memory")),
        Check("hardware show (link)", ["hardware", "show", "nvlink4"], then=_contains("nccl_channels")),
        Check("hardware show --json (GPU)", ["hardware", "show", "h100-sxm", "--json"], then=_json(dict)),
        Check("hardware show --json (link)", ["hardware", "show", "nvlink4", "--json"], then=_json(dict)),
        Check("profiles validate", ["profiles", "validate", str(REPO / "shardplan" / "data")], then=_contains(": ok")),
        Check("sweep -o csv", ["sweep", "-o", "sweep.csv", "--gpu-counts", "1,8", "--no-progress"],
              then=_nonempty("sweep.csv")),
        Check("sweep -o parquet", ["sweep", "-o", "sweep.parquet", "--gpu-counts", "1,8", "--no-progress"],
              extra="parquet", then=_nonempty("sweep.parquet"), absent=["sweep.parquet"]),
        Check("calibrate fsdp", ["calibrate", "fsdp", "--out", "fsdp.jsonl", "--no-isolate"], extra="calibrate",
              absent=["fsdp.jsonl"]),
        Check("calibrate collectives", ["calibrate", "collectives", "--out", "bench.json", "--max-bytes", "4096",
                                        "--iters", "1", "--warmup", "0"], extra="calibrate", absent=["bench.json"]),
        Check("calibrate compute", ["calibrate", "compute", "--out", "compute.json", "--size", "64", "--size", "128",
                                    "--size", "256", "--iters", "1", "--no-bandwidth"], extra="calibrate",
              absent=["compute.json"]),
        Check("calibrate collectives --nccl-tests", ["calibrate", "collectives", "--nccl-tests", nccl,
                                                     "--out", "cal.json"], then=_nonempty("cal.json")),
        Check("calibrate compare", ["calibrate", "compare", records, "--csv", "compare.csv"],
              then=_nonempty("compare.csv")),
    ]
    second = [
        *[Check(f"export {src}.json --to {f}", ["export", f"{src}.json", "--to", f, "-o", f"{src}-export.{f}"],
                extra=NEEDS.get(f), then=_nonempty(f"{src}-export.{f}"), absent=[f"{src}-export.{f}"])
          for src in ("fit", "plan") for f in FORMATS],
        Check("fit --calibration", ["fit", FITS_QUERY, "--calibration", "cal.json", "--global-batch-tokens", "1M"]),
        Check("plan --calibration", ["plan", "llama-3.1-8b", "--gpus", "8xh100-sxm", "--calibration", "cal.json"]),
    ]
    return first, second


def command(hide: bool) -> list[str]:
    """How to start ``shardplan``: the installed console script next to this Python, else ``-m``."""
    if hide:
        return [sys.executable, "-c", HIDE.format(names=tuple(EXTRAS))]
    script = Path(sys.executable).with_name("shardplan.exe" if os.name == "nt" else "shardplan")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "shardplan"]


def judge(check: Check, code: int, out: str, err: str, folder: Path, plain: bool) -> Optional[str]:
    """None when the check passed, else why not."""
    if "Traceback" in out + err:
        return "a traceback"
    if code == 3 or "shardplan: internal error" in err:  # cli.main's one-line report of an unexpected exception
        return "a bug (exit 3, shardplan: internal error)"
    wanted = f'pip install "shardplan[{check.extra}]"' if check.extra else None
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if wanted and code == 2:
        if len(lines) != 1 or wanted not in lines[0]:
            return f"exit 2 without exactly one stderr line naming {wanted!r}"
        left = [n for n in check.absent if (folder / n).exists()]
        return f"it refused but left {', '.join(left)} behind" if left else None
    if wanted and plain:
        return f"exit {code}; without the extra it must exit 2 with one line naming {wanted!r}"
    if code != check.code:
        return f"exit {code}, expected {check.code}"
    return check.then(out, folder) if check.then else None


def run_one(check: Check, start: list[str], folder: Path, plain: bool, timeout_s: float,
            source: Optional[Path]) -> tuple[Check, Optional[str], str, float]:
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, not a checkout
    env["OMP_NUM_THREADS"] = "1"
    if source is not None:
        env["PYTHONPATH"] = str(source)
    try:
        p = subprocess.run([*start, *check.args], cwd=folder, capture_output=True, text=True, timeout=timeout_s,
                           env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return check, f"did not finish in {timeout_s:.0f} s", "", time.perf_counter() - t0
    if check.save_stdout and p.returncode == 0:
        (folder / check.save_stdout).write_text(p.stdout, encoding="utf-8")
    why = judge(check, p.returncode, p.stdout, p.stderr, folder, plain)
    stdout_tail = "\n".join(p.stdout.splitlines()[-5:])
    shown = (f"$ shardplan {' '.join(check.args)}\n[exit {p.returncode}; stderr:]\n{p.stderr[-4000:]}\n"
             f"[stdout, last lines:]\n{stdout_tail}")
    return check, why, shown, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/smoke_plain.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plain", action="store_true", help="the extras must be absent (the CI plain stage)")
    ap.add_argument("--hide-extras", action="store_true", help="hide the extras from each child (implies --plain)")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="commands run at once")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per command")
    ap.add_argument("--keep", metavar="DIR", help="run in DIR and keep what the commands wrote")
    ap.add_argument("--only", metavar="TEXT", action="append", default=[],
                    help="run only the checks whose name contains TEXT (repeatable; a second-wave check needs "
                         "the first-wave check that writes its input)")
    ap.add_argument("--source", metavar="DIR", type=Path,
                    help="import shardplan from DIR (a checkout) instead of the installed package")
    args = ap.parse_args(argv)
    plain = args.plain or args.hide_extras
    if args.plain and not args.hide_extras:
        import importlib.util

        present = sorted(m for m in EXTRAS if importlib.util.find_spec(m) is not None)
        if present:
            print(f"smoke: --plain, but this environment has {', '.join(present)} (not a plain install)")
            return 1
    start = command(args.hide_extras)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="shardplan-smoke-"))
    folder.mkdir(parents=True, exist_ok=True)
    waves = [[c for c in wave if not args.only or any(t in c.name for t in args.only)] for wave in checks()]
    failures, t0 = 0, time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for wave in waves:
                for check, why, shown, seconds in pool.map(
                        lambda c: run_one(c, start, folder, plain, args.timeout, args.source), wave):
                    print(f"{'ok  ' if why is None else 'FAIL'} {seconds:5.1f} s  {check.name}", flush=True)
                    if why is not None:
                        failures += 1
                        print(f"     why: {why}\n" + "\n".join("     | " + ln for ln in shown.splitlines()), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    total = sum(len(w) for w in waves)
    if not total:
        print(f"smoke: no check's name contains {' or '.join(map(repr, args.only))}")
        return 1
    print(f"smoke: {total - failures} of {total} checks passed in {time.perf_counter() - t0:.1f} s "
          f"({'plain: extras absent' if plain else 'extras allowed'}; {' '.join(start[:1])})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
