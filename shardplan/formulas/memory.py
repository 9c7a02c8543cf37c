"""Per-GPU and per-node memory: every term, the peak, and whether it fits.

The peak is the largest of the moments of a training step (measured with torch's FSDPMemTracker;
docs/calibration.md, data/calibration/predicted_vs_measured.md):

* forward (inside the loss): persistent states + all blocks' saved activations + logits with
  their fp32 upcast and log-softmax + the root's unsharded params + the last all-gather buffer
  (SHARD_GRAD_OP: every unit unsharded);
* inside a block's forward (``_block_forward``, np.maximum with the loss moment): FSDP2's
  all-gather copy-out in block 0's / block L-1's pre-forward (three unit-sized buffers), and block
  L-1's own forward at its largest sub-moment (MLP product under AC, residual add without);
* start of backward (the loss's backward; FSDP1: + the last block, prefetched): the same, with the logits' backward (12·bsV) instead;
* inside a block's backward (block k, at its MLP's product backward): states + the sharded
  gradients of the blocks already reduced + the previous block's reduce-scatter input + root and
  block k unsharded + the next block's prefetched all-gather + root gradients + the saved
  activations of blocks ≤ k (block k recomputed in full under AC) + activation gradients. Linear
  in k apart from the buffers at the ends, so its maximum is at k ∈ {0, 1, L-2, L-1};
* LoRA/QLoRA under checkpointing, block k being recomputed at the start of its backward (PEFT's
  transients, ``activations.lora_recompute_bytes_per_token``; no dequantized 4-bit weight then);
* compiled torchao NF4 (torchtune's QLoRA with ``compile``): each block keeps its dequantized
  weights from its forward (no AC) or its recomputation (AC) to its backward, in ``qlora_dequant``
  (``activations.nf4_compiled_saved_weight_bytes``), instead of bitsandbytes' one Linear;
* FSDP1 at the end of block k's backward (``_fsdp1_gradient_moments``): the flat gradient
  concatenated from its views' gradients, then the post-backward hook's upcast gradient and
  reduce-scatter buffers (``buffers.fsdp1_unit_buffers``);
* unwrapped runs (``single``) take the block moments too, with gradients landing in ``.grad``;
* gradient accumulation without sync: the whole model's unsharded gradients in every forward and
  backward moment (``_with_accumulated_grads``);
* optimizer step — persistent states + full gradients + the optimizer's temporaries.

The breakdown reported is the one of the moment that is the peak, so its terms add up to
``peak_allocated_bytes`` exactly; ``peak_moment`` codes the moment (``PEAK_MOMENTS``). Each term
comes from one function; see docs/formulas.md.
"""

from __future__ import annotations

from functools import partial
from operator import is_not

import numpy as np

from shardplan.formulas.activations import (
    backward_working_bytes_per_token,
    block_activation_bytes,
    block_forward_working_bytes_per_token,
    checkpointed_layers,
    chunked_head_backward_bytes,
    chunked_head_dequant_moment_bytes,
    chunked_head_forward_bytes,
    chunked_logits_backward_bytes,
    chunked_logits_forward_bytes,
    compute_dtype_bytes,
    fsdp1_reentrant_held_bytes_per_token,
    fused_lm_head_backward_bytes,
    fused_lm_head_forward_bytes,
    head_activation_bytes,
    kept_layer_bytes_per_token,
    layer_bytes_per_token,
    layers_on_device,
    logits_backward_bytes,
    logits_forward_bytes,
    lora_recompute_bytes_per_token,
    nf4_compiled_held_in_backward_bytes,
    nf4_compiled_saved_weight_bytes,
    offloaded_activation_bytes,
    position_ids_bytes,
    recompute_extra_bytes_per_token,
    rope_bytes,
)
from shardplan.formulas.allocator import reserved_terms
from shardplan.formulas.buffers import engine_buffers, fsdp_units, optimizer_step_temporaries, trainable_fraction
from shardplan.formulas.comm import no_sync_grad_bytes
from shardplan.formulas.load import load_peak_allocated_bytes, model_load_bytes
from shardplan.formulas.model_states import fsdp1_shard_elements, model_states, padded_shard_elements
from shardplan.formulas.nf4_load_cache import nf4_load_cached_bytes
from shardplan.formulas.overheads import HOST_PROCESS_BYTES, non_torch_device_bytes
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st
from shardplan.inputs.allocator_profile import default_allocator

# Order of the breakdown table; also the DataFrame column names.
STATE_TERMS = ("params", "grads", "grad_buckets", "master_params", "optimizer_states")
ACTIVATION_TERMS = ("activations", "logits_and_loss")
BUFFER_TERMS = ("unsharded_params", "all_gather_buffers", "unsharded_grads", "reduce_scatter_buffers",
                "root_unsharded", "root_grads", "autocast_weight_copies", "gathered_params", "comm_buckets",
                "qlora_dequant", "optimizer_step_temporaries")
BREAKDOWN_TERMS = STATE_TERMS + ACTIVATION_TERMS + BUFFER_TERMS
# The terms a moment (one point of a step, ``_forward_moments`` ...) may hold: transients and the
# gradients alive then; the other states are persistent, in every moment alike.
MOMENT_TERMS = ACTIVATION_TERMS + BUFFER_TERMS + ("grads",)
PEAK_TERMS = ("grads",) + ACTIVATION_TERMS + BUFFER_TERMS  # the breakdown at the peak moment
LIVE_AT_PEAK_TERMS = ("grads", "all_gather_buffers")       # what the allocator's pools read of it (always computed)
PEAK_MOMENTS = ("forward", "backward", "optimizer_step")   # codes of ``peak_moment``
FORWARD, BACKWARD, OPTIMIZER_STEP = 0, 1, 2


