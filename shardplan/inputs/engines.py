"""Sharding engines as data: what each engine holds and does, declared once per engine.

An engine declaration (``shardplan/data/engine_profiles/<name>.json``, docs/engines.md) states,
each value with its public ``source``: bytes per element of every model state under each
precision, which strategies the engine runs and as what (its framework name, the wrapper class
that does the work, which states it shards over which ranks, which offloads it accepts), its
default gradient-reduction dtype, its collective bucket sizes and any quantized collectives.

``ENGINES`` (the names) and the engine codes come from the declared ``code`` fields, so existing
codes keep their values. The formulas never test an engine's name: they read the declarations as
numpy tables indexed by the engine code (``table().param_bytes[engine, precision]``), through the
broadcasting helpers below.

This module sits below the vocabulary (which reads the declarations' ``words``), so it reads only
the knob names (``knob_names.py``); looking a declaration up by any accepted spelling
(``engine_lookup.get_engine``) sits above the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from shardplan.inputs import knob_names as st
from shardplan.inputs.knob_names import ENGINE_DIR
from shardplan.support.errors import ShardplanError
from shardplan.support.names import choose

# The classes that do an engine's work for one strategy: no wrapper, torch DDP, FSDP, DeepSpeed's
# ZeRO engine. A new engine reuses one of these mechanisms (its numbers are data); a new
# mechanism needs formulas.
WRAPPERS = ("none", "ddp", "fsdp", "deepspeed")
W_NONE, W_DDP, W_FSDP, W_DEEPSPEED = range(len(WRAPPERS))
# How the engine stores its parameters: FSDP2's per-parameter shards (padded per tensor, an
# all-gather buffer + copy-out), FSDP1's flat parameter per unit, DeepSpeed's flat partitions.
LAYOUTS = ("per_tensor", "flat_unit", "partition")
PER_TENSOR, FLAT_UNIT, PARTITION = range(len(LAYOUTS))
SHARD_OVER = ("none", "all", "group")
STEP_TENSORS = ("per_parameter", "per_flat_unit", "none")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Flag(_Frozen):
    value: bool
    source: str


class Word(_Frozen):
    value: str
    source: str


class PerPrecision(_Frozen):
    """One number (or name) per precision (``strategy.PRECISIONS``)."""

    value: dict[str, float | str]
    source: str


class Bucket(_Frozen):
    """A collective bucket: ``value`` bytes, or ``value`` elements of the collective's dtype."""

    value: int
    unit: Literal["bytes", "elements"]
    source: str


class Quantization(_Frozen):
    """A collective sent quantized: ``bits`` per element plus one ``scale_bytes`` scale per
    ``group_elements``; ``across_nodes_only``: only when the ring spans nodes (else unquantized)."""

    bits: int
    group_elements: int
    scale_bytes: int
    across_nodes_only: bool = False
    source: str

    def bytes_per_element(self) -> float:
        return self.bits / 8 + self.scale_bytes / self.group_elements


class Collectives(_Frozen):
    gradient_bucket: Bucket
    param_gather_bucket: Optional[Bucket] = None
    weight_gather_quantization: Optional[Quantization] = None
    gradient_quantization: Optional[Quantization] = None


class Shards(_Frozen):
    params: Literal["none", "all", "group"]
    grads: Literal["none", "all", "group"]
    optimizer: Literal["none", "all", "group"]


class StrategyRun(_Frozen):
    """How the engine runs one strategy (a strategy it does not list is not valid with it)."""

    framework_name: str
    wrapper: Literal["none", "ddp", "fsdp", "deepspeed"]
    shards: Shards
    offloads: list[Literal["none", "optimizer", "optimizer+params"]]
    zero_stage: Optional[int] = None
    keeps_grads: bool = True                  # a persistent gradient partition (not at ZeRO-3)
    gathers_module_params: bool = False       # ZeRO-3's gathered module (16-bit params + grads)
    reduce_bucket_buffer: bool = False        # ZeRO-0/1/2's 16-bit reduce bucket
    post_step_gather: bool = False            # all-gather of the updated 16-bit partitions
    reduce_scatters_grads: bool = False       # reduce-scatter even where gradients stay whole (ZeRO-1)
    secondary_param_partition: bool = False   # ZeRO++ hpZ: 16-bit params again within the group
    source: str


class EngineWord(_Frozen):
    word: str
    why: str


class StateBytes(_Frozen):
    params: PerPrecision
    grads: PerPrecision
    fp32_master: PerPrecision
    fp32_grad_partition: PerPrecision


class EngineProfile(_Frozen):
    name: str
    code: int
    display_name: str
    description: str
    words: list[EngineWord] = []
    layout: Word
    searched_by_planner: Flag
    bytes_per_element: StateBytes
    default_reduce_dtype: PerPrecision
    default_offload: Word
    offload_moves_params: Flag
    accumulates_without_sync: Flag
    keeps_root_unsharded_to_backward: Flag
    optimizer_step_tensors: Word
    collectives: Collectives
    strategies: dict[str, StrategyRun]


