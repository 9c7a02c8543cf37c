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
  exactly (tests/test_model_states.py, ``test_deepspeed_estimators_reproduced_exactly``).

All functions broadcast over numpy arrays; codes come from ``shardplan.inputs.strategy``.
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.activations import compute_dtype_bytes
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st
from shardplan.inputs.engines import per_engine, per_precision, per_strategy

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
    return np.asarray(np.where(e > 0, blocks + 4 * nested + NF4_PER_TENSOR_BYTES * t, 0), dtype=np.int64)
# GPTQ (Frantar et al. 2022) as AutoGPTQ/GPTQModel/transformers store it at group size 128:
# ``qweight`` int32 [in/8, out] (4 bits per weight), ``qzeros`` int32 [in/128, out/8] (4 bits per
# group and output), ``scales`` fp16 [in/128, out]: 0.5 + 0.5/128 + 2/128 bytes per weight.
# ASSUMPTION: the act-order ``g_idx`` (int32 per input feature, 4·in bytes per Linear, < 0.2 % of
# the layer for out >= 2048) is left out.
GPTQ_GROUP_SIZE = 128
GPTQ_BYTES_PER_PARAM = 0.5 + 0.5 / GPTQ_GROUP_SIZE + 2 / GPTQ_GROUP_SIZE
# The part fms-acceleration's GPTQ plugin turns into float parameters (``qweight`` + ``qzeros``,
# accelerated-peft ``autogptq_utils.py`` ``PATCH_FOR_FSDP_TRITON_V2``): the fp16 ``scales`` stay buffers.
GPTQ_SHARDABLE_BYTES_PER_PARAM = 0.5 + 0.5 / GPTQ_GROUP_SIZE
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
    return np.asarray(np.where(np.asarray(c.method) == st.QLORA, q, 0), dtype=np.int64)


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


def quant_replicated_bytes(c, quant=None):
    """Bytes of a QLoRA base's 4-bit part (``quant``, default ``quantized_base_bytes``) that stay
    whole on every rank under FSDP / ZeRO-3.

    GPTQ/AWQ weights are int32 *buffers* (``qweight``, ``qzeros``, ``scales``), not float
    ``nn.Parameter``s, and FSDP and ZeRO-3 shard only parameters (fms-acceleration#12): the whole
    4-bit part (``quantized_base_bytes``) is on every rank. ``quant_buffers_sharded``:
    fms-acceleration's GPTQ plugin (accelerated-peft ``framework_plugin_autogptq.py``
    ``model_loader``, foundation-model-stack/fms-acceleration 876e2ed; unchanged since PR #15,
    2024-05) registers, when ``world_size > 1`` and ``ACCELERATE_USE_FSDP`` is true, a patch that
    replaces ``qweight`` and ``qzeros`` of every triton-v2 ``QuantLinear`` by
    ``nn.Parameter(attr.view(torch_dtype), requires_grad=False)`` "so FSDP can shard them"
    (``autogptq_utils.py`` ``PATCH_FOR_FSDP_TRITON_V2 = ["qweight", "qzeros"]``; viewed back to
    int32 before each kernel call), applied by ``ModelPatcher.patch`` before the Trainer wraps the
    model. The fp16 ``scales`` (2/128 B per weight) and ``g_idx`` stay buffers, whole on every
    rank. Only under FSDP: ZeRO-3 and DDP see buffers either way. bitsandbytes NF4 shards with a
    float ``quant_storage`` (bitsandbytes PR #970): 0 here (its quant_state is ``frozen_base``'s)."""
    quant = quantized_base_bytes(c) if quant is None else np.asarray(quant)
    fmt = np.asarray(c.quant_format)
    plugin = (np.asarray(c.quant_buffers_sharded, dtype=bool) & (fmt == st.GPTQ)
              & np.asarray(sharded_by_wrapper(c), dtype=bool))
    scales = np.asarray(np.ceil(quant * (1.0 - GPTQ_SHARDABLE_BYTES_PER_PARAM / GPTQ_BYTES_PER_PARAM)), dtype=np.int64)
    return np.asarray(np.where(fmt == st.NF4, 0, np.where(plugin, scales, quant)), dtype=np.int64)


