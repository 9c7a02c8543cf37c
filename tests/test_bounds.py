"""Issue 12: every search and size is bounded. Each test drives the CLI (or the public Python API)
with an input that hung, ran for minutes or exhausted memory before the bounds (shardplan/support/limits.py),
and asserts a fast, one-line refusal (exit 2) or a fast answer. ``_deadline`` turns a hang into a
failure instead of a stuck test run."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import time

import pytest

from shardplan.planning.planner import divisors
from shardplan.support import limits
from tests.helpers import run_cli


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail (not hang) when the block runs longer than ``seconds`` (SIGALRM; POSIX)."""
    def _raise(*_):
        raise TimeoutError(f"still running after {seconds} s: the search is not bounded")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused(result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardplan: error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# --- divisor searches ---------------------------------------------------------------------------
def test_divisors_match_the_definition():
    """Every divisor d of n (n % d == 0), ascending, cut at ``up_to``: checked against the brute force
    definition on 1..400 and 200 random n up to 10^5 (exact)."""
    rng = random.Random(12)
    for n in list(range(1, 401)) + [rng.randrange(1, 10**5) for _ in range(200)]:
        for up_to in (None, 1, 7, 64, n, 10**9):
            limit = n if up_to is None else min(up_to, n)
            assert divisors(n, up_to) == [d for d in range(1, limit + 1) if n % d == 0], (n, up_to)


def test_divisors_of_large_numbers_are_fast():
    # 10^6 = 2^6 5^6 has 49 divisors; 720,720 has 240; 2^61 - 1 is prime (a worst case for the sqrt search)
    with _deadline(10):
        assert len(divisors(10**6)) == 49
        assert len(divisors(720_720)) == 240
        assert divisors(2**61 - 1, up_to=64) == [1]
        assert divisors(1_831_054_688, up_to=64) == [1, 2, 4, 8, 16, 32]  # 15 T tokens / (8 × 1024), rounded


def test_a_divisor_search_past_the_bound_is_refused():
    with _deadline(10), pytest.raises(Exception) as err:
        divisors(2**61 - 1)  # isqrt = 1.5·10^9 trials > MAX_DIVISOR_TRIALS
    assert "divisors" in str(err.value) and f"{limits.MAX_DIVISOR_TRIALS:,}" in str(err.value)


def test_plan_with_a_15t_token_batch_is_fast():
    """The micro-batch search tried every divisor of 1.8·10^9 sequences per GPU (10.7 s, minutes
    under load); it now tries the 64 candidates a micro-batch can be."""
    t0 = time.perf_counter()
    with _deadline(60):
        result = run_cli("plan", "llama-3.1-8b on 8xh100-sxm", "--global-batch-tokens", "15T", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["workload"]["sequences_per_gpu"] == 1_831_054_688
    assert all(1_831_054_688 % p["micro_batch"] == 0 for p in plan["plans"])
    assert time.perf_counter() - t0 < 60


# --- the configurations a plan evaluates ----------------------------------------------------------
def test_plan_past_its_configuration_bound_is_refused_with_the_count_and_the_way():
    # 720,720 one-GPU nodes: 239 HSDP groups × 40 micro-batches × ... = 2,218,212 candidates (~4 GiB)
    with _deadline(60):
        line = _refused(run_cli("plan", "llama-3.1-8b on 720720x1xh100-sxm", "--global-batch", str(720720 * 720720)),
                        "max_configurations=1000000", "2,218,212 candidates", "--max-configurations 2218212")
    assert "GiB" in line


def test_plan_max_configurations_option():
    line = _refused(run_cli("plan", "llama-3.1-8b on 8xh100-sxm", "--max-configurations", "100"),
                    "594 candidates", "--max-configurations 594")
    assert line.startswith("shardplan: error: max_configurations=100:")
    ok = run_cli("plan", "llama-3.1-8b on 8xh100-sxm", "--max-configurations", "594", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["candidates"] == 594


# --- sweeps ---------------------------------------------------------------------------------------
def test_sweep_integer_range_is_measured_before_it_is_built(tmp_path):
    with _deadline(30):
        # each end within seq_len's own range (limits.INT_RANGES); the range's length is what is refused
        _refused(run_cli("sweep", "-o", tmp_path / "s.csv", "--seq-len", "1-16000000"),
                 "seq_len=", "16,000,000 values", f"at most {limits.MAX_AXIS_VALUES:,}")
    assert not list(tmp_path.iterdir())


def test_sweep_past_the_configuration_bound_is_refused_before_it_runs(tmp_path):
    with _deadline(30):
        _refused(run_cli("sweep", "-o", tmp_path / "s.csv", "--gpu-counts", "1-8", "--seq-len", "1-10000",
                         "--micro-batch", "1-200"),
                 "max_configurations=10000000", "144,000,000 configurations", "--max-configurations 144000000",
                 "max_configurations=144000000")
    _refused(run_cli("sweep", "-o", tmp_path / "s.csv", "--gpu-counts", "1-8", "--max-configurations", "3"),
             "72 configurations")
    ok = run_cli("sweep", "-o", tmp_path / "s.csv", "--gpu-counts", "1-8", "--max-configurations", "72")
    assert ok.exit_code == 0, ok.output
    assert "wrote 72 rows" in ok.stdout


def test_sweep_python_api_bound():
    import shardplan
    from shardplan.support.errors import ShardplanError

    with _deadline(30), pytest.raises(ShardplanError) as err:
        shardplan.sweep(gpu_counts=range(1, 10**15))  # a range is measured, not listed
    assert err.value.field == "gpu_counts"
    with pytest.raises(ShardplanError) as err:
        shardplan.sweep(gpu_counts=[8, 16], seq_len=[1024, 2048], max_configurations=10)
    assert err.value.field == "max_configurations" and "32 configurations" in str(err.value)  # 2 × 8 × 2
    assert len(shardplan.sweep(gpu_counts=[8, 16], seq_len=[1024, 2048], max_configurations=32)) == 32
    with pytest.raises(ShardplanError) as err:
        shardplan.sweep(seq_len=(1024 + i for i in range(10**12)))  # an iterator is read one past the bound
    assert err.value.field == "seq_len"


def test_sweep_cluster_table_is_bounded(tmp_path):
    with _deadline(30):
        _refused(run_cli("sweep", "-o", tmp_path / "s.csv", "--gpu-counts", "8-40000"),
                 "gpus x nodes x gpu_counts", "39,993 combinations", f"{limits.MAX_SWEEP_TABLE_CELLS:,}")


def test_sweep_dedupe_is_linear(tmp_path):
    """99,998 distinct values: the list-membership dedupe was 5·10^9 comparisons; hashing is linear.
    Order and first occurrences are kept (the rows follow the order given)."""
    from shardplan.planning.sweep_axes import dedupe as _dedupe

    assert _dedupe([3, 1, 3, 2, 1, True, 1.0]) == [3, 1, 2]
    with _deadline(60):
        result = run_cli("sweep", "-o", tmp_path / "s.csv", "--seq-len", "1-99998,5,7", "--strategies", "full_shard",
                         "--columns", "fits", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "wrote 99,998 rows" in result.stdout


# --- model sizes ----------------------------------------------------------------------------------
def test_models_show_of_a_model_with_10_12_layers_is_refused(tmp_path):
    """Per-layer lists (block_params, parameter_shapes) of 10^12 blocks were a MemoryError."""
    profile = json.loads((__import__("pathlib").Path(__file__).parents[1] / "model_profiles" / "llama-2-7b.json").read_text())
    profile.update(name="huge-layers", aliases=[], num_layers=10**12)
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(profile))
    with _deadline(30):
        _refused(run_cli("models", "show", path), "num_layers=1000000000000", str(limits.MAX_LAYERS))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 10**12,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "max_position_embeddings": 8192}))
    with _deadline(30):
        # the config's own key is named, checked before any default or per-layer list (input_files, hf_config)
        _refused(run_cli("fit", f"{hf} on 8xh100-sxm"), "num_hidden_layers=1000000000000", f"{limits.MAX_LAYERS:,}")


