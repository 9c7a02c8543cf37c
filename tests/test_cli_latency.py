"""What ``shardplan fit`` loads, pinned by module (not by time, which depends on the machine):
importing the CLI loads no command family, and a fit process loads only what fit uses
(benchmarks/query_latency.py times it beside the dependency floor)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Modules that only other commands use: none may load on fit's path.
NOT_FOR_FIT = ("pandas", "torch", "yaml", "transformers", "shardplan.cli.plan_command", "shardplan.cli.sweep_command",
               "shardplan.cli.export_command", "shardplan.cli.profile_commands", "shardplan.calibrate.cli",
               "shardplan.planning.planner", "shardplan.planning.grid_sweep", "shardplan.export")


def _loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (in the checkout, not an install)."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_importing_the_cli_loads_no_command_and_no_heavy_dependency():
    loaded = _loaded_after("import shardplan.cli.app")
    for name in ("tabulate", "pandas", "numpy", "shardplan.cli.fit_command", *NOT_FOR_FIT):
        assert name not in loaded, name


def test_a_fit_process_loads_only_what_fit_uses():
    loaded = _loaded_after("import contextlib, io\nfrom shardplan.cli.app import main\n"
                           "with contextlib.redirect_stdout(io.StringIO()):\n"
                           "    assert main(['fit', '70B on 4x24GB']) == 0")
    assert "shardplan.cli.fit_command" in loaded and "tabulate" in loaded  # it ran, and rendered its tables
    for name in NOT_FOR_FIT:
        assert name not in loaded, name


def test_one_command_app_parses_as_the_whole_app():
    """``main`` registers only the command it runs: its help (every option) and its errors are the whole app's."""
    import typer
    from typer.testing import CliRunner

    from shardplan.cli.app import COMMANDS, GROUPS, app, build_app

    assert list(typer.main.get_command(app).commands) == [*COMMANDS, *GROUPS]
    for name in (*COMMANDS, *GROUPS):
        alone = build_app(name)
        assert list(typer.main.get_command(alone).commands) == [name]
        for args in ([name, "--help"], [name, "--no-such-option"]):
            whole_run, alone_run = CliRunner().invoke(app, args), CliRunner().invoke(alone, args)
            assert f" {name} " in whole_run.output  # the usage line names the command
            assert (alone_run.exit_code, alone_run.output) == (whole_run.exit_code, whole_run.output), args


# --- the model catalogue's index ------------------------------------------------------------------

def test_the_shipped_model_index_is_current():
    from shardplan.inputs.model_index import INDEX_PATH, build_index

    assert json.loads(INDEX_PATH.read_text()) == json.loads(json.dumps(build_index())), \
        "a model profile or model.py changed: run python -m shardplan.inputs.model_index"


def test_a_fit_process_validates_only_the_model_profile_it_names():
    code = ("import contextlib, io\nimport shardplan.inputs.profiles as profiles\nread = []\n"
            "validate = profiles.load_profile\n"
            "profiles.load_profile = lambda path, model: read.append(str(path)) or validate(path, model)\n"
            "from shardplan.cli.app import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['fit', '70B on 4x24GB']) == 0\n"
            "print(json.dumps([p for p in read if 'model_profiles' in p]))")
    script = f"import json\n{code}"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    assert [Path(p).name for p in json.loads(done.stdout)] == ["llama-3.1-70b.json"]


def _without_index(monkeypatch):
    """The catalogue as it is without the shipped index: every profile validated."""
    from shardplan.inputs import model_index

    monkeypatch.setattr(model_index, "_read_index", lambda: None)
    model_index._entries.cache_clear()


def test_the_index_finds_what_reading_every_profile_finds(monkeypatch):
    from shardplan.inputs import model_index
    from shardplan.inputs.models import model_profiles, resolve_model

    words = [n for s in model_profiles() for n in (s.name, s.display_name, *s.aliases) if n]
    words += [f"{size}{unit}" for size in (0.1, 0.35, 1, 1.3, 3, 7, 8, 13, 30, 34, 70, 72, 175, 400, 405, 700)
              for unit in "MBT"]

    def answers():
        out = {}
        for word in words:
            try:
                r = resolve_model(word)
                out[word] = (r.spec, r.how, r.hf_id)
            except Exception as err:  # a size no profile stands for: the same one-line error both ways
                out[word] = str(err)
        return out

    model_index._entries.cache_clear()
    assert model_index._read_index() is not None  # the shipped index is used
    indexed = answers()
    _without_index(monkeypatch)
    try:
        assert answers() == indexed
    finally:
        model_index._entries.cache_clear()


def test_an_index_of_other_files_is_not_used(tmp_path, monkeypatch):
    from shardplan.inputs import model_index

    index = json.loads(model_index.INDEX_PATH.read_text())
    index["sources"]["llama-3.1-70b.json"] = "0" * 64  # as if the profile had been edited since
    stale = tmp_path / "model_index.json"
    stale.write_text(json.dumps(index))
    monkeypatch.setattr(model_index, "INDEX_PATH", stale)
    assert model_index._read_index() is None
    stale.write_text("{not json")
    assert model_index._read_index() is None


def test_profiles_validate_reads_the_index(tmp_path):
    from tests.helpers import run_cli
    from shardplan.inputs.model_index import INDEX_PATH

    assert run_cli("profiles", "validate", str(INDEX_PATH)).stdout.strip().endswith("ok (model index, "
                                                                                   f"{len(json.loads(INDEX_PATH.read_text())['entries'])} profiles)")
    index = json.loads(INDEX_PATH.read_text())
    index["sources"]["model.py"] = "0" * 64
    (tmp_path / "stale.json").write_text(json.dumps(index))
    assert "not of the profiles on disk" in run_cli("profiles", "validate", str(tmp_path / "stale.json")).stdout
    index["entries"][0]["params"] = index["entries"][0].pop("total_params")
    (tmp_path / "bad.json").write_text(json.dumps(index))
    bad = run_cli("profiles", "validate", str(tmp_path / "bad.json"))
    assert bad.exit_code == 2 and "bad.json: entries" in bad.stderr and "not a model index" in bad.stderr
