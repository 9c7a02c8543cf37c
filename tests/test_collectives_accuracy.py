"""The α-β collective model (NCCL's protocol choice, ``comm.nccl_ring_time_s``) against published
nccl-tests lines (``tests/data/published_runs/collectives.csv``; ``shardplan.validation.collectives``).

Tolerances: the bandwidth-bound regime must stay within the issue's target, 10 % median |error|
out of source (6.6 % when committed); the latency-bound regime is guarded at its committed
out-of-source median (22.9 %) rounded up to 30 %: the torch harness's per-call floor and the
GPUDirect-TCPXO plugin's latency do not transfer between sources, so 10 % is not reached there
(docs/accuracy.md). The nccl-tests ``-g 8`` lines, whose floor is the host issue cost (sourced, not
fitted on the table), are held to the 10 % target.
"""

from dataclasses import replace

import numpy as np
import pytest

from shardplan.formulas import comm
from shardplan.inputs.hardware import LinkProfile
from shardplan.validation import collectives as vc

ROWS, SKIPPED = vc.load_rows()
BANDWIDTH_TARGET = 0.10
LATENCY_GUARD = 0.30


def _median_abs(rows, cls, loso=True):
    e = vc.errors(rows, loso)
    v = [abs(e[r.row_id]) for r in rows if not r.in_network and vc.regime(r) == cls]
    return float(np.median(v))


def test_rows_cover_both_regimes_links_and_sources():
    assert len(ROWS) >= 150
    assert {vc.regime(r) for r in ROWS} == {"latency", "bandwidth"}
    assert len({r.source for r in ROWS}) >= 4
    assert {r.fabric[0] for r in ROWS} >= {"nvlink4", "nvlink5", "pcie4"}
    assert all(why for why in SKIPPED.values())


def test_bandwidth_bound_within_target_out_of_source():
    assert _median_abs(ROWS, "bandwidth") <= BANDWIDTH_TARGET


def test_latency_bound_does_not_regress():
    assert _median_abs(ROWS, "latency") <= LATENCY_GUARD


def test_nvlink4_ring_matches_nccl_tests_at_every_size():
    """The 64-line H100 NVLink4 sweep (together-nccl-tests): NCCL's protocol model with the host
    floor fitted on the other sources, median |error| over sizes ≥ 16 MiB within 10 %."""
    rows = [r for r in ROWS if r.fabric[0] == "nvlink4" and r.nodes == 1 and r.size_bytes >= 16 << 20]
    e = vc.errors(ROWS, loso=True)
    assert len(rows) >= 30
    assert float(np.median([abs(e[r.row_id]) for r in rows])) <= BANDWIDTH_TARGET


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_link_efficiency_mis_set_twofold_fails(monkeypatch, factor):
    real = LinkProfile.achievable_bytes_per_s.fget
    monkeypatch.setattr(LinkProfile, "achievable_bytes_per_s", property(lambda self: real(self) * factor))
    assert _median_abs(ROWS, "bandwidth") > BANDWIDTH_TARGET


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_ring_latency_mis_set_twofold_fails(monkeypatch, factor):
    """NCCL's per-step latencies (all protocols) off by 2×: the mid-size NVLink4 rows (1-64 MiB,
    where latency and transfer are of one order) leave the 10 % band."""
    monkeypatch.setattr(comm, "NCCL_RING_BASE_S", {k: v * factor for k, v in comm.NCCL_RING_BASE_S.items()})
    monkeypatch.setattr(comm, "NCCL_RING_HOPS_S", {k: tuple(h * factor for h in v) for k, v in comm.NCCL_RING_HOPS_S.items()})
    rows = [r for r in ROWS if r.fabric[0] == "nvlink4" and r.nodes == 1 and (1 << 20) <= r.size_bytes <= (64 << 20)]
    e = vc.errors(rows, loso=False)
    assert float(np.median([abs(v) for v in e.values()])) > BANDWIDTH_TARGET


def test_protocol_choice_is_nccls():
    """Small messages run LL (low latency, a third of the bandwidth), large ones Simple."""
    rates = vc.fabric_rates(("nvlink4", None, 0))
    bus = comm.ring_bus_bytes_per_s(8, 8, rates)
    small = float(comm.nccl_ring_time_s("all_gather", 1024, 1, 8, 1, bus, rates))
    assert small == pytest.approx(6.6e-6 + 7 * 0.6e-6 + 3 * 0.875 * 1024 / float(bus), rel=1e-6)
    big = float(comm.nccl_ring_time_s("all_gather", 1 << 30, 1, 8, 1, bus, rates))
    assert big == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 0.875 * (1 << 30) / float(bus), rel=1e-6)


def test_report_names_every_regime():
    text = vc.report_markdown()
    for cls in ("bandwidth-bound", "latency-bound", "in-network"):
        assert cls in text


