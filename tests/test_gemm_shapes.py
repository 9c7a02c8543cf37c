"""GEMM efficiency per problem shape (``shardplan/calibrate/gemm_shapes.py``, the GPU profile's
``gemm_shape_fit``, ``throughput.gemm_shape_efficiency``)."""

from pathlib import Path

import numpy as np
import pytest

from shardplan.calibrate import gemm_shapes as gs
from shardplan.formulas import throughput as tp
from shardplan.formulas.columns import columns_for
from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import get_gpu, parse_gpus
from shardplan.inputs.models import resolve_model

ROOT = Path(__file__).resolve().parents[1]
PROBES = ROOT / "data" / "calibration" / "gpu" / "probes.jsonl"
H100_FIT = get_gpu("h100-sxm").gemm_shape_fit


def test_profile_fit_is_the_fit_of_its_probes():
    """The H100 profile's coefficients and stated leave-one-shape-out errors re-derive from the probes."""
    fit = H100_FIT.model_dump()
    assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in fit.items()} == {
        **gs.fit_table(PROBES, "h100-sxm"), "probes_file": "data/calibration/gpu/probes.jsonl"}
    assert (ROOT / fit["probes_file"]).exists()


def test_shape_fit_beats_the_nameplate_curve_out_of_sample():
    """Leave-one-shape-out, the fit's median |error| is below the old eff(m) curve's (0.801, m½ 256,
    p 2) on the same probes: 6.6 % vs 11.8 %."""
    points = gs.gemm_points(PROBES)
    fit = np.median(np.abs(gs.leave_one_shape_out(points, 989.4)))
    curve = np.median([abs(0.801 / (1 + (256 / np.cbrt(m * n * k)) ** 2) / (t / 989.4) - 1) for m, n, k, t, _ in points])
    assert fit < curve
    assert fit <= 0.07


def test_launch_bound_probes_are_left_out():
    shapes = {p[:3] for p in gs.gemm_points(PROBES)}
    assert (512, 512, 512) not in shapes and (1024, 1024, 1024) not in shapes
    assert (8192, 14336, 4096) in shapes


def _cols(gpus="8xh100-sxm", **knobs):
    cluster = parse_gpus(gpus)
    config = TrainingConfig(**{"strategy": "full_shard", "micro_batch": 1, "seq_len": 4096, **knobs})
    return columns_for(resolve_model("llama-3.1-8b").spec, cluster, config), tp.compute_rates(cluster)


@pytest.mark.parametrize("seq_len", [512, 2048, 8192])
def test_efficiency_rises_with_tokens_on_measured_gpu(seq_len):
    """m = b·s: more tokens, a more efficient GEMM mix (the fit's cm > 0), within the measured best."""
    c_small, rates = _cols(seq_len=seq_len)
    c_big, _ = _cols(seq_len=seq_len * 2)
    small, big = float(tp.gemm_efficiency(c_small, rates)), float(tp.gemm_efficiency(c_big, rates))
    assert small < big <= H100_FIT.eff_max


def test_unmeasured_gpu_and_fp32_keep_the_nameplate_curve():
    c, rates = _cols("8xa100-80gb")
    assert np.isnan(rates.gemm_shape_c0)
    m = np.cbrt(4096 * 4096 * 14336)
    assert float(tp.gemm_efficiency(c, rates)) == pytest.approx(rates.gemm_efficiency / (1 + (256 / m) ** 2))
    c32, rates_h = _cols(precision="fp32")
    assert float(tp.gemm_efficiency(c32, rates_h)) == pytest.approx(rates_h.gemm_efficiency / (1 + (256 / m) ** 2))


def test_lora_adapter_bytes_scale_with_adapted_linears_and_dropout():
    """PEFT's adapter path moves bytes per adapted Linear: more targets, more bytes; dropout > 0
    adds its copy and mask; a full fine-tune has none."""
    c_full, _ = _cols(method="full")
    c_qv, _ = _cols(method="lora", lora_targets="qv", lora_dropout=0.0)
    c_all, _ = _cols(method="lora", lora_targets="all-linear", lora_dropout=0.0)
    c_drop, _ = _cols(method="lora", lora_targets="all-linear", lora_dropout=0.1)
    full, qv, all_, drop = (float(tp.lora_adapter_bytes_per_token(c)) for c in (c_full, c_qv, c_all, c_drop))
    assert full == 0 < qv < all_ < drop
    # Llama-3.1-8B all-linear, bf16, AC none: per layer in widths 4096·6 + 14336, out widths 43008
    c_none, _ = _cols(method="lora", lora_targets="all-linear", ac="none", lora_dropout=0.0)
    ins, outs = 4096 * 6 + 14336, 4096 * 2 + 1024 * 2 + 14336 * 2 + 4096
    assert float(tp.lora_adapter_bytes_per_token(c_none)) == pytest.approx(32 * (2 * ins + 12 * outs + 8 * outs + 8 * ins))


def test_qlora_base_matmuls_run_in_16_bit_even_when_the_rest_is_fp32():
    c16, rates = _cols(method="qlora", precision="bf16-mixed")
    c32, _ = _cols(method="qlora", precision="fp32")
    assert int(tp.matmul_precision(c32)) == int(tp.matmul_precision(c16)) != 3
    full32, _ = _cols(method="full", precision="fp32")
    assert int(tp.matmul_precision(full32)) == 3  # a plain fp32 run multiplies in fp32
