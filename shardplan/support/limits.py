"""The ranges every value entering shardplan must lie in, and the one check that enforces them.

Why bounds at all: the formulas run in int64/float64 numpy arrays. A sequence of 2**40 tokens or
10**12 layers does not describe a training run, and past int64 it silently wraps to a negative
"fits". Each bound is far above any published run (stated beside it) and low enough that the
products the formulas form stay below ``INT64_SAFE`` or are caught by the overflow check.
Values are checked where they enter (CLI options, query words, environment, files, the Python
API's config objects), once, with one-line errors naming the field, the value and the range.
"""

from __future__ import annotations

import math
import re

from shardplan.support.errors import ShardplanError

INT64_SAFE = 2**62  # results above this are treated as overflow, never as a verdict

MAX_GPUS = 1_000_000            # the largest published clusters are ~10^5 GPUs
MAX_SEQ_LEN = 2**24             # 16.8 M tokens; the longest published contexts are ~10 M (Llama 4 Scout)
MAX_MICRO_BATCH = 2**16
MAX_GRAD_ACCUM = 2**20
MAX_LORA_RANK = 2**16
MAX_CE_CHUNKS = 2**16
MAX_LAYERS = 10_000             # largest published decoders have ~10^2 layers
MAX_HIDDEN = 2**20              # ~10^4 in published models
MAX_VOCAB = 2**24               # ~2.6·10^5 in published models
MAX_HEADS = 2**14
MAX_EXPERTS = 2**16
MAX_PARAMS = 10**15             # 1,000 T parameters; the largest published models are ~10^12
MAX_TOKENS = 10**18             # global batch / training tokens (largest published runs ~4·10^13)
MAX_BYTES = 2**60               # capacities, host RAM, message sizes (1 EiB)
MAX_DIGITS = 24                 # longer digit strings are refused before int() (Python's 4300-digit limit)
MAX_TOP = 10_000                # plans a report lists; the planner's whole search is ~10^3-10^4 candidates
MAX_ITERS = 100_000             # timed / warm-up iterations per size (nccl-tests defaults: 20 / 5)
MAX_PRICE_PER_GPU_HOUR = 1e6    # $ per GPU-hour; cloud list prices are ~$1-$100

# The range of every whole-number value a user states, by the field name errors use. One table:
# TrainingConfig's validators, the CLI options, query words and the sweep's lists all read it, and
# docs/errors.md lists it (tests/test_bad_values.py checks that the two agree).
INT_RANGES: dict[str, tuple[int, int]] = {
    "seq_len": (1, MAX_SEQ_LEN),
    "micro_batch": (1, MAX_MICRO_BATCH),
    "grad_accum": (1, MAX_GRAD_ACCUM),
    "lora_rank": (1, MAX_LORA_RANK),
    "ac_every_k": (1, MAX_LAYERS),          # every k-th of at most MAX_LAYERS blocks
    "shard_group_size": (1, MAX_GPUS),
    "ce_chunks": (0, MAX_CE_CHUNKS),        # 0: chunked cross-entropy off
    "gpu_counts": (1, MAX_GPUS),
    "nodes": (1, MAX_GPUS),
    "global_batch": (1, MAX_TOKENS),        # sequences
    "global_batch_tokens": (1, MAX_TOKENS),
    "train_tokens": (1, MAX_TOKENS),
    "host_ram": (1, MAX_BYTES),
    "top": (1, MAX_TOP),
    # calibrate's options
    "world_size": (1, MAX_GPUS),
    "iters": (1, MAX_ITERS),
    "warmup": (0, MAX_ITERS),
    "threads": (1, 4096),                   # torch.set_num_threads; the largest hosts have ~10^3 cores
}
FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "price_per_gpu_hour": (0.0, MAX_PRICE_PER_GPU_HOUR),
    # calibrate's quality thresholds: a NaN would switch the check off (every comparison is False)
    "min_r2_log": (0.0, 1.0),               # R² of the fit in log space
    "max_rel_err": (0.0, 100.0),            # relative error, a fraction
    "min_saturation": (0.0, 1.0),           # fraction of F_max the largest size must reach
    "peak_tflops": (1e-6, 1e9),             # nameplate TFLOP/s; the largest GPUs are ~10^4 (sparse fp4)
    "timeout": (1e-3, 1e7),                 # seconds per configuration (~4 months)
}

