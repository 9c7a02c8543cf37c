"""FSDP2 (``fully_shard``) and FSDP1 (``FullyShardedDataParallel``) Python snippets.

Each snippet defines ``shard_model(model, device_type="cuda")`` (call it on every rank after
``init_process_group``) and ``make_optimizer(model)``; module-level constants carry the plan's
numbers so ``read_back`` can parse them. torch API names follow torch 2.6+
(``torch.distributed.fsdp.fully_shard``, ``MixedPrecisionPolicy``, ``CPUOffloadPolicy``).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable

from shardplan.exporters.spec import LORA_TARGET_MODULES, PlanSpec
from shardplan.support.errors import ShardplanError

FSDP1_STRATEGY = {"no_shard": "NO_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "full_shard": "FULL_SHARD",
                  "hybrid_shard": "HYBRID_SHARD", "hybrid_shard_zero2": "_HYBRID_SHARD_ZERO2"}

_OPTIMIZERS = {
    "adamw": "    return torch.optim.AdamW(params, lr=lr)",
    "sgd": "    return torch.optim.SGD(params, lr=lr, momentum=0.9)",
    "sgd-plain": "    return torch.optim.SGD(params, lr=lr)",
    "adafactor": "    return torch.optim.Adafactor(params, lr=lr)",
    "adamw-8bit": "    import bitsandbytes as bnb  # pip install bitsandbytes\n    return bnb.optim.AdamW8bit(params, lr=lr)",
    "lion": "    from lion_pytorch import Lion  # pip install lion-pytorch\n    return Lion(params, lr=lr)",
}


def _comment(spec: PlanSpec, engine: str) -> str:
    note = (f"NOTE: the plan's memory was predicted for engine {spec.engine}; this is the {engine} form"
            if spec.engine != engine else None)
    return spec.comment_header(note)


def _check_engine(spec: PlanSpec, engine: str) -> None:
    if spec.strategy in ("zero1", "zero2"):
        raise ShardplanError("strategy", spec.strategy, f"exists only in DeepSpeed; export --to deepspeed, not {engine}")


def _checkpoint_every(spec: PlanSpec) -> int:
    return {"none": 0, "full": 1, "selective": 1, "selective-op": 1, "every-k": spec.ac_every_k}[spec.ac]


def _literal(value: str) -> str:
    """A string from the plan as a Python literal, never pasted between hand-made quotes: JSON's
    string escapes mean the same in Python, and its double quotes match the rest of the script."""
    return json.dumps(value)


def _constants(spec: PlanSpec, mesh: bool) -> str:
    lines = [f"BLOCK_CLASS = {_literal(spec.block_class)}  # one FSDP unit per transformer block"]
    if mesh:
        if spec.hybrid or spec.strategy == "no_shard":
            lines.append(f"MESH_SHAPE = ({spec.replicate_size}, {spec.shard_size})  # (replicate, shard)")
        else:
            lines.append(f"MESH_SHAPE = ({spec.world_size},)  # (shard,)")
    lines += [f"CHECKPOINT_EVERY = {_checkpoint_every(spec)}  # activation checkpointing ({spec.ac}); 0 = off",
              f"MICRO_BATCH = {spec.micro_batch}  # sequences per GPU per forward",
              f"GRAD_ACCUM = {spec.grad_accum}  # micro-batches per optimizer step",
              f"SEQ_LEN = {spec.seq_len}"]
    if spec.hf_id:
        lines.append(f"MODEL_ID = {_literal(spec.hf_id)}")
    if spec.peft:
        targets = LORA_TARGET_MODULES.get(spec.lora_targets, spec.lora_targets)
        lines += [f"LORA_RANK = {spec.lora_rank}", f"LORA_TARGETS = {targets!r}"]
    return "\n".join(lines)


def _imports_ac(spec: PlanSpec) -> str:
    if not spec.checkpointed:
        return ""
    text = "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper\n"
    if spec.ac in SAC_MODES:
        text += "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts\n"
    return text


_SAC = '''
# Selective activation checkpointing: keep matmul and attention outputs, recompute the rest.
_SAVE = {getattr(torch.ops.aten, n).default for n in ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu")
         if hasattr(torch.ops.aten, n)}


def _sac_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def _sac_context():
    return create_selective_checkpoint_contexts(_sac_policy)
'''


# torchtitan's op-level SAC (models/llama3/infra/parallelize.py _get_custom_policy): the same save
# list, but every second matmul of a block is recomputed (activations.op_sac_saved_linear_width)
_SAC_OP = '''
# Selective activation checkpointing as torchtitan's op-level SAC: keep the attention outputs and
# every odd matmul output of each block (counted in forward order), recompute the rest.
_SAVE = {getattr(torch.ops.aten, n).default for n in ("mm", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu")
         if hasattr(torch.ops.aten, n)}


def _sac_context():
    count = {"forward": 0, "recompute": 0}

    def _sac_policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == torch.ops.aten.mm.default:
            count[mode] += 1
            if count[mode] % 2 == 0:  # every second mm is recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(_sac_policy)
'''
SAC_MODES = ("selective", "selective-op")


def _sac(spec: PlanSpec) -> str:
    """The policy text a selective mode needs ('' for the others)."""
    return {"selective": _SAC, "selective-op": _SAC_OP}.get(spec.ac, "")


def _wrap_call(spec: PlanSpec) -> str:
    return "checkpoint_wrapper(block, context_fn=_sac_context)" if spec.ac in SAC_MODES else "checkpoint_wrapper(block)"


def _load_model(spec: PlanSpec) -> str:
    """A Hugging Face loader matching the plan's dtypes and method (imports inside: optional)."""
    if not spec.hf_id:
        return ""
    dtype = "torch.bfloat16" if spec.precision == "bf16-pure" or spec.peft else "torch.float32"
    body = ["def load_model(model_id=MODEL_ID):",
            '    """Load the model the plan is for (transformers; LoRA via peft, QLoRA via bitsandbytes)."""',
            "    from transformers import AutoModelForCausalLM"]
    kwargs = f"torch_dtype={dtype}"
    if spec.method == "qlora":
        body += ["    from transformers import BitsAndBytesConfig",
                 "    # bnb_4bit_quant_storage=bfloat16 lets FSDP shard the 4-bit weights as bf16 storage",
                 '    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,',
                 "                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)"]
        kwargs += ", quantization_config=quant"
    body.append(f"    model = AutoModelForCausalLM.from_pretrained(model_id, {kwargs})")
    if spec.peft:
        body += ["    from peft import LoraConfig, get_peft_model",
                 "    config = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=LORA_TARGETS, task_type=\"CAUSAL_LM\")",
                 "    model = get_peft_model(model, config)  # adapters are upcast to fp32 (peft autocast_adapter_dtype)"]
    if spec.checkpointed:
        body.append("    model.config.use_cache = False")
    body.append("    return model")
    return "\n\n" + "\n".join(body) + "\n"


