"""Model states per GPU: parameters, gradients, optimizer states, fp32 master copy.

Bytes per parameter and which ranks share each state, per engine:

* ZeRO paper (Rajbhandari et al., SC'20, Fig. 1): mixed-precision Adam holds 2Ψ + 2Ψ + KΨ with
  K = 12; stage 1/2/3 divide the optimizer / +gradients / +parameters by N.
* FSDP2 ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the
  sharded parameters stay in their original fp32 and are the master weights; sharded gradients
  come back in fp32; 16-bit unsharded copies exist only for units in flight (a transient term,
  see buffers.py). Source: torch ``distributed/fsdp/_fully_shard/_fsdp_api.py`` docstring.
* FSDP1 ``MixedPrecision``: fp32 sharded flat parameter and fp32 sharded gradient likewise.
* DDP (torch ``DistributedDataParallel``): full fp32 params and grads, plus gradient buckets of
  the same size unless ``gradient_as_bucket_view=True`` (torch DDP docstring: "the saved memory
  size will be equal to the total gradients size").
* DeepSpeed: 16-bit params (2/N_p), 16-bit grads (2/N_g; not kept at stage 3), and per optimizer
  partition fp32 grads + fp32 master + Adam moments = 16/N_o. This reproduces
  ``estimate_zero2_model_states_mem_needs`` (2Ψ + 18Ψ/N) and ``estimate_zero3_...`` (18Ψ/N + 4L)
  exactly (tests/test_deepspeed_reference.py).

All functions broadcast over numpy arrays; codes come from ``shardplan.inputs.strategy``.
"""

from __future__ import annotations

import numpy as np

from shardplan.inputs import strategy as st

# bitsandbytes NF4 with double quantization (Dettmers et al. 2023, §3 "Double Quantization";
# bitsandbytes ``functional.quantize_4bit`` with compress_statistics): the packed 4-bit weight,
# a uint8 absmax per NF4_BLOCK weights, an fp32 nested absmax per NF4_NESTED_BLOCK such blocks.
NF4_PACKED_BYTES_PER_PARAM = 0.5
NF4_BLOCK = 64            # bitsandbytes ``quantize_4bit`` blocksize (uint8 absmax per block after double quant)
NF4_NESTED_BLOCK = 256    # double quantization: one fp32 absmax per 256 first-level absmax values
# The paper's mean storage per weight of a large tensor, 0.5 + 1/64 + 4/(64·256): what
# ``quant_bytes_per_param`` (packed part) plus ``nf4_quant_state_bytes`` (the rest, per tensor) add up to.
NF4_BYTES_PER_PARAM = NF4_PACKED_BYTES_PER_PARAM + 1 / NF4_BLOCK + 4 / (NF4_BLOCK * NF4_NESTED_BLOCK)
# Per quantized tensor (bitsandbytes ``functional.quantize_4bit`` / ``QuantState``): the NF4 code
# (16 fp32 = 64 B), the nested dynamic-map code (256 fp32 = 1024 B) and the fp32 offset (4 B).
NF4_PER_TENSOR_BYTES = 64 + 1024 + 4


def nf4_quant_state_bytes(elements, tensors):
    """bitsandbytes NF4 + double-quantization quant_state of ``tensors`` weights holding
    ``elements`` in all: uint8 absmax per 64 weights, fp32 nested absmax per 256 blocks, and the
    per-tensor code/offset. Exact for one tensor (``tensors=1``); for many, the ceilings are taken
    over the sum (ASSUMPTION: sizes are multiples of 64·256, true for real hidden sizes).
    Source: bitsandbytes ``functional.py`` ``quantize_4bit`` (compress_statistics); measured on
    the CPU backend (``calibrate/hf_stack.quant_state_bytes``: 16,784 B for 14 tiny tensors)."""
    e = np.asarray(elements, dtype=np.float64)
    t = np.asarray(tensors, dtype=np.float64)
    blocks = np.ceil(e / NF4_BLOCK)
    nested = np.ceil(blocks / NF4_NESTED_BLOCK)
    nested = np.maximum(nested, t)  # every tensor has at least one nested block
    return np.where(e > 0, blocks + 4 * nested + NF4_PER_TENSOR_BYTES * t, 0).astype(np.int64)
