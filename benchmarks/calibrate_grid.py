"""Measure the default tiny grid (fake PG, CPU) plus the same first configurations on 2 real gloo
ranks, and write data/calibration/grid_cpu.jsonl and grid_cpu.csv.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_grid.py
"""

from pathlib import Path

from shardplan.calibrate.config import RunConfig, default_grid
from shardplan.calibrate.launch import run_grid
from shardplan.calibrate.results import flatten, read_jsonl, write_csv_atomic

DIR = Path(__file__).resolve().parents[1] / "data" / "calibration"

if __name__ == "__main__":
    out = DIR / "grid_cpu.jsonl"
    run_grid(default_grid(), out, isolate=False)
    real = [RunConfig(world_size=2, launch="spawn"), RunConfig(world_size=2, param_dtype="bfloat16", ac="full",
                                                              launch="spawn")]
    run_grid(real, DIR / "gloo_2rank_cpu.jsonl", isolate=True, timeout_s=300)
    write_csv_atomic(DIR / "grid_cpu.csv", [flatten(r) for r in read_jsonl(out)])
    write_csv_atomic(DIR / "gloo_2rank_cpu.csv", [flatten(r) for r in read_jsonl(DIR / "gloo_2rank_cpu.jsonl")])
