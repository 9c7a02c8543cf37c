"""Sustained step times on one GPU: what a minutes-long window holds beyond the fastest warm step.

The time model is checked against the campaign's fastest warm step of three (tests/test_step_times_h100.py,
within a few percent), while published tokens/s are averages over minutes of training; the one
calibrated factor of the time model, the window factor (shardplan/validation/window_factor.py), stands
for the difference. This script measures the part of it one GPU can show, with clocks, power,
temperature and throttle reasons sampled all along (gpu_clocks.py):

- ``train``: campaign configurations (gpu_campaign.py's own builders, each in its own process) trained
  for ``duration_s`` seconds from a cool GPU: every step's time, so the window mean, the spread and
  the drift over minutes can be read against the fastest step;
- ``gemm``: one Llama-3-8B MLP product repeated for ``duration_s`` seconds, in bursts timed by CUDA
  events: the sustained matmul rate against the first seconds' (the power cap's share, alone).

    OUT=dir python benchmarks/gpu_sustained.py            # on the GPU machine (~5 minutes)
    python benchmarks/gpu_sustained.py --smoke --out dir  # the same code paths on the CPU, seconds

Results: DIR/sustained.jsonl, one record per measurement, written as each ends; committed under
data/calibration/gpu/ and read by shardplan/calibrate/sustained.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gpu_campaign import _collect, _start, environment, write


def grid(smoke: bool) -> list[dict]:
    """The sustained runs, in the order they run: the 8B FSDP2 configuration of the committed campaign
    (tests/test_step_times_h100.py predicts its fastest step) from a cool GPU, then the matmul alone,
    then the eager Transformers + PEFT LoRA configuration of the committed hf campaign."""
    if smoke:
        fsdp = dict(kind="fsdp", smoke=True, model="smoke", engine="fsdp2", world_size=8, ac="full", micro_batch=1,
                    seq_len=64, method="full", param_dtype="bf16", reduce_dtype="fp32", optimizer="adamw_foreach",
                    steps=3, duration_s=2)
        return [fsdp, dict(kind="gemm", smoke=True, m=64, k=64, n=64, duration_s=1)]
    fsdp = dict(kind="fsdp", smoke=False, model="Llama-3.1-8B", engine="fsdp2", world_size=8, ac="full", micro_batch=1,
                seq_len=4096, method="full", param_dtype="bf16", reduce_dtype="fp32", optimizer="adamw_foreach",
                steps=3, duration_s=150)
    lora = dict(kind="hf", smoke=False, model="Llama-3.1-8B", method="lora", lora_targets="all-linear",
                lora_dropout=0.1, ac="full", micro_batch=1, seq_len=2048, steps=3, duration_s=60)
    return [fsdp, dict(kind="gemm", smoke=False, m=8192, k=4096, n=14336, duration_s=40), lora]


def sustained_gemm(cfg: dict) -> dict:
    """``cfg['m'] x k x n`` bf16 products back to back for ``duration_s`` seconds, in bursts of 20
    between CUDA events (3 rotating operand sets, as the campaign's probes); TFLOP/s per burst."""
    import torch
    from gpu_clocks import ClockSampler

    dev = "cpu" if cfg.get("smoke") or not torch.cuda.is_available() else "cuda"
    m, k, n = cfg["m"], cfg["k"], cfg["n"]
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    ops = [(torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)) for _ in range(3)]
    bursts, iters = [], 20
    with ClockSampler() as clocks:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < cfg["duration_s"]:
            t = time.perf_counter() - t0
            if dev == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for i in range(iters):
                    torch.mm(*ops[i % 3])
                end.record()
                torch.cuda.synchronize()
                s = start.elapsed_time(end) / 1e3 / iters
            else:
                t1 = time.perf_counter()
                for i in range(iters):
                    torch.mm(*ops[i % 3])
                s = (time.perf_counter() - t1) / iters
            bursts.append([round(t, 3), 2 * m * k * n / s / 1e12])
    return {"config": cfg, "status": "ok", "burst_columns": ["t_s", "tflops"], "bursts": bursts,
            "iters_per_burst": iters, **clocks.record(), "env": environment()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: check the code paths")
    ap.add_argument("--gemm", help="internal: one sustained-matmul configuration (JSON), in this process")
    a = ap.parse_args(argv)
    if a.gemm:
        print(json.dumps(sustained_gemm(json.loads(a.gemm))), flush=True)
        return 0
    out = a.out / "sustained.jsonl"
    for cfg in grid(a.smoke):
        if cfg["kind"] == "gemm":  # its own process too: a clean allocator and context, like the others
            import subprocess

            p = subprocess.Popen([sys.executable, __file__, "--gemm", json.dumps(cfg)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        else:
            p = _start(cfg, None)
        t = time.perf_counter()
        rec = _collect(p, cfg, int(cfg["duration_s"]) + 120)
        rec["wall_s"] = time.perf_counter() - t
        write(out, rec)
        times = rec.get("step_times_s") or [b[1] for b in rec.get("bursts", [])]
        print(json.dumps({"kind": cfg["kind"], "status": rec.get("status"), "n": len(times), "wall_s": rec["wall_s"],
                          "first": times[:3], "last": times[-3:], "error": rec.get("error", "")[-300:],
                          "clock_error": rec.get("clock_error")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
