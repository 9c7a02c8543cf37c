"""Run FSDP2 / FSDP1 training steps on the current process group and measure them.

``measure(cfg)`` assumes ``torch.distributed`` is initialised (gloo, nccl or the fake backend)
and returns one tidy record: the configuration, per-category memory peaks from torch's own
trackers (``FSDPMemTracker`` for FSDP2; for FSDP1 ``storage_tracker.StorageTracker``, real storage
sizes, per device), the forward/backward phase peaks of the root module, the breakdown at the
overall peak, step time (median after a warm-up step; timed steps run without any dispatch mode,
the collectives are counted in one more, untimed step), collective counts/bytes, and on CUDA the
allocator's own peaks over the tracked step.

Memory categories (FSDP2, from ``torch.distributed._tools.fsdp2_mem_tracker._FSDPRefType``):
"Sharded Param", "Unsharded Param", "Buffer", "Sharded Grad", "Unsharded Grad", "Activation",
"Temp", "All Gather", "Reduce Scatter", "OptState", "Inputs". FSDP1 (``_MemRefType``):
"Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other". The tracker reports
the per-category breakdown at the instant of the total peak; a subclass here also keeps each
category's own maximum over the tracked step ("cat_max").
"""

from __future__ import annotations

import platform
import statistics
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from shardplan.calibrate.config import RunConfig
from shardplan.calibrate.tiny_model import build_tiny_model, tiny_spec
from shardplan.inputs.models import resolve_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# tracker category -> record field (FSDP2)
FSDP2_FIELDS = {
    "Sharded Param": "params_sharded_bytes",
    "Unsharded Param": "params_unsharded_bytes",
    "Sharded Grad": "grads_sharded_bytes",
    "Unsharded Grad": "grads_unsharded_bytes",
    "OptState": "optimizer_state_bytes",
    "All Gather": "all_gather_bytes",
    "Reduce Scatter": "reduce_scatter_bytes",
    "Activation": "activations_bytes",
    "Temp": "temporaries_bytes",
    "Inputs": "inputs_bytes",
    "Buffer": "buffers_bytes",
}
# FSDP1 is measured with ``storage_tracker.StorageTracker`` (real storage sizes, FSDP1's flat-parameter
# roles by identity); its categories carry FSDP2's names.
FSDP1_FIELDS = dict(FSDP2_FIELDS)
CATEGORY_FIELDS = sorted(set(FSDP2_FIELDS.values()) | set(FSDP1_FIELDS.values()) | {"optimizer_step_peak_bytes"})


# --- collective counting ---------------------------------------------------------------------
class CollectiveCounter(TorchDispatchMode):
    """Counts c10d collectives that pass the dispatcher, with S = the full buffer in bytes
    (nccl-tests convention: all-gather output, reduce-scatter input, all-reduce tensor)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def _add(self, name, tensors):
        n = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        self.counts[name] = self.counts.get(name, 0) + 1
        self.bytes[name] = self.bytes.get(name, 0) + n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c10d = torch.ops.c10d
        packet = getattr(func, "overloadpacket", None)
        if packet is c10d._allgather_base_:
            self._add("all_gather", [args[0]])
        elif packet is c10d._reduce_scatter_base_:
            self._add("reduce_scatter", [args[1]])
        elif packet is c10d.allreduce_:
            self._add("all_reduce", list(args[0]))
        elif packet is c10d.allgather_:
            self._add("all_gather", [t for lst in args[0] for t in lst])
        elif packet is c10d.reduce_scatter_:
            self._add("reduce_scatter", [t for lst in args[1] for t in lst])
        elif packet is c10d.broadcast_:
            self._add("broadcast", list(args[0]))
        elif packet is c10d.allgather_into_tensor_coalesced_:
            self._add("all_gather", list(args[0]))
        elif packet is c10d.reduce_scatter_tensor_coalesced_:
            self._add("reduce_scatter", list(args[1]))
        return func(*args, **kwargs)


def _tracker_with_category_max(base):
    """Subclass a torch memory tracker so it also records every category's own maximum."""

    class Tracker(base):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.cat_max: dict[str, dict[str, int]] = {}  # device -> category -> max

        def _update_snap(self, *a, **k):
            super()._update_snap(*a, **k)
            for dev, snap in self._curr_mem_snap.items():
                cmax = self.cat_max.setdefault(str(dev), {})
                for cat, val in snap.items():
                    name = getattr(cat, "value", cat)
                    if val > cmax.get(name, 0):
                        cmax[name] = val

    return Tracker


