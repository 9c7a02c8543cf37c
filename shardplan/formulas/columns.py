"""The numbers the formulas read: ``Columns``, one numpy column per quantity, broadcast.

A single query is a one-row sweep: ``Columns.build`` accepts scalars or arrays for every field
and broadcasts them, so the same formulas serve one configuration and millions
(docs/architecture.md, principle 2). ``model_values`` / ``cluster_values`` are a model's and a
cluster's numbers (per-tensor padding groups, NF4 quant_state bytes, NCCL buffers: the formulas
that size them live beside them in ``formulas/``), ``inputs.stacks.knob_values`` the knobs' codes;
``columns_for`` puts one configuration's together.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from shardplan.formulas.model_states import PAD_GROUPS, nf4_quant_state_bytes
from shardplan.formulas.overheads import nccl_bytes_for_link
from shardplan.inputs import strategy as st
from shardplan.inputs.config import TrainingConfig, resolved_knob_values
from shardplan.inputs.hardware import Cluster
from shardplan.inputs.model import (
    ModelSpec,
    block_linear_bias_params,
    block_linear_params,
    lora_adapted_inputs,
    lora_blocks_params,
    lora_root_params,
    matmul_params_per_token,
)

MODEL_FIELDS = (
    "total_params", "root_params", "unit_params", "largest_module_params", "num_layers", "hidden_size",
    "vocab_size", "q_width", "kv_width", "attn_out_width", "num_heads", "mlp_width", "moe_blocks", "moe_experts",
    "moe_top_k", "matmul_params", "gated_mlp",
    "layernorm", "tied_embeddings", "lora_params", "quantizable_params", "param_tensors", "rope_dim",
    "quantized_tensors", "quant_state_bytes", "quantized_bias_params", "lora_adapted_in", "lora_unique_in", "lora_adapted_linears",
    "lora_rank_out", "lora_qkv_adapted", "lora_mlp_adapted", "extra_norms", "norm_fp32", "attn_norm_width",
    "attn_norm_rows", "fused_qkv",
) + tuple(f"pad_{what}_{k}" for what in ("dim0", "model", "root", "block") for k in range(PAD_GROUPS))

# Per-tensor padding (FSDP2 pads each tensor's dim 0 to a multiple of the shard count) needs the
# tensors. They are summarised per model as up to PAD_GROUPS distinct dim-0 sizes with, for each,
# the elements per dim-0 row summed over the tensors that share it (whole model, root unit, largest
# block): padded elements per rank = sum_k ceil(dim0_k / N) * cols_k. dim0 = 0 marks a group kept
# unpadded (tensors beyond the first PAD_GROUPS - 1 sizes, and Columns built without shapes).
# PAD_GROUPS is defined once, beside the formula that reads the groups (model_states.padded_shard_elements).


@dataclass(frozen=True)
class Columns:
    """Numeric columns of a sweep; every field broadcasts against every other."""

    # model
    total_params: np.ndarray
    root_params: np.ndarray
    unit_params: np.ndarray          # largest FSDP unit (a decoder block)
    largest_module_params: np.ndarray
    num_layers: np.ndarray
    hidden_size: np.ndarray
    vocab_size: np.ndarray
    q_width: np.ndarray
    kv_width: np.ndarray
    attn_out_width: np.ndarray
    num_heads: np.ndarray
    mlp_width: np.ndarray            # MLP width one token passes through (MoE: k experts + shared)
    moe_blocks: np.ndarray           # blocks holding routed experts (0: dense)
    moe_experts: np.ndarray          # routed experts per MoE block (0: dense)
    moe_top_k: np.ndarray            # routed experts per token (0: dense)
    matmul_params: np.ndarray        # N_matmul per token (inputs.model.matmul_params_per_token)
    gated_mlp: np.ndarray
    layernorm: np.ndarray
    tied_embeddings: np.ndarray
    lora_params: np.ndarray          # adapters over the whole model at the configured rank
    quantizable_params: np.ndarray   # block Linear weights (QLoRA's 4-bit part)
    rope_dim: np.ndarray             # RoPE cos/sin width (head_dim; 0 with learned positions)
    param_tensors: np.ndarray        # parameter tensors in the model (per-tensor optimizer state, e.g. Adam's step)
    quantized_tensors: np.ndarray    # block Linear weight tensors (QLoRA: one quant_state each)
    quant_state_bytes: np.ndarray    # NF4 quant_state of all of them (model_states.nf4_quant_state_bytes)
    quantized_bias_params: np.ndarray  # biases of those Linears (bitsandbytes keeps them in the compute dtype)
    lora_adapted_in: np.ndarray      # per block: sum of the input widths of the LoRA-adapted Linears
    lora_unique_in: np.ndarray       # per block: widths of the distinct adapted inputs (model.lora_adapted_inputs)
    lora_adapted_linears: np.ndarray  # per block: how many Linears LoRA adapts
    lora_rank_out: np.ndarray        # per block: rank x adapted Linears (lora_A outputs)
    lora_qkv_adapted: np.ndarray     # per block: adapted Linears among q, k, v
    lora_mlp_adapted: np.ndarray     # per block: 1 when the MLP projections are adapted
    extra_norms: np.ndarray          # per block: h-wide norms beyond two (Gemma's post-attention/post-MLP norms)
    norm_fp32: np.ndarray            # RMSNorm saves its normalized tensor in fp32 (Gemma, OLMo 2)
    attn_norm_width: np.ndarray      # per token: elements the q/k (or MLA latent) norms normalize
    attn_norm_rows: np.ndarray       # per token: rows those norms normalize (one fp32 rstd each)
    fused_qkv: np.ndarray            # one Linear makes q, k, v (Phi-3, GPT-2, Falcon): SDPA gets strided views
    # padding groups (see PAD_GROUPS): dim-0 sizes and elements per row for model / root / largest block
    pad_dim0_0: np.ndarray
    pad_dim0_1: np.ndarray
    pad_dim0_2: np.ndarray
    pad_dim0_3: np.ndarray
    pad_dim0_4: np.ndarray
    pad_dim0_5: np.ndarray
    pad_model_0: np.ndarray
    pad_model_1: np.ndarray
    pad_model_2: np.ndarray
    pad_model_3: np.ndarray
    pad_model_4: np.ndarray
    pad_model_5: np.ndarray
    pad_root_0: np.ndarray
    pad_root_1: np.ndarray
    pad_root_2: np.ndarray
    pad_root_3: np.ndarray
    pad_root_4: np.ndarray
    pad_root_5: np.ndarray
    pad_block_0: np.ndarray
    pad_block_1: np.ndarray
    pad_block_2: np.ndarray
    pad_block_3: np.ndarray
    pad_block_4: np.ndarray
    pad_block_5: np.ndarray
    # cluster
    world_size: np.ndarray
    gpus_per_node: np.ndarray
    gpu_memory_bytes: np.ndarray
    host_ram_bytes_per_node: np.ndarray
    nccl_buffer_bytes: np.ndarray    # device memory NCCL holds outside torch's allocator
    # knobs
    strategy: np.ndarray
    engine: np.ndarray
    precision: np.ndarray
    optimizer: np.ndarray
    ac: np.ndarray
    ac_every_k: np.ndarray
    offload: np.ndarray
    method: np.ndarray
    micro_batch: np.ndarray
    seq_len: np.ndarray
    grad_accum: np.ndarray
    shard_group_size: np.ndarray
    attention: np.ndarray
    dropout: np.ndarray
    reduce_dtype: np.ndarray         # REDUCE_DTYPES code; left out or None: st.default_reduce_dtype
    # stack knobs (left out: STACK_COLUMN_DEFAULTS, the numbers before stacks were an input)
    stack: np.ndarray                # STACKS code (reports and sweeps only; no formula reads it)
    logits_fp32: np.ndarray
    ce_chunks: np.ndarray
    fused_ce: np.ndarray             # fused cross-entropy kernel (activations.logits_forward_bytes)
    optimizer_in_backward: np.ndarray
    activation_offload: np.ndarray
    fp32_master: np.ndarray
    paged_optimizer: np.ndarray
    lora_dropout: np.ndarray
    reentrant_checkpointing: np.ndarray
    quant_state_sharded: np.ndarray
    quant_buffers_sharded: np.ndarray  # GPTQ qweight/qzeros as FSDP-sharded parameters (model_states.quant_replicated_bytes)
    quant_format: np.ndarray         # QUANT_FORMATS code
    load_mode: np.ndarray            # LOAD_MODES code
    expandable_segments: np.ndarray  # caching allocator with expandable segments (allocator.py)
    checkpoint_wrapper: np.ndarray   # AC by torch's checkpoint_wrapper around HF blocks (memory._block_backward)
    use_cache: np.ndarray            # HF use_cache on during training (memory.kv_cache_leftover_bytes)
    fused_lm_head: np.ndarray        # TRL's chunked LM head, no full logits (activations.fused_lm_head_forward_bytes)
    kbit_prep: np.ndarray            # QLoRA after prepare_model_for_kbit_training: fp32 stream (throughput.stream_dtype_bytes)
    quant_saves_input: np.ndarray    # 4-bit Linears keep their input (activations.quant_saved_input_bytes_per_token)
    quant_head: np.ndarray           # the lm_head is 4-bit too, quantized from fp16 (model_states.frozen_base)
    untied_head: np.ndarray          # a separate lm_head even where the model ties it (completed_values)
    chunked_head: np.ndarray         # LitGPT's 128-token lm_head chunks, fp32 logits kept (activations.chunked_head_*)
    nf4_whole_quantize: np.ndarray   # torchao <= 0.1 NF4 quantization on the GPU at load, cache kept (nf4_load_cache)
    nf4_torchao: np.ndarray          # torchao NF4Tensor dequantized by torch ops (throughput.qlora_dequant_s)
    loop_keeps_logits: np.ndarray    # the loop holds its (shifted, fp32) logits through backward (activations.logits_backward_bytes)
    rope_shared_batch: np.ndarray    # RoPE cos/sin computed for one row and broadcast over the batch (HF; tiny harness: b rows)
    autocast: np.ndarray             # torch.autocast (HF Trainer bf16/fp16; FSDP then has MixedPrecision); False: none
    fsdp_mp_policy: np.ndarray       # the loop gives FSDP a MixedPrecision policy itself, autocast or not (CPU harness)
    fused_dropout: np.ndarray        # CUDA native_dropout (1-byte mask); False: CPU's composite (mask in the input dtype)
    optimizer_impl: np.ndarray       # OPTIMIZER_IMPLS code: fused, foreach (torch's CUDA default), for_loop (CPU default)
    sdpa_fp32_gqa_math: np.ndarray   # fp32 + GQA sends SDPA to its math backend (CUDA); False: CPU's flash kernel
    sync_every_micro_batch: np.ndarray  # gradients reduced every micro-batch; False: no_sync until the last (memory.py)
    compile: np.ndarray              # torch.compile'd blocks: fused element-wise kernels (throughput.elementwise_bytes_per_token)
    lowp_norm: np.ndarray            # norms as one 16-bit kernel (throughput.layer_forward_elementwise_bytes)
    rope_form: np.ndarray            # ROPE_FORMS code: how the stack rotates q and k (throughput.elementwise_bytes_per_token)
    sac_saves_attention: np.ndarray  # op-level SAC keeps SDPA's output: no attention recompute (throughput.flops_per_token)
    metric_ce: np.ndarray            # training metrics re-run an eager cross-entropy forward (throughput.elementwise_bytes_per_token)

    @classmethod
    def build(cls, **values: Any) -> "Columns":
        values = completed_values(values)
        names = [f.name for f in fields(cls)]
        arrays = np.broadcast_arrays(*(np.asarray(values[n]) for n in names))
        return cls(**dict(zip(names, arrays)))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.total_params.shape


COLUMN_NAMES = tuple(f.name for f in fields(Columns))
_COLUMN_SET = frozenset(COLUMN_NAMES)



def completed_values(values: dict[str, Any]) -> dict[str, Any]:
    """Every ``Columns`` field: the shape and stack-knob defaults for what ``values`` leaves out,
    16-bit weights without an fp32 master copy as bf16-pure, the reduce dtype resolved from the
    engine's declaration (``strategy.resolve_reduce_dtype``). A new dict."""
    values = {**_shape_defaults(values), **STACK_COLUMN_DEFAULTS, **values}
    if "precision" in values:
        values["precision"] = np.where(np.logical_not(np.asarray(values["fp32_master"], dtype=bool))
                                       & (np.asarray(values["precision"]) == st.BF16_MIXED),
                                       st.BF16_PURE, values["precision"])
    if "precision" in values and "engine" in values:
        values["reduce_dtype"] = st.resolve_reduce_dtype(values.get("reduce_dtype"), values["precision"], values["engine"])
    if "vocab_size" in values:
        values.update(untied_head_values(values))
    if not values.keys() >= _COLUMN_SET:
        raise TypeError(f"Columns.build missing {sorted(_COLUMN_SET - values.keys())}")
    return values

