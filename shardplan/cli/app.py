"""The ``shardplan`` command: the typer app, its command families (one module each: fit_command,
plan_command, sweep_command, export_command, profile_commands; calibrate/cli.py) and ``main``,
which turns every user error into one line and exit code 2.

A command family's module is imported only when it runs (or when the whole app is asked for, as
``--help`` does): ``main`` registers the one command the arguments name, so ``shardplan fit``
neither imports nor builds ``plan``, ``sweep``, ``export``, the profile commands or calibrate.
"""

from __future__ import annotations

import functools
import importlib
import sys

import typer
from pydantic import ValidationError

from shardplan.support.errors import ShardplanError

# The app's commands in the order ``--help`` lists them: name -> (module, function). A command's
# module is imported when the command is registered.
COMMANDS = {
    "fit": ("shardplan.cli.fit_command", "fit"),
    "export": ("shardplan.cli.export_command", "export_command"),
    "plan": ("shardplan.cli.plan_command", "plan_command"),
    "sweep": ("shardplan.cli.sweep_command", "sweep_command"),
    "accuracy": ("shardplan.cli.accuracy_command", "accuracy_command"),
}
# Sub-apps: name -> (module, typer app, help shown in the parent's list; None: the sub-app's own)
GROUPS = {
    "models": ("shardplan.cli.profile_commands", "models_app", None),
    "hardware": ("shardplan.cli.profile_commands", "hardware_app", None),
    "profiles": ("shardplan.cli.profile_commands", "profiles_app", None),
    "calibrate": ("shardplan.calibrate.cli", "calibrate_app",
                  "Measure real torch FSDP runs, collectives and matmuls; fit coefficients."),
}
APP_HELP = "Will it fit, how fast will it run, and which sharding strategy to use."


class HelpInOutputPanel(typer.core.TyperCommand):
    """A command whose options have an "Output" panel lists ``--help`` there rather than in a panel
    of its own: three lines fewer, so ``fit --help`` stays within 80 lines (issue 22 item 11)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None and any(getattr(p, "rich_help_panel", None) == "Output" for p in self.params):
            option.rich_help_panel = "Output"
        return option


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with only the command or sub-app named ``only`` (what
    one invocation of it needs: its options, help and errors are the same as in the whole app)."""
    app = typer.Typer(add_completion=False, invoke_without_command=True, help=APP_HELP)
    for name, (module, attribute, help_text) in GROUPS.items():
        if only in (None, name):
            sub = getattr(importlib.import_module(module), attribute)
            app.add_typer(sub, name=name, **({"help": help_text} if help_text else {}))
    for name, (module, attribute) in COMMANDS.items():
        if only in (None, name):
            app.command(name, cls=HelpInOutputPanel)(getattr(importlib.import_module(module), attribute))
    app.callback()(_top)
    return app


@functools.lru_cache(maxsize=1)
def whole_app() -> typer.Typer:
    """Every command (``--help`` lists them all); built once."""
    return build_app()


def __getattr__(name: str):
    """``app``: the whole typer app, built on first use (``from shardplan.cli.app import app``)."""
    if name == "app":
        return whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def app_for(args: list[str]) -> typer.Typer:
    """The app that runs ``args``: only the command its first word names, else the whole app
    (top-level options, help, or a word that names no command, which the whole app reports)."""
    first = args[0] if args else None
    return build_app(first) if first in COMMANDS or first in GROUPS else whole_app()


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
    if argv is None:  # the ``shardplan`` script (in-process callers keep their own signal handlers and streams)
        _process_setup()
    try:
        args = sys.argv[1:] if argv is None else list(argv)
        from shardplan.calibrate import install_module_tree_reader
        install_module_tree_reader()  # a config.json of a model_type no family reader knows: its module tree
        app = app_for(args)
        from shardplan.cli.options import check_repeated_options
        check_repeated_options(typer.main.get_command(app), args)  # '--seq-len' twice: an error, not last-one-wins
        # outside standalone mode click *returns* a command's typer.Exit code instead of raising it
        code = app(args=args, standalone_mode=False)
        _flush_stdout()  # a full disk or a closed pipe is met here, not at interpreter exit
        if isinstance(code, int) and not isinstance(code, bool) and code:
            return code
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as exc:
        # click and rich (help text) meet a closed pipe themselves and exit 1 while handling it
        if exc.code == 1 and isinstance(exc.__context__, OSError) and _is_output_error(exc.__context__):
            return _reader_gone()
        raise
    except OSError as err:
        if not _is_output_error(err):
            return _unexpected(err)
        _report(ShardplanError("output", "standard output", f"cannot write: {err.strerror or err}"))
        return _silence_stdout(2)
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


def _process_setup() -> None:
    """What the process owes its caller whatever the command: SIGTERM ends it as SystemExit (so an
    atomic write under way removes its temporary file, support/atomic_write.py), and text a
    terminal's encoding cannot show (``✗``, ``≈`` under PYTHONIOENCODING=latin-1) is written as
    '?' instead of failing the whole answer."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGTERM, _terminated)
        except (ValueError, OSError):  # not settable here (an embedded interpreter)
            pass
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "").replace("_", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _is_output_error(err: OSError) -> bool:
    """An OSError from writing the answer: no space (``> /dev/full``), an I/O error, a closed descriptor."""
    import errno

    return err.errno in (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EPIPE, errno.EDQUOT)


def _reader_gone() -> int:
    """``shardplan ... | head -1``: the reader left; nothing is wrong with the answer. Exit 0 quietly."""
    return _silence_stdout(0)


def _silence_stdout(code: int) -> int:
    """Point stdout at /dev/null so the interpreter's final flush of what is still buffered does not
    fail a second time ('Exception ignored ... BrokenPipeError', exit 120)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):  # no real descriptor (tests' StringIO): nothing buffered there
        pass
    return code


def _report(err: ShardplanError) -> None:
    try:
        typer.echo(f"shardplan: error: {err}", err=True)
    except OSError:  # stderr gone too: the exit code is all that is left
        pass


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