# --- searches and sizes: how much work one command may be asked to do --------------------------
# A divisor search tries at most this many candidates (numpy, ~0.1 s): the divisors of a GPU count
# (<= MAX_GPUS) need sqrt(10^6) = 1,000; micro-batch divisors stop at the largest micro-batch.
MAX_DIVISOR_TRIALS = 10**7
# Rows one `shardplan.sweep` / `shardplan sweep` evaluates unless max_configurations raises it. The
# DataFrame is held in memory: measured 765 B a row with all 114 columns, 136 B with
# columns="summary" (sweep.SWEEP_ROW_BYTES), so the bound is ~7 GiB / ~1.3 GiB (benchmarks/
# sweep_speed.py's 11.2 M-row grid raises it explicitly). Past it the CLI and the API refuse with the count.
MAX_SWEEP_CONFIGURATIONS = 10_000_000
# Cells of a sweep's model table (models x LoRA ranks x targets) or cluster table (GPUs x node
# counts x GPU counts): each cell is resolved in Python before the first row (measured ~12 ms a
# model cell, ~2.5 ms a cluster cell), so 4,096 cells cost at most ~50 s; published grids use < 10^2.
MAX_SWEEP_TABLE_CELLS = 4_096
# Values one sweep axis may list (a list, a range, or the CLI's '1-4096'): the list is built before
# the configuration bound can be checked, so it has a bound of its own.
MAX_AXIS_VALUES = 100_000
# Candidates one `plan` search evaluates in one array (methods x strategies x engines x AC x
# offload x micro-batch x HSDP groups x sync) as one array: measured ~1.9 kB of peak memory a row
# (planner.PLAN_ROW_BYTES), so 10^6 rows is ~1.8 GiB and ~25 s. 8 GPUs plan 594 candidates
# (21,546 with 720 sequences per GPU); 720,720 GPUs with 720 sequences per GPU 506,331.
MAX_PLAN_CONFIGURATIONS = 1_000_000
# Message sizes `calibrate collectives` measures: the ladder min, min*factor, ... up to max has at
# most this many rungs (nccl-tests' default 8 B..128 MiB x2 is 25), and no buffer above MAX_BYTES.
MAX_SIZE_LADDER = 64
# Points one collective fit takes (one op, world size and tier): its breakpoint search is exhaustive,
# O(points^2) line fits for three segments (measured 0.5 s at 64 points, 2.4 s at 128, 8.7 s at
# 256). A ladder has at most MAX_SIZE_LADDER sizes, nccl-tests' default 25: 128 is two ladders.
MAX_FIT_POINTS = 128
# Local ranks `calibrate collectives` / `calibrate fsdp --launch spawn` start on a machine without
# CUDA (gloo on the CPU): each is a Python process importing torch (measured 218 MiB RSS before any
# buffer), so 64 ranks hold ~14 GiB; on CUDA machines the visible GPU count bounds them instead.
MAX_LOCAL_CPU_RANKS = 64
# Square matmul sizes m of `calibrate compute` (default ladder up to 16,384 on GPUs): three m x m
# operands of 2^17 are 96 GiB in bf16, beyond any one GPU, and GEMM efficiency is flat far below.
MAX_MATMUL_SIZE = 2**17

_INTEGER_TEXT = re.compile(r"^\s*[+]?\d+\s*$")


