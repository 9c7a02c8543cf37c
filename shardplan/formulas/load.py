"""The load-time peak: device memory while the weights reach the GPUs, before training starts.

How a stack loads decides a peak of its own, separate from the training step's
(huggingface/accelerate#2515, axolotl-ai-cloud/axolotl#1717). Per ``load_mode``
(``strategy.LOAD_MODES``), bytes on each GPU:

* ``full_per_gpu`` — every rank puts the whole model on its GPU, then the wrapper shards it
  (``from_pretrained(device_map=...)`` / ``model.to("cuda")`` before ``fully_shard`` or FSDP1
  with ``device_id``): the whole model in its load dtype, plus one unit's sharded copy being
  built (FSDP1 flattens a unit into a new flat parameter before freeing the originals).
* ``rank0_broadcast`` — rank 0 reads the checkpoint into CPU RAM, the others hold meta tensors,
  and the wrapper broadcasts unit by unit (FSDP1 ``sync_module_states=True`` with accelerate's
  ``cpu_ram_efficient_loading``) or parameter by parameter (torchtune
  ``load_from_full_model_state_dict``, torch ``set_model_state_dict(broadcast_from_rank0=True)``):
  the rank's shard plus one unit unsharded.
* ``meta_init`` — the model is built on the meta device, sharded, then materialised shard by
  shard (torchtitan ``to_empty`` + ``init_weights`` or a sharded DCP load; Fabric
  ``init_module(empty_init=True)``): the shard only.

The load dtype is the 16-bit checkpoint dtype (fp32 under fp32 training); a QLoRA base is loaded
quantized (bitsandbytes quantizes each weight as it is placed; GPTQ/AWQ checkpoints are stored
quantized). Device bytes outside torch (CUDA context, NCCL) are added so the figure compares with
the GPU's capacity like ``device_total_bytes``. With parameter offload (FSDP ``CPUOffloadPolicy``,
DeepSpeed ``offload_param``) the shard is placed in host RAM, so only the unit in flight (or, for
full_per_gpu, the whole model) touches the GPU. ASSUMPTION: the allocator adds nothing during
loading (few, large, long-lived blocks); the unit in flight is the larger of the root and a block (torchtune distributes one parameter
at a time, so for it this over-counts by less than one block);
GPTQ/AWQ's quantized buffers are whole on every rank, less what a stack re-registers as parameters
(``model_states.quant_replicated_bytes``).
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.model_states import params_offloaded, qlora_block_bytes_per_param, quant_replicated_bytes, quantized_base_bytes
from shardplan.inputs import strategy as st


def model_load_bytes(c):
    """The whole model in its load dtype: 16-bit (fp32 for fp32 training), a QLoRA base with its
    block Linears quantized (``quant_format``) and the rest 16-bit. Adapters are created after
    loading and are not counted."""
    b = np.where(c.precision == st.FP32, 4, 2)
    return np.asarray(np.where(c.method == st.QLORA, quantized_base_bytes(c) + 2 * (c.total_params - c.quantizable_params),
                    b * c.total_params), dtype=np.int64)


def load_unit_bytes(c):
    """The largest unit (root or block) in its load dtype: what one broadcast / flatten holds."""
    b = np.where(c.precision == st.FP32, 4, 2)
    block_bpp = np.where(c.method == st.QLORA, qlora_block_bytes_per_param(c), b)
    return np.asarray(np.ceil(np.maximum(c.root_params * b, c.unit_params * block_bpp)), dtype=np.int64)


def load_peak_allocated_bytes(c, param_shard_degree):
    """Bytes torch holds on one GPU at the load-time peak, per ``load_mode`` (module docstring)."""
    n = np.maximum(np.asarray(param_shard_degree), 1)
    whole = model_load_bytes(c)
    quant = quant_replicated_bytes(c)
    shard = np.asarray(np.where(params_offloaded(c), 0, np.ceil((whole - quant) / n) + quant), dtype=np.int64)
    unit = np.where(n > 1, load_unit_bytes(c), 0)
    mode = np.asarray(c.load_mode)
    return np.asarray(np.where(mode == st.LOAD_FULL_PER_GPU, whole + unit,
                    np.where(mode == st.LOAD_RANK0_BROADCAST, shard + unit, shard)), dtype=np.int64)