# torch.optim.AdamW's flag for the plan's optimizer_impl (its step time and temporaries assumed it)
_ADAMW_IMPL = {"fused": "fused=True", "foreach": "foreach=True", "for_loop": "foreach=False"}


def _optimizer(spec: PlanSpec) -> str:
    line = _OPTIMIZERS[spec.optimizer]
    if spec.optimizer == "adamw" and spec.optimizer_impl in _ADAMW_IMPL:
        line = line.replace("lr=lr)", f"lr=lr, {_ADAMW_IMPL[spec.optimizer_impl]})")
    return ("\n\ndef make_optimizer(model, lr=1e-5):\n"
            "    params = [p for p in model.parameters() if p.requires_grad]\n" + line + "\n")


def _ddp_body(spec: PlanSpec) -> str:
    lines = ["def shard_model(model, device_type=\"cuda\"):",
             '    """DDP: every rank holds the whole model; gradients are all-reduced in buckets."""']
    if spec.precision == "bf16-pure":
        lines.append("    model = model.to(torch.bfloat16)")
    if spec.checkpointed:
        lines += ["    blocks = [(parent, name, child) for parent in model.modules()",
                  "              for name, child in parent.named_children() if type(child).__name__ == BLOCK_CLASS]",
                  "    for i, (parent, name, block) in enumerate(blocks):",
                  "        if CHECKPOINT_EVERY and i % CHECKPOINT_EVERY == 0:",
                  f"            parent.register_module(name, {_wrap_call(spec)})"]
    if spec.strategy == "single":
        lines[1] = '    """single: one GPU, no wrapper: the whole model on the device (no DDP, no FSDP)."""'
        lines += ["    return model.to(device_type)"]
    else:
        lines += ["    device_ids = [torch.cuda.current_device()] if device_type == \"cuda\" else None",
                  "    return DistributedDataParallel(model, device_ids=device_ids)"]
    if spec.precision in ("bf16-mixed", "fp16-mixed"):
        dt = "bfloat16" if spec.precision == "bf16-mixed" else "float16"
        lines.append(f"# mixed precision: run forward under torch.autocast(device_type, dtype=torch.{dt})")
    return "\n".join(lines)


