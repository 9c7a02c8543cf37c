"""Achieved matmul throughput per dtype and size, element-wise memory bandwidth, and the efficiency
curve the throughput model uses.

Matmul measurement (GEMMs, not launches): C = A @ B with square m×m operands (FLOPs = 2m³), sizes up
to 16k on GPUs; after ``warmup`` untimed calls, ``iters`` (≥ 50 by default) back-to-back matmuls
run between two CUDA events (CPU: one host timer around the batch), cycling through a pool of
operand pairs large enough that they do not stay in L2 (``ROTATE_BYTES``), so a small GEMM is not
timed on cached operands and a kernel launch is not what is timed. Per dtype: bf16, fp16, fp32
(TF32 off), tf32 (fp32 operands, ``torch.backends.cuda.matmul.allow_tf32``), fp8 (e4m3 operands,
``torch._scaled_mm`` with unit scales and a bf16 output, compute capability ≥ 8.9).

Element-wise bandwidth: ``dst.copy_(src)`` (2 bytes moved per byte of operand: one read, one write)
and ``torch.add(a, b, out=c)`` (3: two reads, one write), timed the same way; the throughput model's
element-wise time is bytes / this bandwidth (``throughput.compute_rates``).

Curve (documented form, a log-logistic / Hill saturation):

    achieved(m) = F_max / (1 + (m_half / m)^p)          eff(m) = eff_max / (1 + (m_half / m)^p)

with eff_max = F_max / peak when a nameplate peak is given. p = 1 is the classic
"overhead + under-filled machine" curve F_max·m/(m + m_half); measured CPU and GPU GEMMs rise
faster than that at small m (tiles not filled, kernel launch), so p is fitted too. For each p on a
grid (0.5 … 4) the fit is linear in m^-p: 1/achieved = 1/F_max + (m_half^p/F_max)·m^-p, weighted to
minimise relative error; the p with the smallest squared relative error wins. A fit whose largest
measured size reaches less than ``SATURATION`` of the fitted F_max (or that shows no saturation at
all) is refused: F_max would be an extrapolation. For a GEMM of shape (M, N, K) the planner may use
m = (M·N·K)^(1/3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from shardplan.calibrate.timing import seconds_per_call
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_FLOPS_PER_S, MAX_MATMUL_SIZE, bounded_float, checked_float


@dataclass
class MatmulSample:
    dtype: str
    m: int
    time_s: float
    device: str = "cpu"

    @property
    def flops(self) -> float:
        return 2.0 * self.m**3

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s


SATURATION = 0.9                 # largest size must reach this fraction of the fitted F_max
DEFAULT_ITERS = 50               # back-to-back matmuls per size
DEFAULT_WARMUP = 5
ROTATE_BYTES = 256 << 20         # operand pool per size on GPUs: ~5x an H100's 50 MB L2
MAX_ROTATE = 512               # bounded host-side Python work per size
GPU_SIZES = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
CPU_SIZES = (64, 128, 256, 512, 1024)
GPU_DTYPES = ("bfloat16", "float16", "float32", "tf32", "float8_e4m3fn")
CPU_DTYPES = ("float32", "bfloat16")
BANDWIDTH_BYTES = {"cuda": (1 << 28, 1 << 30), "cpu": (1 << 22, 1 << 24)}   # bytes of one operand
BYTES_MOVED = {"copy": 2, "add": 3}   # per byte of one operand: reads + writes


@dataclass
class BandwidthSample:
    kernel: str
    device: str
    dtype: str
    size_bytes: int
    time_s: float

    @property
    def bytes_per_s(self) -> float:
        return BYTES_MOVED[self.kernel] * self.size_bytes / self.time_s

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "device": self.device, "dtype": self.dtype, "size_bytes": self.size_bytes,
                "bytes_per_s": self.bytes_per_s}


@dataclass
class ComputeFit:
    dtype: str
    device: str
    f_max_flops_per_s: float
    m_half: float
    p: float
    peak_flops_per_s: float | None
    eff_max: float | None
    max_rel_err: float
    n_points: int
    residuals: list[float] = field(default_factory=list)
    sm_count: int | None = None

    def achieved_flops_per_s(self, m):
        m = np.asarray(m, dtype=float)
        return self.f_max_flops_per_s / (1.0 + (self.m_half / m) ** self.p)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_samples(samples: list[MatmulSample]) -> None:
    """Each sample a whole size m >= 1 timed in a finite positive time, and at least 3 distinct
    sizes: the fit divides by m and by the rate, and a curve through fewer than 3 sizes (or through
    m = 0, where m^-p is infinite) is not determined (numpy's least squares then fails to converge
    or answers from noise)."""
    if isinstance(samples, (str, bytes)) or not all(isinstance(s, MatmulSample) for s in samples):
        raise ShardplanError("samples", type(samples).__name__, "expected a list of compute.MatmulSample")
    for s in samples:
        if isinstance(s.m, bool) or not isinstance(s.m, (int, np.integer)) or not 1 <= s.m <= MAX_MATMUL_SIZE:
            raise ShardplanError(f"samples[matmul {s.dtype}].m", s.m, f"a matmul size must be a whole number in "
                                                                      f"[1, {MAX_MATMUL_SIZE:,}]")
        if isinstance(s.time_s, bool) or not isinstance(s.time_s, (int, float, np.floating)) \
                or not 0 < s.time_s <= 1e6 or not np.isfinite(s.time_s):  # range first: a huge int never meets float()
            raise ShardplanError(f"samples[matmul {s.dtype} m={s.m}].time_s", s.time_s,
                                 "a measured time must be a finite number of seconds > 0")
    sizes = sorted({int(s.m) for s in samples})
    if len(sizes) < 3:
        raise ShardplanError("samples", f"sizes {', '.join(map(str, sizes))}",
                             "need at least 3 distinct matmul sizes to fit (--size)")


def fit_efficiency(samples: list[MatmulSample], peak_flops_per_s: float | None = None,
                   max_rel_err: float = 0.5, min_saturation: float = SATURATION,
                   sm_count: int | None = None) -> ComputeFit:
    """Fit achieved(m) = F_max/(1 + (m_half/m)^p) to one dtype's samples; refuse (ShardplanError) a
    fit that does not describe them or whose largest size is below saturation."""
    # NaN compares false with everything: a NaN threshold would switch its check off (limits.FLOAT_RANGES)
    max_rel_err, min_saturation = checked_float("max_rel_err", max_rel_err), checked_float("min_saturation", min_saturation)
    if peak_flops_per_s is not None:
        peak_flops_per_s = bounded_float(peak_flops_per_s, "peak_flops_per_s", 1.0, MAX_FLOPS_PER_S)
    _check_samples(samples)
    if len({(s.dtype, s.device) for s in samples}) != 1:
        raise ShardplanError("samples", "mixed", "fit one dtype and device at a time")
    m = np.array([s.m for s in samples], dtype=float)
    f = np.array([s.flops_per_s for s in samples], dtype=float)
    best = None
    for p in np.arange(0.5, 4.01, 0.1):
        mp = m ** -p
        a = np.stack([f, f * mp], axis=1)  # minimise Σ((c0 + c1·m^-p)·f − 1)²
        (c0, c1), *_ = np.linalg.lstsq(a, np.ones_like(f), rcond=None)
        if c0 <= 0:  # 1/F_max <= 0: the rate is still rising like m^p, no saturation in range
            continue
        c1 = max(float(c1), 0.0)
        pred = 1.0 / (c0 + c1 * mp)
        sse = float(np.sum(((pred - f) / f) ** 2))
        if best is None or sse < best[0]:
            best = (sse, round(float(p), 2), float(c0), c1, pred)
    dtype, m_max = samples[0].dtype, int(m.max())
    if best is None:
        raise ShardplanError(f"fit[matmul {dtype}]", f"largest size m={m_max}",
                             "the measured rate has not started to saturate; measure larger sizes (--size)")
    _, p, c0, c1, pred = best
    f_max, m_half = 1.0 / c0, (c1 / c0) ** (1.0 / p) if c1 > 0 else 0.0
    rel = (pred - f) / f
    fit = ComputeFit(dtype, samples[0].device, float(f_max), float(m_half), p, peak_flops_per_s,
                     float(f_max / peak_flops_per_s) if peak_flops_per_s else None,
                     float(np.max(np.abs(rel))), len(m), [float(r) for r in rel], sm_count)
    reached = float(fit.achieved_flops_per_s(m_max) / f_max)
    if reached < min_saturation:
        raise ShardplanError(f"fit[matmul {dtype}]", f"largest size m={m_max}",
                             f"reaches {100 * reached:.0f} % of the fitted F_max (need >= "
                             f"{100 * min_saturation:.0f} %): F_max would be extrapolated; measure larger sizes (--size)")
    if fit.max_rel_err > max_rel_err:
        raise ShardplanError(f"fit[matmul {fit.dtype}]", f"max_rel_err={fit.max_rel_err:.2f}",
                             f"the curve F_max/(1+(m_half/m)^p) does not describe the measurements "
                             f"(limit {max_rel_err}); measure more iterations")
    return fit


def _check_dtype(dtype: str, device: str) -> None:
    import torch

    if dtype not in GPU_DTYPES:
        raise ShardplanError("dtype", dtype, f"expected one of {', '.join(GPU_DTYPES)}")
    if dtype == "tf32" and device != "cuda":
        raise ShardplanError("dtype", dtype, "TF32 exists on CUDA tensor cores only")
    if dtype.startswith("float8"):
        if device != "cuda" or torch.cuda.get_device_capability() < (8, 9):
            raise ShardplanError("dtype", dtype, "fp8 GEMMs (torch._scaled_mm) need a CUDA GPU with compute "
                                                 "capability >= 8.9")


def _matmul_fn(dtype: str, m: int, device: str, count: int):
    """A no-argument callable that runs the next matmul of a rotating pool of ``count`` operand pairs."""
    import itertools

    import torch

    if dtype.startswith("float8"):
        fp8 = getattr(torch, dtype)
        one = torch.ones((), device=device)
        # _scaled_mm wants A row-major and B column-major
        pairs = [(torch.randn(m, m, device=device).to(fp8), torch.randn(m, m, device=device).to(fp8).t())
                 for _ in range(count)]
        cycle = itertools.cycle(pairs)

        def run():
            a, b = next(cycle)
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return run
    tdtype = torch.float32 if dtype == "tf32" else getattr(torch, dtype)
    pairs = [(torch.randn(m, m, device=device, dtype=tdtype), torch.randn(m, m, device=device, dtype=tdtype))
             for _ in range(count)]
    out = torch.empty(m, m, device=device, dtype=tdtype)
    cycle = itertools.cycle(pairs)

    def run():
        a, b = next(cycle)
        return torch.matmul(a, b, out=out)
    return run


def _pool(pair_bytes: int, device: str) -> int:
    return 1 if device != "cuda" else int(min(MAX_ROTATE, max(2, -(-ROTATE_BYTES // max(pair_bytes, 1)))))


def measure_matmul(dtypes=None, sizes=None, warmup: int = DEFAULT_WARMUP, iters: int = DEFAULT_ITERS,
                   device: str | None = None, progress=None) -> list[MatmulSample]:
    """Achieved FLOP/s per (dtype, m): see the module docstring. Defaults: every dtype the device
    runs (GPU: bf16, fp16, fp32, tf32, fp8; CPU: fp32, bf16) at ``GPU_SIZES`` / ``CPU_SIZES``."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device == "cuda"
    if dtypes is None:
        dtypes = tuple(d for d in GPU_DTYPES if not d.startswith("float8") or torch.cuda.get_device_capability() >= (8, 9)) \
            if cuda else CPU_DTYPES
    sizes = sizes or (GPU_SIZES if cuda else CPU_SIZES)
    if iters < 1 or warmup < 0:
        raise ShardplanError("iters", iters, "need iters >= 1 and warmup >= 0")
    for dt in dtypes:
        _check_dtype(dt, device)
    out = []
    tf32_before = torch.backends.cuda.matmul.allow_tf32 if cuda else None
    try:
        for dt in dtypes:
            if cuda:  # fp32 is measured as true fp32, tf32 as fp32 operands on TF32 tensor cores
                torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
            esize = 1 if dt.startswith("float8") else (4 if dt == "tf32" else torch.empty((), dtype=getattr(torch, dt)).element_size())
            for m in sizes:
                fn = _matmul_fn(dt, m, device, _pool(2 * m * m * esize, device))
                for _ in range(warmup):
                    fn()
                s = MatmulSample(dt, m, seconds_per_call(fn, iters, device), device)
                out.append(s)
                fn = None  # free this size's operand pool before the next size allocates its own
                if progress:
                    progress(f"matmul {dt} m={m}: {s.flops_per_s / 1e12:.3f} TFLOP/s")
    finally:
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return out