def _check(profile: EngineProfile, path: Path) -> EngineProfile:
    """What the schema cannot say: the file is named after the engine, every per-precision value
    names each precision once, names are known words (one-line errors naming file and field)."""
    if profile.name != path.stem:
        raise ShardplanError(f"{path.name}: name", profile.name, f"must be the file's name ({path.stem})")
    states = profile.bytes_per_element
    for field, per in (("params", states.params), ("grads", states.grads), ("fp32_master", states.fp32_master),
                       ("fp32_grad_partition", states.fp32_grad_partition),
                       ("default_reduce_dtype", profile.default_reduce_dtype)):
        if sorted(per.value) != sorted(st.PRECISIONS):
            raise ShardplanError(f"{path.name}: {field}", ", ".join(per.value), f"must name each of {', '.join(st.PRECISIONS)}")
    for precision, name in profile.default_reduce_dtype.value.items():
        if name not in st.REDUCE_DTYPES:
            raise ShardplanError(f"{path.name}: default_reduce_dtype.{precision}", name, f"not one of {', '.join(st.REDUCE_DTYPES)}")
    checks = [("layout", profile.layout.value, LAYOUTS), ("optimizer_step_tensors", profile.optimizer_step_tensors.value, STEP_TENSORS),
              ("default_offload", profile.default_offload.value, st.OFFLOADS)]
    checks += [(f"strategies.{s}", s, st.STRATEGIES) for s in profile.strategies]
    for field, value, names in checks:
        if value not in names:
            raise ShardplanError(f"{path.name}: {field}", value, f"not one of {', '.join(names)}")
    return profile


def _read(path) -> EngineProfile:
    from shardplan.inputs.profiles import load_profile

    return _check(load_profile(path, EngineProfile), Path(path))


@lru_cache(maxsize=1)
def engine_profiles() -> tuple[EngineProfile, ...]:
    """Every declaration, in code order (codes must be 0, 1, 2, ... without gaps)."""
    profiles = sorted((_read(p) for p in ENGINE_DIR.glob("*.json")), key=lambda p: p.code)
    for i, p in enumerate(profiles):
        if p.code != i:
            raise ShardplanError(f"{p.name}.json: code", p.code, f"engine codes must run 0..{len(profiles) - 1}")
    return tuple(profiles)


@dataclass(frozen=True)
class EngineTables:
    """The declarations as arrays: ``[engine]``, ``[engine, precision]``, ``[engine, strategy]`` or
    ``[engine, strategy, offload]`` (codes of ``knob_names.py``). Built once (``tables``)."""

    param_bytes: np.ndarray
    grad_bytes: np.ndarray
    master_bytes: np.ndarray
    grad_partition_bytes: np.ndarray
    default_reduce_dtype: np.ndarray
    valid: np.ndarray
    runs_as: np.ndarray
    wrapper: np.ndarray
    shards: np.ndarray                  # [engine, strategy, state]: SHARD_OVER code (params, grads, optimizer)
    offload_ok: np.ndarray
    zero_stage: np.ndarray              # -1 where the engine has no ZeRO stage for the strategy
    keeps_grads: np.ndarray
    gathers_module_params: np.ndarray
    reduce_bucket_buffer: np.ndarray
    post_step_gather: np.ndarray
    reduce_scatters_grads: np.ndarray
    secondary_param_partition: np.ndarray
    layout: np.ndarray
    searched_by_planner: np.ndarray
    offload_moves_params: np.ndarray
    accumulates_without_sync: np.ndarray
    keeps_root_unsharded: np.ndarray
    step_tensors: np.ndarray
    grad_bucket: np.ndarray             # bytes, or elements where grad_bucket_in_elements
    grad_bucket_in_elements: np.ndarray
    gather_bucket: np.ndarray           # 0: the engine gathers no updated partitions
    gather_bucket_in_elements: np.ndarray
    weight_gather_bytes: np.ndarray     # bytes per element of a quantized weight all-gather; 0: unquantized
    gradient_comm_bytes: np.ndarray     # bytes per element of quantized gradient reduction; 0: unquantized
    gradient_quant_across_nodes_only: np.ndarray


_FLAGS = ("keeps_grads", "gathers_module_params", "reduce_bucket_buffer", "post_step_gather",
          "reduce_scatters_grads", "secondary_param_partition")