# GPTQ (Frantar et al. 2022) as AutoGPTQ/GPTQModel/transformers store it at group size 128:
# ``qweight`` int32 [in/8, out] (4 bits per weight), ``qzeros`` int32 [in/128, out/8] (4 bits per
# group and output), ``scales`` fp16 [in/128, out]: 0.5 + 0.5/128 + 2/128 bytes per weight.
# ASSUMPTION: the act-order ``g_idx`` (int32 per input feature, 4·in bytes per Linear, < 0.2 % of
# the layer for out >= 2048) is left out.
GPTQ_GROUP_SIZE = 128
GPTQ_BYTES_PER_PARAM = 0.5 + 0.5 / GPTQ_GROUP_SIZE + 2 / GPTQ_GROUP_SIZE
# AWQ (Lin et al. 2024) in AutoAWQ's GEMM layout: ``qweight`` int32 [in, out/8], ``qzeros`` int32
# [in/128, out/8], ``scales`` fp16 [in/128, out]: the same bytes per weight as GPTQ.
AWQ_BYTES_PER_PARAM = GPTQ_BYTES_PER_PARAM


def quant_bytes_per_param(quant_format):
    """Bytes per weight of a 4-bit frozen base (``st.QUANT_FORMATS``): GPTQ or AWQ at group size
    128 with their scales and zeros (constants above); NF4 packed only, its quant_state counted by
    ``nf4_quant_state_bytes`` (measured per tensor)."""
    q = np.asarray(quant_format)
    return np.where(q == st.GPTQ, GPTQ_BYTES_PER_PARAM, np.where(q == st.AWQ, AWQ_BYTES_PER_PARAM,
                                                                 NF4_PACKED_BYTES_PER_PARAM))


def quantized_base_bytes(c):
    """Bytes of a QLoRA base's 4-bit block Linear weights (0 for other methods): quantizable
    parameters × ``quant_bytes_per_param``, rounded up. NF4's quant_state is not in it
    (``nf4_quant_state_bytes``); biases, norms, embeddings and lm_head stay in a float dtype."""
    q = np.ceil(np.asarray(c.quantizable_params) * quant_bytes_per_param(c.quant_format))
    return np.where(np.asarray(c.method) == st.QLORA, q, 0).astype(np.int64)


def qlora_block_bytes_per_param(c, norm_bytes=2):
    """Mean bytes per block parameter of a QLoRA base as stored, gathered or loaded: 4-bit Linear
    weights (``quant_bytes_per_param``), the norms in ``norm_bytes`` (16-bit as loaded; the compute
    dtype once training, fp32 under fp32 precision after PEFT's ``prepare_model_for_kbit_training``,
    as ``model_states`` holds them) and the Linears' biases in 16-bit (bitsandbytes
    ``Linear4bit.forward`` casts them to the compute dtype, bf16). What one unit all-gathers or
    broadcasts is this × its parameters."""
    blocks = np.maximum(c.total_params - c.root_params, 1)
    quant = c.quantizable_params * quant_bytes_per_param(c.quant_format)
    norms = blocks - c.quantizable_params - c.quantized_bias_params
    return (quant + norm_bytes * norms + 2 * c.quantized_bias_params) / blocks


def trainable_params(c):
    """Parameters the optimizer updates: every parameter for a full fine-tune; only the adapters
    (``lora_params``, ``shardplan.inputs.model.lora_blocks_params`` + ``lora_root_params``) for LoRA
    and QLoRA, whose base is frozen (PEFT marks it ``requires_grad=False``)."""
    return np.where(np.asarray(c.method) == st.FULL, c.total_params, c.lora_params)


