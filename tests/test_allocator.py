"""The caching-allocator model (shardplan/formulas/allocator.py) against the H100 campaign (tests/data/gpu/,
a copy of data/calibration/gpu/ from benchmarks/gpu_campaign.py)."""

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from shardplan.calibrate import fragmentation_loso
from shardplan.calibrate.gpu_compare import compare_folder, load_file, load_records
from shardplan.formulas.allocator import CLASSES, largest_transient_bytes
from shardplan.formulas.columns import columns_for
from shardplan.formulas.memory import estimate_memory
from shardplan.inputs.allocator_profile import default_allocator
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import resolve_model

DATA = Path(__file__).parent / "data"
GPU = DATA / "gpu"
MiB = 1 << 20
SOURCES = functools.cache(fragmentation_loso.sources)  # every GPU source, read once per test session


def test_rounding_probe_follows_the_caching_allocator_rules():
    # torch CUDACachingAllocator.cpp: 512 B blocks; <= 1 MiB from 2 MiB segments; 1-10 MiB from
    # 20 MiB segments; larger rounded up to 2 MiB; a large block is split only when more than
    # 1 MiB would remain, else the request takes the whole block (11 MiB -> 12 MiB allocated).
    # The probe process holds cuBLAS's 32 MiB workspace throughout, the 1-byte row's baseline.
    rows = [json.loads(line) for line in (GPU / "probes.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["probe"] == "rounding"]
    base_alloc = rows[0]["allocated_bytes"] - 512
    base_res = rows[0]["reserved_bytes"] - 2 * MiB
    assert base_alloc == base_res == 32 * MiB
    for r in rows:
        n = r["request_bytes"]
        block = -(-n // 512) * 512
        segment = 2 * MiB if n <= MiB else 20 * MiB if n < 10 * MiB else -(-n // (2 * MiB)) * 2 * MiB
        if n > MiB and segment - block <= MiB:
            block = segment
        assert r["allocated_bytes"] - base_alloc == block, n
        assert r["reserved_bytes"] - base_res == segment, n


def test_fragmentation_coefficients_are_the_leave_one_source_out_fit():
    """allocator.json's k and band are recomputed from the committed records (no hand-set number):
    k the least-squares fit over every source, the band the 0.9 / 0.1 quantile of the residuals of
    runs predicted without their own source."""
    src = SOURCES()
    assert set(src) == {"hf", "qlora", "fsdp", "expandable_segments", fragmentation_loso.USER_SOURCE}
    fitted = fragmentation_loso.coefficients(src)
    model = default_allocator()
    for name in CLASSES:
        coeff, want = model.coefficient(name), fitted[name]
        assert (coeff.k, coeff.band_upper, coeff.band_lower, coeff.runs) == pytest.approx(
            (want["k"], want["band_upper"], want["band_lower"], want["runs"]), abs=5e-4), name
    # FSDP1 and FSDP2 are fitted apart (fragmentation_loso.GROUPS); every class has runs
    assert model.coefficient("fsdp1") != model.coefficient("fsdp2") and all(fitted[c]["runs"] > 0 for c in CLASSES)


def test_band_is_the_stated_quantile_of_out_of_source_residuals():
    """The band is not the observed extreme: at least 90 % of each group's runs predicted without
    their own source lie at or under band_upper (and, with 10 runs or more, not every one), and at
    least 90 % at or over -band_lower."""
    judged = fragmentation_loso.out_of_source(SOURCES())
    model = default_allocator()
    for cls, group in fragmentation_loso.GROUPS.items():
        res = [j["residual"] for j in judged if j["group"] == group]
        coeff = model.coefficient(cls)
        inside_upper = sum(r <= coeff.band_upper + 5e-4 for r in res)
        assert inside_upper >= 0.9 * len(res), cls
        assert sum(r >= -coeff.band_lower - 5e-4 for r in res) >= 0.9 * len(res), cls
        if len(res) >= 10:  # a quantile, not the maximum (with under 10 runs the 0.9 quantile is the maximum)
            assert coeff.band_upper < max(res), cls


def test_leave_one_source_out_table_in_the_docs_is_current():
    """docs/accuracy.md's fragmentation table is what fragmentation_loso renders from the records."""
    table = fragmentation_loso.render(SOURCES())
    assert table in (Path(__file__).parents[1] / "docs" / "accuracy.md").read_text()


def test_the_fit_is_least_squares_of_the_relative_reserved_error():
    """Doubling every run's slack doubles k; a group with no run takes the fit of every run."""
    rows = [{"group": "one GPU", "reserved": 100, "allocated": 60, "slack": 20, "transient": 10, "allocated_predicted": 60},
            {"group": "one GPU", "reserved": 200, "allocated": 100, "slack": 60, "transient": 20, "allocated_predicted": 100}]
    k = fragmentation_loso.fit(rows)["one GPU"]
    x, y = [0.1, 0.1], [0.2, 0.3]
    assert k == pytest.approx(sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x))
    doubled = [dict(r, slack=2 * r["slack"]) for r in rows]
    assert fragmentation_loso.fit(doubled)["one GPU"] == pytest.approx(2 * k)
    assert fragmentation_loso.fit(rows)["FSDP2"] == pytest.approx(k)


def test_reserved_prediction_on_the_gpu_runs():
    """Where the allocated prediction is right (|error| < 5 %), at least 90 % of the runs' reserved
    errors lie within the out-of-source p90 of |reserved error| (fragmentation_loso: every run
    predicted with k fitted without its source; docs/accuracy.md). The flat 5 % fragmentation the
    model replaced was -14.9 % on FSDP2 W=4 no AC (69.42 GiB measured, 56.29 GiB allocated predicted)."""
    tolerance = fragmentation_loso.summary(fragmentation_loso.out_of_source(SOURCES()))[-1]["p90_abs"]
    rows = compare_folder(GPU)
    good = [r for r in rows if abs(r["allocated_error"]) < 0.05]
    assert len(good) >= 11  # of the campaign's 36 runs (13 with the HF-stack mechanisms); the table has the rest
    assert sum(abs(r["reserved_error"]) <= tolerance for r in good) >= 0.9 * len(good)
    w4 = next(r for r in rows if r["engine"] == "fsdp2" and r["world_size"] == 4 and r["ac"] == "none"
              and not r["expandable_segments"])
    flat = r_flat = w4["predicted_allocated_bytes"] * 1.05
    assert (flat - w4["measured_reserved_bytes"]) / w4["measured_reserved_bytes"] < -0.14
    assert abs(w4["reserved_error"]) < abs((r_flat - w4["measured_reserved_bytes"]) / w4["measured_reserved_bytes"])


def _mem(config, gpus="8xh100-sxm", model="llama-3.1-8b", allocator=None):
    spec = resolve_model(model).spec
    return estimate_memory(columns_for(spec, parse_gpus(gpus), config), allocator=allocator)


def test_fsdp_side_stream_pools_hold_the_sharded_grads_and_gathered_root():
    config = TrainingConfig(strategy="full_shard", seq_len=4096, ac="full", use_cache=True)
    m = _mem(config)
    # the peak is inside block 0's backward (with use_cache on under the hf stack's checkpoint_wrapper
    # the finished blocks' KV caches grow to the end): the sharded grads of blocks 1..L-1 are live, so the reduce-scatter pool adds at most
    # block 0's and the root's fp32 shards; the all-gather pool holds the root and one block in bf16
    spec = resolve_model("llama-3.1-8b").spec
    root, block = spec.root_params, spec.largest_block_params
    pools = int(m["stream_pool_bytes"])
    assert 2 * root <= pools <= 2 * (root + block) + 4 * (root + block) // 8
    single = _mem(config.model_copy(update={"strategy": "single", "method": "lora", "use_cache": False}),
                  gpus="1xh100-sxm")
    assert int(single["stream_pool_bytes"]) == 0


def test_expandable_segments_knob_shrinks_fragmentation():
    config = TrainingConfig(strategy="full_shard", seq_len=4096, ac="full")
    off, on = _mem(config), _mem(config.model_copy(update={"expandable_segments": True}))
    assert int(on["peak_allocated_bytes"]) == int(off["peak_allocated_bytes"])
    transient = 4 * 4096 * 128256
    frag = default_allocator().fragmentation_per_transient
    assert int(off["fragmentation_bytes"]) == pytest.approx(frag["fsdp2"].k * transient, abs=1)
    assert int(on["fragmentation_bytes"]) == pytest.approx(frag["expandable_segments"].k * transient, abs=1)
    assert int(off["allocator_band_bytes"]) == pytest.approx(frag["fsdp2"].band_upper * transient, abs=1)
    # k per class comes from different sources (expandable: the campaign's reruns; FSDP: the campaign
    # and the user scripts pooled), so the two k are not ordered; the premise is, run for run: each
    # rerun with expandable segments left less slack than the same configuration without
    runs = {json.dumps(r["config"], sort_keys=True): r for r in load_records(GPU)
            if r.get("status") == "ok" and not r["config"].get("expandable_segments")}
    reruns = [r for r in load_file(GPU / "expandable_segments.jsonl") if r.get("status") == "ok"]
    assert len(reruns) == 4
    for r in reruns:
        base = runs[json.dumps({k: v for k, v in r["config"].items() if k != "expandable_segments"}, sort_keys=True)]
        assert r["max_reserved_bytes"] - r["max_allocated_bytes"] < base["max_reserved_bytes"] - base["max_allocated_bytes"]


@pytest.mark.parametrize("seq,batch", [(1024, 1), (4096, 2)])
def test_fragmentation_and_its_band_scale_with_the_largest_transient(seq, batch):
    """Mechanism 3's regressor: slack and band follow b·s·V, not the allocated peak."""
    config = TrainingConfig(strategy="full_shard", seq_len=seq, micro_batch=batch, ac="full")
    m, m70 = _mem(config), _mem(config, model="llama-3.1-70b", gpus="64xh100-sxm")
    frag = default_allocator().coefficient("fsdp2")
    transient = 4 * batch * seq * 128256
    for got in (m, m70):  # same vocabulary and tokens: same slack whatever the model's size
        assert int(got["fragmentation_bytes"]) == pytest.approx(frag.k * transient, abs=1)
        assert int(got["allocator_band_bytes"]) == pytest.approx(frag.band_upper * transient, abs=1)


def test_chunked_loss_shrinks_the_largest_transient():
    spec = resolve_model("llama-3.1-8b").spec
    cols = columns_for(spec, parse_gpus("1xh100-sxm"), TrainingConfig(strategy="single", method="lora", ce_chunks=8))
    assert int(largest_transient_bytes(cols)) == 4 * 1024 * 128256 // 8



@pytest.mark.parametrize("seq,batch", [(1024, 1), (4096, 2)])
def test_a_fused_loss_leaves_the_16_bit_gradient_as_the_largest_transient(seq, batch):
    # flash-attn's fused cross-entropy makes no fp32 copy; its largest short-lived block is the
    # logits' bf16 gradient it writes (activations.logits_backward_bytes)
    spec = resolve_model("llama-3.1-8b").spec
    config = TrainingConfig(strategy="single", seq_len=seq, micro_batch=batch)
    eager = columns_for(spec, parse_gpus("1xh100-sxm"), config)
    fused = columns_for(spec, parse_gpus("1xh100-sxm"), config.model_copy(update={"fused_ce": True}))
    assert int(largest_transient_bytes(eager)) == 4 * batch * seq * 128256
    assert int(largest_transient_bytes(fused)) == 2 * batch * seq * 128256

def test_calibration_overlay_allocator_is_read_by_fit(tmp_path, capsys):
    from shardplan.calibrate.overlay import write_calibration
    from shardplan.cli.app import main

    def run(*argv):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    path = tmp_path / "cal.json"
    write_calibration(path, allocator={"cuda_context_bytes": 2 << 30})
    args = ["fit", "llama-3.1-8b on 1xh100-sxm lora", "--json"]
    base = json.loads(run(*args)[1])
    cal = json.loads(run(*args, "--calibration", str(path))[1])
    get = (lambda r: (r[0] if isinstance(r, list) else r)["per_gpu"]["device_total_bytes"])
    assert get(cal) - get(base) == (2 << 30) - default_allocator().cuda_context_bytes
    bad = tmp_path / "bad.json"
    data = json.loads(path.read_text())
    data["allocator"]["fragmentation_per_transient"] = {"nonsense": {"k": 1, "band_upper": 2, "band_lower": 0, "runs": 1}}
    bad.write_text(json.dumps(data))
    code, out, err = run(*args, "--calibration", str(bad))
    assert code == 2 and "nonsense" in err and "Traceback" not in err + out


def test_context_bytes_default_is_the_measured_nvml_gap():
    rows = [json.loads(line) for line in (GPU / "hf.jsonl").read_text().splitlines()]
    gaps = {r["nvml_used_after_steps"] - r["nvml_before"] - r["steps"][-1]["end_reserved_bytes"] for r in rows}
    assert gaps == {default_allocator().cuda_context_bytes}
    assert np.all(np.asarray(list(gaps)) > 512 * MiB)  # the old 512 MiB assumption was low
