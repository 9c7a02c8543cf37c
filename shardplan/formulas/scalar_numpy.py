"""The part of numpy the formulas call, over Python numbers: one configuration without arrays.

The formulas are written once, against numpy, for arrays of configurations (a sweep's chunk, the
planner's grid, a batch of queries). For ONE configuration, numpy costs ~1 µs per operation on a
one-element array against ~50 ns for the same operation on a Python int or float, and a memory
estimate is a few thousand operations. ``scalar_twin`` runs the same functions (the same code
objects) with this module bound as their ``np``: the same formulas, evaluated in Python numbers.

Each function here returns what its numpy namesake returns for 0-d inputs, as a Python value:
``where(c, a, b)`` picks a or b, ``select`` the first true choice, ``ceil``/``floor`` whole numbers,
``asarray(x, dtype=int64)`` truncates toward zero like ``astype``. Python numbers differ from numpy
in three places, each handled where the twin evaluates (``planning/evaluate.py``):
* integer arithmetic does not wrap at 2**63 (the overflow guard, ``support/overflow.py``, reads
  the same bounds either way);
* division by zero and ``int(inf)`` raise instead of giving inf/nan with a warning: such a
  configuration is evaluated again with arrays;
* ``~`` on a bool is bitwise on an int (``~True == -2``): the formulas write ``np.logical_not``.
Names the formulas use only where they build tables (``arange``, ``tile``, ``full``) are left
out on purpose: a twin that reaches one fails loudly (AttributeError) rather than guess.
"""

from __future__ import annotations

import builtins
import math
from contextlib import nullcontext

int8 = int16 = int32 = int64 = int
float32 = float64 = float
bool_ = bool
inf = math.inf
ndarray = object  # annotations only; nothing in a formula checks isinstance against it


def where(condition, a, b):
    return a if condition else b


def select(conditions, choices, default=0):
    for condition, choice in zip(conditions, choices):
        if condition:
            return choice
    return default


def choose(index, choices):
    return choices[index]


def logical_not(x):
    return not x


def asarray(x, dtype=None):
    if dtype is None or dtype is float:
        return x if dtype is None else float(x)
    if dtype is bool:
        return bool(x)
    return int(x)  # int types: truncates toward zero, as numpy's cast does


def array(values, dtype=None):
    """A table built in a formula (a list, indexed by a code) stays a list of converted values."""
    if isinstance(values, (list, tuple)):
        return [asarray(v, dtype) for v in values]
    return asarray(values, dtype)


def clip(x, low, high):
    return min(max(x, low), high)


# Python's own functions where they are numpy's for one value (no Python frame per call):
# ceil/floor give whole numbers, round rounds half to even, bool(x) is np.any / np.all of one value.
ceil, floor, isfinite = math.ceil, math.floor, math.isfinite
# max/min of two values: ties keep the first (the same value numpy gives). They do not propagate a
# NaN as numpy does; a NaN byte count meets an int() cast, which raises, and the configuration
# is evaluated with arrays (evaluate.SCALAR_ARITHMETIC_ERRORS).
maximum, minimum = max, min


def _numpy_cbrt(x):
    import numpy

    return float(numpy.cbrt(x))


cbrt = getattr(math, "cbrt", _numpy_cbrt)  # libm's cbrt, as numpy's (math.cbrt: Python 3.11+)
round = builtins.round  # noqa: A001 - numpy's name
any = all = bool  # noqa: A001 - numpy's names


def isin(x, values):
    return x in values


def take(x, index, axis=None):
    return x[index]


def argmax(values, axis=None):
    return max(range(len(values)), key=values.__getitem__)  # max keeps the first of equal maxima, as numpy does


def stack(values, axis=0):
    return list(values)


class _Shape:
    shape: tuple = ()


def broadcast(*values):
    return _Shape()


def broadcast_to(x, shape):
    return x


def shape(x):
    return ()


def ndim(x):
    return 0


def zeros(shape=(), dtype=float):
    return dtype(0)


def ones(shape=(), dtype=float):
    return dtype(1)


def zeros_like(x, dtype=None):
    return (dtype or type(x))(0)


def ones_like(x, dtype=None):
    return (dtype or type(x))(1)


def errstate(**_):
    return nullcontext()
