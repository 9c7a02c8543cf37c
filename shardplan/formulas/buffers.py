"""Transient bytes of the sharding engine itself: unsharded parameters in flight, unsharded
gradients, all-gather and reduce-scatter buffers, DDP autocast copies, DeepSpeed buckets.

FSDP (torch 2.13; measured with FSDPMemTracker, data/calibration/, docs/calibration.md):

* FSDP2 all-gathers each unit into one padded buffer (param dtype; every tensor's dim 0 padded to
  a multiple of the shard count) and copies out into the unsharded parameters. The buffer of the
  most recent all-gather is kept until the next unit's all-gather is waited on
  (``comm_ctx.all_gather_state``), so one block-sized all-gather buffer is alive at the forward
  and backward peaks, and two at once momentarily: the category's maximum is the largest pair of
  consecutive units, max(root + block, 2·block).
* With ``reshard_after_forward=True`` set on every unit (torchtitan, accelerate) the root
  reshards after forward too: every unit is all-gathered twice per step. The root is gathered
  again at the start of backward and stays unsharded (with its lm_head/final-norm gradients)
  until its post-backward at the very end. ``reshard_after_forward=False`` (SHARD_GRAD_OP) keeps
  every unit unsharded from its forward to its backward.
* Reduce-scatter input: one unit's gradients in ``reduce_dtype``, kept until the next unit's
  reduce-scatter (``reduce_scatter_state``): a block's while the next block computes; the
  category's maximum is the largest unit (the root when the vocabulary is large).
* Unsharded gradients are in the param dtype; their maximum is the largest unit.
* FSDP1 all-gathers straight into the unsharded flat parameter (no separate buffer) and keeps the
  root unsharded after forward (5 all-gathers for 3 units).
* DDP under autocast: the 16-bit weight copies that matmuls saved for backward (all of them).
* DeepSpeed ZeRO-3: one gathered module's 16-bit params and grads, 4·L (its estimator's term);
  ZeRO-1/2: the 16-bit reduce bucket (``reduce_bucket_size`` 5e8 elements, DeepSpeed config docs).

The reduce dtype is the ``reduce_dtype`` knob (default fp32 under mixed precision, torchtitan's
choice; fms-fsdp and many FSDP1 recipes reduce in bf16). ASSUMPTION: the largest block is the block unit.
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs import strategy as st
from shardplan.formulas.activations import compute_dtype_bytes
from shardplan.formulas.model_states import (fsdp1_unit_elements, padded_unit_elements, qlora_block_bytes_per_param, trainable_fraction,
                                             trainable_params)

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000


def reduce_dtype_bytes(precision, reduce_dtype=None):
    """Bytes per element of the gradient reduction (reduce-scatter input and output, all-reduce):
    the ``reduce_dtype`` code (``st.REDUCE_DTYPES``; "param" = the compute dtype, FSDP's
    reduce_dtype=None); None = ``st.default_reduce_dtype`` for an FSDP engine (fp32 under mixed
    precision). The sharded gradient it is cast back to stays in the parameter's own dtype (torch
    ``_fsdp_collectives.foreach_reduce``: ``_to_dtype_if_needed(reduce_output, orig_dtype)``)."""
    if reduce_dtype is None:
        reduce_dtype = st.default_reduce_dtype(precision, st.FSDP2)
    r = np.asarray(reduce_dtype)
    return np.select([r == st.REDUCE_FP32, r == st.REDUCE_BF16, r == st.REDUCE_FP16],
                     [4, 2, 2], compute_dtype_bytes(precision))


def unsharded_block_bytes_per_param(c):
    """Bytes of one block parameter once gathered: the compute dtype, which is also the frozen base's
    (LoRA: 16-bit, fp32 under fp32 precision, as ``model_states`` stores it sharded: FSDP gathers a
    parameter in its own dtype when no mixed-precision policy casts it), or for QLoRA the 4-bit
    Linears with norms in that dtype (``qlora_block_bytes_per_param``)."""
    a = compute_dtype_bytes(c.precision)
    return np.where(c.method == st.QLORA, qlora_block_bytes_per_param(c, a), a)


def fsdp_units(c, n_p):
    """Sizes FSDP's transient terms are made of (bytes; 0 for other engines), see module docstring."""
    a = compute_dtype_bytes(c.precision)
    r = reduce_dtype_bytes(c.precision, c.reduce_dtype)
    w = unsharded_block_bytes_per_param(c)
    trainable = trainable_fraction(c)
    full = c.method == st.FULL
    fsdp = (c.engine != st.DEEPSPEED) & (c.strategy != st.DDP) & (c.strategy != st.SINGLE)
    fsdp2 = fsdp & (c.engine == st.FSDP2)
    n = np.maximum(n_p, 1)
    root_elems = np.where(fsdp2, padded_unit_elements(c, n, "root"), fsdp1_unit_elements(c, n, "root"))
    block_elems = np.where(fsdp2, padded_unit_elements(c, n, "block"), fsdp1_unit_elements(c, n, "block"))
    sharded = fsdp & (n > 1)
    keep = fsdp & ((c.strategy == st.SHARD_GRAD_OP) | (c.strategy == st.HYBRID_SHARD_ZERO2))
    root_w = a  # trainable or frozen, the root is held in the compute dtype (unsharded_block_bytes_per_param)
    # FSDP1 NO_SHARD computes on the flat parameter itself: no unsharded copy, except the 16-bit
    # ``_mp_shard`` under MixedPrecision, which lives like a sharded unit's ``_full_param_padded``
    # (measured: tiny NO_SHARD fp32 W=4, the backward peak holds no unsharded bytes; bf16-mixed:
    # root + current + prefetched block of 16-bit copies, 139,648 B at the start of backward).
    mixed = (c.precision == st.BF16_MIXED) | (c.precision == st.FP16_MIXED)
    copies = fsdp & ~((c.engine == st.FSDP1) & (n <= 1) & ~(mixed | ~full))
    out = dict(
        root_unsharded=np.where(copies, root_elems * root_w, 0),
        block_unsharded=np.where(copies, block_elems * w, 0),
        all_gather_block=np.where(fsdp2 & sharded, block_elems * w, 0),
        all_gather_root=np.where(fsdp2 & sharded, root_elems * root_w, 0),
        reduce_scatter_block=np.where(sharded, block_elems * trainable * r, 0),
        reduce_scatter_root=np.where(sharded & full, root_elems * r, 0),
        # gradients take the parameters' own (unpadded) shapes (measured: tiny W=64 runs)
        unsharded_grads_root=np.where(fsdp & full, c.root_params * a, 0),
        unsharded_grads_block=np.where(fsdp, c.unit_params * trainable * a, 0),
        # root gradients held through backward: lm_head (or the tied embedding) and final norm
        root_grads=np.where(fsdp & full, (c.vocab_size * c.hidden_size + c.hidden_size) * a, 0),
        # the first weight gradient of a block's backward: down_proj (h x i)
        first_block_grad=np.where(fsdp, c.hidden_size * c.mlp_width * a * trainable, 0),
    )
    out = {k: np.asarray(np.ceil(v), dtype=np.int64) for k, v in out.items()}
    out["keep_unsharded"] = keep
    out["fsdp"] = fsdp
    return out


