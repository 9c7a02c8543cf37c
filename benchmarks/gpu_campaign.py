"""GPU measurement campaign: allocator, CUDA context, GEMM / bandwidth, real HF stacks, FSDP on CUDA.

Run on a machine with one CUDA GPU (one GPU holds rank 0 of any world size through torch's fake
process group with real CUDA tensors). Every record carries the GPU, driver, CUDA, torch and
library versions. Each training configuration runs in its own process so that the caching
allocator, the CUDA context and NVML's reading start clean.

    python benchmarks/gpu_campaign.py probes --out DIR      # context, allocator rounding, GEMM, bandwidth
    python benchmarks/gpu_campaign.py hf --out DIR          # HF + PEFT + bitsandbytes, one GPU, no wrapper
    python benchmarks/gpu_campaign.py fsdp --out DIR        # HF models under FSDP2/FSDP1, fake PG, CUDA tensors
    python benchmarks/gpu_campaign.py load --out DIR        # load-time peaks (from_pretrained) of a 1B checkpoint
    python benchmarks/gpu_campaign.py hf --out DIR --smoke  # the same code paths on CPU with tiny shapes

Results: DIR/<part>.jsonl, one JSON object per line. Committed under data/calibration/gpu/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
HF_CONFIGS = REPO / "tests" / "data" / "hf_configs.json"
MiB = 1 << 20

# Llama-3.2-1B (HF hub meta-llama/Llama-3.2-1B config.json): not in tests/data/hf_configs.json.
LLAMA_32_1B = {"config_class": "LlamaConfig", "kwargs": {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}}
# Llama-3.2-3B (HF hub meta-llama/Llama-3.2-3B config.json; shardplan/data/model_profiles/llama-3.2-3b.json).
LLAMA_32_3B = {"config_class": "LlamaConfig", "kwargs": dict(
    LLAMA_32_1B["kwargs"], hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, head_dim=128)}
SMOKE = {"config_class": "LlamaConfig", "kwargs": {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}}


def model_config(name: str) -> dict:
    if name == "Llama-3.2-1B":
        return LLAMA_32_1B
    if name == "Llama-3.2-3B":
        return LLAMA_32_3B
    if name == "smoke":
        return SMOKE
    return json.loads(HF_CONFIGS.read_text())["models"][name]


# --- environment ----------------------------------------------------------------------------
def _version(mod: str):
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None


def environment() -> dict:
    import platform

    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": _version("transformers"), "peft": _version("peft"),
           "bitsandbytes": _version("bitsandbytes"), "accelerate": _version("accelerate")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_total_bytes=p.total_memory, sm_count=p.multi_processor_count,
                   capability=f"{p.major}.{p.minor}", cudnn=torch.backends.cudnn.version(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
            env["nvidia_smi"] = out
            env["driver"] = out.split(",")[0].strip()
        except Exception as exc:  # the record still says which GPU
            env["nvidia_smi_error"] = str(exc)
    return env


def nvml_used_bytes() -> int | None:
    """Device memory in use on GPU 0 as NVML (nvidia-smi) sees it: every process's context,
    allocator segments, cuBLAS workspaces and NCCL buffers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:
        return None


def cuda_stats() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    s = torch.cuda.memory_stats()
    keep = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
            "inactive_split_bytes.all.peak", "segment.all.peak", "segment.large_pool.peak",
            "segment.small_pool.peak", "reserved_bytes.large_pool.peak", "reserved_bytes.small_pool.peak",
            "num_alloc_retries", "num_ooms", "allocation.all.peak", "requested_bytes.all.peak")
    return {k: int(s.get(k, 0)) for k in keep}


