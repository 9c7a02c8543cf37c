"""The α-β collective model held against published nccl-tests lines
(``tests/data/published_runs/collectives.csv``, a copy of the development set's table with its
provenance columns).

Each usable row (an all-gather, reduce-scatter or all-reduce with a message size and a bus
bandwidth) is mapped to the link profiles of its fabric (``FABRICS``, keyed by the row's own
``interconnect`` text) and predicted with ``comm.ring_collective_time_s`` — the same function
the step time uses — as one call of S bytes on a ring of ``n_gpus`` ranks. The predicted bus
bandwidth is f(n)·S / t (nccl-tests ``doc/PERFORMANCE.md``).

Size regime, from the measured bus bandwidth against what the group's ring can reach (so that no
change to the latency or protocol model moves a row between regimes; only what a ring of that
group can carry does): *latency-bound* where it is under half the ring's achievable bus bandwidth
(``ring_bus_bytes_per_s``: the start-up cost is more than the transfer), *bandwidth-bound* otherwise.

What the harness adds (``harness_time_s``). nccl-tests (``src/common.cu`` ``BenchTime``, tag
v2.17.9 = 2535da8) launches its ``iters`` iterations back to back and stops the clock after one
stream synchronisation, so a line's time per call is max(host issue, NCCL's GPU time); with ``-z 1``
each iteration is synchronised, so it is their sum. One thread issues the calls of all ``-g`` GPUs
it drives, one after another, so the host issue grows with ``-g`` ("the CUDA latency overheads of
single process jobs", NVIDIA's AddyLaddy in NVIDIA/nccl-tests issue #333). Other harnesses (torch
``all_reduce_bench.py``: CUDA events around one call after a barrier, so the torch dispatch and the
rank skew are inside the time) get a per-tier host floor fitted leave-one-source-out on what
every harness's lines leave unexplained; nccl-tests lines get none.

Rows NCCL runs with in-network reduction (NVLS, CollNet/SHARP) are reported apart: the model
prices a ring or a tree. A line that states Ring ran (a per-algorithm job, ``NCCL_NVLS_ENABLE=0``)
is priced as a ring; the others at NCCL's own choice, Tree included for an all-reduce. Rows whose
fabric has no profile are listed with the reason (``skipped``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardplan.formulas.comm import OPS, LinkRates, nccl_hops, ring_bus_bytes_per_s, ring_collective_time_s, ring_factor
from shardplan.inputs.hardware import get_link
from shardplan.support.quantiles import quantile

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_runs" / "collectives.csv"

# interconnect text (verbatim from the table) -> (intra-node link, inter-node link, NICs per node)
FABRICS = {
    "NVLink4/NVSwitch (single HGX node)": ("nvlink4", None, 0),
    "NVLink4/NVSwitch": ("nvlink4", None, 0),
    "NVLink5/NVSwitch": ("nvlink5", None, 0),
    "NVLink5 intra-node": ("nvlink5", None, 0),
    "NVLink5 intra-node; NDR 400 Gb/s InfiniBand, 8 ConnectX-7 HCAs per node": ("nvlink5", "ib-ndr", 8),
    "NVLink5 intra-node; NDR 400 Gb/s InfiniBand, 8 compute rails per node": ("nvlink5", "ib-ndr", 8),
    # AWS EFA v4 is an Ethernet-based fabric: the 400 Gb/s Ethernet profile stands in (ASSUMPTION)
    "NVLink5 intra-node + 8x 400 Gb/s EFA v4 per node (50 GB/s per GPU)": ("nvlink5", "eth-400g", 8),
    # GPUDirect-TCPXO, 8 x 200 Gb/s per node (the row's own note: inferred, unverified)
    ("inter-node: GCP A3 Mega per repo name (GPUDirect-TCPXO, 8x200 Gbps/node per ml-engineering table)"
     " - not stated in file"): ("nvlink4", "eth-200g", 8),
    "NVLink3 intra-node; 4x HDR InfiniBand (200 Gb/s) per node": ("nvlink3", "ib-hdr", 4),
    ("PCIe (4 GPUs; P2P likely enabled via tinygrad patched open kernel modules - thread context, not"
     " confirmed)"): ("pcie4", None, 0),
    "AMD Infinity Fabric (xGMI) full mesh, 64 GB/s per peer per direction": ("infinity-fabric", None, 0),
}
IN_NETWORK = ("nvls", "collnet")
NCCL_TESTS_ONLY = "all, nccl-tests harness"
LATENCY_BOUND_SHARE = 0.5

# Host issue time of one NCCL call per GPU a thread drives: NVIDIA/nccl-tests issue #123
# (2022-12-14, DGX-A100, ``all_reduce_perf -b 8 -e 128 -g N`` with NCCL_ALGO=Ring,
# NCCL_MAX_NCHANNELS=1): 10.0 … 33.7 µs for N = 2 … 8 GPUs in one process, where NCCL's own Ring/LL
# latency (tuning.cc) is 7.8 … 15 µs. Least squares through the origin of t = N·c gives c = 4.24 µs.
# Not fitted on the table. ASSUMPTION: the A100 host's issue cost holds for the H100/B200 hosts.
ISSUE_123_GPUS = (2, 3, 4, 5, 6, 7, 8)
ISSUE_123_TIME_S = (10.0e-6, 13.76e-6, 16.88e-6, 20.8e-6, 25.2e-6, 29.5e-6, 33.7e-6)


def issue_s_per_gpu() -> float:
    """c of host issue = g·c (least squares through the origin on issue #123's table)."""
    n, t = np.asarray(ISSUE_123_GPUS, dtype=np.float64), np.asarray(ISSUE_123_TIME_S)
    return float((n * t).sum() / (n * n).sum())


@dataclass(frozen=True)
class CollectiveRow:
    row_id: str
    source: str
    op: str
    n: int
    nodes: int
    per_node: int
    size_bytes: float
    busbw_bytes_per_s: float
    fabric: tuple
    in_network: bool
    harness: str = "other"  # "nccl-tests", "nccl-tests-blocking" (-z 1), "torch", "other"
    gpus_per_thread: int = 1  # nccl-tests -g
    forced_ring: bool = False  # the line states Ring ran (not NCCL's free choice): no Tree


def _harness(tool: str) -> tuple[str, int]:
    """(harness, GPUs one thread drives) from the row's ``tool`` text."""
    if "all_reduce_bench" in tool:
        return "torch", 1
    if "nccl-tests" not in tool:
        return "other", 1
    g = re.search(r"-g (\d+)", tool)
    return ("nccl-tests-blocking" if "-z 1" in tool else "nccl-tests"), int(g.group(1)) if g else 1


def _forced_ring(algo: str) -> bool:
    """The line states that Ring ran (forced, or reported by NCCL); 'ring (file name; NCCL default
    selection)' only names the output file, so NCCL chose freely."""
    text = algo.lower()
    return text.startswith("ring") and "default selection" not in text


def _usable(row: dict) -> str:
    """Why a row cannot be predicted ('' when it can)."""
    if row["op"] not in OPS:
        return f"op {row['op']!r} is not a collective the model prices"
    if not row["bytes"] or not row["busbw_gbps"]:
        return "no message size or bus bandwidth"
    if int(row["n_gpus"]) < 2:
        return "one rank"
    if float(row["busbw_gbps"]) == 0 and not row["time_us"]:
        return "bus bandwidth rounded to 0 and no time"
    if row["interconnect"] not in FABRICS:
        return f"no link profile for {row['interconnect']!r}"
    return ""


def _measured_busbw(row: dict) -> float:
    """Bus bandwidth in bytes/s: from the time where the line gives one (the quoted bus bandwidth has
    two decimals, 0.00 GB/s at the smallest sizes), else the quoted value."""
    if row["time_us"]:
        return float(ring_factor(row["op"], int(row["n_gpus"]))) * float(row["bytes"]) / (float(row["time_us"]) * 1e-6)
    return float(row["busbw_gbps"]) * 1e9


def load_rows(path: Path = DATA) -> tuple[list[CollectiveRow], dict[str, str]]:
    """(predictable rows, {row_id: why skipped})."""
    rows, skipped = [], {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            why = _usable(r)
            if why:
                skipped[r["row_id"]] = why
                continue
            rows.append(CollectiveRow(
                r["row_id"], r["source"], r["op"], int(r["n_gpus"]), int(r["n_nodes"]), int(r["gpus_per_node"]),
                float(r["bytes"]), _measured_busbw(r), FABRICS[r["interconnect"]],
                any(k in r["algo"].lower() for k in IN_NETWORK), *_harness(r["tool"]), _forced_ring(r["algo"])))
    return rows, skipped


def fabric_rates(fabric: tuple, launch_s: float = 0.0) -> LinkRates:
    """Nameplate link rates of a fabric (intra link, inter link or None, NICs per node)."""
    intra_name, inter_name, nics = fabric
    intra = get_link(intra_name)
    inter = get_link(inter_name) if inter_name else get_link("ib-ndr")  # unused inside one node
    return LinkRates(intra_alpha_s=np.asarray(intra.latency_s), intra_bus_bytes_per_s=np.asarray(intra.achievable_bytes_per_s),
                     inter_alpha_s=np.asarray(inter.latency_s), inter_nic_bytes_per_s=np.asarray(inter.achievable_bytes_per_s),
                     nics_per_node=np.asarray(max(nics, 1)), **nccl_hops(intra, inter))


def link_label(row: CollectiveRow) -> str:
    """The link class a row is reported under: the intra link, or intra + NICs × inter link."""
    intra, inter, nics = row.fabric
    return intra if row.nodes == 1 or inter is None else f"{intra}+{nics}x{inter}"


def predicted_busbw(row: CollectiveRow, launch_s: float = 0.0) -> float:
    """f(n)·S / t of the model's one call on the row's ring."""
    rates = fabric_rates(row.fabric)
    t = float(ring_collective_time_s(row.op, row.size_bytes, 1, row.n, row.per_node, rates,
                                     not row.forced_ring)) + launch_s
    return float(ring_factor(row.op, row.n)) * row.size_bytes / t


def regime(row: CollectiveRow) -> str:
    """latency-bound when the measured bus bandwidth is under half the ring's achievable one."""
    ring = float(ring_bus_bytes_per_s(row.n, row.per_node, fabric_rates(row.fabric)))
    return "latency" if row.busbw_bytes_per_s < LATENCY_BOUND_SHARE * ring else "bandwidth"


# --- the benchmark's per-call host floor, fitted leave-one-source-out --------------------------
def tier(row: CollectiveRow) -> str:
    return "inter_node" if row.nodes > 1 else "intra_node"


def model_time_s(row: CollectiveRow) -> float:
    """NCCL's time for the row's one call (``comm.ring_collective_time_s``)."""
    return float(ring_collective_time_s(row.op, row.size_bytes, 1, row.n, row.per_node, fabric_rates(row.fabric),
                                        not row.forced_ring))


def measured_time_s(row: CollectiveRow) -> float:
    return float(ring_factor(row.op, row.n)) * row.size_bytes / row.busbw_bytes_per_s


def harness_time_s(row: CollectiveRow, floor: dict[str, float]) -> float:
    """The row's time per call as its harness measures it (module docstring): nccl-tests
    max(g·c, GPU) or, blocking, g·c + GPU; torch's event-timed call c + GPU + the tier's fitted
    floor (the GPU idles after the barrier until the call is issued); any other GPU + floor."""
    gpu, issue = model_time_s(row), row.gpus_per_thread * issue_s_per_gpu()
    if row.harness == "nccl-tests":
        return max(issue, gpu)
    if row.harness == "nccl-tests-blocking":
        return issue + gpu
    return gpu + floor.get(tier(row), 0.0) + (issue if row.harness == "torch" else 0.0)


def fit_host_floor(rows: list[CollectiveRow]) -> dict[str, float]:
    """Per link tier: the median of (measured − harness model without a floor) over the
    latency-bound ring rows — what a benchmark adds per call beyond NCCL's latency model and the
    nccl-tests issue cost (torch dispatch, the network plugin). 0 for a tier without such rows."""
    out = {}
    for t in ("intra_node", "inter_node"):
        gaps = [measured_time_s(r) - harness_time_s(r, {}) for r in rows
                if tier(r) == t and not r.in_network and regime(r) == "latency"]
        out[t] = max(float(np.median(gaps)), 0.0) if gaps else 0.0
    return out


def errors(rows: list[CollectiveRow], loso: bool) -> dict[str, float]:
    """Predicted / measured bus bandwidth − 1 per row id: NCCL's model with the harness's issue
    cost (``loso`` False: no fitted floor) or with the floor fitted on every other source
    (``loso`` True)."""
    out = {}
    for source in sorted({r.source for r in rows}):
        floor = fit_host_floor([r for r in rows if r.source != source]) if loso else {}
        for r in (r for r in rows if r.source == source):
            out[r.row_id] = measured_time_s(r) / harness_time_s(r, floor) - 1
    return out


# --- the report ----------------------------------------------------------------------------------
def _stats(values) -> str:
    v = np.asarray(values, dtype=np.float64)
    return (f"{len(v)} | {np.median(np.abs(v)):.1%} | {np.median(v):+.1%} | {quantile(np.abs(v), 0.9):.1%}"
            if len(v) else "0 | – | – | –")


def summary(rows: list[CollectiveRow] | None = None) -> dict[tuple, dict[str, list[float]]]:
    """{(class, link): {"model": errors, "loso": errors}} with class latency / bandwidth / in-network,
    (class, "all") over every link and (class, ``NCCL_TESTS_ONLY``) over the lines an nccl-tests
    binary measured (the issue's criterion; torch's benchmark lines are the rest)."""
    if rows is None:
        rows = load_rows()[0]
    plain, loso = errors(rows, loso=False), errors(rows, loso=True)
    out: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        cls = "in-network (NVLS/SHARP)" if r.in_network else f"{regime(r)}-bound"
        keys = [(cls, "all"), (cls, link_label(r))] + ([(cls, NCCL_TESTS_ONLY)] if r.harness.startswith("nccl-tests") else [])
        for key in keys:
            slot = out.setdefault(key, {"model": [], "loso": []})
            slot["model"].append(plain[r.row_id])
            slot["loso"].append(loso[r.row_id])
    return out


def report_markdown() -> str:
    """The collectives section of docs/accuracy.md: per size regime and link, predicted vs measured
    bus bandwidth (n | median |error| | signed median | p90) for NCCL's model alone and with the
    per-call host floor fitted on the other sources."""
    rows, skipped = load_rows()
    floors = fit_host_floor(rows)
    lines = ["| regime | link | rows | median \\|e\\| | signed | p90 | out-of-source: median \\|e\\| | signed | p90 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (cls, link), e in sorted(summary(rows).items(), key=lambda kv: (kv[0][0], kv[0][1] != "all", kv[0][1])):
        model = _stats(e["model"]).split(" | ")
        loso = _stats(e["loso"]).split(" | ")[1:]
        lines.append(f"| {cls} | {link} | {' | '.join(model)} | {' | '.join(loso)} |")
    lines.append("")
    lines.append(f"{len(rows)} rows predicted, {len(skipped)} skipped ({', '.join(sorted(set(skipped.values())))}). "
                 f"Host floor fitted on all sources: intra-node {floors['intra_node'] * 1e6:.1f} µs, "
                 f"inter-node {floors['inter_node'] * 1e6:.1f} µs per call.")
    return "\n".join(lines)