def engine_buffers(c):
    """Per-GPU transient bytes of DDP and DeepSpeed (FSDP's are moment-dependent: ``fsdp_units``)."""
    trainable = trainable_fraction(c)
    ds = c.engine == st.DEEPSPEED
    ddp = c.strategy == st.DDP
    # no wrapper on one GPU: autocast's weight copies exist exactly as under DDP
    unwrapped = ddp | (c.strategy == st.SINGLE)
    autocast = (c.precision == st.BF16_MIXED) | (c.precision == st.FP16_MIXED)
    autocast_copies = np.where(unwrapped & ~ds & autocast & (c.method == st.FULL),
                               c.total_params * 2, 0)
    ds_stage3 = ds & ((c.strategy == st.FULL_SHARD) | (c.strategy == st.HYBRID_SHARD))
    gathered = np.where(ds_stage3, 4 * c.largest_module_params, 0)
    # DeepSpeed's "ddp" and no_shard are both stage 0: the same engine, the same reduce bucket
    ds_bucket = np.where(ds & ~ds_stage3, 2 * np.minimum(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, c.total_params * trainable), 0)
    qlora_dequant = np.where(c.method == st.QLORA, 2 * c.hidden_size * c.mlp_width, 0)

    terms = {
        "autocast_weight_copies": autocast_copies,
        "gathered_params": gathered,
        "comm_buckets": ds_bucket,
        "qlora_dequant": qlora_dequant,
    }
    return {k: np.asarray(np.ceil(v), dtype=np.int64) for k, v in terms.items()}


def optimizer_step_temporaries(c, optimizer_shard_degree):
    """The optimizer step's temporaries, in the master dtype.

    * foreach AdamW (torch's default on CUDA): the sqrt(v) list, one copy of the trainable shard
      (torch ``optim/adam.py`` ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = _foreach_sqrt``); Lion's update;
    * per-tensor AdamW (``foreach_optimizer=False``: torch's default off CUDA,
      ``optim/optimizer.py`` ``_default_to_fused_or_foreach``): ``exp_avg_sq.sqrt() / bias_correction2_sqrt``
      holds two copies of the largest tensor the optimizer sees (measured: CPU runs of the real HF
      stack, 2 × the 2048 × 96 fp32 embedding = 1,572,864 B, hf_stack_cpu.jsonl). FSDP1 (flat
      parameters) sees one flat shard per unit, FSDP2 per-tensor shards.
    None for SGD. ASSUMPTION: the largest LoRA tensor is rank × the widest adapted dimension.
    Optimizer in backward (``optimizer_in_backward``): one optimizer per parameter steps inside
    that parameter's post-accumulate-grad hook (torchtune ``training.register_optim_in_bwd_hooks``),
    so only one parameter's temporaries exist at a time (``largest_module_params``' share).
    """
    trainable = trainable_params(c)
    master = np.where(c.precision == st.BF16_PURE, 2, 4)
    has_temp = (c.optimizer == st.ADAMW) | (c.optimizer == st.LION)
    on_gpu = c.offload == st.OFFLOAD_NONE
    n = np.maximum(optimizer_shard_degree, 1)
    foreach = np.ceil(trainable * master / optimizer_shard_degree)
    rank = c.lora_rank_out // np.maximum(c.lora_adapted_linears, 1)
    largest = np.where(c.method == st.FULL,
                       np.where(c.engine == st.FSDP1, np.maximum(c.root_params, c.unit_params), c.largest_module_params),
                       rank * np.maximum(c.hidden_size, c.mlp_width))
    single = 2 * master * np.ceil(largest / n)
    temps = np.where(c.foreach_optimizer, foreach, single)
    one = np.ceil(foreach * np.minimum(c.largest_module_params / np.maximum(c.total_params, 1), 1.0))
    return np.where(has_temp & on_gpu, np.where(c.optimizer_in_backward, np.minimum(one, temps), temps), 0).astype(np.int64)
