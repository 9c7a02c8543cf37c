"""Predicted tokens/s/GPU vs published FSDP runs (tests/data/published_runs.csv, each row cites
its source, table and row, and names in ``unmodelled`` what the source states that the model does
not see).

Tolerance: the predictions use nameplate coefficients only (GPU peak × measured MAMF GEMM
efficiency, FlashAttention papers' attention efficiency, link profiles, op-by-op byte counts of
the eager element-wise kernels and FSDP's copies, NCCL's CTA share of the SMs) and each run's own
reduce dtype (fms-fsdp reduces in bf16, torchtitan in fp32) — nothing is fitted to these runs.
The 13 runs sit at +7.8 … +40.2 % (median +12.0 %, every error listed in docs/throughput.md).
Three tiers are asserted, each from what the errors are made of:

* every run: the sign (prediction ≥ 0.95 × published — everything not modelled makes real runs
  slower, so the model is an upper bound) and |error| ≤ ``TOLERANCE`` = 45 % (the largest error,
  fms-fsdp 13B at +40.2 %, rounded up: a regression past it fails);
* runs whose source states everything the model needs (``unmodelled`` empty: the 8 torchtitan
  A100 runs — nameplate clocks, stated network, eager kernels) within ``SPECIFIED_TOLERANCE`` =
  20 % (now +9.0 … +16.5 %). Those with a stated gap: the H100 runs at a 500 W power cap (+32 %,
  +36 %; torchtitan's own footnote puts the real peak "between SXM and NVL": at NVL's 835 TFLOPS
  they would read +17 %, +21 %) and the fms-fsdp runs on IBM's cluster, whose network the source
  does not give (8 × HDR assumed; the bf16 reduce it really uses made them faster, not slower);
* the median |error| within ``MEDIAN_TOLERANCE`` = 15 % (the typical run, +12.0 % now).

Errors are printed with ``pytest -s``.
"""

import csv
from pathlib import Path

import pytest

from shardplan.formulas.columns import columns_for
from shardplan.formulas.comm import link_rates
from shardplan.formulas.throughput import compute_rates, step_time
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model

DATA = Path(__file__).parent / "data" / "published_runs.csv"
ROWS = list(csv.DictReader(DATA.open()))
TOLERANCE = 0.45
SPECIFIED_TOLERANCE = 0.20
MEDIAN_TOLERANCE = 0.15


def predict(row: dict) -> float:
    spec = resolve_model(row["model"]).spec
    cluster = parse_gpus(row["gpus"])
    if row["gpu_memory_bandwidth_bytes_per_s"]:
        gpu = cluster.gpu.model_copy(update={"memory_bandwidth_bytes_per_s": float(row["gpu_memory_bandwidth_bytes_per_s"])})
        cluster = cluster.model_copy(update={"gpu": gpu})
    config = TrainingConfig(strategy=row["strategy"], engine=row["engine"], ac=row["ac"], ac_every_k=int(row["ac_every_k"]),
                            micro_batch=int(row["micro_batch"]), seq_len=int(row["seq_len"]),
                            reduce_dtype=row["reduce_dtype"] or None)
    c = columns_for(spec, cluster, config)
    return float(step_time(c, link_rates(cluster), compute_rates(cluster))["tokens_per_s_per_gpu"])


def test_dataset_covers_requirements():
    gpus = {parse_gpus(r["gpus"]).gpu.name for r in ROWS}
    assert len(ROWS) >= 5 and len(gpus) >= 2
    assert any(parse_gpus(r["gpus"]).nodes > 1 for r in ROWS)
    assert any(parse_gpus(r["gpus"]).nodes > 1 and parse_gpus(r["gpus"]).gpu.name == "h100-sxm" for r in ROWS)
    assert all(r["source"].startswith("https://") and r["where"] for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_published_run(row):
    published = float(row["published_tokens_per_s_per_gpu"])
    predicted = predict(row)
    error = predicted / published - 1
    print(f"\n{row['id']}: predicted {predicted:,.0f} vs published {published:,.0f} tok/s/GPU: {error:+.1%}")
    assert predicted >= 0.95 * published
    assert abs(error) <= TOLERANCE
    if not row["unmodelled"]:
        assert abs(error) <= SPECIFIED_TOLERANCE


def test_median_error():
    errors = sorted(abs(predict(r) / float(r["published_tokens_per_s_per_gpu"]) - 1) for r in ROWS)
    median = errors[len(errors) // 2] if len(errors) % 2 else (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2
    print(f"\nmedian |error| {median:.1%} over {len(errors)} runs, max {errors[-1]:.1%}")
    assert median <= MEDIAN_TOLERANCE
