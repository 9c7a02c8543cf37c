"""The GPU idle time the eager MoE expert loop's host syncs expose (issue 23; session 7).

Mechanism: Transformers' eager Mixtral block (v4.48.1, the fms-acceleration rows' version,
``src/transformers/models/mixtral/modeling_mixtral.py`` l.136–148, ``MixtralSparseMoeBlock.forward``)
loops over every expert and calls ``torch.where(expert_mask[expert_idx])``: a ``nonzero``, whose
CUDA kernel copies the count of selected tokens to the host and synchronises the stream before it
can size its output (torch ``aten/src/ATen/native/cuda/Nonzero.cu`` ``nonzero_cuda_out_impl``:
``at::cuda::memcpy_and_sync``; the torch docs of ``torch.nonzero`` state the host-device sync).
So once per expert per MoE block and forward pass the host waits until the GPU has run everything
queued, and the GPU then idles until the host issues the expert's next kernel: the loop is a chain of
sync-delimited intervals with no lookahead across them. One interval takes max(host, lead + GPU),
``lead`` the host work from the sync to the expert's first GEMM (while the GPU has nothing queued);
its exposure beyond its GPU seconds is max(host − GPU, lead).
Backward has no sync: ``nonzero``'s integer outputs are not differentiable, so autograd records only
the index, GEMM and ``index_add_`` nodes (counted: none of the backward's aten operators is a
``nonzero``); a checkpointed block's recompute runs the forward again, with its syncs.

Counts (aten operators under ``kernel_launches.launch_counter`` over the v4.48.1 block's own source,
bf16 autocast over fp32 weights as ``eager_host`` counts, torch 2.13 on the CPU; the per-expert count
= (4 experts − 2 experts) / 2): per expert in forward 15 (``nonzero``, the two ``index`` gathers,
the 3 Linears' input and weight casts + mm, silu, 2 mul, ``index_add_``); from the sync to the first
mm 4 (``nonzero``'s own post-sync launches, the hidden-state gather, w1's two casts). bitsandbytes
4-bit experts (QLoRA) add ``eager_host``'s per-4-bit-Linear forward operations to each Linear, before
its GEMM. Host seconds: operations × ``eager_host.HOST_OP_S`` (no new constant).
GPU seconds per expert interval: its GEMMs, 2·(2 + gated)·h·i FLOPs for each of tokens·k/E rows at
the GEMM rate (``throughput.expert_gemm_s``), window-scaled like the rest of the compute.

ASSUMPTION: even routing (tokens·k/E rows per expert); the expert's element-wise kernels, its
dequantization (QLoRA) and the sync's own latency are left out of the interval (a floor on the
exposure when the GPU dominates, a ceiling on it when the host does). ASSUMPTION: the ``hf`` stack
runs this loop (``throughput.moe_dispatch_bytes_per_token``'s assumption); no shared experts (i =
``mlp_width`` / k). ASSUMPTION: the exposure adds to the phase's GPU seconds beside FSDP1's
limiter's (``fsdp1_limiter``), whose cycles are the attention's adapted Linears, not the experts.
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas import eager_host as eh
from shardplan.formulas.activations import recompute_fraction
from shardplan.inputs import strategy as st

EXPERT_FORWARD_OPS = 15  # per expert and forward pass (module docstring)
EXPERT_LEAD_OPS = 4  # from the sync to the expert's first GEMM
EXPERT_LINEARS = 3  # w1, w3, w2


def expert_operations(c):
    """(host operations of one expert's interval, of its lead) in a forward pass; a 4-bit expert's
    Linears add ``eager_host``'s per-Linear 4-bit operations (its first Linear's before the GEMM)."""
    quant = (np.asarray(c.method) == st.QLORA) * (eh.QUANT4_FORWARD / eh.LLAMA_LINEARS)
    return EXPERT_FORWARD_OPS + EXPERT_LINEARS * quant, EXPERT_LEAD_OPS + quant


def sync_exposure_s(c, expert_gpu_s, host_op_s=None):
    """(forward, backward) seconds per micro-batch the per-expert syncs add beyond the GPU alone:
    blocks · E · max(host − GPU, lead) per forward pass, the backward's from its recomputed share;
    ``expert_gpu_s`` one expert interval's GPU seconds; 0 for a dense model and off the hf stack."""
    op = eh.HOST_OP_S if host_op_s is None else host_op_s
    host, lead = (op * n for n in expert_operations(c))
    experts = np.asarray(c.moe_experts, dtype=np.float64)
    per_pass = np.asarray(c.moe_blocks, dtype=np.float64) * experts \
        * np.maximum(host - np.asarray(expert_gpu_s, dtype=np.float64), lead)
    on = (np.asarray(c.stack) == st.HF) & (experts > 0)
    forward = np.where(on, per_pass, 0.0)
    return forward, recompute_fraction(c) * forward
