"""The formulas over Python numbers: the same functions, rebound to ``scalar_numpy`` as their ``np``.

``twin()`` copies the namespace of each module that takes part in a memory estimate and its
verdict, swaps ``np`` for ``scalar_numpy``, and re-creates every plain function of the module
from its own code object over that namespace (``types.FunctionType(f.__code__, namespace)``):
no formula is written twice, and a change to one changes both paths. References between the
twinned modules (``eng.per_engine``, ``from ... import trainable_params``) point at the twins, and
the engine declarations (``engines.tables``) are read as Python lists and dicts keyed by code.

What is not a plain module-level function (classes and their methods, ``lru_cache`` wrappers,
pydantic models) stays as it is: it reads declarations and data files, not configurations.
``tests/test_scalar_vector_agree.py`` checks the twin against the vectorized evaluation on
1,000 random configurations across every engine and stack.
"""

from __future__ import annotations

import types
from dataclasses import fields
from functools import lru_cache

from shardplan.formulas import scalar_numpy

# Every module a memory estimate and its verdict call into (formulas, the declarations they
# read, the column completion and the overflow guard).
TWINNED = (
    "shardplan.inputs.engines", "shardplan.inputs.strategy", "shardplan.inputs.config",
    "shardplan.formulas.overheads", "shardplan.formulas.activations", "shardplan.formulas.model_states",
    "shardplan.formulas.buffers", "shardplan.formulas.comm", "shardplan.formulas.load",
    "shardplan.formulas.allocator", "shardplan.formulas.memory", "shardplan.formulas.verdict",
    "shardplan.support.overflow",
)


def scalar_table(array):
    """A numpy table as Python values: a list for one axis; for more, a dict keyed by every index
    tuple of every length (``t[e]``, ``t[e, s]``, ``t[e, s, o]`` as numpy would index it)."""
    if array.ndim == 1:
        return array.tolist()
    out = {}
    for depth in range(1, array.ndim + 1):
        for index in zip(*(a.ravel() for a in _grid(array.shape[:depth]))):
            key = index[0] if depth == 1 else index
            out[key] = array[index].tolist()
    return out


def _grid(shape):
    import numpy as np

    return np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")


@lru_cache(maxsize=1)
def scalar_tables():
    """``engines.tables()`` with each table as ``scalar_table``."""
    from shardplan.inputs import engines

    tables = engines.tables()
    return types.SimpleNamespace(**{f.name: scalar_table(getattr(tables, f.name)) for f in fields(tables)})


def _rebind(module, namespace: dict) -> None:
    """Each plain function of ``module`` re-created over ``namespace`` (same code, defaults, closure)."""
    for name, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            twin_function = types.FunctionType(value.__code__, namespace, value.__name__, value.__defaults__,
                                               value.__closure__)
            twin_function.__kwdefaults__ = value.__kwdefaults__
            twin_function.__doc__ = value.__doc__
            namespace[name] = twin_function


@lru_cache(maxsize=1)
def twin() -> dict[str, types.ModuleType]:
    """Module name -> its twin (a module object not in ``sys.modules``), built once."""
    import importlib

    originals = {name: importlib.import_module(name) for name in TWINNED}
    twins = {}
    for name, module in originals.items():
        twin_module = types.ModuleType(name + "[scalar]", module.__doc__)
        twin_module.__dict__.update(module.__dict__)
        twin_module.__dict__["np"] = scalar_numpy
        twins[name] = twin_module
    for name, module in originals.items():
        _rebind(module, twins[name].__dict__)
    by_original = {id(m): twins[n] for n, m in originals.items()}
    for name, twin_module in twins.items():
        _link(twin_module.__dict__, by_original, twins)
    twins["shardplan.inputs.engines"].__dict__["tables"] = scalar_tables
    return twins


def _link(namespace: dict, by_original: dict, twins: dict) -> None:
    """References to twinned modules, and functions imported from them by name, -> the twins'."""
    for key, value in list(namespace.items()):
        if isinstance(value, types.ModuleType) and id(value) in by_original:
            namespace[key] = by_original[id(value)]
        elif isinstance(value, types.FunctionType) and value.__module__ in twins and value.__globals__ is not namespace:
            namespace[key] = twins[value.__module__].__dict__.get(value.__name__, value)


def module(name: str) -> types.ModuleType:
    """The twin of ``shardplan.<name>`` (e.g. ``module("formulas.memory").estimate_memory``)."""
    return twin()["shardplan." + name]