def untied_head_values(values: dict[str, Any]) -> dict[str, Any]:
    """A stack that builds a separate lm_head (``untied_head``: LitGPT's ``GPT`` has its own
    ``nn.Linear`` lm_head beside the ``nn.Embedding``, and ``scripts/convert_hf_checkpoint.py``
    copies ``transformer.wte.weight`` into ``lm_head.weight`` when the checkpoint has none) holds
    the V·h head of a tied model twice: one more root tensor, in the padding group of its dim0 V.
    Idempotent: the columns it returns are untied."""
    on = np.asarray(values["untied_head"], dtype=bool) & np.asarray(values["tied_embeddings"], dtype=bool)
    v, h = np.asarray(values["vocab_size"]), np.asarray(values["hidden_size"])
    extra = np.where(on, v * h, 0)
    out = {"total_params": np.asarray(values["total_params"]) + extra,
           "root_params": np.asarray(values["root_params"]) + extra,
           "param_tensors": np.asarray(values["param_tensors"]) + on,
           "tied_embeddings": np.asarray(values["tied_embeddings"], dtype=bool) & np.logical_not(on)}
    placed = np.zeros(np.shape(on), dtype=bool)
    for k in range(PAD_GROUPS - 1):
        match = on & (np.asarray(values[f"pad_dim0_{k}"]) == v) & np.logical_not(placed)
        placed = placed | match
        for what in ("model", "root"):
            out[f"pad_{what}_{k}"] = np.asarray(values[f"pad_{what}_{k}"]) + np.where(match, h, 0)
    rest = on & np.logical_not(placed)  # no group of dim0 V: the unpadded remainder, counted whole
    for what in ("model", "root"):
        last = f"pad_{what}_{PAD_GROUPS - 1}"
        out[last] = np.asarray(values[last]) + np.where(rest, v * h, 0)
    return out