def deepspeed_estimator_host_bytes(total_params, largest_module_params, gpus_per_node, nodes, strategy, offload,
                                   zero_init=True, buffer_factor=1.5):
    """Host RAM per node as DeepSpeed's estimators compute it (deepspeed ``runtime/zero/stage_1_and_2.py``
    ``estimate_zero2_model_states_mem_needs`` and ``stage3.py`` ``estimate_zero3_...``).

    ZeRO-1/2: 4Ψ·g·f, or Ψ·max(4G, 16)·f with optimizer offload. ZeRO-3 (with ``zero.Init``):
    4L·g·f; optimizer offload 16Ψ/nodes·f; + params offload 18Ψ/nodes·f. Without ``zero.Init``
    every process first materialises the fp32 model: max(4Ψ·g, …).
    """
    p = np.asarray(total_params, dtype=np.float64)
    g = np.asarray(gpus_per_node)
    nodes = np.asarray(nodes)
    world = g * nodes
    stage3 = (np.asarray(strategy) == st.FULL_SHARD) | (np.asarray(strategy) == st.HYBRID_SHARD)
    off = np.asarray(offload)
    z2 = np.where(off != st.OFFLOAD_NONE, p * np.maximum(4 * world, 16) * buffer_factor, p * 4 * g * buffer_factor)
    per_node = 1.0 / nodes
    if zero_init:
        z3 = np.select([off == st.OFFLOAD_ALL, off == st.OFFLOAD_OPTIMIZER],
                       [p * 18 * per_node * buffer_factor, p * 16 * per_node * buffer_factor],
                       np.asarray(largest_module_params) * 4 * g * buffer_factor)
    else:
        z3 = np.select([off == st.OFFLOAD_ALL, off == st.OFFLOAD_OPTIMIZER],
                       [p * np.maximum(4 * g, 18 * per_node) * buffer_factor,
                        p * np.maximum(4 * g, 16 * per_node) * buffer_factor],
                       p * 4 * g * buffer_factor)
    return np.asarray(np.floor(np.where(stage3, z3, z2)), dtype=np.int64)


