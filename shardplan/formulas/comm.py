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
# What NCCL picks per call (tuning.cc, 2.2x, ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime``): for
# each protocol, latency = baseLat + intra steps · hwLat(intra) + inter-node steps · hwLat(NET),
# time = latency + S / algbw, and the fastest protocol runs. Ring baseLat (µs): LL 6.6, LL128 14.0,
# Simple 8.4; hwLat per ring step (µs, LL / LL128 / Simple): NVLink .6 / 1.9 / 3.4, PCI 1.0 / 2.5 /
# 5.7, NET 2.7 / 4.0 / 14.0. Bandwidth: LL ×1/3 (all-gather / reduce-scatter in one node) or ×1/4
# (all-reduce, or more than one node); LL128 ×0.92, only on NVLink inside a node (LL128 is enabled
# by default only where the path is NVLink); Simple ×1. LL's intra-node hop is ×1.8 when the ring
# spans nodes. The LL hop is the profile's (α − 6.6 µs)/7; LL128 and Simple hops come from the
# link's kind (``NCCL_RING_HOPS_S``; ASSUMPTION: AMD xGMI priced as NVLink, RCCL's own table not used).
NCCL_RING_BASE_S = {"ll": 6.6e-6, "ll128": 14.0e-6, "simple": 8.4e-6}
NCCL_RING_HOPS_S = {"nvlink": (0.6e-6, 1.9e-6, 3.4e-6), "pcie": (1.0e-6, 2.5e-6, 5.7e-6),
                    "net": (2.7e-6, 4.0e-6, 14.0e-6)}
NCCL_HW_OF_KIND = {"nvlink": "nvlink", "infinity_fabric": "nvlink", "pcie": "pcie",
                   "infiniband": "net", "ethernet": "net", "roce": "net"}
NCCL_LL128_BW = 0.92


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
    values.update(nccl_hops(intra.kind, inter.kind))
    return LinkRates(**{k: np.asarray(v, dtype=np.float64) for k, v in values.items()},
                     nics_per_node=np.asarray(cluster.nics_per_node), calibrated=bool(tables), tables=tables,
                     intra_alpha_measured=measured["intra"], inter_alpha_measured=measured["inter"])


def nccl_hops(intra_kind: str, inter_kind: str) -> dict:
    """LinkRates' LL128 / Simple per-step latencies for two link kinds (``NCCL_RING_HOPS_S``)."""
    intra = NCCL_RING_HOPS_S[NCCL_HW_OF_KIND[intra_kind]]
    inter = NCCL_RING_HOPS_S[NCCL_HW_OF_KIND[inter_kind]]
    ll128 = intra[1] if NCCL_HW_OF_KIND[intra_kind] == "nvlink" else np.inf
    return {"intra_ll128_hop_s": ll128, "intra_simple_hop_s": intra[2], "inter_simple_hop_s": inter[2]}


def _ll_hop_s(profile_alpha_s):
    """NCCL's LL per-step latency inside a profile's α (6.6 µs + 7 hops, the 8-rank ring)."""
    return np.maximum(np.asarray(profile_alpha_s, dtype=np.float64) - NCCL_BASE_LATENCY_S, 0) / PROFILE_RING_STEPS


