"""The strategy vocabulary (DESIGN.md §2), its knobs, and which combinations are valid.

Every categorical knob is an index into a tuple of names, so formulas can take numpy integer
arrays and branch with ``np.where`` (DESIGN.md §3, principle 2). ``*_names`` tuples are the only
place the spelling lives.
"""

from __future__ import annotations

import numpy as np

from shardplan.support.names import choose

# ``single``: one GPU, no wrapper (no DDP/FSDP/DeepSpeed): full states on the GPU, no sharding
# buffers and no NCCL communicator. Appended last so the other codes keep their values.
STRATEGIES = ("ddp", "no_shard", "zero1", "zero2", "shard_grad_op", "full_shard", "hybrid_shard", "hybrid_shard_zero2",
              "single")
DDP, NO_SHARD, ZERO1, ZERO2, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, SINGLE = range(len(STRATEGIES))

ENGINES = ("fsdp2", "fsdp1", "deepspeed")
FSDP2, FSDP1, DEEPSPEED = range(len(ENGINES))

PRECISIONS = ("bf16-mixed", "fp16-mixed", "bf16-pure", "fp32")
BF16_MIXED, FP16_MIXED, BF16_PURE, FP32 = range(len(PRECISIONS))

OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw-8bit", "lion")
ADAMW, SGD, ADAFACTOR, ADAMW_8BIT, LION = range(len(OPTIMIZERS))

AC_MODES = ("none", "full", "selective", "every-k")
AC_NONE, AC_FULL, AC_SELECTIVE, AC_EVERY_K = range(len(AC_MODES))

OFFLOADS = ("none", "optimizer", "optimizer+params")
OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_ALL = range(len(OFFLOADS))

METHODS = ("full", "lora", "qlora")
FULL, LORA, QLORA = range(len(METHODS))

ATTENTIONS = ("sdpa", "eager")
SDPA, EAGER = range(len(ATTENTIONS))

# The training stack whose code surrounds the engine (shardplan/inputs/stacks.py, data/stack_profiles/).
STACKS = ("hf", "torchtitan", "torchtune", "lightning", "plain")
HF, TORCHTITAN, TORCHTUNE, LIGHTNING, PLAIN = range(len(STACKS))

# 4-bit storage of a quantized frozen base (model_states.quant_bytes_per_param).
QUANT_FORMATS = ("nf4", "gptq", "awq")
NF4, GPTQ, AWQ = range(len(QUANT_FORMATS))

# How the weights reach the GPUs before training (memory.load_peak_bytes).
LOAD_MODES = ("full_per_gpu", "rank0_broadcast", "meta_init")
LOAD_FULL_PER_GPU, LOAD_RANK0_BROADCAST, LOAD_META_INIT = range(len(LOAD_MODES))

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

# Which framework names each strategy maps to (DESIGN.md §2), for reports and exports.
FRAMEWORK_NAMES = {
    "ddp": {"fsdp1": "DistributedDataParallel", "fsdp2": "replicate / DDP", "deepspeed": "stage 0"},
    "no_shard": {"fsdp1": "ShardingStrategy.NO_SHARD", "fsdp2": "fully_shard on a (replicate=n, shard=1) mesh", "deepspeed": "stage 0"},
    "zero1": {"deepspeed": "stage 1"},
    "zero2": {"deepspeed": "stage 2"},
    "shard_grad_op": {"fsdp1": "ShardingStrategy.SHARD_GRAD_OP", "fsdp2": "fully_shard(reshard_after_forward=False)", "deepspeed": "stage 2 (≈)"},
    "full_shard": {"fsdp1": "ShardingStrategy.FULL_SHARD", "fsdp2": "fully_shard(reshard_after_forward=True)", "deepspeed": "stage 3"},
    "hybrid_shard": {"fsdp1": "ShardingStrategy.HYBRID_SHARD", "fsdp2": "fully_shard on a 2-D (replicate, shard) mesh", "deepspeed": "stage 3 + hpZ/MiCS"},
    "hybrid_shard_zero2": {"fsdp1": "ShardingStrategy._HYBRID_SHARD_ZERO2", "fsdp2": "2-D mesh + reshard_after_forward=False"},
    "single": {"fsdp1": "no wrapper (one GPU)", "fsdp2": "no wrapper (one GPU)"},
}


