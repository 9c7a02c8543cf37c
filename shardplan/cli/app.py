"""The ``shardplan`` command: the typer app, its command families (one module each: fit_command,
plan_command, sweep_command, export_command, profile_commands; calibrate/cli.py) and ``main``,
which turns every user error into one line and exit code 2."""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

from shardplan.calibrate.cli import calibrate_app
from shardplan.cli.export_command import export_command
from shardplan.cli.fit_command import fit
from shardplan.cli.plan_command import plan_command
from shardplan.cli.profile_commands import hardware_app, models_app, profiles_app
from shardplan.cli.sweep_command import sweep_command
from shardplan.support.errors import ShardplanError

app = typer.Typer(add_completion=False, invoke_without_command=True,
                  help="Will it fit, how fast will it run, and which sharding strategy to use.")
app.add_typer(models_app, name="models")
app.add_typer(hardware_app, name="hardware")
app.add_typer(profiles_app, name="profiles")
app.add_typer(calibrate_app, name="calibrate", help="Measure real torch FSDP runs, collectives and matmuls; fit coefficients.")
app.command()(fit)
app.command("export")(export_command)
app.command("plan")(plan_command)
app.command("sweep")(sweep_command)


def _installed_version() -> str:
    """The installed distribution's version; the package's own ``__version__`` when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardplan")
    except PackageNotFoundError:
        from shardplan import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"shardplan {_installed_version()}")
        raise typer.Exit(0)


@app.callback()
def _top(ctx: typer.Context,
         version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="print 'shardplan X.Y.Z' and exit")):
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


def _one_line_validation(err: ValidationError) -> ShardplanError:
    from shardplan.support.errors import from_validation_error
    return from_validation_error(err)


# Exit code of an exception no handler expects: a bug in shardplan, never a user error (2). The
# fuzz test treats it as a failure; SHARDPLAN_TRACEBACK=1 shows the traceback for a report.
BUG_EXIT = 3


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print one line on stderr and exit 2, never a traceback."""
    try:
        # outside standalone mode click *returns* a command's typer.Exit code instead of raising it
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool) and code:
            return code
    except ShardplanError as err:
        typer.echo(f"shardplan: error: {err}", err=True)
        return 2
    except ValidationError as err:
        typer.echo(f"shardplan: error: {_one_line_validation(err)}", err=True)
        return 2
    except typer.Exit as err:
        return err.exit_code
    except typer.Abort:
        typer.echo("shardplan: aborted", err=True)
        return 130
    except Exception as err:
        return _unexpected(err)
    return 0


def _unexpected(err: Exception) -> int:
    """click's usage errors are user errors (exit 2); anything else is a bug: one line, exit 3."""
    # typer vendors its own click, so match by shape, not by class
    if not (hasattr(err, "format_message") and hasattr(err, "exit_code")):
        import os
        if os.environ.get("SHARDPLAN_TRACEBACK"):
            raise err
        try:
            first = (str(err).splitlines() or [""])[0][:200]
        except Exception:  # a message that cannot be formatted (e.g. a 5,000-digit int)
            first = ""
        typer.echo(f"shardplan: internal error (a bug; please report it with the command; "
                   f"SHARDPLAN_TRACEBACK=1 shows where): {type(err).__name__}: {first}", err=True)
        return BUG_EXIT
    message = err.format_message()
    negative = "No such option: -" in message and "No such option: --" not in message
    hint = " (put '--' before a query that starts with '-')" if negative else ""
    typer.echo(f"shardplan: error: {message}{hint}", err=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
