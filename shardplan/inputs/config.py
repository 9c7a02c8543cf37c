"""What a user states about a training run: ``TrainingConfig`` (names), and its knobs as the
integer codes the formulas read (``resolved_knob_values``; ``stacks.knob_values`` fills the
stack's defaults first). The numbers themselves, broadcast into columns
with a model's and a cluster's, are ``formulas/columns.py``'s ``Columns``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, field_validator, model_validator

from shardplan.inputs import strategy as st
from shardplan.inputs.hardware import Cluster
from shardplan.inputs.vocabulary import canonical_config
from shardplan.support.errors import from_validation_error
from shardplan.support.limits import checked_int


class TrainingConfig(BaseModel):
    """One configuration as a user states it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str = "full_shard"
    engine: str = "fsdp2"
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    ac: str = "none"
    ac_every_k: PositiveInt = 2
    offload: str = "none"
    method: str = "full"
    lora_rank: PositiveInt = 16
    lora_targets: str = "all-linear"
    micro_batch: PositiveInt = 1
    seq_len: PositiveInt = Field(1024, description="default: TRL SFTConfig.max_length (1024)")
    grad_accum: PositiveInt = 1
    sync_every_micro_batch: bool = Field(True, description="reduce gradients every micro-batch (FSDP/DeepSpeed "
                                         "default); False: no_sync, unsharded gradients held until the last")
    shard_group_size: PositiveInt | None = Field(None, description="HSDP shard group; default GPUs per node")
    attention: str = "sdpa"
    dropout: bool = False
    reduce_dtype: str | None = Field(None, description="gradient reduction dtype: fp32, bf16, fp16 or param; "
                                     "default fp32 under FSDP/DDP mixed precision, the 16-bit dtype for DeepSpeed")
    # The training stack and the knobs it sets (shardplan/inputs/stacks.py). None: the stack's default
    # (``stacks.resolve_stack``); a value the user states always wins.
    stack: str = Field("hf", description="training stack: hf (default: Transformers + Trainer + PEFT + "
                                         "bitsandbytes, what most few-GPU fine-tuning runs use), torchtitan, "
                                         "torchtune, lightning, plain")
    logits_fp32: bool | None = Field(None, description="the loss runs on an fp32 upcast of the logits")
    ce_chunks: NonNegativeInt | None = Field(None, description="chunked cross-entropy chunks (0: off)")
    fused_ce: bool | None = Field(None, description="a fused cross-entropy kernel (flash-attn xentropy): keeps the "
                                  "16-bit logits and a per-row log-sum-exp, writes a 16-bit gradient")
    fused_lm_head: bool | None = Field(None, description="TRL's chunked LM head (SFTTrainer since TRL 1.16, "
                                       "add_fused_lm_head): per-token log-probabilities from 4,096-token tiles, no "
                                       "full logits (activations.fused_lm_head_forward_bytes)")
    optimizer_in_backward: bool | None = Field(None, description="optimizer step fused into backward")
    activation_offload: bool | None = Field(None, description="saved activations offloaded to CPU")
    fp32_master: bool | None = Field(None, description="an fp32 master copy exists (None: unless bf16-pure)")
    paged_optimizer: bool | None = Field(None, description="bitsandbytes paged optimizer states")
    expandable_segments: bool = Field(False, description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                                      "(less caching-allocator fragmentation; allocator.py)")
    lora_dropout: float | None = Field(None, ge=0.0, lt=1.0, description="PEFT lora_dropout")
    reentrant_checkpointing: bool | None = Field(None, description="reentrant activation checkpointing")
    checkpoint_wrapper: bool | None = Field(None, description="checkpointing by torch's checkpoint_wrapper around "
                                            "each HF block (accelerate FSDP activation_checkpointing)")
    use_cache: bool | None = Field(None, description="the model config's use_cache during training: a KV cache "
                                   "built in every forward, kept alive under non-reentrant checkpointing by a wrapper "
                                   "(memory.kv_cache_leftover_bytes); Trainer/TRL set it False")
    kbit_prep: bool | None = Field(None, description="QLoRA prepared by PEFT's prepare_model_for_kbit_training: every "
                                   "non-4-bit parameter in fp32, so the residual stream around the 16-bit base "
                                   "matmuls is fp32 (activations.stream_dtype_bytes; memory: an fp32 checkpointed block input on one rank)")
    quant_state_sharded: bool | None = Field(None, description="bnb quant_state sharded with the weights")
    autocast: bool | None = Field(None, description="the hf stack's Trainer runs with bf16/fp16 = True: accelerate's "
                                  "mixed precision puts the forward under torch.autocast and gives FSDP a MixedPrecision "
                                  "policy; False (a 16-bit model without bf16=True): neither, so PEFT's fp32 adapters "
                                  "stay fp32 under FSDP too (activations.lora_adapter_dtype_bytes)")
    quant_buffers_sharded: bool | None = Field(None, description="GPTQ qweight/qzeros re-registered as float parameters "
                                               "so FSDP shards them (fms-acceleration's GPTQ plugin; scales stay "
                                               "whole per rank: model_states.quant_replicated_bytes)")
    quant_saves_input: bool | None = Field(None, description="each 4-bit Linear's autograd keeps its input "
                                           "(bitsandbytes <= 0.43.1 MatMul4Bit)")
    quant_head: bool | None = Field(None, description="the 4-bit plugin quantizes the lm_head too, from an fp16 copy "
                                    "(Lightning Fabric BitsandbytesPrecision)")
    untied_head: bool | None = Field(None, description="the stack builds a separate lm_head even for a model that "
                                     "ties it to the embedding (LitGPT)")
    chunked_head: bool | None = Field(None, description="the lm_head runs on 128-token chunks whose logits reach the "
                                      "loss as fp32 copies the loop keeps (LitGPT fine-tuning on Fabric)")
    loop_keeps_logits: bool | None = Field(None, description="the training loop keeps its fp32 logits referenced through "
                                           "backward (torchtune recipes before 'del logits', 2024-06/07)")
    nf4_whole_quantize: bool | None = Field(None, description="NF4 weights quantized in one piece on the GPU while "
                                            "loading (torchao <= 0.1), the blocks it caches kept reserved into training "
                                            "(formulas.nf4_load_cache)")
    nf4_torchao: bool | None = Field(None, description="NF4 weights are torchao NF4Tensors (torchtune's QLoRA), "
                                     "dequantized by plain torch ops at each use, not by bitsandbytes' kernel "
                                     "(throughput.torchao_nf4_dequant_bytes_per_weight)")
    quant_format: str | None = Field(None, description="4-bit base format: nf4, gptq, awq")
    load_mode: str | None = Field(None, description="how weights reach the GPUs: full_per_gpu, rank0_broadcast, meta_init")
    optimizer_impl: str | None = Field(None, description="how the AdamW step runs: fused (one kernel), foreach "
                                       "(torch's CUDA default: multi-tensor passes and a sqrt(v) copy), for_loop")
    compile: bool | None = Field(None, description="torch.compile of the transformer blocks: inductor fuses their "
                                 "element-wise kernels, LoRA adapters' included (throughput.COMPILED_*_FRACTION)")
    lowp_norm: bool | None = Field(None, description="each norm is one 16-bit kernel (llm-foundry's "
                                   "low_precision_layernorm), not an fp32-upcast RMSNorm (throughput.LOWP_NORM_BYTES)")
    rope_form: str | None = Field(None, description="how the stack's code rotates q and k: complex (torchtitan), "
                                  "rotate_half (Transformers), pairs_fp32 (torchtune), matrix (foundation-model-stack) "
                                  "(throughput.ROPE_FORM_EXTRA_BYTES)")
    sac_saves_attention: bool | None = Field(None, description="op-level SAC saves the SDPA output (torchtitan's "
                                             "_save_list holds the kernel the run used): no attention recompute")
    metric_ce: bool | None = Field(None, description="the loop computes training metrics on each micro-batch's logits "
                                   "(composer's LanguageCrossEntropy + LanguagePerplexity): eager fp32 cross-entropy "
                                   "forwards (throughput.METRIC_CE_FORWARDS)")

    def __init__(self, **data: Any) -> None:
        # words are resolved by the validator below (``_one_vocabulary``); a bad one's one-line
        # ShardplanError comes back out of pydantic's wrapping (``from_validation_error``)
        try:
            super().__init__(**data)
        except ValidationError as err:  # the Python API raises the one error type too
            raise from_validation_error(err) from None

    @field_validator("seq_len", "micro_batch", "grad_accum", "lora_rank", "ac_every_k", "shard_group_size",
                     "ce_chunks", mode="before")
    @classmethod
    def _in_range(cls, value: Any, info: Any) -> Any:
        """Whole numbers within limits.INT_RANGES (2**48 tokens would wrap int64 in the formulas)."""
        return None if value is None else checked_int(info.field_name, value)

    @model_validator(mode="before")
    @classmethod
    def _one_vocabulary(cls, data: Any) -> Any:
        """Every categorical word to its canonical name (shardplan/inputs/vocabulary.py): aliases such as
        'zero3' or 'offload all', and 'bf16' as the chosen stack means it."""
        if not isinstance(data, dict):
            return data
        return canonical_config(data)


