"""The α-β collective model (NCCL 2.26's algorithm and protocol choice, ``comm.nccl_time_s``) against
published nccl-tests lines (``tests/data/published_runs/collectives.csv``; ``shardplan.validation.collectives``).

Nothing is fitted on the table, so every error is out of source. Tolerances: both regimes are held
to the issue's target, 10 % median |error| (bandwidth-bound 5.8 %, latency-bound 7.7 % over all lines
when committed), and so is the issue's literal criterion, the nccl-tests lines alone per regime
(latency-bound 7.8 %, bandwidth-bound 6.2 %). The nccl-tests ``-g 8`` lines, whose floor is the host
issue cost (sourced, not fitted on the table) with the timed loop's fill and drain, the B200
torch-benchmark lines inside a node (one eager operation's host cost, fitted on other runs), the
4-node EFA lines (aws-ofi-nccl's platform latency) and the 2-node TCPXO lines at ≥ 2 GiB, whose bus
bandwidth is the Tree's, are each held to the 10 % target. The GPUDirect-TCPXO plugin's latency is
in no source (docs/accuracy.md): its latency-bound lines are not held.
"""

from dataclasses import replace

import numpy as np
import pytest

from shardplan.formulas import comm, eager_host
from shardplan.inputs.hardware import LinkProfile, get_link
from shardplan.validation import collectives as vc

ROWS, SKIPPED = vc.load_rows()
BANDWIDTH_TARGET = 0.10
LATENCY_GUARD = BANDWIDTH_TARGET


def _median_abs(rows, cls):
    e = vc.errors(rows)
    v = [abs(e[r.row_id]) for r in rows if vc.priced(r) and vc.regime(r) == cls]
    return float(np.median(v))


def test_rows_cover_both_regimes_links_and_sources():
    assert len(ROWS) >= 150
    assert {vc.regime(r) for r in ROWS} == {"latency", "bandwidth"}
    assert len({r.source for r in ROWS}) >= 4
    assert {r.fabric[0] for r in ROWS} >= {"nvlink4", "nvlink5", "pcie4"}
    assert all(why for why in SKIPPED.values())


def test_bandwidth_bound_within_target_out_of_source():
    assert _median_abs(ROWS, "bandwidth") <= BANDWIDTH_TARGET


def test_latency_bound_within_target():
    assert _median_abs(ROWS, "latency") <= LATENCY_GUARD


def _nccl_tests_rows(cls):
    return [r for r in ROWS if r.harness.startswith("nccl-tests") and vc.priced(r) and vc.regime(r) == cls]


@pytest.mark.parametrize("cls", ["latency", "bandwidth"])
def test_nccl_tests_lines_within_target_per_regime(cls):
    """The issue's criterion read strictly: the lines an nccl-tests binary measured, per regime."""
    rows = _nccl_tests_rows(cls)
    assert len(rows) >= 40
    assert _median_abs(rows, cls) <= BANDWIDTH_TARGET


def test_nvlink4_ring_matches_nccl_tests_at_every_size():
    """The 64-line H100 NVLink4 sweep (together-nccl-tests): NCCL's protocol model with the
    harness's host issue, median |error| over sizes ≥ 16 MiB within 10 %."""
    rows = [r for r in ROWS if r.fabric[0] == "nvlink4" and r.nodes == 1 and r.size_bytes >= 16 << 20]
    e = vc.errors(ROWS)
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
    monkeypatch.setattr(comm, "NCCL_TREE_BASE_S", {k: v * factor for k, v in comm.NCCL_TREE_BASE_S.items()})
    monkeypatch.setattr(comm, "NCCL_TREE_HOPS_S", {k: tuple(h * factor for h in v) for k, v in comm.NCCL_TREE_HOPS_S.items()})
    rows = [r for r in ROWS if r.fabric[0] == "nvlink4" and r.nodes == 1 and (1 << 20) <= r.size_bytes <= (64 << 20)]
    e = vc.errors(rows)
    assert float(np.median([abs(v) for v in e.values()])) > BANDWIDTH_TARGET