def host_bytes_per_node(c, host_offloaded):
    """Host RAM a node needs: each rank's process, plus the larger of the ranks' offloaded states
    (and offloaded activations) and the checkpoint copies read before sharding: one (rank 0, Hugging
    Face ``from_pretrained`` with FSDP's ``cpu_ram_efficient_loading``; meta-device init reads
    shards) or one per rank (``load_mode`` full_per_gpu: every process reads the whole model),
    in the load dtype (``load.model_load_bytes``).

    DeepSpeed uses its estimator's figures (``deepspeed_estimator_host_bytes``).
    ASSUMPTION: loading ends before offloaded optimizer states are created.
    """
    copies = np.where(c.load_mode == st.LOAD_FULL_PER_GPU, c.gpus_per_node, 1)
    loading = copies * model_load_bytes(c)
    ours = c.gpus_per_node * HOST_PROCESS_BYTES + np.maximum(loading, c.gpus_per_node * host_offloaded)
    is_ds = eng.wrapper_is(eng.W_DEEPSPEED, c.engine, c.strategy)
    nodes = np.maximum(c.world_size // np.maximum(c.gpus_per_node, 1), 1)
    ds = deepspeed_estimator_host_bytes(c.total_params, c.largest_module_params, c.gpus_per_node, nodes,
                                        c.strategy, c.offload)
    return np.asarray(np.where(is_ds, ds, ours), dtype=np.int64)


def _block_forward(engine_terms, c, k, units, grads_held, ctx, pre):
    """A moment inside block k's forward: ``engine_terms`` (the engine buffers alive then,
    ``_engine_terms``) and FSDP's terms (zeros for other engines).

    ``pre`` — FSDP2's all-gather copy-out in block k's pre-forward: the previous unit's all-gather
    buffer (root for k = 0) is kept until this wait, this unit's buffer is alive, and its unsharded
    parameters are being allocated: three unit-sized buffers at once. Activations: the kept
    tensors of blocks < k and block k's input. Measured: tiny Llama fp32 full AC W=8 FSDP2 forward
    peak 777,812 B at the last ``aten.view`` of block 1's copy-out = states + root unsharded +
    2 × 147,968 all-gather + 147,968 being copied + 41,216 activations (−14.7 % before).
    FSDP1 gathers straight into the flat parameter, from ``_mp_shard`` (``buffers.fsdp1_unit_buffers``)
    under MixedPrecision, which is alive until the gather ends: root + block k unsharded + that
    shard (measured: tiny bf16 W=3/4 full AC, s=4, at block L-1's all-gather; −2.2 % to −3.5 % before).

    otherwise — inside block k's own computation (``block_forward_working_bytes_per_token``): root
    and block k unsharded (SHARD_GRAD_OP: blocks ≤ k), block k's all-gather buffer (FSDP2, kept
    until the next unit's wait), the kept tensors of blocks < k and block k's working set.
    Measured: tiny Llama fp32 full AC W=4 FSDP1 forward peak 773,100 B at block 1's MLP product
    (−12.6 % before); selective W=8 FSDP2 1,008,724 B (−4.8 % before); GPT-2 fp32 W=4 at the last
    block's residual add (−4.4 % before).
    """
    a, tokens, kept_avg = ctx["a"], ctx["tokens"], ctx["kept_avg"]
    fsdp = units["fsdp"]
    keep = units["keep_unsharded"]
    small = ctx["rope"] + position_ids_bytes(c)
    dequant = engine_terms.get("qlora_dequant", 0) + _nf4_saved_weights(c, ctx, k)
    if pre:
        fsdp1 = fsdp & eng.layout_is(eng.FLAT_UNIT, c.engine) & (units["mp_shard_block"] > 0)
        on = (fsdp & eng.layout_is(eng.PER_TENSOR, c.engine) & (units["all_gather_block"] > 0)) | fsdp1
        per_token = layers_on_device(c, k) * kept_avg + a * c.hidden_size
        prior = np.where(k == 0, units["all_gather_root"], units["all_gather_block"])
        acts = np.asarray(np.ceil(tokens * per_token), dtype=np.int64) + small
        return {
            **engine_terms,
            "grads": grads_held,
            "activations": np.where(on, acts, 0),
            "unsharded_params": np.where(on, units["block_unsharded"] * np.where(keep, k + 1, 1), 0),
            "all_gather_buffers": np.where(fsdp1, units["mp_shard_block"], np.where(on, prior + units["all_gather_block"], 0)),
            "root_unsharded": np.where(on, units["root_unsharded"], 0),
            "qlora_dequant": dequant,
        }
    per_token = layers_on_device(c, k) * kept_avg + ctx["forward_working"]
    acts = np.asarray(np.ceil(tokens * per_token), dtype=np.int64) + small
    return {
        **engine_terms,
        "grads": grads_held,
        "activations": np.where(fsdp | (c.strategy == st.SINGLE), acts, 0),
        "unsharded_params": np.where(fsdp, units["block_unsharded"] * np.where(keep, k + 1, 1), 0),
        "all_gather_buffers": np.where(fsdp, units["all_gather_block"], 0),
        "root_unsharded": np.where(fsdp, units["root_unsharded"], 0),
        "qlora_dequant": dequant,
    }


def kv_cache_leftover_bytes(c, a, blocks_done, n_ckpt):
    """Transformers' KV cache under a non-reentrant checkpoint wrapper (``checkpoint_wrapper``,
    or any non-reentrant ``torch.utils.checkpoint`` around a decoder layer) while ``use_cache`` is
    on: a training forward builds a ``DynamicCache`` whenever ``use_cache`` is set, and Transformers
    turns it off only under its own gradient-checkpointing flag (``modeling_llama.py``: "use_cache=True
    is incompatible with gradient checkpointing" applies to ``self.gradient_checkpointing`` only).
    The recomputation of each block appends its K/V to the cache again, and the cached tensors keep
    the recomputed input-norm chain alive until backward ends. Per token per finished block:
    K and V twice (forward + recomputation, 2 x 2 x a x n_kv x d_head = 4·a·kv_width) plus the
    RMSNorm chain (fp32 input copy 4h, fp32 variance 4, fp32 normalized input 4h), and under fp32
    the block input (4h): (8h + 4) + 8·kv_width at 16-bit, 12h + 4 + 16·kv_width at fp32 (issue 21,
    reproduced on CPU). It equals the 12h + 4 measured on the tiny CPU decoders
    (data/calibration/checkpoint_wrapper_cpu.json, h = 128 and 256) because those have
    kv_width = h/2; Llama 3 has kv_width = h/4 (8B) or h/8 (70B). With ``use_cache=False`` (Trainer,
    TRL, fsdp_qlora, shardplan's FSDP export) it is 0. ASSUMPTION: LayerNorm models keep the K/V
    copies but their norm chain is unmeasured (counted as 0)."""
    h = c.hidden_size
    norm_chain = np.where(np.asarray(c.layernorm, dtype=bool), 0, 8 * h + 4 + np.where(a >= 4, 4 * h, 0))
    per_token = 4 * a * c.kv_width + norm_chain
    on = (np.asarray(c.use_cache, dtype=bool) & np.asarray(c.checkpoint_wrapper, dtype=bool)
          & np.logical_not(np.asarray(c.reentrant_checkpointing, dtype=bool)) & (n_ckpt > 0))
    return np.asarray(np.where(on, np.maximum(blocks_done, 0) * c.micro_batch * c.seq_len * per_token, 0), dtype=np.int64)


def _kept_average_bytes_per_token(c, a, n_ckpt=None, full_layer=None):
    """Saved bytes per token of one block, averaged over the blocks: checkpointed blocks keep their
    input only (``kept_layer_bytes_per_token``), the others everything (``layer_bytes_per_token``)."""
    L = np.maximum(c.num_layers, 1)
    n_ckpt = checkpointed_layers(c) if n_ckpt is None else n_ckpt
    full_layer = layer_bytes_per_token(c, a) if full_layer is None else full_layer
    return (n_ckpt * kept_layer_bytes_per_token(c, a) + (L - n_ckpt) * full_layer) / L


def _per_block_grad_bytes(c, states, n_g, grads_held):
    """Sharded gradient bytes of one reduced block (FSDP1 a flat shard per block, FSDP2 the padded
    per-tensor shards); zero while earlier micro-batches' gradients are held (counted whole) or
    with the optimizer in backward (each reduced gradient is stepped and freed at once), and for
    offloaded gradients (none on the device)."""
    L = np.maximum(c.num_layers, 1)
    fsdp1 = eng.layout_is(eng.FLAT_UNIT, c.engine)
    block_shard = np.where(fsdp1, fsdp1_shard_elements(c, n_g, "blocks") // L,
                           padded_shard_elements(c, n_g, "block"))
    per_block = np.where(c.method == st.FULL, block_shard * np.where(c.precision == st.BF16_PURE, 2, 4),
                         states["grads"] // L) * np.where(states["grads"] > 0, 1, 0)
    return np.where((grads_held > 0) | c.optimizer_in_backward, 0, per_block)


def _unwrapped_grads(c, states):
    """One device without a wrapper (``single``): gradients land in ``.grad`` in their own dtype as
    backward produces them — the root's (lm_head + final norm) first, then each block's, block
    k's down projection first (measured: HF stack CPU runs with a small vocabulary, whose peak is
    inside a block's backward: −26 % before these moments existed for unwrapped runs).
    Returns (root gradients, the block's first weight gradient)."""
    single = c.strategy == st.SINGLE
    g_elem = np.where(c.precision == st.BF16_PURE, 2, 4) * np.where(states["grads"] > 0, 1, 0)
    root = np.where(single & (c.method == st.FULL), (c.vocab_size * c.hidden_size + c.hidden_size) * g_elem, 0)
    first = np.where(single, np.ceil(c.hidden_size * c.mlp_width * g_elem * trainable_fraction(c)), 0)
    return root, np.asarray(first, dtype=np.int64)


def _activation_context(c):
    """The activation sizes every moment reads, computed once per evaluation: the compute dtype's
    width, tokens, checkpointed blocks, one block's saved bytes per token (whole and averaged over
    checkpointed and kept blocks), the saved set of all blocks + the head, the logits' forward and
    backward bytes, RoPE's cos/sin, the working set inside a block's forward."""
    a = compute_dtype_bytes(c.precision)
    n_ckpt = checkpointed_layers(c)
    full_layer = layer_bytes_per_token(c, a)
    return dict(
        a=a, tokens=c.micro_batch * c.seq_len, n_ckpt=n_ckpt, full_layer=full_layer,
        kept_avg=_kept_average_bytes_per_token(c, a, n_ckpt, full_layer),
        saved=block_activation_bytes(c, full_layer, n_ckpt) + head_activation_bytes(c),
        logits=_logits_bytes(c), rope=rope_bytes(c),
        forward_working=block_forward_working_bytes_per_token(c, a, full_layer, n_ckpt),
        nf4_block=nf4_compiled_saved_weight_bytes(c), nf4_held=nf4_compiled_held_in_backward_bytes(c),
    )


def _nf4_saved_weights(c, acts, k):
    """Dequantized weights a compiled torchao NF4 model keeps for backward from the k blocks before
    block k (``activations.nf4_compiled_saved_weight_bytes``): the blocks not checkpointed keep
    theirs, the checkpointed ones none until their recomputation. Under activation offloading
    they stay on the GPU (ASSUMPTION: torchtune offloads only with checkpointing on)."""
    L = np.maximum(c.num_layers, 1)
    return np.asarray(acts["nf4_block"] * np.maximum(k, 0) * (L - acts["n_ckpt"]) // L, dtype=np.int64)


def _backward_context(c, states, n_g, grads_held, acts):
    """What every backward moment shares, computed once per evaluation: the activation context
    (``acts``), the reduced block gradient, the unwrapped run's gradients.

    ``reentrant``: HF gradient checkpointing with use_reentrant=True: ``CheckpointFunction.backward``
    re-runs the block and back-propagates through the recomputed output it holds (torch
    ``utils/checkpoint.py``), one more a·h tensor than the non-reentrant unpack hooks, through the
    recomputation and the block's backward (measured: FSDP2 W=4 full and QLoRA pairs, +32,768 B =
    256 tokens x 64 x 2)."""
    a, n_ckpt = acts["a"], acts["n_ckpt"]
    single_root, single_first = _unwrapped_grads(c, states)
    reentrant = np.where(np.asarray(c.reentrant_checkpointing, dtype=bool) & (n_ckpt > 0), a * c.hidden_size, 0)
    return dict(
        acts,
        extra=np.where(n_ckpt > 0, recompute_extra_bytes_per_token(c, a), 0), reentrant=reentrant,
        held_per_block=fsdp1_reentrant_held_bytes_per_token(c, a),  # FSDP1 frozen units, reentrant
        working=backward_working_bytes_per_token(c, a) + reentrant,  # per token, the same in every block
        # the KV cache's leftovers are linear in the blocks whose backward has run
        leftover_per_block=kv_cache_leftover_bytes(c, a, 1, n_ckpt),
        per_block_grad=_per_block_grad_bytes(c, states, n_g, grads_held),
        single_root=single_root, single_first=single_first,
    )


def _backward_activation_bytes(c, k, ctx, recompute):
    """Activations inside block k's backward: the saved tensors of blocks < k, block k's own (all of
    them: recomputed in full under AC) and the activation gradients in flight, plus the
    checkpoint wrapper's leftovers. ``recompute``: a checkpointed LoRA/QLoRA block being recomputed
    at the start of its backward (PEFT's fp32 transients, ``lora_recompute_bytes_per_token``).
    Either way only ``layers_on_device`` of the blocks before k keep their saved tensors on the GPU
    under activation offloading (torchtune ``OffloadActivations``: each checkpoint input went to
    the host in forward and comes back one backward node ahead)."""
    tokens, n_ckpt, kept_avg = ctx["tokens"], ctx["n_ckpt"], ctx["kept_avg"]
    # FSDP1 + reentrant checkpointing: each finished block's input and its gradient, but for the
    # gradient now flowing into block k (the activation gradient in flight, counted in ``working``)
    done = np.maximum(c.num_layers - 1 - k, 0)
    leftover = _leftover_after(c, k, ctx) + np.asarray(
        np.ceil(tokens * np.maximum(2 * done - 1, 0) * ctx["held_per_block"]), dtype=np.int64)
    if recompute:
        kept = layers_on_device(c, k) * kept_avg
        lora = (np.asarray(np.ceil(tokens * (kept + ctx["extra"] + ctx["reentrant"] + ctx["lora_recompute"])), dtype=np.int64)
                + np.asarray(leftover, dtype=np.int64) + ctx["rope"])
        return np.where((c.method != st.FULL) & (n_ckpt > 0), lora, 0)
    per_token = layers_on_device(c, k) * kept_avg + ctx["full_layer"] + ctx["extra"]
    acts = np.asarray(np.ceil(tokens * per_token), dtype=np.int64) + ctx["rope"]
    return acts + tokens * ctx["working"] + leftover


def _leftover_after(c, k, ctx):
    """``kv_cache_leftover_bytes`` inside block k's backward: the L-1-k blocks after it are done."""
    return np.maximum(c.num_layers - 1 - k, 0) * ctx["leftover_per_block"]


def _block_backward(engine_terms, c, k, ctx, units, grads_held, recompute=False):
    """The moment inside block k's backward, at its MLP product: ``engine_terms`` (the engine
    buffers alive then, ``_engine_terms``) and FSDP's and unwrapped runs' terms (zeros elsewhere).
    See the module docstring. ``recompute``: the moment a checkpointed LoRA/QLoRA block is being
    recomputed (no bitsandbytes-dequantized weight is alive then; a compiled torchao block's
    recomputation has saved its dequantized weights but the down projection's)."""
    fsdp = units["fsdp"]
    fsdp1 = eng.layout_is(eng.FLAT_UNIT, c.engine)
    keep = units["keep_unsharded"]
    tracked = fsdp | (c.strategy == st.SINGLE)
    reduced = (c.num_layers - 1 - k) * ctx["per_block_grad"]
    return {
        **engine_terms,
        "grads": grads_held + np.where(tracked, reduced, 0) + ctx["single_first"],
        "activations": np.where(tracked, _backward_activation_bytes(c, k, ctx, recompute), 0),
        "unsharded_params": units["block_unsharded"] * np.where(keep, k + 1, 1),
        # the next block's prefetched all-gather (FSDP1: straight into its unsharded flat parameter)
        "all_gather_buffers": np.where((k >= 1) & np.logical_not(keep), np.where(fsdp1 & (units["all_gather_block"] == 0) & fsdp,
                                                                  units["block_unsharded"], units["all_gather_block"]), 0),
        "unsharded_grads": units["first_block_grad"],
        # FSDP2 keeps the previous block's reduce-scatter input until the next reduce-scatter
        # (``reduce_scatter_state``); FSDP1 frees it inside the post-backward hook (measured: no
        # "Reduce Scatter" bytes inside block 0's backward, tiny bf16 full AC W=4: +12.8 % before)
        "reduce_scatter_buffers": np.where((k < c.num_layers - 1) & np.logical_not(fsdp1), units["reduce_scatter_block"], 0),
        "root_unsharded": units["root_unsharded"],
        "root_grads": units["root_grads"] + ctx["single_root"],
        # a compiled torchao block holds its saved (or recomputed) dequantized weights instead of
        # bitsandbytes' one Linear at a time
        "qlora_dequant": np.where(ctx["nf4_block"] > 0, ctx["nf4_held"], engine_terms.get("qlora_dequant", 0))
        + _nf4_saved_weights(c, ctx, k),
    }


def _fsdp1_gradient_moments(engine_terms, c, k, ctx, units, one, grads_held):
    """FSDP1's two moments at the end of block k's backward (``one``: ``buffers.fsdp1_unit_buffers``;
    ``engine_terms``: the engine buffers alive in every moment, ``_engine_terms``):

    * the flat gradient being concatenated from the views' gradients (2·P·a), block k and the
      prefetched block k-1 unsharded;
    * the post-backward hook: block k resharded first (``_post_backward_reshard``), then autograd's
      gradient, its upcast to the reduce dtype, the padded reduce-scatter input and its output
      shard (NO_SHARD: the upcast, all-reduced in place; the unit's 16-bit copy is freed by the
      same reshard, ``FlatParamHandle.post_reshard``).

    Activations then: the saved tensors of blocks < k and the gradient of block k's input (a·h per
    token). Measured (tiny Llama h=256, s=4, W=3/4, fp32 and bf16 with fp32 reduction, full AC;
    data/calibration/fsdp1_grad_moments_cpu.jsonl): the backward peak is one of these two moments,
    which the block's compute moments missed by 5-27 %. Zeros for other engines.
    """
    a = ctx["a"]
    on = units["fsdp"] & eng.layout_is(eng.FLAT_UNIT, c.engine)
    keep = units["keep_unsharded"]
    acts = (np.asarray(np.ceil(ctx["tokens"] * (layers_on_device(c, k) * ctx["kept_avg"] + a * c.hidden_size)), dtype=np.int64)
            + ctx["rope"] + _leftover_after(c, k, ctx))
    shared = {
        "grads": grads_held + (c.num_layers - 1 - k) * ctx["per_block_grad"], "activations": acts,
        "all_gather_buffers": np.where((k >= 1) & np.logical_not(keep), units["block_unsharded"], 0),  # block k-1, prefetched
        "root_unsharded": units["root_unsharded"], "root_grads": units["root_grads"],
        "qlora_dequant": _nf4_saved_weights(c, ctx, k),
    }
    concat = dict(shared, unsharded_params=units["block_unsharded"] * np.where(keep, k + 1, 1),
                  unsharded_grads=2 * one["flat_grad_block"])
    hook = dict(shared, unsharded_params=units["block_unsharded"] * np.where(keep, k, 0),
                unsharded_grads=one["flat_grad_block"] + one["upcast_grad_block"],
                reduce_scatter_buffers=one["rs_input_block"] + one["rs_output_block"])
    return [{**engine_terms, **m, ROWS: on} for m in (concat, hook)]  # rows of other engines have neither moment


def _logits_bytes(c):
    """(forward, backward) bytes of the logits and the loss: whole, chunked cross-entropy's,
    LitGPT's chunked lm_head on Fabric's fp32 logits (``chunked_head``), or TRL's chunked LM head's
    (``fused_lm_head``: no logits at all; it wins over the model's own loss settings)."""
    chunked = c.ce_chunks > 0
    head = np.asarray(c.chunked_head, dtype=bool)
    trl = np.asarray(c.fused_lm_head, dtype=bool)
    return (np.where(trl, fused_lm_head_forward_bytes(c), np.where(head, chunked_head_forward_bytes(c),
                     np.where(chunked, chunked_logits_forward_bytes(c), logits_forward_bytes(c)))),
            np.where(trl, fused_lm_head_backward_bytes(c), np.where(head, chunked_head_backward_bytes(c),
                     np.where(chunked, chunked_logits_backward_bytes(c), logits_backward_bytes(c)))))


def _engine_terms(c):
    """DDP/DeepSpeed buffers alive in every moment (``common``), and inside a block (``in_block``):
    bitsandbytes dequantizes a 4-bit weight inside its Linear's forward and backward only
    (``autograd/_functions.py`` ``MatMul4Bit``: ``F.dequantize_4bit(B, quant_state)``, freed on
    return): it exists in the moments inside a block, not at the loss (measured: QLoRA runs whose
    peak is the logits' backward hold no dequantized weight, hf_stack_cpu.jsonl: +2.3 % before)."""
    other = engine_buffers(c)
    common = {name: value for name, value in other.items() if name != "qlora_dequant"}
    return other, common, other


def _forward_moments(c, units, grads_held, common, in_block, acts):
    """The moments of the forward: inside the loss (every block's saved activations, the logits),
    and, for FSDP and unwrapped runs, block 0's / block L-1's pre-forward and block L-1's own
    forward (``_block_forward``)."""
    keep = units["keep_unsharded"]
    # blocks unsharded outside their own computation: none (full_shard) or all (SHARD_GRAD_OP)
    blocks_held = np.where(keep, c.num_layers * units["block_unsharded"], 0)
    forward = dict(common, grads=grads_held, activations=acts["saved"], logits_and_loss=acts["logits"][0],
                   unsharded_params=blocks_held, all_gather_buffers=units["all_gather_block"],
                   root_unsharded=units["root_unsharded"], qlora_dequant=_nf4_saved_weights(c, acts, c.num_layers))
    applies = units["fsdp"] | (c.strategy == st.SINGLE)  # block moments: FSDP and unwrapped runs
    last = np.maximum(c.num_layers - 1, 0)
    return [forward] + _only_for(applies, [_block_forward(common, c, 0, units, grads_held, acts, pre=True),
                                           _block_forward(common, c, last, units, grads_held, acts, pre=True),
                                           _block_forward(in_block, c, last, units, grads_held, acts, pre=False)])


ROWS = "_rows"  # a moment's key that is not a term: the rows the moment exists for
_PRESENT = partial(is_not, None)  # a term the moment holds (dict.get gave no None)


def _only_for(applies, moments):
    """Moments that exist only for some rows (inside a block: FSDP and unwrapped runs) carry those
    rows (``ROWS``, and the rows a moment already carries); ``_peak`` counts their total as zero
    elsewhere, so they are never another row's peak (the buffers common to every moment, e.g.
    bitsandbytes' dequantized weight, would otherwise add a moment the row does not have)."""
    return [dict(m, **{ROWS: applies & m.get(ROWS, True)}) for m in moments]


def _backward_moments(c, states, units, n_p, n_g, grads_held, common, in_block, acts):
    """The moments of the backward: its start (the loss's backward), then inside block k's backward
    for k in {0, 1, L-2, L-1} (every term is linear in k apart from the buffers at the ends), with
    a checkpointed LoRA/QLoRA block's recomputation and FSDP1's gradient moments where they apply."""
    L = c.num_layers
    fsdp, keep = units["fsdp"], units["keep_unsharded"]
    blocks_held = np.where(keep, L * units["block_unsharded"], 0)
    # FSDP1 prefetches the last block (BACKWARD_PRE) in the root's pre-backward hook, before the
    # loss's backward runs (measured: tiny bf16 W=4/64 no AC, root + one block unsharded at the
    # logits' backward; −6.5 % / −9.2 % before)
    fsdp1_prefetch = np.where(eng.layout_is(eng.FLAT_UNIT, c.engine) & fsdp & np.logical_not(keep) & (L > 0), units["block_unsharded"], 0)
    start = dict(common, grads=grads_held, activations=acts["saved"], logits_and_loss=acts["logits"][1],
                 unsharded_params=blocks_held + fsdp1_prefetch,
                 all_gather_buffers=np.where(keep, 0, units["all_gather_block"]), root_unsharded=units["root_unsharded"],
                 qlora_dequant=_nf4_saved_weights(c, acts, L))
    # a 4-bit lm_head dequantized for its first chunk's input gradient (``quant_head``, LitGPT on Fabric)
    head_logits, head_weight = chunked_head_dequant_moment_bytes(c)
    head = {**start, "logits_and_loss": head_logits, "qlora_dequant": start["qlora_dequant"] + head_weight, ROWS: head_weight > 0}
    applies = fsdp | (c.strategy == st.SINGLE)
    return [start, head] + _only_for(applies, _block_backward_moments(c, states, units, n_p, n_g, grads_held, common,
                                                                      in_block, acts))


def _block_backward_moments(c, states, units, n_p, n_g, grads_held, common, in_block, acts):
    """Inside block k's backward for k in {0, 1, L-2, L-1}, a checkpointed LoRA/QLoRA block's
    recomputation, FSDP1's gradient moments (``_backward_moments``)."""
    L = c.num_layers
    moments = []
    ctx = _backward_context(c, states, n_g, grads_held, acts)
    ctx["lora_recompute"] = lora_recompute_bytes_per_token(c, ctx["a"])  # per token, the same in every block
    recomputing = (c.method != st.FULL) & (ctx["n_ckpt"] > 0)  # a checkpointed LoRA/QLoRA block is recomputed
    # FSDP1's gradient moments have no buffer ending at L-2: linear in k from 1 to L-1
    for which, k in enumerate((0, 1, L - 2, L - 1)):
        kk = np.clip(k, 0, np.maximum(L - 1, 0))
        moments.append(_block_backward(in_block, c, kk, ctx, units, grads_held))
        moments.append({**_block_backward(common, c, kk, ctx, units, grads_held, recompute=True), ROWS: recomputing})
        if which != 2:
            moments += _fsdp1_gradient_moments(common, c, kk, ctx, units, units["fsdp1_buffers"], grads_held)
    return moments


def _optimizer_step_moment(c, states, n_o):
    """The optimizer step: every gradient and the optimizer's temporaries. Optimizer in backward:
    no moment holds every gradient; each parameter's gradient is freed by its own step (torchtune
    ``register_optim_in_bwd_hooks``), so the step moment holds one parameter's gradient (the
    largest module's share) and its temporaries."""
    one_grad = np.ceil(states["grads"] * np.minimum(c.largest_module_params / np.maximum(c.total_params, 1), 1.0))
    return dict(grads=np.asarray(np.where(c.optimizer_in_backward, one_grad, states["grads"]), dtype=np.int64),
                optimizer_step_temporaries=optimizer_step_temporaries(c, n_o))


def _with_accumulated_grads(moments, held):
    """Gradient accumulation without sync (``no_sync`` / ``set_requires_gradient_sync(False)``):
    the whole model's unsharded gradients (``comm.no_sync_grad_bytes``) are alive from the first
    micro-batch's backward to the last one's reduction, so in every forward and backward moment;
    reduced before the optimizer step. ASSUMPTION: counted on top of the sharded gradients held
    across micro-batches, an upper bound by at most those (the planner's earlier count)."""
    return [dict(m, unsharded_grads=m.get("unsharded_grads", 0) + held) for m in moments]


def _peak(moments, first_bw, step, persistent, zero):
    """Totals of the forward, backward and step moments (each the largest of its moments), the
    moment that is the peak (``PEAK_MOMENTS``) and the index of the winning moment in ``moments``
    (-1: the optimizer step). Every moment's total sums the same terms."""
    def total(m):  # the terms a moment holds (MOMENT_TERMS), added in place into one row-sized array;
        # terms over fewer rows (a sweep grid's broadcast axes) are added together first: one pass
        # over the rows for all of them (integer sums: the order changes no byte)
        terms = list(filter(_PRESENT, map(m.get, MOMENT_TERMS)) if ROWS in m else m.values())
        # the row-sized array is the broadcast of every term (a flag axis of a sweep grid may give a
        # term more rows than the persistent bytes have): an array even for one configuration
        shape = np.broadcast_shapes(np.shape(persistent + zero), *map(np.shape, terms))
        out, fewer_rows = np.array(np.broadcast_to(persistent + zero, shape)), np.int64(0)
        for term in terms:
            if np.size(term) < out.size:
                fewer_rows = fewer_rows + term
            else:
                np.add(out, term, out=out)
        np.add(out, fewer_rows, out=out)
        return np.multiply(out, m[ROWS], out=out) if ROWS in m else out

    def largest(first, stop):  # the largest total of moments[first:stop], and which moment it is
        top = total(moments[first])
        best = np.full(top.shape, first, dtype=np.int64)
        for i in range(first + 1, stop):
            this = total(moments[i])
            if this.shape != top.shape:  # a moment over more rows (a flag axis of the grid) widens both
                shape = np.broadcast_shapes(this.shape, top.shape)
                top, best = np.array(np.broadcast_to(top, shape)), np.array(np.broadcast_to(best, shape))
            np.copyto(best, i, where=this > top)
            np.maximum(top, this, out=top)
        return best, top

    best_fw, fw_total = largest(0, first_bw)
    best_bw, bw_total = largest(first_bw, len(moments))
    step_total = total(step)
    moment = np.where(fw_total > bw_total, FORWARD, BACKWARD)
    moment = np.asarray(np.where(step_total > np.maximum(fw_total, bw_total), OPTIMIZER_STEP, moment), dtype=np.int8)
    which = np.where(moment == FORWARD, best_fw, np.where(moment == BACKWARD, best_bw, -1))
    return dict(forward=fw_total + zero, backward=bw_total + zero, step=step_total + zero, moment=moment, which=which)


def _terms_at_peak(names, moments, step, peak, zero):
    """The breakdown terms at the peak moment: each row takes its winning moment's value (the
    optimizer step's where that is the peak). Only the moments some row peaks at are read (a
    count of the winners per moment; sweeps evaluate many moments, few of which win)."""
    candidates = [*moments, step]
    winner = np.where(peak["moment"] == OPTIMIZER_STEP, len(moments), peak["which"])
    read = np.flatnonzero(np.bincount(np.ravel(winner), minlength=len(candidates))).tolist()
    wins = [winner == i for i in read]  # the winning moments are disjoint: which np.select tries first is moot
    return {name: np.asarray(np.select(wins, [candidates[i].get(name, 0) for i in read], 0) + zero, dtype=np.int64)
            for name in names}


def paged_state_bytes(c, states):
    """bitsandbytes paged optimizer states: allocated with ``cudaMallocManaged`` (``functional.get_paged``;
    ``Optimizer8bit.get_state_buffer`` pages every state of a parameter with >= 1e5 elements, the
    rest are ordinary ``torch.zeros_like``: ASSUMPTION all paged), so torch's caching allocator
    and its counters (``max_memory_allocated`` / ``reserved``, torchtune's memory stats) never see
    them; they are device memory outside torch, like the CUDA context. Evidence: torchtune's
    single-device full fine-tune with PagedAdamW8bit (README, Llama-3.1-8B on a 4090) reports
    18.9 GiB, the bf16 weights (15.0 GiB) + activations and logits, without the 15 GiB of states."""
    return np.where(np.asarray(c.paged_optimizer, dtype=bool), states["optimizer_states"], 0)


def _device_totals(c, peak_allocated, units, states, live, allocator, n_p):
    """Reserved = allocated + FSDP's side-stream pools + fragmentation (allocator.py, measured on an
    H100), the bytes outside torch (CUDA context, NCCL, paged optimizer states), the device total
    and the load peak. Paged states are resident as far as the device has room beside what torch
    and the context hold: unified memory oversubscribes, the driver evicting pages to host RAM
    when the GPU runs out (bitsandbytes docs, "Paged optimizers": "automatic page-to-page
    transfers between the CPU and GPU ... to avoid OOM errors"), so they never make a run OOM.
    The part the device cannot hold is ``paged_spill_bytes`` (the step time pays for it:
    ``throughput.paged_migration_s``). ASSUMPTION: the evicted part fits in host RAM (not added to
    ``host_bytes_per_node``)."""
    reserved = reserved_terms(c, peak_allocated, units, states["grads"], live, allocator, c.expandable_segments)
    # what a whole-weight NF4 load left cached stays reserved into training (nf4_load_cache.py)
    reserved["peak_reserved_bytes"] = np.maximum(reserved["peak_reserved_bytes"],
                                                 states["params"] + nf4_load_cached_bytes(c))
    non_torch = non_torch_device_bytes(c.nccl_buffer_bytes, allocator.cuda_context_bytes)
    room = np.maximum(c.gpu_memory_bytes - reserved["peak_reserved_bytes"] - non_torch, 0)
    paged = paged_state_bytes(c, states)
    resident = np.minimum(paged, room)
    non_torch = non_torch + resident
    device_total = reserved["peak_reserved_bytes"] + non_torch
    load_peak = load_peak_allocated_bytes(c, n_p) + non_torch
    return dict(
        peak_reserved_bytes=reserved["peak_reserved_bytes"], stream_pool_bytes=reserved["stream_pool_bytes"],
        fragmentation_bytes=reserved["fragmentation_bytes"], allocator_band_bytes=reserved["allocator_band_bytes"],
        non_torch_bytes=np.asarray(np.broadcast_to(non_torch, np.shape(peak_allocated)), dtype=np.int64),
        device_total_bytes=device_total,
        load_peak_bytes=np.asarray(load_peak, dtype=np.int64) + np.zeros_like(peak_allocated),
        gpu_memory_bytes=c.gpu_memory_bytes, headroom_bytes=c.gpu_memory_bytes - device_total,
        # what the device cannot hold of the paged states: the step migrates them (throughput.paged_migration_s)
        paged_state_bytes=np.asarray(paged + np.zeros_like(peak_allocated), dtype=np.int64),
        paged_spill_bytes=np.asarray(paged - resident + np.zeros_like(peak_allocated), dtype=np.int64),
    )


def _verdicts(c, out):
    """Validity and the three capacity checks (device, load, host)."""
    out["valid"] = (st.is_valid(c.strategy, c.engine) & eng.valid_offload(c) & valid_method(c) & valid_stack_knobs(c)
                    & st.valid_world_size(c.strategy, c.world_size))
    out["fits_gpu"] = out["device_total_bytes"] <= c.gpu_memory_bytes
    out["fits_load"] = out["load_peak_bytes"] <= c.gpu_memory_bytes
    out["fits_host"] = out["host_bytes_per_node"] <= c.host_ram_bytes_per_node
    out["fits"] = out["fits_gpu"] & out["fits_load"] & out["fits_host"] & out["valid"]
    return out


def estimate_memory(c, *, allocator=None, optimizer_step_on_device=False, breakdown=True):
    """All memory columns for the configurations in ``c`` (a ``Columns``).

    ``optimizer_step_on_device``: count Adam's per-tensor ``step`` scalars in device memory (CPU
    runs, or fused/capturable Adam); torch's default on CUDA keeps them on the host.
    ``breakdown=False`` leaves out the per-term columns at the peak moment (sweeps that only want
    totals); the totals are the same either way. Gradient accumulation without sync
    (``c.sync_every_micro_batch`` False) is counted here (``_with_accumulated_grads``).
    """
    states = model_states(c, optimizer_step_on_device=optimizer_step_on_device)
    n_p, n_g, n_o = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    units = fsdp_units(c, n_p)
    other, common, in_block = _engine_terms(c)
    paged = paged_state_bytes(c, states)  # outside torch's allocator (non_torch_bytes)
    persistent = states["params"] + states["grad_buckets"] + states["master_params"] + states["optimizer_states"] - paged
    grads_held = np.where(c.grad_accum > 1, states["grads"], 0)
    acts = _activation_context(c)
    forward = _forward_moments(c, units, grads_held, common, in_block, acts)
    backward = _backward_moments(c, states, units, n_p, n_g, grads_held, common, in_block, acts)
    moments = _with_accumulated_grads(forward + backward, no_sync_grad_bytes(c))
    step = _optimizer_step_moment(c, states, n_o)
    zero = np.zeros(np.broadcast(persistent, moments[0]["activations"]).shape, dtype=np.int64)
    peak = _peak(moments, len(forward), step, persistent, zero)

    out = {name: states[name] for name in ("params", "grad_buckets", "master_params")}
    out["optimizer_states"] = states["optimizer_states"] - paged
    at_peak = _terms_at_peak(PEAK_TERMS if breakdown else LIVE_AT_PEAK_TERMS, moments, step, peak, zero)
    if breakdown:
        out.update(at_peak)
    peak_allocated = np.maximum(np.maximum(peak["forward"], peak["backward"]), peak["step"])
    live = {name: at_peak[name] for name in ("grads", "all_gather_buffers")}
    out.update(peak_allocated_bytes=peak_allocated,
               **_device_totals(c, peak_allocated, units, states, live, allocator or default_allocator(), n_p))
    host_acts = np.where(c.activation_offload, offloaded_activation_bytes(c), 0)
    out.update(
        model_state_bytes=(persistent + paged + step["grads"] + other["gathered_params"]),  # OIB: one gradient at a time
        host_offloaded_bytes_per_gpu=states["host_offloaded"] + host_acts,
        host_bytes_per_node=host_bytes_per_node(c, states["host_offloaded"] + host_acts),
        host_ram_bytes_per_node=c.host_ram_bytes_per_node,
        forward_peak_bytes=peak["forward"], backward_peak_bytes=peak["backward"],
        optimizer_step_peak_bytes=peak["step"], peak_moment=peak["moment"],
    )
    return _verdicts(c, out)


def valid_stack_knobs(c):
    """``single`` means one GPU; optimizer-in-backward steps every micro-batch, so it cannot
    accumulate gradients (torchtune raises "Gradient accumulation is not supported with optimizer
    in bwd") and keeps no gradients to offload."""
    single_ok = (c.strategy != st.SINGLE) | (c.world_size == 1)
    oib_ok = np.logical_not(np.asarray(c.optimizer_in_backward, dtype=bool)) | ((c.grad_accum == 1) & (c.offload == st.OFFLOAD_NONE))
    return single_ok & oib_ok


def valid_method(c):
    """Every method is valid with every precision: QLoRA under fp32 is the fp32 stream of PEFT's
    ``prepare_model_for_kbit_training`` (or ``bnb_4bit_compute_dtype=float32``); LoRA/QLoRA with
    DeepSpeed ZeRO-3 and FSDP work."""
    return np.ones(np.shape(c.method), dtype=bool)
