"""Measure FSDP1's gradient moments: a tiny Llama with wide blocks and a 4-token sequence, so that
the end of each block's backward (the flat gradient concatenated from its views' gradients, then
the post-backward hook's upcast and reduce-scatter buffers) is the backward peak rather than the
activations. Fake process group, CPU, StorageTracker (real storage sizes). Writes
data/calibration/fsdp1_grad_moments_cpu.jsonl (resumes: configurations already there are kept).

    OMP_NUM_THREADS=1 python benchmarks/calibrate_fsdp1_grad_moments.py
"""

from pathlib import Path

from shardplan.calibrate.config import RunConfig
from shardplan.calibrate.launch import run_grid

OUT = Path(__file__).resolve().parents[1] / "data" / "calibration" / "fsdp1_grad_moments_cpu.jsonl"
# P = 983,552 per block: divisible by 4 (no padding), not by 3 (F.pad copy of the gradient)
TINY = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 1024,
        "vocab_size": 256}


def configs() -> list[RunConfig]:
    runs = [("full_shard", "bfloat16", 4), ("full_shard", "float32", 4), ("shard_grad_op", "bfloat16", 4),
            ("full_shard", "bfloat16", 3), ("no_shard", "bfloat16", 4), ("hybrid_shard", "bfloat16", 4)]
    return [RunConfig(engine="fsdp1", strategy=strategy, param_dtype=dtype, reduce_dtype="float32", world_size=world,
                      ac="full", micro_batch=1, seq_len=4, tiny=TINY, shard_size=2 if strategy == "hybrid_shard" else None)
            for strategy, dtype, world in runs]


if __name__ == "__main__":
    run_grid(configs(), OUT, isolate=False)
