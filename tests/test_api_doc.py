"""The public API is the top-level names of ``shardplan`` (docs/api.md): each resolves, ``import
shardplan`` loads none of them, every example in docs/api.md runs on its own, and every Python
snippet in the README and docs/api.md imports only from the top level."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardplan
from tools.update_readme import blocks, run_python

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"
SNIPPETS = [(path.name, b) for path in (ROOT / "README.md", API) for b in blocks(path.read_text(encoding="utf-8"))
            if b.info == "python"]
API_SNIPPETS = [b for name, b in SNIPPETS if name == "api.md"]


def test_every_public_name_resolves():
    for name in shardplan.__all__:
        assert getattr(shardplan, name) is not None, name
    assert callable(shardplan.fit) and callable(shardplan.plan) and callable(shardplan.sweep)
    assert callable(shardplan.evaluate) and isinstance(shardplan.TrainingConfig(), shardplan.TrainingConfig)
    with pytest.raises(AttributeError):
        shardplan.not_a_name  # noqa: B018


def test_import_shardplan_loads_no_public_name():
    """``import shardplan`` stays cheap: none of numpy, pandas, pydantic until a name is used;
    then the issue's check works."""
    code = ("import sys, shardplan\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'pydantic') if m in sys.modules))\n"
            "shardplan.fit, shardplan.plan, shardplan.sweep, shardplan.evaluate\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout


def test_the_api_page_lists_every_public_name():
    listed = set(re.findall(r"^\| `(\w+)", API.read_text(encoding="utf-8"), re.MULTILINE))
    listed |= set(re.findall(r"^\| `\w+\(df\)`, `(\w+)", API.read_text(encoding="utf-8"), re.MULTILINE))
    public = set(shardplan.__all__) - {"__version__", "minimum_gpus", "ShardplanError"}  # deprecated / named in prose
    assert public <= listed, sorted(public - listed)
    assert listed <= set(shardplan.__all__), sorted(listed - set(shardplan.__all__))


def _deep_imports(code: str) -> list[str]:
    """Imports of anything but the top-level names: ``import shardplan.x``, ``from shardplan.x
    import ...`` and ``from shardplan import y`` for a y that is not public."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("shardplan.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardplan"):
            if node.module != "shardplan":
                out.append(node.module)
            else:
                out += [f"shardplan.{a.name}" for a in node.names if a.name not in shardplan.__all__]
    return out


@pytest.mark.parametrize("where, block", SNIPPETS, ids=[f"{w}:{b.line_number}" for w, b in SNIPPETS])
def test_snippets_use_top_level_names_only(where, block):
    assert _deep_imports("\n".join(block.lines)) == [], f"{where}:{block.line_number}"


def test_the_deep_import_check_catches_deep_imports():
    assert _deep_imports("from shardplan.planning.fit import fit") == ["shardplan.planning.fit"]
    assert _deep_imports("import shardplan.inputs.config as c") == ["shardplan.inputs.config"]
    assert _deep_imports("from shardplan import formulas") == ["shardplan.formulas"]
    assert _deep_imports("import shardplan\nfrom shardplan import fit, TrainingConfig") == []


@pytest.mark.parametrize("block", API_SNIPPETS, ids=[f"api.md:{b.line_number}" for b in API_SNIPPETS])
def test_api_example_runs_on_its_own(tmp_path, block):
    proc = run_python("\n".join(block.lines), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip(), f"docs/api.md:{block.line_number}: {proc.stderr[-2000:]}"


def _wrong_argument_errors():
    """Each public entry point called with one argument of the wrong type: the error's text."""
    spec, cluster = shardplan.resolve_model("llama-3.1-8b").spec, shardplan.parse_gpus("8xh100-sxm")
    config, workload = shardplan.TrainingConfig(), shardplan.resolve_workload(2048, 8)
    calls = {"evaluate spec": lambda: shardplan.evaluate("llama", cluster, config),
             "fit cluster": lambda: shardplan.fit(spec, "8xh100", config),
             "step_timing config": lambda: shardplan.step_timing(spec, cluster, {"strategy": "zero3"}),
             "evaluate_queries config": lambda: shardplan.evaluate_queries([(spec, cluster, "zero3")]),
             "plan base": lambda: shardplan.plan(spec, cluster, "zero3", workload),
             "plan workload": lambda: shardplan.plan(spec, cluster, config, "tokens")}
    out = {}
    for name, call in calls.items():
        with pytest.raises(shardplan.ShardplanError) as caught:
            call()
        out[name] = str(caught.value)
    return out


def test_a_wrong_argument_type_names_the_public_call_that_builds_it():
    """The hint in a wrong-type error is the call a user makes (``shardplan.X``), never a module path below it."""
    errors = _wrong_argument_errors()
    builds = {"spec": "shardplan.resolve_model(NAME).spec", "cluster": "shardplan.parse_gpus(",
              "config": "shardplan.TrainingConfig(...)", "base": "shardplan.TrainingConfig(...)",
              "workload": "shardplan.resolve_workload(...)"}
    for name, text in errors.items():
        assert builds[name.split()[-1]] in text, (name, text)
        assert not re.search(r"shardplan\.(inputs|formulas|planning|support)\.", text), (name, text)