# Stack-knob columns when a caller gives none: hf, the knobs off, fp32 loss upcast, NF4, rank-0 load.
STACK_COLUMN_DEFAULTS: dict[str, Any] = dict(
    stack=st.HF, logits_fp32=True, ce_chunks=0, fused_ce=False, optimizer_in_backward=False, activation_offload=False,
    fp32_master=True, paged_optimizer=False, lora_dropout=0.0, reentrant_checkpointing=False,
    quant_state_sharded=True, quant_buffers_sharded=False, quant_format=st.NF4, load_mode=st.LOAD_RANK0_BROADCAST, checkpoint_wrapper=False,
    use_cache=False, kbit_prep=False, fused_lm_head=False, quant_saves_input=False, quant_head=False, untied_head=False,
    chunked_head=False, loop_keeps_logits=False, nf4_whole_quantize=False, nf4_torchao=False, optimizer_impl=st.OPT_FOREACH,
    # mechanism columns: what real stacks on CUDA do (RoPE built from one row of position ids:
    # transformers, torchtitan's freqs_cis; CUDA's fused dropout; foreach AdamW)
    rope_shared_batch=True, autocast=True, fsdp_mp_policy=False, fused_dropout=True, sdpa_fp32_gqa_math=True,
    expandable_segments=False,  # the caching allocator's default (allocator.py)
    sync_every_micro_batch=True,  # FSDP's and DeepSpeed's default: no no_sync / set_requires_gradient_sync(False)
    compile=False, lowp_norm=False, rope_form=st.ROPE_COMPLEX, sac_saves_attention=True, metric_ce=False,  # stacks.ENGINE_DEFAULTS
)


