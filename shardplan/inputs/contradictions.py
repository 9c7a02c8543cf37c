"""Settings that contradict each other, decided by what the frameworks do (one table, ``RULES``).

Each rule names the field it blames, when it applies, what happens in the framework (cited), and
whether shardplan refuses it (``error``: the framework raises, or the setting would be silently
ignored so the answer would describe a run the user did not ask for) or says it (``note``: the
framework runs it as stated, with a consequence worth knowing). ``check`` runs them for one
configuration (``fit`` per strategy, ``plan``'s base); sweeps keep their vectorized ``valid``
column (engines.valid_offload and friends), which the offload rule here reuses rather than restates.
docs/errors.md lists the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

from shardplan.inputs import strategy as st
from shardplan.support.errors import ShardplanError


@dataclass(frozen=True)
class Rule:
    field: str                                 # the field the message names
    kind: str                                  # "error" or "note"
    applies: Callable[..., bool]               # (config, stated fields, cluster, spec) -> bool
    reason: Callable[..., str]                 # the same arguments -> the one-line reason (with its source)
    involves: tuple[str, ...] = ()             # knobs it reads besides the stated one: skipped where one is searched


def _offload_invalid(cfg, stated, cluster, spec) -> bool:
    from shardplan.inputs.engines import valid_offload

    codes = SimpleNamespace(engine=st.code(st.ENGINES, cfg.engine, "engine"),
                            strategy=st.code(st.STRATEGIES, cfg.strategy, "strategy"),
                            offload=st.code(st.OFFLOADS, cfg.offload, "offload"))
    return not bool(valid_offload(codes))


def _offload_reason(cfg, stated, cluster, spec) -> str:
    from shardplan.inputs.engine_lookup import get_engine

    engine = get_engine(cfg.engine)
    run = engine.strategies.get(cfg.strategy)
    if run is not None and run.offloads == ["none"]:
        return (f"{cfg.strategy} keeps whole replicas on every GPU: torch DistributedDataParallel has no CPU "
                f"offload (no such argument); offload needs a sharded strategy, e.g. --strategy full_shard")
    if run is not None and run.wrapper == "deepspeed":
        return ("DeepSpeed offloads parameters only at ZeRO stage 3 (its config docs: zero_optimization."
                "offload_param is available only with stage 3); use --offload optimizer, or --strategy zero3")
    return ("FSDP offloads parameters, gradients and optimizer states together (FSDP2 CPUOffloadPolicy, "
            "FSDP1 CPUOffload(offload_params=True)); optimizer-only offload is DeepSpeed's: --offload "
            "optimizer+params, or --engine deepspeed")


# HSDP strategies and what they are when the shard group is the whole world
HYBRID_EQUIVALENT = {"hybrid_shard": "full_shard", "hybrid_shard_zero2": "shard_grad_op"}


RULES: tuple[Rule, ...] = (
    Rule("offload", "error", _offload_invalid, _offload_reason, involves=("strategy", "engine")),
    Rule("lora_rank", "error", lambda cfg, stated, cl, sp: "lora_rank" in stated and cfg.method == "full",
         lambda cfg, *_: "a LoRA rank with method full: full fine-tuning trains no adapter; add --method lora "
                         "(or qlora), or drop the rank", involves=("method",)),
    Rule("lora_targets", "error", lambda cfg, stated, cl, sp: "lora_targets" in stated and cfg.method == "full",
         lambda cfg, *_: "LoRA targets with method full: full fine-tuning trains no adapter; add --method lora "
                         "(or qlora), or drop the targets", involves=("method",)),
    Rule("quant_format", "error", lambda cfg, stated, cl, sp: "quant_format" in stated and cfg.method != "qlora",
         lambda cfg, *_: f"a 4-bit base format with method {cfg.method}: only QLoRA keeps a quantized base; "
                         f"use --method qlora", involves=("method",)),
    Rule("ac_every_k", "error", lambda cfg, stated, cl, sp: "ac_every_k" in stated and cfg.ac != "every-k",
         lambda cfg, *_: f"checkpointing every k-th block needs --ac every-k (ac is {cfg.ac!r}); the value "
                         f"would be ignored", involves=("ac",)),
    Rule("shard_group_size", "error",
         lambda cfg, stated, cl, sp: "shard_group_size" in stated and cfg.strategy not in HYBRID_EQUIVALENT,
         lambda cfg, *_: f"a shard group is HSDP's (FSDP HYBRID_SHARD / fully_shard on a 2-D mesh); strategy "
                         f"{cfg.strategy} has none: use --strategy hybrid_shard", involves=("strategy",)),
    Rule("optimizer_in_backward", "error", lambda cfg, stated, cl, sp: bool(cfg.optimizer_in_backward) and cfg.grad_accum > 1,
         lambda cfg, stated, *_: f"the optimizer step fused into backward "
                                 f"({'stated' if 'optimizer_in_backward' in stated else 'the ' + cfg.stack + ' stack default'})"
                                 f" cannot accumulate gradients: torchtune raises 'Gradient accumulation is not "
                                 f"supported with optimizer in bwd' (grad_accum {cfg.grad_accum}); pass "
                                 f"--no-optimizer-in-backward or grad_accum 1"),
    Rule("optimizer_in_backward", "error", lambda cfg, stated, cl, sp: bool(cfg.optimizer_in_backward) and cfg.offload != "none",
         lambda cfg, *_: "the optimizer step fused into backward keeps no gradients to offload (torchtune's "
                         "register_optim_in_bwd_hooks steps on the GPU); pass --no-optimizer-in-backward or "
                         "--offload none", involves=("offload",)),
    Rule("strategy", "note",
         lambda cfg, stated, cl, sp: cfg.strategy in HYBRID_EQUIVALENT
         and (cfg.shard_group_size or cl.gpus_per_node) >= cl.world_size,
         lambda cfg, stated, cl, sp: f"{cfg.strategy} with a shard group of all {cl.world_size} GPUs replicates "
                                     f"nothing (replicate degree 1): torch runs it as "
                                     f"{HYBRID_EQUIVALENT[cfg.strategy]}, and it is counted so", involves=("strategy",)),
    Rule("use_cache", "note",
         lambda cfg, stated, cl, sp: bool(cfg.use_cache) and bool(cfg.checkpoint_wrapper) and cfg.ac != "none"
         and not cfg.reentrant_checkpointing,
         lambda cfg, *_: "use_cache is on under a non-reentrant checkpoint wrapper: transformers builds a KV cache "
                         "in every training forward (it turns use_cache off only under its own gradient "
                         "checkpointing), the recomputation appends K/V again, and each finished block's cache "
                         "and input-norm intermediates stay until backward ends (counted); set "
                         "model.config.use_cache = False (as Trainer/TRL do) to free it", involves=("ac",)),
    Rule("method", "note",
         lambda cfg, stated, cl, sp: cfg.method == "qlora" and cfg.stack == "hf" and not {"precision", "ac"} <= stated,
         lambda cfg, stated, *_: "QLoRA defaults assumed (the hf stack's, as PEFT/TRL QLoRA recipes run): "
                                 + ", ".join(part for part, knob in (
                                     (f"{cfg.precision} compute (bnb_4bit_compute_dtype=bfloat16, bf16=True)", "precision"),
                                     (f"activation checkpointing {cfg.ac} (prepare_model_for_kbit_training enables "
                                      f"gradient checkpointing)", "ac")) if knob not in stated)
                                 + "; state --precision / --ac to change them", involves=("method",)),
    Rule("lora_rank", "note",
         lambda cfg, stated, cl, sp: cfg.method != "full" and sp is not None and cfg.lora_rank > sp.hidden_size,
         lambda cfg, stated, cl, sp: f"LoRA rank {cfg.lora_rank} is above the hidden size {sp.hidden_size}: PEFT "
                                     f"builds the adapters as asked (lora_A is rank x in_features), but their "
                                     f"update cannot have a rank above {sp.hidden_size}; memory is counted at "
                                     f"rank {cfg.lora_rank}", involves=("method",)),
)


# the values a search may give each knob a rule can involve
SEARCH_VALUES = {"strategy": st.STRATEGIES, "engine": st.ENGINES, "method": st.METHODS, "offload": st.OFFLOADS,
                 "ac": st.AC_MODES}


def _variants(config, knobs: set[str]):
    """``config`` with every combination of the searched ``knobs``' values."""
    import itertools

    names = sorted(knobs)
    for values in itertools.product(*(SEARCH_VALUES[n] for n in names)):
        variant = config.model_copy(update=dict(zip(names, values)))
        # only combinations a framework can express (zero1/zero2 exist only in DeepSpeed)
        if bool(st.is_valid(st.STRATEGIES.index(variant.strategy), st.ENGINES.index(variant.engine))):
            yield variant


