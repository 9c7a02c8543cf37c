"""One configuration is a one-row batch: ``evaluate_query`` (memory, verdict and, with
``time=True``, step time) of each configuration equals its row inside one vectorized batch of
many, column by column. Expected values are the batch's own (the path every sweep and search
uses): equal exactly for integers, within 1e-12 relative for floats, and of the same kind (a byte
count an int in both)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_evaluate import _random_queries

from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.planning import evaluate as evaluator
from shardplan.planning.evaluate import evaluate_queries, evaluate_query

KIND = {"i": int, "b": bool, "f": float}


def _assert_row_equals_batch(one: dict, batch: dict, i: int) -> None:
    for name, column in batch.items():
        expected = np.broadcast_to(np.asarray(column), np.shape(batch["overflow"]))[i]
        got = one[name]
        assert type(got) is KIND[expected.dtype.kind], (name, type(got), expected.dtype)
        if expected.dtype.kind == "f":
            assert np.isclose(got, float(expected), rtol=1e-12, atol=0.0, equal_nan=True), (name, got, expected)
        else:
            assert got == expected.item(), (name, got, expected)


def test_one_row_equals_the_same_row_inside_a_batch():
    """1,000 random configurations across every engine, strategy, method, stack and offload: each
    evaluated alone (a one-row batch) equals its row of one 1,000-row pass, column by column."""
    warnings.simplefilter("ignore", RuntimeWarning)
    queries = _random_queries(1000, seed=29)
    batch = evaluate_queries(queries)
    seen = {"engine": set(), "stack": set(), "method": set()}
    for i, query in enumerate(queries):
        _assert_row_equals_batch(evaluate_query(*query), batch, i)
        for knob in seen:
            seen[knob].add(getattr(query[2], knob))
    assert seen == {"engine": set(st.ENGINES), "stack": set(st.STACKS), "method": set(st.METHODS)}


def _every_knob_queries(n: int, seed: int) -> list[tuple]:
    """``n`` configurations with every knob drawn (precision, attention, dropout, every-k AC, chunked
    loss, accumulation with and without sync, offloaded activations, the stack knobs, quantization
    and load modes), valid or not: an invalid one must come out as invalid in both paths."""
    rng = np.random.default_rng(seed)
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    flag = lambda: pick((None, True, False))  # noqa: E731
    out = []
    for spec, cluster, _ in _random_queries(n, seed):
        knobs = dict(strategy=pick(st.STRATEGIES), engine=pick(st.ENGINES), precision=pick(st.PRECISIONS),
                     method=pick(st.METHODS), stack=pick(st.STACKS), ac=pick(st.AC_MODES), ac_every_k=pick((2, 3)),
                     offload=pick(st.OFFLOADS), optimizer=pick(st.OPTIMIZERS), micro_batch=pick((1, 3)),
                     seq_len=pick((256, 2048)), grad_accum=pick((1, 4)), sync_every_micro_batch=pick((True, False)),
                     attention=pick(st.ATTENTIONS), dropout=pick((True, False)), reduce_dtype=pick((None,) + st.REDUCE_DTYPES),
                     ce_chunks=pick((None, 0, 8)), activation_offload=flag(), logits_fp32=flag(),
                     optimizer_in_backward=flag(), fp32_master=flag(), paged_optimizer=flag(),
                     expandable_segments=pick((True, False)), lora_dropout=pick((None, 0.0, 0.05)),
                     reentrant_checkpointing=flag(), checkpoint_wrapper=flag(), quant_state_sharded=flag(),
                     quant_format=pick((None,) + st.QUANT_FORMATS), load_mode=pick((None,) + st.LOAD_MODES))
        if knobs["strategy"] == "single":
            knobs["strategy"] = "ddp" if cluster.world_size > 1 else "single"
        out.append((spec, cluster, TrainingConfig(**knobs)))
    return out


def test_every_knob_one_row_equals_the_batch():
    """500 configurations drawing every knob a TrainingConfig has: each alone equals its row of the batch."""
    warnings.simplefilter("ignore", RuntimeWarning)
    queries = _every_knob_queries(500, seed=41)
    batch = evaluate_queries(queries)
    for i, query in enumerate(queries):
        _assert_row_equals_batch(evaluate_query(*query), batch, i)


def test_one_configuration_comes_back_in_python_numbers():
    """Every result is a Python number (no numpy scalar or 0-d array leaks out of the one-row batch)."""
    spec, cluster, config = _random_queries(1, seed=3)[0]
    for name, value in evaluate_query(spec, cluster, config).items():
        assert type(value) in (int, float, bool), (name, type(value))


# --- step time ------------------------------------------------------------------------------------
def _batch_time_rows(queries) -> list[dict]:
    """The expected time columns of each query: its row of one ``checked_time_columns`` batch over
    every query on its cluster (each row its own sync), in the queries' order."""
    groups: dict[int, list[int]] = {}
    for i, (_, cluster, _) in enumerate(queries):
        groups.setdefault(id(cluster), []).append(i)
    out: list[dict] = [{} for _ in queries]
    for members in groups.values():
        cluster = queries[members[0]][1]
        c = evaluator.stack_queries([evaluator.query_values(*queries[i]) for i in members])
        for i, row in zip(members, evaluator.rows_of(evaluator.checked_time_columns(c, cluster, None, None), len(members))):
            out[i] = row
    return out


def _assert_same_values(got: dict, expected: dict, names) -> None:
    for name in names:
        assert type(got[name]) is type(expected[name]), (name, type(got[name]), type(expected[name]))
        if isinstance(expected[name], float):
            assert np.isclose(got[name], expected[name], rtol=1e-12, atol=0.0, equal_nan=True), (name, got[name], expected[name])
        else:
            assert got[name] == expected[name], (name, got[name], expected[name])


