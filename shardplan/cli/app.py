"""The ``shardplan`` command: thin typer commands that parse, call the library and render."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from tabulate import tabulate

from shardplan.cli import report
from shardplan.formulas.accuracy_bands import load_bands
from shardplan.inputs.config import TrainingConfig
from shardplan.calibrate.cli import calibrate_app
from shardplan.support.errors import ShardplanError
from shardplan.support.extras import require
from shardplan.planning.fit import fit as fit_strategies, step_timing
from shardplan.inputs.hardware import (GPUProfile, LinkProfile, adapt_precision, cluster_notes, get_hardware, gpu_profiles,
                                link_profiles, parse_gpus)
from shardplan.cli.layout import output_width, table
from shardplan.support.limits import MAX_AXIS_VALUES, MAX_PLAN_CONFIGURATIONS, MAX_SWEEP_CONFIGURATIONS
from shardplan.inputs.model import ModelSpec
from shardplan.inputs.models import model_profiles, resolve_model
from shardplan.support.input_files import path_kind
from shardplan.inputs.profiles import load_profile, read_json
from shardplan.inputs.query import parse_query
from shardplan.inputs.units import GiB, parse_capacity_bytes, parse_count
from shardplan.inputs.vocabulary import help_text as vocab_help

app = typer.Typer(add_completion=False, invoke_without_command=True,
                  help="Will it fit, how fast will it run, and which sharding strategy to use.")
models_app = typer.Typer(add_completion=False, invoke_without_command=True, help="List or show model profiles.")
hardware_app = typer.Typer(add_completion=False, invoke_without_command=True, help="List or show GPU and link profiles.")
profiles_app = typer.Typer(add_completion=False, invoke_without_command=True, help="Validate profile files.")
app.add_typer(models_app, name="models")
app.add_typer(hardware_app, name="hardware")
app.add_typer(profiles_app, name="profiles")
app.add_typer(calibrate_app, name="calibrate", help="Measure real torch FSDP runs, collectives and matmuls; fit coefficients.")


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


@profiles_app.callback()
def _profiles(ctx: typer.Context):
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


# Option help generated from the one vocabulary (shardplan/inputs/vocabulary.py, docs/vocabulary.md).
STACK_HELP = vocab_help("stack", "hf: Transformers + Trainer + PEFT + bitsandbytes",
                        "its defaults fill the knobs you do not give (docs/stacks.md)")
REDUCE_HELP = vocab_help("reduce_dtype", "fp32 under FSDP/DDP mixed precision, 16-bit for DeepSpeed")
WIDE_HELP = "print every line whole, however wide (default: fit $COLUMNS, else the terminal, else 100 columns)"

# Options fit and plan share (declared once; typer reads these OptionInfo objects, it does not change them)
STACK_KNOBS = {
    "attention": typer.Option(None, help=vocab_help("attention", "sdpa")),
    "reduce_dtype": typer.Option(None, help=REDUCE_HELP),
    "stack": typer.Option(None, help=STACK_HELP),
    "ce_chunks": typer.Option(None, help="chunked cross-entropy chunks, 0 = off (default: the stack's)"),
    "optimizer_in_backward": typer.Option(None, "--optimizer-in-backward/--no-optimizer-in-backward",
                                          help="optimizer step fused into backward (default: the stack's)"),
    "activation_offload": typer.Option(None, "--activation-offload/--no-activation-offload",
                                       help="offload saved activations to CPU (default: the stack's)"),
    "paged_optimizer": typer.Option(None, "--paged-optimizer/--no-paged-optimizer",
                                    help="bitsandbytes paged optimizer states (default: the stack's)"),
    "checkpoint_wrapper": typer.Option(
        None, "--checkpoint-wrapper/--no-checkpoint-wrapper",
        help="AC by torch's checkpoint_wrapper around each block (accelerate FSDP activation_checkpointing; "
             "default: the stack's)"),
    "expandable_segments": typer.Option(
        None, "--expandable-segments/--no-expandable-segments",
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less allocator fragmentation; docs/accuracy.md)"),
    "fp32_master": typer.Option(None, "--fp32-master/--no-fp32-master",
                                help="keep an fp32 master copy (default: unless bf16-pure)"),
    "quant_format": typer.Option(None, help=vocab_help("quant_format", "nf4")),
    "load_mode": typer.Option(None, help=vocab_help("load_mode", "the stack's")),
}


def _stated(options: dict, query_words: dict) -> dict:
    """The knobs the user gave: an option beats the query's word; what neither gives is left out
    (TrainingConfig's or the stack's default fills it, or a search varies it)."""
    given = {name: value if value is not None else query_words.get(name) for name, value in options.items()}
    return {name: value for name, value in given.items() if value is not None}



@app.command()
def fit(
    query: Optional[str] = typer.Argument(None, help="free text, e.g. '70B on 4x24GB' or 'llama-3.1-8b on 8xh100-sxm seq 8192 batch 2'"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="profile name, HF config.json path, or a size like '70B'"),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g", help="'4x24GB', '8xh100-sxm', '2x8xa100-80gb'"),
    strategy: Optional[str] = typer.Option(None, help=vocab_help("strategy", None, "all when omitted")),
    engine: Optional[str] = typer.Option(None, help=vocab_help("engine", "fsdp2")),
    method: Optional[str] = typer.Option(None, help=vocab_help("method", "full")),
    lora_rank: Optional[int] = typer.Option(None, help="LoRA rank (default 16)"),
    lora_targets: Optional[str] = typer.Option(None, help=vocab_help("lora_targets", "all-linear, or the stack's")),
    precision: Optional[str] = typer.Option(None, help=vocab_help("precision", "bf16-mixed, or the stack's")),
    optimizer: Optional[str] = typer.Option(None, help=vocab_help("optimizer", "adamw, or the stack's")),
    ac: Optional[str] = typer.Option(None, help=vocab_help("ac", "none, or the stack's")),
    ac_every_k: Optional[int] = typer.Option(None, help="with --ac every-k: checkpoint every k-th block"),
    offload: Optional[str] = typer.Option(None, help=vocab_help("offload", "none")),
    seq_len: Optional[int] = typer.Option(None, help="sequence length (default 1024)"),
    micro_batch: Optional[int] = typer.Option(None, help="micro-batch per GPU (default 1)"),
    grad_accum: Optional[int] = typer.Option(None, help="gradient accumulation steps (default 1)"),
    shard_group_size: Optional[int] = typer.Option(None, help="HSDP shard group size (default GPUs per node)"),
    attention: Optional[str] = STACK_KNOBS["attention"],
    reduce_dtype: Optional[str] = STACK_KNOBS["reduce_dtype"],
    stack: Optional[str] = STACK_KNOBS["stack"],
    ce_chunks: Optional[int] = STACK_KNOBS["ce_chunks"],
    optimizer_in_backward: Optional[bool] = STACK_KNOBS["optimizer_in_backward"],
    activation_offload: Optional[bool] = STACK_KNOBS["activation_offload"],
    paged_optimizer: Optional[bool] = STACK_KNOBS["paged_optimizer"],
    checkpoint_wrapper: Optional[bool] = STACK_KNOBS["checkpoint_wrapper"],
    expandable_segments: Optional[bool] = STACK_KNOBS["expandable_segments"],
    fp32_master: Optional[bool] = STACK_KNOBS["fp32_master"],
    quant_format: Optional[str] = STACK_KNOBS["quant_format"],
    load_mode: Optional[str] = STACK_KNOBS["load_mode"],
    host_ram: Optional[str] = typer.Option(None, help="host RAM per node, e.g. '512GB'"),
    intra_link: Optional[str] = typer.Option(None, help="intra-node link profile (default: the GPU's)"),
    inter_link: Optional[str] = typer.Option(None, help="inter-node link profile (default: the GPU's)"),
    global_batch_tokens: Optional[str] = typer.Option(None, help="global batch in tokens ('1M'): adds step time, tokens/s, MFU"),
    calibration: Optional[Path] = typer.Option(None, help="calibration overlay JSON (shardplan calibrate)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (a list when no --strategy)"),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    export_to: Optional[str] = typer.Option(None, "--export", help="also export the first fitting result: "
                                            "FORMAT[=PATH], FORMAT one of fsdp2, fsdp1, accelerate, deepspeed, trainer, torchrun"),
    check: bool = typer.Option(False, "--check", help="for scripts: exit 1 unless some strategy's verdict is 'fits' "
                                                      "('tight' does not count: its error band crosses capacity); "
                                                      "output unchanged"),
):
    """Will it fit? Per-GPU memory, term by term, for one strategy or all of them."""
    if export_to:  # FORMAT[=PATH] checked before any evaluation, not after the report
        from shardplan.export import export_option
        export_option(export_to)
    parsed = parse_query(query) if query else None
    q = parsed.options if parsed else {}
    model_text = model or (parsed.model if parsed else None)
    gpus_text = gpus or (parsed.gpus if parsed else None)
    if not model_text:
        raise ShardplanError("model", None, "give a query like '70B on 4x24GB' or --model")
    if not gpus_text:
        raise ShardplanError("gpus", None, "give a query like '70B on 4x24GB' or --gpus")
    resolved = resolve_model(model_text)
    cluster = parse_gpus(gpus_text, intra_link=intra_link, inter_link=inter_link,
                         host_ram_bytes_per_node=parse_capacity_bytes(host_ram, "host_ram") if host_ram else None)
    # an option beats the query's word; what neither gives takes TrainingConfig's default
    options = dict(engine=engine, method=method, lora_rank=lora_rank, lora_targets=lora_targets, precision=precision,
                   optimizer=optimizer, ac=ac, ac_every_k=ac_every_k, offload=offload, seq_len=seq_len,
                   micro_batch=micro_batch, grad_accum=grad_accum, shard_group_size=shard_group_size,
                   attention=attention, reduce_dtype=reduce_dtype, stack=stack, ce_chunks=ce_chunks,
                   optimizer_in_backward=optimizer_in_backward, activation_offload=activation_offload,
                   paged_optimizer=paged_optimizer, fp32_master=fp32_master, quant_format=quant_format,
                   expandable_segments=expandable_segments, checkpoint_wrapper=checkpoint_wrapper,
                   load_mode=load_mode)
    given = _stated(options, q)
    config, precision_notes = adapt_precision(TrainingConfig(**given), cluster)
    strategy_name = strategy or q.get("strategy")
    notes = [f"model: {resolved.how}", *cluster_notes(cluster), *precision_notes]
    if config.seq_len > resolved.spec.max_position_embeddings:
        notes.append(f"seq_len {config.seq_len} exceeds the model's context of {resolved.spec.max_position_embeddings}")
    if global_batch_tokens is not None:
        from shardplan.planning.planner import resolve_workload
        # (the context check is noted above already)
        workload = resolve_workload(config.seq_len, cluster.world_size, parse_count(global_batch_tokens, "global_batch_tokens"))
        if workload.sequences_per_gpu % config.micro_batch:
            raise ShardplanError("micro_batch", config.micro_batch,
                                 f"must divide the {workload.sequences_per_gpu} sequences per GPU of the global batch")
        from shardplan.support.limits import INT_RANGES
        accum, most = workload.sequences_per_gpu // config.micro_batch, INT_RANGES["grad_accum"][1]
        if accum > most:  # the accumulation the batch implies is in grad_accum's range, or the batch is refused
            raise ShardplanError("global_batch_tokens", global_batch_tokens,
                                 f"needs {accum:,} accumulation steps at micro-batch {config.micro_batch}; "
                                 f"at most {most:,} (raise --micro-batch)")
        config = config.model_copy(update={"grad_accum": accum})
        notes += workload.notes
    overlay = None
    if calibration is not None:
        from shardplan.calibrate.overlay import load_calibration
        overlay = load_calibration(calibration)
        notes.append(f"calibration: {calibration} (allocator: {'calibrated' if overlay.allocator else 'measured defaults'}; "
                     f"time: {'calibrated links/compute' if global_batch_tokens is not None else 'not asked (--global-batch-tokens)'})")
    allocator = overlay.allocator_model() if overlay is not None else None
    bands = load_bands().with_overlay(overlay.accuracy if overlay else None)
    results = fit_strategies(resolved.spec, cluster, config, [strategy_name] if strategy_name else None, notes,
                             allocator=allocator, bands=bands)
    results = [r.model_copy(update={"model": resolved.record(r.model)}) for r in results]
    if global_batch_tokens is not None:
        results = [r.model_copy(update={"time": step_timing(resolved.spec, cluster, TrainingConfig(**r.config), overlay,
                                                            bands)})
                   for r in results]
    if as_json:
        typer.echo(report.to_json(results[0] if strategy_name else results))
    else:
        typer.echo(report.render_fit(results, None if wide else output_width()))
    if export_to:
        _export_results([r.model_dump(mode="json") for r in results], export_to, None)
    if check and not any(r.fits for r in results):
        raise typer.Exit(1)


def _export_results(plans: list[dict], fmt_path: str, index: Optional[int], block_class: Optional[str] = None,
                    path_field: str = "export") -> None:
    """``--export FORMAT[=PATH]``: write the chosen plan's export atomically, or to stdout."""
    from shardplan.support.atomic_write import write_text_atomic
    from shardplan.export import export_chosen, export_option

    fmt, path = export_option(fmt_path, path_field)
    text, _, note = export_chosen(plans, fmt, index, block_class)
    if note:
        typer.echo(f"note: {note}", err=True)
    if path is None:
        typer.echo(text, nl=False)
    else:
        write_text_atomic(path, text)
        typer.echo(f"wrote {fmt} export to {path}", err=True)


