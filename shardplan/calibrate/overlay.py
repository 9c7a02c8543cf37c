"""Calibrated hardware-profile overlay: fitted coefficients written atomically, loaded by the planner.

File format (JSON, ``schema: "shardplan.calibration/1"``)::

    {"schema": ..., "created": ISO date, "source": {torch, cpu/gpu, backend, ...},
     "measured_on": {"gpu": GPU profile, "gpu_name": torch's device name, "link": link profile,
                     "torch", "cuda", "nccl", "driver"} | null,
     "links":   [{"tier", "op", "world_size", "segments": [{"min_bytes", "max_bytes", "alpha_s",
                  "bandwidth_bytes_per_s"}], "r2_log", "max_rel_err", "n_points", "calibrated": true}],
     "compute": [{"dtype", "device", "f_max_flops_per_s", "m_half", "p", "peak_flops_per_s", "eff_max",
                  "max_rel_err", "sm_count", "calibrated": true}],
     "bandwidth": [{"kernel": "copy" | "add", "device", "dtype", "size_bytes", "bytes_per_s", "calibrated": true}],
     "allocator": {"cuda_context_bytes": int, "fragmentation_per_transient": {CLASS: {k, band_upper,
                   band_lower, runs}}, "calibrated": true} | null,
     "accuracy": {"classes": {CLASS: {"relative_error", "derivation", "source"}}, "stacks": {STACK: {...}},
                  "throughput": {...}} | null}     (errors measured on your runs; shardplan.formulas.accuracy_bands)

Link fits are used per size regime as fitted (``comm.link_rates``: each segment's α and bus
bandwidth B for the messages in its size range, α not rescaled to another ring length).
Every entry carries ``calibrated: true`` so a prediction can say it used calibrated rather than
nameplate numbers. Writing merges into an existing overlay (entries replaced by key). No torch.
``measured_on`` says what the numbers were measured on; ``calibrate/foreign.py`` refuses to apply
them to another GPU or link (docs/calibration.md).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from shardplan.calibrate.results import write_json_atomic
from shardplan.formulas.accuracy_bands import AccuracyOverlay
from shardplan.inputs.allocator_profile import FragmentationCoefficient
from shardplan.support.errors import ShardplanError
from shardplan.support.input_files import read_json
from shardplan.support.limits import MAX_BYTES, MAX_FLOPS_PER_S, MAX_GPUS, MAX_LATENCY_S, MAX_LINK_BYTES_PER_S, MAX_MEMORY_BYTES_PER_S, MAX_PROFILE_FILE_BYTES

SCHEMA = "shardplan.calibration/1"


class _Frozen(BaseModel):
    # NaN and ±inf are never a measurement: refused on load and before a fit is written (json.dumps
    # would write them as NaN/Infinity, which is not JSON)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class LinkSegment(_Frozen):
    min_bytes: int = Field(ge=0, le=MAX_BYTES)
    max_bytes: int = Field(ge=0, le=MAX_BYTES)
    alpha_s: float = Field(ge=0, le=MAX_LATENCY_S)
    bandwidth_bytes_per_s: float | None = Field(
        gt=0, le=MAX_LINK_BYTES_PER_S, description="bus bandwidth B; null: a latency-bound regime, t = α")


class LinkCalibration(_Frozen):
    tier: str
    op: Literal["all_gather", "reduce_scatter", "all_reduce"]
    world_size: int = Field(ge=2, le=MAX_GPUS)
    segments: tuple[LinkSegment, ...] = Field(min_length=1)
    r2_log: float
    max_rel_err: float
    n_points: int
    calibrated: Literal[True] = True

    @field_validator("segments")
    @classmethod
    def _last_has_bandwidth(cls, value):
        if value and value[-1].bandwidth_bytes_per_s is None:
            raise ValueError("the largest-size segment must have a bandwidth (plans use it for large messages)")
        return value

    def segment_for(self, size_bytes: int) -> LinkSegment:
        seg = self.segments[0]
        for s in self.segments:
            if size_bytes >= s.min_bytes:
                seg = s
        return seg


class ComputeCalibration(_Frozen):
    dtype: str
    device: str
    f_max_flops_per_s: float = Field(gt=0, le=MAX_FLOPS_PER_S)
    m_half: float = Field(ge=0)
    p: float = Field(1.0, gt=0)
    peak_flops_per_s: float | None = None
    eff_max: float | None = None
    max_rel_err: float
    n_points: int
    sm_count: int | None = Field(None, gt=0, description="the device's SMs as torch reports them")
    calibrated: Literal[True] = True


class BandwidthCalibration(_Frozen):
    """Achieved element-wise memory bandwidth (bytes read + written per second) of one kernel."""

    kernel: Literal["copy", "add"]
    device: str
    dtype: str
    size_bytes: int = Field(gt=0, le=MAX_BYTES, description="bytes of one operand")
    bytes_per_s: float = Field(gt=0, le=MAX_MEMORY_BYTES_PER_S)
    calibrated: Literal[True] = True


class AllocatorCalibration(_Frozen):
    """Measured caching-allocator terms (allocator.py): the CUDA context and the fragmentation
    coefficients per allocator class; what is left out keeps the shipped measurement."""

    cuda_context_bytes: int | None = Field(None, ge=0)
    fragmentation_per_transient: dict[str, FragmentationCoefficient] | None = None
    calibrated: Literal[True] = True

    @field_validator("fragmentation_per_transient")
    @classmethod
    def _known_classes(cls, value):
        from shardplan.formulas.allocator import CLASSES

        for name in value or {}:
            if name not in CLASSES:
                raise ValueError(f"unknown allocator class {name!r}; known: {', '.join(CLASSES)}")
        return value


class MeasuredOn(_Frozen):
    """The machine an overlay's numbers were measured on (None: not known to the writer)."""

    gpu: str | None = Field(None, description="shardplan GPU profile name of the device, when one has its name")
    gpu_name: str | None = Field(None, description="the device's name as torch reports it")
    link: str | None = Field(None, description="link profile the collectives ran over (calibrate collectives --link)")
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None


