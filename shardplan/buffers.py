"""Transient bytes of the sharding engine itself: unsharded parameters in flight, unsharded
gradients, all-gather and reduce-scatter buffers, DDP autocast copies, DeepSpeed buckets.

Counted at the start of backward (the usual peak: all activations still held):

* FSDP2 (torch ``_fully_shard``; DESIGN.md §4): the unit being computed and the one prefetched
  are unsharded in ``param_dtype`` (2 units); the prefetch's all-gather output exists while it is
  copied out into the unsharded parameters (1 unit); the current unit's unsharded gradients
  (param dtype) and the reduce-scatter input in ``reduce_dtype``. The root unit (embeddings,
  final norm, lm_head) is kept unsharded from forward to backward (``reshard_after_forward`` is
  False for the root), and its lm_head gradient is already computed. With
  ``reshard_after_forward=False`` (SHARD_GRAD_OP) every unit stays unsharded until its backward.
* FSDP1 (torch ``docs/source/notes/fsdp.rst``, "FSDP buffers sizes"): backward holds about 2
  all-gather-sized and 2 reduce-scatter-sized buffers besides the current unit's gradient.
* DDP under autocast: the 16-bit weight copies that matmuls saved for backward (all of them).
* DeepSpeed ZeRO-3: one gathered module's 16-bit params and grads, 4·L (its estimator's term);
  ZeRO-1/2: the 16-bit reduce bucket (``reduce_bucket_size`` 5e8 elements, DeepSpeed config docs).

ASSUMPTION: the reduce dtype is fp32 under mixed precision (torchtitan's and FSDP1 recipes'
choice); the largest unit is a decoder block.
"""

from __future__ import annotations

import numpy as np

from shardplan import strategy as st
from shardplan.activations import compute_dtype_bytes
from shardplan.model_states import NF4_BYTES_PER_PARAM

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000


def reduce_dtype_bytes(precision):
    return np.where(np.asarray(precision) == st.BF16_PURE, 2, 4)


def unsharded_block_bytes_per_param(c):
    """Bytes of one block parameter once gathered: the compute dtype, or the frozen base's storage
    (16-bit for LoRA; NF4 Linears with 16-bit norms for QLoRA)."""
    a = compute_dtype_bytes(c.precision)
    blocks = np.maximum(c.total_params - c.root_params, 1)
    qlora = (c.quantizable_params * NF4_BYTES_PER_PARAM + 2 * (blocks - c.quantizable_params)) / blocks
    return np.select([c.method == st.LORA, c.method == st.QLORA], [2.0, qlora], a)


def trainable_fraction(c):
    return np.where(c.method == st.FULL, 1.0, c.lora_params / c.total_params)


def engine_buffers(c):
    """Per-GPU transient engine bytes at the start of backward, by term."""
    a = compute_dtype_bytes(c.precision)
    r = reduce_dtype_bytes(c.precision)
    w = unsharded_block_bytes_per_param(c)
    trainable = trainable_fraction(c)
    unit = c.unit_params
    ds = c.engine == st.DEEPSPEED
    ddp = c.strategy == st.DDP
    fsdp = ~ds & ~ddp
    keep_unsharded = (c.strategy == st.SHARD_GRAD_OP) | (c.strategy == st.HYBRID_SHARD_ZERO2)
    blocks = c.total_params - c.root_params

    in_flight_units = np.where(keep_unsharded, blocks / np.maximum(unit, 1) + 1, 2)
    unsharded_params = np.where(fsdp, in_flight_units * unit * w, 0)
    fsdp1 = c.engine == st.FSDP1
    all_gather = np.where(fsdp & ~keep_unsharded, np.where(fsdp1, unit * a, unit * w), 0)
    unsharded_grads = np.where(fsdp, unit * trainable * a, 0)
    reduce_scatter = np.where(fsdp, np.where(fsdp1, 2, 1) * unit * trainable * r, 0)
    root_unsharded = np.where(fsdp, c.root_params * np.where(c.method == st.FULL, a, 2), 0)
    root_grads = np.where(fsdp & (c.method == st.FULL), c.vocab_size * c.hidden_size * a, 0)  # frozen under PEFT

    autocast = (c.precision == st.BF16_MIXED) | (c.precision == st.FP16_MIXED)
    autocast_copies = np.where(ddp & ~ds & autocast & (c.method == st.FULL),
                               c.total_params * 2, 0)
    ds_stage3 = ds & ((c.strategy == st.FULL_SHARD) | (c.strategy == st.HYBRID_SHARD))
    gathered = np.where(ds_stage3, 4 * c.largest_module_params, 0)
    ds_bucket = np.where(ds & ~ds_stage3 & ~ddp, 2 * np.minimum(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, c.total_params * trainable), 0)
    qlora_dequant = np.where(c.method == st.QLORA, 2 * c.hidden_size * c.mlp_width, 0)

    terms = {
        "unsharded_params": unsharded_params,
        "all_gather_buffers": all_gather,
        "unsharded_grads": unsharded_grads,
        "reduce_scatter_buffers": reduce_scatter,
        "root_unsharded": root_unsharded,
        "root_grads": root_grads,
        "autocast_weight_copies": autocast_copies,
        "gathered_params": gathered,
        "comm_buckets": ds_bucket,
        "qlora_dequant": qlora_dequant,
    }
    return {k: np.asarray(np.ceil(v), dtype=np.int64) for k, v in terms.items()}


def optimizer_step_temporaries(c, optimizer_shard_degree):
    """foreach AdamW's sqrt(v) list (one fp32 copy of the trainable shard); Lion's update; none for SGD.

    Source: torch ``optim/adam.py`` ``_multi_tensor_adam`` (``exp_avg_sq_sqrt = _foreach_sqrt``).
    """
    trainable = np.where(c.method == st.FULL, c.total_params, c.lora_params)
    master = np.where(c.precision == st.BF16_PURE, 2, 4)
    has_temp = (c.optimizer == st.ADAMW) | (c.optimizer == st.LION)
    on_gpu = c.offload == st.OFFLOAD_NONE
    return np.where(has_temp & on_gpu, np.ceil(trainable * master / optimizer_shard_degree), 0).astype(np.int64)
