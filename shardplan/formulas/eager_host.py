"""Host time of an eager Hugging Face training step: the operators the Python side dispatches,
each a kernel launch (or a checkpoint hook call), times one per-operation host cost (issue 23
item 2). A step whose GPU work is short waits on the host: the tokens-per-step series of the GPU
runs (data/calibration/gpu/userscripts/train.jsonl) keeps ~0.15 s (full), ~0.25 s (LoRA + HF
checkpointing) and ~0.28 s (QLoRA) for 16 layers from 512 to 4096 tokens.

Counts (``shardplan.calibrate.kernel_launches``: aten operators under a ``TorchDispatchMode`` over a
tiny ``LlamaForCausalLM`` with the same modules, the per-layer count = 3 layers − 2 layers;
transformers 5.24 ``models/llama/modeling_llama.py``, peft 0.21.2 ``tuners/lora/layer.py``,
bitsandbytes 0.50.2, torch 2.13 ``optim/adam.py`` / ``nn/utils/clip_grad.py``; the GPU runs used
transformers 5.17, peft 0.21.0, bitsandbytes 0.50.2, torch 2.11):

* a decoder layer (bf16 autocast, SDPA): forward 50 (48 inside a checkpointed layer; 14 of them
  the 7 Linears' weight cast + mm), backward 89 with trainable weights, 71 with a frozen base (no
  weight-gradient mm and its cast);
  HF gradient checkpointing recomputes the layer's forward in backward (44 more);
* PEFT LoRA per adapted Linear (dropout, one ``native_dropout`` kernel on CUDA; lora_A and
  lora_B's input/weight casts + mm; ``* scaling``; the add): 8 forward, 10 backward, 8 recomputed;
* bitsandbytes ``Linear4bit`` (QLoRA after ``prepare_model_for_kbit_training``), per Llama layer
  of 7: 22 forward (the CUDA fallback ``_dequant_linear_fallback``: nested absmax dequantize + add,
  ``dequantize_4bit``, ``F.linear``, and the fp32<->bf16 casts), 32 backward (the input gradient
  dequantizes again), 16 recomputed;
* non-reentrant checkpointing calls a Python pack hook for every tensor the layer saves in
  forward and, in backward, an unpack hook and the recomputation's pack hook for each
  (torch ``utils/checkpoint.py`` ``_checkpoint_hook``, ``_recomputation_hook``): a layer saves 38
  tensors (trainable), 29 (frozen base), 22 (frozen 4-bit base), +5 per adapted Linear;
* per step: embedding, rotary tables, masks, loss: 31 forward; loss backward, embedding gradient
  and Trainer's ``clip_grad_norm_`` (``_foreach_norm``, stack, norm, clamp, ``_foreach_mul_``) 32;
* the optimizer (torch ``optim/adam.py``): fused one ``_fused_adamw_`` launch per chunk of 36
  tensors (``multi_tensor_apply`` depth 4) and one ``_foreach_add_`` for the steps; foreach 9
  ``_foreach_*`` ops per chunk; for-loop 9 ops per tensor.

Overlap: CUDA launches are asynchronous, so within a phase the GPU runs behind the host and the
phase takes max(host, GPU); the GPU runs measured it that way (``benchmarks/gpu_userscripts.py``
synchronises at each phase mark), and a phase ends in a host wait in real loops too (the loss
``.item()`` Trainer logs, the optimizer step's dependence on the gradients). A large-batch step's
GPU work hides the host: the term vanishes above the crossover.
ASSUMPTION: only the ``hf`` stack (its module code was counted); torchtitan, torchtune and Lightning
run their own modules, and a compiled model launches fused kernels; their host time is not modelled.
ASSUMPTION: a dense MLP; an MoE layer's expert loop (routing, index ops per expert) is counted only
through its Linears here; its per-expert host syncs, which stop the host running ahead, and each
expert's own operations are priced by ``moe_sync``.

FSDP1 (``fsdp1_operations``; counted by ``shardplan.calibrate.fsdp1_launches``: the same tiny Llama
under FSDP1 with ``use_orig_params`` on a fake process group, minus the unwrapped model): per unit
a pre- and a post-forward hook and, sharded, one all-gather; in backward a pre-backward and a
post-backward (or reshard-only) hook, the re-gather of a resharded unit, and per trainable unit the
gradient pre-division + reduce-scatter (all-reduce under NO_SHARD, which FSDP1 runs at world size 1);
the adapter units inside a checkpointed layer are gathered again, with their two hooks, by the
recompute. Units: the decoder layers + the root, and under PEFT every ``lora_A`` / ``lora_B`` Linear
(transformers ``Trainer`` → ``update_fsdp_plugin_peft`` → peft ``fsdp_auto_wrap_policy``; in the
fms-acceleration rows fms-hf-tuning v2.5.0 ``sft_trainer.py`` sets the same policy). Each hook call
is one host operation, like a checkpoint hook.
ASSUMPTION: FSDP1's Python per hook is priced as one operation here; timed on the CPU, a hook costs
more than an aten operator does (docs/throughput.md), so this is a floor. What a sharded unit's
unshard + reshard costs beyond it was measured on an H100 (``fsdp1_limiter.UNIT_SHARDED_HOST_S``) and
is priced there. FSDP2 is not counted here.
FSDP1's rate limiter (``limit_all_gathers``) is not in this per-phase max: ``fsdp1_limiter`` prices
it (each ``_unshard`` blocks the host on the free event of the reshard two reshards back, torch 2.4.1
``_runtime_utils._unshard``; under PEFT's per-adapter units a layer's host cannot run more than one
adapted Linear ahead), with a measured host price per sharded unit on top of the counted operations
here, and ``throughput.micro_batches_s`` takes the larger of the two.

FSDP1's gradient clipping (``fsdp1_clip_operations``): the Trainer's ``accelerator.clip_grad_norm_``
hands an FSDP1 model to ``FullyShardedDataParallel.clip_grad_norm_`` (accelerate 1.0.1
``accelerator.py``), which loops over the rank's local gradients one by one (torch
``distributed/fsdp/fully_sharded_data_parallel.py`` ``_get_grad_norm``: a ``vector_norm`` per
gradient; then ``grad.mul_(clip_coef_clamped.to(grad.device, grad.dtype))`` per gradient): 3
operations per local gradient where the unwrapped clip is a few ``_foreach`` launches (in
``STEP_BACKWARD``). It runs after the host has waited for backward (transformers 4.48.1
``trainer.py``: ``torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)`` reads the loss on the
host every micro-batch), so it is counted with the optimizer step. Local gradients: every adapter
tensor under PEFT (each ``lora_A``/``lora_B`` is a unit of its own, split over all ranks); for a
full fine-tune the tensors of the rank's shard of each unit's flat parameter, about T/N plus one
straddling a shard boundary per unit (counted: ``tests/test_fsdp1_host.py``).
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.activations import recompute_fraction
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st

# Launch counts per decoder layer (see the module docstring for each).
LAYER_FORWARD = 50
LAYER_FORWARD_CHECKPOINTED = 48
LAYER_BACKWARD_TRAINABLE, LAYER_BACKWARD_FROZEN = 89, 71
LAYER_RECOMPUTE = 44
LORA_FORWARD, LORA_BACKWARD, LORA_RECOMPUTE = 8, 10, 8
QUANT4_FORWARD, QUANT4_BACKWARD, QUANT4_RECOMPUTE = 22, 32, 16  # per Llama layer of 7 Linears
LLAMA_LINEARS = 7
SAVED_TRAINABLE, SAVED_FROZEN, SAVED_FROZEN_4BIT, SAVED_PER_ADAPTER = 38, 29, 22, 5
STEP_FORWARD, STEP_BACKWARD = 31, 32
# FSDP1 per unit: hooks in forward and in backward, the all-gather of a sharded unit, and the
# gradient pre-division + reduce-scatter of a trainable one; the root's backward: one hook, and its
# reduction (2 operations + 2 hooks) when it holds trainable parameters (the full fine-tune)
FSDP1_HOOKS_FORWARD, FSDP1_HOOKS_BACKWARD, FSDP1_GATHER, FSDP1_REDUCE = 2, 2, 1, 2
FSDP1_ROOT_BACKWARD, FSDP1_ROOT_REDUCE = 1, 4
FSDP1_CLIP_PER_GRAD = 3  # vector_norm, the coefficient's .to, mul_ (FSDP1 clip_grad_norm_)
ADAM_TENSORS_PER_LAUNCH = 36  # torch ``MultiTensorApply.cuh`` depth_to_max_tensors[3] (depth 4)
ADAM_OPS = 9  # _foreach_add_(steps), mul_(decay), lerp_, mul_, addcmul_, sqrt, div_, add_, addcdiv_
# Host seconds per dispatched operation, fitted on the train split of the GPU runs only
# (``python -m shardplan.calibrate.host_fit``: the value minimising the median |log error| of the
# measured step times, H100 host, Python 3.12); judged on the held-out third (docs/accuracy.md).
HOST_OP_S = 31.5e-6


def layer_operations(c):
    """(forward, backward, recompute, saved tensors) operations of one decoder layer of ``c``."""
    frozen = c.method != st.FULL
    quant4 = (c.method == st.QLORA) * np.asarray(c.quantized_tensors, dtype=np.float64) / np.maximum(c.num_layers, 1)
    adapters = np.where(frozen, np.asarray(c.lora_adapted_linears, dtype=np.float64), 0.0)
    q = quant4 / LLAMA_LINEARS
    forward = LAYER_FORWARD + LORA_FORWARD * adapters + QUANT4_FORWARD * q
    backward = np.where(frozen, LAYER_BACKWARD_FROZEN, LAYER_BACKWARD_TRAINABLE) + LORA_BACKWARD * adapters \
        + QUANT4_BACKWARD * q
    recompute = LAYER_RECOMPUTE + LORA_RECOMPUTE * adapters + QUANT4_RECOMPUTE * q
    base = np.where(c.method == st.QLORA, SAVED_FROZEN_4BIT, np.where(frozen, SAVED_FROZEN, SAVED_TRAINABLE))
    return forward, backward, recompute, base + SAVED_PER_ADAPTER * adapters


def step_launches(c):
    """(forward, backward, optimizer) kernel launches of one micro-batch's forward and backward and
    of the optimizer step; checkpointed layers recompute their forward in backward."""
    return _launches_and_hooks(c)[:3]


def _launches_and_hooks(c):
    # the layer counts and the checkpointed share, worked out once for both the launches and the
    # checkpoint hooks (a sweep evaluates this over every row)
    layers = np.asarray(c.num_layers, dtype=np.float64)
    fwd, bwd, rec, saved = layer_operations(c)
    ckpt = recompute_fraction(c)
    forward = STEP_FORWARD + layers * (fwd - ckpt * (LAYER_FORWARD - LAYER_FORWARD_CHECKPOINTED))
    hooks = layers * ckpt * ~np.asarray(c.reentrant_checkpointing, dtype=bool) * saved
    return forward, STEP_BACKWARD + layers * (bwd + ckpt * rec), optimizer_operations(c), hooks


def step_operations(c):
    """(forward, backward, optimizer) host operations: ``step_launches`` plus, under non-reentrant
    checkpointing, one pack hook per saved tensor in forward and an unpack + a recomputation pack
    in backward (reentrant checkpointing runs the forward under no_grad: nothing saved, no hooks)."""
    forward, backward, optimizer, hooks = _launches_and_hooks(c)
    fsdp_f, fsdp_b = fsdp1_operations(c)
    return forward + hooks + fsdp_f, backward + 2 * hooks + fsdp_b, optimizer + fsdp1_clip_operations(c)


def fsdp1_operations(c):
    """(forward, backward) host operations FSDP1 adds to a micro-batch (module docstring): units =
    L·(1 + 2·adapted Linears) + 1 under PEFT, L + 1 for a full fine-tune; 0 for other engines."""
    layers = np.asarray(c.num_layers, dtype=np.float64)
    full = np.asarray(c.method) == st.FULL
    leaves = np.where(full, 0.0, 2.0 * np.asarray(c.lora_adapted_linears, dtype=np.float64))
    layer_units = layers * (1 + leaves)
    sharded = (np.asarray(c.strategy) != st.NO_SHARD) & (np.asarray(c.world_size) > 1)
    gather = FSDP1_GATHER * sharded
    forward = (layer_units + 1) * (FSDP1_HOOKS_FORWARD + gather)
    trainable = np.where(full, layers, layers * leaves)
    recompute = recompute_fraction(c) * layers * leaves * (FSDP1_HOOKS_FORWARD + gather)
    backward = layer_units * (FSDP1_HOOKS_BACKWARD + gather) + FSDP1_REDUCE * trainable + recompute \
        + FSDP1_ROOT_BACKWARD + FSDP1_ROOT_REDUCE * full
    on = np.asarray(c.engine) == st.FSDP1
    return np.where(on, forward, 0.0), np.where(on, backward, 0.0)


def fsdp1_clip_operations(c):
    """Host operations of FSDP1's ``clip_grad_norm_`` (module docstring): 3 per local gradient; local
    gradients = the 2·L·(adapted Linears) adapter tensors under PEFT, min(T, T/N + units) for a full
    fine-tune (T parameter tensors, N the shard degree); 0 for other engines."""
    layers = np.asarray(c.num_layers, dtype=np.float64)
    full = np.asarray(c.method) == st.FULL
    n_p = np.maximum(st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)[0], 1)
    tensors = np.asarray(c.param_tensors, dtype=np.float64)
    local = np.where(full, np.minimum(tensors, tensors / n_p + layers + 1),
                     2.0 * np.asarray(c.lora_adapted_linears, dtype=np.float64) * layers)
    on = (np.asarray(c.engine) == st.FSDP1) & eng.wrapper_is(eng.W_FSDP, c.engine, c.strategy)
    return np.where(on, FSDP1_CLIP_PER_GRAD * local, 0.0)


def optimizer_operations(c):
    """Launches of one AdamW step over the trainable tensors (PEFT: lora_A and lora_B per adapted
    Linear), by ``optimizer_impl``."""
    tensors = np.where(c.method == st.FULL, np.asarray(c.param_tensors, dtype=np.float64),
                       2.0 * np.asarray(c.lora_adapted_linears, dtype=np.float64) * c.num_layers)
    chunks = np.ceil(tensors / ADAM_TENSORS_PER_LAUNCH)
    return np.select([c.optimizer_impl == st.OPT_FUSED, c.optimizer_impl == st.OPT_FOREACH],
                     [chunks + 1, ADAM_OPS * chunks], ADAM_OPS * tensors)


def host_phase_s(c, host_op_s=None):
    """(forward, backward, optimizer) host seconds of the ``hf`` stack's eager step (0 elsewhere)."""
    cost = HOST_OP_S if host_op_s is None else host_op_s
    eager = np.asarray(c.stack) == st.HF
    return tuple(np.where(eager, ops * cost, 0.0) for ops in step_operations(c))
