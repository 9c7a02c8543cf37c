"""The evaluator the capacity query (``planning/fit.py``) and the search (``planning/planner.py``)
share: ``Columns`` in, memory + communication + time + verdict arrays out.
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.accuracy_bands import AccuracyBands
from shardplan.formulas.comm import comm_volume, link_rates
from shardplan.formulas.memory import estimate_memory
from shardplan.formulas.throughput import compute_rates, step_time
from shardplan.formulas.verdict import DOES_NOT_FIT, FITS, judge, throughput_band
from shardplan.inputs.config import Columns
from shardplan.inputs.hardware import Cluster
from shardplan.support.overflow import bad_results, quiet_numpy


def evaluate_grid(c: Columns, sync, cluster: Cluster, calibration=None,
                  bands: AccuracyBands | None = None) -> dict[str, np.ndarray]:
    """Memory, communication and time for every row, each computed once over the whole grid.
    ``fits`` is the verdict's (peak + band under capacity; shardplan/formulas/verdict.py), the no_sync
    gradients counted in the peak; tokens/s carries its band (``*_low`` / ``*_high``)."""
    links, rates = link_rates(cluster, calibration), compute_rates(cluster, calibration)
    with quiet_numpy():  # overflowed rows are judged by the guard, never shown as warnings
        m = estimate_memory(c)
        v = comm_volume(c, sync)
        t = step_time(c, links, rates, sync, volume=v)
        device_total = m["device_total_bytes"] + v["no_sync_grad_bytes"]
        verdict = judge(m, c, bands, device_total_bytes=device_total, extra_allocated_bytes=v["no_sync_grad_bytes"])
    out = {**m, **v, **t, **verdict, "device_total_bytes": device_total,
           "headroom_bytes": c.gpu_memory_bytes - device_total, "fits": verdict["verdict"] == FITS,
           "calibrated": np.asarray(links.calibrated or rates.calibrated)}
    overflow = bad_results(c, out)  # an overflowed row is not a candidate (overflow.py)
    out["overflow"] = overflow
    out["valid"] = out["valid"] & ~overflow
    out["fits"] = out["fits"] & ~overflow
    out["verdict"] = np.where(overflow, DOES_NOT_FIT, out["verdict"]).astype(np.asarray(out["verdict"]).dtype)
    for name in ("tokens_per_s", "tokens_per_s_per_gpu"):
        out[f"{name}_low"], out[f"{name}_high"] = throughput_band(t[name], bands)
    return out
