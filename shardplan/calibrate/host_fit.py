"""The per-operation host cost of an eager step (``eager_host.HOST_OP_S``), fitted on the train split
of the GPU runs (``gpu_split.TRAIN_NAME``) only, never on the held-out third.

    python -m shardplan.calibrate.host_fit      # prints the fitted cost and the train split's errors

Each run's compute-only step (the fake process group sends nothing) is predicted phase by phase as
max(host operations × cost, GPU seconds) for forward and backward and for the optimizer
(``eager_host``, ``throughput.compute_only_phases_s``); the cost is the grid value (0.5 µs steps,
1 to 100 µs) with the smallest median |log(predicted / measured)| over the single-GPU Trainer runs
(``counted``). The measured step is the median
after the first, as the held-out report takes it.
"""

from __future__ import annotations

import statistics
import sys

import numpy as np

GRID_S = np.arange(1.0, 100.0, 0.5) * 1e-6


def phases(rec: dict) -> tuple[np.ndarray, np.ndarray]:
    """(host operations, GPU seconds) per phase (forward, backward, optimizer) of one run's step."""
    from shardplan.calibrate.gpu_heldout import user_columns
    from shardplan.formulas import eager_host as eh
    from shardplan.formulas import throughput as tp
    from shardplan.inputs.hardware import parse_gpus

    c = user_columns(rec["config"])
    rates = tp.compute_rates(parse_gpus(f"{rec['config'].get('world_size', 1)}xh100-sxm"))
    f, b = tp.compute_only_phases_s(c, rates)
    ops = np.array([float(x) for x in eh.step_operations(c)]) * float(np.asarray(c.stack) == eh.st.HF)
    return ops, np.array([float(f), float(b), float(tp.optimizer_step_s(c, rates))])


def predicted_step_s(ops: np.ndarray, gpu_s: np.ndarray, cost_s: float) -> float:
    return float(np.maximum(ops * cost_s, gpu_s).sum())


def measured_step_s(rec: dict) -> float:
    return statistics.median(rec["step_times_s"][1:])


def counted(rec: dict) -> bool:
    """A run whose host operations the count covers: a single-GPU Trainer / SFTTrainer run (FSDP's
    own hooks, all-gather copies and resharding launches are not counted; torchtitan's loop runs
    other modules); profiled runs left out (one of their steps runs under torch's profiler)."""
    cfg = rec["config"]
    return rec.get("status") == "ok" and cfg["script"] != "titan" and not cfg.get("fsdp") and not cfg.get("profile")


def fit(records: list[dict]) -> float:
    """The cost minimising the median |log error| over the ``counted`` runs of ``records``."""
    rows = [(phases(r), measured_step_s(r)) for r in records if counted(r)]

    def loss(cost):
        return statistics.median(abs(np.log(predicted_step_s(*p, cost) / m)) for p, m in rows)
    return float(min(GRID_S, key=loss))


def train_records() -> list[dict]:
    from shardplan.calibrate import gpu_split

    return gpu_split.read(gpu_split.FOLDER / gpu_split.TRAIN_NAME)


def main() -> int:
    records = train_records()
    cost = fit(records)
    print(f"host cost per operation: {cost * 1e6:.1f} µs (train split, {len(records)} runs)")
    for r in records:
        ops, gpu = phases(r)
        print(f"{r['config']['script']:7} {r['config']['method']:5} ac={r['config']['ac']:5} "
              f"tokens={r['config']['micro_batch'] * r['config']['seq_len']:6} measured {measured_step_s(r):.3f} s "
              f"predicted {predicted_step_s(ops, gpu, cost):.3f} s (GPU only {gpu.sum():.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
