"""planning/evaluate.py, the evaluator fit and plan share: single configurations as rows of one
vectorized pass agree with one call each; the GPU-count search; the sweep's progress callback."""

from __future__ import annotations

import warnings
from dataclasses import fields

import numpy as np
import pytest

from shardplan.formulas.columns import Columns, columns_for, model_values
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import get_model
from shardplan.planning import fit as fit_module
from shardplan.planning.evaluate import cached_model_values, evaluate_queries, query_values
from shardplan.planning.fit import evaluate, evaluate_many, fewest_gpus_that_fit

MODELS = ("opt-1.3b", "llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen2.5-72b")
GPUS = ("h100-sxm", "rtx4090", "a100-80gb")


def _random_queries(n: int, seed: int) -> list[tuple]:
    """``n`` valid configurations drawn across every engine, strategy, method, stack and offload."""
    rng = np.random.default_rng(seed)
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    out = []
    while len(out) < n:
        count = pick((1, 2, 4, 8, 16))
        engine = pick(st.ENGINES)
        strategy = "single" if count == 1 else pick(st.STRATEGIES)
        if not bool(st.is_valid(st.STRATEGIES.index(strategy), st.ENGINES.index(engine))) or strategy == "single" and count != 1:
            continue
        config = TrainingConfig(strategy=strategy, engine=engine, method=pick(st.METHODS), stack=pick(st.STACKS),
                                ac=pick(("none", "full", "selective")), micro_batch=int(rng.integers(1, 5)),
                                seq_len=pick((512, 2048, 8192)), offload=pick(("none", "optimizer", "optimizer+params")),
                                optimizer=pick(("adamw", "sgd", "adamw-8bit")))
        out.append((get_model(pick(MODELS)), parse_gpus(f"{count}x{pick(GPUS)}"), config))
    return out


def test_queries_in_one_pass_equal_one_call_each():  # the 1,000-configuration agreement
    """1,000 random configurations: every memory column and the verdict of the one-pass evaluation
    equal fit.evaluate's, called one at a time (exact: the same integer arithmetic)."""
    queries = _random_queries(1000, seed=13)
    batch = evaluate_queries(queries)
    for i, (spec, cluster, config) in enumerate(queries):
        if batch["overflow"][i]:
            continue
        one = evaluate(spec, cluster, config)
        assert one.per_gpu.device_total_bytes == int(batch["device_total_bytes"][i]), (i, config)
        assert one.per_gpu.peak_allocated_bytes == int(batch["peak_allocated_bytes"][i])
        assert one.per_gpu.breakdown == {k: int(batch[k][i]) for k in one.per_gpu.breakdown}
        assert (one.band_bytes, one.margin_bytes) == (int(batch["band_bytes"][i]), int(batch["margin_bytes"][i]))
        assert one.fits == (int(batch["verdict"][i]) == 0)


def test_evaluate_many_is_evaluate_row_by_row():
    spec = get_model("llama-3.1-8b")
    queries = [(parse_gpus("8xh100-sxm"), TrainingConfig(strategy=s), None) for s in ("ddp", "full_shard", "zero2")
               if s != "zero2"] + [(parse_gpus("2xrtx4090"), TrainingConfig(method="qlora", ac="full"), ["a note"])]
    many = evaluate_many(spec, queries)
    for (cluster, config, notes), result in zip(queries, many):
        assert result == evaluate(spec, cluster, config, notes)


def test_query_values_are_columns_for():
    spec, cluster = get_model("llama-3.1-8b"), parse_gpus("4xa100-80gb")
    config = TrainingConfig(method="lora", stack="torchtune", lora_rank=32)
    c = columns_for(spec, cluster, config)
    ours = Columns.build(**query_values(spec, cluster, config))
    for f in fields(Columns):
        assert np.array_equal(getattr(c, f.name), getattr(ours, f.name)), f.name


def test_model_values_are_cached_per_spec_object():
    spec = get_model("llama-3.1-8b")
    first = cached_model_values(spec, 16, "all-linear")
    assert first == model_values(spec, 16, "all-linear")
    assert cached_model_values(spec, 16, "all-linear") is first          # computed once
    assert cached_model_values(spec, 8, "all-linear")["lora_params"] < first["lora_params"]  # rank is in the key


@pytest.mark.parametrize("model,gpus,config", [
    ("llama-3.1-70b", "4x24GB", TrainingConfig(strategy="full_shard")),
    ("llama-3.1-70b", "4x24GB", TrainingConfig(strategy="ddp")),
    ("llama-3.1-8b", "8xh100-sxm", TrainingConfig(strategy="full_shard", seq_len=65536)),
    ("qwen2.5-72b", "8xa100-80gb", TrainingConfig(strategy="hybrid_shard", ac="full")),
    ("opt-1.3b", "1xrtx4090", TrainingConfig(strategy="single")),
])
def test_staged_gpu_count_search_finds_the_first_fitting_count(monkeypatch, model, gpus, config):
    """The staged search (COUNT_STAGES) answers what one evaluation of every count answers."""
    spec, cluster = get_model(model), parse_gpus(gpus)
    staged = fewest_gpus_that_fit(spec, cluster, config)
    monkeypatch.setattr(fit_module, "COUNT_STAGES", ())
    assert staged == fewest_gpus_that_fit(spec, cluster, config)


def test_old_minimum_gpus_names_warn_and_answer_the_same():
    import shardplan
    from shardplan.planning.sweep_analysis import fewest_gpus_per_group

    spec, cluster, config = get_model("llama-3.1-70b"), parse_gpus("4x24GB"), TrainingConfig()
    with pytest.warns(DeprecationWarning):
        assert fit_module.minimum_gpus(spec, cluster, config) == fewest_gpus_that_fit(spec, cluster, config)
    df = shardplan.sweep(models="llama-3.1-8b", gpus="rtx4090", gpu_counts=[1, 2, 4, 8], progress=False)
    with pytest.warns(DeprecationWarning):
        old = shardplan.minimum_gpus(df)
    assert old.equals(fewest_gpus_per_group(df))


def test_sweep_reports_progress_through_its_callback_and_writes_no_stderr(capsys):
    import shardplan

    calls = []
    df = shardplan.sweep(models="llama-3.1-8b", gpu_counts=[1, 2, 4, 8], seq_len=[512, 1024, 2048], chunk_size=5,
                         progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (len(df), len(df)) and all(total == len(df) for _, total in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and len(calls) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shardplan.sweep(models="llama-3.1-8b", gpu_counts=[1, 8], progress=False)
    assert capsys.readouterr().err == ""


def test_progress_true_draws_the_command_lines_bar(capsys):
    import shardplan

    shardplan.sweep(models="llama-3.1-8b", gpu_counts=[1, 8], progress=True)
    err = capsys.readouterr().err
    assert err.startswith("\rsweep [") and "100.0%" in err and err.endswith("\n")


@pytest.mark.parametrize("queries", [[], [1], [("a", "b", "c")], 5, "abc", [(get_model("opt-1.3b"), "8xh100", None)]])
def test_bad_queries_are_one_error(queries):
    from shardplan.support.errors import ShardplanError

    with pytest.raises(ShardplanError):
        evaluate_queries(queries)


def test_fit_of_no_strategies_is_no_result():
    assert fit_module.fit(get_model("opt-1.3b"), parse_gpus("1xh100-sxm"), TrainingConfig(), []) == []
