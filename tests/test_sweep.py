"""shardplan.planning.grid_sweep: rows equal the scalar path, the product is laid out right, helpers, CLI."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import shardplan
from shardplan.cli.app import main
from shardplan.formulas.memory import BREAKDOWN_TERMS
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import parse_gpus
from shardplan.inputs.models import get_model
from shardplan.planning.fit import evaluate
from shardplan.planning.grid_sweep import sweep
from shardplan.planning.sweep_analysis import fewest_gpus_per_group as minimum_gpus
from shardplan.planning.sweep_analysis import pareto
from shardplan.support.errors import ShardplanError

GRID = dict(
    models=["gpt2", "llama-3.1-8b", "mixtral-8x7b", "llama-3.1-70b", "deepseek-v2-lite"],
    gpus=["h100-sxm", "24GB"],
    gpu_counts=[1, 8, 16],
    strategies=None,
    engines=["fsdp2", "fsdp1", "deepspeed"],
    method=["full", "lora", "qlora"],
    lora_rank=[8, 64],
    precision=["bf16-mixed", "fp32", "bf16-pure"],
    optimizer=["adamw", "sgd", "adamw-8bit", "lion"],
    offload=["none", "optimizer", "optimizer+params"],
    ac=["none", "every-k"],
    seq_len=[512, 4096],
)


@pytest.fixture(scope="module")
def grid():
    # a small chunk size so the sample crosses many chunk boundaries and split axes
    return sweep(**GRID, chunk_size=5_000, progress=False)


def test_rows_are_the_cartesian_product(grid):
    sizes = [len(v) if isinstance(v, list) else (len(st.STRATEGIES) if v is None else 1) for v in GRID.values()]
    assert len(grid) == int(np.prod(sizes))
    # last varying axis fastest: seq_len alternates, then ac
    assert list(grid["seq_len"][:4]) == [512, 4096, 512, 4096]
    assert list(grid["ac"][:4]) == ["none", "none", "every-k", "every-k"]
    assert grid["model"].dtype == "category" and grid["strategy"].dtype == "category"
    assert not grid.duplicated(subset=["model", "gpu", "world_size", "engine", "strategy", "method", "lora_rank",
                                       "precision", "optimizer", "offload", "ac", "micro_batch", "seq_len",
                                       "grad_accum"]).any()


def _scalar(row) -> tuple:
    spec = get_model(row.model)
    cluster = parse_gpus(f"{row.world_size}x{row.gpu}")
    config = TrainingConfig(strategy=row.strategy, engine=row.engine, precision=row.precision,
                            optimizer=row.optimizer, ac=row.ac, offload=row.offload, method=row.method,
                            lora_rank=int(row.lora_rank), micro_batch=int(row.micro_batch), seq_len=int(row.seq_len),
                            grad_accum=int(row.grad_accum))
    return evaluate(spec, cluster, config), cluster


def test_sample_rows_equal_scalar_evaluate(grid):
    rng = np.random.default_rng(20240605)
    sample = grid.iloc[rng.choice(len(grid), size=300, replace=False)]
    # make sure the sample covers fitting rows and every strategy
    sample = pd.concat([sample, grid[grid["fits"]].sample(100, random_state=1)])
    for row in sample.itertuples(index=False):
        r, cluster = _scalar(row)
        where = f"{row.model} {row.world_size}x{row.gpu} {row.strategy}/{row.engine} {row.method} {row.offload}"
        assert row.fits == r.fits and row.fits_gpu == r.fits_gpu and row.fits_host == r.fits_host, where
        assert row.valid == r.valid, where
        assert row.peak_allocated_bytes == r.per_gpu.peak_allocated_bytes, where
        assert row.peak_reserved_bytes == r.per_gpu.peak_reserved_bytes, where
        assert row.device_total_bytes == r.per_gpu.device_total_bytes, where
        assert row.non_torch_bytes == r.per_gpu.non_torch_bytes, where
        assert row.headroom_bytes == r.per_gpu.headroom_bytes, where
        assert row.model_state_bytes == r.per_gpu.model_state_bytes, where
        assert row.peak_moment == r.per_gpu.peak_moment, where
        assert (row.verdict, row.band_bytes, row.margin_bytes, row.risk_term) == (
            r.verdict, r.band_bytes, r.margin_bytes, r.risk_term), where
        assert row.host_bytes_per_node == r.per_node.host_bytes, where
        assert row.gpus_per_node == cluster.gpus_per_node and row.nodes == cluster.nodes, where
        for term in BREAKDOWN_TERMS:
            assert getattr(row, term) == r.per_gpu.breakdown[term], (where, term)


def test_random_one_row_sweeps_cover_every_knob_value():
    rng = np.random.default_rng(11)
    models = ["gpt2", "opt-1.3b", "falcon-7b", "gemma-2-9b", "mixtral-8x7b", "deepseek-v2-lite", "llama-3.1-405b"]
    for _ in range(60):
        pick = lambda names: names[rng.integers(len(names))]  # noqa: E731
        knobs = dict(strategy=pick(st.STRATEGIES), engine=pick(st.ENGINES), precision=pick(st.PRECISIONS),
                     optimizer=pick(st.OPTIMIZERS), ac=pick(st.AC_MODES), offload=pick(st.OFFLOADS),
                     method=pick(st.METHODS), attention=pick(st.ATTENTIONS), lora_rank=int(rng.integers(1, 128)),
                     ac_every_k=int(rng.integers(1, 5)), micro_batch=int(rng.integers(1, 9)),
                     seq_len=int(rng.integers(64, 9000)), grad_accum=int(rng.integers(1, 5)))
        model, gpus = pick(models), pick(["1x24GB", "2xrtx4090", "8xa100-40gb", "2x8xh100-sxm", "4xmi300x"])
        cluster = parse_gpus(gpus)
        r = evaluate(get_model(model), cluster, TrainingConfig(**knobs))
        df = sweep(models=model, gpus="24GB" if cluster.capacity_only else cluster.gpu.name, gpu_counts=cluster.world_size, nodes=cluster.nodes,
                   strategies=knobs.pop("strategy"), engines=knobs.pop("engine"), progress=False, **knobs)
        row = df.iloc[0]
        assert len(df) == 1 and row["fits"] == r.fits and row["valid"] == r.valid
        assert row["peak_allocated_bytes"] == r.per_gpu.peak_allocated_bytes
        assert row["host_bytes_per_node"] == r.per_node.host_bytes
        assert {t: row[t] for t in BREAKDOWN_TERMS} == r.per_gpu.breakdown


def test_comm_and_throughput_columns_equal_scalar_path(grid):
    comm = pytest.importorskip("shardplan.formulas.comm")
    tp = pytest.importorskip("shardplan.formulas.throughput")
    from shardplan.formulas.columns import columns_for
    from shardplan.inputs import time_calibration

    rng = np.random.default_rng(7)
    sample = grid.iloc[rng.choice(len(grid), size=80, replace=False)]
    checked = 0
    for row in sample.itertuples(index=False):
        cluster = parse_gpus(f"{row.world_size}x{row.gpu}")
        config = TrainingConfig(strategy=row.strategy, engine=row.engine, precision=row.precision,
                                optimizer=row.optimizer, ac=row.ac, offload=row.offload, method=row.method,
                                lora_rank=int(row.lora_rank), micro_batch=int(row.micro_batch),
                                seq_len=int(row.seq_len), grad_accum=int(row.grad_accum))
        c = columns_for(get_model(row.model), cluster, config)
        volume = comm.comm_volume(c)
        # the sweep answers as fit does: at the calibrated window factor (inputs.time_calibration)
        rates = tp.compute_rates(cluster, window_factor=time_calibration.window_factor())
        times = tp.step_time(c, comm.link_rates(cluster), rates, volume=volume)
        for name, value in {**volume, **times}.items():
            got = getattr(row, name)
            assert got == pytest.approx(float(value), rel=1e-12, nan_ok=True), (name, row)
            checked += 1
    assert checked > 80 * 20
    for name in ("step_time_s", "tokens_per_s", "mfu", "comm_bytes_per_step", "ag_fwd_s"):
        assert name in grid.columns


def test_scalars_give_one_row_and_public_api():
    df = shardplan.sweep(models="llama-3.1-70b", gpus="24GB", gpu_counts=4, strategies="full_shard",
                         method="qlora", ac="full", checkpoint_wrapper=False, progress=False)
    assert len(df) == 1
    r = evaluate(get_model("llama-3.1-70b"), parse_gpus("4x24GB"),
                 TrainingConfig(strategy="full_shard", method="qlora", ac="full", checkpoint_wrapper=False))
    assert bool(df["fits"].iloc[0]) == r.fits and df["verdict"].iloc[0] == r.verdict == "tight"
    assert int(df["band_bytes"].iloc[0]) == r.band_bytes and int(df["margin_bytes"].iloc[0]) == r.margin_bytes
    assert df["gpu"].iloc[0] == "24GB"


def test_nodes_and_unlayoutable_counts():
    df = sweep(models="llama-3.1-8b", gpus="h100-sxm", gpu_counts=[8, 12, 16], nodes=[1, 2], strategies="full_shard",
               progress=False)
    assert len(df) == 6
    by = {(r.nodes, r.world_size): r for r in df.itertuples()}
    assert by[(2, 16)].gpus_per_node == 8 and by[(1, 16)].gpus_per_node == 16  # nodes given: as parse_gpus '1x16x..'
    assert by[(2, 12)].gpus_per_node == 6 and by[(2, 12)].valid
    three = sweep(models="llama-3.1-8b", gpus="h100-sxm", gpu_counts=8, nodes=3, strategies="full_shard", progress=False)
    assert not three["valid"].iloc[0] and not three["fits"].iloc[0] and three.attrs["notes"]
    auto = sweep(models="llama-3.1-8b", gpus="h100-sxm", gpu_counts=[12, 16], strategies="full_shard", progress=False)
    assert list(auto["valid"]) == [False, True] and list(auto["nodes"]) == [1, 2]


def test_valid_only_and_columns():
    full = sweep(models="gpt2", gpus="h100-sxm", gpu_counts=[1, 8], strategies=None, engines=["fsdp2", "deepspeed"],
                 progress=False)
    valid = sweep(models="gpt2", gpus="h100-sxm", gpu_counts=[1, 8], strategies=None, engines=["fsdp2", "deepspeed"],
                  valid_only=True, columns="summary", chunk_size=3, progress=False)
    assert len(valid) == int(full["valid"].sum()) and valid["valid"].all()
    assert "activations" not in valid.columns and "peak_allocated_bytes" in valid.columns
    pd.testing.assert_series_equal(valid["peak_allocated_bytes"].reset_index(drop=True),
                                   full.loc[full["valid"], "peak_allocated_bytes"].reset_index(drop=True))
    picked = sweep(models="gpt2", gpu_counts=2, columns="fits,activations", progress=False)
    assert {"fits", "activations", "model", "strategy"} <= set(picked.columns)


def test_bad_values_are_one_line_errors():
    with pytest.raises(ShardplanError, match="strategy"):
        sweep(strategies="zero4", progress=False)
    with pytest.raises(ShardplanError, match="gpu_counts"):
        sweep(gpu_counts=[0], progress=False)
    with pytest.raises(ShardplanError, match="columns"):
        sweep(columns=["nope"], progress=False)


def test_pareto_front():
    df = pd.DataFrame({"device_total_bytes": [1, 2, 2, 3, 4, 5], "tokens_per_s": [10, 5, 20, 15, 30, 30],
                       "fits": [True] * 6})
    front = pareto(df)
    assert list(front["device_total_bytes"]) == [1, 2, 4]
    assert list(front["tokens_per_s"]) == [10, 20, 30]
    # brute force: nothing in the front is dominated, everything off it is
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.integers(0, 50, 400), "y": rng.integers(0, 50, 400), "fits": True})
    front = pareto(df, x="x", y="y")
    for _, r in df.iterrows():
        dominated = ((df.x <= r.x) & (df.y >= r.y) & ((df.x < r.x) | (df.y > r.y))).any()
        on_front = ((front.x == r.x) & (front.y == r.y)).any()
        assert dominated != on_front or (on_front and not dominated)
    assert not any(((df.x <= r.x) & (df.y >= r.y) & ((df.x < r.x) | (df.y > r.y))).any() for r in front.itertuples())


def test_minimum_gpus_matches_fit_minimum_gpus():
    from shardplan.planning.fit import fewest_gpus_that_fit as fit_minimum

    counts = [1, 2, 4, 8, 16, 32, 64, 128]
    df = sweep(models=["llama-3.1-8b", "llama-3.1-70b"], gpus="a100-80gb", gpu_counts=counts,
               strategies=["full_shard", "ddp"], ac="full", progress=False)
    table = minimum_gpus(df)
    for row in table.itertuples():
        want = fit_minimum(get_model(row.model), parse_gpus("8xa100-80gb"),
                           TrainingConfig(strategy=row.strategy, ac="full"), limit=128)
        if want is None or want in counts:  # fit's search also tries counts the sweep did not
            assert (None if pd.isna(row.minimum_gpus) else int(row.minimum_gpus)) == want, row


def test_cli_sweep_writes_csv_and_parquet(tmp_path, capsys):
    out = tmp_path / "grid.csv"
    rc = main(["sweep", "--models", "gpt2,llama-3.1-8b", "--gpus", "h100-sxm", "--gpu-counts", "1-2,8",
               "--strategies", "full_shard,ddp", "--seq-len", "1024,2048", "--columns", "summary", "-o", str(out)])
    assert rc == 0
    df = pd.read_csv(out)
    assert len(df) == 2 * 3 * 2 * 2 and {"model", "fits", "peak_allocated_bytes"} <= set(df.columns)
    assert not list(tmp_path.glob(".*tmp*"))
    assert "wrote 24 rows" in capsys.readouterr().out
    pytest.importorskip("pyarrow")
    pq = tmp_path / "grid.parquet"
    assert main(["sweep", "--models", "gpt2", "--gpu-counts", "1,2", "-o", str(pq)]) == 0
    back = pd.read_parquet(pq)
    assert len(back) == 2 * len(st.STRATEGIES) and back["strategy"].dtype == "category"


def test_cli_sweep_errors_are_one_line(tmp_path, capsys):
    assert main(["sweep", "--models", "nope", "-o", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error: model=") and err.count("\n") == 1
    assert main(["sweep", "-o", str(tmp_path / "x.xlsx")]) == 2
    assert "output" in capsys.readouterr().err


def test_progress_bar_on_request_only(capsys):
    sweep(models="gpt2", gpu_counts=[1, 2, 4], strategies=None, chunk_size=4, progress=True)
    err = capsys.readouterr().err
    assert "sweep [" in err and "100.0%" in err and err.endswith("\n")
    sweep(models="gpt2", gpu_counts=[1, 2, 4], strategies=None, chunk_size=4)  # stderr is not a terminal
    assert capsys.readouterr().err == ""


def test_package_level_sweep_loads_lazily_and_is_callable():
    import subprocess
    import sys

    code = ("import sys, shardplan; assert 'pandas' not in sys.modules; "
            "df = shardplan.sweep(models='gpt2', gpus='24GB', gpu_counts=[1, 2], strategies='full_shard', progress=False); "
            "assert len(df) == 2 and callable(shardplan.pareto)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_sweep_carries_every_link_rate_field():
    """A sweep rebuilds ``comm.LinkRates`` per row from ``RATE_FIELDS``: a field left out runs at its
    default there and the sweep disagrees with the scalar path (NCCL's LL cap, Tree hops, xGMI mesh)."""
    from dataclasses import fields

    from shardplan.formulas.comm import LinkRates
    from shardplan.planning.sweep_plan import RATE_FIELDS

    calibration_only = {"calibrated", "tables", "intra_alpha_measured", "inter_alpha_measured"}
    assert {f.name for f in fields(LinkRates)} - calibration_only == set(RATE_FIELDS)
