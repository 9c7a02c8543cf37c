"""An engine's declaration by any accepted spelling ("FSDP2", an engine's own ``words``), and what
it says about one named strategy (exports and answers name these).

Above the vocabulary: the spelling is resolved by ``strategy.code``, whose aliases the vocabulary
reads from the declarations (``engines.py``), so this cannot live in ``engines.py`` without an
import cycle.
"""

from __future__ import annotations

from shardplan.inputs import strategy as st
from shardplan.inputs.engines import EngineProfile, engine_profiles


def get_engine(name: str) -> EngineProfile:
    """The declaration of engine ``name`` (any accepted spelling)."""
    return engine_profiles()[st.code(st.ENGINES, name, "engine")]


def framework_name(strategy: str, engine: str) -> str:
    """What ``engine`` calls ``strategy`` ("stage 3", "ShardingStrategy.FULL_SHARD"); "" if it cannot run it."""
    run = get_engine(engine).strategies.get(strategy)
    return "" if run is None else run.framework_name


def runs_deepspeed(engine: str) -> bool:
    """Whether DeepSpeed's ZeRO engine does ``engine``'s work (its exports are DeepSpeed configs)."""
    return any(run.wrapper == "deepspeed" for run in get_engine(engine).strategies.values())


def zero_stage(strategy: str, engine: str) -> int | None:
    """The ZeRO stage that runs ``strategy``: the engine's own declaration when DeepSpeed runs it,
    else DeepSpeed's (a plan of another engine exported to DeepSpeed); None: no stage runs it."""
    declared = get_engine(engine if runs_deepspeed(engine) else "deepspeed")
    run = declared.strategies.get(strategy)
    return None if run is None else run.zero_stage