def write(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


# --- probes: context, allocator rounding, GEMM, bandwidth -----------------------------------------
def probe_context() -> dict:
    """NVML used memory at each stage of a process's CUDA life."""
    import torch

    rec = {"nvml_before_init": nvml_used_bytes()}
    torch.cuda.init()
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    rec["nvml_after_context"] = nvml_used_bytes()
    rec["reserved_after_context"] = torch.cuda.memory_reserved()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    rec["nvml_after_bf16_matmul"] = nvml_used_bytes()
    rec["reserved_after_bf16_matmul"] = torch.cuda.memory_reserved()
    rec["allocated_after_bf16_matmul"] = torch.cuda.memory_allocated()
    f = a.float()
    (f @ f).sum().item()
    torch.cuda.synchronize()
    rec["nvml_after_fp32_matmul"] = nvml_used_bytes()
    q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    o.sum().backward()
    torch.cuda.synchronize()
    rec["nvml_after_sdpa_fwd_bwd"] = nvml_used_bytes()
    rec["reserved_after_sdpa_fwd_bwd"] = torch.cuda.memory_reserved()
    del x, a, f, q, o
    torch.cuda.empty_cache()
    rec["nvml_after_empty_cache"] = nvml_used_bytes()
    rec["reserved_after_empty_cache"] = torch.cuda.memory_reserved()
    return rec


def probe_rounding() -> list[dict]:
    """Reserved bytes for one live tensor of each size (fresh allocator state per size)."""
    import torch

    out = []
    for nbytes in (1, 511, 513, 1 * MiB - 1, 1 * MiB + 1, 5 * MiB, 10 * MiB + 1, 11 * MiB, 100 * MiB + 1, 1000 * MiB + 7):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        out.append({"request_bytes": nbytes, "allocated_bytes": torch.cuda.memory_allocated(),
                    "reserved_bytes": torch.cuda.memory_reserved()})
        del t
    torch.cuda.empty_cache()
    return out


def _time_loop(fn, iters: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def probe_gemm(smoke: bool) -> list[dict]:
    """Matmul TFLOP/s: square sizes and LLM shapes, >= 50 back-to-back products with 3 rotating
    operand sets between CUDA events, per dtype."""
    import torch

    squares = [(n, n, n) for n in (512, 1024, 2048, 4096, 8192, 16384)]
    llm = [(8192, 4096, 4096), (8192, 4096, 14336), (8192, 14336, 4096), (8192, 4096, 1024),
           (8192, 4096, 128256), (4096, 8192, 8192), (4096, 8192, 28672), (4096, 28672, 8192), (2048, 2048, 8192)]
    shapes = squares + llm
    out = []
    dtypes = [("bf16", torch.bfloat16, False), ("fp16", torch.float16, False), ("fp32", torch.float32, False),
              ("tf32", torch.float32, True)]
    for label, dt, tf32 in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, k, n in shapes:
            if label in ("fp32", "tf32") and m * k * n > 8192 ** 3:
                continue
            ops = [(torch.randn(m, k, device="cuda", dtype=dt), torch.randn(k, n, device="cuda", dtype=dt)) for _ in range(3)]
            iters = 50 if m * k * n <= 8192 ** 3 else 20
            s = _time_loop(lambda i: torch.mm(*ops[i % 3]), iters)
            out.append({"op": "matmul", "dtype": label, "m": m, "k": k, "n": n, "iters": iters, "time_s": s,
                        "tflops": 2 * m * k * n / s / 1e12})
            del ops
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(0) >= (8, 9):
        for m, k, n in squares[2:] + llm:
            try:
                ops = [(torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn),
                        torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()) for _ in range(3)]
                one = torch.tensor(1.0, device="cuda")
                s = _time_loop(lambda i: torch._scaled_mm(ops[i % 3][0], ops[i % 3][1], scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16), 50)
                out.append({"op": "matmul", "dtype": "fp8_e4m3", "m": m, "k": k, "n": n, "iters": 50, "time_s": s,
                            "tflops": 2 * m * k * n / s / 1e12})
                del ops
            except Exception as exc:
                out.append({"op": "matmul", "dtype": "fp8_e4m3", "m": m, "k": k, "n": n, "error": str(exc)[:200]})
                break
    return out


def probe_bandwidth() -> list[dict]:
    """Element-wise bandwidth: copy and add over 16 MiB .. 2 GiB, bytes read + written."""
    import torch

    out = []
    for label, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        for nbytes in (16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB, 2048 * MiB):
            n = nbytes // torch.tensor([], dtype=dt).element_size()
            src = [torch.randn(n, device="cuda", dtype=dt) for _ in range(2)]
            dst = torch.empty_like(src[0])
            s = _time_loop(lambda i: dst.copy_(src[i % 2]), 30)
            out.append({"op": "copy", "dtype": label, "bytes": nbytes, "time_s": s, "gb_per_s": 2 * nbytes / s / 1e9})
            s = _time_loop(lambda i: torch.add(src[0], src[1], out=dst), 30)
            out.append({"op": "add", "dtype": label, "bytes": nbytes, "time_s": s, "gb_per_s": 3 * nbytes / s / 1e9})
            src = dst = None
            torch.cuda.empty_cache()
    return out


def run_probes(out_dir: Path, smoke: bool) -> None:
    env = environment()
    out = out_dir / "probes.jsonl"
    write(out, {"probe": "context", "env": env, **probe_context()})
    for r in probe_rounding():
        write(out, {"probe": "rounding", **r})
    for r in probe_bandwidth():
        write(out, {"probe": "bandwidth", **r})
    for r in probe_gemm(smoke):
        write(out, {"probe": "gemm", **r})
        print(json.dumps(r), flush=True)


# --- one training configuration (runs in its own process) -----------------------------------------
def _build_hf(cfg: dict, device: str):
    import torch
    import transformers

    mc = model_config(cfg["model"])
    config = getattr(transformers, mc["config_class"])(**mc["kwargs"])
    config._attn_implementation = cfg.get("attention", "sdpa")
    cls = getattr(transformers, mc["config_class"].replace("Config", "ForCausalLM"))
    method = cfg["method"]
    load_dtype = torch.float32 if method == "full" else torch.bfloat16
    if device == "cpu" and method != "qlora":
        load_dtype = torch.float32
    if method == "qlora":
        from transformers import BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16,
                                 bnb_4bit_quant_storage=getattr(torch, cfg.get("quant_storage", "uint8")))
        model = _quantized_random_model(cls, config, bnb, device, cfg["model"])
    else:
        with torch.device(device):
            model = cls._from_config(config, dtype=load_dtype)
    return model, config


