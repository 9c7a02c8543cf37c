"""Communication per training step: bytes, calls and α-β time of every collective, per GPU.

Conventions (nccl-tests ``doc/PERFORMANCE.md``): ``S`` is the full message (all-gather output,
reduce-scatter input, all-reduce tensor). In a ring of ``n`` ranks each rank sends
``(n−1)/n·S`` bytes for all-gather / reduce-scatter and ``2(n−1)/n·S`` for all-reduce; that
factor turns algorithm bandwidth (``S/t``) into bus bandwidth, which is what a link sustains.
"Bytes each GPU moves" below are always ``f(n)·S`` (that bus-bandwidth factor times the message).

Per strategy (ZeRO paper, SC'20, §7 "communication analysis"; FSDP notes; DeepSpeed):

* ``ddp`` / ``no_shard``: all-reduce of the gradients (2Ψ elements moved per GPU).
* ``full_shard`` / ZeRO-3: all-gather in forward + all-gather in backward + reduce-scatter of
  gradients (3Ψ, i.e. 1.5× DDP in elements). FSDP keeps the root unit (embeddings, final norm,
  lm_head) unsharded from forward to backward, so its backward all-gather is skipped.
* ``shard_grad_op`` (FSDP) / ``hybrid_shard_zero2``: forward all-gather + reduce-scatter (2Ψ, 1×).
* DeepSpeed ZeRO-1/2 (and DeepSpeed's ``shard_grad_op`` = stage 2): reduce-scatter of gradients,
  then all-gather of the updated 16-bit parameters after the optimizer step (2Ψ).
* ``hybrid_shard``: the above inside a shard group of ``g`` ranks, then an all-reduce of each
  rank's ``Ψ/g`` gradient shard across the ``r = n/g`` replicas (second link tier).

Gradient accumulation: gradients are synchronised every micro-batch (FSDP/DeepSpeed default), or
once per step under ``no_sync`` / ``set_requires_gradient_sync(False)``, which keeps the
*unsharded* gradients of the whole model until the last micro-batch — ``no_sync_grad_bytes``.
LoRA/QLoRA: only adapter gradients are reduced, but a sharded frozen base is still gathered.

Every function broadcasts over numpy arrays (a ``Columns`` ``c``); no Python ``if`` on values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from shardplan.formulas.activations import compute_dtype_bytes
from shardplan.formulas.buffers import bucket_bytes, reduce_dtype_bytes, unsharded_block_bytes_per_param
from shardplan.formulas.model_states import trainable_params
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st
from shardplan.inputs.engines import per_engine, per_strategy
from shardplan.support.errors import ShardplanError

OPS = ("all_gather", "reduce_scatter", "all_reduce")
COLLECTIVES = ("ag_fwd", "ag_bwd", "rs_grad", "ar_grad", "ar_replica", "ag_post_step")

# NCCL src/graph/tuning.cc (2.2x) cost model: base latency of a Ring/LL collective, 6.6 µs. The
# link profiles' α are that base plus 7 ring hops (an 8-rank ring); the per-hop part is rescaled
# with the ring length here.
NCCL_BASE_LATENCY_S = 6.6e-6
PROFILE_RING_STEPS = 7
# What NCCL picks per call: NVIDIA/nccl src/graph/tuning.cc, tag v2.26.2-1 (the version of the
# committed H100 nccl-tests lines; the tables are unchanged in v2.27.7-1), ``ncclTopoTuneModel`` and
# ``ncclTopoGetAlgoTime``. For every algorithm (Ring; Tree for all-reduce) and protocol (LL, LL128,
# Simple): time = latency + S / algbw, and the fastest runs.
#   Ring latency = baseLat + intra steps · max(hwLat(intra), netOverhead) + inter-node steps · hwLat(NET)
#   (a ring with one GPU per node takes the Tree's NET latency). baseLat Ring (µs): LL 6.6, LL128 14.0,
#   Simple 8.4; hwLat Ring (LL / LL128 / Simple): NVLink .6 / 1.9 / 3.4, PCI 1.0 / 2.5 / 5.7, NET 2.7 /
#   4.0 / 14.0. netOverhead (rings spanning nodes only) = 1 µs per step on an Intel x86 host, ×3 for
#   Simple (ASSUMPTION: Intel hosts; AMD hosts have 2 µs). A multi-node Simple all-reduce ring's latency
#   is ×1.4 ("plateau effect of ring"; ASSUMPTION: the message is over 64 B per channel and rank,
#   true wherever Simple wins). The LL hop of each tier is the profile's (α − 6.6 µs)/7 (its α is
#   NCCL's 8-rank ring); the LL128 and Simple hops come from the link's kind (``NCCL_RING_HOPS_S``;
#   ASSUMPTION: AMD xGMI priced as NVLink, RCCL's own table not used).
#   A net plugin's reported latency (``ncclNetProperties.latency``: aws-ofi-nccl's per-platform value;
#   NCCL's IB and socket transports report 0) is added to every inter-node hop, twice for Simple (the
#   flush): tuning.cc (since v2.12.7-1; v2.27.7-1) ``interLat += graphs[a]->latencyInter``, the graph's value being the
#   NIC's (search.cc ``graph->latencyInter = net->net.latency``); LinkRates ``inter_net_latency_s``.
#   Ring bus bandwidth per protocol: LL min(llMaxBw, 0.5·B) with llMaxBw the intra link's
#   ``nccl_ll_max_bytes_per_s`` in one node (by GPU generation) and 39.0 / 20.4 GB/s across 2 / more
#   nodes (Intel host row of llMaxBws); LL128 0.92·B; Simple B. LL128 runs inside a node where the
#   ranks talk over NVLink (tuning.cc: typeIntra ≤ NVB). Across nodes tuning.cc also needs the NIC
#   within PXB of the GPU (PXN from Hopper on), a PCIe placement no input states; ASSUMPTION: off
#   across nodes (on, the development set's tokens/s median goes 7.4 → 7.7 %, 22 of 33 multi-node
#   runs worse; docs/accuracy.md "Collectives").
#   Tree (all-reduce): latency = baseLat + 2·((ppn − 1)·hwLat(intra) + log2(nodes)·hwLat(NET)), baseLat
#   Tree 6.8 / 14.0 / 8.4, hwLat Tree NVLink .6 / 1.25 / 4.0, PCI 1.0 / 1.9 / 4.0, NET 5.0 / 8.5 / 14;
#   bus bandwidth 0.92·B, LL min(that/3.8, llMaxBw), LL128 that·7/9 (one node) or ·120/128, Simple
#   that; algbw = bus/2, times ``treeCorrectionFactor`` by protocol and log2(S/64). The per-channel
#   caps (nChannels · 36.7-38.7 GB/s on Hopper) never bind at the profiles' channel counts and are
#   left out; ASSUMPTION: the balanced tree (no ×0.85 of the plain-tree pattern); B is the ring's
#   achievable bus bandwidth (``ring_bus_bytes_per_s``).
NCCL_RING_BASE_S = {"ll": 6.6e-6, "ll128": 14.0e-6, "simple": 8.4e-6}
NCCL_RING_HOPS_S = {"nvlink": (0.6e-6, 1.9e-6, 3.4e-6), "pcie": (1.0e-6, 2.5e-6, 5.7e-6),
                    "net": (2.7e-6, 4.0e-6, 14.0e-6)}
NCCL_TREE_BASE_S = {"ll": 6.8e-6, "ll128": 14.0e-6, "simple": 8.4e-6}
NCCL_TREE_HOPS_S = {"nvlink": (0.6e-6, 1.25e-6, 4.0e-6), "pcie": (1.0e-6, 1.9e-6, 4.0e-6),
                    "net": (5.0e-6, 8.5e-6, 14.0e-6)}
NCCL_HW_OF_KIND = {"nvlink": "nvlink", "infinity_fabric": "nvlink", "pcie": "pcie",
                   "infiniband": "net", "ethernet": "net", "roce": "net"}
NCCL_LL128_BW = 0.92
# NCCL_PROTO: the protocols a job lets NCCL pick from (all by default); a line's environment may
# narrow it (GPUDirect-TCPXO runs Simple only, ``validation.collectives.FABRIC_PROTOCOLS``)
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
TREE_HOP_FIELDS = ("intra_tree_ll_hop_s", "intra_tree_ll128_hop_s", "intra_tree_simple_hop_s")  # LinkRates'
NCCL_NET_OVERHEAD_S = 1.0e-6
NCCL_LL_MAX_MULTI_NODE = (39.0e9, 20.4e9)  # llMaxBws, Intel host: 2 nodes, more than 2
NCCL_SIMPLE_PLATEAU = 1.4
NCCL_TREE_BW = 0.92
NCCL_TREE_LL_DIV = 3.8
# treeCorrectionFactor[protocol][log2(S/64)], 64 B … 256 MiB; 1 outside that range
NCCL_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9))


# --- nccl-tests conventions -----------------------------------------------------------------
def ring_factor(op: str, n):
    """f(n): bytes each rank moves per byte of S (nccl-tests ``doc/PERFORMANCE.md``)."""
    n = np.asarray(n, dtype=np.float64)
    if op in ("all_gather", "reduce_scatter"):
        return np.where(n > 1, (n - 1) / np.maximum(n, 1), 0.0)
    if op == "all_reduce":
        return np.where(n > 1, 2 * (n - 1) / np.maximum(n, 1), 0.0)
    raise ShardplanError("op", op, f"expected one of {', '.join(OPS)}")


def algbw_to_busbw(algbw_bytes_per_s, op: str, n):
    """busbw = algbw · f(n) (nccl-tests ``doc/PERFORMANCE.md``, "Bus bandwidth")."""
    return np.asarray(algbw_bytes_per_s, dtype=np.float64) * ring_factor(op, n)


def busbw_to_algbw(busbw_bytes_per_s, op: str, n):
    """Inverse of ``algbw_to_busbw`` (undefined for n = 1: returns inf, nothing moves)."""
    f = ring_factor(op, n)
    with np.errstate(divide="ignore"):
        return np.where(f > 0, np.asarray(busbw_bytes_per_s, dtype=np.float64) / np.where(f > 0, f, 1), np.inf)


def ring_steps(op: str, n):
    """Sequential steps of a ring: n−1 for all-gather/reduce-scatter, 2(n−1) for all-reduce."""
    n = np.asarray(n, dtype=np.float64)
    return np.maximum(n - 1, 0) * (2 if op == "all_reduce" else 1)


def collective_latency_s(op: str, n, profile_alpha_s):
    """α(n) = base + steps(n)·hop, hop = (α_profile − base)/7 (NCCL tuning.cc Ring/LL model).

    ASSUMPTION: a calibrated α is treated like a profile α measured on an 8-rank ring.
    """
    hop = np.maximum(np.asarray(profile_alpha_s, dtype=np.float64) - NCCL_BASE_LATENCY_S, 0) / PROFILE_RING_STEPS
    return np.where(np.asarray(n) > 1, NCCL_BASE_LATENCY_S + ring_steps(op, n) * hop, 0.0)


def collective_time_s(op: str, size_bytes, n, alpha_s, bus_bytes_per_s, calls=1, alpha_measured=False):
    """α-β time of ``calls`` collectives moving ``size_bytes`` (S, summed over the calls) in total:
    calls·α(n) + f(n)·S / B_bus. Zero for a group of one rank.

    ``alpha_measured`` (broadcastable bool): α is a calibrated fit's, used as fitted (no ring-length
    rescaling; ASSUMPTION: the α measured on the calibration's ring holds for the tier's other ring
    lengths); otherwise α is a profile's 8-rank-ring α, rescaled by ``collective_latency_s``."""
    f = ring_factor(op, n)
    alpha = np.where(np.asarray(alpha_measured) & (np.asarray(n) > 1), np.asarray(alpha_s, dtype=np.float64),
                     collective_latency_s(op, n, alpha_s))
    return calls * alpha + f * np.asarray(size_bytes, dtype=np.float64) / bus_bytes_per_s