# --- building --------------------------------------------------------------------------------
def resolve_spec(cfg: RunConfig):
    spec = resolve_model(cfg.model).spec
    if cfg.tiny:
        spec = tiny_spec(spec, **cfg.tiny)
    return spec


def device_type(cfg: RunConfig | None = None) -> str:
    """``cuda`` under nccl, or under the fake process group when the configuration asks for
    ``device="cuda"`` (real CUDA tensors, one GPU as rank 0); ``cpu`` otherwise."""
    if not torch.cuda.is_available():
        return "cpu"
    backend = dist.get_backend()
    if backend == "nccl":
        return "cuda"
    return "cuda" if backend == "fake" and cfg is not None and cfg.device == "cuda" else "cpu"


def build_mesh(cfg: RunConfig, dev: str):
    from torch.distributed.device_mesh import init_device_mesh

    g = cfg.resolved_shard_size
    if cfg.strategy in ("full_shard", "shard_grad_op"):
        return init_device_mesh(dev, (cfg.world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(dev, (cfg.world_size // g, g), mesh_dim_names=("replicate", "shard"))


def wrap_fsdp2(model, cfg: RunConfig, mesh):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[cfg.param_dtype], reduce_dtype=_DTYPES[cfg.reduce_dtype])
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cfg.cpu_offload else OffloadPolicy()
    reshard = cfg.strategy not in ("shard_grad_op", "hybrid_shard_zero2")
    for block in model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    return model


def wrap_fsdp1(model, cfg: RunConfig, dev: str):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = {"full_shard": ShardingStrategy.FULL_SHARD, "shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
                "no_shard": ShardingStrategy.NO_SHARD, "hybrid_shard": ShardingStrategy.HYBRID_SHARD,
                "hybrid_shard_zero2": ShardingStrategy._HYBRID_SHARD_ZERO2}[cfg.strategy]
    mp = None
    if cfg.param_dtype != "float32" or cfg.reduce_dtype != "float32":
        mp = MixedPrecision(param_dtype=_DTYPES[cfg.param_dtype], reduce_dtype=_DTYPES[cfg.reduce_dtype],
                            buffer_dtype=torch.float32)
    kwargs = {}
    if cfg.strategy.startswith("hybrid"):
        kwargs["device_mesh"] = build_mesh(cfg, dev)
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({model.block_class}), sharding_strategy=strategy,
                mixed_precision=mp, device_id=torch.device("cuda", torch.cuda.current_device()) if dev == "cuda" else torch.device("cpu"),
                use_orig_params=False, **kwargs)


def build_optimizer(model, cfg: RunConfig):
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9)


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def train_step(model, opt, inputs):
    opt.zero_grad(set_to_none=True)
    loss = model(*inputs)
    loss.backward()
    opt.step()
    return loss


# --- the measurement -------------------------------------------------------------------------
SPEC_FIELDS = ("family", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "resolved_head_dim",
               "intermediate_size", "vocab_size", "mlp", "norm", "tie_word_embeddings", "total_params",
               "root_params", "largest_block_params")


def measure(cfg: RunConfig) -> dict:
    """Build, wrap, train ``cfg.steps`` untracked steps (timed, collectives counted), then one step
    under the memory tracker. Returns this rank's record (plain JSON types)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rank = dist.get_rank()
    dev = device_type(cfg)
    spec = resolve_spec(cfg)
    torch.manual_seed(cfg.seed)
    mesh = build_mesh(cfg, dev) if cfg.engine == "fsdp2" else None  # outside FakeTensorMode
    fake = FakeTensorMode() if cfg.fake_tensors else nullcontext()
    record: dict = {"key": cfg.key(), "status": "ok", "rank": rank, "config": cfg.model_dump(mode="json"),
                    "spec": {k: getattr(spec, k) for k in SPEC_FIELDS}}
    with fake:
        model, opt, inputs = _build_run(cfg, spec, dev, mesh)
        times, counter = _timed_steps(model, opt, inputs, cfg.steps, dev)
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tracker, loss = _tracked_step(model, opt, inputs, cfg.engine)
        _sync(dev)

    record.update(_tracker_summary(tracker, model, cfg) if cfg.engine == "fsdp2" else _storage_summary(tracker))
    record["device"] = dev
    record["loss"] = None if cfg.fake_tensors else float(loss.detach().float().item())
    record.update(_timing_fields(times, counter, cfg.fake_tensors))
    if dev == "cuda":
        stats = torch.cuda.memory_stats()
        record["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        record["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        record["cuda_active_peak_bytes"] = stats.get("active_bytes.all.peak")
    record["env"] = environment()
    return record


def _build_run(cfg: RunConfig, spec, dev: str, mesh):
    """The tiny model (checkpointed as ``cfg.ac`` says) wrapped by ``cfg.engine``, its optimizer, and
    one micro-batch of random token ids (inputs and labels)."""
    device = torch.device(dev, torch.cuda.current_device()) if dev == "cuda" else torch.device("cpu")
    model = build_tiny_model(spec, dropout=cfg.dropout, device=device)
    model.set_checkpointing(cfg.ac)
    if cfg.engine == "fsdp2":
        model = wrap_fsdp2(model, cfg, mesh)
    else:
        model = wrap_fsdp1(model, cfg, dev)
    opt = build_optimizer(model, cfg)
    ids = torch.randint(0, spec.vocab_size, (cfg.micro_batch, cfg.seq_len), device=device)
    return model, opt, (ids, ids.clone())


def _timed_steps(model, opt, inputs, steps: int, dev: str):
    """``steps`` timed training steps (no dispatch mode, so no Python per op, inside the timer), then
    one more, untimed step that counts the collectives. Returns the step times and the counter."""
    times = []
    for _ in range(steps):
        _sync(dev)
        t0 = time.perf_counter()
        train_step(model, opt, inputs)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    counter = CollectiveCounter()
    with counter:
        train_step(model, opt, inputs)
    _sync(dev)
    return times, counter


def _tracked_step(model, opt, inputs, engine: str):
    """One step under the memory tracker: torch's ``FSDPMemTracker`` for FSDP2, this package's
    ``StorageTracker`` (phases marked) for FSDP1. Returns the tracker and the step's loss."""
    if engine == "fsdp2":
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = _tracker_with_category_max(FSDPMemTracker)(model, opt)
        tracker.track_inputs(inputs)
        with tracker:
            loss = train_step(model, opt, inputs)
        return tracker, loss
    from shardplan.calibrate.storage_tracker import StorageTracker

    tracker = StorageTracker(model, opt, inputs)
    return tracker, tracker.phased_step(lambda: model(*inputs))


def _timing_fields(times: list, counter, fake_tensors: bool) -> dict:
    """Step time (the median after the first, warm-up step; none under fake tensors, which do no
    work), every step's time, and the collectives counted per op."""
    return {"step_time_s": None if fake_tensors else statistics.median(times[1:]),
            "step_times_s": times,
            "collectives": {k: {"count": counter.counts[k], "bytes": counter.bytes[k]} for k in counter.counts}}


def _tracker_summary(tracker, model, cfg: RunConfig) -> dict:
    fields = FSDP2_FIELDS if cfg.engine == "fsdp2" else FSDP1_FIELDS
    out: dict = {}
    peak = tracker.get_tracker_snapshot("peak")
    peak_dev = {str(d): {getattr(k, "value", k): int(v) for k, v in snap.items()} for d, snap in peak.items()}
    # the run's device (CUDA when there is one): Adam's CPU ``step`` scalars are not GPU memory
    main = primary_device(set(peak_dev) | set(tracker.cat_max))
    cat_max = tracker.cat_max.get(main, {})
    measured = {field: 0 for field in CATEGORY_FIELDS}
    for cat, field in fields.items():
        measured[field] = int(cat_max.get(cat, 0))
    out["measured"] = measured
    out["peak_breakdown"] = peak_dev
    out["total_peak_bytes"] = int(peak_dev.get(main, {}).get("Total", 0))
    out["devices"] = sorted(peak_dev)
    # phase peaks of the root module
    fw = bw = None
    root_stats = tracker.memory_tracking.get(model)
    if root_stats is not None:
        snaps = root_stats.snapshots
        fw_key = next((k for k in snaps if getattr(k, "name", "") == "PEAK_FW"), None)
        bw_key = next((k for k in snaps if getattr(k, "name", "") == "PEAK_BW"), None)
        if fw_key is not None:
            fw = {str(d): {getattr(k, "value", k): int(v) for k, v in s.items()} for d, s in snaps[fw_key][-1].items()}
        if bw_key is not None:
            bw = {str(d): {getattr(k, "value", k): int(v) for k, v in s.items()} for d, s in snaps[bw_key][-1].items()}
    out["forward_peak_breakdown"] = fw
    out["backward_peak_breakdown"] = bw
    out["forward_peak_bytes"] = int((fw or {}).get(main, {}).get("Total", 0))
    out["backward_peak_bytes"] = int((bw or {}).get(main, {}).get("Total", 0))
    out["category_max"] = {k: int(v) for k, v in cat_max.items()}
    # steady-state optimizer state (after the step's temporaries are freed) vs. the step's maximum
    end = tracker.get_tracker_snapshot("current")
    opt_cat = "OptState" if cfg.engine == "fsdp2" else "Optstate"
    steady = int(next((getattr_cat(s, opt_cat) for d, s in end.items() if str(d) == main), 0))
    measured["optimizer_step_peak_bytes"] = measured["optimizer_state_bytes"]
    measured["optimizer_state_bytes"] = steady
    out["end_of_step"] = {str(d): {getattr(k, "value", k): int(v) for k, v in s.items()} for d, s in end.items()}
    return out


def primary_device(devices) -> str:
    """The device whose memory a record reports: the (first) CUDA device when the run had one,
    else the CPU."""
    devices = sorted(devices)
    return next((d for d in devices if d.startswith("cuda")), "cpu" if "cpu" in devices or not devices else devices[0])


def _storage_summary(tracker) -> dict:
    """Record fields from ``StorageTracker`` (FSDP1): the same field names as FSDP2's. The tracker
    keeps CUDA and CPU storages apart (Adam's ``step`` scalars stay on the CPU on CUDA runs); the
    measured categories and peaks are the primary device's, every device's breakdown is kept."""
    devices = sorted(set(tracker.cat_max) | set(tracker.peaks.get("all", {}))) or ["cpu"]
    main = primary_device(devices)
    cat_max = tracker.cat_max.get(main, {})
    current = tracker.current.get(main, {})
    measured = {field: 0 for field in CATEGORY_FIELDS}
    for cat, field in FSDP1_FIELDS.items():
        measured[field] = int(cat_max.get(cat, 0))
    measured["optimizer_step_peak_bytes"] = measured["optimizer_state_bytes"]
    measured["optimizer_state_bytes"] = int(current.get("OptState", 0))

    def per_device(phase):
        snaps = tracker.peaks.get(phase, {})
        return {d: {k: int(v) for k, v in snap.items()} for d, snap in sorted(snaps.items())}

    peaks = {ph: per_device(ph) for ph in ("all", "forward", "backward", "optimizer")}
    total = lambda ph: int(peaks[ph].get(main, {}).get("Total", 0))  # noqa: E731
    return {
        "measured": measured,
        "tracker": "StorageTracker",
        "peak_breakdown": peaks["all"],
        "total_peak_bytes": total("all"),
        "devices": devices,
        "forward_peak_breakdown": peaks["forward"],
        "backward_peak_breakdown": peaks["backward"],
        "optimizer_peak_breakdown": peaks["optimizer"],
        "forward_peak_bytes": total("forward"),
        "backward_peak_bytes": total("backward"),
        "category_max": {k: int(v) for k, v in cat_max.items()},
        "end_of_step": {d: {k: int(v) for k, v in snap.items()} for d, snap in sorted(tracker.current.items())},
    }


def getattr_cat(snap: dict, name: str) -> int:
    for k, v in snap.items():
        if getattr(k, "value", k) == name:
            return int(v)
    return 0


def environment() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    env = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu,
           "backend": dist.get_backend() if dist.is_initialized() else None,
           "omp_threads": torch.get_num_threads(), "hostname_hash": hash(platform.node()) & 0xFFFF}
    from shardplan.calibrate.env import cuda_environment

    env.update(cuda_environment())
    return env
