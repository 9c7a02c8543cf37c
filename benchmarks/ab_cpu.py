"""Two source trees, back to back: the CPU time (user + sys, ``os.wait4``'s rusage of each child
process) of the same command run from each, alternating A, B, B, A, ... so that a host's changing
load falls on both. CPU time, not wall time: the development machine is shared, and a process
that waits for a core is not slower for it.

    python benchmarks/ab_cpu.py --before /tmp/tree-a --after . --rounds 5 sweep-summary sweep-memory fit

Commands (each run from its tree's root with that tree first on PYTHONPATH):
``sweep-summary`` / ``sweep-memory`` = ``benchmarks/sweep_speed.py --child full summary|memory``
(the 11.2 M-configuration grid; its JSON line gives the rate by wall time, printed beside);
``fit`` = ``python -m shardplan fit "70B on 4x24GB"`` (a whole CLI process, imports included).
Prints, per command, each tree's median and every run's CPU seconds, and the after/before ratio of
medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

COMMANDS = {
    "sweep-summary": ["benchmarks/sweep_speed.py", "--child", "full", "summary"],
    "sweep-memory": ["benchmarks/sweep_speed.py", "--child", "full", "memory"],
    "fit": ["-m", "shardplan", "fit", "70B on 4x24GB"],
}


def _run(tree: str, argv: list[str]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=tree)
    proc = subprocess.Popen([sys.executable, *argv], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed in {tree}")
    return usage.ru_utime + usage.ru_stime, out


def _rate(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        return ""
    row = json.loads(lines[-1])
    return f" ({row['configs_per_s'] / 1e6:.2f} M/s wall, {row['fits']} fit)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("commands", nargs="+", choices=sorted(COMMANDS))
    args = ap.parse_args()
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    for name in args.commands:
        cpu: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(args.rounds):
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                seconds, out = _run(trees[side], COMMANDS[name])
                cpu[side].append(seconds)
                print(f"{name} {side}: {seconds:.3f} s CPU{_rate(out)}", flush=True)
        med = {side: statistics.median(v) for side, v in cpu.items()}
        print(f"== {name}: before median {med['before']:.3f} s CPU, after {med['after']:.3f} s CPU, "
              f"after/before {med['after'] / med['before']:.3f}  (runs: before {[round(v, 2) for v in cpu['before']]}, "
              f"after {[round(v, 2) for v in cpu['after']]})", flush=True)


if __name__ == "__main__":
    main()
