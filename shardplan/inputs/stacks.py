"""Training stacks as data: what the code around the sharding engine holds, per stack.

A stack profile (``shardplan/data/stack_profiles/<name>.json``) states the DEFAULTS a typical run
of that stack uses for the knobs of ``TrainingConfig`` — the stack mechanisms (chunked CE,
optimizer in backward, activation offloading, paged optimizer, fp32 master, how weights are
loaded, ...) and, where the stack's recipes differ from shardplan's, the ordinary knobs
(precision, optimizer, checkpointing). Every default carries its public ``source``. Stacks ship
different recipes for one GPU and for fine-tuning methods (torchtune's single-device full
fine-tune steps a paged 8-bit optimizer in backward; its LoRA recipes do not): ``overrides`` are
applied in order on top of ``defaults`` when their ``when`` matches (GPU count, method).

``resolve_stack(config, world_size)`` fills every knob the user did not state (pydantic
``model_fields_set``) from the profile, then the remaining stack knobs from ``ENGINE_DEFAULTS``
(the values that reproduce shardplan's numbers before stacks existed). The memory formulas never
look at the stack: they read the knob columns (``formulas.columns.Columns``).

The profiles' schema and reading them sit below the vocabulary (``stack_files.py``: the vocabulary
reads their ``words``); checking their defaults against ``TrainingConfig`` and the vocabulary, and
filling a config from them (``resolve_stack``, ``knob_values``), sit here, above ``config.py``,
so ``inputs/`` has no import cycle.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import numpy as np
from pydantic import ValidationError

from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig, knob_codes, resolved_knob_values
from shardplan.inputs.hardware import PRECISION_FALLBACK, Cluster, check_precision
from shardplan.inputs.stack_files import STACK_DIR, StackProfile, read_stack
from shardplan.inputs.vocabulary import KNOBS
from shardplan.support.errors import ShardplanError

# The stack knobs and the value each takes when neither the user nor the stack states it (the
# numbers shardplan gave before stacks were an input). ``fp32_master`` None: derived from the
# precision (none under bf16-pure).
ENGINE_DEFAULTS: dict[str, Any] = dict(
    logits_fp32=True, ce_chunks=0, fused_ce=False, optimizer_in_backward=False, activation_offload=False, fp32_master=None,
    paged_optimizer=False, lora_dropout=0.0, reentrant_checkpointing=False, quant_state_sharded=True,
    quant_buffers_sharded=False,  # GPTQ buffers stay buffers (whole per rank) unless a plugin re-registers them
    quant_format="nf4", load_mode="rank0_broadcast", checkpoint_wrapper=False, use_cache=False, kbit_prep=False,
    fused_lm_head=False,  # TRL's chunked LM head: SFTTrainer since TRL 1.16, no stack's own loop
    quant_saves_input=False,  # bitsandbytes >= 0.43.2 (PR #1270): MatMul4Bit keeps only the packed weight
    quant_head=False, untied_head=False, chunked_head=False,  # transformers + bitsandbytes: lm_head 16-bit, tied as configured
    nf4_whole_quantize=False,  # torchao >= 0.2 quantizes in 1 Mi-element chunks (6081796bc)
    nf4_torchao=False,  # 4-bit weights are bitsandbytes' (Params4bit, dequantize_4bit kernel) unless a stack says torchao
    loop_keeps_logits=False,  # today's loops drop the logits before backward (torchtune 'del logits' since #1046 / #1235)
    autocast=True,  # the hf stack's Trainer with bf16/fp16 = True (accelerate mixed precision on)
    optimizer_impl="foreach",  # torch.optim.AdamW with neither flag: _default_to_fused_or_foreach picks foreach on CUDA
    compile=False,  # eager unless a run says it compiles (torchtitan's and torchtune's configs default to eager)
    lowp_norm=False,  # torchtitan / Hugging Face RMSNorm: fp32 upcast, op by op
    rope_form="complex",  # torchtitan's complex RoPE (apply_rotary_emb), the form the block count is read from
    sac_saves_attention=True,  # torchtitan's op-level SAC _save_list holds SDPA's flash and efficient kernels
    metric_ce=False,  # ASSUMPTION: no loop but composer's computes metrics on training logits
)
STACK_KNOBS = tuple(ENGINE_DEFAULTS)


def _check(profile: StackProfile, path) -> StackProfile:
    """Every key must be a TrainingConfig knob and every value one it accepts."""
    sections = [("defaults", profile.defaults)] + [(f"overrides.{i}.set", r.set) for i, r in enumerate(profile.overrides)]
    for section, where in sections:
        for key, default in where.items():
            if key in ("stack", "strategy", "method") or key not in TrainingConfig.model_fields:
                raise ShardplanError(f"{path.name}: {section}.{key}", default.value, "not a knob a stack can set")
        try:
            config = TrainingConfig(**{k: d.value for k, d in where.items()})
        except ValidationError as err:
            first = err.errors()[0]
            raise ShardplanError(f"{path.name}: {section}.{'.'.join(map(str, first['loc']))}", first.get("input"),
                                 first["msg"]) from None
        knob_codes(config, check_names=True)  # names must be known words
    if profile.name not in st.STACKS:
        raise ShardplanError(f"{path.name}: name", profile.name, f"not one of {', '.join(st.STACKS)}")
    for knob, words in profile.words.items():
        dependent = {a.word for a in KNOBS[knob].aliases if a.by == "stack"} if knob in KNOBS else set()
        for word, meaning in words.items():
            if word not in dependent:
                raise ShardplanError(f"{path.name}: words.{knob}.{word}", meaning.value,
                                     f"not a stack-dependent word of the vocabulary ({', '.join(sorted(dependent))})")
            if meaning.value is not None and meaning.value not in KNOBS[knob].names:
                raise ShardplanError(f"{path.name}: words.{knob}.{word}", meaning.value,
                                     f"not one of {', '.join(KNOBS[knob].names)}")
    return profile


@lru_cache(maxsize=None)
def get_stack(name: str) -> StackProfile:
    """The built-in profile of stack ``name`` (one of ``strategy.STACKS``)."""
    canonical = st.STACKS[st.code(st.STACKS, name, "stack")]
    return _check(read_stack(canonical), STACK_DIR / f"{canonical}.json")


@lru_cache(maxsize=1024)
def stack_knobs(stack: str, world_size: int, method: str) -> tuple[tuple[str, Any], ...]:
    """``get_stack(stack).knobs(world_size, method)`` as (name, value) pairs, worked out once per
    (stack, world size, method): every query resolves its stack."""
    return tuple(get_stack(stack).knobs(world_size, method).items())


def stack_profiles() -> list[StackProfile]:
    return [get_stack(name) for name in st.STACKS]


def knob_values(config: TrainingConfig, cluster: Cluster) -> dict[str, Any]:
    """Names -> codes, with one-line errors for unknown names; knobs the config leaves unstated
    come from its stack (``resolve_stack``; ``config.resolved_knob_values`` for a resolved one)."""
    return resolved_knob_values(resolve_stack(config, cluster.world_size), cluster)


def resolve_stack(config, world_size: int):
    """``config`` with every knob it leaves unstated taken from its stack (then ENGINE_DEFAULTS);
    knobs the user stated win; a knob stated as None is unstated (its stack's default), as when
    left out. Idempotent: what it fills counts as stated afterwards (``stack_update``)."""
    update = stack_update(config, world_size)
    return config.model_copy(update=update) if update else config


def resolved_fields(config, world_size: int):
    """``resolve_stack``'s values, read-only: the config itself when its stack fills nothing, else a
    namespace of its fields with the stack's (a query reads them once; no pydantic copy is made)."""
    update = stack_update(config, world_size)
    return SimpleNamespace(**{**config.__dict__, **update}) if update else config


def stack_update(config, world_size: int) -> dict[str, Any]:
    """The knobs ``resolve_stack`` fills, by name (empty: nothing to fill)."""
    given = {k for k in config.model_fields_set if getattr(config, k) is not None}
    update = {k: v for k, v in stack_knobs(config.stack, int(world_size), config.method) if k not in given}
    if "precision" in given:  # a stated precision decides the master copy unless fp32_master is stated too
        update.pop("fp32_master", None)
    update.update({k: v for k, v in ENGINE_DEFAULTS.items()
                   if k not in given and k not in update and getattr(config, k) is None})
    precision = update.get("precision", config.precision)
    fp32_master = update.get("fp32_master", config.fp32_master)
    if fp32_master is None:
        fp32_master = st.code(st.PRECISIONS, precision, "precision") != st.BF16_PURE
    elif not fp32_master and st.code(st.PRECISIONS, precision, "precision") == st.BF16_MIXED:
        # 16-bit weights without an fp32 copy is bf16-pure (Lightning "bf16-true")
        update["precision"] = "bf16-pure"
    elif fp32_master and "precision" not in given and st.code(st.PRECISIONS, precision, "precision") == st.BF16_PURE:
        # the user keeps an fp32 master with a stack whose recipes have none: bf16 mixed precision
        update["precision"] = "bf16-mixed"
    if config.fp32_master is None or "fp32_master" in update:
        update["fp32_master"] = bool(fp32_master)
    return update


def stack_tables(single: bool) -> dict[str, np.ndarray]:
    """Per stack knob, its value for each (method code, stack code) (sweeps index it with the
    ``method`` and ``stack`` columns). Categorical knobs are codes; ``fp32_master`` is 1/0, or -1
    when derived from the precision. Only the stack knobs: a sweep's other knobs are its own axes."""
    out = {k: np.zeros((len(st.METHODS), len(st.STACKS)), dtype=np.float64 if k == "lora_dropout" else np.int64)
           for k in STACK_KNOBS}
    for m, method in enumerate(st.METHODS):
        for i, name in enumerate(st.STACKS):
            knobs = {**ENGINE_DEFAULTS, **{k: v for k, v in get_stack(name).knobs(1 if single else 2, method).items()
                                           if k in ENGINE_DEFAULTS}}
            codes = knob_codes(knobs)
            for k in STACK_KNOBS:
                out[k][m, i] = -1 if codes[k] is None else codes[k]
    return out


def stack_label(name: str) -> str:
    """"hf (Transformers + Trainer + PEFT + bitsandbytes)": how every answer names its stack."""
    profile = get_stack(name)
    return f"{profile.name} ({profile.display_name})"


def adapt_precision(config, cluster: Cluster):
    """(config, notes): a precision the user did not state, whose default (the stack's) is bf16, becomes
    fp16-mixed on a GPU without bf16, and the answer says so; a stated bf16 precision is refused
    (``hardware.check_precision``). ``config`` is a ``TrainingConfig``. Here, not in ``hardware.py``:
    it reads the stack's default, and the stacks sit above the hardware profiles."""
    precision = resolve_stack(config, cluster.world_size).precision
    if not str(precision).startswith("bf16") or cluster.gpu.has_bf16:
        return config, []
    if "precision" in config.model_fields_set:
        check_precision(cluster.gpu, precision)
    note = (f"precision: {cluster.gpu.display_name} has no bf16 tensor cores; using {PRECISION_FALLBACK} "
            f"instead of the stack's {precision}")
    return config.model_copy(update={"precision": PRECISION_FALLBACK}), [note]