# --- link coefficients ------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkTable:
    """One calibrated (tier, op): the fitted α and bus bandwidth B of each size regime (segment),
    as ``calibrate.collectives.fit_link`` fitted them on ``world_size`` ranks. A message of S bytes
    per call falls in the last segment whose lower bound is ≤ S (the first segment also takes
    smaller messages), as ``LinkFit.predict_s`` evaluates the fit."""

    min_bytes: np.ndarray
    alpha_s: np.ndarray
    bus_bytes_per_s: np.ndarray
    world_size: int

    @classmethod
    def from_fit(cls, fit) -> "LinkTable":
        segs = list(fit.segments)
        return cls(np.array([0] + [s.min_bytes for s in segs[1:]], dtype=np.float64),
                   np.array([s.alpha_s for s in segs], dtype=np.float64),
                   # a latency-bound segment (B null, t = α) moves bytes in no time: S / inf = 0
                   np.array([np.inf if s.bandwidth_bytes_per_s is None else s.bandwidth_bytes_per_s for s in segs],
                            dtype=np.float64), int(fit.world_size))

    def at(self, message_bytes):
        """(α, B) of the segment each per-call message size falls in (broadcasts)."""
        i = np.clip(np.searchsorted(self.min_bytes, np.asarray(message_bytes, dtype=np.float64), side="right") - 1,
                    0, len(self.min_bytes) - 1)
        return self.alpha_s[i], self.bus_bytes_per_s[i]


