"""Per-GPU and per-node memory: every term, the peak, and whether it fits.

The peak is the larger of two moments of a training step:

* start of backward — persistent states + saved activations + logits/loss + engine buffers
  (+ gradients already accumulated when ``grad_accum > 1``);
* optimizer step — persistent states + full gradients + the optimizer's temporaries.

The breakdown reported is the one of the moment that is the peak, so its terms add up to
``peak_allocated_bytes`` exactly. Each term comes from one function; see docs/formulas.md.
"""

from __future__ import annotations

import numpy as np

from shardplan import strategy as st
from shardplan.activations import block_activation_bytes, head_activation_bytes, logits_and_loss_bytes
from shardplan.buffers import engine_buffers, optimizer_step_temporaries
from shardplan.model_states import NF4_BYTES_PER_PARAM, model_states
from shardplan.overheads import (
    CUDA_CONTEXT_BYTES, FRAGMENTATION, HOST_PROCESS_BYTES, non_torch_device_bytes, reserved_bytes,
)

# Order of the breakdown table; also the DataFrame column names.
STATE_TERMS = ("params", "grads", "grad_buckets", "master_params", "optimizer_states")
ACTIVATION_TERMS = ("activations", "logits_and_loss")
BUFFER_TERMS = ("unsharded_params", "all_gather_buffers", "unsharded_grads", "reduce_scatter_buffers",
                "root_unsharded", "root_grads", "autocast_weight_copies", "gathered_params", "comm_buckets",
                "qlora_dequant", "optimizer_step_temporaries")
BREAKDOWN_TERMS = STATE_TERMS + ACTIVATION_TERMS + BUFFER_TERMS


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
    return np.floor(np.where(stage3, z3, z2)).astype(np.int64)


def host_bytes_per_node(c, host_offloaded):
    """Host RAM a node needs: each rank's process, plus the larger of the ranks' offloaded states
    and the one checkpoint copy rank 0 loads before sharding (Hugging Face ``from_pretrained`` with
    FSDP's ``cpu_ram_efficient_loading``: 16-bit weights, NF4 for QLoRA's quantized Linears).

    DeepSpeed uses its estimator's figures (``deepspeed_estimator_host_bytes``).
    ASSUMPTION: loading ends before offloaded optimizer states are created.
    """
    loading = np.where(c.method == st.QLORA,
                       c.quantizable_params * NF4_BYTES_PER_PARAM + 2 * (c.total_params - c.quantizable_params),
                       2 * c.total_params)
    ours = c.gpus_per_node * HOST_PROCESS_BYTES + np.maximum(loading, c.gpus_per_node * host_offloaded)
    nodes = np.maximum(c.world_size // np.maximum(c.gpus_per_node, 1), 1)
    ds = deepspeed_estimator_host_bytes(c.total_params, c.largest_module_params, c.gpus_per_node, nodes,
                                        c.strategy, c.offload)
    return np.where(c.engine == st.DEEPSPEED, ds, ours).astype(np.int64)


def estimate_memory(c, *, fragmentation=FRAGMENTATION, cuda_context_bytes=CUDA_CONTEXT_BYTES):
    """All memory columns for the configurations in ``c`` (a ``Columns``)."""
    states = model_states(c)
    _, _, n_o = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    activations = block_activation_bytes(c) + head_activation_bytes(c)
    logits = logits_and_loss_bytes(c)
    buffers = engine_buffers(c)
    step_temps = optimizer_step_temporaries(c, n_o)

    persistent = states["params"] + states["grad_buckets"] + states["master_params"] + states["optimizer_states"]
    grads_held = np.where(c.grad_accum > 1, states["grads"], 0)
    at_backward = persistent + grads_held + activations + logits + sum(buffers.values())
    at_step = persistent + states["grads"] + step_temps
    backward_is_peak = at_backward >= at_step

    def at_peak(backward_value, step_value):
        return np.where(backward_is_peak, backward_value, step_value).astype(np.int64)

    out = {name: states[name] for name in ("params", "grad_buckets", "master_params", "optimizer_states")}
    out["grads"] = at_peak(grads_held, states["grads"])
    out["activations"] = at_peak(activations, 0)
    out["logits_and_loss"] = at_peak(logits, 0)
    for name, value in buffers.items():
        out[name] = at_peak(value, 0)
    out["optimizer_step_temporaries"] = at_peak(0, step_temps)

    peak_allocated = sum(out[name] for name in BREAKDOWN_TERMS)
    peak_reserved = reserved_bytes(peak_allocated, fragmentation)
    non_torch = non_torch_device_bytes(c.nccl_buffer_bytes, cuda_context_bytes)
    device_total = peak_reserved + non_torch
    host = host_bytes_per_node(c, states["host_offloaded"])
    out.update(
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
        non_torch_bytes=np.broadcast_to(non_torch, peak_allocated.shape).astype(np.int64),
        device_total_bytes=device_total,
        gpu_memory_bytes=c.gpu_memory_bytes,
        headroom_bytes=c.gpu_memory_bytes - device_total,
        model_state_bytes=(persistent + states["grads"] + buffers["gathered_params"]),
        host_offloaded_bytes_per_gpu=states["host_offloaded"],
        host_bytes_per_node=host,
        host_ram_bytes_per_node=c.host_ram_bytes_per_node,
        peak_phase=np.where(backward_is_peak, "backward", "optimizer_step"),
        valid=st.is_valid(c.strategy, c.engine) & valid_offload(c) & valid_method(c),
    )
    out["fits_gpu"] = device_total <= c.gpu_memory_bytes
    out["fits_host"] = host <= c.host_ram_bytes_per_node
    out["fits"] = out["fits_gpu"] & out["fits_host"] & out["valid"]
    return out


def valid_offload(c):
    """Offload each engine can express: FSDP offloads params+grads+optimizer together
    (``CPUOffloadPolicy`` / ``CPUOffload(offload_params=True)``); DeepSpeed offloads the optimizer at
    stage 1–3 and parameters only at stage 3; DDP offloads nothing."""
    ds = c.engine == st.DEEPSPEED
    stage3 = (c.strategy == st.FULL_SHARD) | (c.strategy == st.HYBRID_SHARD)
    ddp_like = (c.strategy == st.DDP) | ((c.strategy == st.NO_SHARD) & ds)
    ok_fsdp = (c.offload != st.OFFLOAD_OPTIMIZER)
    ok_ds = (c.offload != st.OFFLOAD_ALL) | stage3
    return (c.offload == st.OFFLOAD_NONE) | (~ddp_like & np.where(ds, ok_ds, ok_fsdp))


def valid_method(c):
    """QLoRA's 4-bit base needs a 16-bit compute dtype; LoRA/QLoRA with DeepSpeed ZeRO-3 and FSDP work."""
    return ~((c.method == st.QLORA) & (c.precision == st.FP32))
