"""``shardplan export``, and the ``--export`` option of fit: a plan as a framework's config or code."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shardplan.support.output_path import FORCE_OUTPUT_HELP


def export_results(plans: list[dict], fmt_path: str, index: Optional[int], block_class: Optional[str] = None,
                   path_field: str = "export", force: bool = False) -> None:
    """``--export FORMAT[=PATH]``: write the chosen plan's export atomically, or to stdout."""
    from shardplan.export import export_chosen, export_option
    from shardplan.support.atomic_write import write_text_atomic

    fmt, path = export_option(fmt_path, path_field, force)
    text, _, note = export_chosen(plans, fmt, index, block_class)
    if note:
        typer.echo(f"note: {note}", err=True)
    if path is None:
        typer.echo(text, nl=False)
    else:
        write_text_atomic(path, text, force=force)
        typer.echo(f"wrote {fmt} export to {path}", err=True)


def export_command(
    plan: str = typer.Argument(..., help="JSON from `shardplan fit --json` or `shardplan plan --json` ('-' = stdin)"),
    to: str = typer.Option(..., "--to", "-t", help="fsdp2, fsdp1, accelerate, deepspeed, trainer, torchrun"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="file to write (atomically); stdout when omitted"),
    index: Optional[int] = typer.Option(None, help="which plan of a list (default: the first that fits)"),
    block_class: Optional[str] = typer.Option(None, help="transformer block class to wrap, when the model profile has none"),
    force: bool = typer.Option(False, "--force", help=FORCE_OUTPUT_HELP),
):
    """Write a plan as the config or code a framework expects."""
    from shardplan.export import load_plans

    export_results(load_plans(plan), f"{to}={output}" if output else to, index, block_class, path_field="output",
                   force=force)
