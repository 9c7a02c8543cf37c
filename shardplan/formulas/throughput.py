"""Compute, step time and throughput: FLOPs per step, their time, the comm/compute overlap per
FSDP unit, offload and optimizer time; tokens/s, MFU/HFU, and the cost of N training tokens.

Time of one micro-batch's compute, per GPU (a roofline sum; every term below has a source):

* matmuls: FLOPs / (peak × GEMM efficiency(m)), peak per dtype from the GPU profile, the large-
  GEMM efficiency from measured "maximum achievable matmul FLOPS" (``GPUProfile.gemm_efficiency``), falling
  for small matrices by the saturation curve the calibration harness fits
  (``shardplan/calibrate/compute.py``): eff(m) = eff_max / (1 + (m_half/m)^p);
* attention core (flash/SDPA): FLOPs / (peak × attention efficiency) (``GPUProfile.attention_efficiency``,
  FlashAttention-2's at long sequences; slower on short ones and for the Triton kernel,
  ``attention_rate_factor``);
* element-wise work (norms, RoPE, SwiGLU, residual adds, cross-entropy), counted op by op for eager
  torchtitan / Hugging Face kernels (``elementwise_bytes_per_token``), and FSDP's own copies around
  its collectives (``fsdp_copy_bytes``): bytes / HBM bandwidth.

FLOPs (PaLM, Chowdhery et al. 2022, App. B; torchtitan ``get_dense_model_nparams_and_flops``):
6·N_matmul per token for forward + backward, N_matmul = block Linear weights + lm_head; attention
12·L·s·q per token with full (non-causal) score matrices — half of it with a causal mask, which is
what flash kernels execute (FlashAttention-2 paper, §4.1, counts causal FLOPs as half). Full
activation checkpointing adds one forward (8N instead of 6N); selective (Korthikanti et al. 2022,
§5) recomputes the attention core; LoRA skips the frozen base's weight gradients (4N for the base).

Overlap (PyTorch FSDP notes, ``docs/source/notes/fsdp.rst`` "FSDP Prefetch Nuances": all-gathers on
their own stream overlap earlier compute, the first one cannot; Zhao et al. 2023, arXiv 2304.11277,
§3.3, Fig. 5): per micro-batch, forward Σ max(compute_i, AG_{i+1}), backward
Σ max(compute_i, AG_{i−1} + RS_{i+1}) on one communication stream (HSDP's replica all-reduce on its
own stream, max'ed alongside), the first all-gather and the last reduce-scatter exposed. Overlap is
not free: a running collective holds φ = NCCL CTAs / SMs of the GPU, so each interval is
max(compute + φ·overlapped comm, comm) (``contended_interval_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardplan.formulas.activations import (
    compute_dtype_bytes,
    op_sac_recomputed_params_per_layer,
    recompute_fraction,
    stream_dtype_bytes,
    torchao_nf4_qlora,
)
from shardplan.formulas.comm import COLLECTIVE_OP, LinkRates, comm_times, comm_volume, gathered_param_bytes, grad_comm_bytes_per_element, sync_count
from shardplan.formulas.eager_host import host_phase_s
from shardplan.formulas.fsdp1_limiter import limiter_exposure_s
from shardplan.formulas.model_states import master_dtype_bytes, optimizer_step_bytes_per_element, trainable_params
from shardplan.formulas.moe_sync import sync_exposure_s
from shardplan.inputs import engines as eng
from shardplan.inputs import strategy as st
from shardplan.inputs.engines import per_engine
from shardplan.inputs.hardware import DEFAULT_ATTENTION_EFFICIENCY, DEFAULT_SM_COUNT
from shardplan.inputs.model import attention_flops_per_token, train_flops_per_token

# Per-GPU coefficients are profile data (``shardplan/inputs/hardware.py`` ``GPUProfile``, each number cited in
# its JSON): ``gemm_efficiency`` (measured large-GEMM fraction of peak, MAMF), ``attention_efficiency``
# (FlashAttention-2/3 papers), ``sm_count`` and ``host_link``; the documented defaults for a profile
# that leaves them out are ``hardware.DEFAULT_*``.
# eff(m) saturation: ASSUMPTION m_half = 256, p = 2 — within 2 % of eff_max from m = 2048 on,
# consistent with MAMF's best shapes (smallest dimension ≥ 1536); calibrate to replace.
GEMM_M_HALF = 256.0
GEMM_P = 2.0
# Achievable fraction of nameplate HBM bandwidth for streaming element-wise kernels.
# ASSUMPTION 0.9 (STREAM-like copies reach ~90 % of nameplate on HBM GPUs).
HBM_EFFICIENCY = 0.9
# CPU optimizer (DeepSpeed CPUAdam / torch CPU AdamW) is memory-bandwidth bound: it streams the
# fp32 master, both moments and the gradient. ASSUMPTION: 50 GB/s of host DRAM bandwidth per node
# for it (a fraction of a 2-socket server's ~300-400 GB/s); calibrate to replace.
CPU_OPTIMIZER_BYTES_PER_S_PER_NODE = 50e9
# Element-wise traffic per token per layer in units of the activation width (see
# ``elementwise_bytes_per_token``); backward moves ~2× the forward's bytes (reads the incoming
# gradient and the saved input, writes the outgoing gradient). Measured: autograd's operators for a
# torchtitan-style bf16 block move 2.03-2.10× the forward's bytes over four shapes, and the forward
# 0.98× ``layer_forward_elementwise_bytes`` (``python -m shardplan.calibrate.elementwise_bytes``;
# tests/test_elementwise_bytes.py).
BACKWARD_ELEMENTWISE_FACTOR = 2.0
# Eager element-wise kernels, HBM bytes per element, counted op by op from torchtitan
# ``torchtitan/models/norms.py`` RMSNorm (``self._norm(x.float()).type_as(x) * self.weight`` with
# ``_norm = x * rsqrt(x.pow(2).mean(-1) + eps)``) and ``models/llama/model.py`` ``apply_rotary_emb``
# (``view_as_complex(x.float())`` × freqs, ``view_as_real(...).type_as(x)``); Hugging Face
# ``LlamaRMSNorm`` runs the same fp32 passes. RMSNorm with 16-bit input: x.float() 2+4, pow 4+4,
# mean 4, x·rsqrt 4+4, type_as 4+2, ·weight 2+2 = 36 B/element. RoPE on q and k: float() 2+4,
# complex multiply 4+4, type_as 4+2 = 20 B/element. ASSUMPTION: eager mode (torch.compile fuses
# these into ~1 read + 1 write) and 16-bit activations (the counts scale from a = 2).
RMSNORM_EAGER_BYTES = 36.0
ROPE_EAGER_BYTES = 20.0
# A norm that is one 16-bit kernel (``lowp_norm``): llm-foundry's ``LPLayerNorm.forward``
# (llmfoundry/models/layers/norm.py) casts input, weight and bias to the autocast dtype and runs a
# single ``F.layer_norm``: read 2 + write 2 = 4 B/element (the per-row mean/rstd are O(1/h)); the
# benchmark launcher sets it for every table row (scripts/train/benchmarking/submit_benchmarks.py
# @8c8dd48f: ``norm_type = 'low_precision_layernorm'``). Scaled by a/2 like the others.
LOWP_NORM_BYTES = 4.0
# torch.compile of the blocks (torchtitan ``apply_compile``: each TransformerBlock; torchtune
# ``training.compile``: each layer): inductor fuses the element-wise chain between GEMMs / SDPA
# into a few kernels. Measured with CPU inductor (torch 2.13; the scheduler's fused nodes'
# ``get_read_write_buffers_sizes`` plus the complex-multiply fallbacks, GEMMs and SDPA excluded,
# ``shardplan.calibrate.elementwise_bytes.measure_compiled``) on a torchtitan-style bf16 block,
# forward + backward: 0.37 (h 256, 8 heads, 2 kv, ffn 768) and 0.40 (h 512, 8 heads, ffn 1536)
# of the eager bytes. ASSUMPTION: the larger (less fused) figure for every block shape and GPU
# (the fusion decisions are the shared scheduler's; the Triton backend's heuristics may differ).
COMPILED_BLOCK_ELEMENTWISE_FRACTION = 0.40
# RoPE as each stack's code writes it (``rope_form``, knob_names.ROPE_FORMS), over the complex form
# ``ROPE_EAGER_BYTES`` counts: extra bytes per q/k element of each forward pass (the recomputed one
# included) and of the backward, counted op by op from the code and measured on the block of
# ``calibrate.elementwise_bytes`` (``measure(..., rope_form=...)`` minus the complex block, per q/k
# element, over its four shapes). Scaled by a/2 like the others. The rest of each measurement is the
# table's reads, which scale with 1/heads.
# - ``matrix``, foundation-model-stack: ``fms/modules/positions.py`` ``RotaryEmbedding.adjusted_qk``
#   (ibm-fms v0.0.3 and v0.0.5, the releases fms-fsdp's runs required) rotates each pair by a 2×2
#   fp32 matrix, ``freqs[position_ids].mul(q.float().view(..., -1, 2).unsqueeze(-2)).sum(5)
#   .flatten(3).type_as(q)``. Forward: float() 2+4, mul reads the pair 4 and writes the 2×-wide
#   product 8, sum 8+4, type_as 4+2 = 36 B; backward the same chain reversed = 36 B; 16 B more each
#   way than complex (measured 17.0-18.5 forward, 15.2-15.7 backward; the per-layer gather of the fp32
#   table rows, 24·head_dim B per token, ≤ 6 % of this term at 8+ heads, is left out).
# - ``rotate_half``, Transformers: ``apply_rotary_pos_emb`` = ``(q * cos) + (rotate_half(q) * sin)``,
#   ``rotate_half(x) = cat((-x[..., D/2:], x[..., :D/2]), -1)``, with cos and sin cast to the
#   activations' dtype (``LlamaRotaryEmbedding.forward``: ``cos.to(dtype=x.dtype)``;
#   models/llama/modeling_llama.py @0022728, the same functions in 4.48.1's Llama/Mistral/Mixtral).
#   Forward: mul 2+2, neg 1+1 (half), cat 2+2, mul 2+2, add 4+2 = 20 B, the complex form's count
#   (measured +0.0); backward: two muls 4+4, cat's two slice_backwards 1+2 each, neg 1+1, the add of
#   the two slices' gradients 4+2, the add of q's two gradients 4+2 = 28 B, 8 B more (measured 6.4-7.3).
# - ``pairs_fp32``, torchtune: ``modules/position_embeddings.py`` ``RotaryPositionalEmbeddings.forward``
#   (0217d44c2 l.107-126, 9bafd16fc l.107-127, 1814feb17 l.102-122; ``Llama3ScaledRoPE.forward`` the
#   same, ``models/llama3_1/_position_embeddings.py`` l.171-191) and its fp32 cache (``theta``
#   ``.float()``, ``cache = stack([cos, sin], -1)``): ``xshaped = x.float().reshape(..., -1, 2)``,
#   ``stack([x0·c − x1·s, x1·c + x0·s], -1).flatten(3).type_as(x)``. Forward: float() 2+4, four
#   products of fp32 halves 2+2 each, sub and add 4+2 each, stack 4+4, type_as 4+2 = 48 B (+28);
#   backward: type_as 2+4, four products 2+2 each, four select_backwards 2+4 each, three adds 8+4
#   each, neg 2+2, float() 4+2 = 92 B (+72) (measured +28.3-28.8 forward, +71.2-71.7 backward).
ROPE_MATRIX_EXTRA_BYTES = 16.0
ROPE_ROTATE_HALF_BACKWARD_EXTRA_BYTES = 8.0
ROPE_PAIRS_FORWARD_EXTRA_BYTES, ROPE_PAIRS_BACKWARD_EXTRA_BYTES = 28.0, 72.0
# (forward, backward) extra per q/k element, indexed by the ROPE_FORMS code
ROPE_FORM_EXTRA_BYTES = ((0.0, 0.0), (0.0, ROPE_ROTATE_HALF_BACKWARD_EXTRA_BYTES),
                         (ROPE_PAIRS_FORWARD_EXTRA_BYTES, ROPE_PAIRS_BACKWARD_EXTRA_BYTES),
                         (ROPE_MATRIX_EXTRA_BYTES, ROPE_MATRIX_EXTRA_BYTES))
# A compiled block whose RoPE is real arithmetic: inductor fuses it with the norm and casts around
# it, where the complex multiply stays an aten fallback kernel (``compiled_bytes``). Measured like
# COMPILED_BLOCK_ELEMENTWISE_FRACTION (``python -m shardplan.calibrate.compiled_bytes 256 8 2 768
# --rope-form FORM``), compiled / that block's own eager bytes at (h 256, 8 heads, 2 kv, ffn 768) and
# (h 512, 8 heads, ffn 1536): matrix 0.257 / 0.228, pairs_fp32 0.234 / 0.205, rotate_half
# 0.294 / 0.275; ASSUMPTION as above: the larger for every shape and GPU.
COMPILED_MATRIX_ROPE_BLOCK_FRACTION = 0.26
COMPILED_PAIRS_ROPE_BLOCK_FRACTION = 0.24
COMPILED_ROTATE_HALF_BLOCK_FRACTION = 0.30
# LoRA adapters sit inside what torch.compile compiles: torchtune's ``LoRALinear`` is a submodule of
# each ``TransformerSelfAttentionLayer`` that ``training.compile_model`` compiles (9bafd16fc
# ``training/_compile.py``; the whole model before torch 2.5, as at 0217d44c2), so the adapter
# path's element-wise ops (``* scaling``, the add into the base output, their gradients, the
# input-gradient accumulation) fuse with the block's. Measured as the block measurement above, with
# torchtune's ``LoRALinear.forward`` (``lora_b(lora_a(dropout(x))) * alpha/rank + out``, dropout 0 =
# Identity) on q, v, o and the MLP's three Linears of a frozen bf16 block, compiled minus the same block
# without adapters over eager minus eager (``calibrate.compiled_bytes.adapter_fraction``): 0.42 (h 256,
# GQA) and 0.44 (h 512), forward 0.35–0.38, backward 0.50. The rank-r GEMMs' own reads and writes
# (extern kernels) do not fuse. ASSUMPTION: the larger figure, forward and backward alike.
COMPILED_ADAPTER_ELEMENTWISE_FRACTION = 0.44
# Cross-entropy over fp32-upcast logits (torchtitan ``F.cross_entropy(pred.float(), labels)``; HF
# ``logits.float()``), bytes per vocabulary entry per token: logits written 2, .float() 2+4,
# log_softmax (max and sum-exp passes + output) 4+4+4, backward: nll grad written 4, log_softmax
# backward 4+4+4, cast back to 16-bit 4+2 = 42.
CROSS_ENTROPY_BYTES_PER_VOCAB = 42.0
# A fused cross-entropy (``fused_ce``: a compiled loss, torchtune ``training.compile_loss`` compiling
# ``CEWithChunkedOutputLoss.compute_cross_entropy`` = ``F.cross_entropy(logits.float(), ...)``
# @9bafd16fc; or a fused kernel, flash-attn ``losses/cross_entropy.py`` over ``xentropy_cuda_lib``):
# the logits written 2, then what inductor's kernels move (``calibrate.compiled_bytes.
# cross_entropy_bytes_per_vocab``, CPU inductor): 4 forward (the 16-bit logits read by the max and the
# sum-exp passes) + 4 backward (read 2, 16-bit gradient written 2) = 10. ASSUMPTION: the xentropy
# kernel moves the same (it saves the 16-bit logits and one fp32 log-sum-exp per row, and its
# backward reads the logits and writes their gradient).
FUSED_CROSS_ENTROPY_BYTES_PER_VOCAB = 10.0
# Training metrics on the logits (``metric_ce``): composer v0.16.3 ``Trainer._train_microbatch``
# calls ``_eval_train_metrics`` after every micro-batch's backward, under ``torch.no_grad`` and the
# run's precision context, and updates each train metric on that micro-batch's logits; llm-foundry
# v0.3.0 ``ComposerMPTCausalLM`` (the MF tables' ``git_branch: v0.3.0``, scripts/train/benchmarking/
# submit_benchmarks.py) registers ``LanguageCrossEntropy`` and ``LanguagePerplexity`` (its subclass),
# and each ``update`` runs ``torch.nn.CrossEntropyLoss`` (composer ``metrics/nlp.py``): 2 eager
# cross-entropy forwards. Under autocast cross_entropy runs in float32 (PyTorch AMP docs, "CUDA ops
# that can autocast to float32"), so each moves the eager count's forward part: .float() 2+4,
# log_softmax 4+4+4 = 18 B per vocabulary entry (the nll gather reads one entry per row).
METRIC_CE_FORWARDS = 2
METRIC_CE_FORWARD_BYTES_PER_VOCAB = 18.0
# NCCL runs one CTA (thread block) per channel, resident on an SM for the whole collective (NCCL
# user guide, NCCL_MIN_NCHANNELS / NCCL_MAX_CTAS: more channels = more CUDA blocks). An FSDP
# all-gather on an 8×H100 node launched 24 blocks (NVIDIA developer forum, "Compute-Communication
# Overlap Causes Severe GEMM Performance Degradation because of Tail Effect", nsys trace: GEMM of
# 132 blocks pushed into a second wave). ASSUMPTION: 24 CTAs per running collective on every GPU.
NCCL_CTAS = 24
# The Triton FlashAttention kernel (``st.TRITON``) against FlashAttention-2, which the GPU profile's
# ``attention_efficiency`` describes: "FlashAttention-2 is around 1.3-1.5× faster than FlashAttention
# in Triton in the forward pass and around 2× faster in the backward pass" (Dao 2023, arXiv
# 2307.08691, §4.1, A100 80GB, head dim 64/128, seq 512-16k). Weighted by FLOPs (backward 2.5× the
# forward's, the same section): (1 + 2.5) / (1.4 + 2.5·2) = 0.547 of FlashAttention-2's rate.
# ASSUMPTION: the same ratio on Hopper, where both run Ampere's mma.sync path (FlashAttention-3,
# arXiv 2407.08608: FlashAttention-2 uses none of Hopper's new instructions).
TRITON_OVER_FLASH2 = (1 + 2.5) / (1.4 + 2.5 * 2.0)
# Flash kernels run slower on short sequences (fewer key blocks per query block, a larger causal
# diagonal share). FlashAttention-2 on A100 spans "50-73% of the theoretical maximum FLOPs/s"
# (abstract) over its benchmark (§4.1: seq 512-16k at 16k tokens per batch, head dim 64/128),
# and reaches "up to 73% ... in the forward pass, and up to 63% ... in the backward pass": a
# forward + backward maximum of 3.5 / (1/0.73 + 2.5/0.63) = 0.655 (FLOPs weighted 1 : 2.5). The
# profile's ``attention_efficiency`` is the long-sequence rate (H100's 0.35 is FlashAttention-2's
# maximum there, "up to 335 TFLOPs/s", §4.1); at FLASH_SEQ_SHORT tokens a flash kernel runs at
# FLASH_SHORT_SEQ_FACTOR of it. ASSUMPTION: the range's low end is its shortest sequence, its
# high end the longest, log-linear in between, the same on every GPU and for the Triton kernel.
FLASH_SHORT_SEQ_FACTOR = 0.50 / DEFAULT_ATTENTION_EFFICIENCY
FLASH_SEQ_SHORT, FLASH_SEQ_LONG = 512, 16384
# bitsandbytes 4-bit quantization blocks: ``quantize_4bit(..., blocksize=64)`` and ``Params4bit``'s
# default (``nn/modules.py``; Transformers' BitsAndBytesConfig does not change it), and the nested
# (double-quant) absmax blocks, ``quantize_blockwise(absmax, blocksize=256)`` (``functional.py``).
QLORA_BLOCKSIZE = 64
QLORA_NESTED_BLOCKSIZE = 256


@dataclass(frozen=True)
class ComputeRates:
    """Per-GPU compute coefficients; fields broadcast like ``Columns``. ``peak_flops_by_precision``
    is indexed by the precision code (bf16-mixed, fp16-mixed, bf16-pure, fp32)."""

    peak_flops_by_precision: np.ndarray
    gemm_efficiency: np.ndarray
    gemm_m_half: np.ndarray
    gemm_p: np.ndarray
    attention_efficiency: np.ndarray
    hbm_bytes_per_s: np.ndarray
    host_link_bytes_per_s: np.ndarray
    cpu_optimizer_bytes_per_s_per_node: np.ndarray
    calibrated: bool = False
    # φ = NCCL CTAs / SMs (``nccl_sm_fraction``); a default so callers that build ComputeRates
    # field by field (``shardplan/planning/grid_sweep.py``) keep working: A100's 24/108.
    nccl_sm_fraction: np.ndarray = NCCL_CTAS / DEFAULT_SM_COUNT
    # 16-bit GEMM efficiency per shape where the GPU profile has a measured fit (``gemm_shape_fit``,
    # ``gemm_shape_efficiency``): A, a, b, c of A·m^a·n^b·k^c and the best measured; NaN = nameplate
    gemm_shape_c0: np.ndarray = np.nan
    gemm_shape_cm: np.ndarray = np.nan
    gemm_shape_cn: np.ndarray = np.nan
    gemm_shape_ck: np.ndarray = np.nan
    gemm_shape_eff_max: np.ndarray = np.nan
    # k ≥ 1 on every GPU-side second of a step (``window_gpu_s``): 1 is the kernel rates above, what
    # the fastest step of a warm single GPU runs at; answers use the calibrated window factor
    # (``inputs.time_calibration``), what published multi-step tokens/s averages ran at
    window_factor: np.ndarray = 1.0


def window_gpu_s(seconds, rates: ComputeRates):
    """GPU-side seconds (compute, FSDP's copies, the GPU optimizer step) as a window average runs
    them: × ``ComputeRates.window_factor``. Host time, the CPU optimizer, PCIe and collectives are
    not scaled (the factor was fitted on the GPUs' compute time alone)."""
    return seconds * rates.window_factor


def compute_rates(cluster, calibration=None, window_factor=1.0) -> ComputeRates:
    """Coefficients for a cluster's GPU: nameplate and coefficients from the GPU profile (each cited
    there), overlaid by a calibration (``shardplan.calibrate.overlay``) where it measured them: the
    bf16 matmul curve (``ComputeCalibration``: eff_max, m_half, p; and the SM count it read from the
    device) and the element-wise HBM bandwidth (``BandwidthCalibration``, which replaces nameplate ×
    ``HBM_EFFICIENCY``). ``window_factor``: ``ComputeRates.window_factor`` (1: kernel rates)."""
    from shardplan.inputs.hardware import get_link
    gpu = cluster.gpu
    bf16 = gpu.dense_peak("bf16")
    peak = np.array([bf16, gpu.dense_peak("fp16"), bf16, gpu.dense_peak("fp32")], dtype=np.float64)
    eff, m_half, p, calibrated = gpu.gemm_efficiency, GEMM_M_HALF, GEMM_P, False
    hbm = gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY
    sm_count = gpu.sm_count
    if calibration is not None:
        fits = [f for f in calibration.compute if f.dtype in ("bfloat16", "bf16") and f.device != "cpu"]
        if fits:
            f = fits[0]
            # A measured rate above this GPU's nameplate peak cannot be this GPU's (an overlay of a
            # faster card applied with --force, calibrate/foreign.py): capped at the peak, so no
            # step runs its matmuls faster than the datasheet allows and MFU stays <= 1.
            eff = min(f.eff_max if f.eff_max else f.f_max_flops_per_s / bf16, 1.0)
            m_half, p, calibrated = f.m_half, f.p, True
            sm_count = f.sm_count or sm_count
        bandwidth = [b for b in getattr(calibration, "bandwidth", ()) if b.device != "cpu"]
        if bandwidth:  # capped at the nameplate, as the matmul rate is
            hbm = min(max(b.bytes_per_s for b in bandwidth), gpu.memory_bandwidth_bytes_per_s)
            calibrated = True
    host = get_link(gpu.host_link, "host_link")
    # a calibration's own matmul curve wins over the shipped shape fit (it measured this cluster)
    shape = {} if calibrated else gemm_shape_fields(gpu)
    return ComputeRates(
        peak_flops_by_precision=peak, gemm_efficiency=np.asarray(eff), gemm_m_half=np.asarray(m_half),
        gemm_p=np.asarray(p), attention_efficiency=np.asarray(gpu.attention_efficiency),
        hbm_bytes_per_s=np.asarray(hbm),
        host_link_bytes_per_s=np.asarray(host.achievable_bytes_per_s),
        cpu_optimizer_bytes_per_s_per_node=np.asarray(CPU_OPTIMIZER_BYTES_PER_S_PER_NODE), calibrated=calibrated,
        nccl_sm_fraction=np.asarray(nccl_sm_fraction(sm_count)), window_factor=np.asarray(window_factor, dtype=np.float64),
        **shape)


def gemm_shape_fields(gpu) -> dict:
    """ComputeRates' ``gemm_shape_*`` fields of a GPU whose profile carries a measured GEMM shape fit
    (``GPUProfile.gemm_shape_fit``); {} (the nameplate curve) otherwise."""
    fit = gpu.gemm_shape_fit
    if fit is None:
        return {}
    c0, cm, cn, ck = fit.coefficients
    return {"gemm_shape_c0": np.asarray(c0), "gemm_shape_cm": np.asarray(cm), "gemm_shape_cn": np.asarray(cn),
            "gemm_shape_ck": np.asarray(ck), "gemm_shape_eff_max": np.asarray(fit.eff_max)}


def nccl_sm_fraction(sm_count, nccl_ctas=NCCL_CTAS):
    """φ: share of the GPU's SMs a running collective holds (one CTA per NCCL channel, see
    ``NCCL_CTAS``). ASSUMPTION: a compute kernel overlapping it runs on the remaining 1 − φ, and
    HBM contention from the copies the collective makes is inside the same factor."""
    return np.minimum(np.asarray(nccl_ctas, dtype=np.float64) / np.asarray(sm_count, dtype=np.float64), 1.0)


# --- FLOPs ------------------------------------------------------------------------------------
def matmul_params_per_token(c):
    """N_matmul of each configuration's model: the ``matmul_params`` column, which
    ``shardplan.formulas.columns.model_values`` takes from ``ModelSpec.matmul_params_per_token`` (one
    definition: ``shardplan.inputs.model.matmul_params_per_token``)."""
    return c.matmul_params


def attention_forward_flops_per_token(c, causal=True):
    """Scores + weighted values per token (``shardplan.inputs.model.attention_flops_per_token``),
    halved under a causal mask; float64, so long sequences cannot wrap an integer."""
    return attention_flops_per_token(c.num_layers, c.q_width, np.asarray(c.seq_len, dtype=np.float64), causal)


def model_flops_per_token(c):
    """Model FLOPs for MFU: 6·N_matmul + 3 × causal attention forward (no recompute counted).
    LoRA/QLoRA count the arithmetic they do (``flops_per_token``'s convention): the frozen base has
    no weight gradients, so its matmuls are 4·N (forward + input gradients), the adapters 6·N_lora —
    MFU under LoRA is then the share of peak that real arithmetic reaches, not 6N's (which would
    credit the base's weight gradients nobody computes).
    ASSUMPTION: MFU counts causal attention FLOPs (what flash kernels execute); torchtitan and PaLM
    count the full s² scores (``palm_model_flops_per_token``) — compare tokens/s, not MFU, across them."""
    n, attention = matmul_params_per_token(c), attention_forward_flops_per_token(c)
    peft = 4.0 * n + 6.0 * c.lora_params + 3.0 * attention
    return np.where(c.method != st.FULL, peft, train_flops_per_token(n, attention))


def palm_model_flops_per_token(c):
    """PaLM's and torchtitan's model FLOPs per token: 6·N_matmul + 3 × the full attention forward."""
    return train_flops_per_token(matmul_params_per_token(c), attention_forward_flops_per_token(c, causal=False))


def flops_per_token(c):
    """Hardware FLOPs per token by kind (dict): ``matmul`` and ``attention``, forward and backward,
    with recompute and LoRA's missing base weight gradients."""
    peft = c.method != st.FULL
    head = c.vocab_size * c.hidden_size
    blocks = matmul_params_per_token(c) - head
    fwd_mm = 2.0 * (blocks + head)
    # backward: input gradients (2N) + weight gradients (2N, only trainable weights)
    bwd_mm = np.where(peft, 2.0 * (blocks + head) + 6.0 * c.lora_params, 4.0 * (blocks + head))
    attn_fwd = attention_forward_flops_per_token(c)
    # flash backward recomputes the scores: 2.5× the forward (FlashAttention-2 paper §3.2 / §4.1)
    attn_bwd = np.where(c.attention != st.EAGER, 2.5, 2.0) * attn_fwd
    frac = recompute_fraction(c)
    full_like = (c.ac == st.AC_FULL) | (c.ac == st.AC_EVERY_K)
    # op-level SAC recomputes the even mms of each block (activations.op_sac_recomputed_params_per_layer)
    rec_op = frac * 2.0 * c.num_layers * op_sac_recomputed_params_per_layer(c)
    rec_mm = np.select([full_like, c.ac == st.AC_SELECTIVE_OP], [frac * 2.0 * blocks, rec_op], 0.0)
    # op-level SAC saves SDPA's output when its kernel is in torchtitan's ``_save_list``
    # (``sac_saves_attention``; parallelize_llama.py @9dec370: flash and efficient), so nothing of
    # attention is recomputed; block-level modes re-run the whole forward, attention included
    saved = (c.ac == st.AC_SELECTIVE_OP) & np.asarray(c.sac_saves_attention, dtype=bool)
    rec_attn = np.where((c.ac == st.AC_NONE) | saved, 0.0, frac * attn_fwd)
    return {"fwd_matmul": fwd_mm, "bwd_matmul": bwd_mm + rec_mm, "fwd_attention": attn_fwd,
            "bwd_attention": attn_bwd + rec_attn, "recompute": rec_mm + rec_attn}


def elementwise_bytes_per_token(c):
    """HBM traffic of the non-matmul kernels, forward + backward (+ recompute), per token.

    Forward per layer, eager kernels (counts in ``RMSNORM_EAGER_BYTES``, ``ROPE_EAGER_BYTES``, scaled
    by a/2 for the activation width a): 2 RMSNorms 2·36·h; RoPE on q and k 20·(q + kv); GQA's
    ``repeat_kv`` (torchtitan; HF ``repeat_kv``) materialises k and v at the query width, read kv +
    write q each: 2a·(kv + q) when q > kv; attention output ``transpose(1, 2).contiguous()`` 2a·q;
    2 residual adds 3a·h each; gated MLP silu(gate)·up 5a·i (2a·i non-gated); no RoPE bytes for a
    model with learned positions (``rope_dim`` 0: GPT-2, OPT, MPT's ``learned_pos_emb``). Backward moves
    ``BACKWARD_ELEMENTWISE_FACTOR`` × the forward's bytes; recomputed blocks repeat their forward.
    Head: ``CROSS_ENTROPY_BYTES_PER_VOCAB`` · V (fp32 cross-entropy, forward + backward).
    ``compile``: the blocks' bytes × ``COMPILED_BLOCK_ELEMENTWISE_FRACTION`` (recompute included:
    SAC's recomputed element-wise work is compiled with the block), the LoRA adapters' element-wise
    ops × ``COMPILED_ADAPTER_ELEMENTWISE_FRACTION`` (``lora_adapter_bytes_per_token``); the loss is
    outside the compiled blocks (torchtitan 9dec370 ``train.py``) unless ``fused_ce`` (compiled or
    fused: ``FUSED_CROSS_ENTROPY_BYTES_PER_VOCAB``), and so are casts and FSDP's copies. ``metric_ce``:
    the training metrics' eager cross-entropy forwards (``METRIC_CE_FORWARDS``).
    ``lowp_norm``: norms at ``LOWP_NORM_BYTES``. ``rope_form``: each forward pass (recompute
    included) and the backward move ``ROPE_FORM_EXTRA_BYTES`` more per q/k element than the complex
    form, and compiled blocks keep ``compiled_block_fraction`` of their bytes.
    ASSUMPTION: no fused RMSNorm/RoPE/cross-entropy kernels otherwise (Liger kernels are not modelled).
    """
    a = stream_dtype_bytes(c)
    norm = np.where(c.lowp_norm, LOWP_NORM_BYTES, RMSNORM_EAGER_BYTES)
    layer_fwd = layer_forward_elementwise_bytes(a, c.hidden_size, c.q_width, c.kv_width, c.mlp_width,
                                                c.gated_mlp, np.asarray(c.rope_dim) > 0, norm)
    frac = recompute_fraction(c)
    # learned positions rotate nothing: their blocks count as the complex form's (no RoPE bytes at all)
    form = np.where(np.asarray(c.rope_dim) > 0, np.asarray(c.rope_form, dtype=np.int64), st.ROPE_COMPLEX)
    extra = np.asarray(ROPE_FORM_EXTRA_BYTES)[form]  # (..., 2): forward, backward
    # the forward and the recomputed forward move the forward's extra, the backward its own
    rope_extra = (extra[..., 0] * (1 + frac) + extra[..., 1]) * (a / 2.0) * (c.q_width + c.kv_width)
    fused = np.where(c.compile, compiled_block_fraction(form), 1.0)
    layers = c.num_layers * (layer_fwd * (1 + BACKWARD_ELEMENTWISE_FACTOR + frac) + rope_extra) * fused
    per_vocab = np.where(np.asarray(c.fused_ce, dtype=bool), FUSED_CROSS_ENTROPY_BYTES_PER_VOCAB,
                         CROSS_ENTROPY_BYTES_PER_VOCAB)
    per_vocab = per_vocab + np.where(np.asarray(c.metric_ce, dtype=bool),
                                     METRIC_CE_FORWARDS * METRIC_CE_FORWARD_BYTES_PER_VOCAB, 0.0)
    head = per_vocab * compute_dtype_bytes(c.precision) / 2.0 * c.vocab_size
    return layers + head + lora_adapter_bytes_per_token(c) + qlora_stream_cast_bytes_per_token(c) \
        + moe_dispatch_bytes_per_token(c)


def compiled_block_fraction(rope_form):
    """What inductor leaves of a block's eager element-wise bytes, by its ROPE_FORMS code: the complex
    multiply stays a fallback kernel (``COMPILED_BLOCK_ELEMENTWISE_FRACTION``), the real-arithmetic
    forms fuse with their neighbours."""
    by_form = np.array([COMPILED_BLOCK_ELEMENTWISE_FRACTION, COMPILED_ROTATE_HALF_BLOCK_FRACTION,
                        COMPILED_PAIRS_ROPE_BLOCK_FRACTION, COMPILED_MATRIX_ROPE_BLOCK_FRACTION])
    return by_form[np.asarray(rope_form, dtype=np.int64)]


def layer_forward_elementwise_bytes(a, h, q, kv, i, gated=True, rope=True, norm=RMSNORM_EAGER_BYTES):
    """One block's eager element-wise HBM bytes per token in the forward (``elementwise_bytes_per_token``'s
    count): 2 norms of ``norm`` bytes per 16-bit element, RoPE on q and k, GQA's ``repeat_kv``, the
    attention output's ``.contiguous()``, 2 residual adds and the MLP's activation product, with a the
    activation bytes."""
    mlp = np.where(gated, 5, 2) * a * np.asarray(i, dtype=np.float64)
    gqa = np.where(np.asarray(q) > np.asarray(kv), 2 * a * (np.asarray(kv) + np.asarray(q)), 0)
    rope_b = np.where(rope, ROPE_EAGER_BYTES * (np.asarray(q) + np.asarray(kv)), 0.0)
    return (2 * np.asarray(norm) * np.asarray(h) + rope_b) * (a / 2.0) + gqa + 2 * a * np.asarray(q) \
        + 6 * a * np.asarray(h) + mlp


def moe_dispatch_bytes_per_token(c):
    """HBM bytes per token of Transformers' eager expert loop around the experts' GEMMs
    (``models/mixtral/modeling_mixtral.py`` ``MixtralSparseMoeBlock.forward``, v4.36-v4.47 and the
    blocks copied from it: ``final_hidden_states = torch.zeros(...)``; per expert
    ``idx, top_x = torch.where(expert_mask[expert_idx])``, ``current_state = hidden_states[None, top_x]``,
    ``expert_layer(current_state) * routing_weights[top_x, idx, None]``,
    ``final_hidden_states.index_add_(0, top_x, ...)``), per MoE block, with E experts, k per token,
    a the stream bytes, h the width. Forward: the zeros a·h; over the experts each token's k rows
    are gathered (2a·h·k), scaled (2a·h·k) and index-added (read the rows, read and write the
    destination: 3a·h·k): a·h·(1 + 7k). Backward: index_add_'s source gradient is an index_select
    (2a·h·k); the scaling's two gradients (2a·h·k, and the product 3a·h·k reduced 1a·h·k); each
    expert's gather backward writes a full-size zero gradient and accumulates its rows into it
    (a·h per expert + 3a·h·k in all), and autograd sums the E full-size gradients into the block
    input's (3a·h each): a·h·(4E + 11k). Recomputed blocks repeat the forward. ASSUMPTION: only
    the ``hf`` stack runs this loop (the dev set's other stacks train dense models); the router's
    fp32 softmax over E logits (E ≪ h) is left out; the per-expert ``torch.where`` host syncs are
    priced in ``moe_sync``."""
    a = stream_dtype_bytes(c)
    h = np.asarray(c.hidden_size, dtype=np.float64)
    e, k = np.asarray(c.moe_experts, dtype=np.float64), np.asarray(c.moe_top_k, dtype=np.float64)
    frac = recompute_fraction(c)
    per_block = a * h * ((1 + 7 * k) * (1 + frac) + 4 * e + 11 * k)
    return np.where((np.asarray(c.stack) == st.HF) & (e > 0), c.moe_blocks * per_block, 0.0)


def qlora_stream_cast_bytes_per_token(c):
    """HBM bytes per token of bitsandbytes' dtype casts around each 4-bit Linear when the stream is
    wider than the 16-bit compute dtype (``stream_dtype_bytes`` 4 against bf16's 2): ``Linear4bit.forward``
    (bitsandbytes ``nn/modules.py`` @0.43.3) casts its input ``x.to(self.compute_dtype)`` (read s,
    write 2 per input element) and its output back ``out.to(inp_dtype)`` (read 2, write s per output
    element); backward casts both gradients the other way (the same bytes); recomputed blocks repeat
    the forward. Per block, each Linear casts its own input: q, k, v (one fused qkv: one), o, gate
    and up, down. ASSUMPTION: a dense MLP (an MoE token's k experts each cast its input: (k − 1)·h
    per projection left out)."""
    s = stream_dtype_bytes(c)
    half = np.where(matmul_precision(c) == st.FP32, 4, 2)
    h = np.asarray(c.hidden_size, dtype=np.float64)
    up = np.where(c.gated_mlp, 2.0, 1.0)
    ins = np.where(c.fused_qkv, 1.0, 3.0) * h + c.q_width + up * h + c.mlp_width
    outs = c.q_width + 2.0 * c.kv_width + h + up * c.mlp_width + h
    frac = recompute_fraction(c)
    per_layer = (s + half) * (ins + outs) * (2 + frac)
    return np.where((c.method == st.QLORA) & (s > half), c.num_layers * per_layer, 0.0)


def peft_adapter_cast(c, a):
    """(d, cast): the bytes PEFT's adapter path computes in and whether each adapted input is cast
    (0/1), for the time of that path. PEFT keeps fp32 adapters over a 16-bit base
    (``activations.lora_adapter_dtype_bytes``, the memory side's rule: unwrapped or DDP runs, and FSDP
    runs of the hf stack without the Trainer's mixed precision, ``autocast`` off) and
    casts the input to them in its own code: peft ``tuners/lora/layer.py`` ``Linear.forward``
    (``x = self._cast_input_dtype(x, lora_A.weight.dtype)``, v0.14 on; ``x = x.to(lora_A.weight.dtype)``
    before), with or without autocast. So the cast is counted for LoRA built by PEFT (the ``hf``
    stack; torchtune and LitGPT build their own adapters in the model dtype, with no cast).
    QLoRA is left out: PEFT's ``tuners/lora/bnb.py`` ``Linear4bit.forward`` casts only when
    ``not torch.is_autocast_enabled()``, and the columns do not say whether autocast is on (HF
    Trainer's bf16=True turns it on). ASSUMPTION: under autocast the adapter path's element-wise
    ops run at the adapters' dtype (autocast runs the two rank-r GEMMs in 16 bits; their FLOPs are
    in ``flops_per_token``)."""
    from shardplan.formulas.activations import lora_adapter_dtype_bytes
    d, cast = lora_adapter_dtype_bytes(c, a)
    cast = np.asarray(cast, dtype=bool) & (np.asarray(c.stack) == st.HF) & (np.asarray(c.method) == st.LORA)
    return np.where(cast, d, a), cast.astype(np.float64)


def lora_adapter_pass_bytes(c):
    """(forward, backward) HBM bytes per token and block of PEFT's adapter path around its adapted Linears (peft
    ``tuners/lora/layer.py`` ``Linear.forward``, v0.13-v0.17 alike: ``x = x.to(lora_A.weight.dtype)``,
    ``result = result + lora_B(lora_A(dropout(x))) * scaling``, ``result.to(torch_result_dtype)``),
    per adapted Linear of input width in and output width out, with a the activation bytes and d
    the bytes the adapters compute in (``peft_adapter_cast``: d = 4 where PEFT casts each adapted
    input to its fp32 adapters; otherwise d = a and nothing is cast).

    Forward: the input cast reads a and writes d per input element (cast only); dropout with p > 0
    reads and writes d plus its mask m (``activations.lora_dropout_mask_bytes``); lora_A reads its
    input (d·in); lora_B writes its output (d·out); ``* scaling`` reads and writes it (2d·out); the
    add reads the base output and the adapter output and writes the sum in the promoted dtype
    (a + d + max(a, d))·out; the cast back reads d and writes a (cast only). Backward: the cast
    back's and the add's gradients each convert between a and d (2(a + d)·out, cast only);
    ``* scaling``'s gradient 2d·out; lora_B's input- and weight-gradient GEMMs read the incoming
    gradient (2d·out); lora_A's input gradient is written (d·in), cast back to a ((a + d)·in, cast
    only) and accumulated into x's gradient (3a·in); dropout's backward (2d + m)·in. Recomputed
    blocks repeat the forward. The rank-r tensors (r ≪ in, out) are left out; the rank-r GEMMs'
    FLOPs are in ``flops_per_token``; out widths summed per block are lora_params / (layers · r) −
    the adapted input widths. Under ``compile`` the element-wise ops (all but the rank-r GEMMs' reads
    of their inputs and writes of their outputs: d·in + d·out forward, 2d·out + d·in backward) move
    ``COMPILED_ADAPTER_ELEMENTWISE_FRACTION`` of their eager bytes."""
    from shardplan.formulas.activations import lora_dropout_mask_bytes
    a = stream_dtype_bytes(c)
    d, cast = peft_adapter_cast(c, a)
    rank = np.maximum(c.lora_rank_out / np.maximum(c.lora_adapted_linears, 1), 1)
    layers = np.maximum(np.asarray(c.num_layers, dtype=np.float64), 1)
    ins = np.asarray(c.lora_adapted_in, dtype=np.float64)
    outs = np.maximum(c.lora_params / (layers * rank) - ins, 0)
    dropout = np.where(np.asarray(c.lora_dropout) > 0, (2 * d + lora_dropout_mask_bytes(c, d)) * ins, 0.0)
    converts = cast * (a + d)  # one dtype conversion of an element, read + write
    gemm_fwd, gemm_bwd = d * (ins + outs), d * (2 * outs + ins)  # the rank-r GEMMs' own I/O
    fwd = converts * ins + d * ins + dropout + (3 * d + a + d + np.maximum(a, d)) * outs + converts * outs
    bwd = 2 * converts * outs + 4 * d * outs + d * ins + converts * ins + 3 * a * ins + dropout
    fused = np.where(c.compile, COMPILED_ADAPTER_ELEMENTWISE_FRACTION, 1.0)
    return gemm_fwd + fused * (fwd - gemm_fwd), gemm_bwd + fused * (bwd - gemm_bwd)


def lora_adapter_bytes_per_token(c):
    """HBM bytes per token of PEFT's adapter path over all blocks (``lora_adapter_pass_bytes``): the
    forward, again in each recomputed block, and the backward."""
    fwd, bwd = lora_adapter_pass_bytes(c)
    layers = np.maximum(np.asarray(c.num_layers, dtype=np.float64), 1)
    return np.where(c.method != st.FULL, layers * (fwd * (1 + recompute_fraction(c)) + bwd), 0.0)


def fsdp_copy_bytes(c):
    """(forward, backward) HBM bytes per micro-batch of FSDP's own copies around its collectives.

    FSDP2 (torch ``_fully_shard/_fsdp_collectives.py``): after each all-gather
    ``foreach_all_gather_copy_out`` (``split_with_sizes_copy``) copies the gathered flat buffer into
    the unsharded parameters — read + write of the gathered bytes; before each reduce-scatter
    ``foreach_reduce`` packs the unsharded gradients with ``chunk_cat`` into the reduce-scatter
    input in ``reduce_dtype`` — read a + write reduce bytes per trainable parameter — and casts the
    reduced shard back to the parameter's dtype when ``reduce_dtype`` differs from it (bf16 reduce
    of fp32 params: read 2 + write 4 per sharded element). (Copy-in of the local shard is 1/N of the
    all-gather and left out.) FSDP1 all-gathers straight into the ``FlatParameter``
    (no copy-out) and casts the flat gradient to ``reduce_dtype`` when it differs from the
    parameter dtype. ASSUMPTION: DeepSpeed and DDP bucket copies are not counted; these copies
    run on the compute stream's time (memory-bound kernels on any stream take the same HBM)."""
    n_p, n_g, _ = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    a = compute_dtype_bytes(c.precision)
    blocks_b, root_b = gathered_param_bytes(c)
    fsdp2 = eng.layout_is(eng.PER_TENSOR, c.engine)
    fsdp1 = eng.layout_is(eng.FLAT_UNIT, c.engine)
    gather = fsdp2 & (n_p > 1)
    reshard = gather & ((c.strategy == st.FULL_SHARD) | (c.strategy == st.HYBRID_SHARD))
    fwd = np.where(gather, 2.0 * (blocks_b + root_b), 0.0)
    bwd_gather = np.where(reshard, 2.0 * blocks_b, 0.0)
    gb = grad_comm_bytes_per_element(c)
    cast = np.where(fsdp2 | (fsdp1 & (gb != a)), (a + gb) * trainable_params(c), 0.0)
    # the reduced shard is cast back to the parameter's own dtype (fp32 sharded params under mixed
    # precision: ``_to_dtype_if_needed(reduce_output, orig_dtype)``; FSDP1 ``_cast_grad_to_param_dtype``)
    orig = master_dtype_bytes(c.precision)
    back = np.where(gb != orig, (gb + orig) * trainable_params(c) / np.maximum(n_g, 1), 0.0)
    rs = np.where((fsdp1 | fsdp2) & (n_g > 1), cast + back, 0.0)
    return fwd, bwd_gather, rs


def contended_interval_s(compute_s, phi, *streams_s):
    """Time of one overlap interval: compute alongside communication streams (each the time of its
    collectives in the interval). While a collective runs, its CTAs hold φ of the SMs
    (``nccl_sm_fraction``), so compute proceeds at 1 − φ: with x = Σ streams, compute finishes at
    c + φ·min(x, c/(1−φ)), i.e. interval = max(c + φ·Σx, max x) (exact for one stream). ASSUMPTION:
    communication speed is not slowed by compute; the exposed collectives (first all-gather, last
    reduce-scatter) run alone and pay nothing."""
    x = sum(streams_s)
    longest = streams_s[0]
    for s_ in streams_s[1:]:
        longest = np.maximum(longest, s_)
    return np.maximum(compute_s + phi * x, longest)


def gemm_efficiency(c, rates: ComputeRates):
    """Efficiency of one micro-batch's matmuls: the measured shape fit where the GPU has one and the
    precision is 16-bit (``gemm_shape_efficiency``), else the nameplate curve eff(m) with
    m = (tokens·h·i)^(1/3), tokens = b·s (``shardplan/calibrate/compute.py`` curve)."""
    tokens = np.asarray(c.micro_batch * c.seq_len, dtype=np.float64)
    m = np.cbrt(tokens * c.hidden_size * np.maximum(c.mlp_width, 1))
    nameplate = rates.gemm_efficiency / (1.0 + (rates.gemm_m_half / m) ** rates.gemm_p)
    measured = np.isfinite(rates.gemm_shape_c0) & (matmul_precision(c) != st.FP32)
    return np.where(measured, gemm_shape_efficiency(c, rates), nameplate)


def _shape_eff(rates: ComputeRates, m, n, k):
    """A · m^a · n^b · k^c clipped to [0.05, the best measured] (NaN where the GPU has no fit: the
    caller takes the nameplate curve there)."""
    raw = rates.gemm_shape_c0 * m ** rates.gemm_shape_cm * n ** rates.gemm_shape_cn * k ** rates.gemm_shape_ck
    return np.clip(raw, 0.05, rates.gemm_shape_eff_max)


def gemm_shape_efficiency(c, rates: ComputeRates):
    """FLOP-weighted efficiency of the model's Linear GEMMs from the measured shape fit
    (``shardplan/calibrate/gemm_shapes.py``): every block Linear (q, k, v, o, gate, up, down) and
    the lm_head, each Y[m, out] = X[m, in]·W as three GEMMs — forward (m, out, in), input
    gradient (m, in, out), weight gradient (in, out, m) — with m = b·s tokens; time = Σ FLOPs/eff.
    ASSUMPTION: LoRA's frozen base (no weight gradient) keeps the same mix."""
    m = np.maximum(np.asarray(c.micro_batch * c.seq_len, dtype=np.float64), 1)
    h, q, kv, i = (np.maximum(np.asarray(x, dtype=np.float64), 1) for x in (c.hidden_size, c.q_width, c.kv_width, c.mlp_width))
    layers = np.asarray(c.num_layers, dtype=np.float64)
    up = np.where(c.gated_mlp, 2.0, 1.0)
    linears = ((q, h, layers), (kv, h, 2 * layers), (h, q, layers), (i, h, up * layers), (h, i, layers),
               (np.maximum(np.asarray(c.vocab_size, dtype=np.float64), 1), h, 1.0))
    flops = time = 0.0
    for out, inp, count in linears:
        f = count * out * inp  # per token; the three GEMMs of a Linear have equal FLOPs
        for shape in ((m, out, inp), (m, inp, out), (inp, out, m)):
            flops = flops + f
            time = time + f / _shape_eff(rates, *shape)
    return flops / time


def compute_time_per_token_s(c, rates: ComputeRates, eff):
    """(forward, backward) seconds per token on one GPU, recompute included in backward. ``eff``:
    ``gemm_efficiency(c, rates)``, which the caller computes once for everything that prices a
    GEMM (``step_time``: it is the costliest part of an evaluation, a sum over every Linear's GEMMs)."""
    peak = rates.peak_flops_by_precision[np.asarray(c.precision)]
    mm_peak = rates.peak_flops_by_precision[matmul_precision(c)]
    f = flops_per_token(c)
    ew = elementwise_bytes_per_token(c) / rates.hbm_bytes_per_s
    share_fwd = 1.0 / (2.0 + BACKWARD_ELEMENTWISE_FACTOR + recompute_fraction(c))
    attn = peak * attention_efficiency(c, rates)
    fwd = f["fwd_matmul"] / (mm_peak * eff) + f["fwd_attention"] / attn + ew * share_fwd
    bwd = f["bwd_matmul"] / (mm_peak * eff) + f["bwd_attention"] / attn + ew * (1 - share_fwd)
    return fwd, bwd


def attention_efficiency(c, rates: ComputeRates):
    """Fraction of peak the attention core runs at: the GPU profile's FlashAttention-2 figure
    (``GPUProfile.attention_efficiency``, also what SDPA's flash / cuDNN kernels and eager attention
    are priced at) × ``attention_rate_factor`` (kernel and sequence length)."""
    return rates.attention_efficiency * attention_rate_factor(c.attention, c.seq_len)


def attention_rate_factor(attention, seq_len):
    """A kernel's rate relative to the profile's figure: × ``TRITON_OVER_FLASH2`` for the Triton
    FlashAttention kernel; flash kernels (not eager) × ``FLASH_SHORT_SEQ_FACTOR`` at ≤ 512 tokens,
    rising log-linearly to 1 at ≥ 16k."""
    kernel = np.asarray(attention)
    x = np.clip(np.log2(np.maximum(np.asarray(seq_len, dtype=np.float64), 1) / FLASH_SEQ_SHORT)
                / np.log2(FLASH_SEQ_LONG / FLASH_SEQ_SHORT), 0.0, 1.0)
    seq = np.where(kernel != st.EAGER, FLASH_SHORT_SEQ_FACTOR + (1 - FLASH_SHORT_SEQ_FACTOR) * x, 1.0)
    return seq * np.where(kernel == st.TRITON, TRITON_OVER_FLASH2, 1.0)


def matmul_precision(c):
    """Precision code the Linear GEMMs run in: the configuration's, except QLoRA, whose 4-bit base
    Linears cast their input to the 16-bit compute dtype and multiply in it whatever the precision
    of the rest (bitsandbytes ``nn/modules.py`` ``Linear4bit.forward``: ``x.to(self.compute_dtype)``
    before ``matmul_4bit``; a kbit-prepared model keeps fp32 norms and adapters around it).
    ASSUMPTION: the compute dtype is bf16 (fp16 on GPUs without bf16: the peak table's bf16 entry
    is their fp16 peak); the rank-r adapter GEMMs, a few per mille of the FLOPs, priced alike."""
    return np.where(c.method == st.QLORA, st.BF16_MIXED, np.asarray(c.precision))


def qlora_dequant_bytes_per_weight(blocksize=QLORA_BLOCKSIZE, nested=True, out_bytes=2.0):
    """HBM bytes one ``dequantize_4bit`` moves per 4-bit weight (bitsandbytes ``functional.py``
    @0.43.3): the kernel reads the packed weight (0.5 B) and one fp32 absmax per block of
    ``blocksize`` weights and writes the 16-bit weight (``out_bytes``). With double quantization
    (``quant_state.nested``) the absmax is first dequantized: ``dequantize_blockwise`` reads its
    uint8 code (1 B per block) and one fp32 absmax per ``QLORA_NESTED_BLOCKSIZE`` blocks and writes
    the fp32 absmax (4 B), ``absmax += quant_state.offset`` reads and writes it again (8 B), and the
    4-bit kernel reads it (4 B): 17 B per block. Without it the kernel reads the stored fp32 absmax (4 B)."""
    per_block = np.where(nested, 1.0 + 4.0 + 8.0 + 4.0 + 4.0 / QLORA_NESTED_BLOCKSIZE, 4.0)
    return 0.5 + out_bytes + per_block / np.asarray(blocksize, dtype=np.float64)


def torchao_nf4_dequant_bytes_per_weight(compiled, blocksize=QLORA_BLOCKSIZE,
                                         scaler_blocksize=QLORA_NESTED_BLOCKSIZE):
    """HBM bytes one dequantization of a torchao ``NF4Tensor`` moves per weight (torchtune's QLoRA:
    ``LinearNF4`` calls ``weight.to(dtype)``, whose ``_to_copy`` handler runs
    ``NF4Tensor.get_original_weight``; pytorch/ao v0.1 ``torchao/dtypes/nf4tensor.py`` l.351-375 and
    l.409-456, the same code at v0.6.1 l.655-679, l.721-747 and l.759-763). Eager, op by op on the n/2 packed
    bytes (two 4-bit codes each), per weight: ``>> 4`` and ``& 0b1111`` (0.5 B read, 0.5 B written
    each), their ``.to(torch.long)`` (0.5 + 4 B each), the ``nf4[codes]`` lookups (4 B of int64
    codes read, 1 B of bf16 written each), the two ``repeated.flatten()`` copies of the per-block
    scalers expanded to n/2 (1 B written each), the two products (2 B read, 1 B written each) and
    ``torch.stack`` (2 + 2 B): 33 B; per block of ``blocksize``, ``dequantize_scalers``' int8 /
    bf16 factor (1 + 2 B; the factor 2 B per ``scaler_blocksize`` blocks), ``+ scaler_mean``
    (2 + 2 B) and the two copies' scaler reads (2 B each): 11 B. ``compiled``: inductor fuses the
    whole chain into one kernel that reads the packed byte (0.5 B), the int8 scaler (1 B per block)
    and its factor and writes the bf16 weight (2 B). Measured on the CPU, torch 2.13 with torchao 0.1
    and 0.6.1 (``calibrate/nf4_dequant_bytes.py``): eager 33.172, compiled 2.516 B per weight."""
    per_block = np.where(compiled, 1.0, 11.0) + 2.0 / scaler_blocksize
    return np.where(compiled, 0.5 + 2.0, 33.0) + per_block / np.asarray(blocksize, dtype=np.float64)


def qlora_dequant_s(c, rates: ComputeRates):
    """QLoRA dequantizes every 4-bit Linear to 16-bit at each use. bitsandbytes ``MatMul4Bit``
    (``autograd/_functions.py`` @0.43.3) calls ``dequantize_4bit`` in its forward (and so again in a
    checkpointed block's recompute) and in its backward for the input gradient
    (``grad_output @ dequantize_4bit(B).t()``): 2 uses, + 1 per recomputed block, each moving
    ``qlora_dequant_bytes_per_weight`` per weight; torch.compile leaves it alone (a custom CUDA
    op). ``nf4_torchao`` (torchtune): torchao's ``LinearNF4`` (v0.1 ``nf4tensor.py`` l.557-574,
    v0.6.1 l.929-940) dequantizes in its forward and again in its backward, eager the same 2 uses
    + recompute at ``torchao_nf4_dequant_bytes_per_weight``; compiled, AOTAutograd's partitioner
    keeps the fused kernel's bf16 weight for the backward matmul instead of dequantizing again
    (measured: no dequantization in the backward graph), so 1 use + 1 per recomputed block (a
    checkpointed block recomputes it once, for that matmul). Per micro-batch. ASSUMPTION: double
    quantization (the QLoRA recipe, ``bnb_4bit_use_double_quant=True``; torchao always) and the
    dequantized dtype is the 16-bit compute dtype (no ``.to(A.dtype)`` copy). The compiled bf16
    weight kept for the backward is in the memory estimate (``activations.nf4_compiled_saved_weight_bytes``)."""
    recompute = recompute_fraction(c)
    compiled = np.asarray(c.compile, dtype=bool)
    torchao = torchao_nf4_qlora(c)
    bnb = qlora_dequant_bytes_per_weight() * (2 + recompute)
    tao = torchao_nf4_dequant_bytes_per_weight(compiled) * (np.where(compiled, 1, 2) + recompute)
    per_weight = np.where(torchao, tao, bnb)
    return np.where(c.method == st.QLORA, c.quantizable_params * per_weight / rates.hbm_bytes_per_s, 0.0)


def optimizer_step_s(c, rates: ComputeRates):
    """GPU optimizer step, memory-bound: the optimizer's own bytes per sharded trainable parameter
    (``model_states.optimizer_step_bytes_per_element`` for the stack's ``optimizer_impl``: AdamW
    fp32 fused 28 B/param, foreach / for-loop 80 B/param). Offloaded: the CPU does it
    (``cpu_optimizer_step_s``)."""
    _, _, n_o = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    per_param = optimizer_step_bytes_per_element(c.optimizer, c.precision, c.hidden_size, c.optimizer_impl,
                                                 c.paged_optimizer)
    shard = trainable_params(c) / n_o
    return np.where(c.offload == st.OFFLOAD_NONE, window_gpu_s(shard * per_param / rates.hbm_bytes_per_s, rates), 0.0)


def cpu_optimizer_step_s(c, rates: ComputeRates):
    """Offloaded optimizer on the host: the same bytes per parameter as on the GPU
    (``optimizer_step_bytes_per_element``, each optimizer its own), streamed by the node's DRAM for
    all its GPUs at once (ASSUMPTION in ``CPU_OPTIMIZER_BYTES_PER_S_PER_NODE``)."""
    _, _, n_o = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    shard = trainable_params(c) / n_o
    per_param = optimizer_step_bytes_per_element(c.optimizer, c.precision, c.hidden_size)
    per_node = shard * per_param * np.minimum(c.gpus_per_node, c.world_size)
    return np.where(c.offload != st.OFFLOAD_NONE, per_node / rates.cpu_optimizer_bytes_per_s_per_node, 0.0)


def offload_transfer_s(c, rates: ComputeRates, syncs):
    """PCIe time per step: gradients device→host at each sync and updated parameters host→device
    once (optimizer offload); with parameter offload (FSDP CPUOffloadPolicy, ZeRO-Infinity) the
    sharded parameters also go host→device before each all-gather (forward, and backward when
    resharded). ASSUMPTION: not overlapped with compute (FSDP2 copies on the default stream)."""
    n_p, n_g, n_o = st.shard_degrees(c.strategy, c.engine, c.world_size, c.shard_group_size)
    t = trainable_params(c)
    a = compute_dtype_bytes(c.precision)
    grads = np.where(c.offload != st.OFFLOAD_NONE, syncs * t * 4.0 / n_g, 0.0)
    params_back = np.where(c.offload != st.OFFLOAD_NONE, t * a / n_o, 0.0)
    moves = per_engine("offload_moves_params", c.engine)
    params_resident = (c.offload == st.OFFLOAD_ALL) | ((c.offload != st.OFFLOAD_NONE) & moves)
    reshard = (c.strategy == st.FULL_SHARD) | (c.strategy == st.HYBRID_SHARD)
    gathers = c.grad_accum * np.where(reshard, 2, 1)
    params_in = np.where(params_resident, gathers * c.total_params * 4.0 / n_p, 0.0)
    return (grads + params_back + params_in) / rates.host_link_bytes_per_s


def paged_migration_s(rates: ComputeRates, paged_bytes, spill_bytes):
    """Host link seconds per step of bitsandbytes' paged optimizer states when the device cannot hold
    them all (``memory``'s ``paged_state_bytes`` and ``paged_spill_bytes``).

    Each step touches every paged state once, in the same parameter order: bitsandbytes
    ``Optimizer8bit.step`` calls ``prefetch_state(p)`` (``functional.prefetch_tensor``:
    ``cudaMemPrefetchAsync`` to the GPU) before each parameter's update kernel and synchronizes after
    it (``optim/optimizer.py`` @0.43.1; torchtune's optimizer-in-backward steps one parameter at a
    time). Pages that do not fit are evicted to host RAM, oldest-resident first: the UVM driver's
    ``pick_root_chunk_to_evict`` takes the head of ``va_block_used``, where a 2 MiB root chunk is
    queued when it becomes resident and is not moved when the GPU reads it (its "TODO: Bug 1765193";
    NVIDIA open-gpu-kernel-modules ``kernel-open/nvidia-uvm/uvm_pmm_gpu.c``). A cyclic sweep over
    more bytes than the room therefore misses on every chunk, not only on the spilled part: each
    step brings all paged bytes in and writes all of them back (the update dirtied them). The
    evicted chunk is the one the incoming data is copied into (``pick_and_evict_root_chunk`` hands
    it to the allocation), so the two copies of a chunk do not overlap: 2 × paged bytes over the
    host link (``GPUProfile.host_link``, the same rate CPU offload uses). ASSUMPTION: migration
    runs at that link's achievable rate and nothing of it hides under compute (the update waits
    for its prefetch and the step synchronizes)."""
    spill = np.asarray(spill_bytes, dtype=np.float64)
    return np.where(spill > 0, 2.0 * np.asarray(paged_bytes, dtype=np.float64), 0.0) / rates.host_link_bytes_per_s


def micro_batch_compute_s(c, rates: ComputeRates, eff):
    """(forward, backward) compute seconds of one micro-batch on one GPU, QLoRA's dequantization
    split evenly between them, and the lm_head's share of it (its matmul share of N_matmul).
    ``eff``: ``gemm_efficiency(c, rates)`` (``compute_time_per_token_s``)."""
    tokens_mb = np.asarray(c.micro_batch * c.seq_len, dtype=np.float64)
    fwd_tok, bwd_tok = compute_time_per_token_s(c, rates, eff)
    dequant = qlora_dequant_s(c, rates)
    head_share = (c.vocab_size * c.hidden_size) / matmul_params_per_token(c)
    fwd, bwd = (window_gpu_s(t * tokens_mb + dequant / 2, rates) for t in (fwd_tok, bwd_tok))
    return fwd, bwd, head_share


def per_unit_collective_s(c, t, v, syncs):
    """Seconds of each collective per FSDP unit and micro-batch (the volume's calls count every
    micro-batch or sync): forward and backward all-gathers, reduce-scatter, all-reduce, replica
    all-reduce, in that order."""
    k = np.asarray(c.grad_accum, dtype=np.float64)
    L = np.asarray(c.num_layers, dtype=np.float64)
    units = L + 1

    def per_call(name, per):
        return np.where(per > 0, t[f"{name}_s"] / np.maximum(per, 1), 0.0)

    sync_den = units * np.maximum(syncs, 1)
    return (per_call("ag_fwd", units * k), per_call("ag_bwd", L * k),
            per_call("rs_grad", sync_den * (v["rs_grad_calls"] > 0)),
            per_call("ar_grad", sync_den * (v["ar_grad_calls"] > 0)),
            per_call("ar_replica", sync_den * (v["ar_replica_calls"] > 0)))


def micro_batches_s(c, rates: ComputeRates, t, v, syncs, host, eff):
    """Seconds of a step's micro-batches with the per-unit overlap (module docstring): ``syncs`` of
    them reduce gradients, the rest (no_sync) do not; each forward and backward at least its eager
    host time (``host``: ``eager_host.host_phase_s``). Also returns the compute seconds of the step (FSDP's own
    copies included) and the seconds the host adds beyond them when nothing is communicated.
    ``eff``: ``gemm_efficiency(c, rates)``, one value for the compute and the limiter's rates."""
    k = np.asarray(c.grad_accum, dtype=np.float64)
    L = np.asarray(c.num_layers, dtype=np.float64)
    units = L + 1
    cf_total, cb_total, head_share = micro_batch_compute_s(c, rates, eff)
    cf, cb = cf_total * (1 - head_share) / L, cb_total * (1 - head_share) / L
    head_f, head_b = cf_total * head_share, cb_total * head_share
    ag_f, ag_b, rs, ar, rep = per_unit_collective_s(c, t, v, syncs)
    # FSDP's copy-out after each all-gather and gradient packing before each reduce-scatter
    # (``fsdp_copy_bytes``), per unit, on the compute stream's time
    copies = fsdp_copy_s(c, rates)
    cp_f, cp_b_gather, cp_rs = (x / units for x in copies)
    cf_u = cf + cp_f
    phi = rates.nccl_sm_fraction
    fwd = ag_f + ag_f + (L - 1) * contended_interval_s(cf_u, phi, ag_f) + cf_u + head_f

    def backward(reduce, cb_u):
        rs_, ar_, rep_ = reduce
        # AG_{i-1} and RS_{i+1} share one stream; DDP's all-reduce and HSDP's replica all-reduce
        # run on their own; the last block's and the root's reductions are exposed.
        interval = contended_interval_s(cb_u, phi, ag_b + rs_, ar_ + rep_)
        return head_b + ag_b + (L - 1) * interval + cb_u + 2 * (rs_ + ar_ + rep_)

    zero = np.zeros_like(rs)
    f_only, b_only = _compute_only((cf_total, cb_total), copies)
    # each phase takes max(host, GPU): eager launches run ahead of the GPU (eager_host module docstring),
    # except where FSDP1's rate limiter holds the host to one adapted Linear ahead (fsdp1_limiter)
    host_f, host_b, _ = host
    per_position = limiter_rates(c, rates, eff)  # once: the GEMM rate is also what an expert's interval runs at
    lim_f, lim_b = limiter_exposure_s(c, cf_u, cb + cp_b_gather, per_position)
    # and where an MoE's expert loop syncs the host once per expert (moe_sync)
    moe_f, moe_b = sync_exposure_s(c, expert_gemm_s(c, rates, per_position[0]))
    host_f, host_b = np.maximum(host_f, f_only + lim_f + moe_f), np.maximum(host_b, b_only + lim_b + moe_b)
    fwd = np.maximum(fwd, host_f)
    bwd_sync = np.maximum(backward((rs, ar, rep), cb + cp_b_gather + cp_rs), host_b)
    bwd_nosync = np.maximum(backward((zero, zero, zero), cb + cp_b_gather), host_b)
    micro = syncs * (fwd + bwd_sync) + (k - syncs) * (fwd + bwd_nosync)
    compute = k * (cf_total + cb_total + units * (cp_f + cp_b_gather)) + syncs * units * cp_rs
    # the host's share beyond the compute alone (no communication): what a compute-only run waits
    host_wait = k * (np.maximum(host_f - f_only, 0.0) + np.maximum(host_b - b_only, 0.0))
    return micro, compute, host_wait


def expert_gemm_s(c, rates: ComputeRates, s_per_flop=None):
    """GPU seconds of one routed expert's GEMMs per micro-batch (``moe_sync``): 2·(2 + gated)·h·i
    FLOPs for each of tokens·k/E rows (even routing; i = ``mlp_width`` / k, no shared experts) at
    the GEMM rate (``s_per_flop``: ``limiter_rates``' first, computed here when not given),
    window-scaled; 0 for a dense model."""
    e, k = np.asarray(c.moe_experts, dtype=np.float64), np.asarray(c.moe_top_k, dtype=np.float64)
    rows = np.asarray(c.micro_batch * c.seq_len, dtype=np.float64) * k / np.maximum(e, 1)
    width = np.asarray(c.mlp_width, dtype=np.float64) / np.maximum(k, 1)
    flops = rows * 2 * (2 + np.asarray(c.gated_mlp, dtype=np.float64)) * np.asarray(c.hidden_size) * width
    s_per_flop = limiter_rates(c, rates, gemm_efficiency(c, rates))[0] if s_per_flop is None else s_per_flop
    return window_gpu_s(flops * s_per_flop, rates)


def limiter_rates(c, rates: ComputeRates, eff):
    """What ``fsdp1_limiter.position_weights`` prices a layer's positions with: seconds per matmul
    FLOP (at ``eff``: ``gemm_efficiency(c, rates)``, the compute's own), per attention-core FLOP,
    and PEFT's adapter path (forward, backward) seconds per token."""
    mm_peak = rates.peak_flops_by_precision[matmul_precision(c)]
    attn_peak = rates.peak_flops_by_precision[np.asarray(c.precision)]
    adapter = tuple(x / rates.hbm_bytes_per_s for x in lora_adapter_pass_bytes(c))
    return 1.0 / (mm_peak * eff), 1.0 / (attn_peak * attention_efficiency(c, rates)), adapter


def compute_only_phases_s(c, rates: ComputeRates):
    """(forward, backward) GPU seconds of one micro-batch without communication: compute and FSDP's
    copy-out after each all-gather (gradient packing left out, as for a no_sync micro-batch)."""
    return _compute_only(micro_batch_compute_s(c, rates, gemm_efficiency(c, rates)), fsdp_copy_s(c, rates))


def _compute_only(compute, copies):
    """``compute_only_phases_s`` from a micro-batch's (forward, backward) compute seconds and its
    ``fsdp_copy_s``, which ``micro_batches_s`` has already."""
    return compute[0] + copies[0], compute[1] + copies[1]


def fsdp_copy_s(c, rates: ComputeRates):
    """(forward copy-out, backward copy-out, gradient packing) GPU seconds per micro-batch of FSDP's
    own copies (``fsdp_copy_bytes``) at the HBM rate."""
    return tuple(window_gpu_s(x / rates.hbm_bytes_per_s, rates) for x in fsdp_copy_bytes(c))


def step_time(c, links: LinkRates, rates: ComputeRates, sync_every_micro_batch=None, volume=None, memory=None):
    """Every time column for the configurations in ``c`` (Columns; see module docstring).
    ``sync_every_micro_batch`` None: the configuration's column. ``memory``: ``estimate_memory``'s
    columns of the same rows, for the paged optimizer states the device cannot hold
    (``paged_migration_s``); None: none spill."""
    sync_every_micro_batch = c.sync_every_micro_batch if sync_every_micro_batch is None else sync_every_micro_batch
    v = comm_volume(c, sync_every_micro_batch) if volume is None else volume
    t = comm_times(c, links, v)
    reduces = v["rs_grad_calls"] + v["ar_grad_calls"] + v["ar_replica_calls"] > 0
    syncs = np.asarray(np.where(reduces, sync_count(c, sync_every_micro_batch), 0), dtype=np.float64)
    host = host_phase_s(c)  # (forward, backward, optimizer step) seconds of the eager host
    # once per evaluation (the costliest part of it): the compute, FSDP1's limiter, the MoE expert
    # loop and the reported column all price the Linear GEMMs at this one efficiency
    eff = gemm_efficiency(c, rates)
    micro, compute, host_wait = micro_batches_s(c, rates, t, v, syncs, host, eff)
    opt = optimizer_step_s(c, rates)
    host_opt = host[2]
    host_wait = host_wait + np.maximum(host_opt - opt, 0.0)
    cpu_opt = cpu_optimizer_step_s(c, rates)
    offload = offload_transfer_s(c, rates, syncs)
    if memory is not None:  # paged states migrate over the same host link (module docstring)
        offload = offload + paged_migration_s(rates, memory["paged_state_bytes"], memory["paged_spill_bytes"])
    step = micro + np.maximum(opt, host_opt) + cpu_opt + offload + t["ag_post_step_s"]
    out = {f"{n}_s": t[f"{n}_s"] for n in COLLECTIVE_OP}
    out.update(compute_s=compute, optimizer_s=opt + cpu_opt, offload_transfer_s=offload, host_wait_s=host_wait,
               comm_s=sum(t[f"{n}_s"] for n in COLLECTIVE_OP), step_time_s=step,
               exposed_comm_s=np.maximum(step - compute - opt - cpu_opt - offload - host_wait, 0.0))
    out.update(rates_per_step(c, rates, step, eff))
    return out


def rates_per_step(c, rates: ComputeRates, step_s, eff):
    """Tokens per step and per second, MFU, HFU and the recompute share for a step of ``step_s``, and
    the GEMM efficiency ``eff`` it was priced at (``gemm_efficiency``)."""
    peak = rates.peak_flops_by_precision[np.asarray(c.precision)]
    tokens_step = np.asarray(c.micro_batch * c.seq_len, dtype=np.float64) * np.asarray(c.grad_accum, dtype=np.float64)
    f = flops_per_token(c)
    hw_flops = (f["fwd_matmul"] + f["bwd_matmul"] + f["fwd_attention"] + f["bwd_attention"]) * tokens_step
    return dict(
        tokens_per_step_per_gpu=tokens_step, tokens_per_s_per_gpu=tokens_step / step_s,
        tokens_per_s=tokens_step * c.world_size / step_s,
        mfu=model_flops_per_token(c) * tokens_step / (step_s * peak),
        hfu=hw_flops / (step_s * peak),
        # recomputed FLOPs over those the step runs without them (hfu/mfu is not this: under LoRA the
        # model-FLOPs convention 6N exceeds what the frozen base computes, 4N)
        recompute_extra=f["recompute"] * tokens_step / np.maximum(hw_flops - f["recompute"] * tokens_step, 1e-12),
        gemm_efficiency=eff,
    )


def training_cost(tokens_per_s, world_size, train_tokens, price_per_gpu_hour=None):
    """Time, GPU-hours and (given a $/GPU-hour) cost to train ``train_tokens`` tokens."""
    seconds = np.asarray(train_tokens, dtype=np.float64) / tokens_per_s
    gpu_hours = seconds * world_size / 3600.0
    out = {"time_to_train_s": seconds, "gpu_hours": gpu_hours}
    if price_per_gpu_hour is not None:
        out["cost"] = gpu_hours * price_per_gpu_hour
    return out