# --- calibration sizes ----------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--factor", "1"], ["factor=1", "[2, "]),
    (["--factor", "0"], ["factor=0"]),
    (["--min-bytes", "0"], ["min_bytes=0"]),
    (["--max-bytes", str(10**24)], ["max_bytes=", "out of range"]),
    (["--iters", str(10**12)], ["iters=1000000000000", f"{limits.MAX_ITERS:,}"]),
    (["--warmup", "-1"], ["warmup=-1"]),
])
def test_calibrate_collectives_sizes_are_bounded(tmp_path, args, words):
    pytest.importorskip("torch")
    with _deadline(60):
        _refused(run_cli("calibrate", "collectives", "--out", tmp_path / "c.json", *args), *words)
    assert not (tmp_path / "c.json").exists()


def test_calibrate_local_cpu_ranks_are_bounded(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("on CUDA machines the visible GPU count bounds local ranks")
    with _deadline(60):
        _refused(run_cli("calibrate", "collectives", "--out", tmp_path / "c.json", "--world-size", "100000"),
                 "world_size=100000", str(limits.MAX_LOCAL_CPU_RANKS))
        _refused(run_cli("calibrate", "fsdp", "--launch", "spawn", "--world-size", "1000", "--out",
                         tmp_path / "r.jsonl"), "world_size=1000", "--launch fake")
        _refused(run_cli("calibrate", "compute", "--size", str(10**7), "--out", tmp_path / "c.json"), "size=10000000")


def test_size_ladder_is_bounded_and_exact():
    from shardplan.calibrate.collectives import default_sizes

    assert default_sizes(1024, 1 << 20, 2, cuda=False) == [1 << k for k in range(10, 21)]
    assert default_sizes(1000, 999_999, 10, cuda=False) == [1000, 10_000, 100_000]
    assert len(default_sizes(1, limits.MAX_BYTES, 2, cuda=False)) == 61 <= limits.MAX_SIZE_LADDER
    for bad in (1, 0, 1.5, float("nan"), float("inf"), -2):
        with pytest.raises(Exception) as err:
            default_sizes(1024, 1 << 20, bad, cuda=False)
        assert "factor" in str(err.value)


def test_a_collective_fit_of_too_many_points_is_refused(tmp_path):
    """The piecewise fit's breakpoint search is exhaustive (O(points^2) line fits): a file of 8
    repeated nccl-tests ladders (248 points) took 12 s before the bound, 40 ladders would take
    ~25x that; it is refused above MAX_FIT_POINTS."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "nccl_tests_sample_all_reduce_perf.txt").read_text()
    header = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    rows = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("\n".join(header + rows * 8) + "\n")
    with _deadline(60):
        _refused(run_cli("calibrate", "collectives", "--nccl-tests", path, "--out", tmp_path / "c.json"),
                 f"samples={len(rows) * 8}", f"more than {limits.MAX_FIT_POINTS}")
    assert not (tmp_path / "c.json").exists()
    ok = tmp_path / "one.txt"
    ok.write_text(text)
    assert run_cli("calibrate", "collectives", "--nccl-tests", ok, "--out", tmp_path / "c.json").exit_code == 0