def test_protocol_choice_is_nccls():
    """Small messages run LL (low latency; bus bandwidth min(llMaxBw, B/2), Hopper's llMaxBw 141 GB/s
    binds on NVLink4), large ones Simple."""
    rates = vc.fabric_rates(("nvlink4", None, 0))
    bus = comm.ring_bus_bytes_per_s(8, 8, rates)
    small = float(comm.nccl_time_s("all_gather", 1024, 1, 8, 1, bus, rates))
    assert small == pytest.approx(6.6e-6 + 7 * 0.6e-6 + 0.875 * 1024 / 141e9, rel=1e-6)
    big = float(comm.nccl_time_s("all_gather", 1 << 30, 1, 8, 1, bus, rates))
    assert big == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 0.875 * (1 << 30) / float(bus), rel=1e-6)


def test_report_names_every_regime():
    text = vc.report_markdown()
    for cls in ("bandwidth-bound", "latency-bound", "in-network"):
        assert cls in text


@pytest.mark.parametrize("n", [2, 4, 8])
def test_small_message_time_grows_with_ring_length(n):
    """LL's latency is base + steps · hop: a longer ring (world size) takes longer for a tiny message."""
    rates = vc.fabric_rates(("nvlink4", None, 0))
    t = lambda ranks: float(comm.nccl_time_s("all_gather", 4096, 1, ranks, 1, comm.ring_bus_bytes_per_s(ranks, 8, rates), rates))
    assert t(n) < t(2 * n)


def _g8_latency_rows():
    return [r for r in ROWS if r.harness == "nccl-tests" and r.gpus_per_thread == 8 and vc.regime(r) == "latency"]


def test_issue_cost_is_issue_123s_slope():
    """c = Σ N·t / Σ N² over the issue's table (4.24 µs per GPU a thread drives)."""
    assert vc.issue_s_per_gpu() == pytest.approx(860.1e-6 / 203, rel=1e-3)


def test_g8_latency_lines_within_target():
    """together's H100 -g 8 sweep, latency-bound lines (34): max(8·c, NCCL) within 10 % median."""
    rows = _g8_latency_rows()
    e = vc.errors(ROWS)
    assert len(rows) >= 30
    assert float(np.median([abs(e[r.row_id]) for r in rows])) <= BANDWIDTH_TARGET


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_issue_cost_mis_set_twofold_fails(monkeypatch, factor):
    c = vc.issue_s_per_gpu()
    monkeypatch.setattr(vc, "issue_s_per_gpu", lambda: c * factor)
    rows = _g8_latency_rows()
    e = vc.errors(ROWS)
    assert float(np.median([abs(e[r.row_id]) for r in rows])) > BANDWIDTH_TARGET


@pytest.mark.parametrize("g", [1, 4])
def test_issue_cost_scales_with_gpus_per_thread(g):
    """The same lines as if one thread drove g GPUs instead of 8: the host issue no longer binds
    (g = 1, one process per GPU) or binds at half the time (g = 4): far outside 10 %."""
    rows = [replace(r, gpus_per_thread=g) for r in _g8_latency_rows()]
    e = vc.errors(rows)
    assert float(np.median([abs(v) for v in e.values()])) > 3 * BANDWIDTH_TARGET


def test_nccl_tests_time_is_max_of_issue_and_gpu_over_size():
    """Over message size on one ring the harness time is 8·c plus the drain T/iters while NCCL's
    GPU time T is below 8·c, then T plus the fill 8·c/iters (iterations are pipelined, not summed);
    a blocking (-z 1) harness adds the two."""
    row = next(r for r in ROWS if r.harness == "nccl-tests" and r.gpus_per_thread == 8 and r.op == "all_gather")
    issue = 8 * vc.issue_s_per_gpu()
    assert row.iters == 20
    for size in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28):
        r = replace(row, size_bytes=float(size))
        gpu = vc.model_time_s(r)
        assert vc.harness_time_s(r) == pytest.approx(max(issue, gpu) + min(issue, gpu) / 20)
        assert vc.harness_time_s(replace(r, harness="nccl-tests-blocking")) == pytest.approx(issue + gpu)
    small, big = replace(row, size_bytes=1024.0), replace(row, size_bytes=float(1 << 28))
    assert vc.harness_time_s(small) == pytest.approx(issue + vc.model_time_s(small) / 20)
    assert vc.model_time_s(small) < issue
    assert vc.harness_time_s(big) == pytest.approx(vc.model_time_s(big) + issue / 20)
    assert vc.model_time_s(big) > issue


