"""Import paths users already have keep working after the layout change (shardplan/moved.py):
``import shardplan.memory`` is the very module ``shardplan.formulas.memory`` and warns once with a
DeprecationWarning naming the new path; ``from shardplan import sweep, pareto, minimum_gpus`` gives
the functions, and ``shardplan.sweep`` stays the function whatever planning module is imported.

Each check runs in a fresh interpreter: whether an import warns depends on what was imported
before, and the other tests import the new paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardplan.moved import MOVED_MODULES

ROOT = Path(__file__).resolve().parent.parent


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter (this checkout first on the path); it sets ``result``,
    which comes back as JSON."""
    script = "import json, warnings\nresult = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(result))\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_old_path_is_the_new_module_and_warns_once():
    result = fresh(f"""
        import importlib
        for old, new in {MOVED_MODULES!r}.items():
            with warnings.catch_warnings(record=True) as first:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            with warnings.catch_warnings(record=True) as again:
                warnings.simplefilter("always")
                importlib.import_module(old)
            deprecations = [str(w.message) for w in first if issubclass(w.category, DeprecationWarning)]
            result[old] = {{"same": module is importlib.import_module(new), "first": deprecations,
                           "again": len([w for w in again if issubclass(w.category, DeprecationWarning)])}}
    """)
    assert set(result) == set(MOVED_MODULES)
    for old, new in MOVED_MODULES.items():
        assert result[old]["same"], old
        assert len(result[old]["first"]) == 1 and new in result[old]["first"][0], (old, result[old]["first"])
        assert result[old]["again"] == 0, old


def test_the_old_spellings_users_write():
    result = fresh("""
        warnings.simplefilter("ignore", DeprecationWarning)
        import shardplan.memory
        import shardplan.fit
        from shardplan.memory import estimate_memory
        import shardplan.formulas.memory
        import shardplan.planning.fit
        result["estimate_memory"] = estimate_memory is shardplan.formulas.memory.estimate_memory
        result["fit.evaluate"] = shardplan.fit.evaluate is shardplan.planning.fit.evaluate
        result["memory module"] = shardplan.memory is shardplan.formulas.memory
        # one object: patching the old name patches the new
        shardplan.memory.PATCHED = 1
        result["patched"] = getattr(shardplan.formulas.memory, "PATCHED", None) == 1
    """)
    assert result == {"estimate_memory": True, "fit.evaluate": True, "memory module": True, "patched": True}


def test_sweep_pareto_minimum_gpus_are_the_functions():
    result = fresh("""
        import importlib, inspect, pkgutil
        import shardplan
        from shardplan import minimum_gpus, pareto, sweep
        result["before"] = [inspect.isfunction(f) for f in (sweep, pareto, minimum_gpus)]
        result["names"] = [sweep.__name__, pareto.__name__, minimum_gpus.__name__]
        # importing the modules that hold them (and every other module but the torch harness and
        # the script entry; shardplan.planning.grid_sweep among them) sets attributes on subpackages, never
        # replaces the function shardplan.sweep
        for info in pkgutil.walk_packages(shardplan.__path__, "shardplan."):
            if not info.name.startswith(("shardplan.calibrate", "shardplan.__main__")):
                importlib.import_module(info.name)
        result["after"] = [inspect.isfunction(shardplan.sweep), shardplan.sweep is sweep, shardplan.pareto is pareto,
                           shardplan.minimum_gpus is minimum_gpus]
    """)
    assert result["before"] == [True, True, True]
    assert result["names"] == ["sweep", "pareto", "minimum_gpus"]
    assert result["after"] == [True, True, True, True]


def test_importing_shardplan_does_not_load_the_sweep():
    # ``import shardplan`` stays cheap: the sweep (and pandas) load on first use of shardplan.sweep
    result = fresh("""
        import sys
        import shardplan
        result["pandas"] = "pandas" in sys.modules
    """)
    assert result == {"pandas": False}


@pytest.mark.parametrize("name", ["memory", "fit", "hardware", "report"])
def test_an_old_path_named_by_attribute_after_import(name):
    result = fresh(f"""
        warnings.simplefilter("ignore", DeprecationWarning)
        import importlib
        import shardplan
        module = importlib.import_module("shardplan.{name}")
        result["attribute"] = getattr(shardplan, "{name}") is module
    """)
    assert result == {"attribute": True}
