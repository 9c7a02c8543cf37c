"""Which efficiencies a step time used, with their values and where each came from.

Status of each: ``measured`` (fitted on this GPU's committed measurements, shipped with
shardplan: the H100 GEMM shape fit), ``calibrated`` (the user's calibration overlay measured it on
their cluster; or, for ``window``, fitted on the published runs' tokens/s), or ``nameplate`` (the profile's cited figure or a stated ASSUMPTION, not measured
for this GPU). ``fit --global-batch-tokens`` prints them under the step time and puts them in its
JSON (``efficiencies``).
"""

from __future__ import annotations

from typing import Any

from shardplan.formulas import throughput as tp
from shardplan.formulas.comm import link_rates
from shardplan.inputs import strategy as st
from shardplan.inputs import time_calibration


def _entry(name: str, value: float, status: str, source: str) -> dict[str, Any]:
    return {"name": name, "value": round(float(value), 4), "status": status, "source": source}


def _gemm(cluster, rates, gemm_value: float, precision: str) -> dict[str, Any]:
    fit = cluster.gpu.gemm_shape_fit
    if rates.calibrated:
        return _entry("gemm", gemm_value, "calibrated", "the calibration's matmul curve")
    if fit is not None and precision != "fp32":
        return _entry("gemm", gemm_value, "measured",
                      f"per-shape fit on {fit.probes} probes of {fit.shapes} shapes ({fit.probes_file}), "
                      f"leave-one-shape-out median |error| {fit.loso_median_abs_error:.1%}")
    return _entry("gemm", gemm_value, "nameplate", cluster.gpu.sources.get("gemm_efficiency", "profile default")
                  + f"; eff(m) curve m_half {tp.GEMM_M_HALF:.0f}, p {tp.GEMM_P:.0f} (ASSUMPTION)")


def _attention(cluster, rates, config: dict[str, Any]) -> dict[str, Any]:
    """The attention core's efficiency for the configuration's kernel and sequence length: the
    profile's FlashAttention-2 figure × ``throughput.attention_rate_factor``."""
    kernel, seq = config.get("attention", "sdpa"), int(config.get("seq_len", tp.FLASH_SEQ_LONG))
    factor = float(tp.attention_rate_factor(st.ATTENTIONS.index(kernel), seq))
    source = cluster.gpu.sources.get("attention_efficiency", "profile default")
    return _entry("attention", float(rates.attention_efficiency) * factor, "nameplate",
                  f"{source}; {kernel} at seq {seq}: × {factor:.3f} (FlashAttention-2 paper §4.1: "
                  "range over sequence length, Triton kernel's speed)")


def _window() -> dict[str, Any]:
    """The calibrated window factor every answer's GPU seconds carry (``inputs.time_calibration``),
    as the efficiency it stands for: 1 / k."""
    k = time_calibration.window_factor()
    return _entry("window", 1.0 / k, "calibrated",
                  f"published multi-step tokens/s over a warm GPU's fastest step: 1 / {k:.3f}, fitted on "
                  f"the development set's {len(time_calibration.time_calibration()['per_source'])} sources and "
                  "judged leave-one-source-out "
                  "(shardplan/data/time_calibration.json; no source says what it holds)")


def _links(cluster, calibration) -> list[dict[str, Any]]:
    links = link_rates(cluster, calibration)
    tiers = [("intra_node_link", cluster.intra_link, links.intra_alpha_measured)]
    if cluster.nodes > 1:
        tiers.append(("inter_node_link", cluster.inter_link, links.inter_alpha_measured))
    out = []
    for name, link, calibrated in tiers:
        status = "calibrated" if calibrated else "nameplate"
        source = "the calibration's per-size fit" if calibrated else (
            f"{link.name}: {link.sources['efficiency']}; latency per NCCL protocol (tuning.cc)")
        out.append(_entry(name, link.efficiency, status, source))
    return out


def efficiencies_used(cluster, config: dict[str, Any], gemm_value: float, calibration=None) -> list[dict[str, Any]]:
    """GEMM, attention, HBM and link efficiencies of one configuration's step time (``gemm_value``:
    the step time's own ``gemm_efficiency``), each with its status and source."""
    rates = tp.compute_rates(cluster, calibration)
    nameplate_hbm = cluster.gpu.memory_bandwidth_bytes_per_s
    hbm_status = "calibrated" if rates.calibrated and float(rates.hbm_bytes_per_s) != nameplate_hbm * tp.HBM_EFFICIENCY \
        else "nameplate"
    out = [_gemm(cluster, rates, gemm_value, config.get("precision", "")),
           _attention(cluster, rates, config),
           _entry("hbm", float(rates.hbm_bytes_per_s) / nameplate_hbm, hbm_status,
                  "the calibration's element-wise bandwidth" if hbm_status == "calibrated"
                  else f"ASSUMPTION {tp.HBM_EFFICIENCY} of nameplate (throughput.HBM_EFFICIENCY)")]
    return out + [_window()] + _links(cluster, calibration)
