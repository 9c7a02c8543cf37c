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