def approx_bytes(n: float) -> str:
    """A memory estimate for a refusal message: '3.9 GiB', or '12 MiB' below one GiB."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _shown(value: object) -> object:
    if isinstance(value, int) and value.bit_length() > 128:  # repr() itself fails past 4300 digits
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits>"
    text = repr(value)
    return value if len(text) <= 40 else f"{text[:20]}…{text[-8:]} ({len(text)} chars)"


def bounded_int(value: object, field: str, lo: int, hi: int) -> int:
    """``value`` (int, integral float, or digit string) as an int in [lo, hi], or a one-line error."""
    if isinstance(value, bool):
        raise ShardplanError(field, value, f"expected a whole number in [{lo:,}, {hi:,}]")
    if isinstance(value, str):
        if not _INTEGER_TEXT.match(value) or len(value.strip().lstrip("+").lstrip("0")) > MAX_DIGITS:
            raise ShardplanError(field, _shown(value), f"expected a whole number in [{lo:,}, {hi:,}]")
        number = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ShardplanError(field, _shown(value), f"expected a whole number in [{lo:,}, {hi:,}]")
        number = int(value)
    elif isinstance(value, int):
        number = value
    else:
        try:  # numpy integers
            number = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError, OverflowError):
            raise ShardplanError(field, _shown(value), f"expected a whole number in [{lo:,}, {hi:,}]") from None
    if not lo <= number <= hi:
        raise ShardplanError(field, _shown(value), f"out of range [{lo:,}, {hi:,}]")
    return number


def bounded_float(value: object, field: str, lo: float, hi: float) -> float:
    """A finite float in [lo, hi] (NaN and ±inf refused), or a one-line error."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ShardplanError(field, _shown(value), f"expected a number in [{lo:g}, {hi:g}]") from None
    if isinstance(value, bool) or not math.isfinite(number) or not lo <= number <= hi:
        raise ShardplanError(field, _shown(value), f"expected a finite number in [{lo:g}, {hi:g}]")
    return number


def checked_int(field: str, value: object) -> int:
    """``value`` checked against ``INT_RANGES[field]`` (the one table), or a one-line error."""
    lo, hi = INT_RANGES[field]
    if type(value) is int and lo <= value <= hi:  # the common case, as bounded_int would take it
        return value
    return bounded_int(value, field, lo, hi)


def checked_float(field: str, value: object) -> float:
    """``value`` checked against ``FLOAT_RANGES[field]``, or a one-line error."""
    lo, hi = FLOAT_RANGES[field]
    return bounded_float(value, field, lo, hi)
# Files shardplan reads (shardplan/support/input_files.py). Profiles, Hugging Face config.json files and
# overlays are kilobytes (the built-in ones are < 20 KiB; a config.json with a large id2label table
# stays well under 1 MiB); a plan file from `plan --json` holds `--top` plans of ~10 KiB; a
# calibration results JSONL ~5 KiB per measured configuration; an nccl-tests log ~100 B per size.
# Each cap is >= 16x the largest such file, and a file past it is refused before it is read.
MAX_PROFILE_FILE_BYTES = 16 * 2**20    # profiles, config.json, overlays, accuracy bands, run configs
MAX_PLAN_FILE_BYTES = 64 * 2**20       # export's plan files (and stdin)
MAX_RECORDS_FILE_BYTES = 256 * 2**20   # calibration results JSONL, samples, nccl-tests logs (~5·10^4 records)
MAX_JSON_DEPTH = 64                    # nesting levels; shardplan's own files nest <= 6, config.json <= 4
MAX_FILE_NAME_BYTES = 255              # NAME_MAX of Linux and macOS file systems, per path component
MAX_PATH_BYTES = 4096                  # PATH_MAX on Linux

# Fitted calibration coefficients (calibrate/overlay.py). A fit outside these is a degenerate fit
# (two sizes that time the same give B -> 1e30 B/s), refused before it is written or used.
MAX_LINK_BYTES_PER_S = 1e14    # 100 TB/s; the fastest GPU link (NVLink 5) is 0.9 TB/s per direction
MAX_MEMORY_BYTES_PER_S = 1e14  # 100 TB/s; the fastest HBM (B200 HBM3e) is 8 TB/s
MAX_FLOPS_PER_S = 1e18         # 1 EFLOP/s per device; the fastest (B200 FP4 dense) is ~1e16
MAX_LATENCY_S = 10.0           # α of one collective call; measured α are 1e-6 .. 1e-3 s
MAX_POSITIONS = 2**31          # max_position_embeddings / sliding_window in config.json: int32 positions
                               # (published contexts reach ~10^7; a config may state a larger class default)
# `profiles validate FOLDER` walks at most this many entries (a profile folder holds tens of files;
# `profiles validate /` would otherwise walk the whole file system)
MAX_VALIDATE_ENTRIES = 100_000