def checkpoint_dir(name: str) -> Path:
    return Path(os.environ.get("SP_CKPT_ROOT", "/tmp")) / f"sp_ckpt_{name}"


def make_checkpoint(name: str) -> Path:
    """A random-init bf16 checkpoint of ``name`` (made once, in its own process, so the measured
    processes never hold it): QLoRA runs load it quantized the way from_pretrained does."""
    path = checkpoint_dir(name)
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, str(HERE), "mkckpt", "--config", json.dumps({"model": name})], check=True,
                       timeout=900)
    return path


def _make_checkpoint_here(name: str) -> None:
    import torch
    import transformers

    mc = model_config(name)
    config = getattr(transformers, mc["config_class"])(**mc["kwargs"])
    cls = getattr(transformers, mc["config_class"].replace("Config", "ForCausalLM"))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(dev):
        m = cls._from_config(config, dtype=torch.bfloat16)
    m.save_pretrained(checkpoint_dir(name))


def _quantized_random_model(cls, config, bnb_config, device, name):
    """A 4-bit model as from_pretrained(quantization_config=...) leaves it, from random weights."""
    import torch

    return cls.from_pretrained(make_checkpoint(name), quantization_config=bnb_config, dtype=torch.bfloat16,
                               device_map={"": device if device == "cpu" else 0})


def _apply_peft(model, cfg):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg["method"] == "qlora" and cfg.get("kbit_prep", True):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    targets = {"qv": ["q_proj", "v_proj"], "all-linear": "all-linear"}[cfg.get("lora_targets", "all-linear")]
    lc = LoraConfig(r=cfg.get("lora_rank", 16), lora_alpha=32, lora_dropout=cfg.get("lora_dropout", 0.0),
                    target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, lc)


