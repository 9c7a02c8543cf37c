"""Old import paths of modules that moved into subpackages keep working, with a
DeprecationWarning: ``import shardplan.memory`` gives the very module ``shardplan.formulas.memory``
(one object, so monkeypatching either name patches both).

``shardplan.sweep`` is not here: it is the sweep *function* (``shardplan/__init__.py``); the
module is ``shardplan.planning.grid_sweep``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED_MODULES = {
    **{f"shardplan.{m}": f"shardplan.inputs.{m}" for m in (
        "units", "model", "models", "model_names", "hf_config", "hardware", "strategy", "config", "profiles",
        "stacks", "vocabulary", "query", "contradictions")},
    **{f"shardplan.{m}": f"shardplan.formulas.{m}" for m in (
        "model_states", "activations", "buffers", "overheads", "allocator", "load", "memory", "comm",
        "throughput", "verdict", "accuracy_bands")},
    **{f"shardplan.{m}": f"shardplan.planning.{m}" for m in ("fit", "planner")},
    **{f"shardplan.{m}": f"shardplan.cli.{m}" for m in ("report", "plan_report", "layout")},
    **{f"shardplan.{m}": f"shardplan.support.{m}" for m in (
        "errors", "limits", "overflow", "atomic_write", "input_files", "output_path", "extras", "names")},
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Answers only the names in ``MOVED_MODULES``; every other import goes on as usual."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; the old path will be removed", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