def _strategy_tables(profiles, st) -> dict[str, np.ndarray]:
    E, S = len(profiles), len(st.STRATEGIES)
    out = {k: np.zeros((E, S), dtype=bool) for k in ("valid",) + _FLAGS}
    out.update(runs_as=np.tile(np.arange(S), (E, 1)), wrapper=np.zeros((E, S), dtype=np.int64),
               shards=np.zeros((E, S, 3), dtype=np.int64), zero_stage=np.full((E, S), -1, dtype=np.int64),
               offload_ok=np.zeros((E, S, len(st.OFFLOADS)), dtype=bool))
    out["offload_ok"][:, :, st.OFFLOAD_NONE] = True
    for e, p in enumerate(profiles):
        for name, run in p.strategies.items():
            s = st.STRATEGIES.index(choose(name, st.STRATEGIES, f"{p.name}.json: strategies"))
            own = run.framework_name.removesuffix(" (≈)")  # "(≈)": run as the strategy of that name
            out["runs_as"][e, s] = next(st.STRATEGIES.index(n) for n, r in p.strategies.items()
                                        if r.framework_name.removesuffix(" (≈)") == own)
            out["valid"][e, s] = True
            out["wrapper"][e, s] = WRAPPERS.index(run.wrapper)
            out["shards"][e, s] = [SHARD_OVER.index(getattr(run.shards, k)) for k in ("params", "grads", "optimizer")]
            out["zero_stage"][e, s] = -1 if run.zero_stage is None else run.zero_stage
            for o in run.offloads:
                out["offload_ok"][e, s, st.OFFLOADS.index(o)] = True
            for flag in _FLAGS:
                out[flag][e, s] = getattr(run, flag)
    return out


def _per_precision(profiles, st, get) -> np.ndarray:
    return np.array([[get(p).value[name] for name in st.PRECISIONS] for p in profiles])


def _bucket(b: Optional[Bucket]) -> tuple[int, bool]:
    return (0, False) if b is None else (b.value, b.unit == "elements")


def _engine_tables(profiles) -> dict[str, np.ndarray]:
    def each(get, dtype=None):
        return np.array([get(p) for p in profiles], dtype=dtype)

    def quant(get):
        return each(lambda p: 0.0 if get(p) is None else get(p).bytes_per_element(), np.float64)

    c = lambda p: p.collectives  # noqa: E731
    return dict(
        layout=each(lambda p: LAYOUTS.index(p.layout.value)),
        searched_by_planner=each(lambda p: p.searched_by_planner.value, bool),
        offload_moves_params=each(lambda p: p.offload_moves_params.value, bool),
        accumulates_without_sync=each(lambda p: p.accumulates_without_sync.value, bool),
        keeps_root_unsharded=each(lambda p: p.keeps_root_unsharded_to_backward.value, bool),
        step_tensors=each(lambda p: STEP_TENSORS.index(p.optimizer_step_tensors.value)),
        grad_bucket=each(lambda p: _bucket(c(p).gradient_bucket)[0], np.float64),
        grad_bucket_in_elements=each(lambda p: _bucket(c(p).gradient_bucket)[1], bool),
        gather_bucket=each(lambda p: _bucket(c(p).param_gather_bucket)[0], np.float64),
        gather_bucket_in_elements=each(lambda p: _bucket(c(p).param_gather_bucket)[1], bool),
        weight_gather_bytes=quant(lambda p: c(p).weight_gather_quantization),
        gradient_comm_bytes=quant(lambda p: c(p).gradient_quantization),
        gradient_quant_across_nodes_only=each(lambda p: c(p).gradient_quantization is not None
                                              and c(p).gradient_quantization.across_nodes_only, bool),
    )


@lru_cache(maxsize=1)
def tables() -> EngineTables:
    profiles = engine_profiles()
    reduce = np.array([[st.REDUCE_DTYPES.index(p.default_reduce_dtype.value[name]) for name in st.PRECISIONS]
                       for p in profiles])
    b = lambda p: p.bytes_per_element  # noqa: E731
    return EngineTables(
        param_bytes=_per_precision(profiles, st, lambda p: b(p).params).astype(np.int64),
        grad_bytes=_per_precision(profiles, st, lambda p: b(p).grads).astype(np.int64),
        master_bytes=_per_precision(profiles, st, lambda p: b(p).fp32_master).astype(np.int64),
        grad_partition_bytes=_per_precision(profiles, st, lambda p: b(p).fp32_grad_partition).astype(np.int64),
        default_reduce_dtype=reduce, **_strategy_tables(profiles, st), **_engine_tables(profiles))


def per_engine(name: str, engine):
    """``tables().<name>[engine]`` broadcast over the engine codes."""
    return getattr(tables(), name)[engine]


def per_strategy(name: str, engine, strategy):
    """``tables().<name>[engine, strategy]`` broadcast over both codes."""
    return getattr(tables(), name)[engine, strategy]


def per_precision(name: str, engine, precision):
    """``tables().<name>[engine, precision]`` broadcast over both codes."""
    return getattr(tables(), name)[engine, precision]


def wrapper_is(code: int, engine, strategy):
    """Whether the class doing the work for (engine, strategy) is ``WRAPPERS[code]``."""
    return per_strategy("wrapper", engine, strategy) == code


def layout_is(code: int, engine):
    return per_engine("layout", engine) == code


def valid_offload(c):
    """Offload each engine can express, as its declaration lists per strategy (``offloads``): FSDP
    offloads params+grads+optimizer together (``CPUOffloadPolicy`` / ``CPUOffload(offload_params=True)``);
    DeepSpeed offloads the optimizer at stage 1–3 and parameters only at stage 3; DDP offloads nothing."""
    return tables().offload_ok[np.asarray(c.engine), np.asarray(c.strategy), np.asarray(c.offload)]
