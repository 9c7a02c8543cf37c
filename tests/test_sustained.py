"""One GPU over minutes (``shardplan/calibrate/sustained.py``; data/calibration/gpu/sustained/,
measured on one H100): the window statistics' arithmetic, varied on synthetic step series, and what
the committed records establish about the campaign's fastest-step statistic."""

from __future__ import annotations

import pytest

from shardplan.calibrate import sustained as su
from shardplan.calibrate.gpu_compare import compute_step_s, load_records


def test_window_counts_stalls_and_drift_from_the_series():
    base = [5.0] + [1.0] * 40  # first step pays allocation: never in the window
    w = su.window(base)
    assert (w["steps"], w["fastest_s"], w["mean_over_fastest"], w["drift"], w["stalls"]) == (40, 1.0, 1.0, 1.0, 0)
    for every in (10, 5):  # more frequent stalls: a larger mean over fastest, none left without them
        series = [5.0] + [2.0 if i % every == 0 else 1.0 for i in range(1, 41)]
        w = su.window(series)
        assert w["stalls"] == 40 // every
        assert w["mean_over_fastest"] == pytest.approx(1 + (40 // every) / 40)
        assert w["calm_mean_over_fastest"] == pytest.approx(1.0)
    for slope in (0.001, 0.004):  # a warming card: the drift grows with the slope
        w = su.window([5.0] + [1.0 + slope * i for i in range(40)])
        assert w["drift"] == pytest.approx((1 + slope * 34.5) / (1 + slope * 4.5))


@pytest.mark.parametrize("settle", [2, 4, 7])
def test_steady_finds_where_a_warming_run_settles(settle):
    series = [3.0] + [1.3] * (settle - 2) + [1.0] * (16 - settle)  # step `settle` (from 1) is the first at 1.0
    s = su.steady(series)
    assert s["steady_s"] == 1.0 and s["steady_from_step"] == settle


def test_power_cap_share_reads_the_nvml_bit():
    rec = {"clock_columns": ["t_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle_mask"],
           "clock_samples": [[0, 1980, 2619, 300, 40, 0], [1, 1800, 2619, 700, 60, 0x4],
                             [2, 1750, 2619, 700, 70, 0x4 | 0x20], [3, 1980, 2619, 200, 70, 0x1]],
           "power_limit_w": 700.0, "max_sm_mhz": 1980}
    k = su.clocks(rec)
    assert k["power_capped_share"] == 0.5 and k["sm_mhz_median"] == 1890 and (k["temp_c_first"], k["temp_c_last"]) == (40, 70)


def test_the_campaigns_fastest_step_is_reproduced_by_the_sustained_run():
    """The sustained FSDP run and the committed campaign record of the same configuration are two
    measurements of one thing on two lent machines: their fastest steps agree within 2 %, and the model
    at kernel rates is within the step-time test's 5 % median tolerance of both."""
    run = next(r for r in su.load() if r["config"]["kind"] == "fsdp")
    key = su._key(run["config"])
    committed = [r for r in load_records(su.CAMPAIGN) if su._key(r["config"]) == key]
    assert len(committed) == 1
    fastest_run = su.window(run["step_times_s"])["fastest_s"]
    fastest_campaign = min(committed[0]["step_times_s"][1:])
    assert abs(fastest_run / fastest_campaign - 1) < 0.02
    assert abs(compute_step_s(run) / fastest_run - 1) < 0.05


def test_every_rerun_matches_a_committed_configuration_and_one_settles_late():
    pairs = su.rerun_pairs()
    assert len(pairs) == 8
    late = [new["config"] for _, new in pairs if su.steady(new["step_times_s"])["steady_from_step"] > 3]
    assert [(c["method"], c["ac"]) for c in late] == [("lora", "full")]
    # where it settled early, three steps were enough: the committed value is the steady one within 5 %
    for old, new in pairs:
        if new["config"] not in late:
            assert abs(min(old["step_times_s"][1:]) / su.steady(new["step_times_s"])["steady_s"] - 1) < 0.05


def test_campaign_step_prefers_the_rerun():
    (old, new), = [(o, n) for o, n in su.rerun_pairs() if n["config"]["ac"] == "full" and n["config"]["micro_batch"] == 1]
    assert su.campaign_step_s(old) == su.steady(new["step_times_s"])["steady_s"] < min(old["step_times_s"][1:])


def test_docs_section_is_the_generated_one():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "accuracy.md").read_text()
    section = text[text.index(su.BEGIN):text.index(su.END) + len(su.END)]
    assert section == su.report_markdown(), "run python tools/update_accuracy.py"


def test_the_device_script_runs_its_code_paths_on_the_cpu(tmp_path):
    """``benchmarks/gpu_sustained.py --smoke``: the FSDP configuration trains on until its duration,
    the matmul bursts run, and without NVML the records say why instead of holding clock guesses."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("transformers")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sustained.py"
    subprocess.run([sys.executable, str(script), "--smoke", "--out", str(tmp_path)], check=True, timeout=300,
                   capture_output=True)
    recs = [json.loads(line) for line in (tmp_path / "sustained.jsonl").read_text().splitlines()]
    assert [r["config"]["kind"] for r in recs] == ["fsdp", "gemm"] and all(r["status"] == "ok" for r in recs)
    fsdp, gemm = recs
    times = fsdp["step_times_s"]
    # on past the grid's three steps, and no step begun after the duration had passed
    assert len(times) > fsdp["config"]["steps"] and sum(times[:-1]) < fsdp["config"]["duration_s"]
    assert len(fsdp["steps"]) <= 4  # a sustained run keeps the first three steps' statistics and the last
    assert len(gemm["bursts"]) > 1 and gemm["bursts"][-1][0] <= gemm["config"]["duration_s"]  # starts, kept to the ms
    for r in recs:
        assert r["clock_samples"] or r["clock_error"]
