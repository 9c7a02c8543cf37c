"""Activation bytes saved for backward, counted tensor by tensor.

Per decoder layer and per token, each term is a tensor that autograd keeps alive from forward to
backward, at the compute dtype's width ``a`` bytes (2 for 16-bit, 4 for fp32):

* norm input — LayerNorm (torch native kernel) saves its input (a·h) and its fp32 mean and rstd
  (8 bytes). Hugging Face's eager RMSNorm upcasts to fp32 and saves that copy (4·h; in fp32 the
  "copy" is the input itself), its fp32 rstd (4 bytes) and the normalized 16-bit tensor that the
  weight multiply saves (a·h).
* norm output, saved by the next Linear for its weight gradient: a·h.
* attention, SDPA (flash / memory-efficient / CPU flash kernels; FlashAttention-2, Dao 2023, arXiv
  2307.08691, §3.1: the forward keeps O and the row-wise log-sum-exp for backward): q and k after
  RoPE, v, the output O and the per-head log-sum-exp (fp32): a·(2·q + 2·kv) + 4·heads. O is also
  what ``o_proj`` saves: the kernels return O in (b, s, heads, d) layout, so HF's
  ``transpose(1, 2).contiguous()`` is a no-op and no second copy exists (measured:
  data/calibration/fsdp2_facts.json, 2712 B/token/layer = 16h + 8 + 4q + 4kv + 4·heads + 8i).
* attention, eager (Korthikanti et al. 2022, arXiv 2205.05198, §4.1): Q and K for QKᵀ, V, the
  softmax output (a·heads·s), and with dropout its 1-byte mask and its output (a·heads·s), and
  the ``contiguous()`` copy of the context that the output projection saves (a·q).
* MLP, gated (SwiGLU/GeGLU): gate output, activation output, up output, their product: 4·a·i.
  Non-gated (GELU/ReLU): fc1 output and activation output: 2·a·i.
* dropout masks (1 byte per element) after attention and after the MLP when dropout is on.

Under the paper's assumptions (LayerNorm, GELU MLP with i = 4h, eager attention, dropout, a = 2)
the sum is s·b·h·(34 + 5·a_heads·s/h) + the LayerNorm statistics the paper leaves out (2 norms ×
8 bytes per token), Korthikanti et al. Table 2 — pinned in tests/test_activations.py. Logits and
the cross-entropy loss are counted separately (``logits_forward_bytes`` / ``logits_backward_bytes``).

Checkpointing (measured, torch 2.13 non-reentrant ``checkpoint``): during forward and at the start
of backward a checkpointed block holds only its input (full AC), the matmul/attention outputs
(selective), or the odd matmuls' and the attention outputs (selective-op: torchtitan's op-level
SAC). Inside its own backward the block holds its recomputed full set *and* its input (distinct
storage unless the first norm saves the input itself: fp32, or LayerNorm).
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st


def compute_dtype_bytes(precision):
    return np.where(np.asarray(precision) == st.FP32, 4, 2)


LAYERNORM_STATS_BYTES = 8   # fp32 mean + rstd per token (native layer_norm saves both)
RMSNORM_STATS_BYTES = 4     # fp32 rstd per token (HF RMSNorm: x * torch.rsqrt(var + eps) saves rsqrt)


def norm_stats_bytes_per_token(c):
    return np.where(c.layernorm, LAYERNORM_STATS_BYTES, RMSNORM_STATS_BYTES)


def rmsnorm_normalized_bytes(c, a):
    """Bytes per element of the normalized tensor an RMSNorm saves for its weight's gradient: the
    compute dtype when it casts before the weight multiply (Llama, Qwen, Mistral, DeepSeek:
    ``weight * x.to(input_dtype)``), fp32 when it multiplies first (Gemma ``(1 + weight.float()) * x``,
    OLMo 2 ``(weight * x).to(input_dtype)``). Measured: saved-tensor hooks on tiny HF OLMo 2 / Qwen3
    / Llama blocks in bf16 (tests/test_activations.py)."""
    return np.where(c.norm_fp32, 4, a)


def norm_saved_bytes_per_token(c, a):
    """What one norm saves of its input, plus its per-token statistics (see module docstring)."""
    return (np.where(c.layernorm, a * c.hidden_size, (4 + rmsnorm_normalized_bytes(c, a)) * c.hidden_size)
            + norm_stats_bytes_per_token(c))


def attention_norm_bytes_per_token(c, a, frozen=False):
    """Norms inside the attention (Qwen3 / Gemma 3 / OLMo 2 q/k norms, DeepSeek MLA's latent norms):
    like a block RMSNorm over ``attn_norm_width`` elements with one fp32 rstd per normalized row —
    the fp32 upcast, the rstd, and (trainable weight) the normalized tensor. Their output is what
    RoPE and the attention kernel use, already counted there (RoPE's multiply saves cos/sin only).
    Measured: tiny HF Qwen3 vs Llama block, bf16: +(4 + 2)·(q + kv) + 4·(heads + kv_heads) B/token."""
    normalized = np.where(frozen, 0, rmsnorm_normalized_bytes(c, a))
    return (4 + normalized) * c.attn_norm_width + RMSNORM_STATS_BYTES * c.attn_norm_rows


def sdpa_math_fallback(c, a):
    """SDPA runs its math backend: fp32 inputs with grouped-query attention on CUDA. Flash needs
    16-bit inputs and the memory-efficient / cuDNN kernels reject ``enable_gqa`` (mismatched head
    counts), so ``_fused_sdp_choice`` falls back to math (pytorch/torchtitan#2259, a PyTorch SDPA
    maintainer: "it will just fall back to the math impl"; transformers#46960 for head_dim > 256;
    facebookresearch/sapiens2#3). transformers' ``sdpa_attention_forward`` passes ``enable_gqa``.
    ``sdpa_fp32_gqa_math=False``: CPU, whose flash kernel takes fp32 and GQA (measured, hf_stack_cpu).
    Measured: the H100 QLoRA runs with ``prepare_model_for_kbit_training`` (fp32 stream)."""
    return (c.attention == st.SDPA) & (a >= 4) & (c.kv_width < c.q_width) & np.asarray(c.sdpa_fp32_gqa_math, dtype=bool)


def attention_saved_bytes_per_token(c, a):
    """Attention core + projections' saved inputs, per token (the s² part of eager separately).
    SDPA's math backend (``sdpa_math_fallback``, torch ``_scaled_dot_product_attention_math``)
    saves the scaled q, the repeated scaled k and the repeated v (GQA expanded to every head) for
    its two matmuls, and O: a·4·q."""
    sdpa = a * (2 * c.q_width + 2 * c.kv_width) + 4 * c.num_heads
    sdpa = np.where(sdpa_math_fallback(c, a), 4 * a * c.q_width, sdpa)
    eager = a * (c.q_width + 2 * c.kv_width) + a * c.attn_out_width
    return np.where(c.attention != st.EAGER, sdpa, eager)  # a Triton flash kernel saves what SDPA's flash does


def fused_qkv_output_copy_bytes(c, a):
    """With a fused qkv projection (Phi-3 ``qkv_proj``, GPT-2, Falcon) q, k, v reach SDPA as strided
    slices of one tensor, and the kernel's output is not already in the (b, s, heads, d) layout,
    so ``transpose(1, 2).contiguous()`` copies it and a trainable o_proj saves that copy besides
    the O SDPA keeps: + a·(heads·head_dim). Measured: saved-tensor hooks on a tiny HF Phi-3 block
    in bf16 on CPU (tests/test_hf_families.py), +512 B/token at heads·d = 256; a frozen o_proj saves
    nothing (LoRA/QLoRA: 0). ASSUMPTION: CUDA's flash / memory-efficient kernels return the same
    layout for strided inputs as the CPU flash kernel."""
    return np.where(c.fused_qkv & (c.attention != st.EAGER) & np.logical_not(sdpa_math_fallback(c, a)), a * c.attn_out_width, 0)


def attention_quadratic_bytes_per_token(c, a):
    """Eager attention's softmax output (+ dropout mask and output): per token, grows with s; and
    the softmax output SDPA's math backend keeps (a·heads·s)."""
    per_score = np.where(c.dropout, 2 * a + 1, a)
    math = np.where(sdpa_math_fallback(c, a), a * c.num_heads * c.seq_len, 0)
    return np.where(c.attention == st.EAGER, per_score * c.num_heads * c.seq_len, math)


def mlp_saved_bytes_per_token(c, a):
    return np.where(c.gated_mlp, 4 * a * c.mlp_width, 2 * a * c.mlp_width)


def dropout_mask_bytes_per_token(c):
    return np.where(c.dropout, 2 * c.hidden_size, 0)


def layer_bytes_per_token(c, a):
    """One layer without checkpointing: two norms with their outputs, attention, MLP, masks
    (LoRA/QLoRA: ``frozen_layer_bytes_per_token``); Gemma's extra post-attention/post-MLP norms
    save their input and statistics (their output goes to the residual add, which saves nothing);
    q/k norms as ``attention_norm_bytes_per_token``."""
    return np.where(c.method == st.FULL, trainable_layer_bytes_per_token(c, a), frozen_layer_bytes_per_token(c, a))


def trainable_layer_bytes_per_token(c, a):
    """One block of full fine-tuning without checkpointing (``layer_bytes_per_token``)."""
    norms = (2 * (norm_saved_bytes_per_token(c, a) + a * c.hidden_size) + c.extra_norms * norm_saved_bytes_per_token(c, a)
             + attention_norm_bytes_per_token(c, a))
    return (norms + attention_saved_bytes_per_token(c, a) + fused_qkv_output_copy_bytes(c, a)
            + attention_quadratic_bytes_per_token(c, a)
            + mlp_saved_bytes_per_token(c, a) + dropout_mask_bytes_per_token(c))


def frozen_norm_bytes_per_token(c, a):
    """A norm whose weight is frozen saves only what its input gradient needs: HF RMSNorm its fp32
    upcast (``hidden_states.to(float32)``, saved by ``pow``; in fp32 the input itself) and rstd;
    LayerNorm its input, mean and rstd. The normalized tensor the weight multiply would save for
    the weight's gradient is not kept (``weight * x``: autograd saves an operand only for the
    other operand's gradient). Measured: saved-tensor hooks on HF Llama + PEFT LoRA, hf_stack_cpu."""
    return np.where(c.layernorm, a * c.hidden_size + LAYERNORM_STATS_BYTES, 4 * c.hidden_size + RMSNORM_STATS_BYTES)


def lora_adapter_dtype_bytes(c, a):
    """Bytes per element the LoRA path computes in, and whether each adapted input is cast.
    PEFT keeps adapters in fp32 over a 16-bit base (``get_peft_model(autocast_adapter_dtype=True)``)
    and casts each adapted layer's input to the adapter dtype (peft ``tuners/lora/layer.py``
    ``Linear.forward``: ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``; ``tuners/lora/bnb.py``
    ``Linear4bit.forward`` likewise). Under FSDP's mixed precision the adapters are all-gathered in
    the param dtype, so nothing is cast (measured: FSDP2 LoRA runs, hf_stack_cpu.jsonl). The hf
    stack's FSDP gets that policy only from accelerate's mixed precision, the same switch as its
    autocast (``autocast`` knob): accelerate 1.0.1 ``state.py`` calls ``fsdp_plugin.set_mixed_precision``
    only when ``mixed_precision != "no"``, and transformers 4.48.1 ``TrainingArguments`` sets it from
    ``bf16``/``fp16``. A 16-bit model trained without them (fms-acceleration's LoRA rows: bf16 unset,
    ``accelerate.yaml`` ``mixed_precision: 'no'``) all-gathers PEFT's fp32 adapter units in fp32,
    and PEFT casts each adapted input as on one GPU. A loop that builds FSDP's policy itself
    (``fsdp_mp_policy``: shardplan's CPU harness, ``calibrate/hf_stack.py``) casts without autocast.
    Unwrapped / torch-DDP runs keep PEFT's fp32 adapters; what their matmuls save under autocast is
    ``lora_saved_dtype_bytes``. DeepSpeed
    (every stage, its "ddp" = stage 0 included) casts the whole module to the 16-bit dtype
    (``engine._configure_distributed_model``: ``module.bfloat16()``/``half()``), adapters too.
    torchtune's own ``LoRALinear`` (``torchtune/modules/peft/lora.py``, 1814feb17 and since the
    recipe was split out, 01891fc4c 2024-03-08) is not PEFT's: its ``lora_a``/``lora_b`` are built
    under the recipe's ``set_default_dtype`` (the compute dtype, checked by
    ``validate_expected_param_dtype``) and its forward, ``lora_b(lora_a(dropout(x)))``, casts
    nothing: no fp32 copy on the torchtune stack."""
    unwrapped = eng.wrapper_is(eng.W_NONE, c.engine, c.strategy) | eng.wrapper_is(eng.W_DDP, c.engine, c.strategy)
    policy = np.asarray(c.autocast, dtype=bool) | np.asarray(c.fsdp_mp_policy, dtype=bool)
    fsdp_fp32 = eng.wrapper_is(eng.W_FSDP, c.engine, c.strategy) & (c.stack == st.HF) & np.logical_not(policy)
    cast = (unwrapped | fsdp_fp32) & (a < 4) & (c.stack != st.TORCHTUNE)
    return np.where(cast, 4, a), cast


def lora_saved_dtype_bytes(c, a):
    """Bytes per element of what the LoRA matmuls save: under ``torch.autocast`` (the HF Trainer with
    bf16/fp16 = True: accelerate runs the forward in autocast) each adapter matmul casts its fp32
    input to the 16-bit dtype and saves that copy (autocast's ``linear`` is a lower-precision op;
    torch ``tools/autograd/derivatives.yaml`` ``mm``: self saved for the weight's gradient), so the
    dropout output, the cast input and ``lora_A``'s output are kept at a bytes, not d; the fp32
    dropout output itself is freed. Without autocast (the CPU harness, the campaign's LoRA loop,
    stacks other than hf, bf16-pure) the adapter dtype d. Measured: saved-tensor hooks on a tiny HF Llama + PEFT with and without
    CPU autocast, hidden and MLP widths varied (tests/test_lora_autocast.py)."""
    d, cast = lora_adapter_dtype_bytes(c, a)
    # the hf stack's Trainer autocasts under mixed precision; PEFT's 4-bit Linear (lora/bnb.py) skips
    # its fp32 cast under autocast, a path not modelled here (QLoRA keeps the adapter dtype)
    trainer = (c.stack == st.HF) & ((c.precision == st.BF16_MIXED) | (c.precision == st.FP16_MIXED))
    autocast = np.asarray(c.autocast, dtype=bool) & trainer & (c.method == st.LORA)
    return np.where(cast & autocast, a, d)


def lora_saved_bytes_per_token(c, a):
    """What PEFT's LoRA forward saves per block and token (``result + lora_B(lora_A(dropout(x))) * scaling``):

    * ``lora_dropout > 0``: each adapted layer's own ``nn.Dropout`` output (adapter dtype, saved
      by ``lora_A`` for its weight gradient) and its 1-byte mask (``native_dropout``): (d + 1)·in;
    * no dropout, input cast (fp32 adapters over a 16-bit base): each adapted layer's fp32 copy: d·in;
    * no dropout, no cast: ``lora_A`` saves the layer's input itself, shared by q/k/v and by
      gate/up (``lora_unique_in``);
    * every adapted layer: ``lora_A``'s output x·A (rank wide, adapter dtype), saved by ``lora_B``.
    The frozen base Linear saves nothing (its weight needs no gradient; bitsandbytes ``MatMul4Bit``
    keeps only the packed weight, ``autograd/_functions.py``). Saved widths s as
    ``lora_saved_dtype_bytes`` (autocast: the 16-bit copies); the dropout mask in the adapter dtype's
    terms (it is taken before autocast's cast)."""
    d, cast = lora_adapter_dtype_bytes(c, a)
    s = lora_saved_dtype_bytes(c, a)
    dropout = np.asarray(c.lora_dropout) > 0
    inputs = np.where(dropout, (s + lora_dropout_mask_bytes(c, d)) * c.lora_adapted_in,
                      np.where(cast, s * c.lora_adapted_in, a * c.lora_unique_in))
    return np.where(c.method != st.FULL, inputs + s * c.lora_rank_out, 0)


def lora_dropout_mask_bytes(c, d):
    """Bytes per element the dropout keeps for its backward: CUDA's fused ``native_dropout`` a bool
    mask (1); elsewhere (CPU) torch's composite ``_dropout_impl`` multiplies by a noise tensor in
    the input's dtype and saves it (d). Source: torch ``aten/src/ATen/native/Dropout.cpp``
    (``is_fused_kernel_acceptable``: CUDA/XPU/lazy/privateuse1 only); measured: MulBackward0 saving
    an fp32 noise per adapted input on CPU, hf_stack_cpu.jsonl."""
    return np.where(c.fused_dropout, 1, d)


def frozen_layer_bytes_per_token(c, a):
    """One block of a frozen base (LoRA/QLoRA) without checkpointing: two frozen norms, the attention
    core (SDPA saves q, k, v, O, lse whatever is frozen), the MLP activations the gate/act/product
    backward needs (gated: gate output, activation output, up output = 3·a·i; the product is saved
    only by a trainable down projection), dropout masks, and the LoRA path."""
    mlp = np.where(c.gated_mlp, 3, 1) * a * c.mlp_width
    norms = (2 + c.extra_norms) * frozen_norm_bytes_per_token(c, a) + attention_norm_bytes_per_token(c, a, frozen=True)
    return (norms + attention_saved_bytes_per_token(c, a)
            + attention_quadratic_bytes_per_token(c, a) + mlp + dropout_mask_bytes_per_token(c)
            + lora_saved_bytes_per_token(c, a) + quant_saved_input_bytes_per_token(c, a))


def quant_saved_input_bytes_per_token(c, a):
    """The inputs bitsandbytes <= 0.43.1 keeps for a 4-bit base (``quant_saves_input``): its
    ``MatMul4Bit.forward`` stores ``ctx.tensors = (A, B)`` whenever A or the weight needs a gradient
    (0.42.0 ``autograd/_functions.py``), although its backward reads only B; 0.43.2 (PR #1270,
    2024-07-23, "delete useless buffered activation") stores ``(None, B)``. A frozen 16-bit Linear
    keeps nothing (``lora_saved_bytes_per_token``), so a QLoRA block then also keeps the inputs of
    its Linears that nothing else saves: the attention norm's and the MLP norm's outputs and the
    MLP's down-projection input (the activation output, or the gated product): a·(2h + i). The
    attention output is not among them: the block reshapes SDPA's output, which SDPA saves and
    returns in (b, s, heads, d) layout, as a view (measured on CPU: tests/test_quant_saved_input.py).
    ASSUMPTION: two norms feed the block's Linears (a shared-norm parallel block, Falcon, keeps a·h
    less); block 0's attention input, which needs no gradient, is counted like the others."""
    on = (c.method == st.QLORA) & (np.asarray(c.quant_format) == st.NF4) & np.asarray(c.quant_saves_input, dtype=bool)
    return np.where(on, a * (2 * c.hidden_size + c.mlp_width), 0)


def torchao_nf4_qlora(c):
    """QLoRA on torchao ``NF4Tensor`` weights (``nf4_torchao``: torchtune), the case whose
    dequantization time (``throughput.qlora_dequant_s``) and compiled saved weights
    (``nf4_compiled_saved_weight_bytes``) differ from bitsandbytes'."""
    return (c.method == st.QLORA) & (np.asarray(c.quant_format) == st.NF4) & np.asarray(c.nf4_torchao, dtype=bool)


def nf4_compiled_saved_weight_bytes(c):
    """Bytes of one block's 4-bit Linear weights, dequantized to the compute dtype, that a compiled
    torchao NF4 block (``nf4_torchao`` & ``compile``: torchtune's QLoRA) keeps for its backward: a
    per-block amount, not per token. torchao's ``LinearNF4`` (v0.6.1 ``dtypes/nf4tensor.py``
    l.929-940) saves the NF4 weight and dequantizes it again for the input gradient
    (``grad_output @ weight.to(grad_output.dtype)``); compiled, AOTAutograd's min-cut partitioner
    (torch ``_functorch/partitioners.py``) saves the forward's dequantized weight for the backward
    matmul instead. Measured on the CPU (torch 2.13, torchao 0.1 and 0.6.1,
    ``calibrate/nf4_saved_weight.py``, data/calibration/nf4_saved_weight_cpu.jsonl): a torchtune
    ``LoRALinear`` saves a·out·in bytes besides its input and ``lora_a``'s output, for three weight
    shapes and two token counts; eager it saves no weight. Without checkpointing every block keeps
    this until its backward; with torchtune's checkpointing (torch >= 2.5: each layer compiled, the
    compiled layer checkpointed) the recomputation saves it again, so the block being
    back-propagated holds it. ASSUMPTION: block Linears alike in every block (quantizable / L); torch
    < 2.5's whole-model compile with the checkpoint inside the graph re-dequantizes in the backward
    graph instead (measured: 0 B saved) and is over-counted by this block amount."""
    on = torchao_nf4_qlora(c) & np.asarray(c.compile, dtype=bool)
    per_block = compute_dtype_bytes(c.precision) * np.asarray(c.quantizable_params) / np.maximum(c.num_layers, 1)
    return np.asarray(np.where(on, np.ceil(per_block), 0), dtype=np.int64)


def nf4_compiled_held_in_backward_bytes(c):
    """Of ``nf4_compiled_saved_weight_bytes``, what block k still holds at its MLP product's backward
    (the backward moments) and at its recomputation's modelled sub-moment (the up projection's LoRA
    forward): all but the down projection's weight (a·h·i). The compiled backward frees each saved
    weight after its last use (AOTAutograd ``ctx.maybe_clear_saved_tensors``, inductor's
    ``args.clear()``; measured on the CPU: in a compiled two-``linear_nf4`` chain the second
    weight's bf16 copy is gone when the first one's input-gradient matmul starts), and the down
    projection's input gradient is the block backward's first matmul; in the recomputed forward
    it is the last one dequantized."""
    a = compute_dtype_bytes(c.precision)
    whole = nf4_compiled_saved_weight_bytes(c)
    return np.asarray(np.where(whole > 0, np.maximum(whole - a * c.hidden_size * c.mlp_width, 0), 0), dtype=np.int64)


def first_block_untracked_bytes_per_token(c, a):
    """LoRA/QLoRA without checkpointing: the frozen embedding's output needs no gradient, so the
    first block's input norm saves nothing. With HF gradient checkpointing PEFT users call
    ``enable_input_require_grads`` (transformers ``modeling_utils``; PEFT
    ``prepare_model_for_kbit_training``), and it saves as usual. Likewise the dropout masks of the
    adapters on that norm's output (q/k/v): a dropout keeps its mask only for its input's gradient."""
    d, _ = lora_adapter_dtype_bytes(c, a)
    masks = np.where(np.asarray(c.lora_dropout) > 0, lora_dropout_mask_bytes(c, d) * c.lora_qkv_adapted * c.hidden_size, 0)
    return np.where((c.method != st.FULL) & (c.ac == st.AC_NONE), frozen_norm_bytes_per_token(c, a) + masks, 0)


def selective_layer_bytes_per_token(c, a):
    """Selective checkpointing keeps matmul and attention-kernel outputs and the block input;
    it recomputes norms, RoPE, activation functions and dropout, and (eager) the s² softmax
    (Korthikanti et al. 2022, §5: "selective activation recomputation")."""
    h = c.hidden_size
    attn = a * (c.q_width + 2 * c.kv_width) + np.where(c.attention != st.EAGER, a * c.attn_out_width + 4 * c.num_heads, 0)
    mlp = np.where(c.gated_mlp, 2 * a * c.mlp_width, a * c.mlp_width)
    return a * h + attn + a * h + mlp + a * h


def op_sac_saved_linear_width(c):
    """Output width (elements per token) of the block Linears torchtitan's op-level SAC saves.

    torchtitan's policy (``torchtitan/models/llama3/infra/parallelize.py`` ``_get_custom_policy`` at
    2c8b5947, ``parallelisms/parallelize_llama.py`` at 9dec370; ``distributed/activation_checkpoint.py``
    ``SelectiveAC`` at b5bcd76): each checkpointed block counts its ``aten.mm`` calls in forward
    order and saves the outputs of the odd ones ("Saves output of all compute ops, except every
    second mm"), plus the attention kernel's outputs; every other op is recomputed. The count
    restarts in every block (a fresh ``meta`` per ``context_fn`` call). Forward order: q, k, v, o,
    then gate, up, down (``w2(silu(w1(x)) * w3(x))``), so q, v, gate and down are saved; a fused
    qkv projection is one mm (qkv saved, o recomputed); a plain MLP saves fc1 and recomputes fc2.
    ASSUMPTION: the base Linears are the only matmuls (LoRA adapters' own mms would shift the
    parity; torchtitan trains full models)."""
    attn = np.where(c.fused_qkv, c.q_width + 2 * c.kv_width, c.q_width + c.kv_width)
    mlp = np.where(c.gated_mlp, c.mlp_width + c.hidden_size, c.mlp_width)
    return attn + mlp


def op_sac_recomputed_params_per_layer(c):
    """Weights per block whose matmul op-level SAC recomputes in backward (the even mms of
    ``op_sac_saved_linear_width``): k (unless fused into qkv), o, and up (gated) or fc2 (plain)."""
    return c.hidden_size * (np.where(c.fused_qkv, 0, c.kv_width) + c.attn_out_width + c.mlp_width)


def selective_op_layer_bytes_per_token(c, a):
    """What a block under torchtitan's op-level SAC holds between forward and backward: its input
    (the checkpoint's argument), the saved Linear outputs (``op_sac_saved_linear_width``) and the
    attention kernel's outputs (SDPA: O and the fp32 log-sum-exp; eager attention's bmm/softmax are
    not in the policy's save list, so nothing). Llama-3.1-8B in bf16: 63,616 B/token against
    102,528 for ``selective_layer_bytes_per_token``."""
    sdpa = np.where(c.attention == st.SDPA, a * c.attn_out_width + 4 * c.num_heads, 0)
    return a * c.hidden_size + a * op_sac_saved_linear_width(c) + sdpa


def checkpointed_layers(c):
    """How many blocks are checkpointed: all (full, selective), every k-th (ceil(L/k)), none."""
    every_k = -(-c.num_layers // np.maximum(c.ac_every_k, 1))
    return np.select([c.ac == st.AC_NONE, c.ac == st.AC_EVERY_K], [0, every_k], c.num_layers)


def recompute_fraction(c):
    """Share of the blocks whose forward is recomputed in backward (the time model's recompute FLOPs
    and bytes, the host's checkpoint hooks): all (full, selective), 1/k-th (every-k), none (0
    without checkpointing)."""
    return checkpointed_layers(c) / np.maximum(c.num_layers, 1)


def kept_layer_bytes_per_token(c, a):
    """What a block holds between its forward and its backward: everything (no AC), its input
    (full AC: ``kept_input_bytes_per_token``), or the matmul/attention outputs and its input (selective)."""
    return np.select([c.ac == st.AC_SELECTIVE, c.ac == st.AC_SELECTIVE_OP],
                     [selective_layer_bytes_per_token(c, a), selective_op_layer_bytes_per_token(c, a)],
                     kept_input_bytes_per_token(c, a))


def kbit_fp32_stream(c):
    """Whether PEFT's ``prepare_model_for_kbit_training`` (``kbit_prep``) leaves fp32 parameters
    that the residual stream runs through: a QLoRA model it prepared, except one sharded over more
    than one rank by FSDP or ZeRO-3. There TRL's SFTTrainer does not prepare at all (``is_sharded_qlora``:
    a ``Params4bit`` on cpu/meta, as FSDP's cpu-RAM-efficient loading leaves it, "one should never
    call prepare_model_for_kbit_training when doing QLoRA + FSDP / DS-Zero3", trl
    ``trainer/sft_trainer.py`` @v0.13.0), and where a user prepared it anyway, Trainer sets FSDP's
    mixed precision to the quant storage dtype (transformers ``Trainer._fsdp_qlora_plugin_updates``),
    which casts the prepared parameters back. Measured (fms-acceleration a100_80gb.csv, 2 GPUs): the
    prepared baseline and the plugin's unprepared load hold the same 8.78 / 14.87 GiB and run at the
    same tokens/s (2949 / 2948, 3399 / 3393); on one GPU they differ by the fp32 stream."""
    sharded = (eng.wrapper_is(eng.W_FSDP, c.engine, c.strategy)
               | (eng.wrapper_is(eng.W_DEEPSPEED, c.engine, c.strategy) & (c.strategy == st.FULL_SHARD)))
    return ((c.method == st.QLORA) & np.asarray(c.kbit_prep, dtype=bool)
            & ~(sharded & (np.asarray(c.world_size) > 1)))


def stream_dtype_bytes(c):
    """Bytes per element of the residual stream the blocks' element-wise kernels move: the
    configuration's compute dtype, except a QLoRA model whose prepared parameters stay fp32
    (``kbit_fp32_stream``: PEFT casts every non-4-bit parameter, norms, embeddings and lm_head, to
    fp32, peft ``utils/other.py``): HF's RMSNorm returns ``weight * hidden_states.to(input_dtype)``,
    an fp32 product, and bitsandbytes' ``Linear4bit`` returns its output in its input's dtype, so
    norms, residual adds, RoPE and the MLP product run in fp32 (4 B). ASSUMPTION: the head's
    cross-entropy keeps the compute dtype's count."""
    a = compute_dtype_bytes(c.precision)
    return np.where(kbit_fp32_stream(c), np.maximum(a, 4), a)


def kept_input_bytes_per_token(c, a):
    """The block input a full checkpoint keeps: the residual stream's h elements, in the stream's
    dtype: fp32 where the prepared parameters stay fp32 (``kbit_fp32_stream``). Measured
    (fms-acceleration a100_80gb.csv, Mistral-7B, one GPU, 4096-token samples): the prepared baseline
    holds 1.00 GiB per sample more than the plugin's unprepared load, = 2·h·L per token (h 4096,
    L 32); on two GPUs the two measure the same (8.78 / 14.87 GiB)."""
    return np.where(kbit_fp32_stream(c), np.maximum(a, 4), a) * c.hidden_size


def fsdp1_reentrant_held_bytes_per_token(c, a):
    """Per token, the block input each block whose backward has finished keeps alive (with its
    gradient: ``memory._backward_activation_bytes``) under FSDP1 with frozen decoder units and
    reentrant checkpointing; 0 elsewhere.

    PEFT's ``fsdp_auto_wrap_policy`` (which transformers' ``Trainer._fsdp_qlora_plugin_updates``
    installs for LoRA models) puts each adapter Linear in its own FSDP unit, so a decoder block's
    flat parameter is frozen and FSDP1's ``_pre_forward`` calls
    ``_register_post_backward_reshard_only_hook`` (torch ``distributed/fsdp/_runtime_utils.py``),
    a ``torch.autograd.graph.register_multi_grad_hook`` on the block's inputs. Under reentrant
    checkpointing those inputs are ``CheckpointFunction.backward``'s detached leaves; the hook's
    closure keeps their ``AccumulateGrad`` nodes (``_get_grad_fn_or_grad_acc``), each holding its
    leaf, which aliases the checkpoint's saved input and carries the ``.grad`` the recomputed
    backward accumulated into it, until ``_finalize_params`` removes the hook at the end of the
    backward. Measured on CPU (FSDP1 on a fake process group, world sizes 1 and 2;
    tests/test_fsdp1_reentrant_hold.py): a finished block's input and gradient stay, except the
    gradient still flowing into the next block; nothing without FSDP or with non-reentrant
    checkpointing."""
    held = (eng.layout_is(eng.FLAT_UNIT, c.engine) & (c.strategy != st.SINGLE) & (c.method != st.FULL)
            & np.asarray(c.reentrant_checkpointing, dtype=bool) & (checkpointed_layers(c) > 0))
    return np.where(held, kept_input_bytes_per_token(c, a), 0)


def recompute_extra_bytes_per_token(c, a):
    """Inside a checkpointed block's backward its input (kept by the checkpoint) coexists with the
    recomputed set, unless the first norm saves that very tensor (fp32 training, or LayerNorm)."""
    shared = c.layernorm | (a >= 4)
    extra = np.where(shared, 0, a * c.hidden_size)
    # selective (measured, tiny runs W=2/8, fp32 and bf16): one more h-wide tensor than full AC —
    # the block output the policy stored (down_proj's matmul output) coexists with the recompute.
    # op-level SAC stores the down projection's output too when the MLP is gated (it is the 3rd,
    # odd, MLP mm); a plain MLP's fc2 output is recomputed
    stored_output = (c.ac == st.AC_SELECTIVE) | ((c.ac == st.AC_SELECTIVE_OP) & c.gated_mlp)
    return extra + np.where(stored_output, a * c.hidden_size, 0)


def block_activation_bytes(c, full=None, n_ckpt=None):
    """Saved activations of all blocks during forward and at the start of backward, one micro-batch:
    checkpointed blocks keep only what their policy saves (measured: the forward peak of the 7B
    FakeTensorMode runs holds L block inputs under full AC). ``full`` / ``n_ckpt``: this ``c``'s
    ``layer_bytes_per_token`` / ``checkpointed_layers`` where the caller has them already."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    full = layer_bytes_per_token(c, a) if full is None else full
    n_ckpt = checkpointed_layers(c) if n_ckpt is None else n_ckpt
    per_token = (n_ckpt * kept_layer_bytes_per_token(c, a) + (c.num_layers - n_ckpt) * full
                 - first_block_untracked_bytes_per_token(c, a))
    # activation offloading keeps ~2 layers' worth on the GPU (OFFLOAD_LAYERS_ON_DEVICE, below)
    L = np.maximum(c.num_layers, 1)
    on_device = np.where(c.activation_offload, layers_on_device(c, L) / L, 1.0)
    return np.asarray(np.floor(tokens * per_token * on_device), dtype=np.int64)


def rope_bytes(c):
    """RoPE cos and sin, computed once in the root and cast to the compute dtype (b·s·head_dim
    each), saved by every block's rotary multiplies. None with learned positions.
    ``rope_shared_batch``: transformers builds them from ``position_ids = cache_position.unsqueeze(0)``
    (``LlamaModel.forward``), one row broadcast over the batch: s·head_dim each (measured:
    saved-tensor hooks, (1, 1, s, head_dim) bf16, hf_stack_cpu)."""
    a = compute_dtype_bytes(c.precision)
    rows = np.where(c.rope_shared_batch, 1, c.micro_batch)
    return np.asarray(2 * a * rows * c.seq_len * c.rope_dim, dtype=np.int64)


def head_activation_bytes(c):
    """Final norm (input, statistics and output) saved before the lm_head, and RoPE's cos/sin."""
    a = compute_dtype_bytes(c.precision)
    # frozen final norm and lm_head (LoRA/QLoRA): the norm's input-gradient tensors only
    per_token = np.where(c.method == st.FULL, norm_saved_bytes_per_token(c, a) + a * c.hidden_size,
                         frozen_norm_bytes_per_token(c, a))
    norm = c.micro_batch * c.seq_len * per_token
    return np.asarray(norm + rope_bytes(c), dtype=np.int64)


def loss_dtype_bytes(c):
    """Bytes per element of the log-softmax the loss saves, and so of its gradients: 4 when the
    loss runs in fp32 — an upcast of the logits (``logits_fp32``: HF ``ForCausalLMLoss``
    ``logits.float()``, torchtitan ``pred.float()``, torchtune's chunks, and a loss computed under
    ``torch.autocast``, which casts ``cross_entropy``'s input to fp32) or fp32 training; otherwise
    the 16-bit compute dtype (the torch FSDP2 tutorial's loop: ``F.cross_entropy`` on the 16-bit
    logits, whose ``log_softmax`` returns 16-bit; LitGPT's ``bf16-true`` loss is fp32: Lightning
    Fabric casts the model's outputs to float32 in ``convert_output``). shardplan's
    bf16-mixed names the weights' precision, not whether the loss runs under autocast, so the
    upcast is the stack's ``logits_fp32``. Measured per stack on CPU: tests/test_loss_memory.py."""
    a = compute_dtype_bytes(c.precision)
    return np.where(np.asarray(c.logits_fp32, dtype=bool), 4, a)


def _upcast_bytes(c, a):
    """The fp32 copy of 16-bit logits a loss running in fp32 makes (``.float()`` or autocast's
    cast): an input of log-softmax, not saved by it."""
    return np.where((a < 4) & (loss_dtype_bytes(c) == 4), 4, 0)


def kbit_autocast_head(c):
    """QLoRA after ``prepare_model_for_kbit_training`` on the hf stack: the LM head's weight is fp32
    (PEFT ``utils/other.py`` casts every non-4-bit parameter to fp32) while the Trainer's bf16
    autocast runs ``lm_head`` as a 16-bit matmul (autocast's ``linear``). Outside FSDP (whose mixed
    precision casts the parameters itself)."""
    unwrapped = eng.wrapper_is(eng.W_NONE, c.engine, c.strategy) | eng.wrapper_is(eng.W_DDP, c.engine, c.strategy)
    return ((c.method == st.QLORA) & np.asarray(c.kbit_prep, dtype=bool) & np.asarray(c.autocast, dtype=bool)
            & (c.stack == st.HF) & unwrapped)


def kbit_head_copy_bytes(c):
    """Autocast's 16-bit copy of that fp32 LM head weight (2·V·h): the matmul saves it for the
    hidden state's gradient (``mm``: mat2 saved for self's gradient; the weight itself is frozen,
    so not autocast's weight cache), alive from the head's forward to its backward — the loss's
    moments. Measured on CPU: tests/test_lora_autocast.py (V and h varied)."""
    return np.where(kbit_autocast_head(c), 2 * c.vocab_size * c.hidden_size, 0)


def logits_dtype_bytes(c):
    """Bytes per logit as the head's matmul writes them: the compute dtype, or 2 for a kbit-prepared
    QLoRA under autocast (``kbit_autocast_head``), whose fp32 stream meets a 16-bit head matmul."""
    return np.where(kbit_autocast_head(c), 2, compute_dtype_bytes(c.precision))


def _logits_labels_bytes(c):
    """The int64 labels HF pads and shifts (8·b·(s+1) + 8·b·s) and the int64 position ids (8·s)."""
    return 8 * c.micro_batch * (2 * c.seq_len + 1) + 8 * c.seq_len


def _held_hidden_bytes(c, a):
    # the last hidden state stays referenced by the model's forward while the loss runs
    # (transformers ``LlamaForCausalLM.forward``: ``hidden_states = outputs.last_hidden_state``);
    # a trainable lm_head saves it anyway (``head_activation_bytes``), a frozen one does not
    return np.where(c.method != st.FULL, c.micro_batch * c.seq_len * a * c.hidden_size, 0)


def logits_forward_bytes(c):
    """Logits and loss at the forward peak (inside ``cross_entropy``'s log-softmax), per token and
    vocabulary entry: the a-byte logits, the fp32 copy a loss running in fp32 makes of 16-bit
    logits (``_upcast_bytes``), and the log-softmax output it saves (``loss_dtype_bytes``): HF /
    torchtitan bf16 2 + 4 + 4 = 10, a 16-bit loss 2 + 2 = 4. Plus the labels
    and position ids and, LoRA/QLoRA, the held last hidden state. Measured: 10 B/token/vocab entry
    in bf16 (fsdp2_facts.json).

    ``fused_ce`` (a fused kernel: flash-attn ``flash_attn/losses/cross_entropy.py`` →
    ``xentropy_cuda_lib`` / ``ops/triton/cross_entropy.py``, llm-foundry's default
    ``loss_fn: fused_crossentropy`` in ``ComposerMPTCausalLM``): the kernel reads the 16-bit logits
    and writes only an fp32 loss and log-sum-exp per row (8·bs), saving the logits themselves.
    ASSUMPTION: no chunked/fused-linear cross-entropy (Liger) unless ``ce_chunks`` / ``fused_ce``."""
    a = compute_dtype_bytes(c.precision)
    w = logits_dtype_bytes(c)  # the logits' width: a, or 2 under a kbit-prepared head's autocast
    tokens = c.micro_batch * c.seq_len
    loss = loss_dtype_bytes(c)
    per_entry = w + _upcast_bytes(c, w) + loss
    eager = tokens * c.vocab_size * per_entry
    fused = tokens * c.vocab_size * w + 8 * tokens
    return np.asarray(np.where(c.fused_ce, fused, eager) + _logits_labels_bytes(c) + _held_hidden_bytes(c, a)
                      + kbit_head_copy_bytes(c), dtype=np.int64)


def logits_backward_bytes(c):
    """Logits and loss at the start of backward: the saved log-softmax output, and while its
    backward runs the incoming gradient from nll_loss and its own result, each in the loss dtype
    ``l`` (``loss_dtype_bytes``): 3·l·bsV — 12·bsV for an fp32 loss, 6·bsV for a 16-bit one.
    The 16-bit logits are gone by then: the model's forward (or the HF Trainer's ``compute_loss``)
    drops them; a loop that keeps ``outputs.logits`` adds a·bsV. Measured (fp32 loss): 7B runs,
    backward peak Temp = 8·bsV, Activation = saved + 4·bsV.

    ``fused_ce``: the saved 16-bit logits and the gradient the kernel writes in their dtype
    (flash-attn ``SoftmaxCrossEntropyLossFn.backward``: a new tensor unless ``inplace_backward``,
    which llm-foundry does not set): 2·a·bsV.

    ``loop_keeps_logits``: the loop still references the logits the loss read, in the loss dtype,
    through backward: + l·bsV. torchtune's recipes until "del logits" (lora_finetune_distributed
    #1046, 2024-06-04; the other recipes #1235, 2024-07-28): ``logits = self._model(input_ids)``
    (the model returns ``self.output(h).float()``), ``logits = logits[..., :-1, :].contiguous()``,
    ``logits = logits.transpose(1, 2)``, ``loss = self._loss_fn(logits, labels)``, then
    ``loss.backward()`` with ``logits`` alive: 4 + 12 = 16·bsV with the fp32 loss (measured on CPU,
    tests/test_loss_memory.py). ASSUMPTION: the shift's one token per row is not subtracted."""
    a = compute_dtype_bytes(c.precision)
    kept = np.where(np.asarray(getattr(c, "loop_keeps_logits", False), dtype=bool), 1, 0)
    per_entry = np.where(c.fused_ce, 2 * a, (3 + kept) * loss_dtype_bytes(c))
    return np.asarray(c.micro_batch * c.seq_len * c.vocab_size * per_entry + kbit_head_copy_bytes(c), dtype=np.int64)


def logits_and_loss_bytes(c):
    """Logits and loss at their larger moment (forward or start of backward)."""
    return np.maximum(logits_forward_bytes(c), logits_backward_bytes(c))

HEAD_CHUNK_TOKENS = 128  # LitGPT finetune/lora.py (and adapter, full): model(input_ids, lm_head_chunk_size=128)


def head_chunks(c):
    """LitGPT's lm_head chunks: ``x.split(128, dim=1)``, ceil(s / 128) of them."""
    return np.maximum(np.ceil(np.asarray(c.seq_len) / HEAD_CHUNK_TOKENS), 1)


def chunked_head_forward_bytes(c):
    """Logits and loss at the forward peak of LitGPT's fine-tuning loop (``chunked_head``;
    litgpt/lora.py ``GPT.forward(lm_head_chunk_size=128)``, litgpt/utils.py ``chunked_cross_entropy``)
    on Lightning Fabric: the model returns C 16-bit chunks, which ``_FabricModule.forward`` casts to
    fp32 (``precision.convert_output``: ``torch.get_default_dtype()``) and drops; the loss runs
    ``cross_entropy`` per chunk, each saving its fp32 log-softmax. Inside the last chunk's loss: the
    fp32 logits (4·bsV, the loop's ``logits``) + every chunk's log-softmax (4·bsV) = 8·bsV (the cast
    itself holds 2 + 4). Plus labels and the held hidden state as ``logits_forward_bytes``.
    ASSUMPTION: the previous step's fp32 logits, which the loop still holds while the next forward
    runs (+4·bsV at that cast when consecutive batches are as long), are not counted."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    return np.asarray(tokens * c.vocab_size * 8 + _logits_labels_bytes(c) + _held_hidden_bytes(c, a), dtype=np.int64)


def chunked_head_backward_bytes(c):
    """The start of backward in LitGPT's loop (``chunked_head``): the fp32 logits the loop keeps
    referenced (4·bsV), the C saved fp32 log-softmax outputs (4·bsV) and one chunk's nll and
    log-softmax gradients (8·bsV/C): (8 + 8/C)·bsV. Measured on CPU with the loop and Fabric's cast
    (tests/test_loss_memory.py): 9.8 at C = 4, 11.9 at C = 2."""
    tokens = c.micro_batch * c.seq_len
    return np.asarray(np.ceil(tokens * c.vocab_size * (8 + 8 / head_chunks(c))), dtype=np.int64)


def chunked_head_dequant_moment_bytes(c):
    """(logits and loss, dequantized head) while a 4-bit lm_head (``quant_head``) computes its first
    chunk's input gradient (bitsandbytes 0.42 ``MatMul4Bit.backward``: ``dequantize_4bit(B)`` in the
    quant_state's fp16, ``.to(grad_output.dtype)``: 2 + 2 bytes per weight): the fp32 logits, the
    log-softmax of the other C - 1 chunks and this chunk's 16-bit gradient, (8 - 2/C)·bsV (the
    chunk's own log-softmax and fp32 gradients are freed by then); the head 4·V·h. Zeros unless
    ``quant_head`` and ``chunked_head`` on a QLoRA run."""
    on = (c.method == st.QLORA) & np.asarray(c.quant_head, dtype=bool) & np.asarray(c.chunked_head, dtype=bool)
    tokens = c.micro_batch * c.seq_len
    logits = np.ceil(tokens * c.vocab_size * (8 - 2 / head_chunks(c)))
    return (np.asarray(np.where(on, logits, 0), dtype=np.int64),
            np.asarray(np.where(on, 4 * c.vocab_size * c.hidden_size, 0), dtype=np.int64))


def block_forward_working_bytes_per_token(c, a, full=None, n_ckpt=None):
    """Bytes per token alive inside the forward of the block being run (beyond the saved tensors of
    the blocks before it), at that block's largest sub-moment. Measured (torch 2.13, tiny Llama and
    GPT-2 runs, FSDPMemTracker / StorageTracker per-op traces; data/calibration/):

    * no AC: the end of the block (the residual add allocating the block output): the block's full
      saved set + the down projection's output + the block output (2·a·h), + the block input and
      the post-attention residual when no norm saves them (16-bit RMSNorm saves its fp32 upcast
      instead: +2·a·h; fp32 RMSNorm and LayerNorm save the input itself). GPT-2 fp32, W=4: forward
      peak at the last block's residual add, −4.4 % before this moment was modelled.
    * full AC: the MLP product (``act(gate(x)) * up(x)``): the block input (kept by the checkpoint),
      the residual, the norm output, and the activation output, up output and product (3·a·i gated,
      2·a·i plain: fc1 and activation outputs); nothing of the block is saved. Tiny Llama fp32 W=4
      FSDP1: 172,288 B activations at ``aten.mul`` in block 1 = 64 tokens × (a·h + 3·a·h + 3·a·i)
      + RoPE + position ids.
    * selective AC: the MLP product again, with what the policy saved so far (all of
      ``selective_layer_bytes_per_token`` but the down projection's output) + residual, norm output,
      activation output and product: sel + a·h + 2·a·i (gated; plain: sel + a·h + a·i). Tiny Llama
      fp32 W=8 FSDP2: 420,096 B activations, exact.
    * op-level SAC (``selective_op_layer_bytes_per_token`` = op): the same moment, where the up
      projection's output is alive but not saved: op − a·h (down, not yet run) + residual + norm
      output + activation output, up output and product = op + a·h + 3·a·i (gated); a plain MLP
      (fc2 not saved): op + 2·a·h + a·i.

    Every-k checkpointing takes the no-AC value (the last block may be unchecked). ASSUMPTION: the MLP
    dominates the attention sub-moment (i ≥ 2h); eager attention's s² temporaries are not modelled
    here. ``full`` / ``n_ckpt`` as in ``block_activation_bytes``."""
    h, i = c.hidden_size, c.mlp_width
    full = layer_bytes_per_token(c, a) if full is None else full
    n_ckpt = checkpointed_layers(c) if n_ckpt is None else n_ckpt
    shared = c.layernorm | (a >= 4)
    none = full + np.where(shared, 0, 2 * a * h) + 2 * a * h
    full_ac = np.maximum(3 * a * h + np.where(c.gated_mlp, 3, 2) * a * i, 4 * a * h)
    sel = selective_layer_bytes_per_token(c, a)
    selective = np.maximum(sel + a * h + np.where(c.gated_mlp, 2, 1) * a * i, sel + 2 * a * h)
    op = selective_op_layer_bytes_per_token(c, a)
    selective_op = np.maximum(op + np.where(c.gated_mlp, a * h + 3 * a * i, 2 * a * h + a * i), op + 2 * a * h)
    all_ckpt = n_ckpt >= c.num_layers
    return np.where(all_ckpt, np.select([c.ac == st.AC_SELECTIVE, c.ac == st.AC_SELECTIVE_OP], [selective, selective_op],
                                        full_ac), none)


def position_ids_bytes(c):
    """int64 position ids (b rows expanded from one arange: 8·s bytes), alive through forward."""
    return np.asarray(8 * c.seq_len, dtype=np.int64)


def backward_working_bytes_per_token(c, a):
    """Activation gradients alive at a block's backward peak beyond its saved tensors, per token
    (measured: the MLP's product backward). The block output's gradient (a·h), and for a gated MLP
    the gradients of both factors while the product's gradient is still held and the product is
    freed: +2·a·i; non-gated: the activation's input gradient, +a·i. LoRA/QLoRA with the MLP not
    adapted: + the product's gradient (a·i), the product was never saved."""
    # a frozen, unadapted down projection never saved the product: its gradient (a·i) comes on top
    # (measured: HF Llama + PEFT LoRA on q,v, per-op trace of block 0's backward, hf_stack)
    unsaved_product = np.where((c.method != st.FULL) & (c.lora_mlp_adapted == 0), a * c.mlp_width, 0)
    return a * c.hidden_size + np.where(c.gated_mlp, 2, 1) * a * c.mlp_width + unsaved_product


def lora_recompute_bytes_per_token(c, a):
    """A checkpointed LoRA/QLoRA block being recomputed at the start of its backward, per token, at
    its largest sub-moment (measured per op on HF Llama + PEFT, h=64, i=176, V=256, s=128, b=2;
    PEFT's LoRA forward: peft ``tuners/lora/layer.py`` ``Linear.forward``):

    * MLP adapted, inside the up projection's LoRA forward: everything the block saves but the down
      projection's LoRA inputs, the MLP norm's output (a·h, alive as the MLP's input), PEFT's
      ``lora_B(...)`` and ``* scaling`` transients (2·d·i) and, with dropout, the cast input (d·h)
      that is not the saved tensor (no dropout: 5,240 B/token, exact);
    * MLP adapted, inside the down projection's LoRA forward: the whole saved set, the norm output,
      down's base output (a·h), the MLP product (a·i, down's input) unless it is itself the saved
      LoRA input (no cast, no dropout), and with dropout the cast product (d·i);
    * MLP not adapted: the MLP product (a·i) with the block's saved set and the norm output.
    Plus the gradients in flight when it starts: the block output's (a·h) and the next block's
    input-norm backward (its fp32 upcast's gradient, 4·h, and that cast back, a·h)."""
    d, cast = lora_adapter_dtype_bytes(c, a)
    h, i = c.hidden_size, c.mlp_width
    dropout = np.asarray(c.lora_dropout) > 0
    copied = dropout | cast  # down's LoRA input is a copy, not the product itself
    rank = c.lora_rank_out // np.maximum(c.lora_adapted_linears, 1)
    down = np.where(dropout, d + lora_dropout_mask_bytes(c, d), d) * i + d * rank
    frozen = frozen_layer_bytes_per_token(c, a)
    up_moment = frozen - down + a * h + 2 * d * i + np.where(dropout & cast, d * h, 0)
    down_moment = frozen + 2 * a * h + np.where(copied, a * i, 0) + np.where(dropout & cast, d * i, 0)
    working = np.where(c.lora_mlp_adapted > 0, np.maximum(up_moment, down_moment), frozen + a * h + a * i)
    in_flight = 2 * a * h + 4 * h
    return np.where(c.method != st.FULL, working + in_flight, 0)


def chunked_logits_forward_bytes(c):
    """Logits and loss at the forward peak with torchtune's chunked cross-entropy (``ce_chunks`` =
    C > 0; ``torchtune/modules/loss/ce_chunked_output_loss.py`` ``CEWithChunkedOutputLoss``).

    Mechanism: the model's output projection runs per chunk of tokens (``h.tensor_split(C, dim=1)``),
    so the 16-bit logits exist as C chunk tensors that are all alive until the loss returns
    (a·bsV in all); the loss loops over the chunks and, for each, upcasts it to fp32 and calls
    ``cross_entropy``. The fp32 upcast is an input of log-softmax, not saved by it, so it is freed
    after its chunk: one chunk's upcast (4·bsV/C) is alive at a time — this is the saving. Each
    chunk's fp32 log-softmax output IS saved for backward, so all C of them (4·bsV) are alive when
    the last chunk runs, plus the last chunk's upcast. Total a·bsV + 4·bsV + 4·bsV/C (fp32 training:
    no upcast, a + 4 per entry) + the int64 labels and position ids as unchunked.
    Compiled (``fused_ce``; torchtune ``training.compile_loss`` compiles ``compute_cross_entropy``,
    the upcast and the cross-entropy of one chunk): each chunk's loss saves its 16-bit chunk and
    two fp32 per-row statistics, no fp32 copy (``logits_forward_bytes``): a·bsV + 8·bs."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    chunks = np.maximum(c.ce_chunks, 1)
    loss = loss_dtype_bytes(c)
    per_entry = a + loss + _upcast_bytes(c, a) / chunks
    eager = np.ceil(tokens * c.vocab_size * per_entry)
    fused = tokens * c.vocab_size * a + 8 * tokens
    # the model's forward still holds the last hidden state (see ``logits_forward_bytes``)
    return np.asarray(np.where(c.fused_ce, fused, eager) + _logits_labels_bytes(c) + _held_hidden_bytes(c, a),
                      dtype=np.int64)


def chunked_logits_backward_bytes(c):
    """The start of backward with chunked cross-entropy: the recipe dropped the 16-bit logits
    (``del logits`` before ``backward()``); the C saved fp32 log-softmax outputs (4·bsV) stay until
    their chunk's backward, and one chunk at a time has its incoming fp32 gradient, its
    log-softmax backward result (8·bsV/C) and the cast back to the 16-bit dtype (a·bsV/C).
    Compiled (``fused_ce``): the saved 16-bit chunks (a·bsV, kept by the compiled losses although
    the recipe drops its own reference) and one chunk's 16-bit gradient (a·bsV/C) + the statistics."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    chunks = np.maximum(c.ce_chunks, 1)
    loss = loss_dtype_bytes(c)
    per_entry = loss + (2 * loss + np.where(_upcast_bytes(c, a) > 0, a, 0)) / chunks
    fused = np.ceil(tokens * c.vocab_size * a * (1 + 1.0 / chunks)) + 8 * tokens
    return np.asarray(np.where(c.fused_ce, fused, np.ceil(tokens * c.vocab_size * per_entry)), dtype=np.int64)



# TRL's chunked LM head (``fused_lm_head``): TRL 1.16 ``SFTTrainer.__init__`` calls
# ``add_fused_lm_head`` (trl/trainer/sft_trainer.py; trl/trainer/utils.py), whose forward runs the
# backbone and feeds the last hidden state, never the logits, to ``ChunkedLogProbFunction``
# (trl/kernels/chunked_logprob.py): the projection runs on [TOKEN_CHUNK_SIZE, chunk_size] tiles of
# one reused buffer and only per-token statistics leave the kernel. Not in TRL 1.10.0.dev0
# (huggingface/trl f2cd57710, 2026-07-24, has no add_fused_lm_head); older SFTTrainers use the
# model's own loss (``logits_forward_bytes``).
FUSED_HEAD_TOKEN_TILE = 4096    # chunked_logprob.py TOKEN_CHUNK_SIZE
FUSED_HEAD_VOCAB_TILE = 32768   # trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE, the tile's vocabulary width
# per token at the end of the kernel's forward: seven fp32 running statistics (running_max, sum_exp,
# x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit) and two more vectors while
# log_z = running_max + log(sum_exp) and the log-probabilities are formed (measured:
# tests/test_fused_lm_head.py, 36 B/token)
FUSED_HEAD_KERNEL_ROW_BYTES = 9 * 4
# the wrapper's per-token copies: labels[mask] (int64) and the bool mask itself
FUSED_HEAD_ROW_BYTES = FUSED_HEAD_KERNEL_ROW_BYTES + 8 + 1


def fused_lm_head_tile_bytes(c):
    """The projection buffer ``mm_buf`` (forward and backward each allocate one): min(N, 4096) ×
    min(V, 32768) in the compute dtype (the autocast dtype, else the hidden state's)."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    return np.minimum(tokens, FUSED_HEAD_TOKEN_TILE) * np.minimum(c.vocab_size, FUSED_HEAD_VOCAB_TILE) * a


def _fp32_head_weight(c, a):
    """The LM head's weight is fp32 where the model is: fp32 training, and mixed precision without a
    wrapper that casts it (one GPU, torch DDP); FSDP's unsharded parameter and DeepSpeed's module are 16-bit."""
    unwrapped = eng.wrapper_is(eng.W_NONE, c.engine, c.strategy) | eng.wrapper_is(eng.W_DDP, c.engine, c.strategy)
    return (a >= 4) | (unwrapped & (c.precision != st.BF16_PURE))


def fused_lm_head_forward_bytes(c):
    """Logits and loss at the forward peak with TRL's chunked LM head: no logits. The kernel's
    forward holds its tile buffer, the per-token statistics (``FUSED_HEAD_ROW_BYTES``) and
    ``hidden_states[mask]``, a copy of the last hidden state that it saves for backward (a·h per
    token) while the wrapper's ``backbone_outputs`` still holds the original (a·h more). A full
    fine-tune's head already counts one a·h (``head_activation_bytes``: what the lm_head saves),
    so the copy is added for LoRA/QLoRA only, as ``_held_hidden_bytes``. ASSUMPTION: every label
    is valid (N = b·s; TRL scores only labels != -100)."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    hidden = tokens * a * c.hidden_size + _held_hidden_bytes(c, a)
    return np.asarray(fused_lm_head_tile_bytes(c) + tokens * FUSED_HEAD_ROW_BYTES + hidden + _logits_labels_bytes(c),
                      dtype=np.int64)


def fused_lm_head_backward_bytes(c):
    """The chunked LM head's backward (``ChunkedLogProbFunction.backward``), at its end: the saved
    hidden copy (LoRA/QLoRA; a full fine-tune's is in ``head_activation_bytes``), the fp32
    ``grad_hidden`` accumulator and its cast to a 16-bit hidden dtype (4·h + a·h per token; fp32:
    ``.to`` returns the accumulator itself), the tile buffer, the saved log-sum-exp and the fp32
    incoming gradient (8 B/token), and for a trainable head the fp32 ``grad_weight`` accumulator
    (4·V·h) and its cast to a 16-bit weight's dtype."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    full = c.method == st.FULL
    head = c.vocab_size * c.hidden_size
    weight_grad = np.where(full, head * (4 + np.where(_fp32_head_weight(c, a), 0, a)), 0)
    per_token = np.where(full, 0, a * c.hidden_size) + (4 + np.where(a < 4, a, 0)) * c.hidden_size + 8
    return np.asarray(tokens * per_token + fused_lm_head_tile_bytes(c) + weight_grad, dtype=np.int64)


def fused_lm_head_largest_transient_bytes(c):
    """The chunked LM head's largest short-lived block (``allocator.largest_transient_bytes``): the
    tile buffer, the fp32 ``grad_hidden``, or a trainable head's fp32 ``grad_weight``."""
    tokens = c.micro_batch * c.seq_len
    weight_grad = np.where(c.method == st.FULL, 4 * c.vocab_size * c.hidden_size, 0)
    return np.maximum(np.maximum(fused_lm_head_tile_bytes(c), 4 * tokens * c.hidden_size), weight_grad)

# Activation offloading (torchtune ``training/_activation_offloading.py`` ``OffloadActivations``,
# ported to TRL as ``trl.models.activation_offloading``): every saved tensor of at least 1 KiB
# is copied to pinned host memory on a side stream during forward; the GPU copy is released once
# the copy is done (a forward stash of a few tensors), and in backward the next layer's tensors
# are brought back while the current one computes. So about two layers' saved tensors are on the
# GPU at any time. ASSUMPTION: two layers (the one computing and the one in flight), and the
# final norm's output (the lm_head's input, which OffloadActivations keeps) stays on the GPU.
OFFLOAD_LAYERS_ON_DEVICE = 2


def layers_on_device(c, k):
    """How many of the ``k`` blocks' saved tensors are on the GPU (k without offloading)."""
    return np.where(c.activation_offload, np.minimum(k, OFFLOAD_LAYERS_ON_DEVICE), k)


def offloaded_activation_bytes(c):
    """Saved activation bytes a rank keeps in host (pinned) memory with activation offloading:
    every block's but the ones on the GPU (``layers_on_device``)."""
    a = compute_dtype_bytes(c.precision)
    tokens = c.micro_batch * c.seq_len
    full = layer_bytes_per_token(c, a)
    n_ckpt = checkpointed_layers(c)
    per_token = (n_ckpt * kept_layer_bytes_per_token(c, a) + (c.num_layers - n_ckpt) * full
                 - first_block_untracked_bytes_per_token(c, a))  # as block_activation_bytes counts them
    L = np.maximum(c.num_layers, 1)
    host = tokens * per_token * (L - layers_on_device(c, L)) / L
    return np.asarray(np.where(c.activation_offload, np.floor(host), 0), dtype=np.int64)