def measured_on(source: dict, link: str | None = None) -> dict:
    """``measured_on`` from the environment a calibrate command recorded (``cli._env``): the device's
    name resolved to a GPU profile through the profiles' aliases (torch's 'NVIDIA H100 80GB HBM3' is
    an alias of h100-sxm), and the versions."""
    from shardplan.inputs.hardware import GPU_KIND
    from shardplan.inputs.profile_index import lookup

    name = source.get("gpu") if isinstance(source.get("gpu"), str) else None
    entry = lookup(GPU_KIND, name) if name else None
    versions = {k: str(source[k]) for k in ("torch", "cuda", "nccl", "driver") if source.get(k) is not None}
    return {"gpu": entry.name if entry else None, "gpu_name": name, "link": link, **versions}


class Calibration(_Frozen):
    schema_: Literal["shardplan.calibration/1"] = Field(SCHEMA, alias="schema")
    created: str
    source: dict = Field(default_factory=dict)
    measured_on: MeasuredOn | None = None
    links: tuple[LinkCalibration, ...] = ()
    compute: tuple[ComputeCalibration, ...] = ()
    bandwidth: tuple[BandwidthCalibration, ...] = ()
    allocator: AllocatorCalibration | None = None
    accuracy: AccuracyOverlay | None = None

    def allocator_model(self):
        """The shipped ``allocator_profile.AllocatorModel`` with this overlay's measured terms in place."""
        from shardplan.inputs.allocator_profile import default_allocator

        base = default_allocator()
        if self.allocator is None:
            return base
        frag = dict(base.fragmentation_per_transient)
        frag.update(self.allocator.fragmentation_per_transient or {})
        context = self.allocator.cuda_context_bytes
        return base.model_copy(update={"fragmentation_per_transient": frag, "calibrated": True,
                                       "cuda_context_bytes": base.cuda_context_bytes if context is None else context})

    def link(self, op: str, tier: str = "intra_node", world_size: int | None = None) -> LinkCalibration | None:
        cands = [l for l in self.links if l.op == op and l.tier == tier]
        if world_size is not None:
            exact = [l for l in cands if l.world_size == world_size]
            if exact:
                return exact[0]
            cands.sort(key=lambda l: abs(l.world_size - world_size))
        return cands[0] if cands else None