def param_storage_bytes_per_element(engine, precision):
    """Bytes per element of the persistent (sharded) parameter copy the engine stores, as its
    declaration states it (``bytes_per_element.params``): FSDP/DDP under mixed precision keep fp32
    parameters; DeepSpeed keeps 16-bit ones (its fp32 copy is the optimizer's master, counted in
    ``master_bytes_per_element``)."""
    return per_precision("param_bytes", engine, precision)


def grad_bytes_per_element(engine, precision):
    """Persistent gradient dtype (``bytes_per_element.grads``): fp32 for FSDP/DDP mixed and fp32;
    16-bit for pure bf16 and DeepSpeed's 16-bit gradient partition."""
    return per_precision("grad_bytes", engine, precision)


def master_bytes_per_element(engine, precision):
    """A separate fp32 master copy and the fp32 gradient partition the optimizer steps on
    (``fp32_master`` + ``fp32_grad_partition``): DeepSpeed under 16-bit training 4 + 4, none for FSDP/DDP."""
    return per_precision("master_bytes", engine, precision) + per_precision("grad_partition_bytes", engine, precision)


def master_dtype_bytes(precision):
    """Bytes per element of the dtype the optimizer keeps its master weights and states in: fp32,
    or bf16 under pure bf16 (no fp32 copy anywhere; torch optimizers keep states in the param dtype)."""
    return np.where(np.asarray(precision) == st.BF16_PURE, 2, 4)


def optimizer_bytes_per_element(optimizer, precision, hidden_size, paged=False):
    """Optimizer state bytes per parameter, in the master dtype (``master_dtype_bytes``).

    AdamW: exp_avg + exp_avg_sq (Loshchilov & Hutter 2019); SGD with momentum and Lion: one
    buffer; SGD without momentum (``sgd-plain``): none (torch ``optim/sgd.py`` ``_init_group`` reads a
    ``momentum_buffer`` only when ``momentum != 0``, and the default is 0); 8-bit AdamW (bitsandbytes, Dettmers et al. 2022): two uint8 states + an fp32 absmax
    per 2048-element block each; Adafactor (Shazeer & Stern 2018) without first moment: a row
    and a column factor per matrix, ≈ 2/h of the matrix in fp32 (ASSUMPTION: square-ish h×h').
    ``paged`` (bitsandbytes' paged optimizers): a paged AdamW is bitsandbytes' 32-bit one
    (``PagedAdamW``, ``optim_bits=32``), whose ``Optimizer2State.init_state`` makes both states
    ``torch.float32`` whatever the parameter dtype (bitsandbytes ``optim/optimizer.py`` @0.43.1): 8 B.
    """
    opt = np.asarray(optimizer)
    master = master_dtype_bytes(precision)
    hidden = np.asarray(hidden_size, dtype=np.float64)
    adamw = np.where(np.asarray(paged, dtype=bool), 8.0, 2.0 * master)
    return np.select(
        [opt == st.ADAMW, opt == st.SGD, opt == st.LION, opt == st.ADAMW_8BIT, opt == st.ADAFACTOR, opt == st.SGD_PLAIN],
        [adamw, 1.0 * master, 1.0 * master, 2.0 + 2 * 4 / 2048, master * 2.0 / hidden, 0.0 * master],
    )


# Tensor passes of one unfused AdamW step with weight decay, each a read or a write of one
# master-dtype element per parameter (torch 2.x ``optim/adam.py``, non-capturable path; the same
# ops in ``_multi_tensor_adam`` as ``_foreach_*`` and in ``_single_tensor_adam`` per tensor):
# mul_(param, 1 - lr·wd) 2, lerp_(exp_avg, grad) 3, mul_(exp_avg_sq, β2) 2, addcmul_(exp_avg_sq,
# grad, grad) 3 (grad read once), sqrt(exp_avg_sq) 2, div_ 2, add_(eps) 2, addcdiv_(param,
# exp_avg, denom) 4. ASSUMPTION: weight decay on (torch AdamW's default 0.01; 18 passes without).
UNFUSED_ADAMW_PASSES = 2 + 3 + 2 + 3 + 2 + 2 + 2 + 4


