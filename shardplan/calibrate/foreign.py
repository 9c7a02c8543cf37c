"""Whether a calibration overlay may be applied to a query's cluster: its numbers were measured on
one GPU (and its collectives over one link); applied to another they are not that machine's rates
(an H100's matmul rate on an RTX 4090 gave MFU 125 %). A mismatch is a one-line error naming both,
or, with ``--force``, a warning line on stderr and a note in the answer.

What an overlay says it was measured on (first that answers): its ``measured_on`` (written by
``calibrate compute`` / ``collectives`` since issue 22), else the device of its compute or bandwidth
entries (torch's device name, resolved to a GPU profile through the profiles' aliases), else its
``source.gpu``. An overlay that names no GPU (imported nccl-tests logs, allocator-only overlays,
files written before ``measured_on``) is applied with a note saying it could not be checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shardplan.support.errors import ShardplanError
from shardplan.support.names import normalize


def measured_gpu(cal) -> tuple[str | None, str | None]:
    """(GPU profile name or None, the name the overlay gives) of the device it was measured on."""
    from shardplan.inputs.hardware import GPU_KIND
    from shardplan.inputs.profile_index import lookup

    on = cal.measured_on
    if on is not None and on.gpu:
        return on.gpu, on.gpu_name or on.gpu
    devices = [e.device for e in (*cal.compute, *cal.bandwidth) if e.device and e.device != "cpu"]
    gpu_name = (on.gpu_name if on is not None else None) or (devices[0] if devices else None) \
        or (cal.source.get("gpu") if isinstance(cal.source.get("gpu"), str) else None)
    if not gpu_name:
        return None, None
    entry = lookup(GPU_KIND, gpu_name)
    return (entry.name if entry else None), gpu_name


def _same_gpu(profile: str | None, shown: str, gpu) -> bool:
    if profile is not None:
        return profile == gpu.name
    return normalize(shown) in {normalize(n) for n in (gpu.name, gpu.display_name, *gpu.aliases)}


def mismatches(cal, cluster) -> list[str]:
    """What differs between the machine ``cal`` was measured on and ``cluster`` ('' entries none)."""
    out = []
    profile, shown = measured_gpu(cal)
    if shown and not _same_gpu(profile, shown, cluster.gpu):
        out.append(f"measured on {profile or shown}, this query's GPU is {cluster.gpu.name}")
    link = cal.measured_on.link if cal.measured_on is not None else None
    tiers = {entry.tier for entry in cal.links}
    ours = {"intra_node": cluster.intra_link.name, "inter_node": cluster.inter_link.name}
    if link and cal.links and all(ours.get(t) != link for t in tiers):
        out.append(f"collectives measured over {link}, this query's links are "
                   f"{' / '.join(ours[t] for t in sorted(tiers) if t in ours)}")
    return out


def checked_overlay(cal, cluster, path: Path | str, force: bool) -> list[str]:
    """The notes an answer gives about applying ``cal`` to ``cluster``; a ShardplanError naming both
    machines where they differ and ``force`` is off (with it, also one stderr warning line)."""
    differ = mismatches(cal, cluster)
    if differ and not force:
        raise ShardplanError("calibration", str(path), f"{'; '.join(differ)}: its rates are not this "
                                                       "machine's; calibrate on it, or pass --force to apply it anyway")
    if differ:
        message = f"--calibration {path}: {'; '.join(differ)}; applied anyway (--force)"
        print(f"shardplan: warning: {message}", file=sys.stderr)
        return [f"calibration: {'; '.join(differ)}; applied anyway (--force): rates above this GPU's "
                "nameplate are capped at it"]
    if measured_gpu(cal)[1] is None and (cal.compute or cal.bandwidth or cal.links):
        return [f"calibration: {path} does not say which GPU it was measured on; applied as given"]
    return []