@pytest.mark.parametrize("issue,gpu", [(34e-6, 11e-6), (34e-6, 34e-6), (34e-6, 80e-6)])
def test_pipelined_time_over_iterations(issue, gpu):
    """First issue to last completion over ``iters`` iterations: one iteration is the blocking sum,
    more amortise the fill / drain toward max(P, T), and the closed form is the schedule's."""
    assert vc.pipelined_time_s(issue, gpu, 1) == pytest.approx(issue + gpu)
    times = [vc.pipelined_time_s(issue, gpu, n) for n in (1, 2, 5, 20, 10**6)]
    assert times == sorted(times, reverse=True)
    assert times[-1] == pytest.approx(max(issue, gpu), rel=1e-5)
    for n in (3, 20):
        last = max((k + 1) * issue + (n - k) * gpu for k in range(n))  # iteration k's last rank issued at (k+1)·P
        assert vc.pipelined_time_s(issue, gpu, n) == pytest.approx(last / n)


@pytest.mark.parametrize("iters", [1, 10**9])
def test_nccl_tests_lines_need_their_iteration_count(iters):
    """The latency-bound nccl-tests lines at their 20 timed iterations are within 10 %; timed as
    if each iteration were synchronised (1) or with no fill / drain (10⁹ iterations) they are not."""
    rows = [replace(r, iters=iters) for r in _nccl_tests_rows("latency")]
    e = vc.errors(rows)
    assert float(np.median([abs(v) for v in e.values()])) > BANDWIDTH_TARGET


def test_iterations_read_from_tool_text():
    assert vc._iters("nccl-tests 2.17.9, NCCL 2.26.2, -g 8 single process, 5 warmup + 20 iters") == 20
    assert vc._iters("nccl-tests all_reduce_perf -b 8 -e 128 -n 100 -g 4") == 100
    assert vc._iters("nccl-tests all_reduce_perf -g 2") == vc.NCCL_TESTS_ITERS == 20


def test_harness_read_from_tool_text():
    assert vc._harness("nccl-tests 2.17.9, NCCL 2.26.2, -g 8 single process, 5 warmup + 20 iters") == ("nccl-tests", 8)
    assert vc._harness("nccl-tests -g 8 -z 1 (blocking), NCCL 2.27.7") == ("nccl-tests-blocking", 8)
    assert vc._harness("nccl-tests (-g 1, srun pmix), NCCL 2.29.7") == ("nccl-tests", 1)
    assert vc._harness("all_reduce_bench.py, torch 2.9.1+cu130, NCCL 2.27.7") == ("torch", 1)
    assert vc._harness("nvbandwidth -i 10") == ("other", 1)


def _torch_one_node_latency_rows():
    return [r for r in ROWS if r.harness == "torch" and r.nodes == 1 and vc.regime(r) == "latency"]


def test_torch_event_timed_call_adds_one_eager_operation():
    """all_reduce_bench times one call with CUDA events after a barrier that blocks the CPU: the GPU
    idles until the call has been dispatched, so the time is one eager operation's host cost plus
    NCCL's GPU time, whatever the size."""
    row = _torch_one_node_latency_rows()[0]
    for size in (1 << 15, 1 << 20, 1 << 25):
        r = replace(row, size_bytes=float(size))
        assert vc.harness_time_s(r) == pytest.approx(vc.model_time_s(r) + eager_host.HOST_OP_S)


def test_torch_one_node_latency_lines_within_target():
    """ml-engineering's B200 all_reduce_bench sweep inside a node, latency-bound lines (11): NCCL +
    one eager operation (31.5 µs, fitted on the single-GPU HF step runs) within 10 % median."""
    rows = _torch_one_node_latency_rows()
    e = vc.errors(rows)
    assert len(rows) >= 10
    assert float(np.median([abs(v) for v in e.values()])) <= BANDWIDTH_TARGET


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_torch_host_cost_mis_set_twofold_fails(monkeypatch, factor):
    monkeypatch.setattr(vc, "HOST_OP_S", eager_host.HOST_OP_S * factor)
    e = vc.errors(_torch_one_node_latency_rows())
    assert float(np.median([abs(v) for v in e.values()])) > 3 * BANDWIDTH_TARGET


