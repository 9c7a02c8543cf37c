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
v2.17.9 = 2535da8) synchronises, starts its clock, launches its ``iters`` iterations back to back
and stops the clock after one stream synchronisation, dividing by ``iters``: the iterations are
pipelined, but the clock also holds the pipeline's fill (the first collective cannot start before
its last rank is issued) and drain (the last one runs after its last rank is issued), so a line's
time per call is max(P, T) + min(P, T) / iters for host issue P and NCCL's GPU time T
(``pipelined_time_s``); with ``-z 1`` each iteration is synchronised, so it is P + T. One thread
issues the calls of all ``-g`` GPUs it drives, one after another, so the host issue grows with
``-g`` ("the CUDA latency overheads of single process jobs", NVIDIA's AddyLaddy in
NVIDIA/nccl-tests issue #333). torch's
``all_reduce_bench.py`` (stas00/ml-engineering ``network/benchmarks/all_reduce_bench.py`` at
744d01e, ``timed_allreduce``) calls ``dist.barrier()``, records a start event, calls
``dist.all_reduce`` and records an end event; the barrier's work blocks the CPU until the GPU is
done (torch ``ProcessGroupNCCL.cpp`` ``WorkNCCL::synchronize``: a barrier's work synchronises the
current stream), so the GPU idles from the start event until the Python call has gone through
torch's dispatch and ProcessGroupNCCL to NCCL's launch: host dispatch + NCCL's GPU time, the host
part priced as one eager operation (``eager_host.HOST_OP_S``, fitted on the single-GPU HF step
runs, no collective among them; ASSUMPTION: ProcessGroupNCCL's work object, events and NCCL's
enqueue cost the host what one aten operator's dispatch and launch do). Nothing here is fitted on
this table, so every error is out of source. Any other harness: NCCL's time alone.

A line's NCCL environment where its source states it (``FABRIC_PROTOCOLS``): Google's
GPUDirect-TCPXO profile runs NCCL_PROTO=Simple.

A one-node NVLS all-reduce line is priced with NCCL's own NVLS model (``comm.nvls_all_reduce_time_s``:
NVLS graph search and tuning.cc, efficiency by the line's NCCL version and GPU architecture) and
counted in its size regime. The other in-network lines (NVLS across nodes or for an all-gather /
reduce-scatter, CollNet/SHARP) are reported apart (``IN_NETWORK_UNPRICED``): the model prices them
as a ring or a tree; they are also counted, so priced, in the "incl. in-network" row of each
regime. A line that states Ring ran (a per-algorithm job, ``NCCL_NVLS_ENABLE=0``) is priced as a
ring; the others at NCCL's own choice, Tree included for an all-reduce. Rows whose
fabric has no profile are listed with the reason (``skipped``).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardplan.formulas.comm import (
    NCCL_NVLS_EFFICIENCY,
    NCCL_NVLS_EFFICIENCY_2_27,
    NCCL_PROTOCOLS,
    OPS,
    LinkRates,
    nccl_hops,
    nvls_all_reduce_time_s,
    ring_bus_bytes_per_s,
    ring_collective_time_s,
    ring_factor,
)
from shardplan.formulas.eager_host import HOST_OP_S
from shardplan.inputs.hardware import get_link
from shardplan.support.quantiles import quantile

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_runs" / "collectives.csv"

TCPXO = ("inter-node: GCP A3 Mega per repo name (GPUDirect-TCPXO, 8x200 Gbps/node per ml-engineering table)"
         " - not stated in file")
# interconnect text (verbatim from the table) -> (intra-node link, inter-node link, NICs per node)
FABRICS = {
    "NVLink4/NVSwitch (single HGX node)": ("nvlink4", None, 0),
    "NVLink4/NVSwitch": ("nvlink4", None, 0),
    "NVLink5/NVSwitch": ("nvlink5", None, 0),
    "NVLink5 intra-node": ("nvlink5", None, 0),
    "NVLink5 intra-node; NDR 400 Gb/s InfiniBand, 8 ConnectX-7 HCAs per node": ("nvlink5", "ib-ndr", 8),
    "NVLink5 intra-node; NDR 400 Gb/s InfiniBand, 8 compute rails per node": ("nvlink5", "ib-ndr", 8),
    # AWS EFA v4 with aws-ofi-nccl's P6-B200 platform latency (the efa-v4 profile)
    "NVLink5 intra-node + 8x 400 Gb/s EFA v4 per node (50 GB/s per GPU)": ("nvlink5", "efa-v4", 8),
    # GPUDirect-TCPXO, 8 x 200 Gb/s per node (the row's own note: inferred, unverified)
    TCPXO: ("nvlink4", "eth-200g", 8),
    "NVLink3 intra-node; 4x HDR InfiniBand (200 Gb/s) per node": ("nvlink3", "ib-hdr", 4),
    ("PCIe (4 GPUs; P2P likely enabled via tinygrad patched open kernel modules - thread context, not"
     " confirmed)"): ("pcie4", None, 0),
    "AMD Infinity Fabric (xGMI) full mesh, 64 GB/s per peer per direction": ("infinity-fabric", None, 0),
}
# The protocols a line's environment lets NCCL use (NCCL_PROTO), where its source states them. The
# A3 Mega line (lessizzmore/create-a3mega-ztan-fork README at 02dd8f4) passes every NCCL_* variable of
# the TCPXO plugin's ``nccl-env-profile.sh`` to mpirun; Google's A3 Mega environment sets
# NCCL_PROTO=Simple ("TCPX only supports Simple protocol": apple/axlearn
# ``axlearn/cloud/gcp/jobset_utils.py``, after AI-Hypercomputer/gpu-recipes) and a tuner whose
# 2-node, 8-rank rule runs every all-reduce as Tree/Simple (axlearn
# ``axlearn/cloud/gcp/nccl/a3_mega/tuner_config.txtpb`` at 4da5d0ec, "Default A3+ tuning
# configuration") — NCCL's own model picks Tree there too once Simple is the only protocol.
FABRIC_PROTOCOLS = {TCPXO: ("simple",)}
IN_NETWORK = ("nvls", "collnet")  # the algo column's leading word; 'ring (NCCL_NVLS_ENABLE=0)' is a ring
# A line without its NCCL version (the ml-engineering 'SHARP' GPU-count sweep) is taken to have run
# the version its section's other lines state, 2.27.7 (ASSUMPTION).
NCCL_VERSION_UNSTATED = (2, 27)
# A quoted bus bandwidth (no time given) rounded so coarsely that half a unit of its last digit is
# more than the issue's 10 % criterion cannot be held to it (0.01 GB/s is ±50 %).
ROUNDING_LIMIT = 0.10
NCCL_TESTS_ONLY = "all, nccl-tests harness"
NCCL_TESTS_INCL_IN_NETWORK = "all, nccl-tests harness, incl. in-network"
IN_NETWORK_UNPRICED = "in-network, not priced (NVLS multi-node / all-gather, CollNet)"
LATENCY_BOUND_SHARE = 0.5

# Host issue time of one NCCL call per GPU a thread drives: NVIDIA/nccl-tests issue #123
# (2022-12-14, DGX-A100, ``all_reduce_perf -b 8 -e 128 -g N`` with NCCL_ALGO=Ring,
# NCCL_MAX_NCHANNELS=1): 10.0 … 33.7 µs for N = 2 … 8 GPUs in one process, where NCCL's own Ring/LL
# latency (tuning.cc) is 7.8 … 15 µs. Least squares through the origin of t = N·c gives c = 4.24 µs.
# Not fitted on the table. ASSUMPTION: the A100 host's issue cost holds for the H100/B200 hosts.
# (The issue's -n 100 puts its drain, T/100 < 0.2 µs, inside t: under 1 %, left in c.)
ISSUE_123_GPUS = (2, 3, 4, 5, 6, 7, 8)
ISSUE_123_TIME_S = (10.0e-6, 13.76e-6, 16.88e-6, 20.8e-6, 25.2e-6, 29.5e-6, 33.7e-6)


# nccl-tests' timed iterations when the line does not state them (``-n``): ``int iters = 20;`` in
# ``src/common.cu`` at v2.17.9 (2535da8).
NCCL_TESTS_ITERS = 20


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
    protocols: tuple = NCCL_PROTOCOLS  # NCCL_PROTO of the line's environment (``FABRIC_PROTOCOLS``)
    iters: int = NCCL_TESTS_ITERS  # nccl-tests -n: timed iterations per line
    nvls_efficiency: float = 0.0  # > 0: NCCL ran (and its model prices) a one-node NVLS all-reduce


def _harness(tool: str) -> tuple[str, int]:
    """(harness, GPUs one thread drives) from the row's ``tool`` text."""
    if "all_reduce_bench" in tool:
        return "torch", 1
    if "nccl-tests" not in tool:
        return "other", 1
    g = re.search(r"-g (\d+)", tool)
    return ("nccl-tests-blocking" if "-z 1" in tool else "nccl-tests"), int(g.group(1)) if g else 1


def _iters(tool: str) -> int:
    """nccl-tests' timed iterations from the row's ``tool`` text ('-n N' or 'N iters'; default 20)."""
    n = re.search(r"-n (\d+)|(\d+) iters", tool)
    return int(n.group(1) or n.group(2)) if n else NCCL_TESTS_ITERS


def _forced_ring(algo: str) -> bool:
    """The line states that Ring ran (forced, or reported by NCCL); 'ring (file name; NCCL default
    selection)' only names the output file, so NCCL chose freely."""
    text = algo.lower()
    return text.startswith("ring") and "default selection" not in text


def _in_network(algo: str) -> bool:
    return algo.lower().startswith(IN_NETWORK)


def _nvls_efficiency(row: dict) -> float:
    """NCCL's NVLS efficiency for a one-node NVLS all-reduce line (``comm.NCCL_NVLS_EFFICIENCY``: 5/6
    up to v2.27, per architecture from v2.28.3), 0 for any other line."""
    if not (row["algo"].lower().startswith("nvls") and row["op"] == "all_reduce" and row["n_nodes"] == "1"):
        return 0.0
    v = re.search(r"NCCL (\d+)\.(\d+)", row["tool"])
    version = (int(v.group(1)), int(v.group(2))) if v else NCCL_VERSION_UNSTATED
    arch = "blackwell" if row["gpu"].lstrip("G").startswith("B") else "hopper"
    return NCCL_NVLS_EFFICIENCY_2_27 if version < (2, 28) else NCCL_NVLS_EFFICIENCY[arch]


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
    if not row["time_us"] and _rounding_share(row["busbw_gbps"]) > ROUNDING_LIMIT:
        return f"bus bandwidth {row['busbw_gbps']} GB/s rounded beyond ±{ROUNDING_LIMIT:.0%} and no time"
    if row["interconnect"] not in FABRICS:
        return f"no link profile for {row['interconnect']!r}"
    return ""


def _rounding_share(quoted: str) -> float:
    """Half a unit of the quoted value's last digit, relative to the value."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return 0.5 * 10.0 ** -decimals / float(quoted)


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
                _in_network(r["algo"]), *_harness(r["tool"]), _forced_ring(r["algo"]),
                FABRIC_PROTOCOLS.get(r["interconnect"], NCCL_PROTOCOLS), _iters(r["tool"]), _nvls_efficiency(r)))
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


def predicted_busbw(row: CollectiveRow) -> float:
    """f(n)·S / t of the model's one call on the row's ring, as its harness times it."""
    return float(ring_factor(row.op, row.n)) * row.size_bytes / harness_time_s(row)


def regime(row: CollectiveRow) -> str:
    """latency-bound when the measured bus bandwidth is under half the ring's achievable one."""
    ring = float(ring_bus_bytes_per_s(row.n, row.per_node, fabric_rates(row.fabric)))
    return "latency" if row.busbw_bytes_per_s < LATENCY_BOUND_SHARE * ring else "bandwidth"


# --- what the harness times ----------------------------------------------------------------------
def model_time_s(row: CollectiveRow) -> float:
    """NCCL's time for the row's one call in the line's environment: its one-node NVLS all-reduce
    (``comm.nvls_all_reduce_time_s`` on the ring's bus bandwidth), else ``comm.ring_collective_time_s``."""
    if row.nvls_efficiency:
        bus = ring_bus_bytes_per_s(row.n, row.per_node, fabric_rates(row.fabric))
        return float(nvls_all_reduce_time_s(row.size_bytes, row.n, bus, row.nvls_efficiency))
    return float(ring_collective_time_s(row.op, row.size_bytes, 1, row.n, row.per_node, fabric_rates(row.fabric),
                                        not row.forced_ring, row.protocols))


def measured_time_s(row: CollectiveRow) -> float:
    return float(ring_factor(row.op, row.n)) * row.size_bytes / row.busbw_bytes_per_s


def pipelined_time_s(issue_s: float, gpu_s: float, iters: int) -> float:
    """Time per iteration of ``iters`` pipelined iterations timed from the first issue to the last
    completion (nccl-tests ``BenchTime``): iteration k's last rank is issued at (k+1)·P and the
    GPU runs one collective at a time, so the last completes at max over k of (k+1)·P +
    (iters−k)·T = (iters−1)·max(P, T) + P + T. The drain is one whole collective: NCCL prepares
    every communicator's plan of a group first and launches their kernels together in one round
    (``src/group.cc`` ``doLaunches`` at v2.26.2-1), so the last iteration's ranks start together
    near the end of its issue (ASSUMPTION: the host work after that launch round is small against
    T). iters = 1 is the blocking P + T; many iterations tend to max(P, T)."""
    return max(issue_s, gpu_s) + min(issue_s, gpu_s) / iters


def harness_time_s(row: CollectiveRow) -> float:
    """The row's time per call as its harness measures it (module docstring): nccl-tests
    max(g·c, GPU) + min(g·c, GPU) / iters or, blocking, g·c + GPU; torch's event-timed call after
    a barrier: one eager operation's host dispatch + GPU; any other: GPU."""
    gpu, issue = model_time_s(row), row.gpus_per_thread * issue_s_per_gpu()
    if row.harness == "nccl-tests":
        return pipelined_time_s(issue, gpu, row.iters)
    if row.harness == "nccl-tests-blocking":
        return issue + gpu
    return gpu + (HOST_OP_S if row.harness == "torch" else 0.0)


def errors(rows: list[CollectiveRow]) -> dict[str, float]:
    """Predicted / measured bus bandwidth − 1 per row id (nothing fitted on the table: out of source)."""
    return {r.row_id: measured_time_s(r) / harness_time_s(r) - 1 for r in rows}


# --- the report ----------------------------------------------------------------------------------
def _stats(values) -> str:
    v = np.asarray(values, dtype=np.float64)
    return (f"{len(v)} | {np.median(np.abs(v)):.1%} | {np.median(v):+.1%} | {quantile(np.abs(v), 0.9):.1%}"
            if len(v) else "0 | – | – | –")


def priced(row: CollectiveRow) -> bool:
    """The model prices what NCCL ran: not an in-network line, or a one-node NVLS all-reduce."""
    return not row.in_network or row.nvls_efficiency > 0


def summary(rows: list[CollectiveRow] | None = None) -> dict[tuple, list[float]]:
    """{(class, link): errors} with class latency / bandwidth over the lines the model prices as NCCL
    ran them (``priced``) and ``IN_NETWORK_UNPRICED`` over the rest (priced as a ring or tree), (class,
    "all") over every link, (class, ``NCCL_TESTS_ONLY``) over the lines an nccl-tests binary measured
    (the issue's criterion; torch's benchmark lines are the rest) and (regime,
    ``NCCL_TESTS_INCL_IN_NETWORK``) over every nccl-tests line, the unpriced in-network ones too."""
    if rows is None:
        rows = load_rows()[0]
    e = errors(rows)
    out: dict[tuple, list[float]] = {}
    for r in rows:
        cls = f"{regime(r)}-bound" if priced(r) else IN_NETWORK_UNPRICED
        nccl_tests = r.harness.startswith("nccl-tests")
        keys = [(cls, "all"), (cls, link_label(r))] + ([(cls, NCCL_TESTS_ONLY)] if nccl_tests else [])
        keys += [(f"{regime(r)}-bound", NCCL_TESTS_INCL_IN_NETWORK)] if nccl_tests else []
        for key in keys:
            out.setdefault(key, []).append(e[r.row_id])
    return out


def report_markdown() -> str:
    """The collectives section of docs/accuracy.md: per size regime and link, predicted vs measured
    bus bandwidth (n | median |error| | signed median | p90), NCCL's model with each harness's
    host cost; nothing fitted on the table."""
    rows, skipped = load_rows()
    lines = ["| regime | link | rows | median \\|e\\| | signed | p90 |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for (cls, link), e in sorted(summary(rows).items(), key=lambda kv: (kv[0][0], kv[0][1] != "all", kv[0][1])):
        lines.append(f"| {cls} | {link} | {_stats(e)} |")
    lines.append("")
    lines.append(f"{len(rows)} rows predicted, {len(skipped)} skipped ({', '.join(sorted(set(skipped.values())))}). "
                 f"Host cost of a torch collective call: one eager operation, {HOST_OP_S * 1e6:.1f} µs "
                 f"(`eager_host.HOST_OP_S`, fitted on the single-GPU HF step runs); nccl-tests issue "
                 f"{issue_s_per_gpu() * 1e6:.2f} µs per GPU a thread drives (NVIDIA/nccl-tests issue #123), "
                 f"its timed iterations pipelined with their fill and drain (`pipelined_time_s`).")
    return "\n".join(lines)