def trainable_fraction(c):
    """Trainable share of all parameters (1.0 for a full fine-tune): scales the per-unit gradient
    terms, whose units hold trainable and frozen parameters alike. ASSUMPTION: adapters spread over
    the blocks as the base parameters do."""
    return trainable_params(c) / c.total_params


def quant_replicated(c):
    """GPTQ/AWQ weights are int32 *buffers* (``qweight``, ``qzeros``, ``scales``), not float
    ``nn.Parameter``s, so FSDP and ZeRO-3 leave them whole on every rank (fms-acceleration#12,
    which has to re-register them as float parameters to shard them); bitsandbytes NF4 shards
    with a float ``quant_storage`` (bitsandbytes PR #970)."""
    return (np.asarray(c.method) == st.QLORA) & (np.asarray(c.quant_format) != st.NF4)


def param_storage_bytes_per_element(engine, precision):
    """Bytes per element of the persistent (sharded) parameter copy the engine stores.

    FSDP/DDP under mixed precision keep fp32 parameters; DeepSpeed keeps 16-bit ones (its fp32
    copy is the optimizer's master, counted in ``master_bytes_per_element``).
    """
    precision = np.asarray(precision)
    sixteen = (precision == st.BF16_PURE) | ((np.asarray(engine) == st.DEEPSPEED) & (precision != st.FP32))
    return np.where(sixteen, 2, 4)


def grad_bytes_per_element(engine, precision):
    """Persistent gradient dtype: fp32 for FSDP/DDP mixed and fp32; 16-bit for pure bf16 and DeepSpeed's
    16-bit gradient partition (its fp32 gradient partition is counted with the optimizer)."""
    return param_storage_bytes_per_element(engine, precision)


def master_bytes_per_element(engine, precision):
    """A separate fp32 master copy: DeepSpeed under 16-bit training (and its fp32 gradient
    partition, 4 more bytes), none elsewhere."""
    ds16 = (np.asarray(engine) == st.DEEPSPEED) & (np.asarray(precision) != st.FP32)
    return np.where(ds16, 8, 0)


def optimizer_bytes_per_element(optimizer, precision, hidden_size):
    """Optimizer state bytes per parameter, in the master dtype (fp32, or bf16 for pure bf16).

    AdamW: exp_avg + exp_avg_sq (Loshchilov & Hutter 2019); SGD with momentum and Lion: one
    buffer; 8-bit AdamW (bitsandbytes, Dettmers et al. 2022): two uint8 states + an fp32 absmax
    per 2048-element block each; Adafactor (Shazeer & Stern 2018) without first moment: a row
    and a column factor per matrix, ≈ 2/h of the matrix in fp32 (ASSUMPTION: square-ish h×h').
    """
    opt = np.asarray(optimizer)
    master = np.where(np.asarray(precision) == st.BF16_PURE, 2, 4)
    hidden = np.asarray(hidden_size, dtype=np.float64)
    return np.select(
        [opt == st.ADAMW, opt == st.SGD, opt == st.LION, opt == st.ADAMW_8BIT, opt == st.ADAFACTOR],
        [2.0 * master, 1.0 * master, 1.0 * master, 2.0 + 2 * 4 / 2048, master * 2.0 / hidden],
    )


def _floor(numerator, divisor):
    """floor(numerator / divisor) as int64; numerators stay below 2**53, so float64 is exact."""
    return np.floor(np.asarray(numerator, dtype=np.float64) / np.asarray(divisor)).astype(np.int64)


def zero_paper_model_state_bytes(params, world_size, stage, k=12):
    """ZeRO paper Fig. 1: per-GPU model states of mixed-precision Adam at stage 0–3 (K = 12)."""
    params = np.asarray(params, dtype=np.float64)
    n = np.asarray(world_size, dtype=np.float64)
    stage = np.asarray(stage)
    p_shard = np.where(stage >= 3, n, 1.0)
    g_shard = np.where(stage >= 2, n, 1.0)
    o_shard = np.where(stage >= 1, n, 1.0)
    return 2 * params / p_shard + 2 * params / g_shard + k * params / o_shard


