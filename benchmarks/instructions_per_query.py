"""Machine instructions per single-configuration query: a measure of the one-at-a-time path's work
that does not depend on how busy the machine is (timings on a shared host move by 1.5x; this count
moves by ~3 % between processes: address layout changes how identity-keyed caches hash).

    python benchmarks/instructions_per_query.py            # evaluate_query, memory and verdict
    python benchmarks/instructions_per_query.py --time     # evaluate_query(..., time=True)

Runs ``single_query_peers.py``'s configurations under valgrind's callgrind twice, with 0 and with
``--passes`` timed passes after the same warm-up (set-up and first-call costs are in both), and
prints (difference) / (passes × configurations). Needs valgrind on the PATH
(``apt-get install valgrind``); takes about a minute. ``PYTHONHASHSEED`` is fixed so both runs hash
strings alike. To compare with another tree, run this script with that tree first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _child(configs: int, passes: int, with_time: bool) -> int:
    """``single_query_peers``' calls: two untimed passes (the warm-up), then ``passes`` more."""
    sys.path.insert(0, str(HERE))
    from single_query_peers import shardplan_items

    call, items = shardplan_items(configs, with_time)
    for _ in range(2 + passes):
        for item in items:
            call(item)
    return 0


def _collected(configs: int, passes: int, with_time: bool) -> int:
    """Instructions valgrind collected for one child run."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
               "--child", str(configs), str(passes)] + (["--time"] if with_time else [])
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if not found:
        raise SystemExit(f"valgrind printed no instruction count: {out.stderr[-300:]}")
    return int(found.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--time", action="store_true", help="evaluate_query(..., time=True)")
    ap.add_argument("--child", nargs=2, type=int, metavar=("CONFIGS", "PASSES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child[0], args.child[1], args.time)
    if shutil.which("valgrind") is None:
        print("instructions_per_query: needs valgrind on the PATH (apt-get install valgrind)")
        return 2
    base = _collected(args.configs, 0, args.time)
    more = _collected(args.configs, args.passes, args.time)
    per_query = (more - base) / (args.passes * args.configs)
    what = "evaluate_query(..., time=True)" if args.time else "evaluate_query"
    print(f"{what}: {per_query:,.0f} instructions per query ({args.passes} passes x {args.configs} configurations, "
          f"valgrind callgrind, net of set-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