def _shape_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """Columns built from counts alone (no tensor shapes): every unit is one unpadded group, and a
    Llama-style tensor count (root: embedding, final norm, lm_head; block: 7 Linears + 2 norms).
    Values from a ModelSpec (``model_values``) state every one of these: nothing to add."""
    if "total_params" not in values or _SHAPE_DEFAULT_NAMES <= values.keys():
        return {}
    return _counted_shapes(values)


def _counted_shapes(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {f"pad_{w}_{k}": 0 for w in ("dim0", "model", "root", "block") for k in range(PAD_GROUPS)}
    out.update({k: v for k, v in dict(pad_model_0=values["total_params"], pad_root_0=values.get("root_params", 0),
               pad_block_0=values.get("unit_params", 0),
               param_tensors=3 + 9 * np.asarray(values.get("num_layers", 1)),
               quantized_tensors=7 * np.asarray(values.get("num_layers", 1)),
               quant_state_bytes=nf4_quant_state_bytes(np.asarray(values.get("quantizable_params", 0)),
                                                       7 * np.asarray(values.get("num_layers", 1))),
               matmul_params=matmul_params_per_token(np.asarray(values["total_params"]) - np.asarray(values.get("root_params", 0)),
                                                     np.asarray(values.get("vocab_size", 0)), np.asarray(values.get("hidden_size", 0))),
               quantized_bias_params=0, moe_blocks=0, moe_experts=0, moe_top_k=0,
               extra_norms=0, norm_fp32=False, attn_norm_width=0, attn_norm_rows=0, fused_qkv=False,
               lora_adapted_in=0, lora_unique_in=0, lora_adapted_linears=0, lora_rank_out=0, lora_qkv_adapted=0, lora_mlp_adapted=0,
               rope_dim=np.asarray(values.get("q_width", 0)) // np.maximum(np.asarray(values.get("num_heads", 1)), 1)).items()})
    if "pad_dim0_0" in values:
        out = {k: v for k, v in out.items() if not k.startswith("pad_")}
    return out


_SHAPE_DEFAULT_NAMES = frozenset(_counted_shapes({"total_params": 0}))


def padding_groups(spec: ModelSpec) -> dict[str, int]:
    """The ``pad_*`` fields of one ModelSpec (see PAD_GROUPS) from ``spec.parameter_shapes()``."""
    import math

    shapes = spec.parameter_shapes()
    largest = max((k for k in shapes if k != "root"), key=lambda k: sum(math.prod(t) for t in shapes[k]))
    model: dict[int, int] = {}
    for unit in shapes.values():
        for t in unit:
            model[t[0]] = model.get(t[0], 0) + math.prod(t[1:])
    kept = sorted(model, key=lambda d: -d * model[d])[:PAD_GROUPS - 1]
    slot = {d: i for i, d in enumerate(kept)}
    out = {f"pad_{w}_{k}": 0 for w in ("dim0", "model", "root", "block") for k in range(PAD_GROUPS)}
    for d, i in slot.items():
        out[f"pad_dim0_{i}"] = d
    rest = PAD_GROUPS - 1

    def add(what: str, tensors) -> None:
        for t in tensors:
            if t[0] in slot:
                out[f"pad_{what}_{slot[t[0]]}"] += math.prod(t[1:])
            else:  # unpadded remainder group: dim0 = 0, elements counted whole
                out[f"pad_{what}_{rest}"] += math.prod(t)

    for unit in shapes.values():
        add("model", unit)
    add("root", shapes["root"])
    add("block", shapes[largest])
    out["param_tensors"] = sum(len(u) for u in shapes.values())
    return out


def spec_quant_state_bytes(spec: ModelSpec) -> int:
    """NF4 quant_state bytes of the model's block Linear weights, tensor by tensor (exact)."""
    import math

    return int(sum(nf4_quant_state_bytes(math.prod(t), 1) for unit, shapes in spec.parameter_shapes().items()
                   if unit != "root" for t in shapes if len(t) == 2))


def model_values(spec: ModelSpec, lora_rank: int = 16, lora_targets: str = "all-linear") -> dict[str, int]:
    """The numbers formulas need from one ModelSpec."""
    if spec.moe:
        mlp_width = (spec.moe.experts_per_token + spec.moe.shared_experts) * spec.moe.intermediate_size
    else:
        mlp_width = spec.intermediate_size
    return dict(
        total_params=spec.total_params, root_params=spec.root_params, unit_params=spec.largest_block_params,
        largest_module_params=spec.largest_module_params, num_layers=spec.num_layers,
        hidden_size=spec.hidden_size, vocab_size=spec.vocab_size, q_width=spec.q_width,
        kv_width=spec.kv_width if not spec.mla else spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim,
        attn_out_width=spec.attn_out_width, num_heads=spec.num_heads, mlp_width=mlp_width,
        moe_blocks=spec.num_moe_blocks, moe_experts=spec.moe.num_experts if spec.moe else 0,
        moe_top_k=spec.moe.experts_per_token if spec.moe else 0,
        matmul_params=spec.matmul_params_per_token,
        gated_mlp=spec.gated_mlp, layernorm=spec.norm == "layernorm", tied_embeddings=spec.tie_word_embeddings,
        lora_params=(lora_blocks_params(spec, lora_rank, lora_targets)
                     + lora_root_params(spec, lora_rank, lora_targets)),
        **lora_adapted_inputs(spec, lora_targets, lora_rank),
        quantized_tensors=spec.num_layers * sum(len(t) == 2 for t in spec.block_parameter_shapes()),
        quant_state_bytes=spec_quant_state_bytes(spec), quantized_bias_params=block_linear_bias_params(spec),
        quantizable_params=block_linear_params(spec),
        extra_norms=max(spec.norms_per_block - 2, 0), norm_fp32=spec.norm_multiply_fp32,
        attn_norm_width=spec.attention_norm_width, attn_norm_rows=spec.attention_norm_rows, fused_qkv=spec.fused_qkv,
        rope_dim=0 if spec.learned_position_embeddings else (spec.mla.qk_rope_head_dim if spec.mla else spec.resolved_head_dim),
        **padding_groups(spec),
    )


def cluster_values(cluster: Cluster) -> dict[str, int]:
    nccl = nccl_bytes_for_link(cluster.intra_link) if cluster.world_size > 1 else 0
    return dict(world_size=cluster.world_size, gpus_per_node=cluster.gpus_per_node,
                gpu_memory_bytes=cluster.gpu.memory_bytes, host_ram_bytes_per_node=cluster.host_ram_bytes_per_node,
                nccl_buffer_bytes=nccl)


def columns_for(spec: ModelSpec, cluster: Cluster, config: TrainingConfig) -> Columns:
    """One configuration as 0-d columns (knobs it leaves unstated from its stack)."""
    from shardplan.inputs.stacks import resolved_fields

    fields = resolved_fields(config, cluster.world_size)  # the stack read once (knob_values would read it again)
    return Columns.build(**model_values(spec, fields.lora_rank, fields.lora_targets), **cluster_values(cluster),
                         **resolved_knob_values(fields, cluster))
