"""Optional dependencies: import one where it is used, or fail with one line naming the extra.

A plain ``pip install .`` has no torch, yaml, pyarrow or transformers; the commands that need
them say which ``shardplan[...]`` extra brings them (pyproject.toml ``optional-dependencies``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from shardplan.support.errors import ShardplanError


def require(module: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or a ShardplanError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ShardplanError("dependency", module,
                             f"not installed; this command needs it: pip install \"shardplan[{extra}]\"") from None
