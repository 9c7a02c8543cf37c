"""A published row's stated card facts reach the step time: torchtitan's HBM2e H100 at its stated
2.4 TB/s (not the SXM profile's 3.35), so its element-wise kernels stream slower."""

import dataclasses

import pytest

from shardplan.validation import tokens
from shardplan.validation.runs import RunQuery, read_runs

QUERIES = {r.row_id: r for r in read_runs(tokens.RUNS) if isinstance(r, RunQuery)}


def test_stated_hbm_bandwidth_replaces_the_profiles():
    tt = QUERIES["TT001"]
    assert tt.cluster.gpu.name == "h100-sxm"
    assert tt.cluster.gpu.memory_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert any("2.4 TB/s" in a for a in tt.assumed)


def test_a_row_without_a_stated_bandwidth_keeps_the_profile():
    mf = QUERIES["MF001"]
    assert mf.cluster.gpu.name == "h100-sxm" and mf.cluster.gpu.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)


def test_slower_hbm_predicts_fewer_tokens():
    tt = QUERIES["TT001"]
    fast = tt.cluster.model_copy(update={"gpu": tt.cluster.gpu.model_copy(update={"memory_bandwidth_bytes_per_s": 3.35e12})})
    slow, = tokens.predict([tt])
    quick, = tokens.predict([dataclasses.replace(tt, cluster=fast)])
    assert slow.predicted < quick.predicted
