"""The calibration harness's CUDA path, checked on CPU: GPUs mocked where the code asks torch about
them, everything else real (fake process group, gloo, the published nccl-tests tables)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from shardplan.inputs import strategy as st
from shardplan.support.errors import ShardplanError

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch = pytest.importorskip("torch")
DATA = Path(__file__).parent / "data"
AR_H100 = DATA / "nccl_tests_real_all_reduce_perf_h100_2x8.txt"


def _invoke(args):
    from tests.helpers import run_cli

    return run_cli("calibrate", *args)


@pytest.fixture
def two_gpus(monkeypatch):
    """torch in this process believes it sees 2 CUDA devices."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# --- 1. calibrate fsdp on CUDA -------------------------------------------------------------------
def test_world_size_above_visible_gpus_is_refused_up_front(two_gpus, tmp_path):
    out = tmp_path / "r.jsonl"
    for launch in ("spawn", "auto"):  # auto = real ranks when GPUs are visible
        res = _invoke(["fsdp", "--out", str(out), "--world-size", "4", "--launch", launch])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("shardplan: error: world_size=4: exceeds the 2 visible CUDA device")
    assert not out.exists()  # nothing ran
    res = _invoke(["collectives", "--world-size", "4", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "2 visible CUDA device" in res.output and len(res.output.strip().splitlines()) == 1


def test_auto_launch_is_real_ranks_only_with_gpus(monkeypatch):
    from shardplan.calibrate.launch import resolve_launch

    assert resolve_launch("auto") == ("spawn" if torch.cuda.is_available() else "fake")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert resolve_launch("auto") == "spawn" and resolve_launch("fake") == "fake"


def test_fake_pg_uses_cuda_only_when_asked(monkeypatch):
    import torch.distributed as dist

    from shardplan.calibrate.config import RunConfig
    from shardplan.calibrate.runner import device_type

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "fake")
    assert device_type(RunConfig(device="cuda")) == "cuda"
    assert device_type(RunConfig()) == "cpu"
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    assert device_type(RunConfig()) == "cuda"
    # a new optional field leaves the resume keys of earlier records unchanged
    assert RunConfig().key() == RunConfig(device=None).key() != RunConfig(device="cuda").key()


def test_device_cuda_without_a_gpu_is_refused():
    from shardplan.calibrate.config import RunConfig
    from shardplan.calibrate.launch import check_world_size

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(ShardplanError, match="no CUDA device"):
        check_world_size(RunConfig(device="cuda"))


def test_merge_keeps_every_ranks_cuda_peaks():
    from shardplan.calibrate.launch import merge_ranks

    recs = [{"rank": r, "measured": {"x": 1}, "total_peak_bytes": 10, "cuda_max_allocated_bytes": alloc,
             "cuda_max_reserved_bytes": res, "cuda_active_peak_bytes": act}
            for r, alloc, res, act in ((0, 100, 2048, 90), (1, 300, 4096, 250), (2, 200, 8192, 180))]
    merged = merge_ranks(recs)
    assert merged["cuda_max_allocated_bytes"] == 300
    assert merged["cuda_max_reserved_bytes"] == 8192
    assert merged["cuda_active_peak_bytes"] == 250
    assert [r["cuda_max_allocated_bytes"] for r in merged["ranks"]] == [100, 300, 200]
    assert [r["cuda_max_reserved_bytes"] for r in merged["ranks"]] == [2048, 4096, 8192]


def test_timed_steps_run_without_the_collective_counter(monkeypatch):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from shardplan.calibrate import runner
    from shardplan.calibrate.config import RunConfig

    modes = []
    real = runner.train_step

    def spy(*a, **k):
        modes.append(type(_get_current_dispatch_mode()).__name__)
        return real(*a, **k)

    monkeypatch.setattr(runner, "train_step", spy)
    cfg = RunConfig(world_size=2, steps=2)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        rec = runner.measure(cfg)
    finally:
        dist.destroy_process_group()
    # the timed steps see no dispatch mode; one more step counts collectives; then the tracked step
    assert modes[:2] == ["NoneType", "NoneType"] and modes[2] == "CollectiveCounter"
    assert len(rec["step_times_s"]) == 2
    assert rec["collectives"]["all_gather"]["count"] > 0 and rec["collectives"]["reduce_scatter"]["count"] > 0


def test_storage_tracker_keeps_devices_apart():
    """FSDP1's tracker sums per device (a second device stands in for CUDA: meta storages)."""
    from shardplan.calibrate.runner import _storage_summary
    from shardplan.calibrate.storage_tracker import StorageTracker

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = StorageTracker(model, opt)
    host, other = torch.ones(1000), torch.empty(5000, device="meta")
    with tracker:
        tracker._add(host)
        tracker._add(other)
        tracker._update()
    snap = tracker.snapshot()
    params = sum(p.numel() * 4 for p in model.parameters())
    assert snap["cpu"]["Total"] == 4000 + params and snap["meta"]["Total"] == 20000
    summary = _storage_summary(tracker)
    assert summary["devices"] == ["cpu", "meta"]
    assert summary["total_peak_bytes"] == 4000 + params  # the CPU's own peak, not CPU + meta
    assert summary["peak_breakdown"]["meta"]["Total"] == 20000


def test_storage_summary_labels_cuda_records_cuda():
    from shardplan.calibrate.runner import _storage_summary

    cuda = {"Sharded Param": 1024, "OptState": 2048, "Total": 3072}
    host = {"OptState": 8, "Total": 8}
    tracker = SimpleNamespace(cat_max={"cuda:0": cuda, "cpu": host},
                              peaks={ph: {"cuda:0": cuda, "cpu": host} for ph in ("all", "forward", "backward")},
                              current={"cuda:0": cuda, "cpu": host})
    s = _storage_summary(tracker)
    assert s["devices"] == ["cpu", "cuda:0"] and s["total_peak_bytes"] == 3072
    assert s["measured"]["optimizer_state_bytes"] == 2048  # Adam's CPU step scalars stay out
    assert s["peak_breakdown"]["cuda:0"]["Total"] == 3072 and s["forward_peak_bytes"] == 3072


# --- compare: the run's real precision policy, offload and CUDA semantics ----------------------------
def _record(**cfg):
    from shardplan.calibrate.config import RunConfig

    c = RunConfig(**cfg)
    return {"key": c.key(), "status": "ok", "config": c.model_dump(mode="json"), "measured": {}}


def test_compare_bf16_param_bf16_reduce_is_mixed_not_pure():
    from shardplan.calibrate.compare import record_columns

    c = record_columns(_record(param_dtype="bfloat16", reduce_dtype="bfloat16"))
    assert int(c.precision) == st.BF16_MIXED and int(c.reduce_dtype) == st.REDUCE_BF16
    c = record_columns(_record(param_dtype="bfloat16", reduce_dtype="float32"))
    assert int(c.precision) == st.BF16_MIXED and int(c.reduce_dtype) == st.REDUCE_FP32
    c = record_columns(_record(param_dtype="float32", reduce_dtype="bfloat16"))
    assert int(c.precision) == st.FP32 and int(c.reduce_dtype) == st.REDUCE_BF16


def _round(b):
    return -(-b // 512) * 512


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_compare_cuda_record_rounds_allocations_and_keeps_step_on_host(engine):
    from shardplan.calibrate.compare import predict, record_spec

    cpu = _record(engine=engine, world_size=4, param_dtype="bfloat16")
    gpu = dict(cpu, device="cuda", devices=["cpu", "cuda:0"])
    spec = record_spec(cpu)
    units = spec.parameter_shapes()
    pc, pg = predict(cpu), predict(gpu)
    if engine == "fsdp2":  # one padded fp32 shard per parameter; Adam: exp_avg + exp_avg_sq of each
        shards = [4 * -(-t[0] // 4) * math.prod(t[1:]) for v in units.values() for t in v]
        steps = 4 * len(shards)  # one fp32 ``step`` per parameter, on the host under CUDA
    else:  # one flat parameter per unit
        shards = [4 * -(-sum(math.prod(t) for t in v) // 4) for v in units.values()]
        steps = 4 * len(shards)
    assert pc["params_sharded"] == sum(shards) and pg["params_sharded"] == sum(_round(b) for b in shards)
    assert pc["optimizer"] == 2 * sum(shards) + steps
    assert pg["optimizer"] == 2 * sum(_round(b) for b in shards)
    for cat in ("all_gather_buffers", "reduce_scatter_buffers", "unsharded_params", "unsharded_grads"):
        assert pg[cat] >= pc[cat] and pg[cat] - pc[cat] < 512 * 64, cat
    slack = sum(_round(b) - b for b in shards)
    assert pg["forward_peak"] - pc["forward_peak"] == 3 * slack - steps


def test_compare_cuda_offload_moves_states_to_the_host():
    from shardplan.calibrate.compare import predict

    rec = _record(world_size=4, cpu_offload=True)
    on_gpu = predict(dict(rec, device="cuda"))
    on_cpu = predict(rec)  # one pool: nothing moves
    assert on_gpu["params_sharded"] == 0 and on_gpu["optimizer"] == 0 and on_cpu["params_sharded"] > 0


# --- 2. collectives ----------------------------------------------------------------------------------
def test_real_16xh100_table_alpha_is_its_small_message_time(tmp_path):
    """16 H100s over 2 nodes: the table's small messages take ~123 us (out-of-place, 8 B-1 KiB:
    135.8, 123.2, 123.3, 123.4, 123.0, 123.6, 126.6, 147.1 us; median 123.5). The overlay must give
    that α, not the large-message segment's intercept rescaled as if from an 8-rank ring."""
    from shardplan.calibrate.collectives import fit_all, parse_nccl_tests_file
    from shardplan.calibrate.overlay import load_calibration, write_calibration
    from shardplan.formulas import comm
    from shardplan.inputs.hardware import parse_gpus

    samples = parse_nccl_tests_file(AR_H100, tier="inter_node")
    small = float(np.median([s.time_s for s in samples if s.size_bytes <= 1024]))
    assert small == pytest.approx(123.5e-6, rel=1e-3)
    write_calibration(tmp_path / "cal.json", links=fit_all(samples))
    cal = load_calibration(tmp_path / "cal.json")
    cluster = parse_gpus("2x8xh100-sxm")
    rates = comm.link_rates(cluster, cal)
    assert float(rates.inter_alpha_s) == pytest.approx(small, rel=0.20)
    # every size regime as fitted, on the 16-rank ring that spans the two nodes
    by_size = {s.size_bytes: s.time_s for s in samples}
    for size, tol in ((1024, 0.20), (1 << 20, 0.20), (1 << 30, 0.05), (8 << 30, 0.05)):
        t = float(comm.ring_collective_time_s("all_reduce", size, 1, 16, 8, rates))
        assert t == pytest.approx(small if size == 1024 else by_size[size], rel=tol), size
    # and the tier comes from the file itself: its rank lines name two hosts
    assert {s.tier for s in parse_nccl_tests_file(AR_H100)} == {"inter_node"}


def test_tier_from_file_and_rendezvous():
    from shardplan.calibrate.collectives import parse_nccl_tests, tier_from_env, tier_from_nccl_tests

    head = "# nThread 1 nGpus 1\n" + "".join(
        f"#  Rank {r:2d} Group  0 Pid {100 + r} on {host} device {r % 2} [0x1] NVIDIA H100\n"
        for r, host in enumerate(["a", "a", "b", "b"]))
    row = "        1024           256     float     sum      -1    20.0    0.05    0.08      0    20.0    0.05    0.08      0\n"
    assert tier_from_nccl_tests(head) == "inter_node"
    assert tier_from_nccl_tests(head.replace(" on b ", " on a ")) == "intra_node"
    samples = parse_nccl_tests(head + row, op="all_reduce")
    assert samples[0].tier == "inter_node" and samples[0].world_size == 4
    with pytest.raises(ShardplanError, match="tier"):
        parse_nccl_tests("# nThread 1\n" + row, op="all_reduce", world_size=4)
    assert parse_nccl_tests("# nThread 1\n" + row, op="all_reduce", world_size=4, tier="intra_node")[0].tier == "intra_node"
    assert tier_from_env({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}) == "inter_node"
    assert tier_from_env({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) == "intra_node"
    assert tier_from_env({}) is None


def test_benchmark_batch_is_timed_once_and_averaged_over_ranks(monkeypatch):
    """A fake process group: the batch of iterations is one timer, and the time is the rank mean."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardplan.calibrate import collectives

    calls = []
    monkeypatch.setattr(collectives, "_timed_batch", lambda once, iters, dev: calls.append(iters) or 0.5)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        samples = collectives.benchmark_rank(sizes=[4096], iters=20, warmup=1, tier="intra_node")
    finally:
        dist.destroy_process_group()
    assert calls == [20] * 5 and len(samples) == 5
    # the fake all_reduce leaves the sum as it was (rank 0's 0.5 s): mean over 4 ranks = 0.125 s
    assert all(s.time_s == pytest.approx(0.5 / 4) for s in samples)
    assert collectives.default_sizes(cuda=True)[-1] >= 1 << 30


def test_collective_child_exception_is_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the failing child relies on gloo rejecting fp8 buffers")
    res = _invoke(["collectives", "--world-size", "2", "--dtype", "float8_e4m3fn", "--max-bytes", "4096",
                   "--iters", "1", "--warmup", "0", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if not ln.startswith("benchmarking")]  # progress
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: collectives") and "rank 0" in lines[0]
    assert "RuntimeError" in lines[0] and "Traceback" not in res.output and not (tmp_path / "c.json").exists()


# --- 3. compute ------------------------------------------------------------------------------------
def _curve(ms, m_half=2048.0, p=2.0, f_max=7e14):
    from shardplan.calibrate.compute import MatmulSample

    return [MatmulSample("bfloat16", m, 2 * m**3 / (f_max / (1 + (m_half / m) ** p)), "cuda") for m in ms]


def test_compute_fit_refused_below_saturation():
    from shardplan.calibrate.compute import fit_efficiency

    # largest size 1024 reaches 1/(1 + 2^2) = 20 % of F_max: refuse instead of extrapolating
    with pytest.raises(ShardplanError, match="larger sizes"):
        fit_efficiency(_curve([128, 256, 512, 1024]))
    # measured up to 16k (98.5 % of F_max): the curve comes back
    fit = fit_efficiency(_curve([256, 512, 1024, 2048, 4096, 8192, 16384]))
    assert fit.f_max_flops_per_s == pytest.approx(7e14, rel=1e-3) and fit.m_half == pytest.approx(2048, rel=1e-3)


def test_compute_cli_refusal_is_one_line(monkeypatch, tmp_path):
    from shardplan.calibrate import compute

    monkeypatch.setattr(compute, "measure_matmul", lambda **kw: _curve([128, 256, 512, 1024]))
    res = _invoke(["compute", "--out", str(tmp_path / "c.json"), "--no-bandwidth"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "larger sizes" in res.output


def test_compute_measures_gemm_batches_and_bandwidth_on_cpu(tmp_path):
    from shardplan.calibrate.compute import measure_bandwidth, measure_matmul

    samples = measure_matmul(dtypes=("float32",), sizes=(16, 32), iters=50, warmup=1)
    assert [s.m for s in samples] == [16, 32] and all(s.flops_per_s > 0 for s in samples)
    bw = measure_bandwidth(sizes_bytes=(1 << 16,), iters=5, warmup=1)
    assert {b.kernel for b in bw} == {"copy", "add"} and all(b.bytes_per_s > 0 for b in bw)
    for dt in ("tf32", "float8_e4m3fn", "int8", "float7"):  # CUDA-only (or unknown) dtypes: one-line refusal
        with pytest.raises(ShardplanError, match="dtype"):
            measure_matmul(dtypes=(dt,), sizes=(16,), device="cpu")


def test_calibrated_bandwidth_and_sm_count_overlay_the_profile(tmp_path):
    from shardplan.calibrate.compute import fit_efficiency
    from shardplan.calibrate.overlay import load_calibration, write_calibration
    from shardplan.formulas.throughput import NCCL_CTAS, compute_rates
    from shardplan.inputs.hardware import parse_gpus

    cluster = parse_gpus("8xh100-sxm")
    fit = fit_efficiency(_curve([256, 512, 1024, 2048, 4096, 8192, 16384]), sm_count=120)
    write_calibration(tmp_path / "c.json", compute=[fit],
                      bandwidth=[{"kernel": "copy", "device": "cuda", "dtype": "bfloat16", "size_bytes": 1 << 30,
                                  "bytes_per_s": 2.9e12}])
    rates = compute_rates(cluster, load_calibration(tmp_path / "c.json"))
    assert rates.calibrated and float(rates.hbm_bytes_per_s) == 2.9e12
    assert float(rates.nccl_sm_fraction) == pytest.approx(NCCL_CTAS / 120)
    assert float(rates.gemm_efficiency) == pytest.approx(7e14 / 989.4e12)


def test_calibrate_errors_exit_2_through_the_main_entry_point(tmp_path, capsys):
    """``python -m shardplan calibrate ...`` (shardplan.cli.app.main): a refused input exits 2."""
    from shardplan.cli.app import main

    assert main(["calibrate", "collectives", "--nccl-tests", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0]


def test_records_carry_gpu_driver_cuda_nccl_versions(monkeypatch):
    from shardplan.calibrate import env

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "device_count", lambda: 8)
    monkeypatch.setattr(cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(cuda, "get_device_properties",
                        lambda *a: SimpleNamespace(multi_processor_count=132, total_memory=85045477376))
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(env, "driver_version", lambda: "570.86.15")
    e = env.cuda_environment()
    assert e["gpu"] == "NVIDIA H100 80GB HBM3" and e["capability"] == "9.0" and e["sm_count"] == 132
    assert e["driver"] == "570.86.15" and e["nccl"] == "2.27.3" and e["visible_devices"] == 8


def test_compare_holds_cuda_records_against_max_memory_allocated():
    from shardplan.calibrate.compare import compare_records, predict, summarize

    rec = dict(_record(world_size=4, param_dtype="bfloat16"), device="cuda", devices=["cpu", "cuda:0"])
    total = predict(rec)["total_peak"]
    rec.update(total_peak_bytes=total, cuda_max_allocated_bytes=int(total * 1.02))
    rows = {r["category"]: r for r in compare_records([rec])}
    assert rows["cuda_max_allocated"]["predicted_bytes"] == total
    assert rows["cuda_max_allocated"]["error"] == pytest.approx(1 / 1.02 - 1, rel=1e-4)  # int() of 1.02 x
    assert rows["total_peak"]["error"] == 0.0 and rows["total_peak"]["device"] == "cuda"
    assert {s["shape"] for s in summarize(list(rows.values()))} == {"tiny, cuda"}
