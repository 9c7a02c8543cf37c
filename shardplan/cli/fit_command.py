"""``shardplan fit``: will one configuration fit, strategy by strategy, and what would make it fit."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shardplan.cli.options import FORCE_HELP, WIDE_HELP, cluster_of, stated, with_stack_knobs
from shardplan.inputs.query import parse_query
from shardplan.inputs.vocabulary import help_text as vocab_help
from shardplan.support.errors import ShardplanError

# The knobs fit takes from its options or the query's words (the rest are TrainingConfig's / the stack's)
FIT_KNOBS = ("engine", "method", "lora_rank", "lora_targets", "precision", "optimizer", "ac", "ac_every_k", "offload",
             "seq_len", "micro_batch", "grad_accum", "shard_group_size", "attention", "reduce_dtype", "stack",
             "ce_chunks", "optimizer_in_backward", "activation_offload", "paged_optimizer", "fp32_master",
             "quant_format", "expandable_segments", "checkpoint_wrapper", "use_cache", "kbit_prep", "fused_lm_head", "load_mode",
             "optimizer_impl", "quant_buffers_sharded", "compile")


@with_stack_knobs(after="shard_group_size")
def fit(
    query: Optional[str] = typer.Argument(None, help="MODEL on [COUNTx]GPU [words], e.g. '70B on 4x24GB qlora seq 4096'"),
    model: Optional[str] = typer.Option(None, "--model", "-m", rich_help_panel='What to ask', help="profile name, HF config.json path, or a size like '70B'"),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g", rich_help_panel='What to ask', help="'4x24GB', '8xh100-sxm', '2x8xa100-80gb'"),
    strategy: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("strategy", "all")),
    engine: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("engine", "fsdp2")),
    method: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("method", "full")),
    lora_rank: Optional[int] = typer.Option(None, rich_help_panel='Training', help="LoRA rank (default 16)"),
    lora_targets: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("lora_targets", "all-linear, or the stack's")),
    precision: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("precision", "the stack's")),
    optimizer: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("optimizer", "adamw, or the stack's")),
    ac: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("ac", "none, or the stack's")),
    ac_every_k: Optional[int] = typer.Option(None, rich_help_panel='Training', help="with --ac every-k: checkpoint every k-th block"),
    offload: Optional[str] = typer.Option(None, rich_help_panel='Training', help=vocab_help("offload", "none")),
    seq_len: Optional[int] = typer.Option(None, rich_help_panel='Training', help="sequence length (default 1024)"),
    micro_batch: Optional[int] = typer.Option(None, rich_help_panel='Training', help="micro-batch per GPU (default 1)"),
    grad_accum: Optional[int] = typer.Option(None, rich_help_panel='Training', help="gradient accumulation steps (default 1)"),
    shard_group_size: Optional[int] = typer.Option(None, rich_help_panel='Training', help="HSDP shard group size (default GPUs per node)"),
    host_ram: Optional[str] = typer.Option(None, rich_help_panel='Cluster and time', help="host RAM per node, e.g. '512GB'"),
    intra_link: Optional[str] = typer.Option(None, rich_help_panel='Cluster and time', help="intra-node link profile (default: the GPU's)"),
    inter_link: Optional[str] = typer.Option(None, rich_help_panel='Cluster and time', help="inter-node link profile (default: the GPU's)"),
    global_batch_tokens: Optional[str] = typer.Option(None, rich_help_panel='Cluster and time', help="global batch in tokens ('1M'): adds time, MFU"),
    calibration: Optional[Path] = typer.Option(None, rich_help_panel='Cluster and time', help="calibration overlay JSON (shardplan calibrate)"),
    as_json: bool = typer.Option(False, "--json", rich_help_panel='Output', help="print JSON (a list when no --strategy)"),
    wide: bool = typer.Option(False, "--wide", rich_help_panel='Output', help=WIDE_HELP),
    detail: bool = typer.Option(False, "--detail", rich_help_panel='Output', help="a no-fit answer in full (every term)"),
    export_to: Optional[str] = typer.Option(None, "--export", rich_help_panel='Output', help="export the first fit: FORMAT[=PATH] (docs/export.md)"),
    force: bool = typer.Option(False, "--force", rich_help_panel='Output', help=FORCE_HELP),
    check: bool = typer.Option(False, "--check", rich_help_panel='Output', help="exit 1 unless a strategy fits ('tight' does not)"),
    **stack_knobs,
):
    """Will it fit? Per-GPU memory, term by term, for one strategy or all of them."""
    args = dict(locals())
    run_fit({**args.pop("stack_knobs"), **args})  # the options as typer parsed them, by name


def run_fit(args: dict) -> None:
    """``fit``'s work: resolve the query, evaluate every strategy, render (and export)."""
    from shardplan.formulas.accuracy_bands import load_bands
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.hardware import cluster_notes
    from shardplan.inputs.stacks import adapt_precision
    from shardplan.planning.fit import fit as fit_strategies

    if args["export_to"]:  # FORMAT[=PATH] checked before any evaluation, not after the report
        from shardplan.export import export_option
        export_option(args["export_to"], "export", args["force"])
    parsed = parse_query(args["query"]) if args["query"] else None
    q = parsed.options if parsed else {}
    resolved, cluster, countless = _model_and_cluster(args, parsed)
    # an option beats the query's word; what neither gives takes TrainingConfig's default
    config, precision_notes = adapt_precision(TrainingConfig(**stated({k: args[k] for k in FIT_KNOBS}, q)), cluster)
    strategy_name = args["strategy"] or q.get("strategy")
    count_notes = []
    if countless:  # "on h100": the fewest GPUs that fit, per strategy, said in the answer
        cluster, count_notes = _fewest_cluster(resolved.spec, cluster, config, strategy_name, args)
    notes = [f"model: {resolved.how}", *(parsed.notes if parsed else []), *count_notes, *cluster_notes(cluster),
             *precision_notes]
    if config.seq_len > resolved.spec.max_position_embeddings:
        notes.append(f"seq_len {config.seq_len} exceeds the model's context of {resolved.spec.max_position_embeddings}")
    timed = args["global_batch_tokens"] is not None
    if timed:
        config = _with_global_batch(config, cluster, args["global_batch_tokens"], notes)
    overlay = _calibration(args["calibration"], timed, notes, cluster, args["force"])
    allocator = overlay.allocator_model() if overlay is not None else None
    bands = load_bands().with_overlay(overlay.accuracy if overlay else None)
    results = fit_strategies(resolved.spec, cluster, config, [strategy_name] if strategy_name else None, notes,
                             allocator=allocator, bands=bands, time=timed, calibration=overlay)
    results = [r.model_copy(update={"model": resolved.record(r.model)}) for r in results]
    if timed:
        results = _with_time_sources(results, cluster, overlay, bands)
    _show(results, args, strategy_name)