def run_one(cfg: dict) -> dict:
    """Build, (wrap), train ``cfg['steps']`` steps; allocator peaks of the last step and overall."""
    import torch

    dev = "cuda" if torch.cuda.is_available() and not cfg.get("smoke") else "cpu"
    rec: dict = {"config": cfg, "status": "ok"}
    rec["nvml_before"] = nvml_used_bytes()
    if dev == "cuda":
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        rec["nvml_after_context"] = nvml_used_bytes()
    torch.manual_seed(0)
    model, config = _build_and_load(cfg, dev, rec)
    ac = cfg.get("ac", "none")
    if ac != "none" and cfg["kind"] == "hf":  # FSDP runs were wrapped in _build_fsdp
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ac == "full_reentrant"})
        if cfg["method"] != "full":
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    rec["trainable_params"] = sum(p.numel() for p in params)
    rec["total_params"] = sum(p.numel() for p in model.parameters())
    opt = _optimizer(cfg.get("optimizer", "adamw_foreach"), params, dev)
    b, s = cfg["micro_batch"], cfg["seq_len"]
    ids = torch.randint(0, config.vocab_size, (b, s), device=dev)
    autocast = cfg["kind"] == "hf" and cfg["method"] == "full" and dev == "cuda"
    if cfg.get("duration_s"):  # a sustained run (gpu_sustained.py): clocks sampled all along
        from gpu_clocks import ClockSampler

        with ClockSampler() as clocks:
            times, step_stats = _train_steps(model, opt, ids, cfg.get("steps", 3), dev, autocast, cfg["duration_s"])
        rec.update(clocks.record())
    else:
        times, step_stats = _train_steps(model, opt, ids, cfg.get("steps", 3), dev, autocast)
    rec["step_times_s"] = times
    rec["steps"] = step_stats
    if step_stats:
        rec["max_allocated_bytes"] = max(x["allocated_bytes.all.peak"] for x in step_stats)
        rec["max_reserved_bytes"] = max(x["reserved_bytes.all.peak"] for x in step_stats)
        rec["nvml_used_after_steps"] = step_stats[-1]["nvml_used"]
        # overall process peak (load included): the allocator's lifetime counters are per step here,
        # so the process maximum reserved is the larger of load and steps
        rec["process_max_reserved_bytes"] = max(rec["max_reserved_bytes"], rec.get("load_max_reserved_bytes", 0))
    rec["tokens"] = b * s
    rec["env"] = environment()
    return rec


def _build_and_load(cfg: dict, dev: str, rec: dict):
    """The model (FSDP-wrapped, or HF with PEFT adapters) and its config; records the build time
    and, on CUDA, the load-time allocator peaks and what stays allocated after loading."""
    import torch

    t0 = time.perf_counter()
    if cfg["kind"] == "fsdp":
        model, config = _build_fsdp(cfg, dev)
    else:
        model, config = _build_hf(cfg, dev)
        if cfg["method"] in ("lora", "qlora"):
            model = _apply_peft(model, cfg)
    rec["build_s"] = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.synchronize()
        rec["load_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        rec["load_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        rec["after_load_allocated_bytes"] = torch.cuda.memory_allocated()
        rec["nvml_after_load"] = nvml_used_bytes()
    return model, config


def _optimizer(kind: str, params: list, dev: str):
    """bitsandbytes' AdamW8bit, or torch's AdamW with the foreach or fused kernel (on CUDA; torch's
    default on the CPU)."""
    import torch

    if kind == "adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=1e-5)
    return torch.optim.AdamW(params, lr=1e-5, foreach=(kind == "adamw_foreach") if dev == "cuda" else None,
                             fused=(kind == "adamw_fused") if dev == "cuda" else None)


def _train_steps(model, opt, ids, steps: int, dev: str, autocast: bool,
                 duration_s: float | None = None) -> tuple[list, list]:
    """``steps`` training steps (at least; with ``duration_s``, on until that many seconds have
    passed), each with the allocator's peaks reset before it; returns the step times and, on CUDA,
    each step's allocator statistics with its forward / backward peaks (a sustained run keeps the
    first three steps' statistics and the last's: its hundreds of steps repeat them)."""
    import torch

    times, step_stats = [], []
    t_start = time.perf_counter()
    while len(times) < steps or (duration_s and time.perf_counter() - t_start < duration_s):
        if dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16) if autocast else nullcontext():
            out = model(input_ids=ids, labels=ids)
        fw_peak = torch.cuda.max_memory_allocated() if dev == "cuda" else None
        out.loss.backward()
        bw_peak = torch.cuda.max_memory_allocated() if dev == "cuda" else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out
        if dev == "cuda":
            torch.cuda.synchronize()
            st = cuda_stats()
            st.update(forward_peak_allocated_bytes=fw_peak, backward_peak_allocated_bytes=bw_peak,
                      end_allocated_bytes=torch.cuda.memory_allocated(), end_reserved_bytes=torch.cuda.memory_reserved(),
                      nvml_used=nvml_used_bytes())
            if duration_s and len(step_stats) > 3:
                step_stats.pop()
            step_stats.append(st)
        times.append(time.perf_counter() - t)
    return times, step_stats


