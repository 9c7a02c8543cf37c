"""int64 overflow: a result that cannot be a byte count or a time is an error, never a verdict.

The formulas run in int64 numpy arrays, where a product past 2**63 wraps silently (arrays) or
warns (scalars). Ranges on the inputs (limits.py) keep each input sane, but their products can
still pass int64: Llama-3.1-405B at seq_len 2**24 × micro-batch 2**16 saves ~2**66 bytes of
activations, which wrapped to a plausible 1.8·10^9 GiB before this guard. So results are guarded
where they leave the engine (fit.evaluate, fit.minimum_gpus, the planner's and the sweep's
evaluators), not inside each formula:

1. ``input_scale_bytes``: a float64 upper bound of the largest product any memory formula forms,
   from the inputs alone. ASSUMPTION (stated, checked by tests/test_overflow_guard.py over every
   built-in model × method × strategy × AC × attention × precision × offload × sizes; worst
   term/bound 0.55): every term is at most tokens × (layers × width + 4 × vocab) × 16 bytes +
   params × 64 bytes, where tokens = micro_batch × seq_len and width = hidden + q + 2·kv + 3·mlp
   + heads × seq_len (attention scores, with eager attention or fp32's math backend) — a saved element is at most 16 bytes (fp32 with
   a copy, a mask and a gradient) and model states at most 64 bytes per parameter (fp32 params,
   grads, master, two moments, gathered copies). Rows whose bound exceeds ``SCREEN_BYTES`` may
   have wrapped, and are not evaluated as answers. (Host RAM per node sums a node's GPUs and is
   left to check 2.)
2. ``bad_results``: any guarded term negative or above limits.INT64_SAFE (a wrap that the bound
   missed), and times that are NaN, infinite or negative.

numpy's RuntimeWarnings (overflow, invalid, divide) are silenced at the same boundary
(``quiet_numpy``): a row they concern is caught by 1 or 2, and a user never sees a warning.
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs import strategy as st
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import INT64_SAFE

# Peak totals sum up to ~16 moments' terms of at most the bound each: the bound must leave
# that much room below INT64_SAFE.
SCREEN_BYTES = INT64_SAFE // 16

GUARDED_BYTES = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "load_peak_bytes",
                 "model_state_bytes", "host_bytes_per_node", "host_offloaded_bytes_per_gpu")
GUARDED_TIMES = ("step_time_s", "tokens_per_s")


def quiet_numpy():
    """numpy's floating-point warnings off for an evaluation; the guard below judges the rows."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")


def input_scale_bytes(c) -> np.ndarray:
    """Upper bound (float64) of the largest byte count a memory formula forms for each row (see
    the module's ASSUMPTION)."""
    tokens = np.asarray(c.micro_batch, dtype=np.float64) * np.asarray(c.seq_len, dtype=np.float64)
    # attention scores (heads x seq per token) exist with eager attention and with fp32 (SDPA's math
    # backend, activations.py); SDPA's fused kernels keep none
    scores = (np.asarray(c.attention) == st.EAGER) | (np.asarray(c.precision) == st.FP32)
    width = (np.asarray(c.hidden_size, dtype=np.float64) + np.asarray(c.q_width, dtype=np.float64)
             + 2 * np.asarray(c.kv_width, dtype=np.float64) + 3 * np.asarray(c.mlp_width, dtype=np.float64)
             + np.where(scores, np.asarray(c.num_heads, dtype=np.float64) * np.asarray(c.seq_len, dtype=np.float64), 0.0))
    layers = np.maximum(np.asarray(c.num_layers, dtype=np.float64), 1)
    vocab = np.asarray(c.vocab_size, dtype=np.float64)
    return tokens * (layers * width + 4 * vocab) * 16 + np.asarray(c.total_params, dtype=np.float64) * 64


def bad_results(c, m: dict) -> np.ndarray:
    """True for rows whose results cannot be trusted: inputs past the int64 screen, a guarded byte
    count negative or above INT64_SAFE, a time NaN, infinite or negative."""
    bad = input_scale_bytes(c) > SCREEN_BYTES
    for name in GUARDED_BYTES:
        if name in m:
            value = np.asarray(m[name])
            bad = bad | (value < 0) | (value > INT64_SAFE)
    for name in GUARDED_TIMES:
        if name in m:
            value = np.asarray(m[name], dtype=np.float64)
            bad = bad | np.logical_not(np.isfinite(value)) | (value < 0)
    return bad


def check_one(c, m: dict, config) -> None:
    """A single query (fit, plan's one configuration): an overflowed result is a one-line error."""
    if bool(np.any(bad_results(c, m))):
        raise ShardplanError(
            "seq_len", config.seq_len,
            f"with micro-batch {config.micro_batch} this configuration's results pass int64 (memory above "
            f"{SCREEN_BYTES:.2e} bytes per GPU by the input bound, or a byte count or time that wrapped); not a "
            f"run shardplan can evaluate (shorten the sequence or the micro-batch)")


OVERFLOW_NOTE = "results beyond int64 (sizes too large to evaluate; docs/errors.md)"
