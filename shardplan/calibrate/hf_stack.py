"""Measure the real Hugging Face stack: transformers models, PEFT LoRA, bitsandbytes 4-bit, HF
gradient checkpointing, the HF loss; unwrapped, FSDP2 and FSDP1.

``measure_hf(cfg, device)`` builds a ``LlamaForCausalLM`` / ``MistralForCausalLM`` /
``Qwen2ForCausalLM`` from a config dict with random initialisation (no hub), wraps it the way the
HF stack does and trains ``cfg.steps`` steps, the last one under torch's memory tracking:

* full fine-tuning: the model in fp32 (unwrapped: fp32 training; FSDP: bf16 compute through
  ``MixedPrecisionPolicy`` / ``MixedPrecision``, fp32 reduce, fp32 sharded master);
* LoRA: the model loaded in bf16, ``peft.get_peft_model`` with ``LoraConfig(r, lora_alpha,
  target_modules, lora_dropout)``; PEFT keeps the adapters in fp32 (``autocast_adapter_dtype``);
* QLoRA: the same random model saved to a temporary directory and reloaded with
  ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
  bnb_4bit_compute_dtype=..., bnb_4bit_quant_storage=...)`` (bitsandbytes' CPU backend, >= 0.46);
  ``kbit_prep``: then PEFT's ``prepare_model_for_kbit_training`` (non-4-bit parameters to fp32);
* gradient checkpointing: ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=
  {"use_reentrant": ...})`` (+ ``enable_input_require_grads`` for PEFT, as PEFT's
  ``prepare_model_for_kbit_training`` and the HF docs do);
* the loss: ``labels`` passed to the model (transformers ``loss_utils.ForCausalLMLoss``).

Trackers: ``MemTracker`` (unwrapped), ``FSDPMemTracker`` (FSDP2), shardplan's ``StorageTracker``
(FSDP1). FSDP runs use the fake process group (one process, any world size). The bitsandbytes
``quant_state`` tensors (absmax, code, nested absmax/code) are attributes of each ``Params4bit``,
not parameters or buffers: no tracker registers them, so they are counted by walking the model
(``quant_state_bytes``). On CUDA the record adds ``torch.cuda.max_memory_allocated`` /
``max_memory_reserved`` of the tracked step.

torch, transformers, peft and bitsandbytes are imported where used (the ``stacks`` extra).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from shardplan.support.errors import ShardplanError

HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
HF_CONFIGS = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config"}
LORA_TARGET_MODULES = {"qv": ["q_proj", "v_proj"], "all-linear": "all-linear"}


class HFStackConfig(BaseModel):
    """One real-stack configuration (names as the libraries spell them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Literal["llama", "mistral", "qwen2"] = "llama"
    hidden_size: PositiveInt = 64
    intermediate_size: PositiveInt = 176
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 4
    num_kv_heads: PositiveInt = 2
    vocab_size: PositiveInt = 1024
    tie_word_embeddings: bool = False
    method: Literal["full", "lora", "qlora"] = "full"
    lora_rank: PositiveInt = 8
    lora_alpha: PositiveInt = 16
    lora_targets: Literal["qv", "all-linear"] = "all-linear"
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    gradient_checkpointing: bool = False
    use_reentrant: bool = False
    wrapper: Literal["single", "fsdp1", "fsdp2"] = "single"
    world_size: PositiveInt = 1
    compute_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    quant_storage: Literal["uint8", "bfloat16", "float32"] = "uint8"
    kbit_prep: bool = Field(False, description="QLoRA: PEFT prepare_model_for_kbit_training (non-4-bit params to fp32)")
    micro_batch: PositiveInt = 2
    seq_len: PositiveInt = 64
    steps: PositiveInt = 2
    seed: int = 0

    def hf_config(self) -> dict:
        """The config dict the model is built from (and that shardplan reads: ``hf_config.py``)."""
        cfg = {"model_type": self.family, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
               "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
               "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
               "max_position_embeddings": max(256, self.seq_len), "hidden_act": "silu",
               "tie_word_embeddings": self.tie_word_embeddings, "rms_norm_eps": 1e-6}
        if self.family == "mistral":
            cfg["sliding_window"] = None
        if self.family == "qwen2":
            cfg["use_sliding_window"] = False
        return cfg

    def key(self) -> str:
        return hashlib.sha1(self.model_dump_json().encode()).hexdigest()[:12]

    def label(self) -> str:
        parts = [self.family, self.method]
        if self.method != "full":
            parts.append(f"{self.lora_targets}/r{self.lora_rank}/drop{self.lora_dropout:g}")
        if self.method == "qlora":
            parts.append(f"cd={self.compute_dtype}/qs={self.quant_storage}" + ("/kbit-prep" if self.kbit_prep else ""))
        parts.append("gc-" + ("reentrant" if self.use_reentrant else "nonreentrant") if self.gradient_checkpointing else "nogc")
        parts.append(self.wrapper + (f"/W{self.world_size}" if self.wrapper != "single" else ""))
        parts.append(f"b{self.micro_batch}s{self.seq_len}/V{self.vocab_size}")
        return "/".join(parts)


def _torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "uint8": torch.uint8}[name]


