"""``shardplan sweep``: the product of every listed value, one row each, written to a file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shardplan.cli.options import STACK_HELP
from shardplan.inputs.vocabulary import help_text as vocab_help
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_AXIS_VALUES, MAX_SWEEP_CONFIGURATIONS
from shardplan.support.output_path import FORCE_OUTPUT_HELP

# sweep option -> whether it lists integers ('1,2,8' or '1-8') rather than names
LIST_OPTIONS = {"models": False, "gpus": False, "gpu_counts": True, "nodes": True, "strategies": False, "engines": False,
                "method": False, "lora_rank": True, "precision": False, "optimizer": False, "ac": False,
                "offload": False, "micro_batch": True, "seq_len": True, "grad_accum": True, "stack": False}


def sweep_list(text: Optional[str], field: str, integers: bool = False):
    """'a,b,c' -> list; for integers also 'lo-hi' (inclusive). None -> None (the default)."""
    if text is None:
        return None
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ShardplanError(field, text, "empty list")
    if not integers:
        return items
    from shardplan.support.limits import checked_int

    values: list[int] = []
    for item in items:
        lo, sep, hi = item.partition("-")
        if not (lo.strip().isdigit() and (not sep or hi.strip().isdigit())):
            raise ShardplanError(field, item, "expected integers like '1,2,8' or a range '1-8'")
        first, last = (checked_int(field, lo), checked_int(field, hi)) if sep else (checked_int(field, item),) * 2
        if last < first:
            raise ShardplanError(field, item, "an empty range: write 'lo-hi' with lo <= hi")
        if last - first + 1 + len(values) > MAX_AXIS_VALUES:  # measured before the list is built
            raise ShardplanError(field, text, f"lists {max(last - first + 1, 0) + len(values):,} values; a sweep axis "
                                              f"holds at most {MAX_AXIS_VALUES:,}")
        values += range(first, last + 1)
    return values


def sweep_command(
    output: Path = typer.Option(..., "--output", "-o", help="file to write: .csv, or .parquet (needs pyarrow)"),
    models: str = typer.Option("llama-3.1-8b", help="comma-separated model names or sizes"),
    gpus: str = typer.Option("h100-sxm", help="comma-separated GPU profiles or capacities ('24GB')"),
    gpu_counts: str = typer.Option("8", help="total GPU counts: '1,2,4,8' or '1-8'"),
    nodes: Optional[str] = typer.Option(None, help="node counts to spread the GPUs over (default: the GPU's usual node size)"),
    strategies: Optional[str] = typer.Option(None, help="comma-separated " + vocab_help("strategy", None, "all when omitted")),
    engines: str = typer.Option("fsdp2", help="comma-separated " + vocab_help("engine")),
    method: str = typer.Option("full", help="comma-separated " + vocab_help("method")),
    lora_rank: str = typer.Option("16"),
    precision: str = typer.Option("bf16-mixed", help="comma-separated " + vocab_help("precision")),
    optimizer: str = typer.Option("adamw", help="comma-separated " + vocab_help("optimizer")),
    ac: str = typer.Option("none", help="comma-separated " + vocab_help("ac")),
    offload: str = typer.Option("none", help="comma-separated " + vocab_help("offload")),
    micro_batch: str = typer.Option("1"),
    seq_len: str = typer.Option("1024"),
    grad_accum: str = typer.Option("1"),
    stack: str = typer.Option("hf", help="comma-separated training stacks (a 'stack' column): " + STACK_HELP),
    columns: str = typer.Option("all", help="'all', 'summary', or comma-separated column names"),
    valid_only: bool = typer.Option(False, help="drop combinations the frameworks cannot express"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="stderr progress bar (default: on a terminal)"),
    force: bool = typer.Option(False, "--force", help=FORCE_OUTPUT_HELP),
    max_configurations: int = typer.Option(MAX_SWEEP_CONFIGURATIONS, help="the most rows one sweep evaluates (held "
                                           "in memory, ~765 B each with all columns); a larger product is refused "
                                           "with its count"),
):
    """Evaluate the product of every listed value; one row per configuration, written atomically."""
    run_sweep_command(dict(locals()))  # the options as typer parsed them, by name


def run_sweep_command(args: dict) -> None:
    """``sweep``'s work: check the output, evaluate, write atomically, report the rate."""
    import time

    from shardplan.planning.grid_sweep import sweep
    from shardplan.support.progress import progress_bar

    output = _checked_output(args["output"], args["force"])
    t0 = time.perf_counter()
    df = sweep(**{name: sweep_list(args[name], name, integers) for name, integers in LIST_OPTIONS.items()},
               columns=args["columns"], valid_only=args["valid_only"], progress=progress_bar(args["progress"]),
               max_configurations=args["max_configurations"])
    elapsed = time.perf_counter() - t0
    _write(df, output, args["force"])
    for note in df.attrs.get("notes", []):
        typer.echo(f"note: {note} (rows marked valid=False)", err=True)
    typer.echo(f"wrote {len(df):,} rows x {len(df.columns)} columns to {output} "
               f"({elapsed:.2f} s to evaluate, {len(df) / max(elapsed, 1e-9):,.0f} configurations/s)")


def _checked_output(output: Path, force: bool) -> Path:
    """A .csv or .parquet path that can be written (checked before the sweep runs)."""
    from shardplan.support.extras import require
    from shardplan.support.output_path import writable_output

    suffix = output.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise ShardplanError("output", str(output), "use a .csv or .parquet file name")
    writable_output(output, "output", force)
    if suffix == ".parquet":
        require("pyarrow", "parquet")
    return output


def _write(df, output: Path, force: bool) -> None:
    """The DataFrame to ``output``, atomically (a reader never sees a half-written file)."""
    from shardplan.support.atomic_write import atomic_path

    with atomic_path(output, force=force) as tmp:
        if output.suffix.lower() == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
