"""Hugging Face exports: an ``accelerate`` config YAML and ``transformers`` Trainer flags.

accelerate keys as ``accelerate config`` writes them (accelerate 1.x ``commands/config/cluster.py``):
FSDP2 is ``fsdp_version: 2`` with a boolean ``fsdp_reshard_after_forward``; FSDP1 takes the
strategy name there; HSDP under FSDP2 is ``parallelism_config`` (``dp_replicate_size`` ×
``dp_shard_size``). DeepSpeed plans use ``distributed_type: DEEPSPEED`` with the inline
``deepspeed_config`` keys. Trainer flags follow ``TrainingArguments`` (``--fsdp``,
``--fsdp_config`` as inline JSON, ``--deepspeed`` as inline JSON).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from shardplan.exporters.deepspeed import deepspeed_config
from shardplan.exporters.fsdp import FSDP1_STRATEGY
from shardplan.exporters.launch import launcher_prefix
from shardplan.exporters.spec import LORA_TARGET_MODULES, PlanSpec
from shardplan.inputs.engine_lookup import get_engine, runs_deepspeed
from shardplan.support.errors import ShardplanError
from shardplan.support.extras import require

MIXED = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16-pure": "bf16", "fp32": "no"}
# Transformers' optim='sgd' builds torch.optim.SGD with the learning rate only (momentum 0): the
# sgd-plain plan's optimizer; read back, 'sgd' stays the momentum plan it was written for
HF_OPTIM = {"adamw": "adamw_torch", "sgd": "sgd", "sgd-plain": "sgd", "adafactor": "adafactor", "adamw-8bit": "adamw_bnb_8bit",
            "lion": "lion_32bit"}


def _comment(spec: PlanSpec) -> str:
    return spec.comment_header() + "\n"


def _fsdp_engine(spec: PlanSpec) -> int:
    if spec.strategy in ("zero1", "zero2"):
        raise ShardplanError("strategy", spec.strategy, "exists only in DeepSpeed; use --engine deepspeed")
    return 2 if get_engine(spec.engine).layout.value == "per_tensor" else 1  # FSDP2 shards per parameter


def accelerate_config(spec: PlanSpec) -> dict[str, Any]:
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if runs_deepspeed(spec.engine):
        ds = deepspeed_config(spec)  # raises on combinations DeepSpeed cannot express
        z = ds["zero_optimization"]
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "zero_stage": z["stage"],
            "offload_optimizer_device": z.get("offload_optimizer", {}).get("device", "none"),
            "offload_param_device": z.get("offload_param", {}).get("device", "none"),
            "gradient_accumulation_steps": spec.grad_accum,
            "gradient_clipping": 1.0,
            "zero3_init_flag": z["stage"] == 3,
        }
        if spec.nodes > 1:
            cfg["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
    elif spec.strategy in ("ddp", "single"):  # one process without a wrapper is accelerate's "NO"
        cfg["distributed_type"] = "MULTI_GPU" if spec.world_size > 1 else "NO"
    else:
        version = _fsdp_engine(spec)
        fsdp: dict[str, Any] = {
            "fsdp_version": version,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": spec.block_class,
            "fsdp_reshard_after_forward": (spec.reshard_after_forward if version == 2
                                           else FSDP1_STRATEGY[spec.strategy].lstrip("_")),
            "fsdp_offload_params": spec.offload != "none",
            "fsdp_activation_checkpointing": spec.checkpointed,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        }
        if version == 1:
            # accelerate 1.x launch always exports FSDP_SHARDING_STRATEGY (default FULL_SHARD) and the
            # FSDP1 plugin prefers it over fsdp_reshard_after_forward: state it too.
            fsdp.update(fsdp_sharding_strategy=FSDP1_STRATEGY[spec.strategy].lstrip("_"))
            fsdp.update(fsdp_backward_prefetch=spec.backward_prefetch if spec.backward_prefetch != "NONE" else "NO_PREFETCH",
                        fsdp_forward_prefetch=spec.forward_prefetch, fsdp_use_orig_params=True)
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = fsdp
        if version == 2 and spec.strategy in ("hybrid_shard", "no_shard", "hybrid_shard_zero2"):
            cfg["parallelism_config"] = {"parallelism_config_dp_replicate_size": spec.replicate_size,
                                         "parallelism_config_dp_shard_size": spec.shard_size}
    cfg["downcast_bf16"] = "no"
    cfg["machine_rank"] = 0
    cfg["main_training_function"] = "main"
    cfg["mixed_precision"] = MIXED[spec.precision]
    cfg["num_machines"] = spec.nodes
    cfg["num_processes"] = spec.world_size
    if spec.nodes > 1:
        cfg.update(main_process_ip="MASTER_ADDR", main_process_port=29500, rdzv_backend="c10d", same_network=True)
    else:
        cfg.update(rdzv_backend="static", same_network=True)
    cfg.update(tpu_env=[], tpu_use_cluster=False, tpu_use_sudo=False, use_cpu=False)
    return cfg


def accelerate_yaml(spec: PlanSpec) -> str:
    notes = []
    if spec.nodes > 1:
        notes.append("# multi-node: replace MASTER_ADDR with node 0's address and set machine_rank per node")
    if spec.ac in ("selective", "selective-op", "every-k"):
        notes.append(f"# activation checkpointing '{spec.ac}' has no accelerate key: full checkpointing is enabled")
    if spec.peft:
        notes.append(f"# {spec.method}: apply peft LoraConfig(r={spec.lora_rank}, target_modules="
                     f"{LORA_TARGET_MODULES.get(spec.lora_targets, spec.lora_targets)!r}) in the training script")
    yaml = require("yaml", "export")
    body = yaml.safe_dump(accelerate_config(spec), sort_keys=False, default_flow_style=False)
    return _comment(spec) + "".join(n + "\n" for n in notes) + body


def read_back_accelerate(text: str) -> dict[str, Any]:
    yaml = require("yaml", "export")
    c = yaml.safe_load(text)
    out: dict[str, Any] = {"world_size": c["num_processes"], "nodes": c["num_machines"]}
    precision = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "no": "fp32"}[c["mixed_precision"]]
    out["precision"] = precision
    if c["distributed_type"] == "DEEPSPEED":
        d = c["deepspeed_config"]
        out.update(engine="deepspeed", zero_stage=d["zero_stage"], grad_accum=d["gradient_accumulation_steps"],
                   offload="optimizer+params" if d["offload_param_device"] != "none"
                   else "optimizer" if d["offload_optimizer_device"] != "none" else "none")
    elif c["distributed_type"] == "MULTI_GPU":
        out.update(strategy="ddp")
    elif c["distributed_type"] == "NO":  # one process, no wrapper
        out.update(strategy="single")
    else:
        f = c["fsdp_config"]
        version = f["fsdp_version"]
        reshard = f["fsdp_reshard_after_forward"]
        p = c.get("parallelism_config") or {}
        if version == 2:
            shard = p.get("parallelism_config_dp_shard_size", c["num_processes"])
            if shard == 1:
                strategy = "no_shard"
            elif p:
                strategy = "hybrid_shard" if reshard else "hybrid_shard_zero2"
            else:
                strategy = "full_shard" if reshard else "shard_grad_op"
            out["shard_group_size"] = shard
        else:
            strategy = {v.lstrip("_"): k for k, v in FSDP1_STRATEGY.items()}[reshard]
            out["backward_prefetch"] = f["fsdp_backward_prefetch"]
            out["forward_prefetch"] = f["fsdp_forward_prefetch"]
        out.update(engine=f"fsdp{version}", strategy=strategy, block_class=f["fsdp_transformer_layer_cls_to_wrap"],
                   offload="optimizer+params" if f["fsdp_offload_params"] else "none",
                   checkpointed=f["fsdp_activation_checkpointing"])
    return out


# --- Trainer flags ------------------------------------------------------------------------------
def trainer_args(spec: PlanSpec) -> list[str]:
    """TrainingArguments flags (without the launcher)."""
    args = ["--per_device_train_batch_size", str(spec.micro_batch),
            "--gradient_accumulation_steps", str(spec.grad_accum),
            "--optim", HF_OPTIM[spec.optimizer]]
    if spec.precision in ("bf16-mixed", "bf16-pure"):
        args.append("--bf16")
    elif spec.precision == "fp16-mixed":
        args.append("--fp16")
    fsdp_ac = False
    if runs_deepspeed(spec.engine):
        args += ["--deepspeed", json.dumps(deepspeed_config(spec), separators=(",", ":"))]
    elif spec.strategy not in ("ddp", "single"):
        version = _fsdp_engine(spec)
        # FSDP2 takes only full_shard / shard_grad_op here (its HSDP mesh comes from accelerate's
        # parallelism_config); FSDP1 takes every ShardingStrategy name.
        sharding = (("full_shard" if spec.reshard_after_forward else "shard_grad_op") if version == 2
                    else spec.strategy)
        options = [sharding, "auto_wrap"] + (["offload"] if spec.offload != "none" else [])
        config: dict[str, Any] = {"version": version, "transformer_layer_cls_to_wrap": [spec.block_class],
                                  "cpu_ram_efficient_loading": True, "state_dict_type": "SHARDED_STATE_DICT"}
        if version == 2:
            config["reshard_after_forward"] = spec.reshard_after_forward
        else:
            config.update(backward_prefetch=spec.backward_prefetch.lower() if spec.backward_prefetch != "NONE" else "no_prefetch",
                          forward_prefetch=spec.forward_prefetch, limit_all_gathers=spec.limit_all_gathers,
                          use_orig_params=True, sync_module_states=True)
        if spec.checkpointed:
            config["activation_checkpointing"] = True   # FSDP's own AC; no redundant all-gather
            fsdp_ac = True
        if spec.offload != "none":
            config["cpu_offload"] = True
        args += ["--fsdp", " ".join(options), "--fsdp_config", json.dumps(config, separators=(",", ":"))]
    if spec.checkpointed and not fsdp_ac:
        args.append("--gradient_checkpointing")
    return args


def trainer_flags(spec: PlanSpec) -> str:
    lines = [_comment(spec).rstrip("\n")]
    if (not runs_deepspeed(spec.engine) and spec.strategy not in ("ddp", "single", "full_shard", "shard_grad_op")
            and get_engine(spec.engine).layout.value == "per_tensor"):
        lines.append(f"# FSDP2 {spec.strategy} (a {spec.replicate_size}x{spec.shard_size} mesh) needs accelerate's "
                     "parallelism_config: launch with `accelerate launch --config_file` the accelerate export")
    if spec.ac in ("selective", "selective-op", "every-k"):
        lines.append(f"# activation checkpointing '{spec.ac}': Trainer checkpoints every block (full)")
    if spec.peft:
        targets = LORA_TARGET_MODULES.get(spec.lora_targets, spec.lora_targets)
        targets = targets if isinstance(targets, str) else " ".join(targets)
        trl = f"--use_peft --lora_r {spec.lora_rank} --lora_alpha {2 * spec.lora_rank} --lora_target_modules {targets}"
        if spec.method == "qlora":
            trl += " --load_in_4bit --bnb_4bit_quant_type nf4 --use_bnb_nested_quant"
        lines.append(f"# {spec.method} with TRL's sft script (trl ModelConfig) adds: {trl}")
        if spec.method == "qlora":
            lines.append("# and BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16) so FSDP can shard the 4-bit weights")
    launcher = launcher_prefix(spec)
    args = trainer_args(spec)
    parts = [launcher + " train.py"]
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            parts.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            parts.append(args[i])
            i += 1
    lines.append(" \\\n  ".join(parts))
    return "\n".join(lines) + "\n"


def trainer_cli_args(text: str) -> list[str]:
    """The TrainingArguments part of a trainer export (tokens after ``train.py``)."""
    code = " ".join(line for line in text.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#"))
    tokens = shlex.split(code)
    return tokens[tokens.index("train.py") + 1:]


def read_back_trainer(text: str) -> dict[str, Any]:
    args = trainer_cli_args(text)
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            values[args[i][2:]] = args[i + 1]
            i += 2
        else:
            values[args[i][2:]] = True
            i += 1
    out: dict[str, Any] = {"micro_batch": int(values["per_device_train_batch_size"]),
                           "grad_accum": int(values["gradient_accumulation_steps"]),
                           "optimizer": {v: k for k, v in HF_OPTIM.items() if k != "sgd-plain"}[values["optim"]],
                           "precision": "bf16-mixed" if "bf16" in values else "fp16-mixed" if "fp16" in values else "fp32"}
    if "deepspeed" in values:
        from shardplan.exporters.deepspeed import read_back as ds_read

        out.update({k: v for k, v in ds_read(values["deepspeed"]).items() if k not in ("precision", "optimizer")})
        out["checkpointed"] = "gradient_checkpointing" in values
    elif "fsdp" in values:
        options = values["fsdp"].split()
        config = json.loads(values["fsdp_config"])
        out.update(engine=f"fsdp{config['version']}", sharding=options[0],
                   offload="optimizer+params" if "offload" in options else "none",
                   block_class=config["transformer_layer_cls_to_wrap"][0],
                   checkpointed=bool(config.get("activation_checkpointing")))
        if config["version"] == 2:
            out["reshard_after_forward"] = config["reshard_after_forward"]
    else:
        out.update(strategy="ddp", checkpointed="gradient_checkpointing" in values)
    return out