@dataclass(frozen=True)
class LinkRates:
    """α and achievable bus bandwidth per link tier; fields broadcast like ``Columns``.

    ``inter_nic_bytes_per_s`` is one NIC's achievable bandwidth; a node has ``nics_per_node``.
    ``tables`` holds calibrated per-size-regime fits by (tier, op) (``LinkTable``); where one
    exists, ``for_message`` replaces the tier's α and B by the fitted ones for the message size,
    and α is used as fitted (``*_alpha_measured``).
    """

    intra_alpha_s: np.ndarray
    intra_bus_bytes_per_s: np.ndarray
    inter_alpha_s: np.ndarray
    inter_nic_bytes_per_s: np.ndarray
    nics_per_node: np.ndarray
    # NCCL's LL128 and Simple per-step latencies of each tier (``NCCL_RING_HOPS_S``); LL128 is inf
    # where NCCL does not enable it (not NVLink)
    intra_ll128_hop_s: np.ndarray = np.inf
    intra_simple_hop_s: np.ndarray = NCCL_RING_HOPS_S["nvlink"][2]
    inter_simple_hop_s: np.ndarray = NCCL_RING_HOPS_S["net"][2]
    # NCCL's Tree per-step latencies inside a node (LL, LL128, Simple) and the one-node LL cap
    intra_tree_ll_hop_s: np.ndarray = NCCL_TREE_HOPS_S["nvlink"][0]
    intra_tree_ll128_hop_s: np.ndarray = NCCL_TREE_HOPS_S["nvlink"][1]
    intra_tree_simple_hop_s: np.ndarray = NCCL_TREE_HOPS_S["nvlink"][2]
    ll_max_bus_bytes_per_s: np.ndarray = np.inf
    # the inter-node NIC's net-plugin latency, added to each inter-node hop (twice for Simple)
    inter_net_latency_s: np.ndarray = 0.0
    # a full-mesh intra link's peer links per GPU (``intra_bus_bytes_per_s`` is all of them); inf: a switch
    intra_mesh_peer_links: np.ndarray = np.inf
    calibrated: bool = False
    tables: dict = field(default_factory=dict)
    intra_alpha_measured: bool = False
    inter_alpha_measured: bool = False

    def for_message(self, op: str, message_bytes) -> "LinkRates":
        """These rates at a per-call message size: each calibrated tier's α and B from the fitted
        segment that size falls in (the op's own fit, else another op's fit of the same tier —
        ASSUMPTION: a ring runs every collective at the same bus bandwidth)."""
        if not self.tables:  # nameplate rates: the same at every size
            return self
        update = {}
        for tier, prefix in (("intra_node", "intra"), ("inter_node", "inter")):
            table = next((self.tables[(tier, o)] for o in (op, *OPS) if (tier, o) in self.tables), None)
            if table is None:
                continue
            alpha, bus = table.at(message_bytes)
            update[f"{prefix}_alpha_s"] = alpha
            if prefix == "intra":
                update["intra_bus_bytes_per_s"] = bus
            else:  # a ring spanning nodes runs at the node's NICs together (``ring_bus_bytes_per_s``)
                update["inter_nic_bytes_per_s"] = bus / self.nics_per_node
        return replace(self, **update) if update else self


def link_rates(cluster, calibration=None) -> LinkRates:
    """Nameplate × efficiency from the link profiles (each cited in its profile), or a calibrated
    overlay (``shardplan.calibrate.overlay.load_calibration``) used per size regime as fitted:
    every (tier, op) fit becomes a ``LinkTable`` (α and bus bandwidth B per segment), which
    ``comm_times`` evaluates at each collective's per-call message size; its α is not rescaled.
    The tier's fit is the one measured closest to the ring it will serve (intra: the node's GPUs,
    inter: the whole cluster). The scalar fields carry the calibrated latency floor (the first
    segment's α) and the large-message bus bandwidth (the last segment's B). An inter-node
    calibration measures a ring spanning nodes, whose bus bandwidth is the node's NICs together
    (see ``ring_bus_bytes_per_s``)."""
    intra, inter = cluster.intra_link, cluster.inter_link
    values = dict(intra_alpha_s=intra.latency_s, intra_bus_bytes_per_s=intra.achievable_bytes_per_s,
                  inter_alpha_s=inter.latency_s, inter_nic_bytes_per_s=inter.achievable_bytes_per_s)
    tables: dict = {}
    measured = {"intra": False, "inter": False}
    if calibration is not None:
        for tier, prefix, ranks in (("intra_node", "intra", cluster.gpus_per_node),
                                    ("inter_node", "inter", cluster.world_size)):
            for op in OPS:
                fit = calibration.link(op, tier, ranks)
                if fit is not None:
                    tables[(tier, op)] = LinkTable.from_fit(fit)
            table = next((tables[(tier, o)] for o in ("all_gather", *OPS) if (tier, o) in tables), None)
            if table is None:
                continue
            values[f"{prefix}_alpha_s"] = table.alpha_s[0]
            bw = table.bus_bytes_per_s[-1]
            values["intra_bus_bytes_per_s" if prefix == "intra" else "inter_nic_bytes_per_s"] = (
                bw if prefix == "intra" else bw / cluster.nics_per_node)
            measured[prefix] = True
    values.update(nccl_hops(intra, inter))
    if measured["intra"]:  # measured on the node's GPUs: ASSUMPTION, smaller groups run at that rate too
        values["intra_mesh_peer_links"] = np.inf
    return LinkRates(**{k: np.asarray(v, dtype=np.float64) for k, v in values.items()},
                     nics_per_node=np.asarray(cluster.nics_per_node), calibrated=bool(tables), tables=tables,
                     intra_alpha_measured=measured["intra"], inter_alpha_measured=measured["inter"])


