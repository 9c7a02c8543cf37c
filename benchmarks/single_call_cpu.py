"""One configuration per call, CPU seconds per call (``time.process_time``: on a shared machine CPU
time moves less than wall time, printed beside it), and many configurations in one call.

    python benchmarks/single_call_cpu.py

200 random configurations (three models, three clusters, method / AC / micro-batch / sequence
length drawn), each entry point timed over three passes, the best pass reported. Imports by module
path, not the top-level names, so that it runs on older trees too (put the tree first on
``PYTHONPATH``).
"""

from __future__ import annotations

import time

import numpy as np

from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import get_model
from shardplan.planning.evaluate import evaluate_queries, evaluate_query
from shardplan.planning.fit import evaluate, evaluate_many


def random_queries(n: int, rng) -> list[tuple]:
    specs = [get_model(m) for m in ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b")]
    clusters = [parse_gpus(g) for g in ("8xh100-sxm", "4xrtx4090", "16xa100-80gb")]
    return [(specs[rng.integers(3)], clusters[rng.integers(3)],
             TrainingConfig(method=("full", "lora", "qlora")[rng.integers(3)], ac=("none", "full")[rng.integers(2)],
                            micro_batch=int(rng.integers(1, 5)), seq_len=int((1024, 4096)[rng.integers(2)])))
            for _ in range(n)]


def per_call(label: str, call, queries: list[tuple], passes: int = 3) -> None:
    cpu, wall = [], []
    for _ in range(passes):
        t, w = time.process_time(), time.perf_counter()
        for q in queries:
            call(q)
        cpu.append((time.process_time() - t) / len(queries))
        wall.append((time.perf_counter() - w) / len(queries))
    print(f"{label}: {min(cpu) * 1e3:.2f} ms CPU per call (best of {passes} passes over {len(queries)}), "
          f"{min(wall) * 1e3:.2f} ms wall")


def in_one_call(label: str, call, n: int) -> None:
    t, w = time.process_time(), time.perf_counter()
    call()
    print(f"{label}: {n / (time.process_time() - t):,.0f}/s CPU, {n / (time.perf_counter() - w):,.0f}/s wall")


def main() -> None:
    rng = np.random.default_rng(0)
    queries = random_queries(200, rng)
    for q in queries[:5]:  # per-model and per-cluster values, first-call costs: out of the timing
        evaluate_query(*q)
        evaluate(*q)
    per_call("evaluate_query", lambda q: evaluate_query(*q), queries)
    per_call("evaluate_query(time=True)", lambda q: evaluate_query(*q, time=True), queries)
    per_call("fit.evaluate (FitResult)", lambda q: evaluate(*q), queries)
    big = random_queries(5000, rng)
    in_one_call("evaluate_queries, 5,000 in one call", lambda: evaluate_queries(big), len(big))
    spec = big[0][0]
    one_model = [(cluster, config, None) for _, cluster, config in big[:2000]]
    in_one_call("evaluate_many, 2,000 of one model in one call", lambda: evaluate_many(spec, one_model), len(one_model))
    print("load", " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
