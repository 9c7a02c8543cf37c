"""Predicted tokens/s/GPU vs published FSDP runs (tests/data/published_runs.csv, each row cites
its source, table and row).

Tolerance: the predictions use nameplate coefficients only (GPU peak × measured MAMF GEMM
efficiency, FlashAttention papers' attention efficiency, link profiles, op-by-op byte counts of
the eager element-wise kernels and FSDP's copies, NCCL's CTA share of the SMs) — nothing is
fitted to these runs. After those mechanisms the 12 runs sit at +7 … +32 % (median +12 %, see
docs/throughput.md); before them +15 … +64 %. What the model still does not see, each making real
runs slower, so the model stays an upper bound: power-capped clocks (the H100 run is at 500 W of
700 W: its +32 % is the largest error), the IBM A100 cluster's network and FSDP1 bf16 reduction
(not published / not a knob: the fms-fsdp 13B row, +31 %), GEMM shape effects (wave quantization)
below MAMF's best shapes, kernel-launch and Python overheads. Asserted: the sign (prediction ≥
0.95 × published), every run within ``TOLERANCE`` = 35 % (the largest error, rounded up — a
regression that pushes any run past it fails), and the median |error| within
``MEDIAN_TOLERANCE`` = 15 % (the typical run, +12 % now). Errors are printed with ``pytest -s``.
"""

import csv
from pathlib import Path

import pytest

from shardplan.comm import link_rates
from shardplan.config import TrainingConfig, columns_for
from shardplan.hardware import parse_gpus
from shardplan.models import resolve_model
from shardplan.throughput import compute_rates, step_time

DATA = Path(__file__).parent / "data" / "published_runs.csv"
ROWS = list(csv.DictReader(DATA.open()))
TOLERANCE = 0.35
MEDIAN_TOLERANCE = 0.15


def predict(row: dict) -> float:
    spec = resolve_model(row["model"]).spec
    cluster = parse_gpus(row["gpus"])
    if row["gpu_memory_bandwidth_bytes_per_s"]:
        gpu = cluster.gpu.model_copy(update={"memory_bandwidth_bytes_per_s": float(row["gpu_memory_bandwidth_bytes_per_s"])})
        cluster = cluster.model_copy(update={"gpu": gpu})
    config = TrainingConfig(strategy=row["strategy"], engine=row["engine"], ac=row["ac"], ac_every_k=int(row["ac_every_k"]),
                            micro_batch=int(row["micro_batch"]), seq_len=int(row["seq_len"]))
    c = columns_for(spec, cluster, config)
    return float(step_time(c, link_rates(cluster), compute_rates(cluster))["tokens_per_s_per_gpu"])


def test_dataset_covers_requirements():
    gpus = {parse_gpus(r["gpus"]).gpu.name for r in ROWS}
    assert len(ROWS) >= 5 and len(gpus) >= 2
    assert any(parse_gpus(r["gpus"]).nodes > 1 for r in ROWS)
    assert all(r["source"].startswith("https://") and r["where"] for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_published_run(row):
    published = float(row["published_tokens_per_s_per_gpu"])
    predicted = predict(row)
    error = predicted / published - 1
    print(f"\n{row['id']}: predicted {predicted:,.0f} vs published {published:,.0f} tok/s/GPU: {error:+.1%}")
    assert predicted >= 0.95 * published
    assert abs(error) <= TOLERANCE


def test_median_error():
    errors = sorted(abs(predict(r) / float(r["published_tokens_per_s_per_gpu"]) - 1) for r in ROWS)
    median = errors[len(errors) // 2] if len(errors) % 2 else (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2
    print(f"\nmedian |error| {median:.1%} over {len(errors)} runs, max {errors[-1]:.1%}")
    assert median <= MEDIAN_TOLERANCE
