"""FSDP1's rate limiter under PEFT's per-adapter units (``formulas/fsdp1_limiter.py``, issue 23): the
price reproduces the H100 fake-process-group pair it was calibrated on, and the exposure follows what
it scales with (micro-batch, adapted Linears, layers, world size, the price)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from shardplan.calibrate.gpu_compare import campaign_columns
from shardplan.formulas import fsdp1_limiter as fl
from shardplan.formulas import throughput as tp
from shardplan.formulas.comm import link_rates
from shardplan.inputs import strategy as st
from shardplan.inputs.hardware import parse_gpus

PAIR = Path(__file__).resolve().parents[1] / "data" / "calibration" / "gpu" / "fsdp1world" / "fsdp1world.jsonl"
RECORDS = {r["config"]["world_size"]: r for r in map(json.loads, PAIR.read_text().splitlines())}


def step_s(c, gpus: str) -> float:
    cluster = parse_gpus(gpus)
    return float(tp.step_time(c, link_rates(cluster), tp.compute_rates(cluster))["step_time_s"])


def exposure_s(c, gpus: str = "2xh100-sxm") -> float:
    """The step's seconds with the limiter term less the same step without it."""
    with pytest.MonkeyPatch.context() as mp:
        base = step_s(c, gpus)
        mp.setattr(tp, "limiter_exposure_s", lambda c_, *a: (np.zeros(np.shape(c_.num_layers)),) * 2)
        return base - step_s(c, gpus)


def fake_pg(world_size: int, **fields):
    return replace(campaign_columns(RECORDS[world_size]), **{k: np.asarray(v) for k, v in fields.items()})


def measured(world_size: int, median: bool) -> float:
    steps = RECORDS[world_size]["step_times_s"]
    return statistics.median(steps[3:8]) if median else min(steps)


@pytest.mark.parametrize("median", [False, True])
def test_the_fake_pg_pair_is_reproduced(median, monkeypatch):
    """World size 2 (FULL_SHARD, limiter) − world size 1 (NO_SHARD) on the fake group: the model's
    difference at the price from the fastest steps (or the median of steps 4–8) is the measured one
    within 0.02 s (the bisection the price came from rounds it to 1 µs: 481 units × 3 passes ≈ 1 ms;
    the rest is the comm the fake group does not run, ~9 ms). The measured fastest-to-median spread
    (0.08 s) is the price's uncertainty (UNIT_SHARDED_HOST_S vs _MEDIAN)."""
    if median:
        monkeypatch.setattr(fl, "UNIT_SHARDED_HOST_S", fl.UNIT_SHARDED_HOST_S_MEDIAN)
    want = measured(2, median) - measured(1, median)
    got = step_s(fake_pg(2), "2xh100-sxm") - step_s(fake_pg(1), "1xh100-sxm")
    assert got == pytest.approx(want, abs=0.02)
    assert 0.55 < measured(2, False) - measured(1, False) < 0.62  # the README's +0.59 s


def test_world_size_one_no_shard_and_other_engines_pay_nothing():
    assert exposure_s(fake_pg(1), "1xh100-sxm") == 0.0
    assert exposure_s(fake_pg(2, strategy=st.NO_SHARD)) == 0.0
    assert exposure_s(fake_pg(2, strategy=st.SHARD_GRAD_OP)) == 0.0  # frees nothing in forward
    assert exposure_s(fake_pg(2, engine=st.FSDP2)) == 0.0
    assert exposure_s(fake_pg(2)) > 0.3


def test_it_falls_with_the_micro_batch():
    """Longer GEMMs hide the same host work: the exposure shrinks as the micro-batch grows."""
    e = [exposure_s(fake_pg(2, micro_batch=mb)) for mb in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(e, e[1:]))
    assert e[-1] < 0.25 * e[1]


def test_it_scales_with_layers_and_the_price(monkeypatch):
    """Every layer is the same chain of cycles: at the same GPU seconds a layer, twice the layers is
    twice the exposure; a dearer unit exposes more."""
    c, compute = fake_pg(2), tp.compute_rates(parse_gpus("2xh100-sxm"))
    rates = tp.limiter_rates(c, compute, tp.gemm_efficiency(c, compute))

    def total(layers):
        f, b = fl.limiter_exposure_s(fake_pg(2, num_layers=layers), 0.011, 0.032, rates)
        return float(f + b)

    assert total(64) == pytest.approx(2 * total(32), rel=1e-9)
    assert total(32) > 0.3
    before = total(32)
    monkeypatch.setattr(fl, "UNIT_SHARDED_HOST_S", 2 * fl.UNIT_SHARDED_HOST_S)
    assert total(32) > before + 0.3


def test_more_adapter_units_expose_more_and_a_full_fine_tune_hides_it():
    """All-linear (7 adapted Linears, 15 units a layer) > attention (q, k, v, o) > q, v; a full
    fine-tune has one unit a layer and its layer's GPU work hides the host."""
    all_linear = exposure_s(fake_pg(2))
    attention = exposure_s(fake_pg(2, lora_adapted_linears=4, lora_mlp_adapted=0))
    qv = exposure_s(fake_pg(2, lora_adapted_linears=2, lora_qkv_adapted=2, lora_mlp_adapted=0))
    assert all_linear > attention > qv > 0.0
    assert exposure_s(fake_pg(2, method=st.FULL)) == 0.0


def positions(adapted: set[str]):
    return {p: np.asarray(p in adapted) for p in fl.POSITIONS}


def test_cycles_by_hand():
    """One pass, weights even (1/8 each), GPU 8 s a layer, 0.8 s of layer host (0.1 a position),
    5 s per adapted Linear, 1 s for the layer unit. Adapted q and o: the cycles are [gate, up, down
    (wrapped) + the unit, q]: host 0.3 + 1 + 0.1 + 5 = 6.4 vs GPU 4, and [k, v, attn, o]: host
    0.4 + 5 = 5.4 vs GPU 4: 2.4 + 1.4 = 3.8 exposed."""
    w = {p: 1 / 8 for p in fl.POSITIONS}
    args = (8.0, w, 0.8, 5.0, 1.0)
    got = fl.pass_exposure_s(fl.POSITIONS, positions({"q", "o"}), *args)
    assert float(got) == pytest.approx(3.8)
    # nothing adapted: the layer is one cycle, 0.8 + 1 host under 8 GPU
    assert float(fl.pass_exposure_s(fl.POSITIONS, positions(set()), *args)) == 0.0
    # never less than the host beyond the GPU (what an unlimited host would cost)
    big = fl.pass_exposure_s(fl.POSITIONS, positions({"q", "k", "v", "o"}), 8.0, w, 0.8, 3.0, 1.0)
    assert float(big) >= 0.8 + 1.0 + 4 * 3.0 - 8.0
