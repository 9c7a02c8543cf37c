"""The knobs' names: every categorical knob is an index into a tuple of names, so formulas can take
numpy integer arrays and branch with ``np.where`` (docs/formulas.md: every formula broadcasts).
``*_names`` tuples are the only place the spelling lives.

This is the bottom of ``inputs/``: it imports no other module of it, so the engine and stack
declarations (``engines.py``, ``stack_files.py``) and the vocabulary can validate against these
names, and ``strategy.py`` (what the names mean: aliases, per-engine tables) sits above them all.
Only the engine names are read from data, from the declarations' ``name`` and ``code`` alone.
"""

from __future__ import annotations

import json
from pathlib import Path

ENGINE_DIR = Path(__file__).parents[1] / "data" / "engine_profiles"


def engine_names() -> tuple[str, ...]:
    """The engine names in code order, read from the declarations' ``name`` and ``code`` only
    (``ENGINES``; read before the declarations are validated, which needs the other names)."""
    heads = [json.loads(p.read_text()) for p in ENGINE_DIR.glob("*.json")]
    return tuple(h["name"] for h in sorted(heads, key=lambda h: h["code"]))


# ``single``: one GPU, no wrapper (no DDP/FSDP/DeepSpeed): full states on the GPU, no sharding
# buffers and no NCCL communicator. Appended last so the other codes keep their values.
STRATEGIES = ("ddp", "no_shard", "zero1", "zero2", "shard_grad_op", "full_shard", "hybrid_shard", "hybrid_shard_zero2",
              "single")
DDP, NO_SHARD, ZERO1, ZERO2, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, SINGLE = range(len(STRATEGIES))

# The engines are declared as data (shardplan/inputs/engines.py, data/engine_profiles/*.json); their
# names come in the declared code order, so existing codes keep their values.
ENGINES = engine_names()
FSDP2, FSDP1, DEEPSPEED = (ENGINES.index(n) for n in ("fsdp2", "fsdp1", "deepspeed"))

PRECISIONS = ("bf16-mixed", "fp16-mixed", "bf16-pure", "fp32")
BF16_MIXED, FP16_MIXED, BF16_PURE, FP32 = range(len(PRECISIONS))

# sgd: with momentum (one buffer); sgd-plain: torch.optim.SGD's default momentum=0, no state
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adamw-8bit", "lion", "sgd-plain")
ADAMW, SGD, ADAFACTOR, ADAMW_8BIT, LION, SGD_PLAIN = range(len(OPTIMIZERS))

AC_MODES = ("none", "full", "selective", "every-k", "selective-op")
# selective: every matmul and attention-kernel output saved (the policy ``shardplan export`` writes);
# selective-op: torchtitan's op-level SAC, every second matmul output recomputed (activations.py)
AC_NONE, AC_FULL, AC_SELECTIVE, AC_EVERY_K, AC_SELECTIVE_OP = range(len(AC_MODES))

OFFLOADS = ("none", "optimizer", "optimizer+params")
OFFLOAD_NONE, OFFLOAD_OPTIMIZER, OFFLOAD_ALL = range(len(OFFLOADS))

METHODS = ("full", "lora", "qlora")
FULL, LORA, QLORA = range(len(METHODS))

# "triton": the Triton FlashAttention kernel of FlashAttention-1's design (flash-attn 1.0's
# ``flash_attn_triton``, copied into llm-foundry, whose ``attn_impl: triton`` runs it): SDPA's
# flash memory, its own speed (``throughput.TRITON_OVER_FLASH2``).
ATTENTIONS = ("sdpa", "eager", "triton")
SDPA, EAGER, TRITON = range(len(ATTENTIONS))

# The training stack whose code surrounds the engine (shardplan/inputs/stacks.py, data/stack_profiles/).
STACKS = ("hf", "torchtitan", "torchtune", "lightning", "plain")
HF, TORCHTITAN, TORCHTUNE, LIGHTNING, PLAIN = range(len(STACKS))

# 4-bit storage of a quantized frozen base (model_states.quant_bytes_per_param).
QUANT_FORMATS = ("nf4", "gptq", "awq")
NF4, GPTQ, AWQ = range(len(QUANT_FORMATS))

# How the weights reach the GPUs before training (memory.load_peak_bytes).
LOAD_MODES = ("full_per_gpu", "rank0_broadcast", "meta_init")
LOAD_FULL_PER_GPU, LOAD_RANK0_BROADCAST, LOAD_META_INIT = range(len(LOAD_MODES))

# How a stack's code rotates q and k (throughput.elementwise_bytes_per_token): torchtitan's complex
# multiply, Transformers' rotate_half + cat, torchtune's fp32 pairs, foundation-model-stack's 2x2 matrix.
ROPE_FORMS = ("complex", "rotate_half", "pairs_fp32", "matrix")
ROPE_COMPLEX, ROPE_ROTATE_HALF, ROPE_PAIRS_FP32, ROPE_MATRIX = range(len(ROPE_FORMS))

# How the AdamW step runs on the GPU (torch.optim.AdamW fused= / foreach=; torchtitan's
# ``optimizer.implementation``): model_states.optimizer_step_bytes_per_element, buffers.optimizer_step_temporaries.
OPTIMIZER_IMPLS = ("fused", "foreach", "for_loop")
OPT_FUSED, OPT_FOREACH, OPT_FOR_LOOP = range(len(OPTIMIZER_IMPLS))

# PEFT LoRA targets as the stacks name them (model.lora_params_per_block / lora_root_params):
# q,v (PEFT's default for Llama, torchtune ``lora_attn_modules=['q_proj','v_proj']``), every
# attention projection, every Linear of the blocks (PEFT ``target_modules="all-linear"``, which
# leaves the output layer out), and all of them plus the embedding and lm_head (PEFT
# ``target_modules`` naming ``embed_tokens``/``lm_head``; torchtune ``apply_lora_to_output``).
LORA_TARGETS = ("qv", "attention", "all-linear", "all-linear+embeddings")

# Gradient reduction dtype (FSDP ``MixedPrecision``/``MixedPrecisionPolicy(reduce_dtype=...)``,
# DeepSpeed ``communication_data_type``, DDP's ``bf16_compress_hook``/``fp16_compress_hook``):
# "param" reduces in the compute/param dtype (FSDP's reduce_dtype=None: torch
# ``_fsdp_collectives.foreach_reduce`` ``reduce_dtype = reduce_dtype or grad_dtype``).
REDUCE_DTYPES = ("fp32", "bf16", "fp16", "param")
REDUCE_FP32, REDUCE_BF16, REDUCE_FP16, REDUCE_PARAM = range(len(REDUCE_DTYPES))

# What ``strategy.py`` re-exports with ``import *``: the names and codes, not this module's helpers
# (json, Path, engine_names, ENGINE_DIR).
__all__ = [n for n in tuple(globals()) if n.isupper() and n != "ENGINE_DIR"]