def load_calibration(path) -> Calibration:
    """Load and validate an overlay; errors name the file, field and value."""
    p = Path(path)
    data = read_json(p, "calibration", MAX_PROFILE_FILE_BYTES)
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, p.name) from None


def _one_line(exc: ValidationError, where: str) -> ShardplanError:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(root)"
    value = err.get("input")
    return ShardplanError(f"{where}:{loc}", "{...}" if isinstance(value, (dict, list)) else value, err["msg"])


def _key_link(d):
    return (d["tier"], d["op"], d["world_size"])


def _key_compute(d):
    return (d["dtype"], d["device"])


def _key_bandwidth(d):
    return (d["kernel"], d["device"], d["dtype"])


def _merged(old_entries, new_fits, key) -> dict:
    """Existing overlay entries by key, replaced by the new fits (tagged calibrated, no residuals)."""
    merged = {key(d): d for d in old_entries}
    for fit in new_fits:
        d = fit.to_dict() if hasattr(fit, "to_dict") else dict(fit)
        d.pop("residuals", None)
        d["calibrated"] = True
        merged[key(d)] = d
    return merged


def write_calibration(path, links=(), compute=(), allocator: dict | None = None, source: dict | None = None,
                      merge: bool = True, bandwidth=(), link: str | None = None, force: bool = False) -> Calibration:
    """Write (merging into an existing file) the overlay atomically; returns what was written.

    ``links`` / ``compute`` / ``bandwidth`` take LinkFit / ComputeFit / BandwidthSample objects or
    dicts of the same fields; ``link``: the link profile the collectives ran over, when known;
    ``force``: a read-only file is replaced (and stays read-only)."""
    p = Path(path)
    old = load_calibration(p).model_dump(by_alias=True, mode="json") if merge and p.exists() else {}
    links_d = _merged(old.get("links", []), links, _key_link)
    comp_d = _merged(old.get("compute", []), compute, _key_compute)
    bw_d = _merged(old.get("bandwidth", []), bandwidth, _key_bandwidth)
    alloc = old.get("allocator")
    if allocator is not None:
        alloc = {**allocator, "calibrated": True}
    data = {"schema": SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "source": {**old.get("source", {}), **(source or {})},
            "measured_on": _merged_measured_on(old.get("measured_on"), source or {}, link, p),
            "links": [links_d[k] for k in sorted(links_d)], "compute": [comp_d[k] for k in sorted(comp_d)],
            "bandwidth": [bw_d[k] for k in sorted(bw_d)],
            "allocator": alloc, "accuracy": old.get("accuracy")}
    try:  # validate before anything touches the disk: a degenerate fit is refused, nothing written
        cal = Calibration.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, f"{p.name} (not written)") from None
    write_json_atomic(p, cal.model_dump(by_alias=True, mode="json"), force=force)
    return cal


def _merged_measured_on(old: dict | None, source: dict, link: str | None, path: Path) -> dict:
    """The new measurement's machine, keeping what the old file said and the new one does not; an
    overlay of one GPU (or link) never gains another's entries."""
    new = {k: v for k, v in measured_on(source, link).items() if v is not None}
    for key in ("gpu", "link"):
        if (old or {}).get(key) and new.get(key) and old[key] != new[key]:
            raise ShardplanError("out", str(path), f"holds measurements on {key} {old[key]}; these are on "
                                                   f"{new[key]}: write them to another file")
    return {**(old or {}), **new}