def test_tcpxo_lines_run_nccl_proto_simple():
    """The A3 Mega line's environment (Google's TCPXO profile) allows Simple only: its 8 B
    all-reduce is the Tree/Simple latency, 8.4 + 2·(7·4.0 + 1·14) µs, above NCCL's free choice
    (Tree/LL, 25 µs)."""
    row = next(r for r in ROWS if r.fabric[1] == "eth-200g" and r.size_bytes == 8)
    assert row.protocols == ("simple",)
    assert vc.model_time_s(row) == pytest.approx((8.4 + 2 * (7 * 4.0 + 14.0)) * 1e-6, rel=1e-3)
    assert vc.model_time_s(replace(row, protocols=comm.NCCL_PROTOCOLS)) < 0.3 * vc.model_time_s(row)
    assert all(r.protocols == comm.NCCL_PROTOCOLS for r in ROWS if r.fabric[1] != "eth-200g")


@pytest.mark.parametrize("size", [1 << 10, 1 << 20, 1 << 28])
def test_protocol_restriction_is_the_simple_formula(size):
    """nccl_time_s over Simple alone is the Simple ring time, never below the free choice."""
    rates = vc.fabric_rates(("nvlink4", None, 0))
    bus = comm.ring_bus_bytes_per_s(8, 8, rates)
    simple = float(comm.nccl_time_s("all_gather", size, 1, 8, 1, bus, rates, protocols=("simple",)))
    assert simple == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 0.875 * size / float(bus), rel=1e-6)
    assert simple >= float(comm.nccl_time_s("all_gather", size, 1, 8, 1, bus, rates))


def test_coarsely_rounded_lines_are_skipped():
    """A bus bandwidth quoted as 0.01 GB/s (±50 %) or 0.04 (±12.5 %) with no time cannot be held to
    10 %; 0.45 (±1.1 %) can."""
    assert "rounded beyond" in SKIPPED["C108"] and "rounded beyond" in SKIPPED["C110"]
    assert any(r.row_id == "C112" for r in ROWS)
    assert vc._rounding_share("0.01") == pytest.approx(0.5) and vc._rounding_share("1.2") == pytest.approx(0.05 / 1.2)


@pytest.mark.parametrize(("link", "cap"), [("nvlink4", 141e9), ("nvlink5", 282e9)])
def test_ll_bus_bandwidth_is_the_generations_cap(link, cap):
    """tuning.cc 2.26: a one-node ring's LL runs at min(llMaxBw, B/2); the cap is the GPU
    generation's (Hopper 141, Blackwell 282 GB/s), both below half the NVLink bus bandwidth."""
    rates = vc.fabric_rates((link, None, 0))
    bus = float(comm.ring_bus_bytes_per_s(8, 8, rates))
    assert cap < bus / 2
    ll, _, _ = comm.nccl_ring_protocol_times_s("all_gather", 1 << 20, 8.0, 1.0, bus, rates)
    assert float(ll) == pytest.approx(6.6e-6 + 7 * 0.6e-6 + 0.875 * (1 << 20) / cap, rel=1e-6)


def _tcpxo_rates():
    return vc.fabric_rates(next(r.fabric for r in ROWS if r.source.startswith("lessizzmore")))


@pytest.mark.parametrize(("nodes", "levels"), [(2, 1), (4, 2), (16, 4)])
def test_multi_node_small_all_reduce_runs_tree(nodes, levels):
    """Across nodes NCCL's Tree LL all-reduce beats the ring: 6.8 µs + 2·((ppn − 1)·0.6 +
    log2(nodes)·5.0) µs, which grows with log2 of the node count, not with the ring's length."""
    rates = _tcpxo_rates()
    n = 8 * nodes
    bus = comm.ring_bus_bytes_per_s(n, 8, rates)
    t = float(comm.nccl_time_s("all_reduce", 8, 1, n, nodes, bus, rates))
    assert t == pytest.approx(6.8e-6 + 2 * (7 * 0.6e-6 + levels * 5.0e-6), rel=1e-3)
    ring = float(comm.nccl_time_s("all_reduce", 8, 1, n, nodes, bus, rates, tree=False))
    assert ring > t


@pytest.mark.parametrize(("nodes", "nic_factor"), [(2, 2.0), (4, 1.0), (8, 1.0)])
def test_tree_bus_bandwidth_over_nodes(nodes, nic_factor):
    """A double binary tree moves S each way per node at 2 nodes and 2S beyond: its bus bandwidth is
    min(B_intra, 2·NICs) at 2 nodes and min(B_intra, NICs) beyond; in one node the chain's B_intra."""
    rates = _tcpxo_rates()
    nic = float(rates.nics_per_node * rates.inter_nic_bytes_per_s)
    t = float(comm.tree_bus_bytes_per_s(8.0 * nodes, float(nodes), nic, rates))
    assert t == pytest.approx(min(float(rates.intra_bus_bytes_per_s), nic_factor * nic))
    assert float(comm.tree_bus_bytes_per_s(8.0, 1.0, nic, rates)) == pytest.approx(float(rates.intra_bus_bytes_per_s))


