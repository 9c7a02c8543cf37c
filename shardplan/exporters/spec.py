"""PlanSpec: everything an exporter needs to write a framework config for one plan.

Built from a ``FitResult`` (``shardplan fit --json``), a planner plan, or any dict with the same
keys. Frozen; exporters only read it. Derived framework values (dtypes, mesh shape, ZeRO stage,
global batch) are properties here so every exporter spells them the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, PositiveInt, field_validator, model_validator

from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig
from shardplan.support.errors import ShardplanError

KNOBS = ("strategy", "engine", "precision", "optimizer", "ac", "ac_every_k", "offload", "method", "lora_rank",
         "lora_targets", "micro_batch", "grad_accum", "seq_len", "shard_group_size", "reduce_dtype")

# precision -> (param, reduce, buffer) dtypes as torch names; None = keep the stored dtype.
DTYPES = {
    "bf16-mixed": ("bfloat16", "float32", "float32"),
    "fp16-mixed": ("float16", "float32", "float32"),
    "bf16-pure": (None, None, None),   # the model itself is cast to bf16; nothing to mix
    "fp32": (None, None, None),
}
# reduce_dtype knob (st.REDUCE_DTYPES, "param" resolved by st.reduce_dtype_name) -> torch name
TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# peft target_modules per shardplan lora_targets (Llama-style projection names).
LORA_TARGET_MODULES = {"all-linear": "all-linear", "attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
                       "qv": ["q_proj", "v_proj"],
                       "all-linear+embeddings": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj", "embed_tokens", "lm_head"]}
# The stack and the stack knobs a plan's numbers assumed (carried into every export's header).
STACK_FIELDS = ("stack", "logits_fp32", "ce_chunks", "optimizer_in_backward", "activation_offload", "fp32_master",
                "paged_optimizer", "lora_dropout", "reentrant_checkpointing", "quant_state_sharded", "quant_format",
                "load_mode", "optimizer_impl")

# What may reach generated code. Exports are read by Python, shells and YAML parsers, so a value
# from a plan file is either one of these shapes or refused: a block class is a Python (dotted)
# identifier as transformers names its decoder layers; a hub id is the Hub's owner/name form
# (huggingface_hub validate_repo_id: letters, digits, '-', '_', '.', at most 96 characters a part).
BLOCK_CLASS_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
HF_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
MAX_TEXT = 200  # free-text fields (model name, GPU name, breakdown keys) are shown in comment lines


def check_text(field: str, value: str) -> str:
    """A free-text value that is shown inside comment lines: printable, one line, bounded."""
    if len(value) > MAX_TEXT or not value.isprintable():
        raise ShardplanError(field, value[:40], f"must be printable text on one line, at most {MAX_TEXT} characters")
    return value


class PlanSpec(TrainingConfig):
    """A plan as the exporters need it: TrainingConfig's knobs plus the model, the cluster and the prediction."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # model
    model_name: str
    hf_id: str | None = Field(None, description="Hugging Face repo id, e.g. meta-llama/Llama-3.1-8B")
    block_class: str = Field(description="the transformer block class FSDP wraps, e.g. LlamaDecoderLayer")
    # cluster
    nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 1
    gpu: str = ""
    # engine options the plan assumes (FSDP1 defaults; BACKWARD_PRE is what shardplan's buffers model)
    forward_prefetch: bool = False
    backward_prefetch: Literal["BACKWARD_PRE", "BACKWARD_POST", "NONE"] = "BACKWARD_PRE"
    limit_all_gathers: bool = True
    # prediction
    fits: bool | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    breakdown: dict[str, int] = {}

    @field_validator("block_class")
    @classmethod
    def _block_class(cls, value: str) -> str:
        if len(value) > MAX_TEXT or not BLOCK_CLASS_PATTERN.fullmatch(value):
            raise ShardplanError("block_class", value[:40], "must be a Python class name, e.g. LlamaDecoderLayer")
        return value

    @field_validator("hf_id")
    @classmethod
    def _hf_id(cls, value: str | None) -> str | None:
        if value is not None and (not HF_ID_PATTERN.fullmatch(value) or ".." in value):
            raise ShardplanError("hf_id", value[:40], "must be a Hugging Face repo id, e.g. meta-llama/Llama-3.1-8B")
        return value

    @field_validator("model_name", "gpu")
    @classmethod
    def _text(cls, value: str, info: Any) -> str:
        return check_text(info.field_name, value)

    @field_validator("breakdown")
    @classmethod
    def _breakdown(cls, value: dict[str, int]) -> dict[str, int]:
        for key in value:
            check_text("breakdown", key)
        return value

    @model_validator(mode="after")
    def _check(self) -> "PlanSpec":
        for field, names in (("strategy", st.STRATEGIES), ("engine", st.ENGINES), ("precision", st.PRECISIONS),
                             ("optimizer", st.OPTIMIZERS), ("ac", st.AC_MODES), ("offload", st.OFFLOADS),
                             ("method", st.METHODS), ("reduce_dtype", st.REDUCE_DTYPES)):
            if field == "reduce_dtype" and self.reduce_dtype is None:
                continue
            if getattr(self, field) not in names:
                raise ShardplanError(field, getattr(self, field), f"unknown; choose one of {', '.join(names)}")
        st.check_world_size(self.strategy, self.world_size, self.shard_group_size)
        return self

    # --- derived ----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shard_size(self) -> int:
        """Ranks one parameter is sharded over (the inner mesh dimension)."""
        if self.strategy in ("hybrid_shard", "hybrid_shard_zero2"):
            return min(self.shard_group_size or self.gpus_per_node, self.world_size)
        if self.strategy in ("ddp", "no_shard"):
            return 1
        return self.world_size

    @property
    def replicate_size(self) -> int:
        return self.world_size // self.shard_size

    @property
    def hybrid(self) -> bool:
        return self.strategy in ("hybrid_shard", "hybrid_shard_zero2")

    @property
    def reshard_after_forward(self) -> bool:
        return self.strategy not in ("shard_grad_op", "hybrid_shard_zero2")

    @property
    def dtypes(self) -> tuple[str | None, str | None, str | None]:
        """(param, reduce, buffer) torch dtype names for the mixed-precision policy; the reduce dtype
        follows the ``reduce_dtype`` knob when set (e.g. fms-fsdp's bf16 reduction)."""
        param, reduce, buffer = DTYPES[self.precision]
        if param is not None and self.reduce_dtype is not None:
            reduce = TORCH_DTYPE[st.reduce_dtype_name(st.code(st.REDUCE_DTYPES, self.reduce_dtype, "reduce_dtype"),
                                                      st.PRECISIONS.index(self.precision))]
        return param, reduce, buffer

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro-batch × accumulation × data-parallel ranks."""
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def checkpointed(self) -> bool:
        return self.ac != "none"

    @property
    def peft(self) -> bool:
        return self.method != "full"

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage of the strategy, as the engine declares it (DeepSpeed's declaration for a
        plan of another engine: data/engine_profiles/deepspeed.json ``zero_stage``)."""
        from shardplan.inputs.engine_lookup import zero_stage

        stage = zero_stage(self.strategy, self.engine)
        if stage is None:
            raise ShardplanError("strategy", self.strategy, "has no DeepSpeed equivalent; use --engine fsdp2 or fsdp1")
        return stage

    def knobs(self) -> dict[str, Any]:
        """The training knobs an export must carry (the round-trip contract)."""
        return {k: getattr(self, k) for k in KNOBS} | {"shard_group_size": self.shard_size}

    def stack_line(self) -> str:
        """Which stack's numbers this export assumed, and the stack knobs that are on."""
        on = [f"{k}={getattr(self, k)}" for k in STACK_FIELDS[1:]
              if getattr(self, k) not in (None, False, 0, 0.0)
              and k not in ("logits_fp32", "quant_state_sharded", "fp32_master", "quant_format")]
        on += ["fp32_master=False"] if self.fp32_master is False else []
        on += [f"quant_format={self.quant_format}"] if self.method == "qlora" and self.quant_format else []
        return (f"stack: {self.stack} (shardplan's numbers assume this stack's code: docs/stacks.md)"
                + (f"; {', '.join(on)}" if on else ""))

    def comment_header(self, note: str | None = None) -> str:
        """The header as comment lines ('# ...'), for Python and shell exports alike; ``note`` goes
        after the summary. The fields are validated to one printable line each; this escapes
        anything else once more, so no value can end a comment and become code."""
        lines = self.header_lines()
        if note:
            lines.insert(2, note)
        return "\n".join("# " + (line if line.isprintable() else line.encode("unicode_escape").decode("ascii"))
                         for line in lines)

    def header_lines(self) -> list[str]:
        """Human summary + one machine-readable line, for comment headers of code/shell exports."""
        model = f"{self.model_name}" + (f" ({self.hf_id})" if self.hf_id else "")
        gpus = f"{self.nodes}x{self.gpus_per_node}" if self.nodes > 1 else f"{self.gpus_per_node}"
        lines = [f"shardplan plan: {model} on {gpus} x {self.gpu or 'GPU'} ({self.world_size} GPUs)",
                 f"strategy {self.strategy} (engine {self.engine}), precision {self.precision}, optimizer "
                 f"{self.optimizer}, offload {self.offload}, activation checkpointing {self.ac}, method {self.method}"
                 + (f" (r={self.lora_rank}, {self.lora_targets})" if self.peft else ""),
                 self.stack_line(),
                 f"micro-batch {self.micro_batch} x grad-accum {self.grad_accum} x {self.world_size} ranks = "
                 f"{self.global_batch} sequences of {self.seq_len} tokens per step"]
        if self.hybrid:
            lines.append(f"HSDP mesh: {self.replicate_size} replicas x {self.shard_size}-way shard groups")
        if self.peak_allocated_bytes is not None:
            text = f"predicted peak per GPU: {self.peak_allocated_bytes / 2**30:.2f} GiB allocated"
            if self.peak_reserved_bytes is not None:
                text += f", {self.peak_reserved_bytes / 2**30:.2f} GiB reserved"
            lines.append(text + ("" if self.fits is None else (" (fits)" if self.fits else " (DOES NOT FIT)")))
        top = sorted(((v, k) for k, v in self.breakdown.items() if v), reverse=True)[:5]
        if top:
            lines.append("largest terms: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for v, k in top))
        lines.append("shardplan-plan: " + json.dumps(self.model_dump(exclude={"breakdown"}), separators=(",", ":")))
        return lines
