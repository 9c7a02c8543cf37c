"""One configuration per call: shardplan's ``evaluate_query`` beside llm-analysis' ``training()``,
timed the same way (best of ``--passes`` passes over ``--configs`` random configurations; each
configuration object is built inside the timed loop).

    python benchmarks/single_query_peers.py                       # shardplan, memory and verdict
    python benchmarks/single_query_peers.py --time                # shardplan, memory, verdict and step time
    /path/to/venv-with-llm-analysis/bin/python benchmarks/single_query_peers.py --llm-analysis

llm-analysis' ``training()`` estimates memory and latency together: ``--time`` is the like-for-like
row beside it.

llm-analysis (pip install llm-analysis) pins its own transformers, so it lives in a venv of its own;
run the two modes alternately on the same machine and compare. Its configurations: OPT-1.3B,
Llama-2-7B and OPT-6.7B on A100-80GB, data-parallel 4 or 8, micro-batch 1/2/4, sequence 1024/4096,
every activation-recomputation mode and ZeRO stage (a configuration it refuses as not fitting
still counts: it has done the estimate by then).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from functools import partial


def best_seconds(call, items, passes: int) -> float:
    for item in items[:5]:
        call(item)  # caches and first-call costs
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for item in items:
            call(item)
        best = min(best, (time.perf_counter() - t0) / len(items))
    return best


def shardplan_items(n: int, with_time: bool = False) -> tuple:
    import numpy as np

    from shardplan.inputs import strategy as st
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model
    from shardplan.planning.evaluate import evaluate_query

    rng = np.random.default_rng(0)
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    models = [get_model(m) for m in ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "mixtral-8x7b")]
    clusters = [parse_gpus(g) for g in ("8xh100-sxm", "4xrtx4090", "16xa100-80gb", "2xa100-80gb")]
    items = []
    for _ in range(n):
        knobs = dict(strategy=pick(("full_shard", "shard_grad_op", "hybrid_shard", "ddp")), engine=pick(("fsdp2", "fsdp1")),
                     method=pick(st.METHODS), ac=pick(("none", "full", "selective")), micro_batch=pick((1, 2, 4)),
                     seq_len=pick((1024, 4096)), stack=pick(st.STACKS))
        items.append((pick(models), pick(clusters), knobs))
    query = partial(evaluate_query, time=True) if with_time else evaluate_query  # the plain call runs on older trees too
    return (lambda item: query(item[0], item[1], TrainingConfig(**item[2]))), items


def llm_analysis_items(n: int) -> tuple:
    import logging

    logging.disable(logging.CRITICAL)
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import ParallelismConfig, get_dtype_config_by_name, get_gpu_config_by_name, get_model_config_by_name

    models = [get_model_config_by_name(m) for m in ("facebook_opt-1.3b", "NousResearch_Llama-2-7b-hf", "facebook_opt-6.7b")]
    gpu, dtype = get_gpu_config_by_name("a100-sxm-80gb"), get_dtype_config_by_name("w16a16e16")
    rng = random.Random(0)
    items = [(rng.choice(models), rng.choice([4, 8]), rng.choice([1, 2, 4]), rng.choice([1024, 4096]),
              rng.choice(list(ActivationRecomputation)), rng.choice(list(DSZeRO))) for _ in range(n)]

    def call(item):
        model, dp, batch, seq, recompute, zero = item
        analysis = LLMAnalysis(model, gpu, dtype, ParallelismConfig(dp_size=dp), flops_efficiency=0.5,
                               hbm_memory_efficiency=0.9)
        try:
            return analysis.training(batch_size_per_gpu=batch, seq_len=seq, activation_recomputation=recompute,
                                     ds_zero=zero, gradient_accumulation_steps=1)
        except AssertionError:  # "does not fit": the estimate is done
            return None

    return call, items


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm-analysis", action="store_true", help="time llm-analysis instead of shardplan")
    ap.add_argument("--configs", type=int, default=200)
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--time", action="store_true", help="shardplan: memory and step time (time=True), as "
                    "llm-analysis' training() always estimates both")
    args = ap.parse_args(argv)
    if args.llm_analysis:
        try:
            call, items = llm_analysis_items(args.configs)
        except ImportError:
            print("llm-analysis is not installed in this interpreter (pip install llm-analysis, in a venv of its own)")
            return 2
        name = "llm-analysis LLMAnalysis(...).training()"
    else:
        call, items = shardplan_items(args.configs, args.time)
        name = f"shardplan evaluate_query(spec, cluster, TrainingConfig(...){', time=True' if args.time else ''})"
    best = best_seconds(call, items, args.passes)
    print(f"{name}: best {best * 1e6:.0f} us per configuration = {1 / best:,.0f} configurations/s "
          f"({args.configs} configurations, best of {args.passes} passes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
