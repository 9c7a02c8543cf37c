"""A card run below its TDP (``hardware.power_limit_clock_factor``): its tensor-core rate falls as
the cube root of the power limit (P ∝ f³), its HBM bandwidth does not; a published row that states
its power limit (torchtitan's 500 W Grand Teton H100s) is predicted at it."""

import dataclasses
import statistics

import pytest

from shardplan.inputs.hardware import at_power_limit, get_gpu, power_limit_clock_factor
from shardplan.validation import tokens
from shardplan.validation.runs import RunQuery, read_runs

QUERIES = {r.row_id: r for r in read_runs(tokens.RUNS) if isinstance(r, RunQuery)}
H100_NVL_BF16, H100_SXM_BF16 = 835.5e12, 989.4e12  # NVIDIA datasheets, dense (half the sparse figure)


@pytest.mark.parametrize("limit", [200.0, 300.0, 400.0, 500.0, 600.0])
def test_the_rate_is_the_cube_root_of_the_power_share(limit):
    assert power_limit_clock_factor(limit, 700.0) == pytest.approx((limit / 700.0) ** (1 / 3))
    assert power_limit_clock_factor(limit, 700.0) < power_limit_clock_factor(limit + 50.0, 700.0)


@pytest.mark.parametrize("limit, tdp", [(700.0, 700.0), (800.0, 700.0), (300.0, None)])
def test_no_cap_below_the_tdp_changes_nothing(limit, tdp):
    assert power_limit_clock_factor(limit, tdp) == 1.0


def test_the_rule_reproduces_the_h100_nvl_datasheet():
    # the same Hopper die at NVL's 400 W against SXM's 700 W: a check of the rule, not a fit
    assert power_limit_clock_factor(400.0, 700.0) == pytest.approx(H100_NVL_BF16 / H100_SXM_BF16, rel=0.02)


def test_500_w_lands_inside_torchtitans_stated_bracket():
    # benchmarks/llama3_h100_202412_torchtitan.md: "the actual peak TFLOPs number is between SXM and NVL"
    capped, _ = at_power_limit(get_gpu("h100-sxm"), 500.0)
    assert H100_NVL_BF16 < capped.peak_flops["bf16"] < H100_SXM_BF16


def test_the_cap_scales_tensor_peaks_not_memory_bandwidth():
    gpu = get_gpu("h100-sxm")
    capped, factor = at_power_limit(gpu, 350.0)
    f = (350.0 / 700.0) ** (1 / 3)
    assert factor == pytest.approx(f)
    assert all(capped.peak_flops[k] == pytest.approx(v * f) for k, v in gpu.peak_flops.items())
    assert capped.memory_bandwidth_bytes_per_s == gpu.memory_bandwidth_bytes_per_s


def test_a_row_stating_its_power_limit_is_read_at_it():
    tt, mf = QUERIES["TT001"], QUERIES["MF001"]
    f = (500.0 / 700.0) ** (1 / 3)
    assert tt.cluster.gpu.peak_flops["bf16"] == pytest.approx(H100_SXM_BF16 * f, rel=1e-3)
    assert any("500 W power limit" in a for a in tt.assumed)
    assert mf.cluster.gpu.peak_flops["bf16"] == pytest.approx(H100_SXM_BF16, rel=1e-3)


def _uncapped(q: RunQuery) -> RunQuery:
    return dataclasses.replace(q, cluster=q.cluster.model_copy(update={"gpu": q.cluster.gpu.model_copy(
        update={"peak_flops": get_gpu("h100-sxm").peak_flops})}))


def test_a_capped_step_slows_by_less_than_the_clock():
    # matmuls and attention slow by 1/f, the HBM-bound element-wise kernels do not
    tt = QUERIES["TT001"]
    capped, = tokens.predict([tt])
    full, = tokens.predict([_uncapped(tt)])
    f = (500.0 / 700.0) ** (1 / 3)
    assert f < capped.predicted / full.predicted < 1.0


def test_the_stated_cap_brings_torchtitans_h100_rows_closer():
    rows = [QUERIES[i] for i in ("TT001", "TT002", "TT004", "TT005")]
    with_cap = statistics.median(abs(r.error) for r in tokens.predict(rows))
    without = statistics.median(abs(r.error) for r in tokens.predict([_uncapped(q) for q in rows]))
    assert with_cap < without
