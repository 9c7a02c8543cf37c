"""Optional dependencies: import one where it is used, or fail with one line naming the extra.

A plain ``pip install .`` has no torch, yaml, pyarrow or transformers; the commands that need
them say which ``shardplan[...]`` extra brings them (pyproject.toml ``optional-dependencies``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

from shardplan.support.errors import ShardplanError

# Readers a lower layer calls but may not import (the import contracts keep torch inside calibrate/):
# the layer that owns one installs it (cli.app.main and shardplan.__getattr__ call
# shardplan.calibrate.install_module_tree_reader), the lower layer asks for it by name, and gets
# None where nothing installed it (a caller of inputs/ alone).
_READERS: dict[str, Callable] = {}


def install_reader(name: str, reader: Callable) -> None:
    _READERS[name] = reader


def installed_reader(name: str) -> Callable | None:
    return _READERS.get(name)


def require(module: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or a ShardplanError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ShardplanError("dependency", module,
                             f"not installed; this command needs it: pip install \"shardplan[{extra}]\"") from None