def runs_as(strategy: int, engine: int) -> int:
    """The strategy code the engine actually runs for ``strategy``: the first strategy that the
    engine runs under the same name (FRAMEWORK_NAMES, a trailing "(≈)" marking a stand-in). DeepSpeed
    has one stage 0 for ``ddp`` and ``no_shard`` (both run as ``ddp``) and no SHARD_GRAD_OP: it runs
    ``shard_grad_op`` as stage 2, i.e. as ``zero2``. Other combinations run as themselves."""
    def name(s: str) -> str:
        return FRAMEWORK_NAMES[s].get(ENGINES[engine], "").removesuffix(" (≈)")

    own = name(STRATEGIES[strategy])
    if not own:
        return strategy
    return next(i for i, s in enumerate(STRATEGIES) if name(s) == own)


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
    """The reduce dtype when the user names none: fp32 under FSDP/DDP mixed precision (torchtitan
    ``mixed_precision_reduce = "float32"``; DDP all-reduces the fp32 ``.grad`` under autocast),
    the 16-bit training dtype for DeepSpeed (``communication_data_type`` defaults to it, DeepSpeed
    config docs), and the param dtype when nothing is mixed (bf16-pure, fp32)."""
    p = np.asarray(precision)
    mixed = (p == BF16_MIXED) | (p == FP16_MIXED)
    return np.where(mixed & (np.asarray(engine) != DEEPSPEED), REDUCE_FP32, REDUCE_PARAM)


def reduce_dtype_name(reduce_dtype: int, precision: int) -> str:
    """The concrete name of one reduce dtype code ("param" resolved to the compute dtype)."""
    if int(reduce_dtype) != REDUCE_PARAM:
        return REDUCE_DTYPES[int(reduce_dtype)]
    return {BF16_MIXED: "bf16", FP16_MIXED: "fp16", BF16_PURE: "bf16", FP32: "fp32"}[int(precision)]


def is_valid(strategy, engine) -> np.ndarray:
    """Combinations a framework can express (DESIGN.md §2 table).

    zero1/zero2 exist only in DeepSpeed; hybrid_shard_zero2 has no DeepSpeed equivalent.
    DeepSpeed's shard_grad_op is run as stage 2 and hybrid_shard as stage 3 with hpZ. ``single``
    (no wrapper) is stated with the FSDP engines (the engine is then unused), not DeepSpeed, whose
    engine always wraps the model; that it needs one GPU is checked with the world size
    (``memory.valid_single``).
    """
    strategy = np.asarray(strategy)
    engine = np.asarray(engine)
    deepspeed_only = (strategy == ZERO1) | (strategy == ZERO2)
    not_deepspeed = (strategy == HYBRID_SHARD_ZERO2) | (strategy == SINGLE)
    return np.where(deepspeed_only, engine == DEEPSPEED, np.where(not_deepspeed, engine != DEEPSPEED, True))


def valid_world_size(strategy, world_size) -> np.ndarray:
    """``single`` (one device, no wrapper) exists only on one GPU."""
    return (np.asarray(strategy) != SINGLE) | (np.asarray(world_size) == 1)


def shard_degrees(strategy, engine, world_size, shard_group_size):
    """(param, grad, optimizer) shard degree per strategy: how many ranks split each state.

    ZeRO paper (Rajbhandari et al., SC'20, §5): stage 1 shards optimizer states, stage 2 adds
    gradients, stage 3 adds parameters. FSDP's SHARD_GRAD_OP still shards parameters at rest
    (FSDP1 notes, `docs/source/notes/fsdp.rst`); it only keeps them unsharded from forward to
    backward, which is a transient term. HYBRID strategies shard within ``shard_group_size``;
    DeepSpeed's hybrid (ZeRO++ hpZ, Wang et al. 2023, §3.2) keeps the primary partition of every
    state across all ranks and adds a secondary 16-bit parameter copy within the group
    (``model_states.hpz_secondary_param_bytes``).
    """
    s = np.asarray(strategy)
    n = np.asarray(world_size)
    g = np.minimum(np.asarray(shard_group_size), n)
    one = np.ones_like(n)
    hybrid = ((s == HYBRID_SHARD) | (s == HYBRID_SHARD_ZERO2)) & (np.asarray(engine) != DEEPSPEED)
    ds_hybrid = (s == HYBRID_SHARD) & (np.asarray(engine) == DEEPSPEED)
    full = (s == FULL_SHARD) | (s == SHARD_GRAD_OP) | ds_hybrid
    ds_stage2_like = (np.asarray(engine) == DEEPSPEED) & (s == SHARD_GRAD_OP)
    param = np.where(hybrid, g, np.where(full & ~ds_stage2_like, n, one))
    grad = np.where(hybrid, g, np.where(full | (s == ZERO2), n, one))
    optim = np.where(hybrid, g, np.where(full | (s == ZERO2) | (s == ZERO1), n, one))
    return param, grad, optim