# Distinct dim-0 sizes a model's tensors are summarised by for FSDP2's per-tensor padding: the
# ``pad_*`` columns of ``shardplan.inputs.config.Columns`` (described there) hold PAD_GROUPS groups.
PAD_GROUPS = 6
ADAM_STEP_BYTES = 4  # torch.optim.Adam/AdamW ``state["step"]``: one fp32 scalar tensor per parameter tensor


def padded_shard_elements(c, n, unit="model"):
    """Elements one rank holds of ``unit`` ("model", "root", "block") sharded over ``n`` ranks the
    FSDP2 way: each tensor's dim 0 is padded up to a multiple of n and split evenly, so a rank holds
    ceil(dim0 / n) rows of every tensor (torch ``_fully_shard/_fsdp_param.py``; measured:
    fsdp2_facts.json ``sharded_param_over_padded_total_fp32_div_W`` = 1, and the tiny W=64 runs
    where the k/v projections' 32 rows pad to 64). Rank 0 holds the largest shard; the harness
    reports it. The ``pad_*`` columns are described in ``shardplan.inputs.config`` (beside ``Columns``)."""
    n = np.maximum(np.asarray(n), 1)
    total = 0
    for k in range(PAD_GROUPS):
        dim0 = getattr(c, f"pad_dim0_{k}")
        cols = getattr(c, f"pad_{unit}_{k}")
        rows = -(-dim0 // n)
        total = total + np.where(dim0 > 0, rows * cols, -(-cols // n))
    return np.asarray(total, dtype=np.int64)


def padded_unit_elements(c, n, unit):
    """A unit's unsharded (all-gathered) elements, padding included: n × the per-rank shard."""
    return np.maximum(np.asarray(n), 1) * padded_shard_elements(c, n, unit)


def fsdp1_shard_elements(c, n, unit="model"):
    """Elements one rank holds of ``unit`` sharded over ``n`` ranks the FSDP1 way
    (``use_orig_params=False``): one ``FlatParameter`` per unit (root, each block), padded as a
    whole to a multiple of n (torch ``distributed/fsdp/_flat_param.py``
    ``FlatParamHandle._get_shard``): a rank holds ceil(P_unit / n) of each. ``unit``: "root",
    "block" (the largest block), "blocks" (every block) or "model" (root + blocks).
    ASSUMPTION for "blocks": every block holds the mean block size (exact for uniform blocks)."""
    n = np.maximum(np.asarray(n), 1)
    if unit == "block":
        return np.asarray(-(-c.unit_params // n)).astype(np.int64)
    root = -(-c.root_params // n)
    if unit == "root":
        return np.asarray(root).astype(np.int64)
    per_block = -(-(c.total_params - c.root_params) // np.maximum(c.num_layers, 1))
    blocks = c.num_layers * -(-per_block // n)
    return np.asarray({"blocks": blocks, "model": root + blocks}[unit]).astype(np.int64)


def fsdp1_unit_elements(c, n, unit):
    """A unit's unsharded FlatParameter elements, padding included: n × the per-rank shard."""
    return np.maximum(np.asarray(n), 1) * fsdp1_shard_elements(c, n, unit)


def optimizer_step_tensor_bytes(c, on_device=False):
    """Adam's per-tensor ``step`` (4 bytes each). torch keeps it on the CPU unless the optimizer is
    ``fused`` or ``capturable`` (``optim/adam.py`` ``_init_group``), so on CUDA it is host memory:
    counted only when ``on_device`` (the CPU harness, or fused/capturable Adam). Tensors the
    optimizer sees: FSDP2/DDP every parameter; FSDP1 (``use_orig_params=False``) one flat
    parameter per unit. LoRA/QLoRA adapters: 2 tensors per adapted Linear (not tracked; 0)."""
    fsdp1 = c.engine == st.FSDP1
    # LoRA/QLoRA: lora_A and lora_B of every adapted Linear (measured: 28 step scalars for 14
    # adapted Linears, hf_stack_cpu.jsonl)
    tensors = np.where(c.method == st.FULL, np.where(fsdp1, c.num_layers + 1, c.param_tensors),
                       2 * c.num_layers * c.lora_adapted_linears)
    adam = (c.optimizer == st.ADAMW) & (c.engine != st.DEEPSPEED)
    return np.where(adam & np.asarray(on_device), ADAM_STEP_BYTES * tensors, 0).astype(np.int64)


def hpz_secondary_param_bytes(c, trainable_bytes_16bit):
    """ZeRO++ hpZ (Wang et al. 2023, "ZeRO++", §3.2): a secondary copy of the 16-bit parameters,
    partitioned within the node-sized group, so backward all-gathers stay inside the node."""
    ds_hybrid = (c.engine == st.DEEPSPEED) & (c.strategy == st.HYBRID_SHARD)
    group = np.minimum(c.shard_group_size, c.world_size)
    return np.where(ds_hybrid, _floor(trainable_bytes_16bit, group), 0)


def params_offloaded(c):
    """Whether the sharded parameters live in host RAM: FSDP's ``CPUOffloadPolicy`` /
    ``CPUOffload(offload_params=True)`` moves them with the optimizer; DeepSpeed only with
    ``offload_param`` (ZeRO-3, "optimizer+params")."""
    ds = c.engine == st.DEEPSPEED
    fsdp = ~ds & (c.strategy != st.DDP) & (c.strategy != st.SINGLE)
    return (c.offload == st.OFFLOAD_ALL) | ((c.offload != st.OFFLOAD_NONE) & fsdp)


def model_states(c, optimizer_step_on_device=False):
    """Per-GPU bytes of params, grads, master copy and optimizer states, plus what is offloaded.

    Returns a dict of int64 arrays: ``params``, ``grads``, ``grad_buckets``, ``master_params``,
    ``optimizer_states`` (GPU) and ``host_offloaded`` (bytes this rank keeps in host RAM).
    """
    n_p, n_g, n_o = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    ds = c.engine == st.DEEPSPEED
    fsdp = ~ds & (c.strategy != st.DDP) & (c.strategy != st.SINGLE)
    peft = c.method != st.FULL

    trainable = trainable_params(c)
    frozen = np.where(peft, c.total_params, 0)
    # Frozen base: 16-bit (LoRA) or 4-bit for block Linears and 16-bit for the rest (QLoRA),
    # sharded like any float parameter (NF4 with a float ``bnb_4bit_quant_storage``; GPTQ/AWQ
    # buffers are not: ``quant_replicated``). The unquantized frozen weights are 16-bit, or fp32
    # under fp32 precision (a base loaded in fp32; for QLoRA, PEFT's ``prepare_model_for_kbit_training``
    # casting every non-4-bit parameter to fp32).
    qlora = c.method == st.QLORA
    w_frozen = np.where(np.asarray(c.precision) == st.FP32, 4, 2)
    quant_part = quantized_base_bytes(c)
    # bitsandbytes ``Linear4bit.forward`` casts its bias to the compute dtype in place
    # (``bias.data = bias.data.to(x.dtype)``), whatever it was loaded or prepared as: 16-bit here
    # (ASSUMPTION: ``bnb_4bit_compute_dtype`` bf16; measured: Qwen2 q/k/v biases, hf_stack_cpu).
    unquantized = c.total_params - c.quantizable_params - c.quantized_bias_params
    frozen_bytes = np.where(
        qlora, quant_part + w_frozen * unquantized + 2 * c.quantized_bias_params, w_frozen * frozen,
    ).astype(np.int64)
    # The quant_state (absmax, codes) is an attribute of each Params4bit / Linear4bit, not a
    # parameter: FSDP leaves it whole on every rank unless the quantization itself is sharded
    # (``quant_state_sharded``; bitsandbytes ``nn/modules.py`` ``fix_4bit_weight_quant_state_from_module``
    # restores it from the module after FSDP swaps the parameter; measured: hf_stack_cpu.jsonl).
    # (NF4 only: GPTQ/AWQ scales and zeros are inside ``quant_bytes_per_param``)
    quant_state = np.where(qlora & (np.asarray(c.quant_format) == st.NF4), c.quant_state_bytes, 0)
    quant_state = np.where(c.quant_state_sharded, _floor(quant_state, n_p), quant_state)

    ds_stage3 = ds & ((c.strategy == st.FULL_SHARD) | (c.strategy == st.HYBRID_SHARD))
    p_bytes = param_storage_bytes_per_element(c.engine, c.precision)
    # DeepSpeed stage 3 keeps no persistent 16-bit gradient partition (estimator: 18Ψ/N = 2 + 16).
    g_bytes = np.where(ds_stage3, 0, grad_bytes_per_element(c.engine, c.precision))
    m_bytes = master_bytes_per_element(c.engine, c.precision)
    o_bytes = optimizer_bytes_per_element(c.optimizer, c.precision, c.hidden_size)

    replicated = quant_replicated(c)
    frozen_held = np.where(replicated, _floor(frozen_bytes - quant_part, n_p) + quant_part, _floor(frozen_bytes, n_p))
    params = _floor(trainable * p_bytes, n_p) + frozen_held + quant_state
    grads = _floor(trainable * g_bytes, n_g)
    # FSDP shards per tensor (FSDP2) or per flat unit (FSDP1), padded: exact per-rank bytes.
    full_fsdp = fsdp & (c.method == st.FULL)
    fsdp1 = c.engine == st.FSDP1
    shard_p = np.where(fsdp1, fsdp1_shard_elements(c, n_p), padded_shard_elements(c, n_p))
    shard_g = np.where(fsdp1, fsdp1_shard_elements(c, n_g), padded_shard_elements(c, n_g))
    shard_o = np.where(fsdp1, fsdp1_shard_elements(c, n_o), padded_shard_elements(c, n_o))
    master = _floor(trainable * m_bytes, n_o)
    # States split the same way are floored once as a group, as DeepSpeed's estimators do
    # (int(18Ψ/N)); the optimizer term takes the remainder so the group total is exact.
    same_p = n_p == n_o
    same_g = n_g == n_o
    group_bytes = np.where(same_p, p_bytes, 0) + np.where(same_g, g_bytes, 0) + m_bytes + o_bytes
    group = _floor(trainable * group_bytes, n_o)
    optimizer = group - np.where(same_p, _floor(trainable * p_bytes, n_p), 0) - np.where(same_g, grads, 0) - master
    params = np.where(full_fsdp, shard_p * p_bytes, params) + hpz_secondary_param_bytes(c, 2 * trainable + frozen_bytes)
    grads = np.where(full_fsdp, shard_g * g_bytes, grads)
    optimizer = np.where(full_fsdp, np.ceil(shard_o * o_bytes).astype(np.int64), optimizer)
    optimizer = optimizer + optimizer_step_tensor_bytes(c, optimizer_step_on_device)
    grad_buckets = np.where((c.strategy == st.DDP) & ~ds, trainable * g_bytes, 0)

    # Offload: FSDP's CPUOffloadPolicy moves sharded params, grads and optimizer to the host;
    # DeepSpeed ZeRO-Offload moves the optimizer partition (with fp32 grads and master), and at
    # stage 3 optionally the 16-bit params (ZeRO-Infinity).
    off_opt = c.offload != st.OFFLOAD_NONE
    off_params = (c.offload == st.OFFLOAD_ALL) | (off_opt & fsdp)
    off_grads = off_opt & (fsdp | (ds & ~ds_stage3))
    host = (np.where(off_params, params, 0) + np.where(off_grads, grads, 0)
            + np.where(off_opt, master + optimizer, 0))
    return {
        "params": np.where(off_params, 0, params),
        "grads": np.where(off_grads, 0, grads),
        "grad_buckets": grad_buckets,
        "master_params": np.where(off_opt, 0, master),
        "optimizer_states": np.where(off_opt, 0, optimizer),
        "host_offloaded": host,
    }