def measure_bandwidth(kernels=("copy", "add"), sizes_bytes=None, dtype: str = "bfloat16", warmup: int = DEFAULT_WARMUP,
                      iters: int = DEFAULT_ITERS, device: str | None = None, progress=None) -> list[BandwidthSample]:
    """Element-wise memory bandwidth per kernel and operand size (see the module docstring)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes_bytes = sizes_bytes or BANDWIDTH_BYTES["cuda" if device == "cuda" else "cpu"]
    tdtype = getattr(torch, dtype)
    esize = torch.empty((), dtype=tdtype).element_size()
    out = []
    for kernel in kernels:
        if kernel not in BYTES_MOVED:
            raise ShardplanError("kernel", kernel, f"expected one of {', '.join(BYTES_MOVED)}")
        for size in sizes_bytes:
            n = max(1, size // esize)
            a = torch.ones(n, dtype=tdtype, device=device)
            b = torch.ones(n, dtype=tdtype, device=device)
            if kernel == "copy":
                def fn():
                    return b.copy_(a)
            else:
                c = torch.empty(n, dtype=tdtype, device=device)

                def fn():
                    return torch.add(a, b, out=c)
            for _ in range(warmup):
                fn()
            s = BandwidthSample(kernel, device, dtype, n * esize, seconds_per_call(fn, iters, device))
            out.append(s)
            if progress:
                progress(f"{kernel} {dtype} {s.size_bytes:,} B: {s.bytes_per_s / 1e9:.1f} GB/s")
    return out


def bandwidth_entries(samples: list[BandwidthSample]) -> list[dict]:
    """Overlay entries: per (kernel, device, dtype), the sample of the largest operand (the one
    that streams from DRAM/HBM rather than from cache)."""
    best: dict[tuple, BandwidthSample] = {}
    for s in samples:
        k = (s.kernel, s.device, s.dtype)
        if k not in best or s.size_bytes > best[k].size_bytes:
            best[k] = s
    return [best[k].to_dict() for k in sorted(best)]