@pytest.mark.parametrize("make, n, seed", [(_random_queries, 1000, 31), (_every_knob_queries, 300, 43)])
def test_step_time_of_one_row_equals_its_row_inside_a_batch(make, n, seed):
    """Communication volume and time, step time, tokens/s with its band, MFU: every time column of
    one configuration alone equals its row of a batch over its cluster's configurations (exact
    integers, floats within 1e-12 relative, the same kinds), with the memory columns unchanged by
    asking for time; ``overflow`` from both guards."""
    warnings.simplefilter("ignore", RuntimeWarning)
    queries = make(n, seed)
    for (spec, cluster, config), expected in zip(queries, _batch_time_rows(queries)):
        got = evaluate_query(spec, cluster, config, time=True)
        _assert_same_values(got, expected, [k for k in expected if k != "overflow"])
        memory = evaluate_query(spec, cluster, config)
        assert {k: got[k] for k in memory if k != "overflow"} == {k: v for k, v in memory.items() if k != "overflow"}
        assert got["overflow"] == (memory["overflow"] or expected["overflow"])


def test_step_timing_reads_the_configurations_sync_and_agrees_with_the_planners_grid():
    """fit.step_timing: gradients reduced as the configuration says (no_sync: once per step), the
    numbers the planner's grid gives for that sync (evaluate_grid)."""
    from shardplan.formulas.columns import columns_for
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model
    from shardplan.planning.fit import TIME_FIELDS, step_timing
    from shardplan.planning.planner import evaluate_grid

    spec, cluster = get_model("llama-3.1-8b"), parse_gpus("2x8xh100-sxm")
    answers = {}
    for sync in (True, False):
        config = TrainingConfig(strategy="hybrid_shard", grad_accum=8, sync_every_micro_batch=sync)
        grid = evaluate_grid(columns_for(spec, cluster, config), sync, cluster)
        answers[sync] = step_timing(spec, cluster, config)
        for name in TIME_FIELDS:
            assert answers[sync][name] == pytest.approx(float(grid[name]), rel=1e-12), (sync, name)
    # one gradient reduction per step instead of eight (the all-gathers stay): less communication
    assert answers[False]["comm_s"] < answers[True]["comm_s"]
    assert answers[False]["step_time_s"] < answers[True]["step_time_s"]


def test_a_calibrations_step_time_is_the_grids(tmp_path):
    """A calibration's per-size link tables: evaluate_query(time=True,
    calibration=...) equals the planner's grid with that calibration, and differs from nameplate."""
    from pathlib import Path

    from shardplan.calibrate.collectives import fit_link, parse_nccl_tests_file
    from shardplan.calibrate.overlay import load_calibration, write_calibration
    from shardplan.formulas.columns import columns_for
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model
    from shardplan.planning.fit import TIME_FIELDS
    from shardplan.planning.planner import evaluate_grid

    data = Path(__file__).parent / "data"
    write_calibration(tmp_path / "cal.json",
                      links=[fit_link(parse_nccl_tests_file(data / "nccl_tests_sample_all_gather_perf.txt"))])
    calibration = load_calibration(tmp_path / "cal.json")
    spec, cluster, config = get_model("llama-3.1-8b"), parse_gpus("8xh100-sxm"), TrainingConfig()
    got = evaluate_query(spec, cluster, config, time=True, calibration=calibration)
    grid = evaluate_grid(columns_for(spec, cluster, config), True, cluster, calibration)
    assert got["calibrated"] is True
    for name in TIME_FIELDS:
        assert got[name] == pytest.approx(float(grid[name]), rel=1e-12), name
    assert got["comm_s"] != evaluate_query(spec, cluster, config, time=True)["comm_s"]


def test_step_timings_in_one_pass_equal_step_timing_one_at_a_time():
    """fit's results with time (the CLI's --global-batch-tokens) in one vectorized pass: each equals
    its own step_timing, within 1e-12 relative."""
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model
    from shardplan.planning.fit import step_timing, step_timings

    spec, cluster = get_model("llama-3.1-8b"), parse_gpus("2x8xh100-sxm")
    configs = [TrainingConfig(strategy=strategy, method=method, grad_accum=4, sync_every_micro_batch=sync)
               for strategy in ("full_shard", "hybrid_shard", "ddp") for method in ("full", "lora")
               for sync in (True, False)]
    for config, many in zip(configs, step_timings(spec, cluster, configs)):
        one = step_timing(spec, cluster, config)
        assert one.keys() == many.keys()
        for name, value in many.items():
            assert one[name] == pytest.approx(value, rel=1e-12), (config, name)
    assert step_timings(spec, cluster, []) == []


def test_a_sweep_over_two_flag_axes_equals_its_single_value_sweeps():
    """Flag axes broadcast: a moment's terms can span more rows than the persistent bytes (the
    in-place sums of formulas/memory._peak once raised a ValueError here, found by the API fuzz)."""
    import pandas as pd

    import shardplan

    both = shardplan.sweep(dropout=[True, False], sync_every_micro_batch=[True, False])
    parts = pd.concat([shardplan.sweep(dropout=[d], sync_every_micro_batch=[s])
                       for d in (True, False) for s in (True, False)])
    keys = list(both.columns[:12]) + ["dropout", "sync_every_micro_batch"]
    a, b = (f.sort_values(keys).reset_index(drop=True) for f in (both, parts))
    pd.testing.assert_frame_equal(a, b)