def knob_codes(knobs, check_names: bool = False) -> dict[str, Any]:
    """Stack knobs of a (resolved) TrainingConfig or a dict: names -> codes, booleans and numbers
    as they are (None stays None); one-line errors for unknown names. ``check_names`` also checks
    the ordinary knobs a stack profile may set (precision, optimizer, ac, engine, method, targets)."""
    get = knobs.get if isinstance(knobs, dict) else vars(knobs).get  # a model's (or namespace's) fields
    out = {k: get(k) for k in ("logits_fp32", "ce_chunks", "fused_ce", "optimizer_in_backward", "activation_offload",
                               "fp32_master", "paged_optimizer", "lora_dropout", "reentrant_checkpointing",
                               "quant_state_sharded", "quant_buffers_sharded", "checkpoint_wrapper", "use_cache", "kbit_prep",
                               "fused_lm_head", "quant_saves_input", "quant_head", "untied_head", "chunked_head",
                               "loop_keeps_logits", "nf4_whole_quantize", "nf4_torchao", "autocast", "compile", "lowp_norm",
                               "sac_saves_attention", "metric_ce")}
    if get("quant_format") is not None:
        out["quant_format"] = st.code(st.QUANT_FORMATS, get("quant_format"), "quant_format")
    else:
        out["quant_format"] = None
    out["load_mode"] = None if get("load_mode") is None else st.code(st.LOAD_MODES, get("load_mode"), "load_mode")
    out["rope_form"] = None if get("rope_form") is None else st.code(st.ROPE_FORMS, get("rope_form"), "rope_form")
    impl = get("optimizer_impl")
    out["optimizer_impl"] = None if impl is None else st.code(st.OPTIMIZER_IMPLS, impl, "optimizer_impl")
    if not check_names:
        return out
    for name, names in (("precision", st.PRECISIONS), ("optimizer", st.OPTIMIZERS), ("ac", st.AC_MODES),
                        ("engine", st.ENGINES), ("method", st.METHODS)):
        if get(name) is not None:
            st.code(names, get(name), name)
    if get("lora_targets") is not None:
        from shardplan.inputs.model import lora_target_code
        lora_target_code(get("lora_targets"))
    return out


