"""shardplan: will it fit, how fast will it run, and which sharding strategy to use.

The public API is these top-level names (docs/api.md has a runnable example of each). Each is
loaded on first use, so ``import shardplan`` imports no numpy, pandas or pydantic until a name
is asked for.
"""

import importlib

__version__ = "0.1.0"

# name -> (module, attribute)
_LAZY = {
    # what a user states: a model, a cluster, the training knobs, a global batch
    "get_model": ("shardplan.inputs.models", "get_model"),
    "resolve_model": ("shardplan.inputs.models", "resolve_model"),
    "parse_gpus": ("shardplan.inputs.hardware", "parse_gpus"),
    "TrainingConfig": ("shardplan.inputs.config", "TrainingConfig"),
    "resolve_workload": ("shardplan.planning.workload", "resolve_workload"),
    "ShardplanError": ("shardplan.support.errors", "ShardplanError"),
    # one configuration, or one per strategy, term by term
    "evaluate": ("shardplan.planning.fit", "evaluate"),
    "fit": ("shardplan.planning.fit", "fit"),
    "step_timing": ("shardplan.planning.fit", "step_timing"),
    # many configurations in one vectorized pass
    "evaluate_many": ("shardplan.planning.fit", "evaluate_many"),
    "evaluate_queries": ("shardplan.planning.evaluate", "evaluate_queries"),
    "sweep": ("shardplan.planning.grid_sweep", "sweep"),
    "pareto": ("shardplan.planning.sweep_analysis", "pareto"),
    "fewest_gpus_per_group": ("shardplan.planning.sweep_analysis", "fewest_gpus_per_group"),
    "minimum_gpus": ("shardplan.planning.sweep_analysis", "minimum_gpus"),  # deprecated: fewest_gpus_per_group
    # the search
    "plan": ("shardplan.planning.planner", "plan"),
    # the verdict codes of evaluate_queries' ``verdict`` column, as words
    "VERDICTS": ("shardplan.formulas.verdict", "VERDICTS"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        from shardplan.calibrate import install_module_tree_reader

        install_module_tree_reader()  # a config.json of a model_type no family reader knows: its module tree
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # the next access is a plain attribute
        return value
    raise AttributeError(f"module 'shardplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