def _layers(model):
    inner = model
    for attr in ("base_model", "model"):
        while hasattr(inner, attr) and not hasattr(inner, "layers"):
            inner = getattr(inner, attr)
    return inner.layers


def _build_fsdp(cfg: dict, dev: str):
    """An HF model sharded by FSDP2 (fully_shard per decoder layer + root) or FSDP1 on a fake process
    group of ``world_size`` ranks: built on the meta device, materialised shard by shard on the GPU."""
    import torch
    import torch.distributed as dist
    import transformers
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg["world_size"])
    mc = model_config(cfg["model"])
    config = getattr(transformers, mc["config_class"])(**mc["kwargs"])
    config._attn_implementation = cfg.get("attention", "sdpa")
    config.use_cache = cfg.get("use_cache", config.use_cache)  # the earlier runs: Transformers' default (True)
    cls = getattr(transformers, mc["config_class"].replace("Config", "ForCausalLM"))
    # mixed_precision "no" (the fms-acceleration runs' accelerate setting): weights loaded in bf16, no
    # FSDP mixed-precision policy; otherwise fp32 weights under the policy below
    native = cfg.get("mixed_precision") == "no"
    with torch.device("meta"):
        model = cls._from_config(config, dtype=torch.bfloat16 if native else torch.float32)
    if cfg["method"] == "lora":
        model = _apply_peft(model, cfg)
    layers = _layers(model)
    layer_cls = type(layers[0])
    if cfg.get("ac", "none") != "none":
        # before sharding, as torchtitan does: each decoder layer inside a CheckpointWrapper
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, layer_cls))
        layers = _layers(model)
    param_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.get("param_dtype", "bf16")]
    reduce_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.get("reduce_dtype", "fp32")]
    reshard = cfg.get("strategy", "full_shard") == "full_shard"
    if cfg["engine"] == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(dev, (cfg["world_size"],))
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        for layer in layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        model.to_empty(device=dev)
    else:
        mp = None if native else (param_dtype, reduce_dtype)
        model = _fsdp1(model, cfg, dev, layer_cls, reshard, mp)
    random_init(model, config)
    return model, config


def _fsdp1(model, cfg: dict, dev: str, layer_cls, reshard: bool, mp):
    """FSDP1 over ``model``: a unit per decoder layer, or PEFT's policy (``cfg['wrap'] == 'peft'``,
    what Trainer installs for a PEFT model: each adapter Linear its own unit); ``mp`` (param, reduce
    dtypes) or None for no mixed-precision policy."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = ShardingStrategy.FULL_SHARD if reshard else ShardingStrategy.SHARD_GRAD_OP
    if cfg.get("wrap") == "peft":
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
    else:
        policy = ModuleWrapPolicy({layer_cls})
    precision = None if mp is None else MixedPrecision(param_dtype=mp[0], reduce_dtype=mp[1], buffer_dtype=torch.float32)
    return FSDP(model, auto_wrap_policy=policy, sharding_strategy=strategy, mixed_precision=precision,
                device_id=torch.device(dev, 0) if dev == "cuda" else torch.device("cpu"),
                param_init_fn=lambda m: m.to_empty(device=dev, recurse=False), use_orig_params=cfg["method"] != "full")


def random_init(model, config) -> None:
    """Weights ~ N(0, 0.02) and RoPE's inv_freq recomputed, after ``to_empty`` (meta -> device): far
    faster than Transformers' per-module init on the CPU, and the same bytes."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).normal_(0, 0.02)
        for name, buf in model.named_buffers():
            if name.endswith("inv_freq"):
                d = buf.numel() * 2
                theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
                buf.copy_(1.0 / (theta ** (torch.arange(0, d, 2, device=buf.device, dtype=torch.float32) / d)))


