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
  root unsharded after forward (5 all-gathers for 3 units). Its gradient reduction upcasts the
  flat gradient to the reduce dtype and reduce-scatters it into a separate output shard
  (``fsdp1_unit_buffers``).
* DDP under autocast: the 16-bit weight copies that matmuls saved for backward (all of them).
* DeepSpeed ZeRO-3: one gathered module's 16-bit params and grads, 4·L (its estimator's term);
  ZeRO-0/1/2: the 16-bit reduce bucket (the engine's declared ``gradient_bucket``: ``reduce_bucket_size``
  5e8 elements, DeepSpeed config docs). Which of these an engine has is its declaration's
  (``shardplan/inputs/engines.py``).

The reduce dtype is the ``reduce_dtype`` knob (default fp32 under mixed precision, torchtitan's
choice; fms-fsdp and many FSDP1 recipes reduce in bf16). ASSUMPTION: the largest block is the block unit.
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.activations import compute_dtype_bytes
from shardplan.formulas.model_states import (
    fsdp1_unit_elements,
    master_dtype_bytes,
    padded_unit_elements,
    qlora_block_bytes_per_param,
    trainable_fraction,
    trainable_params,
)
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st
from shardplan.inputs.engines import per_engine, per_strategy


def bucket_bytes(engine, element_bytes, which="grad_bucket"):
    """Bytes of one collective bucket as the engine declares it (``collectives.gradient_bucket`` /
    ``param_gather_bucket``): torch DDP's ``bucket_cap_mb`` 25 MiB, DeepSpeed's
    ``reduce_bucket_size`` / ``allgather_bucket_size`` 5e8 elements of the collective's dtype."""
    size = per_engine(which, engine)
    return np.where(per_engine(f"{which}_in_elements", engine), size * np.asarray(element_bytes), size)


def reduce_dtype_bytes(precision, reduce_dtype):
    """Bytes per element of the gradient reduction (reduce-scatter input and output, all-reduce):
    the ``reduce_dtype`` code (``st.REDUCE_DTYPES``; "param" = the compute dtype, FSDP's
    reduce_dtype=None), resolved from the engine's declared default when unstated
    (``st.resolve_reduce_dtype``). The sharded gradient it is cast back to stays in the
    parameter's own dtype (torch ``_fsdp_collectives.foreach_reduce``:
    ``_to_dtype_if_needed(reduce_output, orig_dtype)``)."""
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


# fsdp_units' byte terms (besides its masks, ``keep_unsharded`` and ``fsdp``, and ``fsdp1_buffers``)
FSDP_UNIT_TERMS = ("root_unsharded", "block_unsharded", "all_gather_block", "all_gather_root", "reduce_scatter_block",
                   "reduce_scatter_root", "unsharded_grads_root", "unsharded_grads_block", "root_grads",
                   "first_block_grad", "mp_shard_block")


def fsdp_units(c, n_p):
    """Sizes FSDP's transient terms are made of (bytes; 0 for other engines), see module docstring;
    ``fsdp1_buffers``: ``fsdp1_unit_buffers`` (read by FSDP1 rows only)."""
    fsdp = eng.wrapper_is(eng.W_FSDP, c.engine, c.strategy)
    a = compute_dtype_bytes(c.precision)
    r = reduce_dtype_bytes(c.precision, c.reduce_dtype)
    w = unsharded_block_bytes_per_param(c)
    trainable = trainable_fraction(c)
    full = c.method == st.FULL
    fsdp2 = fsdp & eng.layout_is(eng.PER_TENSOR, c.engine)
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
    copies = fsdp & np.logical_not(eng.layout_is(eng.FLAT_UNIT, c.engine) & (n <= 1) & np.logical_not(mixed | np.logical_not(full)))
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
    # FSDP1 reduces the flat gradient upcast to the reduce dtype, padded to n·ceil(P/n), into
    # its own output shard: input + output, and an unsharded gradient of P·max(a, r)
    # (``fsdp1_unit_buffers``; measured exact, calibrate compare)
    fsdp1 = fsdp & eng.layout_is(eng.FLAT_UNIT, c.engine)
    one = fsdp1_unit_buffers(c, n)
    for unit in ("root", "block"):
        rs = n * one[f"rs_output_{unit}"] + one[f"rs_output_{unit}"]
        out[f"reduce_scatter_{unit}"] = np.where(fsdp1, np.where(sharded & (full | (unit == "block")), rs, 0),
                                                 out[f"reduce_scatter_{unit}"])
        grad = np.maximum(one[f"flat_grad_{unit}"], one[f"upcast_grad_{unit}"])
        out[f"unsharded_grads_{unit}"] = np.where(fsdp1, np.where(full | (unit == "block"), grad, 0),
                                                  out[f"unsharded_grads_{unit}"])
    # FSDP1's all-gather input under MixedPrecision (``_mp_shard``), alive while a unit is gathered
    out["mp_shard_block"] = np.where(fsdp1 & sharded, one["mp_shard_block"], 0)
    out = {k: np.asarray(np.ceil(v), dtype=np.int64) for k, v in out.items()}
    out["keep_unsharded"] = keep
    out["fsdp"] = fsdp
    out["fsdp1_buffers"] = one  # FSDP1's gradient moments read them too (memory._block_backward_moments)
    return out