def test_two_node_large_all_reduce_beats_the_ring_bound():
    """The A3 Mega 2-node lines reach 318-339 GB/s bus bandwidth at 2-8 GiB, above the ring's NIC
    bound (8 x 200 Gb/s): only the Tree's halved inter-node traffic explains them. With Tree they
    are within 10 %, with the ring alone 35 % off or more."""
    rows = [r for r in ROWS if r.source.startswith("lessizzmore") and r.size_bytes >= 2 << 30]
    assert len(rows) >= 3
    e = vc.errors(rows)
    assert max(abs(v) for v in e.values()) <= BANDWIDTH_TARGET
    ring = vc.errors([replace(r, forced_ring=True) for r in rows])
    assert min(abs(v) for v in ring.values()) > 0.35


def test_forced_ring_read_from_algo_text():
    assert vc._forced_ring("Ring (per-algorithm job; report column)")
    assert vc._forced_ring("ring (NCCL_NVLS_ENABLE=0)")
    assert not vc._forced_ring("ring (file name; NCCL default selection)")
    assert not vc._forced_ring("NCCL default")


def test_ll128_only_over_nvlink_inside_a_node():
    """tuning.cc enables LL128 where the ranks talk over NVLink; across nodes it also needs the NIC
    within PXB of the GPU, which no input states (ASSUMPTION: off there); never over PCIe."""
    nv, pcie = vc.fabric_rates(("nvlink4", "ib-ndr", 8)), vc.fabric_rates(("pcie4", None, 0))
    one = comm.nccl_ring_protocol_times_s("all_gather", 1 << 24, 8.0, 1.0, 300e9, nv)[1]
    two = comm.nccl_ring_protocol_times_s("all_gather", 1 << 24, 16.0, 2.0, 300e9, nv)[1]
    over_pcie = comm.nccl_ring_protocol_times_s("all_gather", 1 << 24, 4.0, 1.0, 20e9, pcie)[1]
    assert np.isfinite(one) and np.isinf(two) and np.isinf(over_pcie)


@pytest.mark.parametrize("g", [2, 4, 8])
def test_xgmi_mesh_bus_bandwidth_grows_with_the_group(g):
    """A full xGMI mesh (7 peer links per MI300X): a g-GPU ring reaches g − 1 links, so its bus
    bandwidth is (g − 1)/7 of the 8-GPU figure; an NVSwitch link is the same for every group."""
    mesh, switch = vc.fabric_rates(("infinity-fabric", None, 0)), vc.fabric_rates(("nvlink4", None, 0))
    b8 = float(mesh.intra_bus_bytes_per_s)
    assert float(comm.ring_bus_bytes_per_s(g, 8, mesh)) == pytest.approx(b8 * (g - 1) / 7)
    assert float(comm.ring_bus_bytes_per_s(g, 8, switch)) == pytest.approx(float(switch.intra_bus_bytes_per_s))


def test_two_mi300x_run_at_one_xgmi_link():
    """ml-engineering's 2-GPU MI300X all-reduce (47.7 GB/s bus bandwidth at 4 GiB): one 64 GB/s link
    at the profile's 0.75 efficiency, within 10 %; priced at the 8-GPU mesh it is 7× too fast."""
    row = next(r for r in ROWS if r.fabric[0] == "infinity-fabric" and r.n == 2)
    assert vc.regime(row) == "bandwidth"
    assert abs(vc.errors([row])[row.row_id]) <= BANDWIDTH_TARGET
    flat = replace(vc.fabric_rates(row.fabric), intra_mesh_peer_links=np.inf)
    t = float(comm.ring_collective_time_s(row.op, row.size_bytes, 1, row.n, row.per_node, flat))
    assert vc.measured_time_s(row) / t > 5


