"""``shardplan plan``: the fastest configurations that fit, searched as one vectorized grid."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shardplan.cli.options import WIDE_HELP, cluster_of, stated, with_stack_knobs
from shardplan.inputs.query import parse_query
from shardplan.inputs.vocabulary import help_text as vocab_help
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_PLAN_CONFIGURATIONS

# The knobs plan takes from its options (the query's words fill what they leave out); grad_accum and
# ac_every_k come from the query's words alone
PLAN_KNOBS = ("method", "strategy", "engine", "ac", "offload", "micro_batch", "shard_group_size", "lora_rank",
              "lora_targets", "precision", "optimizer", "attention", "reduce_dtype", "stack", "seq_len", "ce_chunks",
              "optimizer_in_backward", "activation_offload", "paged_optimizer", "checkpoint_wrapper", "use_cache", "kbit_prep", "fused_lm_head",
              "expandable_segments", "fp32_master", "quant_format", "load_mode", "optimizer_impl", "quant_buffers_sharded",
              "compile")


@with_stack_knobs(after="optimizer")
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
    train_tokens: Optional[str] = typer.Option(None, help="tokens to train, e.g. '15T', for time and cost"),
    price_per_gpu_hour: Optional[float] = typer.Option(None, help="$ per GPU-hour, for cost"),
    calibration: Optional[Path] = typer.Option(None, help="calibration overlay JSON (shardplan calibrate)"),
    force: bool = typer.Option(False, "--force", help="apply a --calibration measured on another GPU or link "
                                                      "(a warning line says so)"),
    host_ram: Optional[str] = typer.Option(None, help="host RAM per node, e.g. '512GB'"),
    intra_link: Optional[str] = typer.Option(None, help="intra-node link profile"),
    inter_link: Optional[str] = typer.Option(None, help="inter-node link profile"),
    top: int = typer.Option(5, help="how many plans to show"),
    max_configurations: int = typer.Option(MAX_PLAN_CONFIGURATIONS, help="the most candidates one plan evaluates "
                                           "(one array, ~1.9 kB each); a larger search is refused with its count"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    **stack_knobs,
):
    """Fastest configuration that fits: search method × strategy × engine × AC × micro-batch × offload × HSDP group."""
    args = dict(locals())
    run_plan({**args.pop("stack_knobs"), **args})  # the options as typer parsed them, by name


def run_plan(args: dict) -> None:
    """``plan``'s work: resolve the query and the workload, search, render."""
    from shardplan.cli.layout import output_width
    from shardplan.cli.plan_report import plan_to_json, render_plan
    from shardplan.formulas.accuracy_bands import load_bands
    from shardplan.inputs import strategy as st
    from shardplan.inputs.hardware import cluster_notes
    from shardplan.inputs.stacks import adapt_precision
    from shardplan.inputs.units import parse_count
    from shardplan.planning.planner import plan as search

    args = _checked(args)
    resolved, cluster, base = _plan_inputs(args)
    rule_notes, workload = _rules_and_workload(args, resolved, cluster, base)
    overlay, overlay_notes = None, []
    if args["calibration"] is not None:
        from shardplan.calibrate.foreign import checked_overlay
        from shardplan.calibrate.overlay import load_calibration
        overlay = load_calibration(args["calibration"])
        overlay_notes = checked_overlay(overlay, cluster, args["calibration"], args["force"])
    methods = None if "method" in base.model_fields_set else st.METHODS
    base, precision_notes = adapt_precision(base, cluster)  # bf16 on a GPU without it: the stack's fp16
    result = search(resolved.spec, cluster, base, workload, top=args["top"],
                    train_tokens=parse_count(args["train_tokens"], "train_tokens") if args["train_tokens"] else None,
                    price_per_gpu_hour=args["price_per_gpu_hour"], calibration=overlay,
                    notes=[f"model: {resolved.how}", *cluster_notes(cluster), *precision_notes, *rule_notes, *overlay_notes],
                    bands=load_bands().with_overlay(overlay.accuracy if overlay else None), methods=methods,
                    max_configurations=args["max_configurations"])
    result = result.model_copy(update={"model": resolved.record(result.model)})
    typer.echo(plan_to_json(result) if args["as_json"] else render_plan(result, None if args["wide"] else output_width()))


def _checked(args: dict) -> dict:
    """The numeric options within their ranges (one-line errors)."""
    from shardplan.support.limits import checked_float, checked_int

    args = dict(args)
    args["top"] = checked_int("top", args["top"])
    args["global_batch"] = None if args["global_batch"] is None else checked_int("global_batch", args["global_batch"])
    price = args["price_per_gpu_hour"]
    args["price_per_gpu_hour"] = None if price is None else checked_float("price_per_gpu_hour", price)
    return args


def _plan_inputs(args: dict):
    """The model, the cluster and the base configuration (what the user fixed)."""
    from shardplan.inputs.config import TrainingConfig
    from shardplan.inputs.models import resolve_model

    query = args["query"]
    parsed = parse_query(query) if " on " in f" {query.strip()} ".lower() else None
    q = parsed.options if parsed else {}
    gpus_text = args["gpus"] or (parsed.gpus if parsed else None)
    if not gpus_text:
        raise ShardplanError("gpus", None, "give a query like '70B on 4x24GB' or --gpus")
    resolved = resolve_model(parsed.model if parsed else query)
    cluster = cluster_of(gpus_text, args)
    # an option beats the query's word; what neither gives is searched (method, strategy, engine,
    # AC, offload, micro-batch, HSDP group) or takes TrainingConfig's / the stack's default, as in fit
    options = {**{k: args[k] for k in PLAN_KNOBS}, "grad_accum": q.get("grad_accum"), "ac_every_k": q.get("ac_every_k")}
    return resolved, cluster, TrainingConfig(**stated(options, q))


def _rules_and_workload(args: dict, resolved, cluster, base):
    """The contradiction rules' notes (errors raise) and the global batch as a workload."""
    from shardplan.inputs import contradictions
    from shardplan.inputs.units import parse_count
    from shardplan.planning.planner import SEARCHED_KNOBS
    from shardplan.planning.workload import resolve_workload

    rule_notes = contradictions.check(base, cluster, resolved.spec,  # what the search varies, its validity decides
                                      searched={k for k in (*SEARCHED_KNOBS, "method") if k not in base.model_fields_set})
    tokens = args["global_batch_tokens"]
    workload = resolve_workload(base.seq_len, cluster.world_size,
                                parse_count(tokens, "global_batch_tokens") if tokens else None,
                                args["global_batch"], context=resolved.spec.max_position_embeddings)
    return rule_notes, workload
