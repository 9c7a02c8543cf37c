"""Option declarations the commands share, and the rule that merges options with a query's words."""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import typer

from shardplan.inputs.vocabulary import help_text as vocab_help

# Option help generated from the one vocabulary (shardplan/inputs/vocabulary.py, docs/vocabulary.md).
STACK_HELP = vocab_help("stack", "hf: Transformers + Trainer + PEFT + bitsandbytes",
                        "its defaults fill the knobs you do not give (docs/stacks.md)")
REDUCE_HELP = vocab_help("reduce_dtype", "fp32 under FSDP/DDP mixed precision, 16-bit for DeepSpeed")
FORCE_OUTPUT_HELP = ("replace an output file even where it is read-only (it stays read-only; "
                     "a symbolic link is never written through)")
FORCE_HELP = ("apply a --calibration measured on another GPU or link (a warning line says so), and replace a "
              "read-only --export file")
WIDE_HELP = "print every line whole, however wide (default: fit $COLUMNS, else the terminal, else 100 columns)"

# Options fit and plan share (declared once; typer reads these OptionInfo objects, it does not change them)
STACK_KNOB_TYPES = {"attention": str, "reduce_dtype": str, "stack": str, "ce_chunks": int,
                    "optimizer_in_backward": bool, "activation_offload": bool, "paged_optimizer": bool,
                    "checkpoint_wrapper": bool, "use_cache": bool, "expandable_segments": bool, "fp32_master": bool,
                    "quant_format": str, "load_mode": str}
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
    "use_cache": typer.Option(
        None, "--use-cache/--no-use-cache",
        help="the model's use_cache during training: under a non-reentrant checkpoint wrapper its KV cache "
             "keeps every finished block's K/V and input-norm chain (default: the stack's; Trainer/TRL set False)"),
    "expandable_segments": typer.Option(
        None, "--expandable-segments/--no-expandable-segments",
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less allocator fragmentation; docs/accuracy.md)"),
    "fp32_master": typer.Option(None, "--fp32-master/--no-fp32-master",
                                help="keep an fp32 master copy (default: unless bf16-pure)"),
    "quant_format": typer.Option(None, help=vocab_help("quant_format", "nf4")),
    "load_mode": typer.Option(None, help=vocab_help("load_mode", "the stack's")),
}


def with_stack_knobs(after: str) -> Callable[[Callable], Callable]:
    """Give a command the shared stack-knob options (``STACK_KNOBS``), listed right after its
    option ``after``: the command declares ``**stack_knobs`` and receives them there. typer reads
    the signature this sets, so ``--help`` shows them as if written out in the command."""
    def decorate(command: Callable) -> Callable:
        own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
        at = next(i for i, p in enumerate(own) if p.name == after) + 1
        knobs = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option,
                                   annotation=Optional[STACK_KNOB_TYPES[name]]) for name, option in STACK_KNOBS.items()]

        @functools.wraps(command)
        def wrapper(**kwargs):
            return command(**kwargs)

        wrapper.__signature__ = inspect.Signature(own[:at] + knobs + own[at:])
        wrapper.__annotations__ = {**command.__annotations__, **{p.name: p.annotation for p in knobs}}
        wrapper.__annotations__.pop("stack_knobs", None)
        return wrapper
    return decorate


def stated(options: dict, query_words: dict) -> dict:
    """The knobs the user gave: an option beats the query's word; what neither gives is left out
    (TrainingConfig's or the stack's default fills it, or a search varies it)."""
    given = {name: value if value is not None else query_words.get(name) for name, value in options.items()}
    return {name: value for name, value in given.items() if value is not None}


def cluster_of(gpus_text: str, args: dict):
    """The cluster a command's --gpus (or query) names, with its link and host-RAM options."""
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.units import parse_capacity_bytes

    host_ram = args["host_ram"]
    return parse_gpus(gpus_text, intra_link=args["intra_link"], inter_link=args["inter_link"],
                      host_ram_bytes_per_node=parse_capacity_bytes(host_ram, "host_ram") if host_ram else None)
