"""Helpers on a sweep's DataFrame: the Pareto front of two columns, and the fewest GPUs at which
each group of rows fits."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from shardplan.support.errors import ShardplanError


def pareto(df: pd.DataFrame, x: str = "device_total_bytes", y: str = "tokens_per_s", *, minimize_x: bool = True,
           maximize_y: bool = True, by: str | Sequence[str] | None = None, only_fitting: bool = True) -> pd.DataFrame:
    """Rows no other row beats on both ``x`` and ``y`` (default: less memory, more tokens/s),
    sorted by ``x``; per group of ``by`` when given. Rows that do not fit are left out unless
    ``only_fitting`` is False."""
    for col in (x, y):
        if col not in df.columns:
            raise ShardplanError("pareto", col, f"no such column; have {', '.join(map(str, df.columns))}")
    data = df[df["fits"]] if only_fitting and "fits" in df.columns else df
    if by is not None:
        keys = [by] if isinstance(by, str) else list(by)
        parts = [_front(g, x, y, minimize_x, maximize_y) for _, g in data.groupby(keys, observed=True, sort=False)]
        return pd.concat(parts) if parts else data.iloc[:0]
    return _front(data, x, y, minimize_x, maximize_y)


def _front(data: pd.DataFrame, x: str, y: str, minimize_x: bool, maximize_y: bool) -> pd.DataFrame:
    xs = data[x].to_numpy(dtype=np.float64) * (1 if minimize_x else -1)
    ys = data[y].to_numpy(dtype=np.float64) * (1 if maximize_y else -1)
    ok = ~(np.isnan(xs) | np.isnan(ys))
    pos = np.flatnonzero(ok)
    order = pos[np.lexsort((-ys[pos], xs[pos]))]      # x ascending, best y first among equal x
    best = np.maximum.accumulate(ys[order])
    previous = np.concatenate(([-np.inf], best[:-1]))
    keep = order[ys[order] > previous]
    return data.iloc[keep]


def fewest_gpus_per_group(df: pd.DataFrame, by: str | Sequence[str] = ("model", "strategy")) -> pd.DataFrame:
    """Smallest ``world_size`` at which each group (default model × strategy) has a fitting row;
    ``<NA>`` where none fits (column ``minimum_gpus``). Add other labels (``gpu``, ``method``,
    ``seq_len``) to ``by`` to split further. One configuration's answer, searched over GPU counts,
    is ``shardplan.planning.fit.fewest_gpus_that_fit``."""
    keys = [by] if isinstance(by, str) else list(by)
    world = df["world_size"].where(df["fits"].astype(bool))
    result = world.groupby([df[k] for k in keys], observed=True, sort=True).min()
    return result.astype("Int64").rename("minimum_gpus").reset_index()


def minimum_gpus(df: pd.DataFrame, by: str | Sequence[str] = ("model", "strategy")) -> pd.DataFrame:
    """Deprecated name of ``fewest_gpus_per_group``."""
    import warnings

    warnings.warn("minimum_gpus(df) is now shardplan.fewest_gpus_per_group(df)",
                  DeprecationWarning, stacklevel=2)
    return fewest_gpus_per_group(df, by)