def nccl_hops(intra, inter) -> dict:
    """LinkRates' NCCL terms of an intra-node and an inter-node link profile: LL128 / Simple ring
    steps and Tree steps by link kind (``NCCL_RING_HOPS_S``, ``NCCL_TREE_HOPS_S``; LL128 inf where
    the ranks do not talk over NVLink), the one-node LL cap (``nccl_ll_max_bytes_per_s``) and a
    mesh's peer links (``mesh_peer_links``) and the inter link's net-plugin latency
    (``nccl_net_latency_s``, 0 where NCCL's own transport runs)."""
    hw = NCCL_HW_OF_KIND[intra.kind]
    ring, net = NCCL_RING_HOPS_S[hw], NCCL_RING_HOPS_S[NCCL_HW_OF_KIND[inter.kind]]
    cap = intra.nccl_ll_max_bytes_per_s
    return {"intra_ll128_hop_s": ring[1] if hw == "nvlink" else np.inf, "intra_simple_hop_s": ring[2],
            "inter_simple_hop_s": net[2], **dict(zip(TREE_HOP_FIELDS, NCCL_TREE_HOPS_S[hw])),
            "ll_max_bus_bytes_per_s": np.inf if cap is None else cap,
            "intra_mesh_peer_links": np.inf if intra.mesh_peer_links is None else intra.mesh_peer_links,
            "inter_net_latency_s": 0.0 if inter.nccl_net_latency_s is None else inter.nccl_net_latency_s}


def _ll_hop_s(profile_alpha_s):
    """NCCL's LL per-step latency inside a profile's α (6.6 µs + 7 hops, the 8-rank ring)."""
    return np.maximum(np.asarray(profile_alpha_s, dtype=np.float64) - NCCL_BASE_LATENCY_S, 0) / PROFILE_RING_STEPS


def _ll_cap(nodes, rates: LinkRates):
    """LL's bus bandwidth cap, llMaxBw: the intra link's in one node, the host row's across nodes."""
    multi = np.where(nodes <= 2, NCCL_LL_MAX_MULTI_NODE[0], NCCL_LL_MAX_MULTI_NODE[1])
    return np.where(nodes <= 1, rates.ll_max_bus_bytes_per_s, multi)


def _ll128_on(rates: LinkRates, nodes):
    """Where NCCL runs LL128: NVLink ranks (a finite LL128 hop) inside one node (see above)."""
    return np.isfinite(rates.intra_ll128_hop_s) & (nodes <= 1)


def nccl_ring_protocol_times_s(op: str, per_call_bytes, n, nodes, bus_bytes_per_s, rates: LinkRates):
    """(LL, LL128, Simple) time of one ring collective of S bytes on ``n`` ranks over ``nodes``
    nodes (tuning.cc's Ring model, see the constants above; LL128 inf where NCCL disables it)."""
    moved = ring_factor(op, n) * per_call_bytes / bus_bytes_per_s
    inter = ring_steps(op, nodes)
    intra = ring_steps(op, n) - inter
    spans = nodes > 1
    over = np.where(spans, NCCL_NET_OVERHEAD_S, 0.0)
    one_per_node = n <= nodes  # ppn = 1: the Tree's NET latency (tuning.cc)
    plugin = rates.inter_net_latency_s
    net = {k: np.where(one_per_node, NCCL_TREE_HOPS_S["net"][i], NCCL_RING_HOPS_S["net"][i]) + plugin
           for i, k in enumerate(("ll", "ll128", "simple"))}
    ll_net = np.where(one_per_node, net["ll"], _ll_hop_s(rates.inter_alpha_s) + plugin)
    ll_bus = np.minimum(_ll_cap(nodes, rates), 0.5 * bus_bytes_per_s)
    ll = (NCCL_RING_BASE_S["ll"] + intra * np.maximum(_ll_hop_s(rates.intra_alpha_s), over) + inter * ll_net
          + ring_factor(op, n) * per_call_bytes / ll_bus)
    ll128_hop = np.where(_ll128_on(rates, nodes), rates.intra_ll128_hop_s, 1.0)  # finite stand-in where off
    ll128 = np.where(_ll128_on(rates, nodes), NCCL_RING_BASE_S["ll128"] + intra * np.maximum(ll128_hop, over)
                     + inter * net["ll128"] + moved / NCCL_LL128_BW, np.inf)
    plateau = np.where(spans & (op == "all_reduce"), NCCL_SIMPLE_PLATEAU, 1.0)
    simple_net = np.where(one_per_node, net["simple"], rates.inter_simple_hop_s + plugin) + plugin  # + the flush
    simple = plateau * (NCCL_RING_BASE_S["simple"] + intra * np.maximum(rates.intra_simple_hop_s, 3 * over)
                        + inter * simple_net) + moved
    return ll, ll128, simple