# --- the grids ----------------------------------------------------------------------------------
def hf_grid(smoke: bool) -> list[dict]:
    m8, m1 = ("smoke", "smoke") if smoke else ("Llama-3.1-8B", "Llama-3.2-1B")
    s_long = 64 if smoke else 2048
    base = dict(kind="hf", smoke=smoke, steps=3)
    g = []
    # LoRA on an 8B base in bf16 (PEFT recipes): targets, dropout, checkpointing flavour, batch
    for ac in ("none", "full", "full_reentrant"):
        for drop in (0.0, 0.1):
            g.append(dict(base, model=m8, method="lora", lora_targets="all-linear", lora_dropout=drop, ac=ac,
                          micro_batch=1, seq_len=s_long))
    g.append(dict(base, model=m8, method="lora", lora_targets="qv", lora_dropout=0.05, ac="full", micro_batch=4, seq_len=s_long))
    g.append(dict(base, model=m8, method="lora", lora_targets="all-linear", lora_dropout=0.05, ac="full", micro_batch=2,
                  seq_len=4 * s_long))
    # QLoRA on 8B (bitsandbytes NF4, double quant, bf16 compute), prepare_model_for_kbit_training
    for ac in ("none", "full"):
        for drop in (0.0, 0.1):
            g.append(dict(base, model=m8, method="qlora", lora_targets="all-linear", lora_dropout=drop, ac=ac,
                          micro_batch=1, seq_len=s_long))
    g.append(dict(base, model=m8, method="qlora", lora_targets="all-linear", lora_dropout=0.05, ac="full", micro_batch=4,
                  seq_len=s_long, kbit_prep=False))
    # Mistral / Qwen2 LoRA
    if not smoke:
        g.append(dict(base, model="Mistral-7B-v0.1", method="lora", lora_targets="all-linear", lora_dropout=0.05, ac="full",
                      micro_batch=2, seq_len=s_long))
        g.append(dict(base, model="Qwen2.5-7B", method="qlora", lora_targets="all-linear", lora_dropout=0.05, ac="full",
                      micro_batch=2, seq_len=s_long))
    # full fine-tune of a 1B model, fp32 params + bf16 autocast (HF Trainer bf16=True), one GPU
    for opt in ("adamw_foreach", "adamw_fused", "adamw_8bit"):
        g.append(dict(base, model=m1, method="full", ac="none", micro_batch=2, seq_len=s_long, optimizer=opt))
    g.append(dict(base, model=m1, method="full", ac="full", micro_batch=8, seq_len=s_long, optimizer="adamw_fused"))
    return g


def fsdp_grid(smoke: bool) -> list[dict]:
    m8 = "smoke" if smoke else "Llama-3.1-8B"
    s = 64 if smoke else 4096
    base = dict(kind="fsdp", smoke=smoke, steps=3, method="full", param_dtype="bf16", reduce_dtype="fp32",
                optimizer="adamw_foreach")
    g = []
    for w in (4, 8, 64):
        for ac in ("none", "full"):
            g.append(dict(base, model=m8, engine="fsdp2", world_size=w, ac=ac, micro_batch=1, seq_len=s))
    g.append(dict(base, model=m8, engine="fsdp2", world_size=8, ac="full", micro_batch=2, seq_len=2 * s))
    g.append(dict(base, model=m8, engine="fsdp2", world_size=8, ac="none", micro_batch=1, seq_len=s, strategy="shard_grad_op"))
    g.append(dict(base, model=m8, engine="fsdp2", world_size=8, ac="full", micro_batch=1, seq_len=s, optimizer="adamw_fused"))
    g.append(dict(base, model=m8, engine="fsdp2", world_size=8, ac="full", micro_batch=1, seq_len=s, method="lora",
                  lora_targets="all-linear", lora_dropout=0.05))
    for w in (8, 64):
        g.append(dict(base, model=m8, engine="fsdp1", world_size=w, ac="full", micro_batch=1, seq_len=s))
    if not smoke:
        g.append(dict(base, model="Mistral-7B-v0.1", engine="fsdp2", world_size=8, ac="full", micro_batch=1, seq_len=s))
        g.append(dict(base, model="Llama-3.1-70B", engine="fsdp2", world_size=64, ac="full", micro_batch=1, seq_len=s))
    return g


