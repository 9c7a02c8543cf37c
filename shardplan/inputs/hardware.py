"""GPUs, links and clusters.

A cluster is GPU × GPUs per node × nodes × intra-node link × inter-node link × host RAM per node.
Profiles live in ``hardware_profiles/gpus/*.json`` and ``hardware_profiles/links/*.json``; each
numeric field carries its source in the profile's ``sources`` mapping.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from shardplan.inputs.profile_index import entries, find_entry, profile_of
from shardplan.inputs.profiles import load_all
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_BYTES, MAX_FLOPS_PER_S, MAX_GPUS, MAX_LATENCY_S, MAX_LINK_BYTES_PER_S, MAX_MEMORY_BYTES_PER_S, bounded_int, checked_int
from shardplan.support.names import did_you_mean, normalize

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]

# Documented defaults of the optional per-GPU / per-link coefficients (a profile that leaves a
# field out gets these; a profile that sets one must cite its source like every other number).
# GEMM: the median of the MAMF table's GPU rows (stas00/ml-engineering ``compute/accelerator/README.md``
# @744d01e, bf16, mamf-finder v2 with per-shape cache resets: A100 SXM 86.9 %, GH200 83.8 %, A100
# PCIe 81.1 %, H100 SXM 80.3 %, B300 78.6 %, B200 77.6 %, GB200 72.9 %, MI355X 68.0 %, MI325X 60.4 %,
# MI300X 51.4 %; the Gaudi rows are not GPUs a profile can name). Until session 8 it was the median
# of the five v1 rows the author has since replaced (0.822).
DEFAULT_GEMM_EFFICIENCY = 0.781
# A card may run its GEMMs faster than its nameplate: a datasheet's tensor peak is at the boost clock
# it names (RTX 4090: 2520 MHz, Ada whitepaper Appendix A), and GeForce boards boost past it under
# load; the RTX 4090's measured MAMF maximum is 178.8 bf16 TFLOPS, 1.082 of the 165.2 figure
# (mag-/gpu_benchmark README). The bound catches a mistyped efficiency, not a fast card: 1.2 is
# above any boost over the datasheet clock that a published measurement shows.
MAX_GEMM_EFFICIENCY = 1.2
# Attention: the long-sequence rate, as ``throughput.attention_rate_factor`` reads the profile's
# figure (it scales it down for short sequences). FlashAttention-2 on A100 (Dao 2023, arXiv
# 2307.08691) reaches "up to 73% ... in the forward pass, and up to 63% ... in the backward pass"
# (§4.1): weighted by FLOPs (backward 2.5x the forward's) 3.5 / (1/0.73 + 2.5/0.63) = 0.655. The
# abstract's 50 % low end is the short-sequence end that the rate factor already applies.
DEFAULT_ATTENTION_EFFICIENCY = (1 + 2.5) / (1 / 0.73 + 2.5 / 0.63)
# SMs: A100's 108 (A100 whitepaper) for a GPU whose profile does not say.
DEFAULT_SM_COUNT = 108
# Host interface for CPU offload transfers: PCIe Gen4 x16, the common case before Hopper.
DEFAULT_HOST_LINK = "pcie4"
# NCCL channels: NCCL's usual choice over PCIe (2-4; NCCL env docs, NCCL_MIN/MAX_NCHANNELS).
DEFAULT_NCCL_CHANNELS = 4


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


OPTIONAL_GPU_FIELDS = ("gemm_efficiency", "attention_efficiency", "sm_count", "host_link", "default_nics_per_node",
                       "gemm_shape_fit")


class GemmShapeFit(_Frozen):
    """16-bit GEMM efficiency per problem shape measured on this GPU (``calibrate/gemm_shapes.py``):
    eff(m, n, k) = A · m^a · n^b · k^c (``coefficients`` = A, a, b, c), clipped to [0.05, eff_max],
    with the fit's leave-one-shape-out error."""

    coefficients: tuple[float, float, float, float]
    eff_max: float = Field(gt=0, le=1)
    shapes: PositiveInt
    probes: PositiveInt
    loso_median_abs_error: float = Field(ge=0)
    loso_p90_abs_error: float = Field(ge=0)
    probes_file: str