def _tree_correction(per_call_bytes):
    """treeCorrectionFactor per protocol at log2(S/64) (1 outside 64 B … 256 MiB)."""
    table = np.asarray(NCCL_TREE_CORRECTION)
    with np.errstate(divide="ignore"):
        log = np.floor(np.log2(np.maximum(np.asarray(per_call_bytes, dtype=np.float64), 1) / 64))
    inside = (log >= 0) & (log < table.shape[1])
    i = np.clip(log, 0, table.shape[1] - 1).astype(np.int64)
    return tuple(np.where(inside, table[p][i], 1.0) for p in range(3))


def tree_bus_bytes_per_s(n, nodes, nic_bytes_per_s, rates: LinkRates):
    """T, the Tree's bus bandwidth (algbw = 0.5·0.92·T): the node's chain at the intra link, and
    across nodes the NICs, which move S each way per node at 2 nodes and 2S beyond (double binary
    tree), so T = min(B_intra, 2·NICs) at 2 nodes, min(B_intra, NICs) beyond — tuning.cc prices
    ≤ 2 nodes at the graph's bwIntra and more at its bwInter. One GPU per node: no chain."""
    in_node = intra_bus_for_group(n / np.maximum(nodes, 1), rates)
    chain = np.where(n > nodes, in_node, np.inf)
    nic = np.where(nodes <= 2, 2.0, 1.0) * nic_bytes_per_s
    return np.where(nodes <= 1, in_node, np.minimum(chain, nic))


def nccl_tree_allreduce_times_s(per_call_bytes, n, nodes, tree_bus_bytes_per_s, rates: LinkRates):
    """(LL, LL128, Simple) time of one Tree all-reduce (tuning.cc's Tree model, constants above)."""
    ppn = n / np.maximum(nodes, 1)
    levels = np.floor(np.log2(np.maximum(nodes, 1)))
    bus = NCCL_TREE_BW * tree_bus_bytes_per_s
    buses = (np.minimum(bus / NCCL_TREE_LL_DIV, _ll_cap(nodes, rates)),
             bus * np.where(nodes <= 1, 7.0 / 9.0, 120.0 / 128.0), bus)
    out = []
    for i, (k, corr) in enumerate(zip(("ll", "ll128", "simple"), _tree_correction(per_call_bytes))):
        hop = getattr(rates, TREE_HOP_FIELDS[i])
        net = NCCL_TREE_HOPS_S["net"][i] + rates.inter_net_latency_s * (2 if k == "simple" else 1)  # + the flush
        lat = NCCL_TREE_BASE_S[k] + 2 * ((ppn - 1) * hop + levels * net)
        out.append(lat + per_call_bytes / (0.5 * buses[i] * corr))
    out[1] = np.where(_ll128_on(rates, nodes), out[1], np.inf)
    return tuple(out)


def _fastest(times, protocols):
    """The fastest of (LL, LL128, Simple) times among the ``protocols`` allowed (NCCL_PROTO)."""
    allowed = [t for t, p in zip(times, NCCL_PROTOCOLS) if p in protocols]
    if not allowed:
        raise ShardplanError("protocols", ",".join(protocols), f"expected some of {', '.join(NCCL_PROTOCOLS)}")
    return np.minimum.reduce(np.broadcast_arrays(*allowed))


def nccl_time_s(op: str, message_bytes, calls, n, nodes, bus_bytes_per_s, rates: LinkRates, tree=True,
                nic_bytes_per_s=None, protocols=NCCL_PROTOCOLS):
    """``calls`` collectives of S/calls bytes each on ``n`` ranks over ``nodes`` nodes, each at the
    fastest of NCCL's algorithms and protocols (tuning.cc's model, see the constants above): Ring,
    and Tree for an all-reduce unless ``tree`` is False (a line that forced Ring), over the
    ``protocols`` the job allows (NCCL_PROTO; all by default).
    ``bus_bytes_per_s`` is the ring's achievable bus bandwidth, ``nic_bytes_per_s`` the inter-node
    bandwidth a node gives this group (None: all its NICs). Zero for one rank."""
    n = np.asarray(n, dtype=np.float64)
    nodes = np.asarray(nodes, dtype=np.float64)
    calls = np.maximum(np.asarray(calls, dtype=np.float64), 1)
    per_call = np.asarray(message_bytes, dtype=np.float64) / calls
    best = _fastest(nccl_ring_protocol_times_s(op, per_call, n, nodes, bus_bytes_per_s, rates), protocols)
    if op == "all_reduce" and tree:
        nic = rates.nics_per_node * rates.inter_nic_bytes_per_s if nic_bytes_per_s is None else nic_bytes_per_s
        tree_bus = tree_bus_bytes_per_s(n, nodes, nic, rates)
        best = np.minimum(best, _fastest(nccl_tree_allreduce_times_s(per_call, n, nodes, tree_bus, rates), protocols))
    return np.where(n > 1, calls * best, 0.0)


def ring_collective_time_s(op: str, message_bytes, calls, group_size, gpus_per_node, rates: LinkRates, tree=True,
                           protocols=NCCL_PROTOCOLS):
    """Time of ``calls`` collectives of one flat ring moving ``message_bytes`` (S summed over the
    calls) at the per-call message size S/calls: a calibrated tier with its fitted α and B of that
    size (``collective_time_s``), otherwise NCCL's algorithm and protocol choice on the ring's bus
    bandwidth (``nccl_time_s``, Tree allowed for an all-reduce unless ``tree`` is False, among the
    ``protocols`` allowed; ``ring_bus_bytes_per_s``)."""
    per_call = np.asarray(message_bytes, dtype=np.float64) / np.maximum(calls, 1)
    r = rates.for_message(op, per_call)
    spans = np.asarray(group_size) > np.asarray(gpus_per_node)
    measured = np.where(spans, r.inter_alpha_measured, r.intra_alpha_measured)
    bus = ring_bus_bytes_per_s(group_size, gpus_per_node, r)
    fitted = collective_time_s(op, message_bytes, group_size, ring_alpha_s(group_size, gpus_per_node, r), bus, calls,
                               measured)
    nodes = np.ceil(np.asarray(group_size, dtype=np.float64) / np.maximum(gpus_per_node, 1))
    return np.where(measured, fitted, nccl_time_s(op, message_bytes, calls, group_size, nodes, bus, r, tree,
                                                  protocols=protocols))


