"""The formulas over Python numbers: the same functions, compiled a second time for one configuration.

A formula is written once, against numpy, for arrays of configurations. ``twin()`` gives each
module that takes part in a memory estimate, its verdict and a step time a second namespace in
which ``np`` is ``scalar_numpy`` (numpy's functions over Python numbers), and re-creates every
top-level function of the module there from the module's own source, with numpy calls written as
the Python they mean for one value (``_ScalarCalls``: ``np.where`` -> a conditional expression, ``np.asarray`` ->
the value or ``int()``/``bool()``/``float()``, ``np.logical_not`` -> ``not``). No formula is written
twice: a change to one changes both paths. References between the twinned modules
(``eng.per_engine``, ``from ... import trainable_params``) point at the twins, and the engine
declarations (``engines.tables``) are read as Python lists and dicts keyed by code.

What is not a plain module-level function (classes and their methods, ``lru_cache`` wrappers,
pydantic models) stays as it is: it reads declarations and data files, not configurations.
``tests/test_scalar_twin.py`` checks the twin against the vectorized evaluation column by column
on 1,000 random configurations across every engine, stack and method.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import itertools
import marshal
import sys
import types
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

from shardplan.formulas import scalar_numpy

# Every module a memory estimate, its verdict and a step time call into (formulas, the
# declarations they read, the column completion and the overflow guard).
TWINNED = (
    "shardplan.inputs.engines", "shardplan.inputs.strategy", "shardplan.inputs.config",
    "shardplan.formulas.overheads", "shardplan.formulas.activations", "shardplan.formulas.model_states",
    "shardplan.formulas.buffers", "shardplan.formulas.comm", "shardplan.formulas.load",
    "shardplan.formulas.allocator", "shardplan.formulas.memory", "shardplan.formulas.verdict",
    "shardplan.formulas.throughput", "shardplan.support.overflow",
)


# Pure functions of a few codes and whole numbers (declaration lookups, shard degrees), called
# ~100 times per estimate: in the twin each keeps its answers per argument tuple. lru_cache is C,
# so a hit costs no Python frame; typed, so True and 1 stay apart; bounded (whole numbers come from
# queries). Their arguments are Python numbers there (a TypeError would say otherwise).
MEMOIZED = {
    "shardplan.inputs.engines": ("per_engine", "per_strategy", "per_precision", "wrapper_is", "layout_is"),
    "shardplan.inputs.strategy": ("runs_as", "default_reduce_dtype", "resolve_reduce_dtype", "is_valid",
                                  "valid_world_size", "shard_degrees"),
}
MEMO_SIZE = 4096


def scalar_table(array):
    """A numpy table as Python values: a list for one axis; for more, a dict keyed by every index
    tuple of every length (``t[e]``, ``t[e, s]``, ``t[e, s, o]`` as numpy would index it)."""
    if array.ndim == 1:
        return array.tolist()
    out = {}
    for depth in range(1, array.ndim + 1):
        for index in itertools.product(*(range(n) for n in array.shape[:depth])):
            out[index[0] if depth == 1 else index] = array[index].tolist()
    return out


@lru_cache(maxsize=1)
def scalar_tables():
    """``engines.tables()`` with each table as ``scalar_table``."""
    from shardplan.inputs import engines

    tables = engines.tables()
    return types.SimpleNamespace(**{f.name: scalar_table(getattr(tables, f.name)) for f in fields(tables)})


class _ScalarCalls(ast.NodeTransformer):
    """numpy calls written as the Python they mean for one value, so the twin pays no function
    call for them: ``np.where(c, a, b)`` -> ``a if c else b`` (evaluating only the branch taken;
    formulas have no side effects), ``np.select([c1, c2], [v1, v2], d)`` with the lists written
    out -> ``v1 if c1 else v2 if c2 else d`` (likewise), ``np.asarray(x)`` -> ``x`` and with an int /
    bool / float dtype -> ``int(x)`` / ``bool(x)`` / ``float(x)`` (int() truncates toward zero, as
    numpy's cast does), ``np.logical_not(x)`` -> ``not x``, ``np.zeros`` / ``np.ones`` (and
    ``*_like`` with a dtype) -> the constant 0 / 1 of their dtype (float without one, as numpy's).
    Every other ``np.<name>`` stays a call into ``scalar_numpy``."""

    CASTS = {"int8": "int", "int16": "int", "int32": "int", "int64": "int", "float32": "float",
             "float64": "float", "bool_": "bool", "bool": "bool", "int": "int", "float": "float"}
    FILLS = {"zeros": 0, "ones": 1, "zeros_like": 0, "ones_like": 1}

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        name = _numpy_name(node.func)
        if name == "where" and len(node.args) == 3 and not node.keywords:
            return ast.copy_location(ast.IfExp(test=node.args[0], body=node.args[1], orelse=node.args[2]), node)
        if name == "select" and not node.keywords:
            return self._select(node)
        if name == "logical_not" and len(node.args) == 1 and not node.keywords:
            return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=node.args[0]), node)
        if name == "asarray" and len(node.args) == 1:
            if not node.keywords:
                return node.args[0]
            cast = self._cast(node)
            if cast:
                callee = ast.copy_location(ast.Name(id=cast, ctx=ast.Load()), node.func)
                return ast.copy_location(ast.Call(func=callee, args=node.args, keywords=[]), node)
        if name in self.FILLS and len(node.args) == 1:
            cast = self._cast(node) or (None if name.endswith("_like") or node.keywords else "float")
            if cast:
                value = {"int": int, "float": float, "bool": bool}[cast](self.FILLS[name])
                return ast.copy_location(ast.Constant(value=value), node)
        return node

    def _cast(self, node: ast.Call) -> str | None:
        """The Python type a call's only keyword, ``dtype=np.<int/float/bool type>``, names, else None."""
        dtype = node.keywords[0].value if [k.arg for k in node.keywords] == ["dtype"] else None
        return self.CASTS.get(_numpy_name(dtype) or getattr(dtype, "id", None))

    @staticmethod
    def _select(node: ast.Call):
        """``np.select`` over written-out lists as nested conditional expressions (the first true
        condition's choice, else the default: 0 when none is given), else the call unchanged."""
        if len(node.args) not in (2, 3) or not all(isinstance(a, ast.List) for a in node.args[:2]):
            return node
        conditions, choices = node.args[0].elts, node.args[1].elts
        if len(conditions) != len(choices):
            return node
        out = node.args[2] if len(node.args) == 3 else ast.copy_location(ast.Constant(value=0), node)
        for condition, choice in reversed(list(zip(conditions, choices))):
            out = ast.copy_location(ast.IfExp(test=condition, body=choice, orelse=out), node)
        return out


def _numpy_name(node) -> str | None:
    """``name`` for an ``np.name`` expression, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "np":
        return node.attr
    return None


def _rebind(module, namespace: dict) -> None:
    """Each plain function of ``module`` re-created over ``namespace``: its ``def`` as
    ``scalar_definitions`` compiled it, executed over the twin's namespace (default values read the
    twin's names too); a decorated function, or one whose source is not at hand, re-created from
    its own code object."""
    functions = {name: value for name, value in namespace.items()
                 if isinstance(value, types.FunctionType) and value.__module__ == module.__name__}
    compiled: dict = {}
    code = scalar_definitions(module)
    if code is not None:
        exec(code, namespace, compiled)
    for name, function in functions.items():
        twin_function = compiled.get(name)
        if twin_function is None or twin_function.__code__.co_firstlineno != function.__code__.co_firstlineno:
            twin_function = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                                               function.__closure__)
            twin_function.__kwdefaults__ = function.__kwdefaults__
        twin_function.__doc__ = function.__doc__
        namespace[name] = twin_function


def scalar_definitions(module) -> types.CodeType | None:
    """The module's top-level, undecorated ``def``s rewritten by ``_ScalarCalls`` and compiled
    together (line numbers kept: a traceback points at the formula's own line). Parsing and
    rewriting a dozen modules takes ~0.15 s, so the code is kept beside the module's bytecode
    (``__pycache__/<module>.<tag>.scalar-twin.pyc``), keyed by the SHA-256 of the module's source
    and of this file; not written where Python writes no bytecode (``sys.dont_write_bytecode``) or
    the folder is read-only. None: no source at hand."""
    try:
        path = inspect.getsourcefile(module)
        source = Path(path).read_bytes()
    except (OSError, TypeError):
        return None
    key = hashlib.sha256(source + _transform_source()).digest()
    cache = Path(importlib.util.cache_from_source(path)).with_suffix(".scalar-twin.pyc")
    try:
        data = cache.read_bytes()
        if data[:len(key)] == key:
            return marshal.loads(data[len(key):])
    except (OSError, ValueError, EOFError, TypeError):
        pass
    tree = ast.parse(source, path)
    definitions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and not node.decorator_list}
    code = compile(_ScalarCalls().visit(ast.Module(body=list(definitions.values()), type_ignores=[])), path, "exec")
    if not sys.dont_write_bytecode:
        try:
            from shardplan.support.atomic_write import write_bytes_atomic

            write_bytes_atomic(cache, key + marshal.dumps(code))
        except (OSError, ValueError):
            pass  # a read-only install: compiled again by the next process
    return code


@lru_cache(maxsize=1)
def _transform_source() -> bytes:
    """This file's bytes: a change to the rewriting recompiles every twin (read when a twin is built,
    not when a fit process imports the evaluator)."""
    return Path(__file__).read_bytes()


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
        for function in MEMOIZED.get(name, ()):
            twins[name].__dict__[function] = lru_cache(maxsize=MEMO_SIZE, typed=True)(twins[name].__dict__[function])
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