def fsdp1_world_grid(smoke: bool) -> list[dict]:
    """FSDP1 + PEFT LoRA with PEFT's wrap policy at world size 1 (FSDP switches to NO_SHARD) and 2
    (FULL_SHARD), the same per-GPU micro-batch: on the fake process group the difference is FSDP1's
    own sharded-path work, no communication (the fms-acceleration 2-GPU rows' excess, docs/accuracy.md)."""
    model, s = ("smoke", 64) if smoke else ("Mistral-7B-v0.1", 4096)
    base = dict(kind="fsdp", smoke=smoke, steps=8, method="lora", lora_targets="all-linear", lora_dropout=0.05,
                param_dtype="bf16", reduce_dtype="fp32", optimizer="adamw_foreach", model=model, engine="fsdp1",
                ac="full", seq_len=s, wrap="peft", mixed_precision="no", use_cache=False)
    return [dict(base, world_size=w, micro_batch=mb) for mb, w in ((2, 1), (2, 2), (4, 2), (4, 1))]


def wait_for_turn() -> None:
    """A prewarmed child (``run_grid(prewarm=True)``): import the heavy libraries (no CUDA context yet),
    then wait until the previous configuration's process has exited, so its NVML reading and the
    GPU are this process's alone while the next one's imports overlap it."""
    turn = os.environ.get("SP_TURN")
    if not turn:
        return
    import accelerate  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import Trainer  # noqa: F401

    while not os.path.exists(turn):
        time.sleep(0.05)


