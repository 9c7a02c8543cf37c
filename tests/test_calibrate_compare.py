"""Predicted vs measured against the committed harness records (data/calibration/), and one small
live fake-PG run when torch is installed. Tolerances are the calibration issue's (issue 3):
exact for params, grads, optimizer states, all-gather / reduce-scatter buffers (and unsharded
params/grads), <= 1 % for activations and total peak on the tiny FSDP2 grid, <= 2 % for the phase
peaks of the 7B FakeTensorMode runs. FSDP1 (measured with shardplan's StorageTracker: real
storage sizes) is held to the same exactness for states and buffers and <= 1 % activations; its
phase peaks where the model covers the mechanism (see the FSDP1 tests)."""

from pathlib import Path

import pytest

from shardplan.calibrate.compare import EXACT, compare_files, compare_records, summarize, summary_markdown
from shardplan.calibrate.results import read_jsonl

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
GRID = DATA / "grid_cpu.jsonl"
GLOO = DATA / "gloo_2rank_cpu.jsonl"
FAKE_7B = DATA / "fake_7b.jsonl"


@pytest.fixture(scope="module")
def rows():
    return compare_files([GRID, GLOO, FAKE_7B])


def _errors(rows, engine, fake, category):
    return [r for r in rows if r["engine"] == engine and r["fake_tensors"] == fake and r["category"] == category]


def test_grid_covers_the_issue_matrix(rows):
    configs = {r["configuration"] for r in rows if r["engine"] == "fsdp2" and not r["fake_tensors"]}
    assert len(configs) >= 24
    worlds = {int(c.split("/W")[1].split("/")[0]) for c in configs}
    assert {2, 4, 8, 64} <= worlds
    assert {r["engine"] for r in rows} == {"fsdp1", "fsdp2"}


@pytest.mark.parametrize("category", EXACT)
def test_tiny_fsdp2_states_and_buffers_are_exact(rows, category):
    bad = [(r["configuration"], r["predicted_bytes"], r["measured_bytes"]) for r in _errors(rows, "fsdp2", False, category)
           if r["predicted_bytes"] != r["measured_bytes"]]
    assert not bad


@pytest.mark.parametrize("category", ["activations", "forward_peak", "total_peak", "backward_peak"])
def test_tiny_fsdp2_activations_and_peaks_within_1_percent(rows, category):
    # measured max: activations 0.07 %, forward 0.03 %, backward/total 0.68 % (NO_SHARD fp32)
    tol = {"activations": 0.001, "forward_peak": 0.0005}.get(category, 0.007)
    bad = [(r["configuration"], r["error"]) for r in _errors(rows, "fsdp2", False, category) if abs(r["error"]) > tol]
    assert not bad


@pytest.mark.parametrize("category", EXACT + ("activations", "forward_peak", "backward_peak"))
def test_7b_fake_tensor_runs(rows, category):
    found = _errors(rows, "fsdp2", True, category)
    assert len(found) == 4  # W = 8, 64 x AC none, full
    tol = 0.0 if category in EXACT else 0.001  # issue 3 asks 2 %; measured max 0.001 %
    assert all(abs(r["error"]) <= tol for r in found), [(r["configuration"], r["error"]) for r in found]


def test_fsdp1_grid_covers_strategies_precision_ac_and_worlds(rows):
    configs = {r["configuration"] for r in rows if r["engine"] == "fsdp1"}
    assert len(configs) >= 20
    for part in ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "p=bfloat16", "ac=full", "ac=selective",
                 "/W2/", "/W4/", "/W8/", "/W64/"):
        assert any(part in c for c in configs), part


@pytest.mark.parametrize("category", EXACT)
def test_fsdp1_states_and_buffers_are_exact(rows, category):
    """FSDP1 measured with StorageTracker (real storage sizes): params, grads, optimizer, the
    unsharded flat parameters, ``_mp_shard`` and the reduce-scatter buffers are exact."""
    found = _errors(rows, "fsdp1", False, category)
    assert found
    bad = [(r["configuration"], r["predicted_bytes"], r["measured_bytes"]) for r in found
           if r["predicted_bytes"] != r["measured_bytes"]]
    assert not bad


def test_fsdp1_activations_within_1_percent(rows):
    for r in _errors(rows, "fsdp1", False, "activations"):
        assert abs(r["error"]) <= 0.01, r


