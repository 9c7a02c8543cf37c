"""The layering docs/architecture.md states is checked by tools, in the suite as in .ci/run:
``lint-imports`` (the import contracts in pyproject.toml) and ``ruff check`` (ruff.toml) pass, and
the contracts themselves are the ones the architecture states: removing or loosening one fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = {c["id"]: c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}

# Highest first: a layer may import the layers below it, never one above.
LAYERS = ["shardplan.cli", "shardplan.calibrate | (shardplan.validation)", "shardplan.export", "shardplan.exporters",
          "shardplan.planning", "shardplan.formulas", "shardplan.inputs", "shardplan.support"]
LIBRARY = {"shardplan.support", "shardplan.inputs", "shardplan.formulas", "shardplan.planning", "shardplan.exporters",
           "shardplan.export", "shardplan.cli"}


def _run(*command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_import_contracts_hold():
    proc = _run(sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                                      "sys.exit(lint_imports_command())")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in proc.stdout


def test_ruff_check_passes():
    proc = _run(sys.executable, "-m", "ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_contracts_are_the_architectures():
    layers = CONTRACTS["layers"]
    assert layers["type"] == "layers" and layers["layers"] == LAYERS and not layers.get("ignore_imports")
    cycles = CONTRACTS["no-cycles"]
    assert cycles["type"] == "acyclic_siblings" and cycles["ancestors"] == ["shardplan"]
    assert not cycles.get("skip_descendants") and not cycles.get("ignore_imports")  # every module of shardplan
    torch = CONTRACTS["torch-in-calibrate-only"]
    assert torch["type"] == "forbidden" and torch["forbidden_modules"] == ["torch"]
    assert set(torch["source_modules"]) == LIBRARY and not torch.get("ignore_imports")
    io = CONTRACTS["formulas-do-no-io"]
    assert io["type"] == "forbidden" and io["source_modules"] == ["shardplan.formulas"]
    assert {"json", "pathlib", "io", "os", "importlib"} <= set(io["forbidden_modules"])
    assert io.get("ignore_imports", []) == ["shardplan.formulas.accuracy_bands -> pathlib"]


def test_ruff_checks_what_it_says():
    config = tomllib.loads((ROOT / "ruff.toml").read_text())
    assert {"E", "W", "F", "I"} <= set(config["lint"]["select"]) and config["line-length"] <= 160
    assert config["lint"]["isort"]["known-first-party"] == ["shardplan"]
    assert set(config["lint"].get("ignore", [])) <= {"E731", "E741"}


def _reductions_to_one_truth(tree) -> list[int]:
    """Lines calling ``np.any`` / ``np.all`` (or a ``.any()`` / ``.all()`` method): the only way a
    formula can turn rows' values into one Python bool to branch on."""
    import ast

    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("any", "all")]


def test_formulas_never_reduce_rows_to_a_python_bool():
    """docs/architecture.md principle 2: no formula branches in Python on the rows' values. The one
    reduction allowed is the overflow guard of a single query (``overflow.check_one``), which raises
    an error rather than choosing a computation."""
    import ast

    found = {path.name: _reductions_to_one_truth(ast.parse(path.read_text()))
             for path in sorted((ROOT / "shardplan" / "formulas").glob("*.py"))}
    found = {name: lines for name, lines in found.items() if lines}
    assert list(found) == ["overflow.py"] and len(found["overflow.py"]) == 1, found
