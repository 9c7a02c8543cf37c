"""formulas/scalar_twin.py: one configuration's memory and verdict in Python numbers through the
same formula functions as the arrays. Expected values are the vectorized batch's own (the path
every sweep and search uses): equal exactly for integers, within 1e-12 relative for floats, and
of the same kind (a byte count an int in both); and scalar_numpy's functions are numpy's for 0-d
inputs."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

from shardplan.formulas import scalar_numpy, scalar_twin
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.planning import evaluate as evaluator
from shardplan.planning.evaluate import evaluate_queries, evaluate_query

from test_evaluate import _random_queries

KIND = {"i": int, "b": bool, "f": float}


def _assert_row_equals_batch(one: dict, batch: dict, i: int) -> None:
    for name, column in batch.items():
        expected = np.broadcast_to(np.asarray(column), np.shape(batch["verdict"]))[i]
        got = one[name]
        assert type(got) is KIND[expected.dtype.kind], (name, type(got), expected.dtype)
        if expected.dtype.kind == "f":
            assert np.isclose(got, float(expected), rtol=1e-12, atol=0.0, equal_nan=True), (name, got, expected)
        else:
            assert got == expected.item(), (name, got, expected)


def test_one_configuration_in_python_numbers_equals_the_batch():
    """1,000 random configurations across every engine, strategy, method, stack and offload: each
    through the twin equals its row of one vectorized pass, column by column."""
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


def test_every_knob_in_python_numbers_equals_the_batch():
    """500 configurations drawing every knob a TrainingConfig has: the twin equals the batch."""
    warnings.simplefilter("ignore", RuntimeWarning)
    queries = _every_knob_queries(500, seed=41)
    batch = evaluate_queries(queries)
    for i, query in enumerate(queries):
        _assert_row_equals_batch(evaluate_query(*query), batch, i)


def test_the_twin_evaluates_without_numpy_arrays():
    """Every result is a Python number (no numpy scalar or 0-d array leaks in from a table or a
    function the twin did not rebind)."""
    spec, cluster, config = _random_queries(1, seed=3)[0]
    for name, value in evaluate_query(spec, cluster, config).items():
        assert type(value) in (int, float, bool), (name, type(value))


def test_every_function_of_a_twinned_module_runs_over_scalar_numpy():
    twins = scalar_twin.twin()
    for name, twin in twins.items():
        assert twin.np is scalar_numpy, name
        for attr, value in vars(twin).items():
            if isinstance(value, types.FunctionType) and value.__module__ in twins:
                assert value.__globals__["np"] is scalar_numpy, (name, attr)
    original = __import__("shardplan.formulas.memory", fromlist=["np"])
    assert original.np is np  # the arrays' modules are untouched


def test_arithmetic_python_refuses_goes_through_the_arrays(monkeypatch):
    """Python raises where numpy gives inf/nan with a warning (a division by zero): the query is
    answered by the one-row batch, the same columns."""
    spec, cluster, config = _random_queries(1, seed=5)[0]
    expected = evaluate_query(spec, cluster, config)
    memory = scalar_twin.module("formulas.memory")

    def divides_by_zero(*args, **kwargs):
        return 1 // 0

    monkeypatch.setattr(memory, "estimate_memory", divides_by_zero)
    assert evaluator.scalar_memory_verdict(evaluator.scalar_columns(evaluator.query_values(spec, cluster, config))) is None
    assert evaluate_query(spec, cluster, config) == expected


@pytest.mark.parametrize("x", [-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 7.999, 1e15 + 0.5])
def test_scalar_numpy_rounds_and_casts_as_numpy(x):
    assert scalar_numpy.asarray(x, dtype=scalar_numpy.int64) == int(np.asarray(x, dtype=np.int64))
    assert scalar_numpy.ceil(x) == np.ceil(x) and scalar_numpy.floor(x) == np.floor(x)
    assert scalar_numpy.round(x) == np.round(x)
    assert scalar_numpy.asarray(x, dtype=bool) == bool(np.asarray(x, dtype=bool))


def test_scalar_numpy_choices_as_numpy():
    for condition in (True, False):
        assert scalar_numpy.where(condition, 3, 4.5) == np.where(condition, 3, 4.5)
        assert scalar_numpy.logical_not(condition) == np.logical_not(condition)
    for a in range(3):
        conditions, choices = [a == 0, a == 1], [10, 20]
        assert scalar_numpy.select(conditions, choices, 30) == np.select(conditions, choices, 30)
        assert scalar_numpy.choose(a, [5, 6, 7]) == np.choose(a, [5, 6, 7])
        assert scalar_numpy.isin(a, [0, 2]) == np.isin(a, [0, 2])
    values = [3, 7, 7, 1]
    assert scalar_numpy.argmax(values) == np.argmax(values) == 1  # the first of equal maxima
    assert scalar_numpy.clip(-4, 0, 9) == np.clip(-4, 0, 9) and scalar_numpy.clip(12, 0, 9) == np.clip(12, 0, 9)
    assert (scalar_numpy.maximum(2, 5.0), scalar_numpy.minimum(2, 5.0)) == (np.maximum(2, 5.0), np.minimum(2, 5.0))


def _rewritten(expression: str, **names):
    """``expression`` as the twin compiles it (``_ScalarCalls``), evaluated over ``names`` with
    ``np`` = scalar_numpy."""
    import ast

    tree = ast.Expression(body=scalar_twin._ScalarCalls().visit(ast.parse(expression, mode="eval").body))
    return eval(compile(ast.fix_missing_locations(tree), "<rewritten>", "eval"), {"np": scalar_numpy, **names})


@pytest.mark.parametrize("expression", [
    "np.where(a > 1, 3, 4)", "np.where(a > 1, 2.5, 4.5)", "np.select([a == 0, a == 1], [10, 20], 30)", "np.select([a == 0, a == 2], [10, 20])",
    "np.asarray(a * 2.7, dtype=np.int64)", "np.asarray(a, dtype=bool)", "np.asarray(a / 3)", "np.logical_not(a > 0)",
    "np.zeros(np.shape(a), dtype=np.int64) + a", "np.ones(np.shape(a), dtype=bool)", "np.zeros(np.shape(a))",
    "np.zeros_like(a, dtype=np.float64)", "np.ones_like(a, dtype=np.int8) * a",
])
@pytest.mark.parametrize("a", [0, 1, 2])
def test_rewritten_numpy_calls_mean_what_numpy_means_for_one_value(expression, a):
    # the twin writes these calls as Python expressions (no call into scalar_numpy): the value and
    # its kind (int / bool / float) must be numpy's for a 0-d input
    got, expected = _rewritten(expression, a=a), eval(expression, {"np": np, "a": np.asarray(a)})
    assert type(got) is KIND[np.asarray(expected).dtype.kind], (expression, got, expected)
    assert got == np.asarray(expected).item(), (expression, got, expected)


def test_memoized_lookups_answer_as_the_functions_do():
    # MEMOIZED functions keep answers per argument tuple in the twin: the same answers as the
    # arrays' functions for every engine and strategy code, True and 1 kept apart (typed)
    from shardplan.inputs import engines

    twin_engines, twin_strategy = scalar_twin.module("inputs.engines"), scalar_twin.module("inputs.strategy")
    for engine in range(len(st.ENGINES)):
        for strategy in range(len(st.STRATEGIES)):
            assert twin_engines.per_strategy("shards", engine, strategy) == engines.per_strategy("shards", engine, strategy).tolist()
            assert twin_engines.wrapper_is(engines.W_FSDP, engine, strategy) == bool(engines.wrapper_is(engines.W_FSDP, engine, strategy))
            for world, group in ((8, 4), (1, 1)):
                assert twin_strategy.shard_degrees(strategy, engine, world, group) == tuple(
                    int(d) for d in st.shard_degrees(strategy, engine, world, group))
    assert all(hasattr(getattr(scalar_twin.twin()[module], name), "cache_info")
               for module, names in scalar_twin.MEMOIZED.items() for name in names)


def test_engine_tables_as_python_values_index_as_numpy():
    from shardplan.inputs import engines

    tables = engines.tables()
    scalar = scalar_twin.scalar_tables()
    for name in ("param_bytes", "shards", "offload_ok", "layout", "grad_bucket"):
        array = getattr(tables, name)
        for index in np.ndindex(array.shape):
            key = index[0] if len(index) == 1 else index
            assert getattr(scalar, name)[key] == array[index].item(), (name, index)
    assert scalar.shards[1, 2] == tables.shards[1, 2].tolist()


def test_rewritten_code_is_kept_beside_the_bytecode_and_follows_the_source(tmp_path, monkeypatch):
    """The compiled twin of a module is written once (when Python writes bytecode) and read back
    by the next process; an edit to the module's source compiles it again."""
    import importlib.util
    import sys as system

    source = tmp_path / "tiny_formula.py"
    source.write_text("import numpy as np\n\n\ndef pick(c):\n    return np.where(c > 1, 10, 20)\n")
    spec = importlib.util.spec_from_file_location("tiny_formula", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(system, "dont_write_bytecode", False)
    scalar_twin.scalar_definitions(module)
    cached = list((tmp_path / "__pycache__").glob("tiny_formula.*.scalar-twin.pyc"))
    assert len(cached) == 1
    parse = scalar_twin.ast.parse
    monkeypatch.setattr(scalar_twin.ast, "parse", lambda *a, **k: pytest.fail("parsed again with a valid cache"))
    namespace = {"np": scalar_numpy}
    compiled: dict = {}
    exec(scalar_twin.scalar_definitions(module), namespace, compiled)
    assert compiled["pick"](2) == 10 and compiled["pick"](0) == 20
    monkeypatch.setattr(scalar_twin.ast, "parse", parse)
    source.write_text("import numpy as np\n\n\ndef pick(c):\n    return np.where(c > 1, 11, 21)\n")
    exec(scalar_twin.scalar_definitions(module), namespace, compiled)
    assert compiled["pick"](2) == 11


def test_a_one_shot_process_does_not_build_the_twin():
    """The first single query of a process goes through the arrays (a one-shot command would not
    earn back compiling the twin); the second builds it; both answers are the same."""
    import subprocess
    import sys as system

    script = (
        "from shardplan.formulas import scalar_twin\n"
        "from shardplan.inputs.config import TrainingConfig\n"
        "from shardplan.inputs.hardware import parse_gpus\n"
        "from shardplan.inputs.models import get_model\n"
        "from shardplan.planning.evaluate import evaluate_query\n"
        "q = (get_model('llama-3.1-8b'), parse_gpus('8xh100-sxm'), TrainingConfig(method='lora'))\n"
        "first = evaluate_query(*q); built_first = scalar_twin.twin.cache_info().currsize\n"
        "second = evaluate_query(*q)\n"
        "print(built_first, scalar_twin.twin.cache_info().currsize, first == second)\n")
    out = subprocess.run([system.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1", "True"]


# --- step time: the same twin for comm.py and throughput.py ----------------------------------------
def _array_time_row(spec, cluster, config) -> dict:
    """The expected time columns: one row of the arrays' ``time_columns`` (each row's own sync)."""
    c = evaluator.stack_queries([evaluator.query_values(spec, cluster, config)])
    return evaluator.rows_of(evaluator.checked_time_columns(c, cluster, None, None), 1)[0]


def _assert_same_values(got: dict, expected: dict, names) -> None:
    for name in names:
        assert type(got[name]) is type(expected[name]), (name, type(got[name]), type(expected[name]))
        if isinstance(expected[name], float):
            assert np.isclose(got[name], expected[name], rtol=1e-12, atol=0.0, equal_nan=True), (name, got[name], expected[name])
        else:
            assert got[name] == expected[name], (name, got[name], expected[name])


@pytest.mark.parametrize("make, n, seed", [(_random_queries, 1000, 31), (_every_knob_queries, 300, 43)])
def test_step_time_in_python_numbers_equals_the_arrays(make, n, seed):
    """Communication volume and time, step time, tokens/s with its band, MFU: every time column of
    the twin equals the one-row arrays' (exact integers, floats within 1e-12 relative, the same
    kinds), with the memory columns unchanged by asking for time; ``overflow`` from both guards."""
    warnings.simplefilter("ignore", RuntimeWarning)
    scalar_twin.twin()  # every query below through the twin
    for spec, cluster, config in make(n, seed):
        expected = _array_time_row(spec, cluster, config)
        got = evaluate_query(spec, cluster, config, time=True)
        _assert_same_values(got, expected, [k for k in expected if k != "overflow"])
        memory = evaluate_query(spec, cluster, config)
        assert {k: got[k] for k in memory if k != "overflow"} == {k: v for k, v in memory.items() if k != "overflow"}
        assert got["overflow"] == (memory["overflow"] or expected["overflow"])


def test_a_step_time_python_refuses_goes_through_the_arrays(monkeypatch):
    """Python raises where numpy gives inf/nan (a division by zero in a time formula): the whole
    query, memory and time, is answered by the one-row arrays, the same columns."""
    spec, cluster, config = _random_queries(1, seed=7)[0]
    expected = evaluate_query(spec, cluster, config, time=True)

    def divides_by_zero(*args, **kwargs):
        return 1 / 0

    monkeypatch.setattr(scalar_twin.module("formulas.throughput"), "step_time", divides_by_zero)
    assert evaluator.scalar_time_columns(evaluator.scalar_columns(evaluator.query_values(spec, cluster, config)),
                                         cluster) is None
    got = evaluate_query(spec, cluster, config, time=True)
    assert got.keys() == expected.keys()
    _assert_same_values(got, expected, [k for k in expected if k != "overflow"])


def test_step_timing_reads_the_configurations_sync_and_agrees_with_the_planners_grid():
    """fit.step_timing: gradients reduced as the configuration says (no_sync: once per step), the
    numbers the planner's grid gives for that sync (evaluate_grid), through the twin or the arrays."""
    from shardplan.inputs.config import columns_for
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


def test_a_calibrations_step_time_goes_through_the_arrays(tmp_path):
    """A calibration's per-size link tables are evaluated with arrays: evaluate_query(time=True,
    calibration=...) equals the planner's grid with that calibration, and differs from nameplate."""
    from pathlib import Path

    from shardplan.calibrate.collectives import fit_link, parse_nccl_tests_file
    from shardplan.calibrate.overlay import load_calibration, write_calibration
    from shardplan.inputs.config import columns_for
    from shardplan.inputs.hardware import parse_gpus
    from shardplan.inputs.models import get_model
    from shardplan.planning.fit import TIME_FIELDS
    from shardplan.planning.planner import evaluate_grid

    data = Path(__file__).parent / "data"
    write_calibration(tmp_path / "cal.json",
                      links=[fit_link(parse_nccl_tests_file(data / "nccl_tests_sample_all_gather_perf.txt"))])
    calibration = load_calibration(tmp_path / "cal.json")
    spec, cluster, config = get_model("llama-3.1-8b"), parse_gpus("8xh100-sxm"), TrainingConfig()
    scalar_twin.twin()
    got = evaluate_query(spec, cluster, config, time=True, calibration=calibration)
    grid = evaluate_grid(columns_for(spec, cluster, config), True, cluster, calibration)
    assert got["calibrated"] is True
    for name in TIME_FIELDS:
        assert got[name] == pytest.approx(float(grid[name]), rel=1e-12), name
    assert got["comm_s"] != evaluate_query(spec, cluster, config, time=True)["comm_s"]


def test_step_timings_in_one_pass_equal_step_timing_one_at_a_time():
    """fit's results with time (the CLI's --global-batch-tokens) in one vectorized pass: each equals
    its own step_timing (twin or arrays), within 1e-12 relative."""
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
