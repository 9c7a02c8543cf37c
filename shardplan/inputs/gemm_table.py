"""The measured 16-bit GEMM shape fits shipped with shardplan (``shardplan/data/gemm_efficiency.json``,
written from ``calibrate/gemm_shapes.py``): read once, looked up by GPU profile name."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def gemm_shape_table() -> dict:
    """{GPU profile name: fit} of the shipped file."""
    return json.loads(resources.files("shardplan").joinpath("data/gemm_efficiency.json").read_text())["gpus"]


def gemm_shape_entry(gpu_name: str) -> dict | None:
    """One GPU's fit (coefficients, eff_max, probes, shapes, leave-one-shape-out errors), or None."""
    return gemm_shape_table().get(gpu_name)
