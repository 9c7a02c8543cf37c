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

from shardplan.errors import ShardplanError

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
MAX_LIST_VALUES = 100_000       # values one sweep list or 'lo-hi' range expands to (before the product is formed)
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

_INTEGER_TEXT = re.compile(r"^\s*[+]?\d+\s*$")


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
    return bounded_int(value, field, lo, hi)


def checked_float(field: str, value: object) -> float:
    """``value`` checked against ``FLOAT_RANGES[field]``, or a one-line error."""
    lo, hi = FLOAT_RANGES[field]
    return bounded_float(value, field, lo, hi)