# The categorical knobs every configuration names, with the names their codes index (knob_names.py).
CATEGORICAL_KNOBS = (("stack", st.STACKS), ("strategy", st.STRATEGIES), ("engine", st.ENGINES),
                     ("precision", st.PRECISIONS), ("optimizer", st.OPTIMIZERS), ("ac", st.AC_MODES),
                     ("offload", st.OFFLOADS), ("method", st.METHODS), ("attention", st.ATTENTIONS))
_NAME_CODES = {field: {name: i for i, name in enumerate(names)} for field, names in CATEGORICAL_KNOBS}


def resolved_knob_values(config: TrainingConfig, cluster: Cluster) -> dict[str, Any]:
    """``knob_values`` of a config its stack has resolved already (``stacks.resolve_stack``; ``stacks.knob_values`` resolves and converts)."""
    codes = knob_codes(config)
    for field, names in CATEGORICAL_KNOBS:  # a canonical name by one lookup; anything else (an alias, a bad word) by st.code
        value = getattr(config, field)
        code = _NAME_CODES[field].get(value)
        codes[field] = code if code is not None else st.code(names, value, field)
    return dict(**codes,
        ac_every_k=config.ac_every_k,
        micro_batch=config.micro_batch, seq_len=config.seq_len, grad_accum=config.grad_accum,
        sync_every_micro_batch=config.sync_every_micro_batch,
        shard_group_size=config.shard_group_size or cluster.gpus_per_node,
        dropout=config.dropout, expandable_segments=config.expandable_segments,
        reduce_dtype=int(st.resolve_reduce_dtype(
            None if config.reduce_dtype is None else st.code(st.REDUCE_DTYPES, config.reduce_dtype, "reduce_dtype"),
            codes["precision"], codes["engine"])),
    )