def fsdp1_unit_buffers(c, n_p):
    """FSDP1's gradient buffers of one unit in bytes, for the root (``*_root``) and the largest
    block (``*_block``; P = ``unit_params``). FSDP1 keeps one flat parameter per unit, padded as a
    whole to a multiple of the shard count n (torch ``distributed/fsdp/_flat_param.py``); a is the
    compute dtype's bytes, r the reduce dtype's (torch ``distributed/fsdp/_runtime_utils.py``):

    * ``mp_shard``: ``_mp_shard``, the compute-dtype copy of the rank's ceil(P/n) elements that is
      the all-gather input under ``MixedPrecision`` (NO_SHARD: of the whole unit); 0 otherwise;
    * ``flat_grad``: the flat parameter's gradient as autograd produces it, P·a. At the end of
      the unit's backward autograd concatenates the gradients of the parameters' views into it
      (``aten.cat``), so the views' gradients, P·a more, are alive at that moment too;
    * ``upcast_grad``: in the post-backward hook (``_post_backward_hook``) the gradient upcast to
      the reduce dtype (``flat_param.grad.to(handle._reduce_dtype)``), P·r when r differs from a,
      while autograd's stays referenced (``autograd_computed_grad``);
    * ``rs_input``: the reduce-scatter input when P is not a multiple of n: ``F.pad`` of the
      gradient to n·ceil(P/n) elements in r (``_get_reduce_scatter_tensors``; otherwise the
      gradient itself is the input);
    * ``rs_output``: the reduce-scatter output shard, ceil(P/n)·r (``torch.empty_like(chunks[0])``),
      which becomes ``_saved_grad_shard``.

    NO_SHARD (n = 1) all-reduces the gradient in place (``_reduce_grad_no_shard``): no
    reduce-scatter buffers. Measured with ``StorageTracker`` (tiny Llama, W = 3 and 4, fp32 and
    bf16 with fp32 reduction): both moments at the bytes above,
    data/calibration/fsdp1_grad_moments_cpu.jsonl. ASSUMPTION: LoRA/QLoRA gradients are the
    trainable fraction of the unit's (unmeasured).
    """
    a = compute_dtype_bytes(c.precision)
    r = reduce_dtype_bytes(c.precision, c.reduce_dtype)
    n = np.maximum(np.asarray(n_p), 1)
    sharded = n > 1
    t = trainable_fraction(c)
    mixed = (c.precision == st.BF16_MIXED) | (c.precision == st.FP16_MIXED)
    out = {}
    for unit, params in (("root", c.root_params), ("block", c.unit_params)):
        shard = -(-params // n)
        out[f"mp_shard_{unit}"] = np.where(mixed, shard * a, 0)
        out[f"flat_grad_{unit}"] = params * t * a
        out[f"upcast_grad_{unit}"] = np.where(r != a, params * t * r, 0)
        out[f"rs_input_{unit}"] = np.where(sharded & (n * shard != params), n * shard * t * r, 0)
        out[f"rs_output_{unit}"] = np.where(sharded, shard * t * r, 0)
    return {k: np.asarray(np.ceil(v), dtype=np.int64) for k, v in out.items()}


def engine_buffers(c):
    """Per-GPU transient bytes of DDP and DeepSpeed (FSDP's are moment-dependent: ``fsdp_units``)."""
    trainable = trainable_fraction(c)
    # no wrapper on one GPU: autocast's weight copies exist exactly as under torch DDP
    unwrapped = eng.wrapper_is(eng.W_DDP, c.engine, c.strategy) | eng.wrapper_is(eng.W_NONE, c.engine, c.strategy)
    autocast = (c.precision == st.BF16_MIXED) | (c.precision == st.FP16_MIXED)
    # LoRA/QLoRA: autocast's 16-bit copies of PEFT's fp32 adapters (its weight cache keeps a cast of
    # every leaf weight that requires grad until the forward ends; the matmuls save them)
    adapters = unwrapped & autocast & (c.method == st.LORA) & (c.stack == st.HF) & np.asarray(c.autocast, dtype=bool)
    autocast_copies = np.where(unwrapped & autocast & (c.method == st.FULL), c.total_params * 2,
                               np.where(adapters, c.lora_params * 2, 0))
    gathered = np.where(per_strategy("gathers_module_params", c.engine, c.strategy), 4 * c.largest_module_params, 0)
    # DeepSpeed's "ddp" and no_shard are both stage 0: the same engine, the same 16-bit reduce bucket
    bucket_elements = bucket_bytes(c.engine, 1)
    ds_bucket = np.where(per_strategy("reduce_bucket_buffer", c.engine, c.strategy),
                         2 * np.minimum(bucket_elements, c.total_params * trainable), 0)
    # the largest block Linear dequantized to 16-bit; Lightning's plugin quantizes from an fp16
    # copy, so bitsandbytes dequantizes to fp16 and casts to the compute dtype (``quant_head``: 2 + 2)
    qlora_dequant = np.where(c.method == st.QLORA,
                             np.where(np.asarray(c.quant_head, dtype=bool), 4, 2) * c.hidden_size * c.mlp_width, 0)

    terms = {
        "autocast_weight_copies": autocast_copies,
        "gathered_params": gathered,
        "comm_buckets": ds_bucket,
        "qlora_dequant": qlora_dequant,
    }
    return {k: np.asarray(np.ceil(v), dtype=np.int64) for k, v in terms.items()}


def optimizer_step_temporaries(c, optimizer_shard_degree):
    """The optimizer step's temporaries, in the master dtype (``optimizer_impl``).

    * fused AdamW (torch ``_fused_adamw_``, one kernel per tensor group): none, every
      intermediate stays in registers;
    * foreach AdamW (torch's default on CUDA): the sqrt(v) list, one copy of the trainable shard
      (torch ``optim/adam.py`` ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = _foreach_sqrt``); Lion's update;
    * per-tensor AdamW (``for_loop``: torch's default off CUDA,
      ``optim/optimizer.py`` ``_default_to_fused_or_foreach``): ``exp_avg_sq.sqrt() / bias_correction2_sqrt``
      holds two copies of the largest tensor the optimizer sees, while the previous tensor's
      ``denom`` stays alive until the name is rebound (``_single_tensor_adam``'s loop): 2 × the
      largest + its predecessor. FSDP2 per-tensor shards (measured: CPU runs of the real HF stack,
      2 × the 2048 × 96 fp32 embedding = 1,572,864 B, the first parameter, hf_stack_cpu.jsonl;
      ASSUMPTION: the largest tensor's predecessor is small, the embedding / lm_head case); FSDP1
      one flat shard per unit in order root, block 0, block 1, …: max(2·root, 2·block + root,
      3·block with two blocks or more) (measured: tiny NO_SHARD runs, 3 × 3,934,208 B at the last
      block's ``div``, fsdp1_grad_moments_cpu.jsonl; −6.9 % on the step before).
    None for SGD. ASSUMPTION: the largest LoRA tensor is rank × the widest adapted dimension.
    Optimizer in backward (``optimizer_in_backward``): one optimizer per parameter steps inside
    that parameter's post-accumulate-grad hook (torchtune ``training.register_optim_in_bwd_hooks``),
    so only one parameter's temporaries exist at a time (``largest_module_params``' share).
    """
    trainable = trainable_params(c)
    master = master_dtype_bytes(c.precision)
    has_temp = (c.optimizer == st.ADAMW) | (c.optimizer == st.LION)
    on_gpu = c.offload == st.OFFLOAD_NONE
    n = np.maximum(optimizer_shard_degree, 1)
    foreach = np.ceil(trainable * master / optimizer_shard_degree)
    rank = c.lora_rank_out // np.maximum(c.lora_adapted_linears, 1)
    largest = np.where(c.method == st.FULL, c.largest_module_params, rank * np.maximum(c.hidden_size, c.mlp_width))
    root, block = np.ceil(c.root_params / n), np.ceil(c.unit_params / n)
    flat = np.maximum(2 * root, 2 * block + np.where(c.num_layers >= 2, np.maximum(root, block), root))
    single = master * np.where(eng.layout_is(eng.FLAT_UNIT, c.engine) & (c.method == st.FULL), flat, 2 * np.ceil(largest / n))
    temps = np.select([c.optimizer_impl == st.OPT_FOREACH, c.optimizer_impl == st.OPT_FOR_LOOP], [foreach, single], 0)
    one = np.ceil(foreach * np.minimum(c.largest_module_params / np.maximum(c.total_params, 1), 1.0))
    return np.asarray(np.where(has_temp & on_gpu, np.where(c.optimizer_in_backward, np.minimum(one, temps), temps), 0), dtype=np.int64)
