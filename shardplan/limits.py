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


# Files shardplan reads (shardplan/input_files.py). Profiles, Hugging Face config.json files and
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