def nccl_ring_time_s(op: str, message_bytes, calls, n, nodes, bus_bytes_per_s, rates: LinkRates):
    """``calls`` ring collectives of S/calls bytes each on ``n`` ranks over ``nodes`` nodes, each at
    the fastest of NCCL's three protocols (``NCCL_RING_BASE_S``, tuning.cc's latency and bandwidth
    model); ``bus_bytes_per_s`` is the ring's achievable bus bandwidth. Zero for one rank."""
    n = np.asarray(n, dtype=np.float64)
    nodes = np.asarray(nodes, dtype=np.float64)
    calls = np.maximum(np.asarray(calls, dtype=np.float64), 1)
    moved = ring_factor(op, n) * np.asarray(message_bytes, dtype=np.float64) / calls / bus_bytes_per_s
    inter = ring_steps(op, nodes)
    intra = ring_steps(op, n) - inter
    spans = nodes > 1
    ll = (NCCL_RING_BASE_S["ll"] + intra * _ll_hop_s(rates.intra_alpha_s) * np.where(spans, 1.8, 1.0)
          + inter * _ll_hop_s(rates.inter_alpha_s) + moved * np.where(spans | (op == "all_reduce"), 4.0, 3.0))
    # LL128 off (inf hop) or across nodes: priced out (a finite stand-in keeps 0 steps × hop defined)
    ll128_hop = np.where(np.isfinite(rates.intra_ll128_hop_s), rates.intra_ll128_hop_s, 1.0)
    ll128 = np.where(spans | np.logical_not(np.isfinite(rates.intra_ll128_hop_s)), np.inf,
                     NCCL_RING_BASE_S["ll128"] + intra * ll128_hop + moved / NCCL_LL128_BW)
    simple = NCCL_RING_BASE_S["simple"] + intra * rates.intra_simple_hop_s + inter * rates.inter_simple_hop_s + moved
    return np.where(n > 1, calls * np.minimum(np.minimum(ll, ll128), simple), 0.0)


def ring_collective_time_s(op: str, message_bytes, calls, group_size, gpus_per_node, rates: LinkRates):
    """Time of ``calls`` collectives of one flat ring moving ``message_bytes`` (S summed over the
    calls) at the per-call message size S/calls: a calibrated tier with its fitted α and B of that
    size (``collective_time_s``), otherwise NCCL's protocol choice on the ring's bus bandwidth
    (``nccl_ring_time_s``; ``ring_bus_bytes_per_s``)."""
    per_call = np.asarray(message_bytes, dtype=np.float64) / np.maximum(calls, 1)
    r = rates.for_message(op, per_call)
    spans = np.asarray(group_size) > np.asarray(gpus_per_node)
    measured = np.where(spans, r.inter_alpha_measured, r.intra_alpha_measured)
    bus = ring_bus_bytes_per_s(group_size, gpus_per_node, r)
    fitted = collective_time_s(op, message_bytes, group_size, ring_alpha_s(group_size, gpus_per_node, r), bus, calls,
                               measured)
    nodes = np.ceil(np.asarray(group_size, dtype=np.float64) / np.maximum(gpus_per_node, 1))
    return np.where(measured, fitted, nccl_ring_time_s(op, message_bytes, calls, group_size, nodes, bus, r))


def ring_bus_bytes_per_s(group_size, gpus_per_node, rates: LinkRates):
    """Bus bandwidth of one flat ring over ``group_size`` consecutive ranks.

    Inside a node: the intra-node link. Spanning nodes: NCCL runs one channel per NIC, each
    crossing the node boundary once, so the ring's slowest hop gives min(B_intra, NICs·B_NIC)
    (e.g. 8 A100 + 4 HDR NICs: 4 × 24 = 96 GB/s busbw, S. Jeaugey in NVIDIA/nccl-tests #119).
    """
    spans = np.asarray(group_size) > np.asarray(gpus_per_node)
    inter = rates.nics_per_node * rates.inter_nic_bytes_per_s
    return np.where(spans, np.minimum(rates.intra_bus_bytes_per_s, inter), rates.intra_bus_bytes_per_s)


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
    return np.where(inside, rates.intra_bus_bytes_per_s, np.minimum(share, rates.intra_bus_bytes_per_s))


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
            nccl = nccl_ring_time_s(op, S, calls, group, np.where(spans, group, 1), bus, r)
            out[f"{name}_s"] = np.where(measured, collective_time_s(op, S, group, alpha, bus, calls, measured), nccl)
        else:
            out[f"{name}_s"] = ring_collective_time_s(op, S, calls, group, c.gpus_per_node, rates)
    return out