def _model_and_cluster(args: dict, parsed):
    """The model and cluster an option or the query names (a one-line error when neither does),
    and whether the GPUs came without a count (then the cluster is one node, the search's unit)."""
    from shardplan.inputs.hardware import gpu_without_count
    from shardplan.inputs.models import resolve_model
    from shardplan.inputs.query import GRAMMAR_HINT

    model_text = args["model"] or (parsed.model if parsed else None)
    gpus_text = args["gpus"] or (parsed.gpus if parsed else None)
    if not model_text:
        raise ShardplanError("model", None, f"give a query ({GRAMMAR_HINT}) or --model")
    if not gpus_text:
        raise ShardplanError("gpus", None, f"give a query ({GRAMMAR_HINT}) or --gpus")
    resolved = resolve_model(model_text)
    gpu = gpu_without_count(gpus_text)
    if gpu is not None:
        return resolved, cluster_of(f"{gpu.default_gpus_per_node}x{gpus_text}", args), True
    return resolved, cluster_of(gpus_text, args), False


def _fewest_cluster(spec, node, config, strategy_name: Optional[str], args: dict):
    """The cluster of the fewest GPUs that fit (``planning.gpu_count``) and the note that says so."""
    from shardplan.planning.gpu_count import fewest_per_strategy

    found = fewest_per_strategy(spec, node, config, [strategy_name] if strategy_name else None)
    count = found.fewest or node.gpus_per_node
    return cluster_of(f"{count}x{node.gpu_text}", args), [found.note(node.gpu_text, node.gpus_per_node)]


def _with_global_batch(config, cluster, global_batch_tokens: str, notes: list[str]):
    """The config with the accumulation a global batch implies (--global-batch-tokens asks for time)."""
    from shardplan.inputs.units import parse_count
    from shardplan.planning.workload import resolve_workload
    from shardplan.support.limits import INT_RANGES

    # (the context check is noted already)
    workload = resolve_workload(config.seq_len, cluster.world_size, parse_count(global_batch_tokens, "global_batch_tokens"))
    accum, most = workload.accumulation(config.micro_batch), INT_RANGES["grad_accum"][1]
    if accum > most:  # the accumulation the batch implies is in grad_accum's range, or the batch is refused
        raise ShardplanError("global_batch_tokens", global_batch_tokens,
                             f"needs {accum:,} accumulation steps at micro-batch {config.micro_batch}; "
                             f"at most {most:,} (raise --micro-batch)")
    notes += workload.notes
    return config.model_copy(update={"grad_accum": accum})


def _calibration(path: Optional[Path], timed: bool, notes: list[str], cluster, force: bool):
    """The calibration overlay --calibration names (None without one), checked against the cluster, noted."""
    if path is None:
        return None
    from shardplan.calibrate.foreign import checked_overlay
    from shardplan.calibrate.overlay import load_calibration

    overlay = load_calibration(path)
    notes += checked_overlay(overlay, cluster, path, force)
    notes.append(f"calibration: {path} (allocator: {'calibrated' if overlay.allocator else 'measured defaults'}; "
                 f"time: {'calibrated links/compute' if timed else 'not asked (--global-batch-tokens)'})")
    return overlay


def _with_time_sources(results: list, cluster, overlay, bands) -> list:
    """Each timed result with the efficiencies its step time used (measured, calibrated or
    nameplate) and what the published runs of its GPU family say about its tokens/s band."""
    from shardplan.formulas.efficiencies import efficiencies_used
    from shardplan.inputs.hardware import gpu_family

    measured = overlay is not None and overlay.accuracy is not None and overlay.accuracy.throughput is not None
    band = bands.throughput.evidence(gpu_family(cluster.gpu.name), calibrated=measured)
    return [r.model_copy(update={"efficiencies": efficiencies_used(cluster, r.config, r.time["gemm_efficiency"], overlay),
                                 "time_band": band}) for r in results]


def _show(results: list, args: dict, strategy_name: Optional[str]) -> None:
    """Print the results (JSON or the report), export the first fitting one, apply --check."""
    from shardplan.cli import report
    from shardplan.cli.layout import output_width

    if args["as_json"]:
        typer.echo(report.to_json(results[0] if strategy_name else results))
    else:
        typer.echo(report.render_fit(results, None if args["wide"] else output_width(), detail=args["detail"]))
    if args["export_to"]:
        from shardplan.cli.export_command import export_results
        export_results([r.model_dump(mode="json") for r in results], args["export_to"], None, force=args["force"])
    if args["check"] and not any(r.fits for r in results):
        raise typer.Exit(1)