def _require_stack():
    try:
        import bitsandbytes  # noqa: F401
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        raise ShardplanError("stack", "hf", f"needs the 'stacks' extra (pip install 'shardplan[stacks]'): {err}") from None


def build_hf_model(cfg: HFStackConfig, device):
    """The HF model with random init (no hub), with PEFT / bitsandbytes / checkpointing applied."""
    _require_stack()
    import torch
    import transformers

    config = getattr(transformers, HF_CONFIGS[cfg.family])(**{k: v for k, v in cfg.hf_config().items()
                                                              if k != "model_type"})
    config._attn_implementation = "sdpa"
    cls = getattr(transformers, HF_CLASSES[cfg.family])
    torch.manual_seed(cfg.seed)
    if cfg.method == "full":
        model = cls(config).to(device)
    elif cfg.method == "lora":
        model = cls(config).to(device=device, dtype=torch.bfloat16)
    else:
        model = _load_4bit(cls, config, cfg, device)
        if cfg.kbit_prep:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": cfg.use_reentrant})
    if cfg.method != "full":
        from peft import LoraConfig, get_peft_model

        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=LORA_TARGET_MODULES[cfg.lora_targets], bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    model.train()
    return model


def _load_4bit(cls, config, cfg: HFStackConfig, device):
    """Random model -> save -> reload quantized (the path ``from_pretrained`` takes for a checkpoint)."""
    import torch
    from transformers import BitsAndBytesConfig

    torch.manual_seed(cfg.seed)
    base = cls(config).to(torch.bfloat16)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=_torch_dtype(cfg.compute_dtype),
                             bnb_4bit_quant_storage=_torch_dtype(cfg.quant_storage))
    with tempfile.TemporaryDirectory(prefix="shardplan-hf-") as tmp:
        base.save_pretrained(tmp)
        del base
        return cls.from_pretrained(tmp, quantization_config=bnb, dtype=torch.bfloat16,
                                   device_map={"": str(device)})


def decoder_layer_class(model):
    for m in model.modules():
        if type(m).__name__.endswith("DecoderLayer"):
            return type(m)
    raise ShardplanError("model", type(model).__name__, "no *DecoderLayer module found")


def wrap_model(model, cfg: HFStackConfig, device):
    """FSDP2 ``fully_shard`` per decoder layer + root, or FSDP1 with ``ModuleWrapPolicy``, the
    way accelerate's FSDP plugin wraps (transformer layer class; bf16 params, fp32 reduce)."""
    import torch

    if cfg.wrapper == "single":
        return model
    layer_cls = decoder_layer_class(model)
    full = cfg.method == "full"
    if cfg.wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (cfg.world_size,), mesh_dim_names=("shard",))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for m in list(model.modules()):
            if isinstance(m, layer_cls):
                fully_shard(m, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({layer_cls}), sharding_strategy=ShardingStrategy.FULL_SHARD,
                mixed_precision=mp, device_id=device, use_orig_params=not full)