def _shard_model_head(spec: PlanSpec) -> list[str]:
    """The opening lines of the ``shard_model`` function both FSDP exporters write."""
    body = [
        'def shard_model(model, device_type="cuda"):',
        '    """Apply the plan on every rank, after torch.distributed.init_process_group()."""',
    ]
    if spec.precision == "bf16-pure":
        body.append("    model = model.to(torch.bfloat16)  # bf16-pure: params, grads and optimizer in bf16")
    return body


def _snippet(spec: PlanSpec, engine: str, sharded: Callable[[PlanSpec], tuple[str, str, str]]) -> str:
    """The file both FSDP exporters write: torch DDP for the ``ddp`` strategy and the bare module for
    ``single`` whichever engine was asked; for the sharded strategies the engine's ``sharded(spec)``
    gives its imports, constants and ``shard_model``."""
    _check_engine(spec, engine)
    head = _comment(spec, engine) + "\nimport torch\n"
    if spec.strategy in ("ddp", "single"):
        ddp = "from torch.nn.parallel import DistributedDataParallel\n" if spec.strategy != "single" else ""
        imports, consts, body = ddp + _imports_ac(spec), _constants(spec, mesh=False), _ddp_body(spec)
    else:
        imports, consts, body = sharded(spec)
    return (head + imports + "\n" + consts + "\n" + _sac(spec)
            + "\n\n" + body + "\n" + _optimizer(spec) + _load_model(spec))


def fsdp2_snippet(spec: PlanSpec) -> str:
    return _snippet(spec, "fsdp2", _fsdp2_sharded)


def fsdp1_snippet(spec: PlanSpec) -> str:
    return _snippet(spec, "fsdp1", _fsdp1_sharded)


def _fsdp2_sharded(spec: PlanSpec) -> tuple[str, str, str]:
    param, reduce, _ = spec.dtypes
    mp = (f"MixedPrecisionPolicy(param_dtype=torch.{param}, reduce_dtype=torch.{reduce})" if param
          else "MixedPrecisionPolicy()")
    offload = ('CPUOffloadPolicy(pin_memory=device_type == "cuda")' if spec.offload != "none" else "OffloadPolicy()")
    names = '("replicate", "shard")' if spec.hybrid or spec.strategy == "no_shard" else '("shard",)'
    imports = ("from torch.distributed.device_mesh import init_device_mesh\n"
               "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard\n"
               + _imports_ac(spec))
    consts = _constants(spec, mesh=True) + (f"\nRESHARD_AFTER_FORWARD = {spec.reshard_after_forward}  "
                                            f"# {spec.strategy}: {'free' if spec.reshard_after_forward else 'keep'} "
                                            "gathered params after forward")
    body = _shard_model_head(spec)
    body += [
        f"    mesh = init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names={names})",
        "    kwargs = dict(",
        "        mesh=mesh,",
        "        reshard_after_forward=RESHARD_AFTER_FORWARD,",
        f"        mp_policy={mp},",
        f"        offload_policy={offload},",
        "    )",
        "    blocks = [(parent, name, child) for parent in model.modules()",
        "              for name, child in parent.named_children() if type(child).__name__ == BLOCK_CLASS]",
        "    if not blocks:",
        '        raise ValueError(f"no {BLOCK_CLASS} modules in the model")',
        "    for i, (parent, name, block) in enumerate(blocks):",
        "        if CHECKPOINT_EVERY and i % CHECKPOINT_EVERY == 0:",
        f"            block = {_wrap_call(spec)}",
        "            parent.register_module(name, block)",
        "        fully_shard(block, **kwargs)",
        "    fully_shard(model, **kwargs)  # root: embeddings, final norm, lm_head",
        "    return model",
    ]
    if spec.precision == "fp16-mixed":
        body.append("# fp16: scale the loss, e.g. torch.amp.GradScaler(device_type)")
    if spec.offload == "optimizer":
        body.append("# FSDP offloads params, grads and optimizer together: CPUOffloadPolicy")
    return imports, consts, "\n".join(body)