def test_lines_read_by_nccl_tests_definitions():
    """Every line that gives a time: algbw = S / t (S in bytes, t in µs) and busbw = algbw · f(n) of
    its collective (nccl-tests doc/PERFORMANCE.md) to the quoted two decimals, so size, time and
    the bus-bandwidth factor are read as the harness wrote them (out-of-place column)."""
    import csv

    checked = 0
    with open(vc.DATA, newline="") as f:
        for r in csv.DictReader(f):
            if not (r["time_us"] and r["algbw_gbps"] and r["busbw_gbps"]) or r["op"] not in comm.OPS:
                continue
            algbw = float(r["bytes"]) / (float(r["time_us"]) * 1e-6) / 1e9
            busbw = algbw * float(comm.ring_factor(r["op"], int(r["n_gpus"])))
            assert algbw == pytest.approx(float(r["algbw_gbps"]), abs=0.006, rel=0.01), r["row_id"]
            assert busbw == pytest.approx(float(r["busbw_gbps"]), abs=0.006, rel=0.01), r["row_id"]
            checked += 1
    assert checked >= 80


def _efa_latency_rows():
    return [r for r in ROWS if r.fabric[1] == "efa-v4" and vc.regime(r) == "latency"]


@pytest.mark.parametrize("op, nodes", [("all_reduce", 2), ("all_reduce", 4), ("all_gather", 4)])
def test_net_plugin_latency_added_per_inter_node_step(op, nodes):
    """tuning.cc adds the net plugin's latency L to every inter-node hop, twice for Simple: a Tree
    all-reduce pays 2·log2(nodes) hops, a ring all-gather nodes − 1, each protocol by its multiple."""
    base = vc.fabric_rates(("nvlink5", "eth-400g", 8))
    plug = replace(base, inter_net_latency_s=np.asarray(35e-6))
    n, size = 8.0 * nodes, 4096.0
    if op == "all_reduce":
        tb = comm.tree_bus_bytes_per_s(n, float(nodes), 8 * float(base.inter_nic_bytes_per_s), base)
        t0 = comm.nccl_tree_allreduce_times_s(size, n, float(nodes), tb, base)
        t1 = comm.nccl_tree_allreduce_times_s(size, n, float(nodes), tb, plug)
        hops = 2 * np.log2(nodes)
    else:
        t0 = comm.nccl_ring_protocol_times_s(op, size, n, float(nodes), 400e9, base)
        t1 = comm.nccl_ring_protocol_times_s(op, size, n, float(nodes), 400e9, plug)
        hops = nodes - 1
    for i, multiple in ((0, 1), (2, 2)):  # LL, Simple (LL128 is off across nodes)
        assert float(t1[i] - t0[i]) == pytest.approx(hops * multiple * 35e-6, rel=1e-6)


def test_efa_profile_carries_aws_ofi_nccls_platform_latency():
    """efa-v4: aws-ofi-nccl's P6-B200 latency (35 µs) with its source; NCCL's own transports report 0."""
    efa = get_link("efa-v4")
    assert efa.nccl_net_latency_s == pytest.approx(35e-6) and "aws-ofi-nccl" in efa.sources["nccl_net_latency_s"]
    assert float(vc.fabric_rates(("nvlink5", "efa-v4", 8)).inter_net_latency_s) == pytest.approx(35e-6)
    assert float(vc.fabric_rates(("nvlink5", "ib-ndr", 8)).inter_net_latency_s) == 0.0
    with pytest.raises(ValueError, match="nccl_net_latency_s"):
        LinkProfile(**{**efa.model_dump(), "sources": {k: v for k, v in efa.sources.items() if k != "nccl_net_latency_s"}})


def test_efa_latency_lines_within_target():
    """ml-engineering's 4-node P6-B200 all_reduce_bench lines, latency-bound (10): NCCL with the
    plugin's latency + the torch call's host cost, within 10 % median."""
    rows = _efa_latency_rows()
    assert len(rows) >= 8
    assert float(np.median([abs(v) for v in vc.errors(rows).values()])) <= BANDWIDTH_TARGET


@pytest.mark.parametrize("factor", [0.0, 0.5, 2.0])
def test_net_plugin_latency_mis_set_fails(monkeypatch, factor):
    real = vc.fabric_rates
    monkeypatch.setattr(vc, "fabric_rates", lambda fabric: replace(real(fabric), inter_net_latency_s=real(fabric).inter_net_latency_s * factor))
    e = vc.errors(_efa_latency_rows())
    assert float(np.median([abs(v) for v in e.values()])) > 2 * BANDWIDTH_TARGET


