"""shardplan: will it fit, how fast will it run, and which sharding strategy to use."""

import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``shardplan.sweep(...)`` and ``shardplan.pareto`` load pandas only when first used.
    if name in ("sweep", "pareto"):
        module = importlib.import_module("shardplan.sweep")
        return module if name == "sweep" else module.pareto
    raise AttributeError(f"module 'shardplan' has no attribute {name!r}")