def intra_bus_for_group(ranks_in_node, rates: LinkRates):
    """The intra link's bus bandwidth for a ring over ``ranks_in_node`` GPUs of a node: all of it on a
    switch; on a full mesh of P peer links per GPU (``mesh_peer_links``) the group reaches
    min(g − 1, P) of them, so B·min(g − 1, P)/P (AMD xGMI: 2 MI300X get one 64 GB/s link of 7)."""
    peers = rates.intra_mesh_peer_links
    mesh = np.isfinite(peers)
    p = np.where(mesh, peers, 1.0)
    share = np.where(mesh, np.minimum(np.maximum(np.asarray(ranks_in_node, dtype=np.float64) - 1, 1), p) / p, 1.0)
    return rates.intra_bus_bytes_per_s * share


def ring_bus_bytes_per_s(group_size, gpus_per_node, rates: LinkRates):
    """Bus bandwidth of one flat ring over ``group_size`` consecutive ranks.

    Inside a node: the intra-node link. Spanning nodes: NCCL runs one channel per NIC, each
    crossing the node boundary once, so the ring's slowest hop gives min(B_intra, NICs·B_NIC)
    (e.g. 8 A100 + 4 HDR NICs: 4 × 24 = 96 GB/s busbw, S. Jeaugey in NVIDIA/nccl-tests #119).
    The intra link as the group's in-node ranks reach it (``intra_bus_for_group``).
    """
    spans = np.asarray(group_size) > np.asarray(gpus_per_node)
    inter = rates.nics_per_node * rates.inter_nic_bytes_per_s
    intra = intra_bus_for_group(np.minimum(group_size, gpus_per_node), rates)
    return np.where(spans, np.minimum(intra, inter), intra)


def ring_alpha_s(group_size, gpus_per_node, rates: LinkRates):
    """A ring spanning nodes pays the inter-node hop latency (its slowest hop)."""
    spans = np.asarray(group_size) > np.asarray(gpus_per_node)
    return np.where(spans, np.maximum(rates.inter_alpha_s, rates.intra_alpha_s), rates.intra_alpha_s)


def replica_bus_bytes_per_s(replicas, shard_group, gpus_per_node, rates: LinkRates):
    """HSDP's replica all-reduce: every local rank of a node runs its own replica group at the same
    time, so each gets its per-GPU share of the node's NICs, NICs·B_NIC / GPUs per node (capped by
    the intra-node link); replicas that all sit in one node (g·r ≤ GPUs per node) use NVLink/PCIe."""
    inside = np.asarray(shard_group) * np.asarray(replicas) <= np.asarray(gpus_per_node)
    share = rates.nics_per_node * rates.inter_nic_bytes_per_s / np.maximum(gpus_per_node, 1)
    return np.where(inside, intra_bus_for_group(replicas, rates), np.minimum(share, rates.intra_bus_bytes_per_s))


# --- volumes ----------------------------------------------------------------------------------
def grad_comm_bytes_per_element(c):
    """Bytes per element of the gradient collectives (reduce-scatter, all-reduce, HSDP's replica
    all-reduce), from the ``reduce_dtype`` knob (``buffers.reduce_dtype_bytes``): FSDP's
    ``MixedPrecision(Policy)(reduce_dtype=...)`` — torch ``foreach_reduce`` allocates the
    reduce-scatter input and output in it and all-reduces HSDP replicas in it; DDP all-reduces its
    buckets in the ``.grad`` dtype (fp32 params under autocast), or in 16-bit with
    ``bf16_compress_hook``/``fp16_compress_hook``; DeepSpeed ``communication_data_type`` (default:
    the 16-bit training dtype, DeepSpeed config docs; ASSUMPTION for bf16). The default per engine
    is its declaration's (``st.default_reduce_dtype``)."""
    return reduce_dtype_bytes(c.precision, c.reduce_dtype)


def reduce_collective_bytes_per_element(c, group):
    """Bytes per element the gradient reduction sends: the reduce dtype, or the engine's quantized
    gradients where it declares them (``collectives.gradient_quantization``: bits/8 + one scale per
    group; ``across_nodes_only``: only when the ``group`` ring spans nodes, ZeRO++ qgZ's
    ``all_to_all_quant_reduce`` being used for multi-node groups only)."""
    quant = per_engine("gradient_comm_bytes", c.engine)
    spans = np.asarray(group) > np.asarray(c.gpus_per_node)
    applies = (quant > 0) & (spans | np.logical_not(per_engine("gradient_quant_across_nodes_only", c.engine)))
    return np.where(applies, quant, grad_comm_bytes_per_element(c))


def gather_bytes_scale(c, gathered_bytes_per_element):
    """Factor on the bytes of a parameter all-gather: 1, or the engine's quantized weights over the
    gathered dtype (``collectives.weight_gather_quantization``: ZeRO++ qwZ int8 + block scales)."""
    quant = per_engine("weight_gather_bytes", c.engine)
    return np.where(quant > 0, quant / np.asarray(gathered_bytes_per_element, dtype=np.float64), 1.0)


def gathered_param_bytes(c):
    """(block bytes, root bytes) one all-gather round produces: blocks in the compute dtype (or the
    frozen base's storage for LoRA/QLoRA) + adapters; the root in the compute dtype, frozen or not."""
    a = compute_dtype_bytes(c.precision)
    blocks = (c.total_params - c.root_params) * unsharded_block_bytes_per_param(c)
    adapters = np.where(c.method == st.FULL, 0, c.lora_params * a)
    root = c.root_params * a  # frozen or not, in the compute dtype (buffers.unsharded_block_bytes_per_param)
    return blocks + adapters, root


def _sync_mode(c, sync_every_micro_batch):
    """The sync knob: the value given, or (None) the configuration's ``sync_every_micro_batch`` column."""
    return np.asarray(c.sync_every_micro_batch if sync_every_micro_batch is None else sync_every_micro_batch, dtype=bool)


