"""The strategy vocabulary, its knobs, and which combinations are valid (with each engine's
declaration, ``shardplan/inputs/engines.py``; docs/engines.md).

Every categorical knob is an index into a tuple of names, so formulas can take numpy integer
arrays and branch with ``np.where`` (docs/formulas.md: every formula broadcasts). ``*_names`` tuples are the only
place the spelling lives.
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs.engines import engine_names as _engine_names
from shardplan.inputs.engines import per_precision, per_strategy
from shardplan.support.names import choose

# ``single``: one GPU, no wrapper (no DDP/FSDP/DeepSpeed): full states on the GPU, no sharding
# buffers and no NCCL communicator. Appended last so the other codes keep their values.
STRATEGIES = ("ddp", "no_shard", "zero1", "zero2", "shard_grad_op", "full_shard", "hybrid_shard", "hybrid_shard_zero2",
              "single")
DDP, NO_SHARD, ZERO1, ZERO2, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, SINGLE = range(len(STRATEGIES))

# The engines are declared as data (shardplan/inputs/engines.py, data/engine_profiles/*.json); their
# names come in the declared code order, so existing codes keep their values.
ENGINES = _engine_names()
FSDP2, FSDP1, DEEPSPEED = (ENGINES.index(n) for n in ("fsdp2", "fsdp1", "deepspeed"))

PRECISIONS = ("bf16-mixed", "fp16-mixed", "bf16-pure", "fp32")
BF16_MIXED, FP16_MIXED, BF16_PURE, FP32 = range(len(PRECISIONS))

OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw-8bit", "lion")
ADAMW, SGD, ADAFACTOR, ADAMW_8BIT, LION = range(len(OPTIMIZERS))

AC_MODES = ("none", "full", "selective", "every-k", "selective-op")
# selective: every matmul and attention-kernel output saved (the policy ``shardplan export`` writes);
# selective-op: torchtitan's op-level SAC, every second matmul output recomputed (activations.py)
AC_NONE, AC_FULL, AC_SELECTIVE, AC_EVERY_K, AC_SELECTIVE_OP = range(len(AC_MODES))

OFFLOADS = ("none", "optimizer", "optimizer+params")
OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_ALL = range(len(OFFLOADS))

METHODS = ("full", "lora", "qlora")
FULL, LORA, QLORA = range(len(METHODS))

# "triton": the Triton FlashAttention kernel of FlashAttention-1's design (flash-attn 1.0's
# ``flash_attn_triton``, copied into llm-foundry, whose ``attn_impl: triton`` runs it): SDPA's
# flash memory, its own speed (``throughput.TRITON_OVER_FLASH2``).
ATTENTIONS = ("sdpa", "eager", "triton")
SDPA, EAGER, TRITON = range(len(ATTENTIONS))

# The training stack whose code surrounds the engine (shardplan/inputs/stacks.py, data/stack_profiles/).
STACKS = ("hf", "torchtitan", "torchtune", "lightning", "plain")
HF, TORCHTITAN, TORCHTUNE, LIGHTNING, PLAIN = range(len(STACKS))

# 4-bit storage of a quantized frozen base (model_states.quant_bytes_per_param).
QUANT_FORMATS = ("nf4", "gptq", "awq")
NF4, GPTQ, AWQ = range(len(QUANT_FORMATS))

# How the weights reach the GPUs before training (memory.load_peak_bytes).
LOAD_MODES = ("full_per_gpu", "rank0_broadcast", "meta_init")
LOAD_FULL_PER_GPU, LOAD_RANK0_BROADCAST, LOAD_META_INIT = range(len(LOAD_MODES))

# How the AdamW step runs on the GPU (torch.optim.AdamW fused= / foreach=; torchtitan's
# ``optimizer.implementation``): model_states.optimizer_step_bytes_per_element, buffers.optimizer_step_temporaries.
OPTIMIZER_IMPLS = ("fused", "foreach", "for_loop")
OPT_FUSED, OPT_FOREACH, OPT_FOR_LOOP = range(len(OPTIMIZER_IMPLS))

# PEFT LoRA targets as the stacks name them (model.lora_params_per_block / lora_root_params):
# q,v (PEFT's default for Llama, torchtune ``lora_attn_modules=['q_proj','v_proj']``), every
# attention projection, every Linear of the blocks (PEFT ``target_modules="all-linear"``, which
# leaves the output layer out), and all of them plus the embedding and lm_head (PEFT
# ``target_modules`` naming ``embed_tokens``/``lm_head``; torchtune ``apply_lora_to_output``).
LORA_TARGETS = ("qv", "attention", "all-linear", "all-linear+embeddings")

# Gradient reduction dtype (FSDP ``MixedPrecision``/``MixedPrecisionPolicy(reduce_dtype=...)``,
# DeepSpeed ``communication_data_type``, DDP's ``bf16_compress_hook``/``fp16_compress_hook``):
# "param" reduces in the compute/param dtype (FSDP's reduce_dtype=None: torch
# ``_fsdp_collectives.foreach_reduce`` ``reduce_dtype = reduce_dtype or grad_dtype``).
REDUCE_DTYPES = ("fp32", "bf16", "fp16", "param")
REDUCE_FP32, REDUCE_BF16, REDUCE_FP16, REDUCE_PARAM = range(len(REDUCE_DTYPES))

def runs_as(strategy, engine):
    """The strategy code the engine actually runs for ``strategy``: the first strategy its
    declaration runs under the same framework name (a trailing "(≈)" marks a stand-in). DeepSpeed
    has one stage 0 for ``ddp`` and ``no_shard`` (both run as ``ddp``) and no SHARD_GRAD_OP: it
    runs ``shard_grad_op`` as stage 2, i.e. as ``zero2``. Other combinations run as themselves."""

    return per_strategy("runs_as", engine, strategy)


def code(vocabulary: tuple[str, ...], value: str, field: str) -> int:
    """Name -> index, with a one-line error listing the accepted names. A knob of the one
    vocabulary (shardplan/inputs/vocabulary.py) also takes its aliases ("zero3", "offload all")."""
    if isinstance(value, str) and value in vocabulary:  # already a name (every query, many times)
        return vocabulary.index(value)
    from shardplan.inputs.vocabulary import KNOBS, canonical

    if field in KNOBS and KNOBS[field].names == vocabulary:
        return vocabulary.index(canonical(field, value))
    return vocabulary.index(choose(value, vocabulary, field))


def default_reduce_dtype(precision, engine):
    """The reduce dtype when the user names none: each engine declares it per precision
    (``default_reduce_dtype`` in data/engine_profiles/*.json: fp32 under FSDP/DDP mixed precision,
    the 16-bit training dtype for DeepSpeed, the param dtype when nothing is mixed)."""

    return per_precision("default_reduce_dtype", engine, precision)


def resolve_reduce_dtype(reduce_dtype, precision, engine):
    """The ``reduce_dtype`` codes with every unstated one (None, or a negative code in a sweep
    column) replaced by the engine's default: the one place the default is resolved."""
    if reduce_dtype is None:
        return default_reduce_dtype(precision, engine)
    r = np.asarray(reduce_dtype)
    return np.where(r < 0, default_reduce_dtype(precision, engine), r)


def reduce_dtype_name(reduce_dtype: int, precision: int) -> str:
    """The concrete name of one reduce dtype code ("param" resolved to the compute dtype)."""
    if int(reduce_dtype) != REDUCE_PARAM:
        return REDUCE_DTYPES[int(reduce_dtype)]
    return {BF16_MIXED: "bf16", FP16_MIXED: "fp16", BF16_PURE: "bf16", FP32: "fp32"}[int(precision)]


def is_valid(strategy, engine) -> np.ndarray:
    """Combinations a framework can express: the strategies the engine's declaration lists
    (zero1/zero2 only DeepSpeed's; hybrid_shard_zero2 and ``single`` not DeepSpeed's, whose engine
    always wraps the model). That ``single`` needs one GPU is checked with the world size
    (``valid_world_size``)."""

    return per_strategy("valid", engine, strategy)


def valid_world_size(strategy, world_size) -> np.ndarray:
    """``single`` (one device, no wrapper) exists only on one GPU."""
    return (np.asarray(strategy) != SINGLE) | (np.asarray(world_size) == 1)


def shard_degrees(strategy, engine, world_size, shard_group_size):
    """(param, grad, optimizer) shard degree: how many ranks split each state, as the engine
    declares it per strategy (``shards``: none -> 1, all -> the world, group -> the shard group).

    ZeRO paper (Rajbhandari et al., SC'20, §5): stage 1 shards optimizer states, stage 2 adds
    gradients, stage 3 adds parameters. FSDP's SHARD_GRAD_OP still shards parameters at rest
    (FSDP1 notes, ``docs/source/notes/fsdp.rst``); keeping them unsharded from forward to backward
    is a transient term. FSDP's HYBRID strategies shard within ``shard_group_size``; DeepSpeed's
    hybrid (ZeRO++ hpZ, Wang et al. 2023, §3.2) partitions every state over all ranks and adds a
    secondary 16-bit parameter copy within the group (``model_states.hpz_secondary_param_bytes``).
    """
    n = np.asarray(world_size)
    g = np.minimum(np.asarray(shard_group_size), n)
    over = per_strategy("shards", engine, strategy)
    degree = [np.where(np.take(over, k, axis=-1) == 1, n, np.where(np.take(over, k, axis=-1) == 2, g, 1))
              for k in range(3)]
    ones = np.ones_like(n) * np.ones_like(g)
    return tuple(d * ones for d in degree)


def check_world_size(strategy: str, world_size: int, shard_group_size: int | None) -> None:
    """One-line errors for a run whose GPU count its strategy cannot use: ``single`` is one GPU
    without a wrapper; a shard group must divide the GPUs (the rules ``valid_world_size`` and the
    HSDP mesh apply to arrays, for one stated run)."""
    from shardplan.support.errors import ShardplanError

    if strategy == "single" and world_size != 1:
        raise ShardplanError("strategy", "single", f"means one GPU without a wrapper; this run has {world_size}")
    if shard_group_size and world_size % shard_group_size:
        raise ShardplanError("shard_group_size", shard_group_size, f"must divide the {world_size} GPUs")