def _start(cfg: dict, turn: Path | None) -> subprocess.Popen:
    env = dict(os.environ, **({"SP_TURN": str(turn)} if turn else {}))
    return subprocess.Popen([sys.executable, str(HERE), "one", "--config", json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _collect(p: subprocess.Popen, cfg: dict, timeout_s: int) -> dict:
    """The child's last JSON line, or its status (oom / error / timeout) with the end of its stderr."""
    try:
        stdout, stderr = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"config": cfg, "status": "timeout"}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = (stderr or stdout)[-1500:]
    return {"config": cfg, "status": "oom" if "out of memory" in err.lower() else "error", "error": err}


def run_grid(grid: list[dict], out: Path, timeout_s: int, prewarm: bool = False) -> None:
    """Each configuration in its own process, one at a time on the GPU. ``prewarm``: the next process
    starts (and imports) while the current one runs, and begins only once it has exited."""
    turns = Path(tempfile.mkdtemp(prefix="sp_turns_"))
    nxt = None
    for i, cfg in enumerate(grid):
        if cfg.get("method") == "qlora" and cfg["kind"] == "hf":
            make_checkpoint(cfg["model"])
        if prewarm:
            p = nxt or _start(cfg, turns / str(i))
            (turns / str(i)).touch()
            nxt = _start(grid[i + 1], turns / str(i + 1)) if i + 1 < len(grid) else None
        else:
            p = _start(cfg, None)
        t = time.perf_counter()
        rec = _collect(p, cfg, timeout_s)
        rec["wall_s"] = time.perf_counter() - t
        write(out, rec)
        short = {k: rec.get(k) for k in ("status", "max_allocated_bytes", "max_reserved_bytes", "nvml_used_after_steps",
                                         "wall_s")}
        print(json.dumps({"cfg": {k: v for k, v in cfg.items() if k not in ("kind", "smoke", "steps")}, **short}), flush=True)


def load_grid(out_dir: Path, smoke: bool) -> None:
    """Load-time peaks: a 1B bf16 checkpoint loaded to the GPU whole (device_map), and quantized."""
    name = "smoke" if smoke else "Llama-3.2-1B"
    ckpt = make_checkpoint(name)
    for mode in ("bf16_device_map", "nf4_device_map", "fp32_device_map"):
        cfg = {"kind": "load", "model": name, "mode": mode, "ckpt": str(ckpt), "smoke": smoke}
        p = subprocess.run([sys.executable, str(HERE), "loadone", "--config", json.dumps(cfg)], capture_output=True,
                           text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        rec = json.loads(lines[-1]) if p.returncode == 0 and lines else {"config": cfg, "status": "error",
                                                                          "error": (p.stderr or "")[-1500:]}
        write(out_dir / "load.jsonl", rec)
        print(json.dumps(rec)[:400], flush=True)


def load_one(cfg: dict) -> dict:
    import torch
    import transformers

    dev = "cuda" if torch.cuda.is_available() and not cfg["smoke"] else "cpu"
    rec = {"config": cfg, "status": "ok", "nvml_before": nvml_used_bytes()}
    kw = {"device_map": {"": 0 if dev == "cuda" else "cpu"}}
    if cfg["mode"].startswith("nf4"):
        kw["quantization_config"] = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                                   bnb_4bit_use_double_quant=True,
                                                                   bnb_4bit_compute_dtype=torch.bfloat16)
        kw["dtype"] = torch.bfloat16
    else:
        kw["dtype"] = torch.float32 if cfg["mode"].startswith("fp32") else torch.bfloat16
    t = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(cfg["ckpt"], **kw)
    rec["load_s"] = time.perf_counter() - t
    if dev == "cuda":
        torch.cuda.synchronize()
        rec.update(load_max_allocated_bytes=torch.cuda.max_memory_allocated(),
                   load_max_reserved_bytes=torch.cuda.max_memory_reserved(),
                   after_load_allocated_bytes=torch.cuda.memory_allocated(), nvml_after_load=nvml_used_bytes())
    rec["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    rec["env"] = environment()
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=("probes", "hf", "qlora", "fsdp", "fsdp1world", "load", "one", "loadone", "mkckpt",
                                     "list", "userscripts"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    ap.add_argument("--config")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: check the code paths")
    ap.add_argument("--only", type=int, nargs="*", help="indices of the grid to run")
    ap.add_argument("--unmeasured", action="store_true",
                    help="userscripts: only the configurations with no committed ok record")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--steps", type=int, help="hf / qlora / fsdp: steps per configuration (default: the grid's 3)")
    a = ap.parse_args(argv)
    if a.part == "one":
        cfg = json.loads(a.config)
        if cfg["kind"] == "user":  # the scripts users launch (gpu_userscripts.py)
            from gpu_userscripts import run_user

            wait_for_turn()
            print(json.dumps(run_user(cfg)), flush=True)
            return 0
        print(json.dumps(run_one(cfg)), flush=True)
        return 0
    if a.part == "mkckpt":
        _make_checkpoint_here(json.loads(a.config)["model"])
        return 0
    if a.part == "loadone":
        print(json.dumps(load_one(json.loads(a.config))), flush=True)
        return 0
    if a.part == "probes":
        run_probes(a.out, a.smoke)
        return 0
    if a.part == "load":
        load_grid(a.out, a.smoke)
        return 0
    if a.part == "userscripts":
        from gpu_userscripts import unmeasured, user_grid

        if not a.smoke:
            make_checkpoint("Llama-3.2-1B")  # QLoRA loads it quantized; made before any run is timed
        grid = user_grid(a.smoke)
        pick = a.only or (unmeasured(grid) if a.unmeasured else range(len(grid)))
        run_grid([grid[i] for i in pick], a.out / "userscripts.jsonl", a.timeout, prewarm=True)
        return 0
    grid = {"hf": [c for c in hf_grid(a.smoke) if c["method"] != "qlora"],
            "qlora": [c for c in hf_grid(a.smoke) if c["method"] == "qlora"], "fsdp": fsdp_grid(a.smoke),
            "fsdp1world": fsdp1_world_grid(a.smoke)}.get(a.part, [])
    if a.part == "list":
        for i, c in enumerate(hf_grid(a.smoke) + fsdp_grid(a.smoke)):
            print(i, c)
        return 0
    if a.only:
        grid = [grid[i] for i in a.only]
    if a.steps:
        grid = [dict(c, steps=a.steps) for c in grid]
    run_grid(grid, a.out / f"{a.part}.jsonl", a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