@app.command("export")
def export_command(
    plan: str = typer.Argument(..., help="JSON from `shardplan fit --json` or `shardplan plan --json` ('-' = stdin)"),
    to: str = typer.Option(..., "--to", "-t", help="fsdp2, fsdp1, accelerate, deepspeed, trainer, torchrun"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="file to write (atomically); stdout when omitted"),
    index: Optional[int] = typer.Option(None, help="which plan of a list (default: the first that fits)"),
    block_class: Optional[str] = typer.Option(None, help="transformer block class to wrap, when the model profile has none"),
):
    """Write a plan as the config or code a framework expects."""
    from shardplan.export import load_plans

    _export_results(load_plans(plan), f"{to}={output}" if output else to, index, block_class, path_field="output")


@app.command("plan")
def plan_command(
    query: str = typer.Argument(..., help="'MODEL on GPUS [words]' as fit takes it (e.g. '70B on 4x24GB qlora'), "
                                          "or a model name with --gpus"),
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g", help="'8xh100-sxm', '2x8xa100-80gb', '4x24GB'"),
    seq_len: Optional[int] = typer.Option(None, help="sequence length in tokens (default 1024, as fit)"),
    global_batch_tokens: Optional[str] = typer.Option(None, help="global batch in tokens, e.g. '1M' (decimal)"),
    global_batch: Optional[int] = typer.Option(None, help="global batch in sequences"),
    method: Optional[str] = typer.Option(None, help=vocab_help("method", None, "full, lora and qlora searched when omitted")),
    strategy: Optional[str] = typer.Option(None, help=vocab_help("strategy", None, "searched when omitted")),
    engine: Optional[str] = typer.Option(None, help=vocab_help("engine", None, "searched when omitted")),
    ac: Optional[str] = typer.Option(None, help=vocab_help("ac", None, "none, selective, full searched when omitted")),
    offload: Optional[str] = typer.Option(None, help=vocab_help("offload", None, "searched when omitted")),
    micro_batch: Optional[int] = typer.Option(None, help="micro-batch per GPU (searched when omitted)"),
    shard_group_size: Optional[int] = typer.Option(None, help="HSDP shard group size (searched when omitted)"),
    lora_rank: Optional[int] = typer.Option(None, help="LoRA rank (default 16, or the stack's)"),
    lora_targets: Optional[str] = typer.Option(None, help=vocab_help("lora_targets", "all-linear, or the stack's")),
    precision: Optional[str] = typer.Option(None, help=vocab_help("precision", "bf16-mixed, or the stack's")),
    optimizer: Optional[str] = typer.Option(None, help=vocab_help("optimizer", "adamw, or the stack's")),
    attention: Optional[str] = STACK_KNOBS["attention"],
    reduce_dtype: Optional[str] = STACK_KNOBS["reduce_dtype"],
    stack: Optional[str] = STACK_KNOBS["stack"],
    ce_chunks: Optional[int] = STACK_KNOBS["ce_chunks"],
    optimizer_in_backward: Optional[bool] = STACK_KNOBS["optimizer_in_backward"],
    activation_offload: Optional[bool] = STACK_KNOBS["activation_offload"],
    paged_optimizer: Optional[bool] = STACK_KNOBS["paged_optimizer"],
    checkpoint_wrapper: Optional[bool] = STACK_KNOBS["checkpoint_wrapper"],
    expandable_segments: Optional[bool] = STACK_KNOBS["expandable_segments"],
    fp32_master: Optional[bool] = STACK_KNOBS["fp32_master"],
    quant_format: Optional[str] = STACK_KNOBS["quant_format"],
    load_mode: Optional[str] = STACK_KNOBS["load_mode"],
    train_tokens: Optional[str] = typer.Option(None, help="tokens to train, e.g. '15T', for time and cost"),
    price_per_gpu_hour: Optional[float] = typer.Option(None, help="$ per GPU-hour, for cost"),
    calibration: Optional[Path] = typer.Option(None, help="calibration overlay JSON (shardplan calibrate)"),
    host_ram: Optional[str] = typer.Option(None, help="host RAM per node, e.g. '512GB'"),
    intra_link: Optional[str] = typer.Option(None, help="intra-node link profile"),
    inter_link: Optional[str] = typer.Option(None, help="inter-node link profile"),
    top: int = typer.Option(5, help="how many plans to show"),
    max_configurations: int = typer.Option(MAX_PLAN_CONFIGURATIONS, help="the most candidates one plan evaluates "
                                           "(one array, ~1.9 kB each); a larger search is refused with its count"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
):
    """Fastest configuration that fits: search method × strategy × engine × AC × micro-batch × offload × HSDP group."""
    from shardplan.planning.planner import plan as run_plan, resolve_workload
    from shardplan.cli.plan_report import plan_to_json, render_plan
    from shardplan.inputs import strategy as st

    from shardplan.support.limits import checked_float, checked_int
    top = checked_int("top", top)
    global_batch = None if global_batch is None else checked_int("global_batch", global_batch)
    price_per_gpu_hour = None if price_per_gpu_hour is None else checked_float("price_per_gpu_hour", price_per_gpu_hour)
    parsed = parse_query(query) if " on " in f" {query.strip()} ".lower() else None
    q = parsed.options if parsed else {}
    gpus_text = gpus or (parsed.gpus if parsed else None)
    if not gpus_text:
        raise ShardplanError("gpus", None, "give a query like '70B on 4x24GB' or --gpus")
    resolved = resolve_model(parsed.model if parsed else query)
    cluster = parse_gpus(gpus_text, intra_link=intra_link, inter_link=inter_link,
                         host_ram_bytes_per_node=parse_capacity_bytes(host_ram, "host_ram") if host_ram else None)
    # an option beats the query's word; what neither gives is searched (method, strategy, engine,
    # AC, offload, micro-batch, HSDP group) or takes TrainingConfig's / the stack's default, as in fit
    options = dict(method=method, strategy=strategy, engine=engine, ac=ac, offload=offload, micro_batch=micro_batch,
                   shard_group_size=shard_group_size, lora_rank=lora_rank, lora_targets=lora_targets,
                   precision=precision, optimizer=optimizer, attention=attention, reduce_dtype=reduce_dtype,
                   stack=stack, seq_len=seq_len, ce_chunks=ce_chunks, optimizer_in_backward=optimizer_in_backward,
                   activation_offload=activation_offload, paged_optimizer=paged_optimizer,
                   checkpoint_wrapper=checkpoint_wrapper, expandable_segments=expandable_segments,
                   fp32_master=fp32_master, quant_format=quant_format, load_mode=load_mode,
                   grad_accum=q.get("grad_accum"), ac_every_k=q.get("ac_every_k"))
    base = TrainingConfig(**_stated(options, q))
    from shardplan.inputs import contradictions
    from shardplan.planning.planner import SEARCHED_KNOBS
    rule_notes = contradictions.check(base, cluster, resolved.spec,  # what the search varies, its validity decides
                                      searched={k for k in (*SEARCHED_KNOBS, "method") if k not in base.model_fields_set})
    workload = resolve_workload(base.seq_len, cluster.world_size,
                                parse_count(global_batch_tokens, "global_batch_tokens") if global_batch_tokens else None,
                                global_batch, context=resolved.spec.max_position_embeddings)
    overlay = None
    if calibration is not None:
        from shardplan.calibrate.overlay import load_calibration
        overlay = load_calibration(calibration)
    methods = None if "method" in base.model_fields_set else st.METHODS
    base, precision_notes = adapt_precision(base, cluster)  # bf16 on a GPU without it: the stack's fp16
    result = run_plan(resolved.spec, cluster, base, workload, top=top,
                      train_tokens=parse_count(train_tokens, "train_tokens") if train_tokens else None,
                      price_per_gpu_hour=price_per_gpu_hour, calibration=overlay,
                      notes=[f"model: {resolved.how}", *cluster_notes(cluster), *precision_notes, *rule_notes],
                      bands=load_bands().with_overlay(overlay.accuracy if overlay else None), methods=methods,
                      max_configurations=max_configurations)
    result = result.model_copy(update={"model": resolved.record(result.model)})
    typer.echo(plan_to_json(result) if as_json else render_plan(result, None if wide else output_width()))


@models_app.callback()
def models_list(ctx: typer.Context, wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """List the built-in (and user) model profiles."""
    if ctx.invoked_subcommand:
        return
    rows = [[m.name, m.family, f"{m.total_params / 1e9:.2f}B", m.num_layers, m.hidden_size, m.vocab_size,
             ", ".join(m.aliases[:2])] for m in model_profiles()]
    headers = ["name", "family", "params", "layers", "hidden", "vocab", "aliases"]
    typer.echo(tabulate(rows, headers=headers) if wide else table(rows, headers, output_width(), wrap_columns=(6,), numparse=True))


@models_app.command("show")
def models_show(name: str, as_json: bool = typer.Option(False, "--json"),
                wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """Show one model's dimensions and derived counts."""
    spec = resolve_model(name).spec
    derived = {"total_params": spec.total_params, "non_embedding_params": spec.non_embedding_params,
               "embedding_params": spec.embedding_params, "root_params": spec.root_params,
               "largest_block_params": spec.largest_block_params, "largest_module_params": spec.largest_module_params,
               "active_params_per_token": spec.active_params_per_token,
               "train_flops_per_token_at_4096": spec.train_flops_per_token(4096)}
    if as_json:
        import json
        typer.echo(json.dumps({**spec.model_dump(mode="json"), "derived": derived}, indent=2))
        return
    rows = [[k, v] for k, v in spec.model_dump(mode="json", exclude_none=True).items()] + [[k, f"{v:,}"] for k, v in derived.items()]
    typer.echo(tabulate(rows, headers=["field", "value"]) if wide
               else table(rows, ["field", "value"], output_width(), wrap_columns=(1,), numparse=True))


@hardware_app.callback()
def hardware_list(ctx: typer.Context, wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """List GPU and link profiles."""
    if ctx.invoked_subcommand:
        return
    gpus = [[g.name, g.display_name, f"{g.memory_bytes / GiB:.1f}", f"{g.peak_flops.get('bf16', 0) / 1e12:.0f}",
             f"{g.memory_bandwidth_bytes_per_s / 1e12:.2f}", g.default_intra_link] for g in gpu_profiles()]
    gpu_headers = ["gpu", "name", "GiB", "bf16 TFLOP/s", "HBM TB/s", "intra link"]
    typer.echo(tabulate(gpus, headers=gpu_headers) if wide else table(gpus, gpu_headers, output_width(), wrap_columns=(1,), numparse=True))
    typer.echo("")
    links = [[l.name, l.kind, l.scope, f"{l.bandwidth_bytes_per_s / 1e9:.1f}", f"{l.latency_s * 1e6:.1f}", l.efficiency]
             for l in link_profiles()]
    link_headers = ["link", "kind", "scope", "GB/s per dir", "alpha us", "efficiency"]
    typer.echo(tabulate(links, headers=link_headers) if wide else table(links, link_headers, output_width(), numparse=True))


@hardware_app.command("show")
def hardware_show(name: str):
    """Show one GPU or link profile with its sources."""
    typer.echo(get_hardware(name).model_dump_json(indent=2))


def _validate_one(path: Path) -> str:
    data = read_json(path)
    if "model_type" in data:
        from shardplan.inputs.hf_config import spec_from_hf_config_file
        spec = spec_from_hf_config_file(path)
        return f"{path}: ok (Hugging Face config, {spec.total_params:,} params)"
    if "defaults" in data and "display_name" in data:  # a training stack profile
        from shardplan.inputs.stacks import StackProfile, _check
        profile = _check(load_profile(path, StackProfile), Path(path))
        return f"{path}: ok (StackProfile {profile.name})"
    if "bytes_per_element" in data and "strategies" in data:  # an engine declaration (inputs/engines.py)
        from shardplan.inputs.engines import EngineProfile
        return f"{path}: ok (EngineProfile {load_profile(path, EngineProfile).name})"
    if "fragmentation_per_transient" in data:  # the caching-allocator model (allocator.py)
        from shardplan.formulas.allocator import AllocatorModel
        load_profile(path, AllocatorModel)
        return f"{path}: ok (AllocatorModel)"
    if data.get("schema") == "shardplan.accuracy/1":
        bands = load_bands(path)
        return f"{path}: ok (accuracy bands, {len(type(bands.classes).model_fields)} term classes)"
    schema = GPUProfile if "vendor" in data else LinkProfile if "scope" in data else ModelSpec
    profile = load_profile(path, schema)
    return f"{path}: ok ({schema.__name__} {profile.name})"


def _json_files(folder: Path) -> list[Path]:
    """The *.json files under ``folder``, walking at most ``MAX_VALIDATE_ENTRIES`` entries: a profile
    folder holds tens of files, and `profiles validate /` must not walk the whole file system."""
    import os

    from shardplan.support.limits import MAX_VALIDATE_ENTRIES

    found, seen = [], 0
    for root, dirs, files in os.walk(folder):  # symlinked folders are not followed (no loops)
        seen += len(dirs) + len(files)
        if seen > MAX_VALIDATE_ENTRIES:
            raise ShardplanError("path", str(folder), f"holds more than {MAX_VALIDATE_ENTRIES:,} entries; give the "
                                                      "folder that holds the profiles")
        found += [Path(root) / f for f in files if f.endswith(".json")]
    return sorted(found)


@profiles_app.command("validate")
def profiles_validate(path: Path):
    """Validate a profile file (model, GPU, link, or HF config.json) or every JSON file in a folder."""
    paths = _json_files(path) if path_kind(path) == "dir" else [path]
    if not paths:
        raise ShardplanError("path", str(path), "no JSON files found")
    for p in paths:
        typer.echo(_validate_one(p))


def _sweep_list(text: Optional[str], field: str, integers: bool = False):
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


@app.command("sweep")
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
    max_configurations: int = typer.Option(MAX_SWEEP_CONFIGURATIONS, help="the most rows one sweep evaluates (held "
                                           "in memory, ~765 B each with all columns); a larger product is refused "
                                           "with its count"),
):
    """Evaluate the product of every listed value; one row per configuration, written atomically."""
    import time

    from shardplan.support.atomic_write import atomic_path
    from shardplan.support.output_path import writable_output
    from shardplan.planning.grid_sweep import sweep as run_sweep

    suffix = output.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise ShardplanError("output", str(output), "use a .csv or .parquet file name")
    writable_output(output, "output")  # before the sweep runs
    if suffix == ".parquet":  # before the sweep runs
        require("pyarrow", "parquet")
    t0 = time.perf_counter()
    df = run_sweep(
        models=_sweep_list(models, "models"), gpus=_sweep_list(gpus, "gpus"),
        gpu_counts=_sweep_list(gpu_counts, "gpu_counts", True), nodes=_sweep_list(nodes, "nodes", True),
        strategies=_sweep_list(strategies, "strategies"), engines=_sweep_list(engines, "engines"),
        method=_sweep_list(method, "method"), lora_rank=_sweep_list(lora_rank, "lora_rank", True),
        precision=_sweep_list(precision, "precision"), optimizer=_sweep_list(optimizer, "optimizer"),
        ac=_sweep_list(ac, "ac"), offload=_sweep_list(offload, "offload"),
        micro_batch=_sweep_list(micro_batch, "micro_batch", True), seq_len=_sweep_list(seq_len, "seq_len", True),
        grad_accum=_sweep_list(grad_accum, "grad_accum", True), stack=_sweep_list(stack, "stack"),
        columns=columns, valid_only=valid_only,
        progress=progress, max_configurations=max_configurations,
    )
    elapsed = time.perf_counter() - t0
    with atomic_path(output) as tmp:
        if suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
    for note in df.attrs.get("notes", []):
        typer.echo(f"note: {note} (rows marked valid=False)", err=True)
    typer.echo(f"wrote {len(df):,} rows x {len(df.columns)} columns to {output} "
               f"({elapsed:.2f} s to evaluate, {len(df) / max(elapsed, 1e-9):,.0f} configurations/s)")


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
        # click's usage errors (typer vendors its own click, so match by shape, not by class)
        if not (hasattr(err, "format_message") and hasattr(err, "exit_code")):
            import os
            if os.environ.get("SHARDPLAN_TRACEBACK"):
                raise
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