def quant_state_bytes(model) -> dict:
    """bitsandbytes 4-bit storage, by walking the model: the quant_state tensors (absmax, code, and
    with double quantization the fp32 offset and the nested absmax/code) that ``Linear4bit`` keeps
    as attributes (``module.quant_state`` and ``weight.quant_state``, bitsandbytes
    ``nn/modules.py`` ``fix_4bit_weight_quant_state_from_module``) outside the trackers' reach;
    and, unwrapped, the packed 4-bit weights themselves (a tracked parameter)."""
    import torch

    state = packed = 0
    seen: set[int] = set()

    def add(t) -> int:
        if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in seen:
            seen.add(t.untyped_storage()._cdata)
            return t.untyped_storage().nbytes()
        return 0

    for m in model.modules():
        states = [getattr(m, "quant_state", None), getattr(getattr(m, "weight", None), "quant_state", None)]
        for qs in states:
            if qs is None or not hasattr(qs, "absmax"):
                continue
            for t in (qs.absmax, qs.code, getattr(qs, "offset", None)):
                state += add(t)
            nested = getattr(qs, "state2", None)
            if nested is not None:
                state += add(nested.absmax) + add(nested.code)
        w = getattr(m, "weight", None)
        if type(w).__name__ == "Params4bit":
            packed += w.untyped_storage().nbytes()
    return {"packed_weight_bytes": int(packed), "quant_state_bytes": int(state)}


def _step(model, opt, ids, labels):
    """One step the way the HF Trainer runs it: ``compute_loss`` returns ``outputs.loss`` and the
    outputs (the logits) go out of scope before ``backward``."""
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    return loss


MEMTRACKER_FIELDS = {"Parameter": "params_bytes", "Gradient": "grads_bytes", "Optstate": "optimizer_state_bytes",
                     "Activation": "activations_bytes", "Temp": "temporaries_bytes", "Buffer": "buffers_bytes"}
FSDP_FIELDS = {"Sharded Param": "params_bytes", "Sharded Grad": "grads_bytes", "OptState": "optimizer_state_bytes",
               "Activation": "activations_bytes", "Temp": "temporaries_bytes", "Buffer": "buffers_bytes",
               "Unsharded Param": "params_unsharded_bytes", "Unsharded Grad": "grads_unsharded_bytes",
               "All Gather": "all_gather_bytes", "Reduce Scatter": "reduce_scatter_bytes", "Inputs": "inputs_bytes"}


def measure_hf(cfg: HFStackConfig, device="cpu") -> dict:
    """Build, wrap, train ``cfg.steps - 1`` untracked steps and one tracked step; one record.

    Assumes ``torch.distributed`` is initialised for the FSDP wrappers (``run_hf`` does that with
    the fake process group). ``device`` may be "cpu" or a CUDA device."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    model = wrap_model(build_hf_model(cfg, device), cfg, device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab_size, (cfg.micro_batch, cfg.seq_len), generator=g).to(device)
    labels = ids.clone()
    for _ in range(cfg.steps - 1):
        _step(model, opt, ids, labels)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    loss, summary = _tracked_step(cfg.wrapper, model, opt, ids, labels)
    record = {"key": cfg.key(), "status": "ok", "stack": "hf", "config": cfg.model_dump(mode="json"),
              "hf_config": cfg.hf_config(), "loss": float(loss.detach().float().item()), **summary}
    record["measured"].update(quant_state_bytes(model))
    record["tracker"] = {"single": "MemTracker", "fsdp2": "FSDPMemTracker", "fsdp1": "StorageTracker"}[cfg.wrapper]
    if device.type == "cuda":
        record["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        record["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    record["env"] = _stack_environment(device)
    return record


def _tracked_step(wrapper: str, model, opt, ids, labels):
    """One step under the tracker that fits the wrapper (``StorageTracker`` for FSDP1,
    ``FSDPMemTracker`` for FSDP2, ``MemTracker`` unwrapped). Returns the loss and the tracker's
    summary with this module's field names."""
    from shardplan.calibrate.runner import _tracker_with_category_max

    if wrapper == "fsdp1":
        from shardplan.calibrate.storage_tracker import StorageTracker

        tracker = StorageTracker(model, opt, (ids, labels))
        loss = tracker.phased_step(lambda: model(input_ids=ids, labels=labels).loss)
        return loss, _storage_summary(tracker)
    if wrapper == "fsdp2":
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = _tracker_with_category_max(FSDPMemTracker)(model, opt)
        tracker.track_inputs((ids, labels))
        fields = FSDP_FIELDS
    else:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = _tracker_with_category_max(MemTracker)()
        tracker.track_external(model, opt)
        _skip_frozen_grad_hooks(tracker, model)
        fields = MEMTRACKER_FIELDS
    with tracker:
        loss = _step(model, opt, ids, labels)
    return loss, _mem_tracker_summary(tracker, model, fields, "OptState" if wrapper == "fsdp2" else "Optstate")