def optimizer_step_bytes_per_element(optimizer, precision, hidden_size, impl=st.OPT_FUSED, paged=False):
    """HBM (or host DRAM) bytes one optimizer step moves per parameter, in the master dtype.

    Fused (one kernel: torch ``_fused_adamw_``, DeepSpeed ``FusedAdam``, the CPU optimizers): it
    reads and writes the master weights and every state (``optimizer_bytes_per_element``) and reads
    the gradient once: AdamW in fp32 2·(4 + 8) + 4 = 28 B. AdamW foreach or for-loop (``impl``):
    every op is its own pass (``UNFUSED_ADAMW_PASSES`` = 20: 80 B in fp32). ASSUMPTION: memory-bound;
    other optimizers are counted as fused under any ``impl`` (the knob picks AdamW's kernel). A
    ``paged`` (bitsandbytes) optimizer runs its own one kernel per parameter
    (``functional.optimizer_update_32bit`` / ``_8bit_blockwise`` @0.43.1), fused whatever ``impl`` says."""
    master = master_dtype_bytes(precision)
    fused = 2.0 * (master + optimizer_bytes_per_element(optimizer, precision, hidden_size, paged)) + master
    unfused = (np.asarray(optimizer) == st.ADAMW) & (np.asarray(impl) != st.OPT_FUSED) & ~np.asarray(paged, dtype=bool)
    return np.where(unfused, UNFUSED_ADAMW_PASSES * master, fused)