def test_fsdp1_peaks_within_1_percent(rows):
    """FSDP1 phase and total peaks (every strategy, fp32 and bf16-mixed, AC none/full/selective):
    the forward moments inside a block's forward, the last block prefetched at the start of
    backward, the reduce-scatter input freed inside the post-backward hook, and NO_SHARD without
    unsharded copies (fp32) are modelled. Measured max: backward 0.001 % (0.66 % before FSDP1's
    gradient moments), total 0.001 % (0.78 % while the CPU harness's per-tensor AdamW step was
    predicted as foreach)."""
    for cat in ("forward_peak", "backward_peak", "total_peak"):
        found = _errors(rows, "fsdp1", False, cat)
        assert len(found) >= 20
        bad = [(r["configuration"], r["error"]) for r in found if abs(r["error"]) > 0.008]
        assert not bad, (cat, bad)
        exact = [r for r in found if abs(r["error"]) <= 0.0001]
        assert len(exact) >= len(found) - 6, cat


FSDP1_GRAD_MOMENTS = DATA / "fsdp1_grad_moments_cpu.jsonl"


def test_fsdp1_gradient_moments_are_the_backward_peak():
    """Wide blocks and 4 tokens (benchmarks/calibrate_fsdp1_grad_moments.py): the backward peak is
    the end of a block's backward — the flat gradient concatenated from its views' gradients
    (fp32), or the post-backward hook's upcast gradient, padded reduce-scatter input and output
    shard (bf16 compute, fp32 reduction; W = 3 pads). Measured max error 0.002 % (before these
    moments: -5.0 % NO_SHARD to -26.5 % W = 3); the buffers are exact."""
    rows = compare_files([FSDP1_GRAD_MOMENTS])
    assert len({r["configuration"] for r in rows}) == 6
    bad = [(r["configuration"], r["category"], r["error"]) for r in rows
           if (r["category"] == "backward_peak" and abs(r["error"]) > 0.0001)
           or (r["category"] in EXACT and r["error"] != 0)]
    assert not bad


def test_fsdp1_backward_peak_needs_the_gradient_moments(monkeypatch):
    """Without FSDP1's gradient moments the same runs are missed by more than 15 % (W = 3 and 4
    full_shard and SHARD_GRAD_OP): the moments are the mechanism, not a margin."""
    import shardplan.formulas.memory as memory

    monkeypatch.setattr(memory, "_fsdp1_gradient_moments", lambda *a, **k: [])
    rows = [r for r in compare_files([FSDP1_GRAD_MOMENTS]) if r["category"] == "backward_peak"
            and ("full_shard" in r["configuration"] or "shard_grad_op" in r["configuration"])]
    assert len(rows) == 4 and all(r["error"] < -0.15 for r in rows), [(r["configuration"], r["error"]) for r in rows]


def test_forward_peak_inside_a_block_is_modelled(rows):
    """The forward peak inside a block's forward (FSDP2 all-gather copy-out, the MLP product under
    AC, the last block's residual add without AC): <= 0.05 % on every tiny run."""
    for engine in ("fsdp1", "fsdp2"):
        bad = [(r["configuration"], r["error"]) for r in _errors(rows, engine, False, "forward_peak")
               if abs(r["error"]) > 0.0005]
        assert not bad, engine


def test_real_gloo_ranks_agree_with_fake_pg():
    fake = {r["key"]: r for r in read_jsonl(GRID)}
    for rec in read_jsonl(GLOO):
        assert rec["measured"] == fake[rec["key"]]["measured"]
        assert compare_records([rec])[0]["predicted_bytes"] == compare_records([fake[rec["key"]]])[0]["predicted_bytes"]


def test_summary_lists_every_category(rows):
    summary = summarize(rows)
    assert {s["category"] for s in summary} >= set(EXACT) | {"activations", "total_peak"}
    assert "max abs error" in summary_markdown(rows)


def test_live_fake_pg_run_matches_prediction(tmp_path):
    pytest.importorskip("torch")
    from shardplan.calibrate.config import RunConfig
    from shardplan.calibrate.launch import run_grid

    # a shape and world size the committed grid does not have (3 blocks, W = 16: k/v rows pad)
    # Known gap, stated in docs/calibration.md: inside a block's backward one sub-moment is modelled
    # (the MLP product's backward); with few tokens (b·s = 32 here) the weight gradients dominate
    # and the peak comes later in the block: -3.3 % on this run.
    cfg = RunConfig(engine="fsdp2", strategy="full_shard", world_size=16, param_dtype="bfloat16", ac="none",
                    tiny={"hidden_size": 64, "num_layers": 3, "num_heads": 4, "num_kv_heads": 1,
                          "intermediate_size": 96, "vocab_size": 256}, micro_batch=1, seq_len=32, steps=2)
    out = tmp_path / "live.jsonl"
    run_grid([cfg], out, isolate=False, timeout_s=120, resume=False, progress=lambda *_: None)
    live = compare_records(read_jsonl(out))
    assert live
    for r in live:
        if r["category"] in EXACT:
            assert r["predicted_bytes"] == r["measured_bytes"], r
        elif r["category"] == "activations":
            assert abs(r["error"]) <= 0.01, r
        else:  # phase peaks: see the known gap (2) above
            assert abs(r["error"]) <= 0.05, r
