"""The training scripts users launch, measured on one CUDA GPU (issue 25).

Not the project's own loop: Transformers' ``Trainer`` (and TRL's ``SFTTrainer``) with an accelerate
FSDP plugin built from ``fsdp_config`` (FSDP1 / FSDP2, ``activation_checkpointing`` or HF gradient
checkpointing, ``use_cache`` both ways), PEFT LoRA, QLoRA through
``prepare_model_for_kbit_training`` with its defaults, and a plain FSDP2 ``fully_shard`` loop as
torchtitan writes it (``train.py``: ``pred = model(x); loss = cross_entropy(pred.flatten(0, 1).float(),
labels.flatten()); del pred; loss.backward()``). Models are random-initialised from their published
configs (no hub). Under FSDP, one GPU holds rank 0 of W ranks through torch's fake process group
with real CUDA tensors: it cannot see NCCL's buffers (no communicator is made), other ranks'
memory, or collective time.

The configurations run through ``gpu_campaign.py``'s machinery (one process per configuration,
``run_grid``, ``environment``, ``nvml_used_bytes``, ``cuda_stats``):

    python benchmarks/gpu_campaign.py userscripts --out DIR            # all of them, DIR/userscripts.jsonl
    python benchmarks/gpu_campaign.py userscripts --out DIR --smoke    # CPU, tiny shapes, same code paths
    python benchmarks/gpu_userscripts.py split DIR/userscripts.jsonl   # -> data/calibration/gpu/userscripts/

The held-out rule (``shardplan/calibrate/gpu_split.py``) decides which file each record goes to.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_campaign as gc  # noqa: E402

ONE_B, THREE_B = "Llama-3.2-1B", "Llama-3.2-3B"


# --- per-phase allocator peaks ---------------------------------------------------------------------
class Phases:
    """Allocator peaks per phase: each ``mark`` reads the peak since the previous mark and resets it,
    so a phase's peak is its own (what is still allocated from earlier phases included)."""

    def __init__(self, dev: str):
        self.cuda = dev == "cuda"
        self.peaks: dict[str, list[dict]] = {}
        self.t = time.perf_counter()

    def mark(self, phase: str) -> None:
        import torch

        rec = {"s": time.perf_counter() - self.t}
        if self.cuda:
            torch.cuda.synchronize()
            rec.update(allocated=torch.cuda.max_memory_allocated(), reserved=torch.cuda.max_memory_reserved(),
                       now_allocated=torch.cuda.memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        self.peaks.setdefault(phase, []).append(rec)
        self.t = time.perf_counter()

    def summary(self, rec: dict) -> None:
        """``phase_peaks``: every mark; ``<phase>_peak_allocated_bytes`` over the steps after the first."""
        rec["phase_peaks"] = self.peaks
        for phase, marks in self.peaks.items():
            later = marks[1:] or marks
            if self.cuda:
                rec[f"{phase}_peak_allocated_bytes"] = max(m["allocated"] for m in later)
                rec[f"{phase}_peak_reserved_bytes"] = max(m["reserved"] for m in later)


def nvml_process_bytes() -> int | None:
    """This process's device memory as NVML attributes it (context + allocator segments + handles)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return sum(int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                   if p.pid == os.getpid()) or None
    except Exception:
        return None


def finish(rec: dict, phases: Phases, dev: str, step_times: list[float]) -> dict:
    """The counters a user could read, after the last step."""
    import torch

    phases.summary(rec)
    rec["step_times_s"] = step_times
    if dev == "cuda":
        steps = [p for k, v in phases.peaks.items() if k in ("forward", "backward", "optimizer") for p in v[1:] or v]
        rec["max_allocated_bytes"] = max(p["allocated"] for p in steps)
        rec["max_reserved_bytes"] = max(p["reserved"] for p in steps)
        rec["process_max_reserved_bytes"] = max(p["reserved"] for v in phases.peaks.values() for p in v)
        rec["end_reserved_bytes"] = torch.cuda.memory_reserved()
        rec["nvml_used_after_steps"] = gc.nvml_used_bytes()
        rec["nvml_process_bytes"] = nvml_process_bytes()
        rec["memory_stats_end"] = gc.cuda_stats()
    rec["env"] = gc.environment()
    return rec


# --- models ---------------------------------------------------------------------------------------
def hf_model(cfg: dict, dev: str):
    """A random-initialised causal LM from its published config, as a user's script loads it: fp32
    for a full fine-tune (Trainer's bf16=True autocasts), bf16 for LoRA, NF4 from a checkpoint for
    QLoRA (from_pretrained with a BitsAndBytesConfig, device_map on this GPU)."""
    import torch
    import transformers

    mc = gc.model_config(cfg["model"])
    config = getattr(transformers, mc["config_class"])(**mc["kwargs"])
    config.use_cache = cfg["use_cache"]
    cls = getattr(transformers, mc["config_class"].replace("Config", "ForCausalLM"))
    if cfg["method"] == "qlora":
        bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                              bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
        model = cls.from_pretrained(gc.make_checkpoint(cfg["model"]), quantization_config=bnb, dtype=torch.bfloat16,
                                    device_map={"": 0 if dev == "cuda" else "cpu"})
        model.config.use_cache = cfg["use_cache"]
        return model
    dtype = torch.bfloat16 if cfg["method"] == "lora" else torch.float32
    with torch.device("meta"):
        model = cls._from_config(config, dtype=dtype)
    # Random weights are drawn on the GPU (normal_ over 1-8 B parameters took 11-32 s per run on the
    # device's CPU in the first campaign, most of its time), then the model is moved to the CPU, as
    # from_pretrained leaves it: FSDP (accelerate.prepare) or the single-GPU Trainer moves it to the
    # GPU itself. The caching allocator's blocks and peak are cleared so the load phase measures
    # what the user's script holds, not this shortcut.
    model.to_empty(device=dev)
    gc.random_init(model, config)
    model.tie_weights()
    if dev == "cuda":
        model.to("cpu")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return model


def with_adapters(model, cfg: dict):
    """PEFT as its docs write it: kbit preparation with its defaults for QLoRA (gradient
    checkpointing on, non-4-bit params cast to fp32), then LoRA r=16 on all linear layers."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg["method"] == "qlora":
        model = prepare_model_for_kbit_training(model)
    targets = {"qv": ["q_proj", "v_proj"], "all-linear": "all-linear"}[cfg.get("lora_targets", "all-linear")]
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=targets,
                                            task_type="CAUSAL_LM"))


