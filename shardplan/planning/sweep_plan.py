"""A sweep's plan: its axes, and the model- and cluster-dependent columns tabulated once per
(model, LoRA rank, LoRA targets) and per (GPU, nodes, GPU count) cell, each resolved in Python
once (a profile lookup, a cluster layout), then indexed by the chunks."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.formulas import comm, throughput
from shardplan.formulas.columns import MODEL_FIELDS, cluster_values, model_values
from shardplan.inputs import strategy as st
from shardplan.inputs import time_calibration
from shardplan.inputs.hardware import Cluster, gpu_family, parse_gpus
from shardplan.inputs.models import resolve_model
from shardplan.planning.sweep_axes import AXES, Axis, as_list, checked_ints, dedupe, knob_axes
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_SWEEP_CONFIGURATIONS, MAX_SWEEP_TABLE_CELLS, approx_bytes

# Bytes of the returned DataFrame per row with every column (measured: a 192,000-row sweep of all
# 114 columns holds 765 B a row; "summary" 136 B); the configuration bound's message uses it.
SWEEP_ROW_BYTES = 765

CLUSTER_FIELDS = ("world_size", "gpus_per_node", "gpu_memory_bytes", "host_ram_bytes_per_node", "nccl_buffer_bytes")
RATE_FIELDS = ("intra_alpha_s", "intra_bus_bytes_per_s", "inter_alpha_s", "inter_nic_bytes_per_s", "nics_per_node",
               "intra_ll128_hop_s", "intra_simple_hop_s", "inter_simple_hop_s", "intra_tree_ll_hop_s",
               "intra_tree_ll128_hop_s", "intra_tree_simple_hop_s", "ll_max_bus_bytes_per_s", "intra_mesh_peer_links",
               "inter_net_latency_s")
COMPUTE_FIELDS = ("gemm_efficiency", "gemm_m_half", "gemm_p", "attention_efficiency", "hbm_bytes_per_s",
                  "host_link_bytes_per_s", "cpu_optimizer_bytes_per_s_per_node", "nccl_sm_fraction",
                  "gemm_shape_c0", "gemm_shape_cm", "gemm_shape_cn", "gemm_shape_ck", "gemm_shape_eff_max",
                  "window_factor")
PEAK_FIELD = "peak_flops_by_precision"


def _cluster_for(gpu: str, count: int, nodes: int | None, **link_options) -> tuple[Cluster | None, str]:
    """The cluster of ``count`` GPUs in all (spread over ``nodes`` nodes, or the GPU's usual node
    size when ``nodes`` is None), or None with the reason when that count cannot be laid out."""
    try:
        if nodes is None:
            return parse_gpus(f"{count}x{gpu}", **link_options), ""
        if count % nodes:
            return None, f"{count} GPUs do not split over {nodes} nodes"
        return parse_gpus(f"{nodes}x{count // nodes}x{gpu}", **link_options), ""
    except ShardplanError as err:
        if err.field == "gpus" and "whole" in err.reason:
            return None, err.reason
        raise


@dataclass
class SweepPlan:
    axes: list[Axis]
    model_table: dict[str, np.ndarray]      # [model, lora_rank, lora_targets]
    cluster_table: dict[str, np.ndarray]    # [gpu, nodes, gpu_counts]
    cluster_notes: list[str]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def rows(self) -> int:
        return math.prod(self.shape)

    def axis(self, name: str) -> Axis:
        return self.axes[AXES.index(name)]


def _check_cells(what: str, cells: int) -> None:
    """Refuse a model or cluster table past ``MAX_SWEEP_TABLE_CELLS`` (each cell is resolved in Python)."""
    if cells > MAX_SWEEP_TABLE_CELLS:
        raise ShardplanError(what, f"{cells:,} combinations", f"above the {MAX_SWEEP_TABLE_CELLS:,} a sweep resolves "
                                                              f"(each is a profile lookup in Python); split the sweep")


def plan_sweep(args: dict[str, Any], link_options: dict[str, Any],
               max_configurations: int = MAX_SWEEP_CONFIGURATIONS) -> SweepPlan:
    """The axes of the sweep ``args`` describe and its model and cluster tables; a product above
    ``max_configurations`` or a table above ``MAX_SWEEP_TABLE_CELLS`` is refused before any is built."""
    specs = _model_specs(args["models"])
    axes: dict[str, Axis] = {"models": Axis("models", tuple(s.name for s in specs), np.arange(len(specs)))}
    gpu_texts = dedupe(str(g).strip() for g in as_list(args["gpus"]))
    axes["gpus"] = Axis("gpus", tuple(gpu_texts), np.arange(len(gpu_texts)))
    nodes = [None] if args["nodes"] is None else checked_ints("nodes", as_list(args["nodes"]))
    axes["nodes"] = Axis("nodes", tuple(nodes), np.arange(len(nodes)))
    counts = checked_ints("gpu_counts", as_list(args["gpu_counts"]))
    axes["gpu_counts"] = Axis("gpu_counts", tuple(counts), np.asarray(counts, dtype=np.int64))
    axes.update(knob_axes(args, counts))
    ranks, targets = axes["lora_rank"].labels, axes["lora_targets"].labels
    _check_cells("models x lora_rank x lora_targets", len(specs) * len(ranks) * len(targets))
    _check_cells("gpus x nodes x gpu_counts", len(gpu_texts) * len(nodes) * len(counts))
    rows = math.prod(axes[a].size for a in AXES)
    if rows > max_configurations:
        raise ShardplanError("max_configurations", max_configurations,
                             f"this sweep has {rows:,} configurations, above the bound (~{approx_bytes(rows * SWEEP_ROW_BYTES)} "
                             f"with all columns); narrow an axis, or raise it: sweep(..., max_configurations={rows}) "
                             f"or shardplan sweep --max-configurations {rows}")
    model_table = _model_table(specs, ranks, targets)
    cluster_table, gpu_labels, notes = _cluster_table(gpu_texts, nodes, counts, link_options)
    axes["gpus"] = Axis("gpus", tuple(_dedupe_labels(gpu_labels)), axes["gpus"].codes)
    return SweepPlan([axes[a] for a in AXES], model_table, cluster_table, notes)


def _model_specs(models: Any) -> list:
    """The distinct models swept (a name or size resolved once each; two spellings of one model once)."""
    # each distinct text is resolved once (a file read or a size search), so the count is bounded first
    texts, seen = [], set()
    for t in as_list(models):
        key = id(t) if hasattr(t, "total_params") else str(t)
        if key not in seen:
            seen.add(key)
            texts.append(t)
    _check_cells("models", len(texts))
    by_name: dict[str, Any] = {}
    for text in texts:
        spec = text if hasattr(text, "total_params") else resolve_model(str(text)).spec
        by_name.setdefault(spec.name, spec)
    return list(by_name.values())


def _model_table(specs: list, ranks: tuple, targets: tuple) -> dict[str, np.ndarray]:
    """``config.model_values`` of every (model, LoRA rank, LoRA targets) cell."""
    shape_m = (len(specs), len(ranks), len(targets))
    model_table = {f: np.zeros(shape_m, dtype=np.int64) for f in MODEL_FIELDS}
    for (i, spec), (j, rank), (k, tgt) in itertools.product(enumerate(specs), enumerate(ranks), enumerate(targets)):
        for f, v in model_values(spec, rank, tgt).items():
            model_table[f][i, j, k] = int(v)
    return model_table


def _cluster_table(gpu_texts: list[str], nodes: list, counts: list[int],
                   link_options: dict[str, Any]) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """Cluster, link-rate and compute-rate columns of every (GPU, nodes, GPU count) cell, the GPU
    labels and the notes on cells that cannot be laid out (their rows are marked not valid)."""
    shape_c = (len(gpu_texts), len(nodes), len(counts))
    table = {f: np.zeros(shape_c, dtype=np.int64) for f in CLUSTER_FIELDS + ("nodes", "cluster_ok", "has_bf16")}
    table.update({f: np.zeros(shape_c, dtype=np.float64) for f in RATE_FIELDS + COMPUTE_FIELDS})
    table[PEAK_FIELD] = np.zeros(shape_c + (len(st.PRECISIONS),), dtype=np.float64)
    table["gpu_family"] = np.full(shape_c, "", dtype=object)  # the tokens/s band's (verdict.throughput_band)
    gpu_labels = list(gpu_texts)
    notes = []
    for (i, gpu), (j, n_nodes), (k, count) in itertools.product(enumerate(gpu_texts), enumerate(nodes), enumerate(counts)):
        cluster, why = _cluster_for(gpu, count, n_nodes, **link_options)
        ok = cluster is not None
        if not ok:  # laid out on one node so the formulas still run; the row is marked not valid
            notes.append(f"{count}x{gpu}" + (f" on {n_nodes} nodes" if n_nodes else "") + f": {why}")
            cluster = parse_gpus(f"1x{count}x{gpu}", **link_options)
        gpu_labels[i] = gpu if cluster.capacity_only else cluster.gpu.name
        if not cluster.gpu.has_bf16 and j == k == 0:
            notes.append(f"{gpu}: no bf16 tensor cores; its bf16 rows are marked not valid (hardware.check_precision)")
        _fill_cell(table, (i, j, k), cluster, ok)
    table["cluster_ok"] = table["cluster_ok"].astype(bool)
    table["has_bf16"] = table["has_bf16"].astype(bool)
    return table, gpu_labels, notes


def _fill_cell(table: dict[str, np.ndarray], cell: tuple[int, int, int], cluster: Cluster, ok: bool) -> None:
    """One cluster cell's columns: its values, whether it was laid out, bf16, link and compute rates."""
    for f, v in cluster_values(cluster).items():
        table[f][cell] = v
    table["nodes"][cell] = cluster.nodes
    table["cluster_ok"][cell] = ok
    table["has_bf16"][cell] = cluster.gpu.has_bf16  # V100/T4: bf16 rows are not valid
    table["gpu_family"][cell] = gpu_family(cluster.gpu.name)
    rates = comm.link_rates(cluster)
    for f in RATE_FIELDS:
        table[f][cell] = float(getattr(rates, f))
    compute = throughput.compute_rates(cluster, window_factor=time_calibration.window_factor())  # as fit answers
    for f in COMPUTE_FIELDS:
        table[f][cell] = float(getattr(compute, f))
    table[PEAK_FIELD][cell] = getattr(compute, PEAK_FIELD)


def _dedupe_labels(labels: list[str]) -> list[str]:
    """Two spellings of one GPU ('h100' and 'h100-sxm') keep distinct category names."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out
