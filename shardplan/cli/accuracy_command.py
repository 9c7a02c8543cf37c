"""``shardplan accuracy [CSV]``: the accuracy report over a runs CSV (by default the published
development set shipped with the tests), through fit's own path: peak memory, then tokens/s (issue
23 item 4: one report), every prediction out of source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

DEFAULT_RUNS = Path("tests/data/published_runs/runs.csv")


def accuracy_command(
    runs: Optional[Path] = typer.Argument(None, help="runs CSV with the columns of tests/data/published_runs/runs.csv "
                                                     "(default: that file, from a checkout)"),
    as_json: bool = typer.Option(False, "--json", help="the report as JSON"),
    rows: bool = typer.Option(False, "--rows", help="also list every row's prediction, error and verdict"),
) -> None:
    """Predicted vs measured peak memory per counter class, source and stack, false fits and false OOMs;
    then tokens/s per regime, source, GPU family and class."""
    from shardplan.support.errors import ShardplanError
    from shardplan.validation import accuracy, tokens
    from shardplan.validation.runs import read_runs

    path = runs or DEFAULT_RUNS
    if not path.is_file():
        raise ShardplanError("runs", str(path), "no such file (give a runs CSV; the default exists in a checkout)")
    rows_read = read_runs(path)
    judged, bands_of = accuracy.judge_out_of_source(rows_read)
    data = accuracy.report(judged, bands_of)
    # the tokens/s rows are fitted on the development set: read again only when the CSV is another
    timed = tokens.csv_rows(rows_read, rows_read if path.resolve() == tokens.RUNS else None)
    if as_json:
        typer.echo(json.dumps({**data, "tokens": tokens.report_data(timed)}, indent=1, default=float))
        return
    typer.echo(accuracy.render(data, f"shardplan accuracy {runs or ''}".strip()))
    if rows:
        typer.echo(accuracy.render_rows(judged))
    typer.echo("\n## Tokens/s\n\n" + "\n".join(tokens.report_lines(timed)))