def check(config, cluster, spec=None, *, searched=()) -> list[str]:
    """Raise the first ``error`` rule that applies (one line naming its field and value); return
    the notes of the ``note`` rules that apply. ``config``: as the user stated it (its
    ``model_fields_set`` tells which knobs were stated, before a stack fills the rest);
    ``searched``: knobs the caller varies itself (plan's search, fit over every strategy), whose
    rules the search's own validity handles."""
    from shardplan.inputs.stacks import resolve_stack

    stated = set(config.model_fields_set)
    config = resolve_stack(config, cluster.world_size)  # the values the run would have (stack defaults too)
    notes = []
    for rule in RULES:
        if rule.kind == "error" and rule.field in searched:
            continue
        if rule.kind == "error" and set(rule.involves) & set(searched):
            # a searched knob: refuse only when no value the search may take makes the setting valid
            # (ddp + offload is invalid under every engine; full_shard + optimizer-only offload is
            # valid under DeepSpeed), and explain with a combination the search would have tried
            variants = list(_variants(config, set(rule.involves) & set(searched)))
            if not variants or not all(rule.applies(v, stated, cluster, spec) for v in variants):
                continue
            raise ShardplanError(rule.field, getattr(config, rule.field), rule.reason(variants[0], stated, cluster, spec))
        if not rule.applies(config, stated, cluster, spec):
            continue
        if rule.kind == "error":
            raise ShardplanError(rule.field, getattr(config, rule.field), rule.reason(config, stated, cluster, spec))
        notes.append(rule.reason(config, stated, cluster, spec))
    return notes