def _fsdp1_sharded(spec: PlanSpec) -> tuple[str, str, str]:
    param, reduce, buffer = spec.dtypes
    mp = (f"MixedPrecision(param_dtype=torch.{param}, reduce_dtype=torch.{reduce}, buffer_dtype=torch.{buffer})"
          if param else "None")
    imports = ("from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, FullyShardedDataParallel, "
               "MixedPrecision, ShardingStrategy\n"
               "from torch.distributed.fsdp.wrap import ModuleWrapPolicy\n")
    if spec.hybrid:
        imports += "from torch.distributed.device_mesh import init_device_mesh\n"
    if spec.checkpointed:
        imports += ("from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import "
                    "apply_activation_checkpointing, checkpoint_wrapper\n")
        if spec.ac in SAC_MODES:
            imports += "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts\n"
    prefetch = "None" if spec.backward_prefetch == "NONE" else f"BackwardPrefetch.{spec.backward_prefetch}"
    body = _shard_model_head(spec)
    body += [
        "    block_classes = {type(m) for m in model.modules() if type(m).__name__ == BLOCK_CLASS}",
        "    if not block_classes:",
        '        raise ValueError(f"no {BLOCK_CLASS} modules in the model")',
    ]
    extra = ""
    if spec.hybrid:
        body.append('    mesh = init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=("replicate", "shard"))')
        extra = "\n        device_mesh=mesh,"
    body += [
        "    model = FullyShardedDataParallel(",
        "        model,",
        f"        sharding_strategy=ShardingStrategy.{FSDP1_STRATEGY[spec.strategy]},",
        "        auto_wrap_policy=ModuleWrapPolicy(block_classes),",
        f"        mixed_precision={mp},",
        f"        cpu_offload=CPUOffload(offload_params={spec.offload != 'none'}),",
        f"        backward_prefetch={prefetch},",
        f"        forward_prefetch={spec.forward_prefetch},",
        f"        limit_all_gathers={spec.limit_all_gathers},",
        "        use_orig_params=True,",
        '        device_id=torch.cuda.current_device() if device_type == "cuda" else torch.device("cpu"),' + extra,
        "    )",
    ]
    if spec.checkpointed:
        wrapper = ("lambda m: checkpoint_wrapper(m, context_fn=_sac_context)" if spec.ac in SAC_MODES
                   else "checkpoint_wrapper")
        body += [
            "    blocks = [m for m in model.modules() if type(m).__name__ == BLOCK_CLASS]",
            "    chosen = {id(b) for i, b in enumerate(blocks) if CHECKPOINT_EVERY and i % CHECKPOINT_EVERY == 0}",
            f"    apply_activation_checkpointing(model, checkpoint_wrapper_fn={wrapper}, check_fn=lambda m: id(m) in chosen)",
        ]
    body.append("    return model")
    if spec.precision == "fp16-mixed":
        body.append("# fp16: scale the loss with torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler")
    if spec.offload == "optimizer":
        body.append("# FSDP offloads params, grads and optimizer together: CPUOffload(offload_params=True)")
    return imports, _constants(spec, mesh=spec.hybrid), "\n".join(body)


