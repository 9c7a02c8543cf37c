"""Hardware a benchmark table leaves out but its source states elsewhere (``runs.SOURCE_HARDWARE``):
torchao's float8 H100 table ran on Meta's H100 variant (96 GB HBM2e, 2.4 TB/s, 500 W), its B200
table on B200s limited to 750 W; the MI300X table on the same page states nothing more."""

import pytest

from shardplan.inputs.hardware import get_gpu
from shardplan.validation import tokens
from shardplan.validation.runs import RunQuery, express, read_runs

QUERIES = {r.row_id: r for r in read_runs(tokens.RUNS) if isinstance(r, RunQuery)}


def test_the_h100_table_is_read_as_metas_h100_variant():
    # AO001, the bf16 row; the float8 rows of the table are not expressible (float8 linears)
    q, sxm = QUERIES["AO001"], get_gpu("h100-sxm")
    gpu = q.cluster.gpu
    assert gpu.peak_flops["bf16"] == pytest.approx(sxm.peak_flops["bf16"] * (500 / 700) ** (1 / 3), rel=1e-6)
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert gpu.memory_bytes == pytest.approx(sxm.memory_bytes * 96 / sxm.nominal_memory_gb, rel=1e-6)
    assert any("custom to Meta's H100 variant" in a for a in q.assumed)


def test_the_b200_table_is_read_at_750_w():
    q, b200 = QUERIES["AO008"], get_gpu("b200")
    assert q.cluster.gpu.peak_flops["bf16"] == pytest.approx(b200.peak_flops["bf16"] * 0.75 ** (1 / 3), rel=1e-6)
    assert q.cluster.gpu.memory_bandwidth_bytes_per_s == b200.memory_bandwidth_bytes_per_s
    assert any("limited to 750W" in a for a in q.assumed)


def test_the_mi300x_table_on_the_same_page_is_left_as_stated():
    q = QUERIES["AO004"]
    assert q.cluster.gpu.peak_flops == get_gpu("mi300x").peak_flops
    assert not any("power limit" in a for a in q.assumed)


@pytest.mark.parametrize("watts", [600, 900])
def test_a_limit_the_row_states_itself_wins_and_scales_the_rate(watts):
    # the source's text is appended after the row's own gpu column, so the row's number is read first
    row = dict(QUERIES["AO008"].row, gpu=f"B200 ({watts}W power limit)")
    q = express(row)
    assert q.cluster.gpu.peak_flops["bf16"] == pytest.approx(2.25e15 * (watts / 1000) ** (1 / 3), rel=1e-6)


def test_a_row_of_another_source_gets_nothing_appended():
    row = dict(QUERIES["AO008"].row, source="some other benchmark", source_locator="a table")
    q = express(row)
    assert q.cluster.gpu.peak_flops == get_gpu("b200").peak_flops


@pytest.mark.parametrize("row_id", ["AO001", "AO008"])
def test_the_stated_hardware_slows_the_prediction_by_at_most_the_clock(row_id):
    # matmuls and attention slow by the clock factor; element-wise kernels by HBM bandwidth (H100 only)
    q = QUERIES[row_id]
    bare = express(dict(q.row, source="unknown", source_locator=""))
    stated, = tokens.predict([q])
    nameplate, = tokens.predict([bare])
    assert stated.predicted < nameplate.predicted
    floor = min(q.cluster.gpu.peak_flops["bf16"] / bare.cluster.gpu.peak_flops["bf16"],
                q.cluster.gpu.memory_bandwidth_bytes_per_s / bare.cluster.gpu.memory_bandwidth_bytes_per_s)
    assert stated.predicted / nameplate.predicted > floor
