"""The calibrated window factor (``throughput.ComputeRates.window_factor``,
``validation/window_factor.py``): it scales a step's GPU seconds and nothing else; it is fitted on
the other sources for each source; answers use the shipped value and say it is calibrated; the
fastest-step comparisons (the H100 campaign) run at kernel rates, k = 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shardplan.formulas import throughput as tp
from shardplan.formulas.comm import link_rates
from shardplan.formulas.efficiencies import efficiencies_used
from shardplan.inputs import strategy as st
from shardplan.inputs import time_calibration
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.planning.fit import step_timings
from shardplan.validation import window_factor
from tests.helpers import columns


@pytest.mark.parametrize("k", [1.1, 1.3])
@pytest.mark.parametrize("gpus", ["8xh100-sxm", "16xa100-80gb"])
def test_the_factor_scales_gpu_seconds_only(k, gpus):
    cluster = parse_gpus(gpus)
    c = columns("llama-3.1-8b", seq_len=4096, world_size=cluster.world_size, grad_accum=2)
    one, scaled = (tp.step_time(c, link_rates(cluster), tp.compute_rates(cluster, window_factor=w)) for w in (1.0, k))
    assert float(scaled["compute_s"]) == pytest.approx(k * float(one["compute_s"]), rel=1e-9)
    assert float(scaled["optimizer_s"]) == pytest.approx(k * float(one["optimizer_s"]), rel=1e-9)
    assert float(scaled["comm_s"]) == float(one["comm_s"])
    # MFU is against the nameplate peak: it falls as the step lengthens
    assert float(scaled["mfu"]) == pytest.approx(float(one["mfu"]) * float(one["step_time_s"] / scaled["step_time_s"]))


def test_offloaded_optimizer_runs_on_the_host_unscaled():
    cluster = parse_gpus("8xh100-sxm")
    c = columns("llama-3.1-8b", offload=st.OFFLOAD_OPTIMIZER)
    one, scaled = (tp.step_time(c, link_rates(cluster), tp.compute_rates(cluster, window_factor=w)) for w in (1.0, 1.2))
    assert float(scaled["optimizer_s"]) == float(one["optimizer_s"]) and float(scaled["offload_transfer_s"]) == float(one["offload_transfer_s"])


def _rows(**per_source):
    return [SimpleNamespace(source=s, error=e, gpu_share=g) for s, items in per_source.items() for e, g in items]


def test_each_source_is_fitted_without_its_own_rows():
    rows = _rows(A=[(0.10, 1.0), (0.30, 0.5)], B=[(0.20, 1.0)], C=[(0.0, 1.0)], D=[(-0.1, 0.5)])
    per = window_factor.source_factors(rows)
    assert per == pytest.approx({"A": 1.35, "B": 1.2, "C": 1.0, "D": 0.8})  # A: median of 1.1 and 1.6
    loso = window_factor.loso(rows)
    assert loso["A"] == pytest.approx(1.0) and loso["C"] == pytest.approx(1.2)  # medians of B, C, D / A, B, D
    # a source moving its own rows leaves its own factor alone
    moved = _rows(A=[(0.9, 1.0)], B=[(0.20, 1.0)], C=[(0.0, 1.0)], D=[(-0.1, 0.5)])
    assert window_factor.loso(moved)["A"] == loso["A"]


def test_the_shipped_factor_is_the_fit_of_the_dev_set():
    from shardplan.validation import tokens

    rows = tokens.predict(tokens.dev_set_queries(), window_factor=1.0)
    assert time_calibration.TIME_CALIBRATION_FILE.read_text() == window_factor.calibration_text(rows)


def test_answers_carry_the_calibrated_factor_and_say_so():
    spec, cluster = resolve_model("llama-3.1-8b").spec, parse_gpus("8xh100-sxm")
    config = TrainingConfig(stack="torchtitan", seq_len=4096)
    k = time_calibration.window_factor()
    answer, kernel = (step_timings(spec, cluster, [config], window_factor=w)[0] for w in (None, 1.0))
    assert answer["compute_s"] == pytest.approx(k * kernel["compute_s"], rel=1e-9)
    window = [e for e in efficiencies_used(cluster, config.model_dump(), 0.6) if e["name"] == "window"]
    assert window and window[0]["status"] == "calibrated" and window[0]["value"] == pytest.approx(1 / k, abs=1e-4)


def test_no_stated_factor_means_the_calibrated_one_on_every_path(monkeypatch):
    # one helper decides it (time_calibration.window_factor): with another shipped value, every
    # path that states no factor (answers, the sweep, the tokens/s report) follows it, and a stated
    # factor passes through unchanged
    import shardplan
    from shardplan.validation import tokens

    monkeypatch.setattr(time_calibration, "time_calibration", lambda: {"value": 1.4})
    assert time_calibration.window_factor() == 1.4 and time_calibration.window_factor(1.0) == 1.0
    spec, cluster = resolve_model("llama-3.1-8b").spec, parse_gpus("8xh100-sxm")
    config = TrainingConfig(strategy="full_shard", seq_len=4096)
    answer, kernel = (step_timings(spec, cluster, [config], window_factor=w)[0] for w in (None, 1.0))
    assert answer["compute_s"] == pytest.approx(1.4 * kernel["compute_s"], rel=1e-9)
    df = shardplan.sweep(models="llama-3.1-8b", gpus="h100-sxm", gpu_counts=8, strategies="full_shard",
                         seq_len=4096, progress=False)
    # the sweep's default stack is hf, whose RoPE is Transformers' rotate_half (the columns' default is complex)
    c = columns("llama-3.1-8b", seq_len=4096, world_size=8, rope_form=st.ROPE_ROTATE_HALF)
    at_one = tp.step_time(c, link_rates(cluster), tp.compute_rates(cluster))
    assert float(df["compute_s"].iloc[0]) == pytest.approx(1.4 * float(at_one["compute_s"]), rel=1e-9)
    query = tokens.dev_set_queries()[0]
    assert [r.window_factor for r in tokens.predict([query])] == [1.4]
    assert [r.window_factor for r in tokens.predict([query], {query.source: 1.2})] == [1.2]


def test_kernel_rates_are_the_default_of_compute_rates():
    # the fastest-step comparisons (tests/test_step_times_h100.py, calibrate.host_fit) call
    # compute_rates without a factor: a warm single GPU's fastest step is what the kernel rates price
    assert float(tp.compute_rates(parse_gpus("1xh100-sxm")).window_factor) == 1.0


def test_a_bad_calibration_file_is_one_line(tmp_path):
    from shardplan.support.errors import ShardplanError

    bad = tmp_path / "time_calibration.json"
    bad.write_text('{"window_factor": {"value": 0, "status": "calibrated", "derivation": "", "per_source": {}, "loso": {}}}')
    with pytest.raises(ShardplanError, match=r"window_factor\.value"):
        time_calibration.load(bad)
