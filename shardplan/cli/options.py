"""Option declarations the commands share, and the rule that merges options with a query's words."""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import typer

from shardplan.inputs.vocabulary import help_text as vocab_help
from shardplan.support.errors import ShardplanError

# Option help generated from the one vocabulary (shardplan/inputs/vocabulary.py, docs/vocabulary.md).
STACK_HELP = vocab_help("stack", "hf")  # its defaults fill the knobs not given: docs/stacks.md
REDUCE_HELP = vocab_help("reduce_dtype", "fp32; DeepSpeed: 16-bit")
WIDE_HELP = "every line whole, however wide (default: $COLUMNS, the terminal, or 100)"
FORCE_HELP = "apply a foreign --calibration; replace a read-only --export file"

# The stack's on/off knobs, each an option --knob/--no-knob left unset (the stack's) when not given:
# knob -> its --help line. quant_buffers_sharded (query word fms-gptq) and compile (query word compile)
# are documented in docs/stacks.md and docs/vocabulary.md, left out of --help, which stays within 80
# lines (tests/test_questions.py)
SWITCHES = {
    "optimizer_in_backward": "step in backward (stack's)", "activation_offload": "activations to CPU (stack's)",
    "paged_optimizer": "paged 8-bit states (stack's)", "checkpoint_wrapper": "AC by checkpoint_wrapper",
    "use_cache": "KV cache in training (stack's)", "fused_lm_head": "TRL SFT chunked LM head",
    "kbit_prep": "QLoRA PEFT kbit prep (fp32)", "expandable_segments": "expandable_segments allocator",
    "fp32_master": "fp32 master (unless bf16-pure)",
    "quant_buffers_sharded": "GPTQ qweight/qzeros sharded by FSDP (fms-acceleration's plugin)",
    "compile": "torch.compile'd blocks: fused element-wise (stack's)",
}
HIDDEN_SWITCHES = ("quant_buffers_sharded", "compile")  # fit --help stays short (tests/test_questions.py)


def _switch(knob: str) -> typer.models.OptionInfo:
    flag = knob.replace("_", "-")
    return typer.Option(None, f"--{flag}/--no-{flag}", rich_help_panel="Stack switches", help=SWITCHES[knob],
                        hidden=knob in HIDDEN_SWITCHES)


# Options fit and plan share (declared once; typer reads these OptionInfo objects, it does not change them)
STACK_KNOB_TYPES = {"attention": str, "reduce_dtype": str, "stack": str, "ce_chunks": int,
                    **dict.fromkeys(SWITCHES, bool), "quant_format": str, "load_mode": str, "optimizer_impl": str}
STACK_KNOBS = {
    "attention": typer.Option(None, rich_help_panel="Stack", help=vocab_help("attention", "sdpa")),
    "reduce_dtype": typer.Option(None, rich_help_panel="Stack", help=REDUCE_HELP),
    "stack": typer.Option(None, rich_help_panel="Stack", help=STACK_HELP),
    "ce_chunks": typer.Option(None, rich_help_panel="Stack", help="chunked cross-entropy chunks, 0 = off (default: the stack's)"),
    **{knob: _switch(knob) for knob in SWITCHES},
    "quant_format": typer.Option(None, rich_help_panel="Stack", help=vocab_help("quant_format", "nf4")),
    "load_mode": typer.Option(None, rich_help_panel="Stack", help=vocab_help("load_mode", "the stack's")),
    "optimizer_impl": typer.Option(None, rich_help_panel="Stack", help=vocab_help("optimizer_impl", "the stack's")),
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


def check_repeated_options(command, args: list[str]) -> None:
    """An option given twice (``--seq-len 4096 --seq-len 8192``) is an error naming it, not a
    silent last-one-wins (click keeps the last); options declared repeatable are left alone.
    ``command``: the click command or group ``args`` run through (subcommands are followed)."""
    i = 0  # typer vendors its own click: groups and options are recognised by their attributes
    while isinstance(getattr(command, "commands", None), dict) and i < len(args):
        if args[i] in command.commands:
            command, i = command.commands[args[i]], i + 1
        elif args[i].startswith("-"):
            i += 1
        else:
            return
    # options by their spellings
    owner = {opt: p for p in getattr(command, "params", ()) if not getattr(p, "multiple", True)
             and not getattr(p, "count", False) for opt in (*p.opts, *getattr(p, "secondary_opts", ()))
             if opt.startswith("-")}
    seen: dict[str, str] = {}
    rest = args[i:]
    for j, word in enumerate(rest):
        if word == "--":
            break
        param = owner.get(word.split("=", 1)[0]) if word.startswith("-") else None
        if param is None:
            continue
        # the option as typed, with its value ('--seq-len 4096')
        flag = getattr(param, "is_flag", False)
        given = word if "=" in word or flag or j + 1 >= len(rest) else f"{word} {rest[j + 1]}"
        if param.name in seen:
            raise ShardplanError(param.name, f"{seen[param.name]} ... {given}", "given twice; give it once")
        seen[param.name] = given
