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


# Modules fit needs only for some inputs: none may load for a bare size on a GPU capacity.
NOT_FOR_THIS_QUERY = ("shardplan.inputs.hf_config",       # a model given as a path (config.json)
                      "shardplan.inputs.model_names")     # a model given as a name (its spellings)


def test_a_fit_of_a_size_loads_no_path_reader_or_name_rules():
    loaded = _loaded_after("import contextlib, io\nfrom shardplan.cli.app import main\n"
                           "with contextlib.redirect_stdout(io.StringIO()):\n"
                           "    assert main(['fit', '70B on 4x24GB']) == 0")
    assert "shardplan.inputs.models" in loaded
    for name in NOT_FOR_THIS_QUERY:
        assert name not in loaded, name
    named = _loaded_after("import contextlib, io\nfrom shardplan.cli.app import main\n"
                          "with contextlib.redirect_stdout(io.StringIO()):\n"
                          "    assert main(['fit', 'meta-llama/Meta-Llama-3.1-8B-Instruct on 4x24GB']) == 0")
    assert "shardplan.inputs.model_names" in named and "shardplan.inputs.hf_config" not in named


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


# --- the catalogues' index ----------------------------------------------------------------------

def test_the_shipped_profile_index_is_current():
    from shardplan.inputs.profile_index import INDEX_PATH, build_index

    assert json.loads(INDEX_PATH.read_text()) == json.loads(json.dumps(build_index())), \
        "a profile or model.py changed: run python -m shardplan.inputs.profile_index"


def test_a_fit_process_validates_only_the_profiles_it_names():
    code = ("import contextlib, io\nimport shardplan.inputs.profiles as profiles\nread = []\n"
            "validate = profiles.load_profile\n"
            "profiles.load_profile = lambda path, model: read.append(str(path)) or validate(path, model)\n"
            "from shardplan.cli.app import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['fit', '70B on 4x24GB']) == 0\n"
            "print(json.dumps([p for p in read if '_profiles' in p]))")
    script = f"import json\n{code}"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    read = sorted(Path(p).relative_to(ROOT / "shardplan" / "data").as_posix() for p in json.loads(done.stdout))
    # the model, the GPU '24GB' stands for, its two links, and the stack and engine declarations
    profiles = [p for p in read if p.startswith(("model_profiles", "hardware_profiles"))]
    assert profiles == ["hardware_profiles/gpus/rtx4090.json", "hardware_profiles/links/eth-100g.json",
                        "hardware_profiles/links/pcie4-nop2p.json", "model_profiles/llama-3.1-70b.json"]


def _without_index(monkeypatch):
    """The catalogues as they are without the shipped index: every profile validated."""
    from shardplan.inputs import profile_index

    monkeypatch.setattr(profile_index, "_read_index", lambda kind: None)
    _forget(profile_index)


def _forget(profile_index) -> None:
    profile_index._entries.cache_clear()
    profile_index._by_name.cache_clear()


def _lookups() -> dict:
    """What every name, alias and bare size of a model, and every GPU string form, resolves to."""
    from shardplan.inputs.hardware import gpu_profiles, link_profiles, parse_gpus
    from shardplan.inputs.models import model_profiles, resolve_model
    from shardplan.inputs.query import parse_query

    words = [n for s in model_profiles() for n in (s.name, s.display_name, *s.aliases) if n]
    words += [f"{size}{unit}" for size in (0.1, 0.35, 1, 1.3, 3, 7, 8, 13, 30, 34, 70, 72, 175, 400, 405, 700)
              for unit in "MBT"]
    gpus = [f"8x{n}" for g in gpu_profiles() for n in (g.name, *g.aliases)]
    gpus += [f"4x{gb}GB" for gb in (8, 16, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144, 180, 192, 256, 288)]
    links = [link.name for link in link_profiles()]
    out = {}
    for kind, text, answer in ([("model", w, lambda w=w: resolve_model(w)) for w in words]
                               + [("gpus", g, lambda g=g: parse_gpus(g)) for g in gpus]
                               + [("link", n, lambda n=n: parse_gpus("2x8xh100-sxm", inter_link=n)) for n in links]
                               + [("query", g, lambda g=g: parse_query(f"8B on {g} seq 2048")) for g in gpus[:40]]):
        try:
            out[kind, text] = answer()
        except Exception as err:  # a size or capacity no profile stands for: the same one-line error both ways
            out[kind, text] = str(err)
    return out


def test_the_index_finds_what_reading_every_profile_finds(monkeypatch):
    from shardplan.inputs import profile_index

    _forget(profile_index)
    assert all(profile_index._read_index(kind) is not None for kind in profile_index.KINDS)  # the index is used
    indexed = _lookups()
    _without_index(monkeypatch)
    try:
        assert _lookups() == indexed
    finally:
        _forget(profile_index)


def test_an_index_of_other_files_is_not_used(tmp_path, monkeypatch):
    from shardplan.inputs import profile_index

    index = json.loads(profile_index.INDEX_PATH.read_text())
    index["model_profiles"]["sources"]["llama-3.1-70b.json"] = "0" * 64  # as if the profile had been edited since
    stale = tmp_path / "profile_index.json"
    stale.write_text(json.dumps(index))
    monkeypatch.setattr(profile_index, "INDEX_PATH", stale)
    profile_index._shipped.cache_clear()
    try:
        assert profile_index._read_index("model_profiles") is None
        assert profile_index._read_index("hardware_profiles/gpus") is not None  # each kind on its own files
        stale.write_text("{not json")
        profile_index._shipped.cache_clear()
        assert all(profile_index._read_index(kind) is None for kind in profile_index.KINDS)
        monkeypatch.setattr(profile_index, "INDEX_PATH", profile_index.DATA_DIR / "profile_index.json")
        monkeypatch.setattr(profile_index, "PACKAGE", tmp_path)  # no model.py source to check the counts against
        profile_index._shipped.cache_clear()
        assert profile_index._read_index("model_profiles") is None
        assert profile_index._read_index("hardware_profiles/links") is not None
    finally:
        profile_index._shipped.cache_clear()


def test_profiles_validate_reads_the_index(tmp_path):
    from shardplan.inputs.profile_index import INDEX_PATH
    from tests.helpers import run_cli

    index = json.loads(INDEX_PATH.read_text())
    count = sum(len(kind["entries"]) for kind in index.values())
    assert run_cli("profiles", "validate", str(INDEX_PATH)).stdout.strip().endswith(f"ok (profile index, {count} profiles)")
    index["model_profiles"]["sources"]["inputs/model.py"] = "0" * 64
    (tmp_path / "stale.json").write_text(json.dumps(index))
    assert "model_profiles not of the files on disk" in run_cli("profiles", "validate", str(tmp_path / "stale.json")).stdout
    index["model_profiles"]["entries"][0].pop("facts")
    (tmp_path / "bad.json").write_text(json.dumps(index))
    bad = run_cli("profiles", "validate", str(tmp_path / "bad.json"))
    assert bad.exit_code == 2 and "bad.json: entries" in bad.stderr and "not a profile index" in bad.stderr