def _floor(numerator, divisor):
    """floor(numerator / divisor) as int64; numerators stay below 2**53, so float64 is exact."""
    return np.asarray(np.floor(np.asarray(numerator, dtype=np.float64) / np.asarray(divisor)), dtype=np.int64)


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
# ``pad_*`` columns of ``shardplan.formulas.columns.Columns`` (described there) hold PAD_GROUPS groups.
PAD_GROUPS = 6
# (dim-0 column, elements column) of each padding group, per unit
PAD_COLUMNS = {unit: tuple((f"pad_dim0_{k}", f"pad_{unit}_{k}") for k in range(PAD_GROUPS))
               for unit in ("model", "root", "block")}
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
    for dim0_name, unit_name in PAD_COLUMNS[unit]:
        dim0, cols = getattr(c, dim0_name), getattr(c, unit_name)
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
        return np.asarray(-(-c.unit_params // n), dtype=np.int64)
    root = -(-c.root_params // n)
    if unit == "root":
        return np.asarray(root, dtype=np.int64)
    per_block = -(-(c.total_params - c.root_params) // np.maximum(c.num_layers, 1))
    blocks = c.num_layers * -(-per_block // n)
    return np.asarray({"blocks": blocks, "model": root + blocks}[unit], dtype=np.int64)


def fsdp1_unit_elements(c, n, unit):
    """A unit's unsharded FlatParameter elements, padding included: n × the per-rank shard."""
    return np.maximum(np.asarray(n), 1) * fsdp1_shard_elements(c, n, unit)


def optimizer_step_tensor_bytes(c, on_device=False):
    """Adam's per-tensor ``step`` (4 bytes each). torch keeps it on the CPU unless the optimizer is
    ``fused`` or ``capturable`` (``optim/adam.py`` ``_init_group``), so on CUDA it is host memory:
    counted only when ``on_device`` (the CPU harness, or fused/capturable Adam). Tensors the
    optimizer sees, as the engine declares them (``optimizer_step_tensors``): every parameter
    (FSDP2/DDP), one flat parameter per unit (FSDP1, ``use_orig_params=False``), or none counted
    (DeepSpeed's flat partitions). LoRA/QLoRA: lora_A and lora_B of every adapted Linear."""
    kind = per_engine("step_tensors", c.engine)
    # LoRA/QLoRA: lora_A and lora_B of every adapted Linear (measured: 28 step scalars for 14
    # adapted Linears, hf_stack_cpu.jsonl)
    tensors = np.where(c.method == st.FULL, np.where(kind == 1, c.num_layers + 1, c.param_tensors),
                       2 * c.num_layers * c.lora_adapted_linears)
    adam = (c.optimizer == st.ADAMW) & (kind != 2)
    return np.asarray(np.where(adam & np.asarray(on_device), ADAM_STEP_BYTES * tensors, 0), dtype=np.int64)


def hpz_secondary_param_bytes(c, trainable_bytes_16bit):
    """ZeRO++ hpZ (Wang et al. 2023, "ZeRO++", §3.2): a secondary copy of the 16-bit parameters,
    partitioned within the node-sized group, so backward all-gathers stay inside the node (where
    the engine declares ``secondary_param_partition`` for the strategy)."""
    secondary = per_strategy("secondary_param_partition", c.engine, c.strategy)
    group = np.minimum(c.shard_group_size, c.world_size)
    return np.where(secondary, _floor(trainable_bytes_16bit, group), 0)


def sharded_by_wrapper(c):
    """Whether FSDP does the work for the row's (engine, strategy) (not torch DDP, not unwrapped)."""
    return eng.wrapper_is(eng.W_FSDP, c.engine, c.strategy)


def params_offloaded(c):
    """Whether the sharded parameters live in host RAM: FSDP's ``CPUOffloadPolicy`` /
    ``CPUOffload(offload_params=True)`` moves them with the optimizer (``offload_moves_params``);
    DeepSpeed only with ``offload_param`` (ZeRO-3, "optimizer+params")."""
    moves = per_engine("offload_moves_params", c.engine) & sharded_by_wrapper(c)
    return (c.offload == st.OFFLOAD_ALL) | ((c.offload != st.OFFLOAD_NONE) & moves)


def frozen_base(c):
    """(bytes of the frozen base, its 4-bit part, its quant_state) before sharding.

    Frozen base: 16-bit (LoRA) or 4-bit for block Linears and 16-bit for the rest (QLoRA), sharded
    like any float parameter (NF4 with a float ``bnb_4bit_quant_storage``; GPTQ/AWQ buffers are
    not: ``quant_replicated_bytes``). The unquantized frozen weights are 16-bit, or fp32 under fp32
    precision (a base loaded in fp32; for QLoRA, PEFT's ``prepare_model_for_kbit_training``
    casting every non-4-bit parameter to fp32). bitsandbytes ``Linear4bit.forward`` casts its bias
    to the compute dtype in place, whatever it was loaded as: 16-bit here (ASSUMPTION:
    ``bnb_4bit_compute_dtype`` bf16; measured: Qwen2 q/k/v biases, hf_stack_cpu). The NF4
    quant_state (absmax, codes) is an attribute of each Params4bit, not a parameter (bitsandbytes
    ``nn/modules.py`` ``fix_4bit_weight_quant_state_from_module``); GPTQ/AWQ scales are inside
    ``quant_bytes_per_param``. ``quant_head`` (Lightning Fabric's ``BitsandbytesPrecision``
    replaces every ``torch.nn.Linear``, LitGPT's lm_head included: ``_convert_layers`` /
    ``module_init_context``): the V·h head is 4-bit too, with its own quant_state."""
    peft = c.method != st.FULL
    frozen = np.where(peft, c.total_params, 0)
    qlora = c.method == st.QLORA
    w_frozen = compute_dtype_bytes(c.precision)
    head = np.where(qlora & np.asarray(c.quant_head, dtype=bool), c.vocab_size * c.hidden_size, 0)
    nf4 = np.asarray(c.quant_format) == st.NF4
    quant_part = quantized_base_bytes(c) + np.asarray(np.ceil(head * quant_bytes_per_param(c.quant_format)), dtype=np.int64)
    unquantized = c.total_params - c.quantizable_params - c.quantized_bias_params - head
    frozen_bytes = np.asarray(np.where(
        qlora, quant_part + w_frozen * unquantized + 2 * c.quantized_bias_params, w_frozen * frozen,
    ), dtype=np.int64)
    quant_state = np.where(qlora & nf4, c.quant_state_bytes + np.where(head > 0, nf4_quant_state_bytes(head, 1), 0), 0)
    return frozen_bytes, quant_part, quant_state


def state_bytes_per_element(c):
    """(params, grads, master, optimizer) bytes per trainable element the engine keeps. Engines
    that keep no persistent gradient partition for the strategy (DeepSpeed stage 3, estimator:
    18Ψ/N = 2 + 16) hold 0 gradient bytes."""
    g_bytes = np.where(per_strategy("keeps_grads", c.engine, c.strategy), grad_bytes_per_element(c.engine, c.precision), 0)
    return (param_storage_bytes_per_element(c.engine, c.precision), g_bytes,
            master_bytes_per_element(c.engine, c.precision),
            optimizer_bytes_per_element(c.optimizer, c.precision, c.hidden_size, c.paged_optimizer))


def _zero_partitioned_states(c, trainable, degrees, per_element):
    """(params, grads, master, optimizer) of the trainable weights split evenly over each state's
    shard degree. States split the same way are floored once as a group, as DeepSpeed's
    estimators do (int(18Ψ/N)); the optimizer term takes the remainder so the group total is exact."""
    n_p, n_g, n_o = degrees
    p_bytes, g_bytes, m_bytes, o_bytes = per_element
    grads = _floor(trainable * g_bytes, n_g)
    master = _floor(trainable * m_bytes, n_o)
    same_p = n_p == n_o
    same_g = n_g == n_o
    group = _floor(trainable * (np.where(same_p, p_bytes, 0) + np.where(same_g, g_bytes, 0) + m_bytes + o_bytes), n_o)
    optimizer = group - np.where(same_p, _floor(trainable * p_bytes, n_p), 0) - np.where(same_g, grads, 0) - master
    return _floor(trainable * p_bytes, n_p), grads, master, optimizer


def _fsdp_shard_elements(c, n):
    """Elements one rank holds of the model sharded over ``n``: per tensor (FSDP2) or per flat unit (FSDP1)."""
    return np.where(eng.layout_is(eng.FLAT_UNIT, c.engine), fsdp1_shard_elements(c, n), padded_shard_elements(c, n))


def _held_states(c, optimizer_step_on_device):
    """Per-GPU (params, grads, master, optimizer, grad_buckets) before offload (``model_states``)."""
    degrees = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    n_p, n_g, n_o = degrees
    trainable = trainable_params(c)
    frozen_bytes, quant_part, quant_state = frozen_base(c)
    # the quant_state is whole on every rank unless the quantization itself is sharded
    quant_state = np.where(c.quant_state_sharded, _floor(quant_state, n_p), quant_state)
    per_element = state_bytes_per_element(c)
    p_bytes, g_bytes, _, o_bytes = per_element
    # the part FSDP cannot shard (GPTQ/AWQ buffers) is whole on every rank
    whole = quant_replicated_bytes(c, quant_part)
    frozen_held = _floor(frozen_bytes - whole, n_p) + whole
    params, grads, master, optimizer = _zero_partitioned_states(c, trainable, degrees, per_element)
    params = params + frozen_held + quant_state
    # FSDP shards per tensor (FSDP2) or per flat unit (FSDP1), padded: exact per-rank bytes.
    full_fsdp = sharded_by_wrapper(c) & (c.method == st.FULL)
    params = np.where(full_fsdp, _fsdp_shard_elements(c, n_p) * p_bytes, params)
    params = params + hpz_secondary_param_bytes(c, 2 * trainable + frozen_bytes)
    grads = np.where(full_fsdp, _fsdp_shard_elements(c, n_g) * g_bytes, grads)
    optimizer = np.where(full_fsdp, np.asarray(np.ceil(_fsdp_shard_elements(c, n_o) * o_bytes), dtype=np.int64), optimizer)
    # fused AdamW keeps each ``step`` on the parameter's device (``_init_group``)
    on_device = np.asarray(optimizer_step_on_device) | (c.optimizer_impl == st.OPT_FUSED)
    optimizer = optimizer + optimizer_step_tensor_bytes(c, on_device)
    # torch DDP's gradient buckets: a second copy of the gradients (DDP docstring, gradient_as_bucket_view)
    grad_buckets = np.where(eng.wrapper_is(eng.W_DDP, c.engine, c.strategy), trainable * g_bytes, 0)
    return params, grads, master, optimizer, grad_buckets


def model_states(c, optimizer_step_on_device=False):
    """Per-GPU bytes of params, grads, master copy and optimizer states, plus what is offloaded.

    Returns a dict of int64 arrays: ``params``, ``grads``, ``grad_buckets``, ``master_params``,
    ``optimizer_states`` (GPU) and ``host_offloaded`` (bytes this rank keeps in host RAM).
    Offload: FSDP's CPUOffloadPolicy moves sharded params, grads and optimizer to the host;
    DeepSpeed ZeRO-Offload moves the optimizer partition (with fp32 grads and master) and its
    16-bit gradient partition, and at stage 3 optionally the 16-bit params (ZeRO-Infinity).
    """
    params, grads, master, optimizer, grad_buckets = _held_states(c, optimizer_step_on_device)
    off_opt = c.offload != st.OFFLOAD_NONE
    off_params = params_offloaded(c)
    off_grads = off_opt & np.logical_not(eng.wrapper_is(eng.W_DDP, c.engine, c.strategy)) & np.logical_not(eng.wrapper_is(eng.W_NONE, c.engine, c.strategy))
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
