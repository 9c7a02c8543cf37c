"""One configuration at a time and a whole batch run the same formulas: evaluating 1,000 random
configurations one by one (one row each) and as one vectorized batch gives identical memory
columns (exact for integer bytes) and times (relative 1e-12), across every declared engine
(data/engine_profiles, ZeRO++ included), every stack (data/stack_profiles) and every strategy,
precision, method, offload and activation-checkpointing mode. Rows the batch evaluates with a
branch of another row (``np.any`` shortcuts, chunked cross-entropy, FSDP-only moments) must
come out as if evaluated alone. Seeded."""

import warnings

import numpy as np
import pytest

from shardplan.formulas.columns import Columns, columns_for
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.planning.planner import evaluate_grid

CONFIGURATIONS = 1000
MODELS = ("llama-3.1-8b", "qwen2.5-7b", "llama-2-7b")
CLUSTERS = ("1xh100-sxm", "8xh100-sxm", "2x8xa100-80gb")
OPTIMIZERS = st.OPTIMIZERS


def _random_config(rng, world_size: int) -> TrainingConfig:
    pick = lambda names: names[int(rng.integers(len(names)))]  # noqa: E731
    knobs = dict(engine=pick(st.ENGINES), stack=pick(st.STACKS), strategy=pick(st.STRATEGIES),
                 precision=pick(st.PRECISIONS), method=pick(st.METHODS), offload=pick(st.OFFLOADS),
                 ac=pick(st.AC_MODES), optimizer=pick(OPTIMIZERS), micro_batch=int(rng.integers(1, 4)),
                 grad_accum=int(rng.choice([1, 2, 4])), seq_len=int(rng.choice([512, 2048])))
    if world_size > 8 and rng.random() < 0.5:
        knobs["shard_group_size"] = 8
    if rng.random() < 0.2:
        knobs["ce_chunks"] = 8
    return TrainingConfig(**knobs)


def _rows(seed: int):
    """(cluster, [(columns, sync)]) groups: rows of one cluster share its link and compute rates."""
    rng = np.random.default_rng(seed)
    specs = {m: resolve_model(m).spec for m in MODELS}
    groups = {name: (parse_gpus(name), []) for name in CLUSTERS}
    for _ in range(CONFIGURATIONS):
        name = CLUSTERS[int(rng.integers(len(CLUSTERS)))]
        cluster, rows = groups[name]
        config = _random_config(rng, cluster.world_size)
        spec = specs[MODELS[int(rng.integers(len(MODELS)))]]
        rows.append((columns_for(spec, cluster, config), bool(rng.random() < 0.7)))
    return list(groups.values())


def _batch(rows) -> Columns:
    names = Columns.__dataclass_fields__
    return Columns(**{n: np.stack([np.asarray(getattr(c, n)) for c, _ in rows]) for n in names})


def _assert_same(name, one, many):
    one, many = np.asarray(one), np.asarray(many)
    if one.dtype.kind in "iub" and many.dtype.kind in "iub":
        assert int(one) == int(many), name
    elif one.dtype.kind == "f" or many.dtype.kind == "f":
        assert np.isclose(float(one), float(many), rtol=1e-12, atol=0.0, equal_nan=True), (name, one, many)
    else:
        assert one == many, name


@pytest.mark.parametrize("seed", [13])
def test_one_by_one_equals_the_batch(seed):
    warnings.simplefilter("ignore", RuntimeWarning)
    seen = {"engine": set(), "stack": set(), "strategy": set(), "precision": set(), "method": set(),
            "offload": set(), "ac": set()}
    for cluster, rows in _rows(seed):
        if not rows:
            continue
        batch = _batch(rows)
        sync = np.array([s for _, s in rows])
        many = evaluate_grid(batch, sync, cluster)
        for i, (c, s) in enumerate(rows):
            one = evaluate_grid(c, s, cluster)
            for name, value in one.items():
                _assert_same(name, value, np.asarray(many[name])[i] if np.ndim(many[name]) else many[name])
            for knob in seen:
                seen[knob].add(int(getattr(c, knob)))
    assert seen["engine"] == set(range(len(st.ENGINES)))
    assert seen["stack"] == set(range(len(st.STACKS)))
    assert seen["strategy"] == set(range(len(st.STRATEGIES)))
    for knob, names in (("precision", st.PRECISIONS), ("method", st.METHODS), ("offload", st.OFFLOADS),
                        ("ac", st.AC_MODES)):
        assert seen[knob] == set(range(len(names))), knob
