"""Sweeps: the same formulas over the cartesian product of many knobs, as numpy arrays.

``sweep(models=[...], gpus=[...], gpu_counts=[...], strategies=[...], seq_len=[...], ...)``
returns a pandas DataFrame with one row per configuration, whose columns carry the names of the
record fields (``estimate_memory``'s terms, ``comm_volume`` / ``comm_times``, step time / tokens/s
/ MFU). No formula lives here, and no step of its own: the axes are planned in
``sweep_axes`` / ``sweep_plan``, the product is evaluated chunk by chunk in ``sweep_chunks`` and
assembled in ``sweep_frame``; ``sweep_analysis`` holds the helpers on the result (docs/sweep.md).

How the product is evaluated, without a Python loop per configuration:

* every knob is an *axis* (its distinct values, in the order given); axes of one value are fixed
  scalars; the row order is the C order of the product (the last axis varies fastest);
* the product is cut into chunks of at most ``chunk_size`` rows: outer axes are fixed per chunk,
  the axis where the chunk boundary falls is sliced, and the inner axes stay a broadcast grid —
  each ``Columns`` field is an array shaped only along the axes it depends on (a model column
  varies along the model axis, a cluster column along GPU × nodes × GPU count), so numpy computes
  every intermediate at the size of the axes it really involves, and only the results that vary
  with everything are materialised at chunk size;
* the chosen columns are copied into preallocated arrays (labels as small integer codes, exposed
  as pandas categoricals), so memory is bounded by the output plus one chunk's temporaries.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pandas as pd

from shardplan.formulas.accuracy_bands import AccuracyBands
from shardplan.formulas.overflow import OVERFLOW_NOTE

# names this module had before the split (the notebooks import pareto and minimum_gpus from here)
from shardplan.planning.sweep_analysis import minimum_gpus, pareto  # noqa: F401
from shardplan.planning.sweep_axes import bounded_axis
from shardplan.planning.sweep_chunks import OVERFLOW_KEY, axis_index, chunk_columns, chunks, evaluate_columns
from shardplan.planning.sweep_frame import MEMORY_COLUMNS, SUMMARY_COLUMNS, FrameBuilder  # noqa: F401
from shardplan.planning.sweep_plan import plan_sweep
from shardplan.support.limits import MAX_SWEEP_CONFIGURATIONS, bounded_int

DEFAULT_CHUNK_ROWS = 1 << 20
# sweep's arguments that are not knob axes
_OPTIONS = ("intra_link", "inter_link", "host_ram", "columns", "valid_only", "bands", "chunk_size", "progress",
            "max_configurations")


def sweep(models: Any = "llama-3.1-8b", gpus: Any = "h100-sxm", gpu_counts: Any = 8, nodes: Any = None,
          strategies: Any = None, engines: Any = "fsdp2", precision: Any = "bf16-mixed", optimizer: Any = "adamw",
          ac: Any = "none", micro_batch: Any = 1, seq_len: Any = 1024, offload: Any = "none", method: Any = "full",
          lora_rank: Any = 16, *, lora_targets: Any = "all-linear", grad_accum: Any = 1, ac_every_k: Any = 2,
          shard_group_size: Any = None, attention: Any = "sdpa", dropout: Any = False, reduce_dtype: Any = None,
          stack: Any = "hf", logits_fp32: Any = None, ce_chunks: Any = None, fused_ce: Any = None,
          optimizer_in_backward: Any = None,
          activation_offload: Any = None, fp32_master: Any = None, paged_optimizer: Any = None,
          lora_dropout: Any = None, reentrant_checkpointing: Any = None, quant_state_sharded: Any = None,
          quant_format: Any = None, load_mode: Any = None, checkpoint_wrapper: Any = None,
          use_cache: Any = None, kbit_prep: Any = None, fused_lm_head: Any = None, optimizer_impl: Any = None,
          quant_saves_input: Any = None, quant_head: Any = None, untied_head: Any = None, chunked_head: Any = None,
          quant_buffers_sharded: Any = None, loop_keeps_logits: Any = None, nf4_whole_quantize: Any = None,
          nf4_torchao: Any = None,
          autocast: Any = None, compile: Any = None, lowp_norm: Any = None, rope_form: Any = None,
          sac_saves_attention: Any = None, metric_ce: Any = None,
          sync_every_micro_batch: Any = None,
          intra_link: str | None = None, inter_link: str | None = None, host_ram: str | int | None = None,
          columns: Any = None, valid_only: bool = False, bands: AccuracyBands | None = None,
          chunk_size: int = DEFAULT_CHUNK_ROWS, progress: Callable[[int, int], None] | bool | None = None,
          max_configurations: int = MAX_SWEEP_CONFIGURATIONS) -> pd.DataFrame:
    """Evaluate every configuration of the product of the knobs given; one DataFrame row each.

    Every knob takes a scalar or a list/range (docs/sweep.md lists them). ``gpu_counts`` is the
    total GPU count; ``nodes`` None lays it out on the GPU's usual node size, an integer spreads it
    over that many nodes; counts that cannot be laid out give rows with ``valid`` False.
    ``strategies`` None sweeps all eight (``valid_only=True`` drops what an engine cannot express).
    ``reduce_dtype`` None: each engine's default. ``sync_every_micro_batch`` None: gradients reduced
    every micro-batch (the engines' default); False (or [True, False]) holds the unsharded gradients
    until the last micro-batch (no_sync), counted in the memory columns. ``stack`` fills the stack knobs left None from
    each stack's profile (one-GPU rows its ``single_gpu`` values). ``columns``: None/"all",
    "summary", or column names (labels always kept). ``bands``: the verdict's band data.
    ``progress``: a callable ``progress(rows_done, rows_total)`` called after each chunk; True a
    stderr bar (``shardplan.support.progress``), None that bar when stderr is a terminal and the sweep
    big, False nothing. ``max_configurations`` (default 10^7, ~765 B a row with all columns): a
    larger product is refused before anything is evaluated, naming its count.
    """
    given = dict(locals())
    link_options = _link_options(intra_link, inter_link, host_ram)
    chunk_size = bounded_int(chunk_size, "chunk_size", 1, MAX_SWEEP_CONFIGURATIONS)
    max_configurations = bounded_int(max_configurations, "max_configurations", 1, 10**12)
    args = {name: bounded_axis(name, value) for name, value in given.items() if name not in _OPTIONS}
    plan = plan_sweep(args, link_options, max_configurations)
    report = _progress_callback(progress)
    frame = FrameBuilder(plan, columns, valid_only)
    _decide_columns(frame, plan, bands)
    overflow_rows = 0
    for start, index, grid in chunks(plan.shape, int(chunk_size)):
        ix, grid = axis_index(index, plan)
        out = evaluate_columns(*chunk_columns(plan, ix), frame.want, bands)
        overflow_rows += int(np.count_nonzero(np.broadcast_to(out.pop(OVERFLOW_KEY), grid)))
        frame.add(start, ix, grid, out)
        if report is not None:
            report(start + math.prod(grid), plan.rows)
    return frame.frame(plan.cluster_notes + ([f"{overflow_rows:,} rows: {OVERFLOW_NOTE}"] if overflow_rows else []))


def _decide_columns(frame: FrameBuilder, plan, bands) -> None:
    """The frame's columns, and so what every chunk computes (``frame.want``), from the first row
    evaluated with every column: no chunk computes columns nobody asked for."""
    _, index, _ = next(chunks(plan.shape, 1))
    ix, _ = axis_index(index, plan)
    out = evaluate_columns(*chunk_columns(plan, ix), None, bands)
    out.pop(OVERFLOW_KEY)
    frame.allocate(out)


def _link_options(intra_link: str | None, inter_link: str | None, host_ram: str | int | None) -> dict[str, Any]:
    """``parse_gpus``'s link and host-RAM options (host RAM as text or bytes)."""
    from shardplan.inputs.units import parse_capacity_bytes
    from shardplan.support.limits import checked_int

    host = (parse_capacity_bytes(host_ram, "host_ram") if isinstance(host_ram, str)
            else None if host_ram is None else checked_int("host_ram", host_ram))
    return dict(intra_link=intra_link, inter_link=inter_link, host_ram_bytes_per_node=host)


def _progress_callback(progress: Callable[[int, int], None] | bool | None) -> Callable[[int, int], None] | None:
    """The callback ``progress`` names: itself, nothing (False), or the stderr bar
    (``support/progress.py``; True, or None: drawn only on a terminal for a big sweep)."""
    if callable(progress):
        return progress
    if progress is False:
        return None
    from shardplan.support.progress import StderrBar

    return StderrBar(None if progress is None else bool(progress))


__all__ = ["sweep", "pareto", "minimum_gpus", "evaluate_columns", "SUMMARY_COLUMNS", "MEMORY_COLUMNS"]
