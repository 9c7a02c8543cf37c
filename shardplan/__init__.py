"""shardplan: will it fit, how fast will it run, and which sharding strategy to use."""

import importlib

from shardplan import moved as _moved

__version__ = "0.1.0"

_moved.install()

# name -> (module, attribute): loaded on first use, so ``import shardplan`` stays cheap
# (``sweep`` needs pandas).
_LAZY = {
    "sweep": ("shardplan.planning.grid_sweep", "sweep"),
    "pareto": ("shardplan.planning.sweep_analysis", "pareto"),
    "fewest_gpus_per_group": ("shardplan.planning.sweep_analysis", "fewest_gpus_per_group"),
    "minimum_gpus": ("shardplan.planning.sweep_analysis", "minimum_gpus"),  # deprecated: fewest_gpus_per_group
    "evaluate_queries": ("shardplan.planning.evaluate", "evaluate_queries"),
}


def __getattr__(name: str):
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'shardplan' has no attribute {name!r}")
