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
through its Linears.
"""

from __future__ import annotations

import numpy as np

from shardplan.formulas.activations import checkpointed_layers
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
    ckpt = checkpointed_share(c)
    forward = STEP_FORWARD + layers * (fwd - ckpt * (LAYER_FORWARD - LAYER_FORWARD_CHECKPOINTED))
    hooks = layers * ckpt * ~np.asarray(c.reentrant_checkpointing, dtype=bool) * saved
    return forward, STEP_BACKWARD + layers * (bwd + ckpt * rec), optimizer_operations(c), hooks


def checkpointed_share(c):
    return np.where(c.ac == st.AC_NONE, 0.0, checkpointed_layers(c) / np.maximum(c.num_layers, 1))


def step_operations(c):
    """(forward, backward, optimizer) host operations: ``step_launches`` plus, under non-reentrant
    checkpointing, one pack hook per saved tensor in forward and an unpack + a recomputation pack
    in backward (reentrant checkpointing runs the forward under no_grad: nothing saved, no hooks)."""
    forward, backward, optimizer, hooks = _launches_and_hooks(c)
    return forward + hooks, backward + 2 * hooks, optimizer


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
