"""A sweep's DataFrame: the wanted columns of every chunk copied into preallocated arrays (or
gathered per chunk when only valid rows are kept), the configuration labels as pandas
categoricals (small integer codes), coded columns with their names."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from shardplan.formulas.accuracy_bands import BAND_CLASSES
from shardplan.formulas.memory import BREAKDOWN_TERMS, PEAK_MOMENTS
from shardplan.formulas.verdict import VERDICTS
from shardplan.planning.sweep_axes import AXES, AXIS_COLUMN, LABEL_AXES, STACK_KNOB_AXES
from shardplan.planning.sweep_plan import SweepPlan
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import _shown

MEMORY_COLUMNS = BREAKDOWN_TERMS + (
    "peak_allocated_bytes", "peak_reserved_bytes", "stream_pool_bytes", "fragmentation_bytes", "allocator_band_bytes",
    "non_torch_bytes", "device_total_bytes", "gpu_memory_bytes", "headroom_bytes", "load_peak_bytes", "model_state_bytes",
    "host_offloaded_bytes_per_gpu", "host_bytes_per_node",
    "host_ram_bytes_per_node", "peak_moment", "valid", "fits_gpu", "fits_load", "fits_host", "fits",
)
# Columns holding codes, exposed as pandas categoricals with these names.
CODED_COLUMNS = {"peak_moment": PEAK_MOMENTS, "verdict": VERDICTS, "risk_term": BAND_CLASSES}
# What ``columns="summary"`` keeps besides the configuration labels (those that exist).
SUMMARY_COLUMNS = ("fits", "verdict", "valid", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                   "load_peak_bytes", "headroom_bytes", "comm_bytes_per_step", "step_time_s", "tokens_per_s", "mfu")


class FrameBuilder:
    """Where a sweep's chunks land, in row order; ``frame()`` is the DataFrame.

    The column set is decided by the first chunk (``columns``: None/"all", "summary", or names);
    ``want`` is then what the evaluation must compute. With ``valid_only`` the rows that are not
    valid are dropped chunk by chunk, and the labels are gathered with them; otherwise every
    column is preallocated and the labels are tiled at the end."""

    def __init__(self, plan: SweepPlan, columns: Any = None, valid_only: bool = False):
        self.plan, self.columns, self.keep_lists = plan, columns, valid_only
        self.label_cols = [AXIS_COLUMN[a] for a in AXES
                           if not (a == "nodes" or (a in ("shard_group_size", "reduce_dtype", "sync_every_micro_batch") + STACK_KNOB_AXES
                                                    and plan.axis(a).labels == (None,)))]
        self.store: dict[str, Any] = {}
        self.names: list[str] | None = None
        self.want: set[str] | None = None

    def add(self, start: int, ix: dict[str, Any], grid: tuple[int, ...], out: dict[str, Any]) -> None:
        """One chunk's results (``start``: its first row; ``ix``: its axis indices; ``grid``: its shape)."""
        if self.names is None:
            self.allocate(out)
        mask = np.broadcast_to(out["valid"], grid).ravel() if self.keep_lists else None
        for name in self.names:
            self._put(name, out[name], start, grid, mask)
        if self.keep_lists:
            for a in AXES:
                if AXIS_COLUMN[a] in self.label_cols:
                    self._put("__ix_" + a, ix[a], start, grid, mask, dtype=_label_dtype(self.plan.axis(a).size))

    def allocate(self, out: dict[str, Any]) -> None:
        """The column set and its storage, from one evaluation with every column (``out``)."""
        available = ["gpus_per_node", "nodes"] + [k for k in out if k not in ("gpus_per_node", "nodes", "world_size")]
        self.names = _column_names(self.columns, available)
        self.want = set(self.names) | {"valid"}
        for name in self.names:
            self.store[name] = [] if self.keep_lists else _empty(out[name], self.plan.rows)
        if self.keep_lists:  # with valid_only the labels are gathered per chunk; otherwise tiled at the end
            for a in AXES:
                if AXIS_COLUMN[a] in self.label_cols:
                    self.store["__ix_" + a] = []

    def _put(self, key: str, value, start: int, grid: tuple[int, ...], mask, dtype=None) -> None:
        value = np.broadcast_to(np.asarray(value, dtype=dtype), grid)
        if self.keep_lists:
            self.store[key].append(value.ravel()[mask] if mask is not None else value.ravel())
        else:
            np.copyto(self.store[key][start:start + math.prod(grid)].reshape(grid), value, casting="unsafe")

    def frame(self, notes: list[str]) -> pd.DataFrame:
        """The DataFrame: label columns first (axis order), then the wanted columns; ``attrs["notes"]``."""
        frame: dict[str, Any] = {}
        for a in AXES:
            if AXIS_COLUMN[a] in self.label_cols:
                frame[AXIS_COLUMN[a]] = self._labels(a)
        for name in self.names or []:
            values = self.store[name]
            values = np.concatenate(values) if self.keep_lists else values
            if name in CODED_COLUMNS:
                frame[name] = pd.Categorical.from_codes(values.astype(np.int8), categories=list(CODED_COLUMNS[name]))
            else:
                frame[name] = values
        df = pd.DataFrame(frame, copy=False)
        df.attrs["notes"] = notes
        return df

    def _labels(self, a: str):
        """Axis ``a``'s label of every row: a categorical, the GPU count, or the value itself."""
        axis = self.plan.axis(a)
        if self.keep_lists:
            codes = np.concatenate(self.store.pop("__ix_" + a))
        else:
            codes = _tiled_codes(self.plan.shape, AXES.index(a), _label_dtype(axis.size))
        if a in LABEL_AXES:
            return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(list(axis.labels)), validate=False)
        if a == "gpu_counts":
            return axis.codes[codes]
        return np.asarray(axis.labels)[codes]


def _label_dtype(n: int):
    return np.int8 if n < 127 else np.int16 if n < 32767 else np.int32


def _column_names(columns, available: Sequence[str]) -> list[str]:
    if columns is None or columns == "all":
        return list(available)
    if columns == "summary":
        return [c for c in SUMMARY_COLUMNS if c in available]
    if not isinstance(columns, (str, list, tuple)) or not all(isinstance(c, str) for c in
                                                              ([columns] if isinstance(columns, str) else columns)):
        raise ShardplanError("columns", _shown(columns), "expected 'all', 'summary', or column names")
    wanted = [c.strip() for c in columns.split(",") if c.strip()] if isinstance(columns, str) else list(columns)
    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise ShardplanError("columns", ",".join(unknown), f"unknown; available: {', '.join(available)}")
    return wanted


def _tiled_codes(shape: tuple[int, ...], i: int, dtype) -> np.ndarray:
    """Index along axis ``i`` of every row of the C-ordered product: a repeat then a tile."""
    stride = math.prod(shape[i + 1:])
    period = np.repeat(np.arange(shape[i], dtype=dtype), stride)
    return np.tile(period, math.prod(shape[:i]))


def _empty(value, total: int) -> np.ndarray:
    return np.empty(total, dtype=np.asarray(value).dtype)