# --- Trainer / SFTTrainer ---------------------------------------------------------------------------
def fake_world(world_size: int, dev: str) -> None:
    """Rank 0 of ``world_size`` on this one device: the env a launcher sets, and torch's fake process
    group already initialised, so accelerate's PartialState takes it instead of making NCCL's."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def cpu_rehearsal_as_gpu(args) -> None:
    """CPU rehearsal only (``--smoke``): accelerate gives FSDP to GPU-like distributed types, never to
    MULTI_CPU, so the state TrainingArguments made is relabelled (FSDP1's plugin still refuses a CPU)."""
    from accelerate.state import DistributedType, PartialState

    _ = args.device  # TrainingArguments resets and makes accelerate's PartialState here
    PartialState().distributed_type = DistributedType.MULTI_GPU


def fsdp_config(cfg: dict, layer_cls: str) -> dict:
    """Trainer's ``fsdp_config`` (accelerate's FSDP plugin), as the accelerate / TRL FSDP examples set it."""
    out = {"version": cfg["fsdp"], "transformer_layer_cls_to_wrap": [layer_cls],
           "activation_checkpointing": cfg["ac"] == "fsdp", "state_dict_type": "SHARDED_STATE_DICT"}
    if cfg["fsdp"] == 1:
        out.update(reshard_after_forward="full_shard", use_orig_params=True)
    return out


def training_args(cfg: dict, dev: str, out_dir: str, sft: bool):
    """TrainingArguments (or TRL's SFTConfig) with the knobs of ``cfg`` and the library defaults else."""
    kw = dict(output_dir=out_dir, per_device_train_batch_size=cfg["micro_batch"], max_steps=cfg["steps"],
              learning_rate=1e-5, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
              dataloader_num_workers=0, remove_unused_columns=False, bf16=dev == "cuda", use_cpu=dev == "cpu",
              gradient_checkpointing=cfg["ac"] == "hf", gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.get("fsdp"):
        mc = gc.model_config(cfg["model"])
        kw.update(fsdp=True, fsdp_config=fsdp_config(cfg, mc["config_class"].replace("Config", "DecoderLayer")))
    if sft:
        from trl import SFTConfig

        return SFTConfig(**kw, max_length=cfg["seq_len"], packing=False, dataset_text_field=None, pad_token="<pad>")
    from transformers import TrainingArguments

    return TrainingArguments(**kw)


def random_rows(cfg: dict, vocab: int):
    """Fixed-length rows of random token ids (input_ids = labels): every step the same shape."""
    import torch

    g = torch.Generator().manual_seed(0)
    n = cfg["micro_batch"] * (cfg["steps"] + 1)
    ids = torch.randint(0, vocab, (n, cfg["seq_len"]), generator=g)
    return [{"input_ids": r, "labels": r.clone(), "attention_mask": torch.ones_like(r)} for r in ids]


def sft_dataset(rows: list[dict]):
    """TRL's input: a datasets.Dataset already tokenised (SFTTrainer skips its own tokenisation)."""
    from datasets import Dataset

    return Dataset.from_list([{"input_ids": r["input_ids"].tolist()} for r in rows])


def tiny_tokenizer():
    """A word-level tokenizer made in memory (no hub): TRL needs a processing class for its padding
    collator; the rows are already token ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "<eos>": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")


def phase_callback(phases: Phases, step_times: list):
    """Marks the Trainer's phases: wrap (accelerate.prepare, until on_train_begin), backward (to
    on_pre_optimizer_step: backward + gradient clipping), optimizer (to on_optimizer_step); the
    forward is marked by a forward hook on the model (``forward_hook``)."""
    from transformers import TrainerCallback

    class PhaseCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            phases.mark("wrap")

        def on_step_begin(self, args, state, control, **kw):
            phases.mark("between_steps")
            self.t = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            phases.mark("backward")

        def on_optimizer_step(self, args, state, control, **kw):
            phases.mark("optimizer")
            step_times.append(time.perf_counter() - self.t)

    return PhaseCallback()


LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile_callback(rec: dict, step: int = 2):
    """``config.profile``: torch's profiler around one step (the third: past warm-up and the first
    optimizer step's state allocation), counting what the host launched and what the GPU ran. The
    per-step launch count and the GPU's busy time are what a host-bound floor is made of."""
    import torch
    from transformers import TrainerCallback

    class ProfileCallback(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == step:
                acts = [torch.profiler.ProfilerActivity.CPU] + (
                    [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                self.prof = torch.profiler.profile(activities=acts)
                self.prof.__enter__()
                self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if getattr(self, "prof", None) is not None and state.global_step == step + 1:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                wall = time.perf_counter() - self.t
                self.prof.__exit__(None, None, None)
                try:  # a profiler API that differs on the device must not cost the run's other numbers
                    rec["profile"] = profile_counts(self.prof, wall)
                except Exception as exc:  # noqa: BLE001
                    rec["profile_error"] = repr(exc)[-500:]
                self.prof = None

    return ProfileCallback()


def profile_counts(prof, wall_s: float) -> dict:
    """Launches, kernels and their summed GPU time, aten ops, in the profiled step."""
    import torch

    ev = prof.events()
    gpu = [e for e in ev if e.device_type == torch.autograd.DeviceType.CUDA]
    launch_names: dict[str, int] = {}
    for e in ev:
        if e.device_type != torch.autograd.DeviceType.CUDA and "Launch" in e.name:
            launch_names[e.name] = launch_names.get(e.name, 0) + 1
    return {"wall_s": wall_s, "launches": sum(e.name in LAUNCH_NAMES for e in ev), "launch_names": launch_names,
            "kernels": len(gpu), "gpu_busy_s": sum(e.time_range.elapsed_us() for e in gpu) * 1e-6,
            "memcpy_memset": sum(("Memcpy" in e.name or "Memset" in e.name) for e in gpu),
            "aten_ops": sum(e.name.startswith("aten::") for e in ev)}


def forward_hook(phases: Phases):
    """The root module's forward ends the forward phase (the loss is computed inside it: labels)."""

    def hook(module, args, output):
        if module.training:
            phases.mark("forward")
    return hook


def run_trainer(cfg: dict, dev: str, rec: dict) -> dict:
    """One Trainer / SFTTrainer run: load (+ adapters), Trainer built, ``trainer.train()``."""
    import torch  # noqa: F401

    if cfg.get("fsdp"):
        fake_world(cfg["world_size"], dev)
    phases = Phases(dev)
    model = hf_model(cfg, dev)
    if cfg["method"] in ("lora", "qlora"):
        model = with_adapters(model, cfg)
    rec["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rec["total_params"] = sum(p.numel() for p in model.parameters())
    phases.mark("load")
    model.register_forward_hook(forward_hook(phases))
    step_times: list[float] = []
    sft = cfg["script"] == "sft"
    rows = random_rows(cfg, gc.model_config(cfg["model"])["kwargs"]["vocab_size"])
    callbacks = [phase_callback(phases, step_times)] + ([profile_callback(rec)] if cfg.get("profile") else [])
    with tempfile.TemporaryDirectory() as out_dir:
        args = training_args(cfg, dev, out_dir, sft)
        if dev == "cpu" and cfg.get("fsdp"):
            cpu_rehearsal_as_gpu(args)
        if sft:
            from trl import SFTTrainer

            trainer = SFTTrainer(model=model, args=args, train_dataset=sft_dataset(rows), processing_class=tiny_tokenizer(),
                                 callbacks=callbacks)
        else:
            from transformers import Trainer

            trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)
        rec["optim"] = str(args.optim)
        rec["use_cache_at_train"] = bool(getattr(trainer.model.config, "use_cache", None))
        trainer.train()
    rec["tokens"] = cfg["micro_batch"] * cfg["seq_len"]
    del trainer, model
    return finish(rec, phases, dev, step_times)


# --- torchtitan's loop ------------------------------------------------------------------------------
def run_titan(cfg: dict, dev: str, rec: dict) -> dict:
    """torchtitan's training step over an FSDP2-sharded HF model (``gpu_campaign._build_fsdp``: meta
    init, checkpoint_wrapper per block when ``ac == "full"``, fully_shard per block + root, bf16
    params / fp32 reduce); fused AdamW and clip_grad_norm_(1.0) as torchtitan's defaults."""
    import torch
    import torch.nn.functional as F

    phases = Phases(dev)
    model, config = gc._build_fsdp(dict(cfg, kind="fsdp", method="full", engine="fsdp2"), dev)
    phases.mark("load")
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, fused=dev == "cuda")
    b, s = cfg["micro_batch"], cfg["seq_len"]
    ids = torch.randint(0, config.vocab_size, (b, s), device=dev)
    step_times = []
    for _ in range(cfg["steps"]):
        phases.mark("between_steps")
        t = time.perf_counter()
        pred = model(input_ids=ids).logits
        loss = F.cross_entropy(pred.flatten(0, 1).float(), ids.flatten())
        del pred
        phases.mark("forward")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        phases.mark("backward")
        opt.step()
        opt.zero_grad()
        phases.mark("optimizer")
        step_times.append(time.perf_counter() - t)
    rec["tokens"] = b * s
    return finish(rec, phases, dev, step_times)


def run_user(cfg: dict) -> dict:
    """gpu_campaign.py's ``one`` for the kinds of this file."""
    import torch

    dev = "cuda" if torch.cuda.is_available() and not cfg.get("smoke") else "cpu"
    rec: dict = {"config": cfg, "status": "ok", "nvml_before": gc.nvml_used_bytes()}
    if dev == "cuda":
        torch.zeros(1, device="cuda")
        rec["nvml_after_context"] = gc.nvml_used_bytes()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    return run_titan(cfg, dev, rec) if cfg["script"] == "titan" else run_trainer(cfg, dev, rec)


# --- the grid -------------------------------------------------------------------------------------
def user_grid(smoke: bool) -> list[dict]:
    """Trainer + accelerate FSDP (W = 8, one at 64), TRL, single-GPU PEFT LoRA / QLoRA / full, and
    torchtitan's loop; 1B / 3B Llama-3.2 shapes, seq 2048 unless varied, 4 steps (6 in the
    tokens-per-step series)."""
    one, three = ("smoke", "smoke") if smoke else (ONE_B, THREE_B)
    s = 64 if smoke else 2048
    base = dict(kind="user", smoke=smoke, steps=4, micro_batch=2, seq_len=s, use_cache=False, method="full",
                world_size=1, fsdp=0, ac="none")
    fs = dict(base, script="trainer", world_size=8)
    g = [dict(fs, model=one, fsdp=v, ac=ac, use_cache=uc)
         for v in (2, 1) for ac, uc in (("fsdp", False), ("fsdp", True), ("hf", True), ("none", False))]
    g += [dict(fs, model=one, fsdp=2, ac="fsdp", micro_batch=1, seq_len=2 * s),
          dict(fs, model=one, fsdp=2, ac="fsdp", world_size=64),
          dict(fs, model=three, fsdp=2, ac="fsdp"), dict(fs, model=three, fsdp=2, ac="hf", use_cache=True),
          dict(fs, model=one, fsdp=2, ac="fsdp", method="lora"),
          dict(fs, script="sft", model=one, fsdp=2, ac="fsdp")]
    single = dict(base, script="trainer")
    g += [dict(single, model=one, method="lora", ac=ac, use_cache=uc) for ac, uc in (("hf", False), ("none", True),
                                                                                      ("none", False))]
    g += [dict(single, model=three, method="lora", ac="hf"), dict(single, model=three, method="lora", ac="none"),
          dict(single, model=one, method="lora", ac="hf", lora_targets="qv", micro_batch=4),
          dict(single, script="sft", model=one, method="lora", ac="hf")]
    g += [dict(single, model=one, method="qlora", ac="kbit", use_cache=uc) for uc in (False, True)]
    g += [dict(single, model=one, method="qlora", ac="kbit", micro_batch=4, seq_len=s // 2),
          dict(single, model=one, method="full", ac="hf"), dict(single, model=one, method="full", ac="none")]
    titan = dict(base, script="titan", world_size=8, param_dtype="bf16", reduce_dtype="fp32")
    g += [dict(titan, model=one, ac="none"), dict(titan, model=one, ac="full"), dict(titan, model=one, ac="full",
                                                                                    world_size=64),
          dict(titan, model=three, ac="full"), dict(titan, model=one, ac="full", use_cache=True)]
    # Added in the second device session (appended: earlier indices keep their configurations). Tokens
    # per step varied at a fixed model and method: a step's per-launch host/eager cost (PEFT adapters,
    # bitsandbytes dequantisation, HF modules) separates from its per-token cost only when the tokens
    # per step vary; six steps so that five are past the first.
    tps = dict(single, model=one, steps=6)
    g += [dict(tps, method=m, ac="kbit" if m == "qlora" else "hf", micro_batch=b, seq_len=n)
          for m in ("lora", "qlora", "full") for b, n in ((1, s // 4), (1, s // 2), (4, 2 * s))]
    g += [dict(single, model=three, method="qlora", ac="kbit")]
    # Third device call: one step under torch's profiler (launches, kernels, GPU busy time) at 512
    # tokens, where the step is host-bound; 1B and 3B (16 and 28 layers) to vary what the launches
    # scale with.
    prof = dict(single, profile=True, micro_batch=1, seq_len=s // 4)
    g += [dict(prof, model=one, method=m, ac=ac) for m, ac in (("full", "hf"), ("full", "none"), ("lora", "hf"),
                                                               ("lora", "none"), ("qlora", "kbit"))]
    g += [dict(prof, model=three, method="lora", ac="hf")]
    return g


def committed_records() -> list[dict]:
    """Every record already in train.jsonl and heldout.jsonl (both: a later session adds runs)."""
    from shardplan.calibrate import gpu_split

    return [r for name in (gpu_split.TRAIN_NAME, gpu_split.HELDOUT_NAME)
            if (gpu_split.FOLDER / name).exists() for r in gpu_split.read(gpu_split.FOLDER / name)]


def unmeasured(grid: list[dict]) -> list[int]:
    """Indices of the grid whose configuration has no committed ``ok`` record: a device session with
    minutes left spends them on what was not measured yet (the first session measured 12 of 31)."""
    from shardplan.calibrate import gpu_split

    done = {gpu_split.config_digest(r["config"]) for r in committed_records() if r.get("status") == "ok"}
    return [i for i, c in enumerate(grid) if gpu_split.config_digest(c) not in done]


def split_raw(raw: Path) -> tuple[int, int]:
    """The committed records plus the device's raw records -> train.jsonl and heldout.jsonl by the
    rule (gpu_split), atomically. A configuration measured again keeps its newest ``ok`` record (a
    timeout never replaces a measurement)."""
    from shardplan.calibrate import gpu_split
    from shardplan.support.atomic_write import write_text_atomic

    newest: dict[str, dict] = {}
    for r in committed_records() + gpu_split.read(raw):
        key = gpu_split.config_digest(r["config"])
        if r.get("status") == "ok" or newest.get(key, {}).get("status") != "ok":
            newest[key] = r
    train, held = gpu_split.split(list(newest.values()))
    for name, recs in ((gpu_split.TRAIN_NAME, train), (gpu_split.HELDOUT_NAME, held)):
        write_text_atomic(gpu_split.FOLDER / name, "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    return len(train), len(held)

if __name__ == "__main__":
    if sys.argv[1:2] != ["split"] or len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/gpu_userscripts.py split RAW.jsonl (runs: benchmarks/gpu_campaign.py "
                 "userscripts)")
    print("train %d, held out %d" % split_raw(Path(sys.argv[2])))
