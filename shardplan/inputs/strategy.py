"""What the knobs' names mean: names -> codes with the vocabulary's aliases (``code``), and which
combinations each engine's declaration runs, how it shards them and its default reduce dtype
(``shardplan/inputs/engines.py``; docs/engines.md).

The names themselves live in ``knob_names.py`` (re-exported here, so callers write
``st.FULL_SHARD``): they sit below the engine and stack declarations and the vocabulary, which
validate against them, while this module reads those, which keeps ``inputs/`` free of import cycles
(docs/architecture.md).
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs.engines import per_precision, per_strategy
from shardplan.inputs.knob_names import *  # noqa: F403 (the names, re-exported: callers write st.FULL_SHARD)
from shardplan.inputs.knob_names import BF16_MIXED, BF16_PURE, FP16_MIXED, FP32, REDUCE_DTYPES, REDUCE_PARAM, SINGLE
from shardplan.inputs.vocabulary import KNOBS, canonical
from shardplan.support.errors import ShardplanError
from shardplan.support.names import choose


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
    if strategy == "single" and world_size != 1:
        raise ShardplanError("strategy", "single", f"means one GPU without a wrapper; this run has {world_size}")
    if shard_group_size and world_size % shard_group_size:
        raise ShardplanError("shard_group_size", shard_group_size, f"must divide the {world_size} GPUs")
