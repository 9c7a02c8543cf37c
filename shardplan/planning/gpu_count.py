"""How many GPUs do I need: the fewest GPUs of one kind that fit, strategy by strategy, for a
question that names a GPU without a count ("llama-3.1-70b on h100 full").

The counts tried are ``fit.fewest_gpus_that_fit``'s: 1, 2, 4, 8 within a node, then whole nodes of
the GPU's usual node size. One GPU runs without a wrapper (``single``); more run each valid
strategy of the engine. Fitting is the verdict's rule (peak + band under capacity).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import Cluster
from shardplan.inputs.model import ModelSpec

COUNT_LIMIT = 4096  # fit.fewest_gpus_that_fit's default: past it the answer is "none"


@dataclass(frozen=True)
class FewestGpus:
    """The fewest GPUs per strategy (None: none up to ``COUNT_LIMIT``), and the overall fewest."""

    per_strategy: dict[str, int | None]
    fewest: int | None

    def note(self, gpu_text: str, node_size: int) -> str:
        """One line for the answer: what was searched and what it found."""
        found = ", ".join(f"{name} {n if n is not None else 'none'}" for name, n in self.per_strategy.items())
        head = f"gpus: no GPU count in '{gpu_text}'; fewest GPUs that fit (tried 1, 2, 4, 8, then whole " \
               f"{node_size}-GPU nodes up to {COUNT_LIMIT:,}): {found}"
        if self.fewest is None:
            return f"{head}; nothing fits, shown on one node"
        return f"{head}; shown on {self.fewest}"


def fewest_per_strategy(spec: ModelSpec, node: Cluster, config: TrainingConfig, strategies: list[str] | None = None,
                        allocator=None, bands=None) -> FewestGpus:
    """``node``: one whole node of the GPU (its usual size), the unit counts grow by past 8.
    ``strategies``: those to search (None: one GPU without a wrapper, then the engine's valid
    multi-GPU strategies, searched only where one GPU does not fit)."""
    from shardplan.planning.fit import fewest_gpus_that_fit

    def fewest(name: str) -> int | None:
        return fewest_gpus_that_fit(spec, node, config.model_copy(update={"strategy": name}), COUNT_LIMIT,
                                    allocator, bands)

    if strategies is None:
        if fewest("single") == 1:
            return FewestGpus({"single": 1}, 1)
        engine = st.code(st.ENGINES, config.engine, "engine")
        strategies = [name for i, name in enumerate(st.STRATEGIES)
                      if i != st.SINGLE and bool(st.is_valid(i, engine))]
    found = {name: fewest(name) for name in strategies}
    counts = [n for n in found.values() if n is not None]
    return FewestGpus(found, min(counts) if counts else None)
