"""Llama-2-7B shape under FakeTensorMode + fake process group at world sizes 8 and 64 (FSDP2,
bf16 params / fp32 reduce, AdamW, micro-batch 1, seq 4096, AC none and full). No real memory is
allocated; the tracker's phase peaks are the measurement. Output: data/calibration/fake_7b.jsonl

    OMP_NUM_THREADS=1 python benchmarks/calibrate_fake_7b.py
"""

import sys
from pathlib import Path

from shardplan.calibrate.config import RunConfig
from shardplan.calibrate.launch import run_grid

OUT = Path(__file__).resolve().parents[1] / "data" / "calibration" / "fake_7b.jsonl"

configs = [RunConfig(model="llama-2-7b", tiny={}, world_size=w, param_dtype="bfloat16", reduce_dtype="float32",
                     ac=ac, micro_batch=1, seq_len=4096, fake_tensors=True, steps=2)
           for w in (8, 64) for ac in ("none", "full")]

if __name__ == "__main__":
    run_grid(configs, sys.argv[1] if len(sys.argv) > 1 else OUT, isolate=True, timeout_s=900)
