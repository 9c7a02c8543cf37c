"""Compute-only step times measured on one H100 (``data/calibration/gpu/fsdp.jsonl``: HF Llama
under FSDP2 / FSDP1 on the fake process group — real CUDA kernels, no communication) against the
model's compute + optimizer time (``throughput.step_time``: ``compute_s`` + ``optimizer_s``).

Nothing in the time model was fitted on these step times, so every error below is out of sample.
Tolerance: median |error| ≤ 5 % and 90th percentile ≤ 12 % over the 15 full-parameter runs
(3.8 % and 10.2 % when committed: W = 4-64, AC none/full, 8B and 70B, seq 4096-8192, foreach and
fused AdamW). LoRA and the single-GPU Hugging Face runs are listed, not asserted: their eager
per-module overheads are not modelled (docs/accuracy.md, "Time"). The measured step is the fastest
after the first, or the steady step of a 15-step re-run of the configuration where one exists
(``data/calibration/gpu/sustained/``: LoRA with non-reentrant checkpointing settles only at step 7).
"""

from pathlib import Path

import numpy as np
import pytest

from shardplan.calibrate.gpu_compare import compute_step_s, load_records
from shardplan.calibrate.sustained import campaign_step_s
from shardplan.formulas import throughput as tp

GPU_DIR = Path(__file__).resolve().parents[1] / "data" / "calibration" / "gpu"
RECORDS = [r for r in load_records(GPU_DIR) if r.get("status") == "ok" and r.get("step_times_s")]
FSDP_FULL = [r for r in RECORDS if r["config"]["kind"] == "fsdp" and r["config"]["method"] == "full"]
MEDIAN_TOLERANCE = 0.05
P90_TOLERANCE = 0.12


def predicted_s(record) -> float:
    return compute_step_s(record)


def errors(records) -> np.ndarray:
    # steady state: the fastest step after the first (which pays allocation and autotuning), or the
    # 15-step re-run's steady step where one exists (calibrate/sustained.campaign_step_s)
    return np.array([predicted_s(r) / campaign_step_s(r) - 1 for r in records])


def test_fsdp_full_step_times_within_out_of_sample_tolerance():
    e = np.abs(errors(FSDP_FULL))
    print(f"\n{len(e)} runs: median |error| {np.median(e):.1%}, p90 {np.quantile(e, 0.9):.1%}")
    assert len(e) >= 12
    assert np.median(e) <= MEDIAN_TOLERANCE
    assert np.quantile(e, 0.9) <= P90_TOLERANCE


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_hbm_efficiency_mis_set_twofold_fails(monkeypatch, factor):
    monkeypatch.setattr(tp, "HBM_EFFICIENCY", tp.HBM_EFFICIENCY * factor)
    e = np.abs(errors(FSDP_FULL))
    assert np.median(e) > MEDIAN_TOLERANCE or np.quantile(e, 0.9) > P90_TOLERANCE


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_gemm_efficiency_mis_set_twofold_fails(monkeypatch, factor):
    real = tp.gemm_efficiency
    monkeypatch.setattr(tp, "gemm_efficiency", lambda c, rates: real(c, rates) * factor)
    assert np.median(np.abs(errors(FSDP_FULL))) > MEDIAN_TOLERANCE


def test_single_gpu_hf_lora_is_slower_than_modelled():
    """The documented gap: eager PEFT LoRA on one GPU runs slower than the model (ratio < 1)."""
    lora = [r for r in RECORDS if r["config"]["kind"] == "hf" and r["config"]["method"] == "lora"]
    assert len(lora) >= 5 and np.median(errors(lora)) < 0