def sync_count(c, sync_every_micro_batch=None):
    """Gradient synchronisations per step: every micro-batch, or once (no_sync). DeepSpeed ZeRO-1
    reduces only at the accumulation boundary (its gradients are unsharded anyway)."""
    once = np.logical_not(_sync_mode(c, sync_every_micro_batch)) | (c.strategy == st.ZERO1)
    return np.where(once, 1, c.grad_accum)


def no_sync_grad_bytes(c, sync_every_micro_batch=None):
    """Extra device memory of syncing once per step when gradients are otherwise sharded: the whole
    model's unsharded gradients in the reduce dtype (FSDP ``no_sync`` docstring: "gradients are
    accumulated in the unsharded form"). Zero for DDP / NO_SHARD / ZeRO-1 (already unsharded).
    ``sync_every_micro_batch`` None: the configuration's column. ``memory.estimate_memory`` counts
    it in every forward and backward moment."""
    _, n_g, _ = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    sharded_grads = (n_g > 1) & (c.strategy != st.ZERO1)
    held = np.logical_not(_sync_mode(c, sync_every_micro_batch)) & (c.grad_accum > 1) & sharded_grads
    return np.asarray(np.where(held, trainable_params(c) * grad_comm_bytes_per_element(c), 0), dtype=np.int64)


def _gather_collectives(c, n_p, k, units):
    """(op, S, calls, group) of the parameter all-gathers: forward, and backward where units reshard
    after forward (FSDP keeps the root unsharded to backward; DeepSpeed ZeRO-3 gathers it again:
    ``keeps_root_unsharded_to_backward``). Quantized where the engine declares it (ZeRO++ qwZ;
    ASSUMPTION: the backward gather too). Where the engine keeps a secondary partition within the
    shard group (ZeRO++ hpZ, Wang et al. 2023 §3.2: "eliminates inter-node backward parameter
    all-gather"), the backward all-gather runs inside that group."""

    s = c.strategy
    blocks_b, root_b = gathered_param_bytes(c)
    scale = gather_bytes_scale(c, compute_dtype_bytes(c.precision))
    blocks_b, root_b = blocks_b * scale, root_b * scale
    regathers_root = np.logical_not(per_engine("keeps_root_unsharded", c.engine))
    gather = n_p > 1
    reshard = gather & ((s == st.FULL_SHARD) | (s == st.HYBRID_SHARD))
    ag_fwd_S = np.where(gather, (blocks_b + root_b) * k, 0)
    ag_bwd_S = np.where(reshard, (blocks_b + np.where(regathers_root, root_b, 0)) * k, 0)
    # ZeRO++ hpZ: backward gathers from the secondary partition, inside the shard group (the node)
    secondary = per_strategy("secondary_param_partition", c.engine, s)
    bwd_group = np.where(secondary, np.minimum(c.shard_group_size, c.world_size), n_p)
    return {
        "ag_fwd": ("all_gather", ag_fwd_S, np.where(gather, units * k, 0), np.where(gather, n_p, 1)),
        "ag_bwd": ("all_gather", ag_bwd_S, np.where(reshard, (units - np.where(regathers_root, 0, 1)) * k, 0),
                   np.where(reshard, bwd_group, 1)),
    }


def _gradient_collectives(c, n_g, g, replicas, syncs, units):
    """(op, S, calls, group) of the gradient reduction and the post-step all-gather. FSDP reduces
    once per unit; bucketed wrappers (torch DDP, DeepSpeed) once per declared bucket
    (``collectives.gradient_bucket``; DeepSpeed's all-gather of the updated 16-bit partitions after
    ZeRO-1/2's step: ``param_gather_bucket``). ZeRO-1 reduce-scatters although it keeps whole
    gradients (``reduce_scatters_grads``)."""
    s, n = c.strategy, c.world_size
    hybrid = (s == st.HYBRID_SHARD) | (s == st.HYBRID_SHARD_ZERO2)
    bucketed = np.logical_not(eng.wrapper_is(eng.W_FSDP, c.engine, s))
    rs = (n_g > 1) | per_strategy("reduce_scatters_grads", c.engine, s)
    rs_group = np.where(rs, np.where(hybrid, g, n), 1)
    gb = reduce_collective_bytes_per_element(c, rs_group)
    grads_S = trainable_params(c) * gb
    rs_S = np.where(rs, grads_S * syncs, 0)
    ar = np.logical_not(rs) & (n > 1)
    plain_S = trainable_params(c) * grad_comm_bytes_per_element(c)
    ar_S = np.where(ar, plain_S * syncs, 0)
    ar_rep_S = np.where(hybrid & (replicas > 1), plain_S / np.maximum(g, 1) * syncs, 0)
    post = per_strategy("post_step_gather", c.engine, s) & (n > 1)
    post_S = np.where(post, trainable_params(c) * 2, 0)
    grad_calls = np.ceil(np.where(rs, grads_S, plain_S) / bucket_bytes(c.engine, gb))
    post_calls = np.ceil(post_S / np.maximum(bucket_bytes(c.engine, 2, "gather_bucket"), 1))
    return {
        "rs_grad": ("reduce_scatter", rs_S, np.where(rs, np.where(bucketed, grad_calls, units) * syncs, 0), rs_group),
        "ar_grad": ("all_reduce", ar_S, np.where(ar, np.where(bucketed, grad_calls, units) * syncs, 0), np.where(ar, n, 1)),
        "ar_replica": ("all_reduce", ar_rep_S, np.where(ar_rep_S > 0, units * syncs, 0), np.where(ar_rep_S > 0, replicas, 1)),
        "ag_post_step": ("all_gather", post_S, np.where(post_S > 0, post_calls, 0), np.where(post_S > 0, n, 1)),
    }