@pytest.mark.parametrize("n", [2, 4, 8])
def test_small_message_time_grows_with_ring_length(n):
    """LL's latency is base + steps · hop: a longer ring (world size) takes longer for a tiny message."""
    rates = vc.fabric_rates(("nvlink4", None, 0))
    t = lambda ranks: float(comm.nccl_ring_time_s("all_gather", 4096, 1, ranks, 1, comm.ring_bus_bytes_per_s(ranks, 8, rates), rates))
    assert t(n) < t(2 * n)


def _g8_latency_rows():
    return [r for r in ROWS if r.harness == "nccl-tests" and r.gpus_per_thread == 8 and vc.regime(r) == "latency"]


def test_issue_cost_is_issue_123s_slope():
    """c = Σ N·t / Σ N² over the issue's table (4.24 µs per GPU a thread drives)."""
    assert vc.issue_s_per_gpu() == pytest.approx(860.1e-6 / 203, rel=1e-3)


def test_g8_latency_lines_within_target():
    """together's H100 -g 8 sweep, latency-bound lines (34): max(8·c, NCCL) within 10 % median."""
    rows = _g8_latency_rows()
    e = vc.errors(ROWS, loso=True)
    assert len(rows) >= 30
    assert float(np.median([abs(e[r.row_id]) for r in rows])) <= BANDWIDTH_TARGET


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_issue_cost_mis_set_twofold_fails(monkeypatch, factor):
    c = vc.issue_s_per_gpu()
    monkeypatch.setattr(vc, "issue_s_per_gpu", lambda: c * factor)
    rows = _g8_latency_rows()
    e = vc.errors(ROWS, loso=True)
    assert float(np.median([abs(e[r.row_id]) for r in rows])) > BANDWIDTH_TARGET


@pytest.mark.parametrize("g", [1, 4])
def test_issue_cost_scales_with_gpus_per_thread(g):
    """The same lines as if one thread drove g GPUs instead of 8: the host issue no longer binds
    (g = 1, one process per GPU) or binds at half the time (g = 4): far outside 10 %."""
    rows = [replace(r, gpus_per_thread=g) for r in _g8_latency_rows()]
    e = vc.errors(rows, loso=False)
    assert float(np.median([abs(v) for v in e.values()])) > 3 * BANDWIDTH_TARGET


def test_nccl_tests_time_is_max_of_issue_and_gpu_over_size():
    """Over message size on one ring the harness time is flat at 8·c while NCCL's GPU time is
    below it, then follows the GPU time (iterations are pipelined, not summed); a blocking
    (-z 1) harness adds the two."""
    row = next(r for r in ROWS if r.harness == "nccl-tests" and r.gpus_per_thread == 8 and r.op == "all_gather")
    issue = 8 * vc.issue_s_per_gpu()
    for size in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28):
        r = replace(row, size_bytes=float(size))
        gpu = vc.model_time_s(r)
        assert vc.harness_time_s(r, {}) == pytest.approx(max(issue, gpu))
        assert vc.harness_time_s(replace(r, harness="nccl-tests-blocking"), {}) == pytest.approx(issue + gpu)
    small, big = replace(row, size_bytes=1024.0), replace(row, size_bytes=float(1 << 28))
    assert vc.harness_time_s(small, {}) == pytest.approx(issue) and vc.model_time_s(small) < issue
    assert vc.harness_time_s(big, {}) == pytest.approx(vc.model_time_s(big))
    assert vc.model_time_s(big) > issue


def test_harness_read_from_tool_text():
    assert vc._harness("nccl-tests 2.17.9, NCCL 2.26.2, -g 8 single process, 5 warmup + 20 iters") == ("nccl-tests", 8)
    assert vc._harness("nccl-tests -g 8 -z 1 (blocking), NCCL 2.27.7") == ("nccl-tests-blocking", 8)
    assert vc._harness("nccl-tests (-g 1, srun pmix), NCCL 2.29.7") == ("nccl-tests", 1)
    assert vc._harness("all_reduce_bench.py, torch 2.9.1+cu130, NCCL 2.27.7") == ("torch", 1)
    assert vc._harness("nvbandwidth -i 10") == ("other", 1)


def test_torch_event_timed_call_includes_its_issue():
    """torch's all_reduce_bench times one call with CUDA events after a barrier: the GPU idles
    until that call is issued, so c sits inside the time on top of NCCL's and the floor."""
    row = next(r for r in ROWS if r.harness == "torch" and r.nodes == 1)
    floor = {"intra_node": 7e-6}
    assert vc.harness_time_s(row, floor) == pytest.approx(vc.model_time_s(row) + 7e-6 + vc.issue_s_per_gpu())