# --- reading back --------------------------------------------------------------------------------
def _constants_of(text: str) -> dict[str, Any]:
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                try:
                    out[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return out


def read_back(text: str) -> dict[str, Any]:
    """Knobs as the code itself states them (constants, policies, strategy), plus ``header``: the
    plan line of the comment header."""
    c = _constants_of(text)
    fsdp1 = "FullyShardedDataParallel(" in text
    strategy, shard, world = _layout_of(text, c, fsdp1)
    every = c["CHECKPOINT_EVERY"]
    ac = ("none" if not every else "selective-op" if "every second mm is recomputed" in text
          else "selective" if "create_selective_checkpoint_contexts" in text
          else "full" if every == 1 else "every-k")
    offload = "optimizer+params" if ("CPUOffloadPolicy(pin" in text or "offload_params=True" in text) else "none"
    out: dict[str, Any] = {
        "engine": "fsdp1" if fsdp1 else "fsdp2", "strategy": strategy, "precision": _precision_of(text), "ac": ac,
        "offload": offload, "micro_batch": c["MICRO_BATCH"], "grad_accum": c["GRAD_ACCUM"], "seq_len": c["SEQ_LEN"],
        "block_class": c["BLOCK_CLASS"],
        "method": "qlora" if "load_in_4bit=True" in text else "lora" if "LORA_RANK" in c else "full",
    }
    if ac == "every-k":
        out["ac_every_k"] = every
    if shard is not None:
        out["shard_group_size"] = shard
    if world is not None:
        out["world_size"] = world
    if "LORA_RANK" in c:
        out["lora_rank"] = c["LORA_RANK"]
    if fsdp1 and "DistributedDataParallel(" not in text and strategy != "single":
        out.update(_fsdp1_prefetch_of(text))
    opt = re.search(r"return (torch\.optim\.(\w+)|bnb\.optim\.(\w+)|Lion)\((.*)\)", text)
    sgd = "sgd" if "momentum" in opt.group(4) else "sgd-plain"
    out["optimizer"] = {"AdamW": "adamw", "SGD": sgd, "Adafactor": "adafactor", "AdamW8bit": "adamw-8bit",
                        None: "lion"}[opt.group(2) or opt.group(3)]
    header = re.search(r"^# shardplan-plan: (.*)$", text, re.MULTILINE)
    out["header"] = json.loads(header.group(1)) if header else None
    return out


def _layout_of(text: str, c: dict[str, Any], fsdp1: bool) -> tuple[str, int | None, int | None]:
    """(strategy, shard group size, world size) from the wrapper the code calls, FSDP1's
    ``ShardingStrategy`` or FSDP2's ``MESH_SHAPE`` and ``RESHARD_AFTER_FORWARD``."""
    mesh = c.get("MESH_SHAPE")
    world = None
    if "DistributedDataParallel(" in text:
        strategy, shard = "ddp", 1
    elif "single: one GPU, no wrapper" in text:
        strategy, shard = "single", 1
    elif fsdp1:
        name = re.search(r"ShardingStrategy\.(\w+)", text).group(1)
        strategy = {v: k for k, v in FSDP1_STRATEGY.items()}[name]
        shard = mesh[1] if mesh else None
    else:
        reshard = c["RESHARD_AFTER_FORWARD"]
        if len(mesh) == 1:
            strategy, shard, world = ("full_shard" if reshard else "shard_grad_op"), mesh[0], mesh[0]
        elif mesh[1] == 1:
            strategy, shard = "no_shard", 1
        else:
            strategy, shard = ("hybrid_shard" if reshard else "hybrid_shard_zero2"), mesh[1]
    if mesh:
        world = mesh[0] * (mesh[1] if len(mesh) > 1 else 1)
    return strategy, shard, world


def _precision_of(text: str) -> str:
    """The precision the code trains in: a pure-bf16 cast, a ``param_dtype`` policy, autocast, or fp32."""
    dtype = re.search(r"param_dtype=torch\.(\w+)", text)
    if "model.to(torch.bfloat16)" in text:
        return "bf16-pure"
    if dtype:
        return {"bfloat16": "bf16-mixed", "float16": "fp16-mixed"}[dtype.group(1)]
    if "torch.autocast" in text:
        return "bf16-mixed" if "torch.bfloat16)" in text else "fp16-mixed"
    return "fp32"


def _fsdp1_prefetch_of(text: str) -> dict[str, Any]:
    """FSDP1's prefetch knobs as the ``FullyShardedDataParallel(...)`` call states them."""
    m = re.search(r"backward_prefetch=BackwardPrefetch\.(\w+)", text)
    return {"forward_prefetch": "forward_prefetch=True" in text,
            "limit_all_gathers": "limit_all_gathers=True" in text,
            "backward_prefetch": m.group(1) if m else "NONE"}