def test_the_committed_table_is_the_report():
    # docs/accuracy.md's collectives table is generated (tools/update_accuracy.py): a change to the
    # model or the lines that moves any number and is not regenerated fails here
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "accuracy.md").read_text()
    section = doc.split("<!-- collectives:begin -->", 1)[1].split("<!-- collectives:end -->", 1)[0]
    assert section == "\n" + vc.report_markdown().rstrip("\n") + "\n", "run python tools/update_accuracy.py"


# --- NVLS (NVLink SHARP) all-reduce inside one node: NCCL's own model ------------------------------
@pytest.mark.parametrize("eff", [comm.NCCL_NVLS_EFFICIENCY_2_27, comm.NCCL_NVLS_EFFICIENCY["blackwell"]])
def test_nvls_bus_bandwidth_against_the_ring_over_gpu_count(eff):
    """NVLS busbw = 2·eff·(n − 1)/(n + 1)·B: it grows with the GPU count, loses to the ring (B) at 2 GPUs
    and beats it at 8 on the same link; its time is latency + S/algbw, linear in the message size."""
    rates = vc.fabric_rates(("nvlink4", None, 0))
    ring = float(comm.ring_bus_bytes_per_s(8, 8, rates))
    bus = [float(comm.nvls_all_reduce_bus_bytes_per_s(n, ring, eff)) for n in range(2, 9)]
    assert bus == pytest.approx([2 * eff * (n - 1) / (n + 1) * ring for n in range(2, 9)], rel=1e-12)
    assert all(a < b for a, b in zip(bus, bus[1:]))
    assert bus[0] < ring < bus[-1]
    size = float(1 << 33)
    ring_t = float(comm.ring_collective_time_s("all_reduce", size, 1, 8, 8, rates, False))
    nvls_t = float(comm.nvls_all_reduce_time_s(size, 8, ring, eff))
    assert ring_t / nvls_t == pytest.approx(bus[-1] / ring, rel=0.01)
    t1, t2 = (float(comm.nvls_all_reduce_time_s(s, 8, ring, eff)) for s in (size, 2 * size))
    assert t2 - t1 == pytest.approx(t1 - comm.NCCL_NVLS_LATENCY_S, rel=1e-9)
    assert float(comm.nvls_all_reduce_time_s(0.0, 8, ring, eff)) == comm.NCCL_NVLS_LATENCY_S


def test_nvls_efficiency_from_version_and_architecture():
    by_id = {r.row_id: r for r in ROWS}
    assert by_id["C081"].nvls_efficiency == comm.NCCL_NVLS_EFFICIENCY_2_27  # H200, NCCL 2.27.7
    assert by_id["C087"].nvls_efficiency == comm.NCCL_NVLS_EFFICIENCY_2_27  # version unstated: its section's
    assert by_id["C156"].nvls_efficiency == comm.NCCL_NVLS_EFFICIENCY["blackwell"]  # B200, NCCL 2.29.7
    assert by_id["C082"].in_network is False  # 'ring (NCCL_NVLS_ENABLE=0)' ran a ring
    assert by_id["C158"].nvls_efficiency == 0.0 and not vc.priced(by_id["C158"])  # NVLS over 2 nodes
    assert by_id["C176"].nvls_efficiency == 0.0  # NVLS all-gather: not priced


def test_hopper_nvls_gpu_count_sweep_follows_nccl_model():
    """The H200 sweep (5 … 8 GPUs, NCCL's default choice = NVLS) within 2 %, where the ring's pricing
    misses by 10 … 22 % and the more the more GPUs: the (n − 1)/(n + 1) term carries the trend."""
    rows = [r for r in ROWS if r.row_id in ("C087", "C089", "C091", "C093")]
    assert [r.n for r in rows] == [5, 6, 7, 8]
    nvls = vc.errors(rows)
    assert max(abs(v) for v in nvls.values()) < 0.02
    as_ring = vc.errors([replace(r, nvls_efficiency=0.0) for r in rows])
    assert min(abs(v) for v in as_ring.values()) > 0.10
    assert [as_ring[r.row_id] for r in rows] == sorted(as_ring.values(), reverse=True)


def test_nccl_tests_incl_in_network_row_counts_every_line():
    s = vc.summary(ROWS)
    n = sum(r.harness.startswith("nccl-tests") for r in ROWS)
    assert sum(len(s.get((f"{c}-bound", vc.NCCL_TESTS_INCL_IN_NETWORK), [])) for c in ("latency", "bandwidth")) == n
    assert all(r.in_network and not r.nvls_efficiency for r in ROWS if not vc.priced(r))
