"""Reserved vs allocated: what the CUDA caching allocator holds beyond the live tensors.

Mechanisms (torch ``c10/cuda/CUDACachingAllocator.cpp``; measured on an H100,
data/calibration/gpu/, ``benchmarks/gpu_campaign.py``):

1. **Rounding and segments.** Every block is rounded up to 512 B; requests up to 1 MiB come
   from 2 MiB small-pool segments, 1–10 MiB from 20 MiB segments, larger ones are rounded to
   2 MiB (``probes.jsonl`` "rounding": all ten sizes exactly so). At GiB scale this is below
   0.1 %. ASSUMPTION: not counted separately; it is inside the measured fragmentation.
2. **Per-stream pools.** A freed block is cached for the stream that allocated it, and only
   that stream reuses it. FSDP all-gathers on its own stream and reduce-scatters on another
   (torch ``_fsdp_param_group.py``: ``all_gather_stream``, ``reduce_scatter_stream``). Their
   cached blocks are reserved, but the default stream cannot use them at its own peak:
   * all-gather pool: the root's and one block's all-gather outputs, in the param dtype;
   * reduce-scatter pool: the sharded gradients. ``foreach_reduce`` allocates the reduce-scatter
     output on the reduce-scatter stream, and the sharded gradient is a view of it.
   Measured with ``expandable_segments`` (no fragmentation inside a pool): Llama-3.1-8B FSDP2
   W=8 AC full, reserved − allocated = 6.45 GiB; pools 6.10 GiB. W=4 no AC: 10.44 vs 9.84 GiB.
   ASSUMPTION: with a bf16 reduce the fp32 cast of the gradient is also made on the
   reduce-scatter stream (same code path); FSDP1's unshard / post-backward streams hold the
   same two pools.
3. **Fragmentation.** A freed block stays cached in its segment and is reused only by a later
   request it can hold (best fit over the pool's free blocks; a large-pool block is split when
   more than 1 MiB would remain; a request over 10 MiB that no cached block holds gets a new
   segment of its own size rounded to 2 MiB — ``CUDACachingAllocator.cpp`` ``get_free_block``,
   ``should_split``, ``get_allocation_size``). The blocks that end up split are the largest ones
   a step frees: the loss chain's, of the size of the largest transient (the fp32 copy of the
   logits, 4·b·s·V; per chunk with chunked cross-entropy). Measured (data/calibration/gpu,
   ``steps``): the campaign's FSDP runs reserve up to 5.5 such blocks more in step 2 than in
   step 1 beyond the growth of their allocated peak (Llama-3.1-8B W=4 AC full: +10.8 GiB at the
   same allocated peak). Adam's states are created at the first ``optimizer.step()``
   (``torch.optim.AdamW`` ``_init_group``: ``zeros_like``) from the blocks the first step cached,
   the loss blocks among them, and the next loss needs whole ones again; where the lazily created
   states are smaller than one loss block (LoRA; 1B on 8 ranks) the slack stays at 0.3–1.3
   blocks. Slack = k × the largest transient, k per allocator class fitted on every source with
   both counters and judged leave-one-source-out (``calibrate.fragmentation_loso``:
   least squares of the relative reserved error over every source with both counters; FSDP1 and
   FSDP2 apart). The band is the 0.9 quantile of the out-of-source residual per transient byte
   (``band_upper``; ``band_lower`` the 0.1 quantile); docs/accuracy.md shows both and the
   leave-one-source-out errors. ASSUMPTION: the number of loss blocks split per step, measured on
   an H100 with torch 2.11, holds for other GPUs and torch releases; the campaign's FSDP runs
   (8B, 7.5–15 GiB of states per rank) and the user scripts' (1B, 1.2 GiB) bracket it, and k is
   between them. A ``--calibration`` overlay replaces the coefficients.

The CUDA context, cuBLAS handles and lazily loaded kernels are outside the allocator: 764 MiB
measured (``allocator.json``). NCCL buffers are added per link (``overheads.py``).
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.activations import compute_dtype_bytes, fused_lm_head_largest_transient_bytes, loss_dtype_bytes
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st
from shardplan.inputs.allocator_profile import AllocatorModel, default_allocator
from shardplan.support.identity_cache import IdentityCache

CLASSES = ("no_side_streams", "fsdp2", "fsdp1", "expandable_segments")


def allocator_class(c, expandable_segments=False):
    """Index into ``CLASSES`` per configuration."""
    fsdp = np.logical_not(eng.wrapper_is(eng.W_DEEPSPEED, c.engine, c.strategy)) & (c.strategy != st.DDP) & (c.world_size > 1)
    cls = np.where(fsdp & eng.layout_is(eng.PER_TENSOR, c.engine), 1,
                   np.where(fsdp & eng.layout_is(eng.FLAT_UNIT, c.engine), 2, 0))
    return np.where(np.asarray(expandable_segments, dtype=bool), 3, cls)


def side_stream_pool_bytes(c, units, sharded_grad_bytes, live_at_peak=None):
    """Bytes cached in FSDP's all-gather and reduce-scatter stream pools (mechanism 2) that are not
    live at the allocated peak: each pool's high-water mark less what of it the peak moment holds
    (``live_at_peak``: the breakdown's ``all_gather_buffers`` and ``grads`` at that moment)."""
    sharded = (units["all_gather_block"] > 0) | (eng.layout_is(eng.FLAT_UNIT, c.engine) & units["fsdp"] & (c.world_size > 1))
    all_gather = np.where(units["fsdp"] & sharded,
                          np.maximum(units["all_gather_root"], units["root_unsharded"])
                          + np.maximum(units["all_gather_block"], units["block_unsharded"]), 0)
    reduce_scatter = np.where(units["fsdp"] & sharded, sharded_grad_bytes, 0)
    if live_at_peak is not None:
        all_gather = np.maximum(all_gather - live_at_peak["all_gather_buffers"], 0)
        reduce_scatter = np.maximum(reduce_scatter - live_at_peak["grads"], 0)
    return np.asarray(all_gather + reduce_scatter, dtype=np.int64)


def largest_transient_bytes(c):
    """The step's largest short-lived block (mechanism 3): the loss's copy of the logits in its
    dtype (``activations.loss_dtype_bytes``: the fp32 copy of HF ``ForCausalLMLoss``
    ``logits.float()``), per chunk when the loss is chunked (``ce_chunks``); with a fused
    cross-entropy kernel (``fused_ce``) the logits' 16-bit gradient it writes; with TRL's chunked LM
    head (``fused_lm_head``) its tile or gradient accumulator (no logits exist)."""
    chunks = np.maximum(np.asarray(getattr(c, "ce_chunks", 0)), 1)
    width = np.where(np.asarray(getattr(c, "fused_ce", False), dtype=bool), compute_dtype_bytes(c.precision),
                     loss_dtype_bytes(c))
    logits = np.ceil(width * c.micro_batch * c.seq_len * c.vocab_size / chunks)
    head = np.asarray(getattr(c, "fused_lm_head", False), dtype=bool)
    return np.asarray(np.where(head, fused_lm_head_largest_transient_bytes(c), logits), dtype=np.int64)


def fragmentation_bytes(c, model: AllocatorModel, expandable_segments=False):
    """Fragmentation slack, k × the largest transient (mechanism 3), and the band's bytes: the
    class's out-of-source 0.9 quantile of the residual (``band_upper``) × the same transient —
    the side a ``fits`` answer must cover (the verdict's lower side is the published runs')."""
    cls = allocator_class(c, expandable_segments)
    transient = largest_transient_bytes(c)
    k, upper = class_coefficients(model)
    frag = np.asarray(np.ceil(np.choose(cls, k) * transient), dtype=np.int64)
    return frag, np.asarray(np.ceil(np.choose(cls, upper) * transient), dtype=np.int64)


_coefficients = IdentityCache(64)


def class_coefficients(model: AllocatorModel) -> tuple[list[float], list[float]]:
    """The (k, band_upper) of each of ``CLASSES``, read once per allocator model (frozen data;
    every estimate reads them)."""
    return _coefficients.get(model, None, lambda: tuple([getattr(model.coefficient(name), which) for name in CLASSES]
                                                        for which in ("k", "band_upper")))


def reserved_terms(c, peak_allocated, units, sharded_grad_bytes, live_at_peak=None,
                   model: AllocatorModel | None = None, expandable_segments=False):
    """``peak_reserved_bytes`` and its parts, plus the band's bound on the allocator slack."""
    model = model or default_allocator()
    pools = side_stream_pool_bytes(c, units, sharded_grad_bytes, live_at_peak)
    frag, band = fragmentation_bytes(c, model, expandable_segments)
    return {
        "peak_reserved_bytes": np.asarray(peak_allocated, dtype=np.int64) + pools + frag,
        "stream_pool_bytes": pools,
        "fragmentation_bytes": frag,
        "allocator_band_bytes": band,
    }