def _stack_environment(device) -> dict:
    """The harness environment plus the versions of the stack under test and the device."""
    import bitsandbytes
    import peft
    import transformers

    from shardplan.calibrate.runner import environment

    return {**environment(), "transformers": transformers.__version__, "peft": peft.__version__,
            "bitsandbytes": bitsandbytes.__version__, "device": str(device)}


class _NoHook:
    def remove(self) -> None:
        pass


def _skip_frozen_grad_hooks(tracker, model) -> None:
    """torch 2.13 ``MemTracker._track_module_params_and_buffers`` registers a gradient hook on
    every parameter of a module and fails on frozen ones (LoRA's base weights); marking the frozen
    parameters as already hooked skips them (they never get a gradient to count)."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


def _snap(s: dict) -> dict:
    return {getattr(k, "value", k): int(v) for k, v in s.items()}


def _mem_tracker_summary(tracker, model, fields: dict, opt_cat: str) -> dict:
    from shardplan.calibrate.runner import primary_device

    measured = {f: 0 for f in set(MEMTRACKER_FIELDS.values()) | set(FSDP_FIELDS.values())}
    # the tracker keeps each category's maximum per device (runner._tracker_with_category_max)
    cat_max = tracker.cat_max.get(primary_device(tracker.cat_max), {}) if tracker.cat_max else {}
    for cat, field in fields.items():
        measured[field] = int(cat_max.get(cat, 0))
    peak = {str(d): _snap(s) for d, s in tracker.get_tracker_snapshot("peak").items()}
    end = {str(d): _snap(s) for d, s in tracker.get_tracker_snapshot("current").items()}
    measured["optimizer_step_peak_bytes"] = measured["optimizer_state_bytes"]
    measured["optimizer_state_bytes"] = max((s.get(opt_cat, 0) for s in end.values()), default=0)
    out = {"measured": measured, "peak_breakdown": peak,
           "total_peak_bytes": max((s.get("Total", 0) for s in peak.values()), default=0),
           "category_max": {k: int(v) for k, v in cat_max.items()}, "end_of_step": end}
    stats = tracker.memory_tracking.get(model)
    for phase, name in (("forward", "PEAK_FW"), ("backward", "PEAK_BW")):
        snap = None
        if stats is not None:
            key = next((k for k in stats.snapshots if getattr(k, "name", "") == name), None)
            if key is not None:
                snap = {str(d): _snap(s) for d, s in stats.snapshots[key][-1].items()}
        out[f"{phase}_peak_breakdown"] = snap
        out[f"{phase}_peak_bytes"] = max((s.get("Total", 0) for s in (snap or {}).values()), default=0)
    return out


def _storage_summary(tracker) -> dict:
    """FSDP1 runs: the harness's own StorageTracker summary (per device), with this module's fields."""
    from shardplan.calibrate.runner import _storage_summary as runner_storage_summary
    from shardplan.calibrate.runner import primary_device

    out = runner_storage_summary(tracker)
    main = primary_device(out["devices"])
    cat_max, current = tracker.cat_max.get(main, {}), tracker.current.get(main, {})
    measured = {f: 0 for f in set(MEMTRACKER_FIELDS.values()) | set(FSDP_FIELDS.values())}
    for cat, field in FSDP_FIELDS.items():
        measured[field] = int(cat_max.get(cat, 0))
    measured["optimizer_step_peak_bytes"] = measured["optimizer_state_bytes"]
    measured["optimizer_state_bytes"] = int(current.get("OptState", 0))
    out["measured"] = measured
    return out


def run_hf(cfg: HFStackConfig, device="cpu") -> dict:
    """One configuration in this process: the FSDP wrappers get the fake process group
    (``FakeStore``, backend "fake": rank 0 of ``world_size``); never raises, the status says."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    started = False
    try:
        if cfg.wrapper != "single":
            from torch.testing._internal.distributed.fake_pg import FakeStore

            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg.world_size)
            started = True
        return measure_hf(cfg, device)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        return {"key": cfg.key(), "status": "error", "stack": "hf", "config": cfg.model_dump(mode="json"),
                "hf_config": cfg.hf_config(), "error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        if started:
            dist.destroy_process_group()


# Three shapes, one per family (Qwen2 brings q/k/v biases; Mistral three layers and a wider vocabulary).
FAMILY_SHAPES = {
    "llama": dict(hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=1024, micro_batch=2, seq_len=64),
    "mistral": dict(hidden_size=96, intermediate_size=256, num_layers=3, num_heads=6, num_kv_heads=2,
                    vocab_size=2048, micro_batch=1, seq_len=96),
    "qwen2": dict(hidden_size=128, intermediate_size=320, num_layers=2, num_heads=8, num_kv_heads=2,
                  vocab_size=1536, micro_batch=1, seq_len=128),
}


def default_hf_grid() -> list[HFStackConfig]:
    """The committed real-stack grid (46 runs): every family x the same ten wrappings, which
    together take every value of every axis: method full/LoRA/QLoRA, checkpointing off /
    non-reentrant / reentrant, LoRA dropout 0/0.1, targets q,v / all-linear, wrapper
    single/FSDP1/FSDP2 (W=4, fake process group), QLoRA quant_storage uint8 / bfloat16; then
    small-vocabulary Llama runs whose peak is inside a block's backward, and unwrapped QLoRA runs
    prepared with ``prepare_model_for_kbit_training``. FSDP1 runs full fine-tuning only: FSDP1 flattens a unit's parameters into one tensor and
    refuses PEFT's fp32 adapters next to a bf16 base ("Must flatten tensors with uniform dtype")."""
    out = []
    for fam, shape in FAMILY_SHAPES.items():
        def c(**kw):
            return HFStackConfig(family=fam, **shape, **kw)

        out += [
            c(method="full"),
            c(method="full", gradient_checkpointing=True, use_reentrant=True),
            c(method="lora", lora_targets="qv", lora_dropout=0.1, gradient_checkpointing=True),
            c(method="lora", lora_targets="all-linear", lora_dropout=0.0),
            c(method="qlora", lora_targets="all-linear", lora_dropout=0.1),
            c(method="qlora", lora_targets="qv", lora_dropout=0.0, gradient_checkpointing=True, use_reentrant=True),
            c(method="full", wrapper="fsdp2", world_size=4, gradient_checkpointing=True),
            c(method="lora", wrapper="fsdp2", world_size=4, lora_dropout=0.1),
            c(method="qlora", wrapper="fsdp2", world_size=4, quant_storage="bfloat16", gradient_checkpointing=True,
              use_reentrant=True),
            c(method="full", wrapper="fsdp1", world_size=4, gradient_checkpointing=fam == "mistral"),
        ]
    # A small vocabulary and longer sequence move the peak from the logits into a block's backward
    # (recomputation, gradients arriving, the reentrant flavour's held output).
    small = dict(FAMILY_SHAPES["llama"], vocab_size=256, seq_len=128)
    for kw in (dict(), dict(wrapper="fsdp2", world_size=4),
               dict(method="qlora", wrapper="fsdp2", world_size=4, quant_storage="bfloat16")):
        for reentrant in (False, True):
            out.append(HFStackConfig(family="llama", **small, gradient_checkpointing=True, use_reentrant=reentrant, **kw))
    # QLoRA prepared by PEFT's prepare_model_for_kbit_training (fp32 stream), one GPU
    for fam, kw in (("llama", dict()), ("qwen2", dict(lora_dropout=0.1)),
                    ("mistral", dict(gradient_checkpointing=True, lora_targets="qv"))):
        out.append(HFStackConfig(family=fam, **FAMILY_SHAPES[fam], method="qlora", kbit_prep=True, **kw))
    # ... and, for PEFT, into a checkpointed block's recomputation (LoRA transients) or its MLP backward
    for kw in (dict(method="lora"), dict(method="lora", use_reentrant=True), dict(method="lora", lora_targets="qv"),
               dict(method="lora", lora_dropout=0.1), dict(method="qlora"),
               dict(method="lora", wrapper="fsdp2", world_size=4),
               dict(method="lora", lora_dropout=0.1, wrapper="fsdp2", world_size=4, use_reentrant=True)):
        out.append(HFStackConfig(family="llama", **small, gradient_checkpointing=True, **kw))
    return out
