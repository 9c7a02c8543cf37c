"""How long does one question take? ``shardplan fit "70B on 4x24GB"`` as a whole process, and the
shared evaluator on single configurations.

    python benchmarks/query_latency.py              # 10 process runs, 200 single queries, 20,000 batched
    python benchmarks/query_latency.py --runs 5 --json out.json

Process: ``python -m shardplan fit QUERY`` run ``--runs`` times (output discarded); min and median
wall time, interpreter start-up and imports included. Beside it, the dependency floor: a process
that only imports what fit's output needs (``python -c "import numpy, pydantic, typer, tabulate"``),
and the same defining one pydantic model, run alternately with it so all see the same machine load;
the difference is shardplan's own share (its imports and the work fit does). Python writes no bytecode cache when
PYTHONDONTWRITEBYTECODE is set (then every run compiles shardplan from source, as a first run
after an edit does); ``--bytecode`` (default on) runs it with the cache as an installed package has it.
Evaluator: one configuration per call through ``planning.evaluate.evaluate_query`` (a one-row
batch, answered in Python numbers), ``planning.evaluate.evaluate_queries`` (a one-row batch,
arrays) and ``planning.fit.evaluate`` (the record fit prints), then ``--batch`` configurations in
one call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # both parts time this checkout's shardplan
sys.path.insert(0, str(ROOT))
QUERY = "70B on 4x24GB"

# The dependency floor: what fit's output needs imported, and nothing of shardplan's. The second
# floor also defines one pydantic model, as any code with a pydantic model pays for it on first use
# (pydantic.main, its field types, its plugin entry points): the part of fit's share that is pydantic's.
FLOOR = "import numpy, pydantic, typer, tabulate"
FLOOR_MODEL = FLOOR + "\nfrom pydantic import BaseModel\nclass One(BaseModel):\n    x: int"


def process_times(query: str, runs: int, bytecode: bool) -> dict[str, list[float]]:
    """Wall seconds of ``runs`` whole ``shardplan fit`` processes and of as many of each floor's,
    alternately (so that all see the same machine load), by name: fit, floor, floor_model."""
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    commands = {"fit": [sys.executable, "-m", "shardplan", "fit", query], "floor": [sys.executable, "-c", FLOOR],
                "floor_model": [sys.executable, "-c", FLOOR_MODEL]}
    for command in commands.values():  # warm the file cache (and bytecode)
        subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            t0 = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT)
            times[name].append(time.perf_counter() - t0)
    return times


def _spread(times: list[float]) -> str:
    return f"min {min(times):.3f} s, median {statistics.median(times):.3f} s"


def print_process_times(query: str, times: dict[str, list[float]], bytecode: bool) -> None:
    """The fit process beside the floors, and shardplan's own share (median of the run-by-run differences)."""
    fit, floor, model = times["fit"], times["floor"], times["floor_model"]
    print(f"process  shardplan fit {query!r}: {_spread(fit)} over {len(fit)} runs "
          f"({'with' if bytecode else 'as set for'} the bytecode cache)", flush=True)
    print(f"floor    python -c {FLOOR!r}: {_spread(floor)} (alternating with fit's runs)", flush=True)
    print(f"floor    the same + one pydantic model: {_spread(model)}", flush=True)
    own = statistics.median(t - f for t, f in zip(fit, floor))
    beyond = statistics.median(t - f for t, f in zip(fit, model))
    print(f"shardplan's own share: median {own:.3f} s over the floor, {beyond:.3f} s over the floor with a "
          "pydantic model", flush=True)


def evaluator_times(single: int, batch: int) -> dict:
    """Seconds per single-configuration call (two entry points) and configurations/s batched."""
    import numpy as np

    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model
    from shardplan.planning.evaluate import evaluate_queries, evaluate_query
    from shardplan.planning.fit import evaluate

    rng = np.random.default_rng(0)
    specs = [get_model(m) for m in ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b")]
    clusters = [parse_gpus(g) for g in ("8xh100-sxm", "4xrtx4090", "16xa100-80gb")]
    def one():
        return (specs[rng.integers(3)], clusters[rng.integers(3)],
                TrainingConfig(method=("full", "lora", "qlora")[rng.integers(3)], ac=("none", "full")[rng.integers(2)],
                               micro_batch=int(rng.integers(1, 5)), seq_len=int((1024, 4096)[rng.integers(2)])))
    evaluate_queries([one()]), evaluate(*one()), evaluate(*one())  # caches and first-call costs out of the timing
    queries = [one() for _ in range(single)]
    t0 = time.perf_counter()
    for q in queries:
        evaluate_queries([q])
    per_query = (time.perf_counter() - t0) / single
    t0 = time.perf_counter()
    for q in queries:
        evaluate_query(*q)
    per_scalar = (time.perf_counter() - t0) / single
    t0 = time.perf_counter()
    for q in queries:
        evaluate(*q)
    per_fit = (time.perf_counter() - t0) / single
    t0 = time.perf_counter()
    evaluate_queries([one() for _ in range(batch)])
    batched = batch / (time.perf_counter() - t0)
    return {"single_query_s": per_query, "single_scalar_s": per_scalar, "single_fit_evaluate_s": per_fit, "batched_configs_per_s": batched,
            "batch": batch}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--query", default=QUERY)
    ap.add_argument("--runs", type=int, default=10, help="whole-process runs")
    ap.add_argument("--no-bytecode", dest="bytecode", action="store_false",
                    help="keep PYTHONDONTWRITEBYTECODE as set (compile from source each run when it is)")
    ap.add_argument("--single", type=int, default=200, help="single-configuration calls")
    ap.add_argument("--batch", type=int, default=20000, help="configurations in the batched call")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    times = process_times(args.query, args.runs, args.bytecode)
    print_process_times(args.query, times, args.bytecode)
    e = evaluator_times(args.single, args.batch)
    print(f"evaluate one configuration per call: {e['single_scalar_s'] * 1e3:.3f} ms (evaluate_query: "
          f"{1 / e['single_scalar_s']:,.0f}/s), {e['single_query_s'] * 1e3:.2f} ms (evaluate_queries, a one-row batch), "
          f"{e['single_fit_evaluate_s'] * 1e3:.2f} ms (fit.evaluate, with its record)", flush=True)
    print(f"evaluate {e['batch']:,} configurations in one call: {e['batched_configs_per_s']:,.0f} configurations/s",
          flush=True)
    if args.json:
        from shardplan.support.atomic_write import write_text_atomic

        write_text_atomic(args.json, json.dumps({"process_s": times["fit"], "floor_s": times["floor"],
                                                  "floor_model_s": times["floor_model"], "bytecode": args.bytecode, **e},
                                                 indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