def comm_volume(c, sync_every_micro_batch=None):
    """Per step, per GPU: for each collective in ``COLLECTIVES``: ``<name>_message_bytes`` (S summed
    over calls), ``<name>_bytes`` (f(n)·S, what this GPU sends), ``<name>_calls`` and ``<name>_group``
    (ranks in the ring), plus ``comm_bytes_per_step`` and ``no_sync_grad_bytes``."""
    s = c.strategy
    n = c.world_size
    n_p, n_g, _ = st.shard_degrees(s, c.engine, n, c.shard_group_size)
    hybrid = (s == st.HYBRID_SHARD) | (s == st.HYBRID_SHARD_ZERO2)
    g = np.where(hybrid, n_p, n)
    replicas = np.where(hybrid, n // np.maximum(g, 1), 1)
    k = c.grad_accum
    syncs = sync_count(c, sync_every_micro_batch)
    units = c.num_layers + 1
    out = {}
    table = {**_gather_collectives(c, n_p, k, units), **_gradient_collectives(c, n_g, g, replicas, syncs, units)}
    total = 0
    for name, (op, S, calls, group) in table.items():
        S = np.asarray(S, dtype=np.float64)
        moved = ring_factor(op, group) * S
        out[f"{name}_message_bytes"] = np.asarray(np.round(S), dtype=np.int64)
        out[f"{name}_bytes"] = np.asarray(np.round(moved), dtype=np.int64)
        out[f"{name}_calls"] = np.asarray(calls, dtype=np.int64)
        out[f"{name}_group"] = np.asarray(group, dtype=np.int64)
        total = total + out[f"{name}_bytes"]
    out["comm_bytes_per_step"] = total
    out["replicas"] = np.asarray(replicas, dtype=np.int64)
    out["no_sync_grad_bytes"] = no_sync_grad_bytes(c, sync_every_micro_batch)
    return out


COLLECTIVE_OP = {"ag_fwd": "all_gather", "ag_bwd": "all_gather", "rs_grad": "reduce_scatter",
                 "ar_grad": "all_reduce", "ar_replica": "all_reduce", "ag_post_step": "all_gather"}


def comm_times(c, rates: LinkRates, volume=None, sync_every_micro_batch=None):
    """α-β time per step of each collective (``<name>_s``), each on its own ring and link tier:
    sharded groups and DDP/ZeRO rings as flat rings (``ring_bus_bytes_per_s``), HSDP replicas on
    the per-GPU NIC share (``replica_bus_bytes_per_s``)."""
    v = comm_volume(c, sync_every_micro_batch) if volume is None else volume
    out = {}
    for name, op in COLLECTIVE_OP.items():
        group, S, calls = v[f"{name}_group"], v[f"{name}_message_bytes"], v[f"{name}_calls"]
        if name == "ar_replica":
            r = rates.for_message(op, np.asarray(S, dtype=np.float64) / np.maximum(calls, 1))
            shard_group = c.world_size // np.maximum(group, 1)
            bus = replica_bus_bytes_per_s(group, shard_group, c.gpus_per_node, r)
            spans = shard_group * group > c.gpus_per_node
            alpha = np.where(spans, r.inter_alpha_s, r.intra_alpha_s)
            measured = np.where(spans, r.inter_alpha_measured, r.intra_alpha_measured)
            # replicas of one shard sit on different nodes when the replica group spans nodes
            nccl = nccl_time_s(op, S, calls, group, np.where(spans, group, 1), bus, r, nic_bytes_per_s=bus)
            out[f"{name}_s"] = np.where(measured, collective_time_s(op, S, group, alpha, bus, calls, measured), nccl)
        else:
            out[f"{name}_s"] = ring_collective_time_s(op, S, calls, group, c.gpus_per_node, rates)
    return out


# NVLS (NVLink SHARP) all-reduce inside one NVSwitch node, NCCL's own model (NVIDIA/nccl
# ``src/graph/search.cc`` ``ncclTopoSearchTryNvls`` and ``src/graph/tuning.cc``, v2.27.7-1 and
# v2.29.7-1): without a NIC the NVLS graph has one channel per GPU (head), and a channel takes its
# bandwidth once on every GPU's NVSwitch link each way and twice on its head's, so each link carries
# (n + 1)·bw: bwIntra = B/(n + 1), nChannels·bwIntra = n·B/(n + 1). v2.27.7 turns that into
# algbw = 5/6 of it; from v2.28.3 the bus bandwidth is nChannels·bwIntra·eff·(nCh − 1)/nCh·2
# (``nvlsEfficiency``: Hopper 0.85, Blackwell 0.74) over the ring's nRanks/nsteps. Both give, in
# nccl-tests' bus bandwidth (algbw·2(n − 1)/n), 2·eff·(n − 1)/(n + 1)·B with eff = 5/6 (v2.27) or
# the architecture's. Latency: hwLat NVLink NVLS Simple 25 µs (baseLat 0), v2.27.7-1.
# ASSUMPTIONS: B is the ring's achievable bus bandwidth (the NVLS graph's link budget is the
# ring's; NCCL's speed-array rounding of bwIntra, a few %, is left out).
NCCL_NVLS_EFFICIENCY_2_27 = 5.0 / 6.0
NCCL_NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}  # v2.28.3-1 … v2.30.7-1
NCCL_NVLS_LATENCY_S = 25e-6


def nvls_all_reduce_bus_bytes_per_s(n, intra_bus_bytes_per_s, efficiency):
    """nccl-tests bus bandwidth of NCCL's NVLS all-reduce over ``n`` GPUs of one NVSwitch node."""
    n = np.asarray(n, dtype=np.float64)
    return 2.0 * np.asarray(efficiency) * (n - 1.0) / (n + 1.0) * np.asarray(intra_bus_bytes_per_s)


def nvls_all_reduce_time_s(message_bytes, n, intra_bus_bytes_per_s, efficiency):
    """NCCL's time for one NVLS all-reduce of ``message_bytes`` (latency + S / algbw)."""
    bus = nvls_all_reduce_bus_bytes_per_s(n, intra_bus_bytes_per_s, efficiency)
    return NCCL_NVLS_LATENCY_S + np.asarray(message_bytes, dtype=np.float64) / busbw_to_algbw(bus, "all_reduce", n)
