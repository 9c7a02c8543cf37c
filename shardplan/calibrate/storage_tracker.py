"""A storage-size memory tracker for FSDP1 (``FullyShardedDataParallel``).

torch's generic ``MemTracker`` registers a storage with the size it has when the tracker first
sees it and only follows ``UntypedStorage.resize_`` for storages it already knows. FSDP1 reuses
the same flat storages across steps and grows them with ``resize_`` *before* any dispatched op
touches them (``_alloc_storage`` before the all-gather), so the tracker's Parameter category ends
up counting storages FSDP has already freed (an artifact of up to 13 % on the phase peaks).

This tracker counts real bytes: every storage it has seen (model parameters, FSDP's flat-parameter
storages, optimizer state, inputs, buffers, and every tensor passing the dispatcher) is summed
with its *current* ``nbytes()`` after every dispatched op, so ``resize_`` growth and frees are
counted whenever they happen. Categories are assigned by identity from FSDP1's own attributes
(``torch/distributed/fsdp/_flat_param.py``):

* "Sharded Param" — ``flat_param._local_shard`` (the fp32 sharded flat parameter; NO_SHARD: the
  whole flat parameter);
* "Unsharded Param" — ``_full_param_padded`` (and ``_full_prec_full_param_padded``), the padded
  all-gather output the module computes with;
* "All Gather" — ``_mp_shard``, the low-precision copy of the shard that is the all-gather input
  under ``MixedPrecision``;
* "Sharded Grad" / "Unsharded Grad" — ``flat_param.grad`` and ``_saved_grad_shard`` by numel;
* "Reduce Scatter" — the input and output of ``reduce_scatter_tensor`` while nothing else owns them;
* "OptState", "Inputs", "Buffer"; everything else is "Activation" when created during the
  forward and "Temp" otherwise.

Every device is accounted apart (``str(storage.device)``: ``cuda:0``, ``cpu``): on a CUDA run
Adam's per-tensor ``step`` scalars and the CPU-side inputs are host memory and must not be added to
the GPU's bytes. ``snapshot()``, ``current``, ``cat_max`` and ``peaks[phase]`` are keyed by device.

Phase peaks are taken over the forward call (loss included), the backward call and the optimizer
step, which ``phased_step`` marks with ``phase(...)``; each device's phase peak is its own maximum.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CATEGORIES = ("Sharded Param", "Unsharded Param", "All Gather", "Sharded Grad", "Unsharded Grad", "Reduce Scatter",
              "OptState", "Inputs", "Buffer", "Activation", "Temp")


def _storage(t):
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


class StorageTracker(TorchDispatchMode):
    def __init__(self, model, optimizer, inputs=()):
        super().__init__()
        self.model, self.optimizer, self.inputs = model, optimizer, inputs
        self._live: dict[int, tuple] = {}      # cdata -> (weakref(storage), created_phase)
        self._rs: set[int] = set()             # storages used by a reduce-scatter
        self.phase_name = "idle"
        self.cat_max: dict[str, dict[str, int]] = {}   # device -> category -> max bytes
        self.peaks: dict[str, dict] = {}       # phase -> device -> breakdown at that peak (incl. "Total")
        self.current: dict = {}                # device -> breakdown now
        self._handles = []

    # --- registration ---------------------------------------------------------------------
    def _add(self, t):
        st = _storage(t)
        if st is None:
            return
        key = st._cdata
        entry = self._live.get(key)
        if entry is not None and entry[0]() is not None:
            return
        try:
            ref = weakref.ref(st)
        except TypeError:
            return
        self._live[key] = (ref, self.phase_name)

    def _flat_params(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        out = []
        for m in FSDP.fsdp_modules(self.model):
            h = getattr(m, "_handle", None)
            if h is not None and h.flat_param is not None:
                out.append(h.flat_param)
        return out

    def _known(self):
        """cdata -> category for the storages whose role FSDP's attributes tell."""
        cat: dict[int, str] = {}

        def put(t, name, overwrite=True):
            st = _storage(t)
            if st is not None and (overwrite or st._cdata not in cat):
                cat[st._cdata] = name

        for t in self.inputs:
            put(t, "Inputs")
        for b in self.model.buffers():
            put(b, "Buffer")
        for state in self.optimizer.state.values():
            for v in state.values():
                put(v, "OptState")
        for fp in self._flat_params():
            shard = getattr(fp, "_local_shard", fp)
            for name in ("_full_param_padded", "_full_prec_full_param_padded"):
                if hasattr(fp, name):
                    put(getattr(fp, name), "Unsharded Param")
            if hasattr(fp, "_mp_shard"):
                put(fp._mp_shard, "All Gather")
            put(shard, "Sharded Param")
            for g in (fp.grad, getattr(fp, "_saved_grad_shard", None)):
                if isinstance(g, torch.Tensor):
                    put(g, "Sharded Grad" if g.numel() <= shard.numel() else "Unsharded Grad")
        return cat

    def register_state(self):
        for t in list(self.inputs) + list(self.model.parameters()) + list(self.model.buffers()):
            self._add(t)
        for state in self.optimizer.state.values():
            for v in state.values():
                self._add(v)
        for fp in self._flat_params():
            for name in ("_local_shard", "_full_param_padded", "_full_prec_full_param_padded", "_mp_shard",
                         "_saved_grad_shard"):
                self._add(getattr(fp, name, None))
            self._add(fp.grad)

    # --- accounting -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[str, int]]:
        """Bytes per device per category now (each device with its "Total")."""
        known = self._known()
        snaps: dict[str, dict[str, int]] = {}
        dead = []
        for key, (ref, born) in self._live.items():
            st = ref()
            if st is None:
                dead.append(key)
                continue
            n = st.nbytes()
            if not n:
                continue
            c = known.get(key)
            if c is None:
                if key in self._rs:
                    c = "Reduce Scatter"
                else:
                    c = "Activation" if born == "forward" else "Temp"
            snap = snaps.setdefault(str(st.device), {k: 0 for k in CATEGORIES})
            snap[c] += n
        for key in dead:
            del self._live[key]
            self._rs.discard(key)
        for snap in snaps.values():
            snap["Total"] = sum(snap[c] for c in CATEGORIES)
        return snaps

    def _update(self):
        snaps = self.snapshot()
        self.current = snaps
        for dev, snap in snaps.items():
            cmax = self.cat_max.setdefault(dev, {})
            for c, v in snap.items():
                if c != "Total" and v > cmax.get(c, 0):
                    cmax[c] = v
            for ph in (self.phase_name, "all"):
                peaks = self.peaks.setdefault(ph, {})
                if snap["Total"] > peaks.get(dev, {}).get("Total", -1):
                    peaks[dev] = dict(snap)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat_in, _ = tree_flatten((args, kwargs))
        for t in flat_in:
            self._add(t)
        out = func(*args, **kwargs)
        flat_out, _ = tree_flatten(out)
        for t in flat_out:
            self._add(t)
        packet = getattr(func, "overloadpacket", None)
        c10d = torch.ops.c10d
        if packet in (c10d._reduce_scatter_base_, c10d.reduce_scatter_tensor_coalesced_):
            for t in flat_in:
                st = _storage(t)
                if st is not None:
                    self._rs.add(st._cdata)
        self._update()
        return out

    @contextmanager
    def phase(self, name: str):
        prev, self.phase_name = self.phase_name, name
        try:
            self._update()
            yield
        finally:
            self._update()
            self.phase_name = prev

    def phased_step(self, forward):
        """One training step under this tracker, its phases marked: ``forward()`` (the forward call,
        loss included) returns the loss, then the backward call and the optimizer step. Returns the loss."""
        with self:
            self.optimizer.zero_grad(set_to_none=True)
            with self.phase("forward"):
                loss = forward()
            with self.phase("backward"):
                loss.backward()
            with self.phase("optimizer"):
                self.optimizer.step()
        return loss

    def __enter__(self):
        self.register_state()
        super().__enter__()
        self._update()
        return self

    def __exit__(self, *exc):
        self._update()
        return super().__exit__(*exc)