class GPUProfile(_Frozen):
    """One accelerator. ``memory_bytes`` is what the driver exposes (torch ``total_memory``).

    The throughput model's per-GPU coefficients are profile data too: ``gemm_efficiency``,
    ``attention_efficiency``, ``sm_count`` (denominator of NCCL's share of the GPU) and
    ``host_link`` (the offload path); each is optional with the documented ``DEFAULT_*`` above,
    and a calibration overlay replaces what it measured (``throughput.compute_rates``)."""

    name: str
    display_name: str
    aliases: tuple[str, ...] = ()
    vendor: Literal["nvidia", "amd"]
    # upper bounds (limits.py): past them the formulas' int64/float64 arithmetic overflows (2**70
    # bytes of memory was an internal error before it was a one-line one)
    memory_bytes: int = Field(gt=0, le=MAX_BYTES)
    nominal_memory_gb: int = Field(gt=0, le=MAX_BYTES // 10**9, description="the marketing capacity, e.g. 24 for '24 GB'")
    peak_flops: dict[Dtype, Annotated[float, Field(gt=0, le=MAX_FLOPS_PER_S)]] = Field(
        description="dense (no sparsity) peak FLOP/s per dtype")
    memory_bandwidth_bytes_per_s: float = Field(gt=0, le=MAX_MEMORY_BYTES_PER_S)
    default_intra_link: str
    default_inter_link: str
    default_gpus_per_node: int = Field(gt=0, le=MAX_GPUS)
    default_host_ram_bytes: int = Field(gt=0, le=MAX_BYTES, description="host RAM of a typical node built around it")
    default_nics_per_node: int | None = Field(
        None, gt=0, le=MAX_GPUS, description="inter-node NICs of a typical node; None: one per GPU on 8-GPU nodes, else one")
    tdp_watts: PositiveFloat | None = None
    gemm_efficiency: float = Field(DEFAULT_GEMM_EFFICIENCY, gt=0, le=MAX_GEMM_EFFICIENCY,
                                   description="large-GEMM achieved / dense peak (MAMF), above 1 where the card boosts "
                                               "past its datasheet clock; default 0.781")
    attention_efficiency: float = Field(DEFAULT_ATTENTION_EFFICIENCY, gt=0, le=1,
                                        description="flash/SDPA attention achieved / dense peak at long sequences; default 0.655")
    sm_count: int = Field(DEFAULT_SM_COUNT, gt=0, le=MAX_GPUS, description="streaming multiprocessors (CUs); default 108")
    gemm_shape_fit: GemmShapeFit | None = Field(None, description="measured per-shape GEMM efficiency; None: the "
                                                "nameplate eff(m) curve from gemm_efficiency")
    host_link: str = Field(DEFAULT_HOST_LINK, description="link profile of the host interface; default pcie4")
    generic_aliases: tuple[str, ...] = Field((), description="aliases that also fit other variants ('H100' for "
                                             "SXM, PCIe, NVL): an answer reached through one says which it took "
                                             "(one not among aliases is never matched)")
    note: str = Field("", description="said in every answer on this GPU (e.g. what one 'GPU' is)")
    sources: dict[str, str]

    @property
    def has_bf16(self) -> bool:
        """bf16 tensor math exists (Ampere and later, CDNA 2 and later; not Volta V100 or Turing T4)."""
        return "bf16" in self.peak_flops

    def dense_peak(self, dtype: Literal["bf16", "fp16", "fp32"]) -> float:
        """The dense tensor peak a ``dtype`` matmul is counted at, for the throughput model
        (``throughput.compute_rates``) and the check on published rates (``runs``): a card with one
        16-bit figure (the validator requires one) is counted at it in both 16-bit formats, and one
        without an fp32 figure at a sixteenth of its bf16 one."""
        pf = self.peak_flops
        bf16 = pf.get("bf16", pf.get("fp16"))
        return {"bf16": bf16, "fp16": pf.get("fp16", bf16), "fp32": pf.get("fp32", bf16 / 16)}[dtype]

    @model_validator(mode="after")
    def _every_number_sourced(self) -> "GPUProfile":
        required = {"memory_bytes", "peak_flops", "memory_bandwidth_bytes_per_s", "default_host_ram_bytes"}
        required |= {f for f in OPTIONAL_GPU_FIELDS if f in self.model_fields_set}
        missing = sorted(required - set(self.sources))
        if missing:
            raise ValueError(f"sources lacks {', '.join(missing)}")
        if "bf16" not in self.peak_flops and "fp16" not in self.peak_flops:
            raise ValueError("peak_flops needs bf16 or fp16")
        return self


class LinkProfile(_Frozen):
    """One interconnect tier. Bandwidth is per direction, per GPU (intra) or per NIC (inter)."""

    name: str
    display_name: str
    aliases: tuple[str, ...] = ()
    kind: Literal["pcie", "nvlink", "infinity_fabric", "infiniband", "ethernet", "roce"]
    scope: Literal["intra_node", "inter_node"]
    bandwidth_bytes_per_s: float = Field(gt=0, le=MAX_LINK_BYTES_PER_S, description="nameplate, per direction")
    latency_s: float = Field(gt=0, le=MAX_LATENCY_S, description="per-collective start-up latency alpha")
    efficiency: float = Field(gt=0, le=1, description="achievable bus bandwidth / nameplate")
    peer_to_peer: bool = True
    nccl_channels: int = Field(DEFAULT_NCCL_CHANNELS, gt=0, le=MAX_GPUS,
                                       description="NCCL channels a communicator rings over this fabric; default 4")
    nccl_ll_max_bytes_per_s: float | None = Field(
        None, gt=0, le=MAX_LINK_BYTES_PER_S, description="NCCL's cap on the LL protocol's bus bandwidth inside one "
        "node (tuning.cc llMaxBws, by GPU generation); None: no cap")
    mesh_peer_links: int | None = Field(
        None, gt=0, le=MAX_GPUS, description="a full mesh: the bandwidth is this many peer links per GPU, "
        "of which a g-GPU ring uses g - 1 (AMD xGMI); None: a switch, the same for any group")
    nccl_net_latency_s: float | None = Field(
        None, ge=0, le=MAX_LATENCY_S, description="the latency an NCCL net plugin reports for this NIC "
        "(ncclNetProperties.latency), which NCCL adds to every inter-node step, twice for Simple; None: "
        "NCCL's own IB/socket transports, which report 0")
    sources: dict[str, str]

    @model_validator(mode="after")
    def _every_number_sourced(self) -> "LinkProfile":
        required = {"bandwidth_bytes_per_s", "latency_s", "efficiency"}
        required |= {"nccl_channels", "nccl_ll_max_bytes_per_s", "mesh_peer_links", "nccl_net_latency_s"} & self.model_fields_set
        missing = sorted(required - set(self.sources))
        if missing:
            raise ValueError(f"sources lacks {', '.join(missing)}")
        return self

    @property
    def achievable_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency


class Cluster(_Frozen):
    gpu: GPUProfile
    gpus_per_node: PositiveInt
    nodes: PositiveInt = 1
    intra_link: LinkProfile
    inter_link: LinkProfile
    nics_per_node: PositiveInt
    host_ram_bytes_per_node: PositiveInt
    capacity_only: bool = Field(False, description="GPU given only by memory size ('24GB')")
    gpu_text: str = Field("", description="the GPU as the user typed it ('h100', '24 GB')")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def label(self) -> str:
        gpu = f"{self.gpu.nominal_memory_gb}GB" if self.capacity_only else self.gpu.name
        if self.nodes > 1:
            return f"{self.nodes}x{self.gpus_per_node}x{gpu}"
        return f"{self.gpus_per_node}x{gpu}"


GPU_KIND, LINK_KIND = "hardware_profiles/gpus", "hardware_profiles/links"  # folders and catalogues (profile_index)


def gpu_profiles() -> tuple[GPUProfile, ...]:
    return load_all(GPU_KIND, GPUProfile)


def link_profiles() -> tuple[LinkProfile, ...]:
    return load_all(LINK_KIND, LinkProfile)


def get_gpu(name: str) -> GPUProfile:
    """The GPU profile of a name or alias (validated alone: the catalogue's index finds it)."""
    return profile_of(GPU_KIND, find_entry(GPU_KIND, name, "gpu"))


def get_link(name: str, field: str = "link") -> LinkProfile:
    return profile_of(LINK_KIND, find_entry(LINK_KIND, name, field))


# Tensor-core clock under a power limit below the card's TDP: dynamic power P ≈ C·V²·f with the
# supply voltage rising about linearly with the clock over the DVFS range, so P ∝ f³ and a
# power-bound matmul runs at f ∝ P^(1/3) (the cube rule of CMOS DVFS: Mudge, "Power: a first-class
# architectural design constraint", IEEE Computer 34(4), 2001). Cross-check against NVIDIA's
# datasheets, not a fit: the same Hopper die at 400 W (H100 NVL, 835 dense bf16 TFLOPS) against
# 700 W (H100 SXM, 989): (400/700)^(1/3) = 0.830, datasheet ratio 0.845. ASSUMPTION: large GEMMs
# and attention are power-bound at the TDP too (what the profile's MAMF was measured at), leakage
# is not separated, and HBM-bound kernels draw less than the limit (their rate is unchanged).
POWER_CLOCK_EXPONENT = 1.0 / 3.0


def power_limit_clock_factor(limit_watts: float, tdp_watts: float | None) -> float:
    """The tensor-core rate at ``limit_watts`` relative to the TDP (``POWER_CLOCK_EXPONENT``); 1 for
    a limit at or above the TDP or a profile without one."""
    if not tdp_watts or limit_watts >= tdp_watts:
        return 1.0
    return (limit_watts / tdp_watts) ** POWER_CLOCK_EXPONENT


def at_power_limit(gpu: GPUProfile, limit_watts: float) -> tuple[GPUProfile, float]:
    """The GPU run at a power limit below its TDP, every tensor peak scaled by
    ``power_limit_clock_factor`` (matmuls and attention slow down; HBM bandwidth does not), and
    that factor, which a caller states where it assumed the limit."""
    factor = power_limit_clock_factor(limit_watts, gpu.tdp_watts)
    if factor == 1.0:
        return gpu, factor
    return gpu.model_copy(update={"peak_flops": {k: v * factor for k, v in gpu.peak_flops.items()}}), factor


# GPU families, by profile-name prefix: the published-runs report groups its tokens/s errors by
# them (validation/tokens.py) and a tokens/s band is looked up by them (``ThroughputBand.fractions``),
# so an H100 PCIe answer carries what the H100 SXM runs showed. Longer prefixes first ("l40" before
# "l4"); a profile outside these is a family of its own.
GPU_FAMILIES = ("a100", "h100", "h200", "b200", "gh200", "mi300", "mi250", "v100", "a10g", "l40", "l4")


def gpu_family(gpu_name: str) -> str:
    """The family of a GPU profile's name (``GPU_FAMILIES``; the name itself outside them)."""
    return next((family for family in GPU_FAMILIES if gpu_name.startswith(family)), gpu_name)


def gpu_for_capacity(nominal_gb: float) -> GPUProfile:
    """A GPU named only by its memory ('24GB'): the built-in profile with that nominal capacity.

    ASSUMPTION: among GPUs of equal capacity the most common training card is listed first in
    ``CAPACITY_DEFAULTS``; its compute and link figures stand in, and the answer says which. A
    capacity no card people train on has ('64GB': only an MI250X GCD, half a package) is refused
    with the capacities that do stand for a card, rather than answered for an unrelated one.
    """
    gpus = entries(GPU_KIND)
    if float(nominal_gb).is_integer():  # '24.5GB' must not fall through to the 24 GB cards
        size = int(nominal_gb)
        for name in CAPACITY_DEFAULTS.get(size, ()):
            return get_gpu(name)
        for gpu in gpus:  # a size CAPACITY_DEFAULTS does not list, e.g. a user profile
            if gpu.nominal_memory_gb == size and gpu.name not in NOT_A_CAPACITY:
                return profile_of(GPU_KIND, gpu)
    sizes = sorted({g.nominal_memory_gb for g in gpus if g.name not in NOT_A_CAPACITY})
    raise ShardplanError("gpus", f"{nominal_gb:g}GB", f"no GPU profile stands for that capacity; name the card, "
                                                      f"or one of {', '.join(map(str, sizes))} GB ({APPLE_NOTE})")


# ASSUMPTION per capacity: among GPUs of equal memory, the card people most often train on is
# listed first; its compute and link figures stand in and the answer says which (gpu_for_capacity).
# 12 GB: the RTX 3060 of hobby fine-tuning; 16 GB: the T4 of the free Colab / Kaggle tiers (no
# bf16: fp16-mixed is chosen, and said); 24 GB: the RTX 4090 of single-box fine-tuning; 96 GB: the
# H20, an 8-GPU HGX board, because 'Nx96GB' describes GPUs sharing a box, which a
# one-superchip-per-node GH200 is not.
# 128 GB names no torch device: an MI250X package is two 64 GB GCDs (write 'Nx64GB' or 'Nxmi250x').
CAPACITY_DEFAULTS: dict[int, tuple[str, ...]] = {
    10: ("rtx3080",),
    12: ("rtx3060", "rtx4070", "rtx4070ti", "rtx3080-12gb"),
    16: ("t4", "v100-16gb", "rtx4060ti", "rtx4080", "rtx-a4000", "rtx5080"),
    24: ("rtx4090", "rtx3090", "a10g", "l4", "rtx-a5000", "rx7900xtx"),
    32: ("rtx5090", "v100-32gb"),
    40: ("a100-40gb",),
    48: ("l40s", "rtx6000-ada", "rtx-a6000", "l40"),
    80: ("h100-sxm", "a100-80gb"),
    96: ("h20", "gh200-96gb"),
    141: ("h200",),
    144: ("gh200-144gb",),
    180: ("b200",),
    192: ("mi300x",),
    256: ("mi325x",),
}
# Profiles a bare capacity never stands for: a 64 GB MI250X GCD is half of a package nobody buys by
# the GCD; '1x64GB' is far more often a Mac's unified memory (not supported) or a typo.
NOT_A_CAPACITY = frozenset({"mi250x"})
# Apple silicon: torch's MPS backend has no NCCL, FSDP or DeepSpeed, the subject of every answer.
APPLE_WORDS = frozenset({"mps", "apple", "mac", "macbook", "m1", "m2", "m3", "m4", "m1max", "m2max", "m3max", "m4max",
                         "m1ultra", "m2ultra", "m3ultra", "m4pro", "m3pro", "m2pro", "m1pro"})
APPLE_NOTE = "Apple silicon / MPS is not supported: shardplan plans CUDA and ROCm FSDP/DeepSpeed training"


# The one grammar of a GPU string: [NODES SEP] COUNT SEP GPU, where SEP is 'x', '×' or '*' (spaces
# around it allowed) or plain whitespace, and GPU is a profile name/alias or a capacity ('24GB',
# '24 GB'). 'GB' alone is never a GPU, so '4x24 GB' is 4 GPUs of 24 GB, not 24 GPUs of 'GB'.
_SEP = r"(?:\s*[x×*]\s*|\s+)"
_GPUS = re.compile(rf"^\s*(?:(\d+){_SEP})?(\d+){_SEP}((?!gi?b\s*$)\S.*?)\s*$", re.IGNORECASE)
_ONE_LEVEL = re.compile(rf"^\s*(\d+){_SEP}(\S.*?)\s*$", re.IGNORECASE)
_CAPACITY_GPU = re.compile(r"^(\d+(?:\.\d+)?)\s*gi?b?$", re.IGNORECASE)
# ASSUMPTION: no training cluster reaches a million GPUs (the largest announced hold a few hundred
# thousand); a count above it is a typo, refused before any arithmetic on it (limits.MAX_GPUS).
GPUS_GRAMMAR = "COUNTxGPU or NODESxCOUNTxGPU, e.g. '8xh100-sxm', '8 h100', '4x24GB', '2x8xa100-80gb'"


def _scoped_link(name: str, scope: str, field: str) -> LinkProfile:
    """A link profile that must serve the given tier (NVLink cannot join nodes, InfiniBand is not intra-node)."""
    link = get_link(name, field)
    if link.scope != scope:
        raise ShardplanError(field, name, f"is an {link.scope.replace('_', '-')} link; "
                                          f"{field} needs an {scope.replace('_', '-')} one")
    return link


def _bounded_count(digits: str | None, text: str, what: str) -> int:
    """A GPU or node count from its digits, refused above ``MAX_GPUS`` before it is converted (a
    thousand-digit count must not reach int() or any loop)."""
    if digits is None:
        return 1
    if len(digits.lstrip("0")) > len(str(MAX_GPUS)) or int(digits) > MAX_GPUS:
        raise ShardplanError("gpus", text, f"{what} above {MAX_GPUS:,} is not a cluster shardplan plans for")
    count = int(digits)
    if count < 1:
        raise ShardplanError("gpus", text, "GPU and node counts must be at least 1")
    return count


def even_layout(count: int, node_size: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``count`` GPUs in equal nodes of at most ``node_size``: the largest
    divisor of ``count`` not above ``node_size`` fills each node. Searches at most ``node_size`` values."""
    per_node = next(d for d in range(min(node_size, count), 0, -1) if count % d == 0)
    return count // per_node, per_node


def default_nics(gpu: GPUProfile, gpus_per_node: int) -> int:
    """NICs of a node of ``gpus_per_node`` such GPUs: the profile's (a DGX-1 has 4 EDR ports for 8
    V100, a cloud instance one network interface), never more than one per GPU; without one, one per
    GPU on 8-GPU platforms (DGX/HGX: a ConnectX per GPU) and one otherwise."""
    if gpu.default_nics_per_node is not None:
        return max(1, min(gpu.default_nics_per_node, gpus_per_node))
    return max(1, gpus_per_node if gpu.default_gpus_per_node >= 8 else 1)


def _named_gpu(gpu_text: str) -> GPUProfile | None:
    """The profile a GPU phrase names ('7900xtx', 'h100', '24GB'), None where it names none."""
    try:
        return _gpu_of(gpu_text, gpu_text)
    except ShardplanError:
        return None


def _gpu_of(gpu_text: str, text: str) -> GPUProfile:
    """The GPU of a phrase's GPU part: a capacity ('24GB'), a card named by digits ('4090'), a name."""
    if normalize(gpu_text) in APPLE_WORDS:
        raise ShardplanError("gpus", text, APPLE_NOTE)
    capacity = _CAPACITY_GPU.match(gpu_text)
    if capacity:
        return gpu_for_capacity(float(capacity.group(1)))
    if gpu_text.isdigit():  # '4x24': a capacity without its unit, unless a card is named by digits ('4090')
        try:
            return get_gpu(gpu_text)
        except ShardplanError:
            raise ShardplanError("gpus", text, f"'{gpu_text}' is neither a GPU name nor a capacity; write "
                                               f"'{gpu_text}GB' for cards of {gpu_text} GB") from None
    return get_gpu(gpu_text)


def gpu_without_count(text: str) -> GPUProfile | None:
    """The GPU a phrase with no count names ('h100', '4090', 'RTX 4090'), else None: ``fit`` then
    looks for the fewest GPUs that fit (a phrase with a count goes to ``parse_gpus``)."""
    text = str(text).strip()
    if not text or text[0].isdigit() and _GPUS.match(text):
        return None
    if normalize(text) in APPLE_WORDS:
        raise ShardplanError("gpus", text, APPLE_NOTE)
    return _named_gpu(text)


def _groups(text: str) -> tuple[str | None, str, str]:
    """(nodes, count, GPU) of a GPU phrase. A two-number reading whose GPU part is a card's name is
    taken first: '1x7900xtx' is one RX 7900 XTX, not 1 node of 7900 'xtx' cards."""
    single = _ONE_LEVEL.match(text)
    if single and _named_gpu(single.group(2)) is not None:
        return None, single.group(1), single.group(2)
    match = _GPUS.match(text)
    if not match:
        if normalize(text) in APPLE_WORDS or any(normalize(w) in APPLE_WORDS for w in re.split(r"[\sx×*]+", text)):
            raise ShardplanError("gpus", text, APPLE_NOTE)
        if _named_gpu(text) is not None:
            raise ShardplanError("gpus", text, f"no GPU count; write '8x{text}' ('shardplan fit' without a count "
                                               f"finds the fewest GPUs that fit)")
        raise ShardplanError("gpus", text, f"expected {GPUS_GRAMMAR}")
    return match.groups()


def parse_gpus(
    text: str,
    *,
    intra_link: str | None = None,
    inter_link: str | None = None,
    host_ram_bytes_per_node: int | None = None,
    nics_per_node: int | None = None,
) -> Cluster:
    """'4x24GB', '4 x 24 GB', '8xh100-sxm', '8 h100', '8×H100', '2x8xa100-80gb' (nodes × GPUs per
    node × GPU), '1xa10g', '1x7900xtx'. One grammar (``_GPUS``); counts are bounded by ``MAX_GPUS``.

    A bare count above the GPU's usual node size is split into nodes of that size.
    """
    nodes_text, count_text, gpu_text = _groups(str(text))
    count = _bounded_count(count_text, text, "a GPU count")
    nodes = _bounded_count(nodes_text, text, "a node count")
    if count * nodes > MAX_GPUS:
        raise ShardplanError("gpus", text, f"{count * nodes:,} GPUs is above the {MAX_GPUS:,} shardplan plans for")
    capacity = _CAPACITY_GPU.match(gpu_text)
    gpu = _gpu_of(gpu_text, text)
    per_node = count
    node_size = gpu.default_gpus_per_node
    if nodes_text is None and count > node_size:
        if count % node_size:
            even_nodes, even_per_node = even_layout(count, node_size)
            raise ShardplanError(
                "gpus", text,
                f"{count} GPUs do not fill whole {node_size}-GPU {gpu.name} nodes; write NODESxCOUNTxGPU, "
                f"e.g. '{even_nodes}x{even_per_node}x{gpu_text}'",
            )
        per_node, nodes = node_size, count // node_size
    return Cluster(
        gpu=gpu,
        gpus_per_node=per_node,
        nodes=nodes,
        intra_link=_scoped_link(intra_link or gpu.default_intra_link, "intra_node", "intra_link"),
        inter_link=_scoped_link(inter_link or gpu.default_inter_link, "inter_node", "inter_link"),
        nics_per_node=bounded_int(nics_per_node, "nics_per_node", 1, MAX_GPUS) if nics_per_node else default_nics(gpu, per_node),
        host_ram_bytes_per_node=(checked_int("host_ram", host_ram_bytes_per_node) if host_ram_bytes_per_node is not None
                                 else gpu.default_host_ram_bytes),
        capacity_only=bool(capacity),
        gpu_text=gpu_text,
    )


def cluster_notes(cluster: Cluster) -> list[str]:
    """What an answer must say about the GPU it assumed: a capacity that stood for a card, a
    family name that stood for one variant ('h100' -> h100-sxm), and the profile's own note."""
    gpu, notes = cluster.gpu, []
    if cluster.capacity_only:
        notes.append(f"gpus: '{cluster.gpu_text}' names only a capacity; using the {gpu.display_name} profile "
                     f"({gpu.memory_bytes / 2**30:.2f} GiB usable) for it")
    elif any(normalize(a) == normalize(cluster.gpu_text) for a in gpu.generic_aliases):
        key = normalize(cluster.gpu_text)
        others = [g.name for g in entries(GPU_KIND) if g.name != gpu.name and key in normalize(g.name)]
        notes.append(f"gpus: '{cluster.gpu_text}' taken as {gpu.name} ({gpu.display_name}, "
                     f"{gpu.memory_bytes / 2**30:.2f} GiB usable)"
                     + (f"; name {' or '.join(others)} for another variant" if others else ""))
    if gpu.note:
        notes.append(f"gpus: {gpu.note}")
    return notes


PRECISION_FALLBACK = "fp16-mixed"


def check_precision(gpu: GPUProfile, precision: str) -> None:
    """bf16 precisions need bf16 tensor math: Volta (V100) and Turing (T4) have none (their
    datasheets list FP16 tensor rates only; torch may emulate bf16, far below any peak the model
    could use), so a bf16 precision on them is a one-line error that suggests fp16 mixed precision."""
    if str(precision).startswith("bf16") and not gpu.has_bf16:
        raise ShardplanError("precision", precision,
                             f"{gpu.display_name} has no bf16 tensor cores; use --precision {PRECISION_FALLBACK} "
                             f"(query word 'fp16'; HF Trainer fp16=True)")


def get_hardware(name: str) -> GPUProfile | LinkProfile:
    """A GPU or link profile by name; unknown names get one line listing both kinds."""
    key = normalize(name)
    for profile in (*gpu_profiles(), *link_profiles()):
        if key in {normalize(n) for n in (profile.name, *profile.aliases)}:
            return profile
    gpus, links = gpu_profiles(), link_profiles()
    owner = {n: p.name for p in (*gpus, *links) for n in (p.name, *p.aliases)}
    raise ShardplanError("hardware", name, f"unknown{did_you_mean(name, owner)}; GPUs: "
                                           f"{', '.join(sorted(g.name for g in gpus))}; links: "
                                           f"{', '.join(sorted(l.name for l in links))}")


__all__ = [
    "GPUProfile", "LinkProfile", "Cluster", "DEFAULT_GEMM_EFFICIENCY", "DEFAULT_ATTENTION_EFFICIENCY",
    "DEFAULT_SM_COUNT", "DEFAULT_HOST_LINK", "DEFAULT_NCCL_CHANNELS", "gpu_profiles", "link_profiles", "get_gpu", "get_link",
    "parse_gpus", "gpu_for_capacity", "cluster_notes", "check_precision", "get_hardware",
    "even_layout", "MAX_GPUS",
]
