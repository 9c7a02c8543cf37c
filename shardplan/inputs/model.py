"""ModelSpec: a decoder transformer's dimensions, and every parameter count derived from them.

Counts follow the Hugging Face `transformers` module layout of each family (which Linear has a
bias, how many norms a block owns, fused MoE expert banks) and are pinned exactly against models
built on the meta device (tests/data/hf_model_counts.csv). FLOPs per token follow PaLM (Chowdhery
et al. 2022, App. B): 6·N_matmul + 12·L·n_heads·head_dim·s for training.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardplan.support.limits import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_PARAMS, MAX_POSITIONS, MAX_VOCAB

# Dimensions with their stated ranges (limits.py): a profile file or an API caller past them is refused
# by name before any per-layer list or int64 formula sees the value.
Width = Annotated[int, Field(gt=0, le=MAX_HIDDEN)]
Layers = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
Heads = Annotated[int, Field(gt=0, le=MAX_HEADS)]
Experts = Annotated[int, Field(gt=0, le=MAX_EXPERTS)]
Positions = Annotated[int, Field(gt=0, le=MAX_POSITIONS)]


class MoESpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_experts: Experts
    experts_per_token: Experts
    intermediate_size: Width
    shared_experts: int = Field(0, ge=0, le=MAX_EXPERTS, description="always-active experts of the same width")
    first_dense_layers: int = Field(0, ge=0, le=MAX_LAYERS, description="leading blocks with a dense MLP instead")
    layer_step: Layers = Field(
        1, description="every k-th block is MoE: block i when (i + 1) % k == 0 (Qwen3-MoE decoder_sparse_step, "
                       "Llama 4 interleave_moe_layer_step)")
    dense_layers: tuple[Annotated[int, Field(ge=0, lt=MAX_LAYERS)], ...] = Field(
        (), max_length=MAX_LAYERS, description="blocks forced dense (Qwen3-MoE mlp_only_layers)")
    lora_adapts_experts: bool = Field(
        False, description="PEFT's all-linear adapts the expert banks: families whose experts transformers 5 fused "
                           "(Mixtral, Qwen3-MoE, DeepSeek-V2/V3; not Llama 4, fused already in transformers 4)")

    def is_moe_layer(self, index: int) -> bool:
        """Block ``index`` holds experts: the union of transformers' rules, DeepSeek
        (``layer_idx >= first_k_dense_replace``), Qwen3-MoE (``layer_idx not in mlp_only_layers and
        (layer_idx + 1) % decoder_sparse_step == 0``) and Llama 4 (``moe_layers`` =
        ``range(step - 1, L, step)``)."""
        return (index >= self.first_dense_layers and (index + 1) % self.layer_step == 0
                and index not in self.dense_layers)


class MLASpec(BaseModel):
    """DeepSeek-V2 multi-head latent attention (arXiv 2405.04434, §2.1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kv_lora_rank: Width
    q_lora_rank: Width | None = None
    qk_rope_head_dim: Width
    qk_nope_head_dim: Width
    v_head_dim: Width


Shape = tuple[Annotated[int, Field(gt=0, le=MAX_PARAMS)], ...]


class ModuleTree(BaseModel):
    """A model's parameter tensors as transformers builds them (``calibrate/module_tree.py``: the
    module tree on the meta device, for a ``model_type`` no family reader knows). Where a spec has
    one, its counts and tensor shapes are these, not the ones its dimensions would give."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(description="the class and library version that built it")
    root: tuple[Shape, ...] = Field(description="tensors outside the decoder blocks, a shared (tied) one once")
    blocks: tuple[tuple[Shape, ...], ...] = Field(min_length=1, max_length=MAX_LAYERS,
                                                  description="each decoder block's tensors, in order")
    block_norm_params: int = Field(ge=0, description="elements of block 0's normalization modules")
    largest_module_params: int = Field(gt=0, description="the largest module's own parameters (ZeRO-3's unit)")


def _elements(shapes) -> int:
    return sum(math.prod(s) for s in shapes)


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    display_name: str = ""
    aliases: tuple[str, ...] = ()
    source: str = ""
    family: Literal["llama", "mistral", "mixtral", "qwen2", "gemma2", "gpt2", "opt", "falcon", "deepseek_v2",
                    "qwen3", "qwen3_moe", "gemma3_text", "phi3", "llama4_text", "olmo2", "granite", "deepseek_v3",
                    "module_tree"]  # module_tree: another model_type, read from its module tree (ModuleTree)
    block_class: str = Field("", description="the transformers class FSDP wraps, e.g. LlamaDecoderLayer")

    vocab_size: Annotated[int, Field(gt=0, le=MAX_VOCAB)]
    hidden_size: Width
    num_layers: Layers
    num_heads: Heads
    num_kv_heads: Heads
    head_dim: Width | None = None
    intermediate_size: Width
    max_position_embeddings: Positions

    mlp: Literal["swiglu", "geglu", "gelu", "relu"]
    norm: Literal["rmsnorm", "layernorm"]
    norms_per_block: Annotated[int, Field(gt=0, le=16)] = 2
    qk_norm: Literal["none", "head", "width"] = Field(
        "none", description="RMSNorm on queries and keys: 'head' one weight of head_dim each (Qwen3, Gemma 3), "
                            "'width' over the whole q and k projections (OLMo 2)")
    norm_multiply_fp32: bool = Field(
        False, description="RMSNorm multiplies its weight in fp32 and casts after (Gemma's (1 + w)·x, OLMo 2's w·x), "
                           "so it saves the normalized tensor in fp32 (Llama's casts first and saves it 16-bit)")
    fused_qkv: bool = Field(False, description="one Linear makes q, k and v (GPT-2 c_attn, Falcon, Phi-3 qkv_proj)")
    fused_gate_up: bool = Field(False, description="one Linear makes gate and up (Phi-3 gate_up_proj)")
    qkv_bias: bool = False
    out_proj_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    learned_position_embeddings: bool = False
    position_embedding_offset: int = Field(0, ge=0, le=MAX_POSITIONS, description="OPT keeps 2 extra position rows")
    sliding_window: Positions | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    assumed: tuple[str, ...] = Field(
        (), description="what the source config did not say and the value taken for it (hf_config.spec_from_hf_config)")
    module_tree: ModuleTree | None = Field(
        None, description="tensor shapes transformers built on the meta device; the counts come from them")

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelSpec":
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}")
        if self.moe and self.moe.experts_per_token > self.moe.num_experts:
            raise ValueError("moe.experts_per_token exceeds moe.num_experts")
        if self.module_tree and len(self.module_tree.blocks) != self.num_layers:
            raise ValueError(f"module_tree has {len(self.module_tree.blocks)} blocks, num_layers={self.num_layers}")
        if self.total_params > MAX_PARAMS:
            raise ValueError(f"{self.total_params:,} parameters exceeds the {MAX_PARAMS:,} shardplan plans for")
        return self

    # --- shapes -------------------------------------------------------------------------------
    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def q_width(self) -> int:
        """Width of the query projection output (n_heads × head_dim)."""
        if self.mla:
            return self.num_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_heads * self.resolved_head_dim

    @property
    def kv_width(self) -> int:
        """Width of one of K or V (n_kv_heads × head_dim); GQA/MQA make it narrower than q."""
        return self.num_kv_heads * self.resolved_head_dim

    @property
    def attn_out_width(self) -> int:
        if self.mla:
            return self.num_heads * self.mla.v_head_dim
        return self.num_heads * self.resolved_head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in ("swiglu", "geglu")

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    # --- per-block parameter counts -----------------------------------------------------------
    @property
    def attention_params(self) -> int:
        h = self.hidden_size
        if self.mla:
            m = self.mla
            q = h * m.q_lora_rank + m.q_lora_rank * self.q_width if m.q_lora_rank else h * self.q_width
            kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
            kv_b = m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv_a + kv_b + self.attn_out_width * h
        qkv = h * (self.q_width + 2 * self.kv_width)
        if self.qkv_bias:
            qkv += self.q_width + 2 * self.kv_width
        out = self.attn_out_width * h + (h if self.out_proj_bias else 0)
        return qkv + out

    def mlp_params_for(self, intermediate: int) -> int:
        h = self.hidden_size
        if self.gated_mlp:
            return 3 * h * intermediate + (2 * intermediate + h if self.mlp_bias else 0)
        return 2 * h * intermediate + (intermediate + h if self.mlp_bias else 0)

    @property
    def dense_mlp_params(self) -> int:
        return self.mlp_params_for(self.intermediate_size)

    @property
    def routed_experts_params_per_block(self) -> int:
        """The fused expert bank of one MoE block (transformers 5 keeps it as one module)."""
        if not self.moe:
            return 0
        return self.moe.num_experts * self.mlp_params_for(self.moe.intermediate_size)

    @property
    def moe_block_mlp_params(self) -> int:
        moe = self.moe
        if not moe:
            return self.dense_mlp_params
        shared = self.mlp_params_for(moe.shared_experts * moe.intermediate_size) if moe.shared_experts else 0
        router = moe.num_experts * self.hidden_size
        return self.routed_experts_params_per_block + shared + router

    @property
    def moe_layer_mask(self) -> tuple[bool, ...]:
        """For each block, whether it holds experts (``MoESpec.is_moe_layer``)."""
        return tuple(bool(self.moe and self.moe.is_moe_layer(i)) for i in range(self.num_layers))

    @property
    def num_moe_blocks(self) -> int:
        return sum(self.moe_layer_mask)

    @property
    def attention_norm_params(self) -> int:
        """Norms inside the attention: q/k norms (Qwen3 and Gemma 3 ``q_norm``/``k_norm`` of head_dim,
        OLMo 2's of the full q and k widths) and MLA's ``q_a_layernorm``/``kv_a_layernorm``."""
        if self.mla:
            return (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank
        widths = {"none": 0, "head": 2 * self.resolved_head_dim, "width": self.q_width + self.kv_width}
        return widths[self.qk_norm]

    @property
    def attention_norm_width(self) -> int:
        """Elements per token the norms inside the attention normalize: q and k (q/k norms act on the
        whole tensors whether their weight is per head or per width), or MLA's q and kv latents."""
        if self.mla:
            return (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank
        return 0 if self.qk_norm == "none" else self.q_width + self.kv_width

    @property
    def attention_norm_rows(self) -> int:
        """Normalized rows per token (one fp32 rstd each): per head for head-wise q/k norms, one per
        tensor for width-wise ones and MLA's latent norms."""
        if self.mla:
            return (1 if self.mla.q_lora_rank else 0) + 1
        return {"none": 0, "head": self.num_heads + self.num_kv_heads, "width": 2}[self.qk_norm]

    @property
    def block_norm_params(self) -> int:
        """Every norm weight of one block (the 1-D tensors that are not Linear biases)."""
        if self.module_tree:
            return self.module_tree.block_norm_params
        return self.norms_per_block * self.norm_params + self.attention_norm_params

    @property
    def dense_block_params(self) -> int:
        return self.attention_params + self.dense_mlp_params + self.block_norm_params

    @property
    def moe_block_params(self) -> int:
        return self.attention_params + self.moe_block_mlp_params + self.block_norm_params

    @property
    def block_params(self) -> tuple[int, ...]:
        """Parameters of each decoder block, in order (blocks differ only for partly-MoE models)."""
        if self.module_tree:
            return tuple(_elements(b) for b in self.module_tree.blocks)
        return tuple(self.moe_block_params if moe else self.dense_block_params for moe in self.moe_layer_mask)

    @property
    def largest_block_params(self) -> int:
        return max(self.block_params)

    @property
    def blocks_params(self) -> int:
        return sum(self.block_params)

    # --- non-block parameters -----------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The output projection's weight, whether or not it shares storage with the embedding."""
        return self.vocab_size * self.hidden_size

    @property
    def position_embedding_params(self) -> int:
        if not self.learned_position_embeddings:
            return 0
        return (self.max_position_embeddings + self.position_embedding_offset) * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return self.norm_params

    @property
    def root_params(self) -> int:
        """What is not inside a decoder block: FSDP's root unit when each block is wrapped."""
        if self.module_tree:
            return _elements(self.module_tree.root)
        untied_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + untied_head + self.position_embedding_params + self.final_norm_params

    @property
    def total_params(self) -> int:
        return self.root_params + self.blocks_params

    @property
    def non_embedding_params(self) -> int:
        """Total minus embedding tables (token, position) and an untied lm_head (HF convention)."""
        untied_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.total_params - self.embedding_params - self.position_embedding_params - untied_head

    @property
    def largest_module_params(self) -> int:
        """Largest module that owns its parameters directly (DeepSpeed ZeRO-3's gathered unit).

        Candidates: token embedding, an untied lm_head, one MLP projection (Phi-3's fused gate_up),
        a fused QKV projection (GPT-2, Falcon, Phi-3), and a fused MoE expert bank (transformers >= 5 keeps it as one module).
        """
        if self.module_tree:
            return self.module_tree.largest_module_params
        h = self.hidden_size
        ups = 2 if self.fused_gate_up else 1
        mlp_proj = ups * (h * self.intermediate_size + (self.intermediate_size if self.mlp_bias else 0))
        candidates = [self.embedding_params, mlp_proj, self.routed_experts_params_per_block]
        if not self.tie_word_embeddings:
            candidates.append(self.lm_head_params)
        if self.fused_qkv:
            width = self.q_width + 2 * self.kv_width
            candidates.append(h * width + (width if self.qkv_bias else 0))
        return max(candidates)

    # --- parameter tensors (FSDP units) ---------------------------------------------------------
    def block_parameter_shapes(self, moe_block: bool = False) -> tuple[tuple[int, ...], ...]:
        """Shapes of one decoder block's parameter tensors, ``nn.Linear`` layout (out, in).

        FSDP2 shards every tensor on dim 0 and pads dim 0 up to a multiple of the shard count, and
        optimizers keep per-tensor state (Adam's ``step``): both need the tensors, not the counts.
        Fused projections are one tensor (Phi-3 ``qkv_proj`` and ``gate_up_proj``, GPT-2/Falcon's
        QKV); a MoE expert bank is two (E, 2·I, h) ``gate_up_proj`` and (E, h, I) ``down_proj``
        parameters (transformers 5 ``MixtralExperts``, ``Qwen3MoeExperts``, ``DeepseekV3NaiveMoe``).
        ASSUMPTION: GPT-2's ``Conv1D`` (in, out) and Llama 4's (E, h, 2·I) bank layouts are not
        mirrored (dim 0 is what FSDP pads: the expert count either way, and the calibration harness
        uses ``nn.Linear``).
        """
        if self.module_tree:  # every block as transformers built it (the first, where blocks differ)
            return self.module_tree.blocks[0]
        h, q, kv, o = self.hidden_size, self.q_width, self.kv_width, self.attn_out_width
        shapes: list[tuple[int, ...]] = []
        norm = [(h,), (h,)] if self.norm == "layernorm" else [(h,)]
        if self.mla:
            m = self.mla
            if m.q_lora_rank:
                shapes += [(m.q_lora_rank, h), (m.q_lora_rank,), (q, m.q_lora_rank)]
            else:
                shapes.append((q, h))
            shapes += [(m.kv_lora_rank + m.qk_rope_head_dim, h), (m.kv_lora_rank,),
                       (self.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank), (h, o)]
        elif self.fused_qkv:
            shapes.append((q + 2 * kv, h))
            if self.qkv_bias:
                shapes.append((q + 2 * kv,))
            shapes.append((h, o))
        else:
            shapes += [(q, h), (kv, h), (kv, h)]
            if self.qkv_bias:
                shapes += [(q,), (kv,), (kv,)]
            shapes.append((h, o))
        if self.out_proj_bias:
            shapes.append((h,))
        shapes += {"none": [], "head": [(self.resolved_head_dim,)] * 2, "width": [(q,), (kv,)]}[self.qk_norm]

        def mlp(width: int) -> list[tuple[int, ...]]:
            ups = 2 if self.gated_mlp else 1
            fused = self.fused_gate_up and self.gated_mlp
            out = [(2 * width, h)] if fused else [(width, h)] * ups
            out.append((h, width))
            if self.mlp_bias:
                out += ([(2 * width,)] if fused else [(width,)] * ups) + [(h,)]
            return out

        if moe_block and self.moe:
            moe, e = self.moe, self.moe.num_experts
            ups = 2 if self.gated_mlp else 1
            shapes += [(e, h), (e, ups * moe.intermediate_size, h), (e, h, moe.intermediate_size)]  # router, bank
            if moe.shared_experts:
                shapes += mlp(moe.shared_experts * moe.intermediate_size)
        else:
            shapes += mlp(self.intermediate_size)
        shapes += norm * self.norms_per_block
        return tuple(shapes)

    def root_parameter_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The root unit's tensors: token embedding, learned positions, final norm, untied lm_head."""
        if self.module_tree:
            return self.module_tree.root
        h = self.hidden_size
        shapes: list[tuple[int, ...]] = [(self.vocab_size, h)]
        if self.learned_position_embeddings:
            shapes.append((self.max_position_embeddings + self.position_embedding_offset, h))
        shapes += [(h,), (h,)] if self.norm == "layernorm" else [(h,)]
        if not self.tie_word_embeddings:
            shapes.append((self.vocab_size, h))
        return tuple(shapes)

    def parameter_shapes(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Parameter tensor shapes per FSDP unit: ``root`` and ``block0`` ... ``block{L-1}``."""
        out = {"root": self.root_parameter_shapes()}
        if self.module_tree:
            return {**out, **{f"block{i}": b for i, b in enumerate(self.module_tree.blocks)}}
        for i, moe in enumerate(self.moe_layer_mask):
            out[f"block{i}"] = self.block_parameter_shapes(moe_block=moe)
        return out

    # --- MoE ------------------------------------------------------------------------------------
    @property
    def routed_experts_params(self) -> int:
        return self.routed_experts_params_per_block * self.num_moe_blocks

    @property
    def active_params_per_token(self) -> int:
        """Parameters one token touches: the unrouted experts drop out."""
        if not self.moe:
            return self.total_params
        idle = (self.moe.num_experts - self.moe.experts_per_token) / self.moe.num_experts
        return self.total_params - round(self.routed_experts_params * idle)

    # --- FLOPs (the module functions below, shared with the vectorized formulas) ------------------
    @property
    def matmul_params_per_token(self) -> int:
        """``matmul_params_per_token`` of this model: its active block parameters (MoE: the routed
        experts a token skips left out) plus the lm_head."""
        return matmul_params_per_token(self.active_params_per_token - self.root_params, self.vocab_size, self.hidden_size)

    def attention_flops_per_token(self, seq_len) -> object:
        """``attention_flops_per_token`` of this model, full (non-causal-skipping) attention as PaLM
        and torchtitan count it."""
        return attention_flops_per_token(self.num_layers, self.q_width, seq_len)

    def train_flops_per_token(self, seq_len) -> object:
        """``train_flops_per_token``: 6N + 12·L·H·Q·T (PaLM App. B)."""
        return train_flops_per_token(self.matmul_params_per_token, self.attention_flops_per_token(seq_len))


# --- FLOPs per token: one definition for a ModelSpec (ints) and for Columns (arrays) ------------------
def matmul_params_per_token(active_block_params, vocab_size, hidden_size):
    """N_matmul, the parameters that enter a matmul for one token (PaLM, Chowdhery et al. 2022, App. B:
    N excludes the embeddings; torchtitan ``get_dense_model_nparams_and_flops``): the active block
    parameters plus the lm_head (V·h; a tied head still multiplies, while the embedding lookup is
    a gather). ASSUMPTION: block norms and biases are counted as PaLM's N counts them (< 0.1 % of
    N for every profile; they are element-wise work, not matmuls)."""
    return active_block_params + vocab_size * hidden_size


def attention_flops_per_token(num_layers, q_width, seq_len, causal=False):
    """Forward score + value FLOPs per token: 2·2·L·s·q, q = n_heads·head_dim (PaLM App. B); with
    ``causal`` half of it, what flash kernels execute under a causal mask (FlashAttention-2 paper,
    §4.1). Exact integers for int inputs; pass float arrays where the product could pass 2**63."""
    full = 4 * num_layers * seq_len * q_width
    return full / 2 if causal else full


def train_flops_per_token(matmul_params, attention_forward_flops):
    """Training FLOPs per token: forward 2N + backward 4N, and 3 × the attention forward
    (PaLM App. B: 6N + 12·L·H·Q·T with the full attention count)."""
    return 6 * matmul_params + 3 * attention_forward_flops


LORA_TARGETS = ("all-linear", "attention", "qv")


def lora_target_code(targets: str) -> int:
    """``targets`` -> index into ``strategy.LORA_TARGETS``, through the one vocabulary (also "q,v",
    "all", "all-linear+lm_head"; shardplan/inputs/vocabulary.py); a one-line error names anything else."""
    from shardplan.inputs import strategy as st

    return st.code(st.LORA_TARGETS, targets, "lora_targets")


def lora_params_per_block(spec: ModelSpec, rank: int, targets: str = "all-linear",
                          moe_block: bool | None = None) -> int:
    """Adapter parameters one block gains: rank·(in + out) per targeted Linear (Hu et al. 2021, §4).

    Targets (``strategy.LORA_TARGETS``): "qv" — q_proj and v_proj (PEFT's default
    ``target_modules`` for Llama, ``peft/utils/constants.py``
    ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``; torchtune's
    ``lora_attn_modules=['q_proj', 'v_proj']``); "attention" — q, k, v, o; "all-linear" — every
    Linear of the blocks (PEFT ``target_modules="all-linear"``, which excludes the output layer:
    ``peft/tuners/tuners_utils.py`` ``_maybe_include_all_linear_layers``);
    "all-linear+embeddings" — the same per block, plus the root's adapters (``lora_root_params``).
    A fused projection is one Linear, so one adapter: Phi-3's ``qkv_proj`` is rank·(h + q + 2·kv)
    (and is what "qv" adapts there: the model has no separate q/v), its ``gate_up_proj``
    rank·(h + 2·I). ``moe_block`` picks the MLP of a MoE block (its shared experts) or of a dense
    one (default: whichever the model has, for callers that treat blocks alike; totals use
    ``lora_blocks_params``). Unknown names are a one-line error.

    MoE blocks under "all-linear": the router (Llama 4's ``nn.Linear``, the others' (E, h)
    parameter through PEFT's ``ParamWrapper``) gains rank·(h + E); with
    ``MoESpec.lora_adapts_experts`` PEFT (0.21, ``utils/transformers_weight_conversion.py``
    ``_convert_peft_config_moe``) turns the per-expert targets into ``target_parameters`` on the
    fused banks, rank 2r on ``gate_up_proj`` (w1 + w3 fused) and r on ``down_proj``, each a
    ``ParamWrapper`` with ``lora_A`` = Linear(in, rank·E) and ``lora_B`` = Linear(rank·E, out):
    2r·E·(h + 2·I) + r·E·(I + h). That conversion matches targets by the per-expert names
    (``gate_proj``/``up_proj``/``down_proj``, ``w1``/``w2``/``w3``), so the Linears of the dense
    blocks' MLPs and of the shared experts, which carry the same names, lose their adapters.
    Pinned to PEFT on meta-device Qwen3-MoE, Mixtral, DeepSeek-V2/V3 and Llama 4 models
    (tests/test_hf_families.py).

    MLA under "all-linear": each of its Linears (``q_a_proj`` + ``q_b_proj`` or ``q_proj``,
    ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``) gains rank·(in + out).
    ASSUMPTION: for "qv" and "attention", MLA's projections are counted like q/k/v/o widths.
    """
    code = lora_target_code(targets)
    moe = spec.moe is not None if moe_block is None else moe_block and spec.moe is not None
    qv, attention, all_attention = _lora_attention_dims(spec)
    dims = [qv, attention][code] if code < 2 else all_attention + _lora_mlp_dims(spec, moe)
    if moe and code >= 2:
        dims += _lora_moe_dims(spec)
    return rank * dims


def _lora_attention_dims(spec: ModelSpec) -> tuple[int, int, int]:
    """Σ(in + out) of the adapted attention Linears for "qv", "attention" and "all-linear"
    (MLA's own projections for the last; ``lora_params_per_block``)."""
    h = spec.hidden_size
    if spec.fused_qkv:
        qkv = h + spec.q_width + 2 * spec.kv_width
        qv, attention = qkv, qkv + spec.attn_out_width + h
    else:
        qv = 2 * h + spec.q_width + spec.kv_width
        attention = qv + h + spec.kv_width + spec.attn_out_width + h
    if not spec.mla:
        return qv, attention, attention
    m = spec.mla
    q = (h + 2 * m.q_lora_rank + spec.q_width) if m.q_lora_rank else h + spec.q_width
    kv = (h + m.kv_lora_rank + m.qk_rope_head_dim) + (m.kv_lora_rank + spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim))
    return qv, attention, q + kv + spec.attn_out_width + h


def _lora_mlp_width(spec: ModelSpec, moe_block: bool) -> int:
    """Width of the MLP whose Linears keep their adapters: a MoE block's shared experts or the dense
    MLP; 0 when PEFT's MoE conversion took the MLP names over (``MoESpec.lora_adapts_experts``)."""
    if spec.moe is not None and spec.moe.lora_adapts_experts:
        return 0
    return spec.moe.shared_experts * spec.moe.intermediate_size if moe_block else spec.intermediate_size


def _lora_mlp_dims(spec: ModelSpec, moe_block: bool) -> int:
    """Σ(in + out) of the adapted MLP Linears ("all-linear"): gate, up, down (Phi-3's fused
    gate_up is one Linear), or up and down for a non-gated MLP."""
    h, width = spec.hidden_size, _lora_mlp_width(spec, moe_block)
    if not width:
        return 0
    if spec.gated_mlp:
        return (h + 2 * width if spec.fused_gate_up else 2 * (h + width)) + (h + width)
    return 2 * (h + width)


def _lora_moe_dims(spec: ModelSpec) -> int:
    """A MoE block's router, h + E, and with ``lora_adapts_experts`` the expert banks'
    ``ParamWrapper`` adapters, 2·E·(h + 2·I) + E·(I + h) (``lora_params_per_block``)."""
    e, width, h = spec.moe.num_experts, spec.moe.intermediate_size, spec.hidden_size
    return h + e + (2 * e * (h + 2 * width) + e * (width + h) if spec.moe.lora_adapts_experts else 0)


def lora_blocks_params(spec: ModelSpec, rank: int, targets: str = "all-linear") -> int:
    """Adapters of all blocks: dense and MoE blocks differ in their MLP (``lora_params_per_block``)."""
    return sum(lora_params_per_block(spec, rank, targets, moe_block=m) for m in spec.moe_layer_mask)


def lora_root_params(spec: ModelSpec, rank: int, targets: str = "all-linear") -> int:
    """Adapters on the root with "all-linear+embeddings": the embedding (PEFT ``lora.Embedding``:
    A is r×V, B is h×r) and the lm_head Linear (r·(h + V)); each is its own module even when the
    weights are tied. Zero for the other targets."""
    from shardplan.inputs import strategy as st

    if lora_target_code(targets) != st.LORA_TARGETS.index("all-linear+embeddings"):
        return 0
    return 2 * rank * (spec.vocab_size + spec.hidden_size)
def lora_adapted_inputs(spec: ModelSpec, targets: str = "all-linear", rank: int = 16) -> dict[str, int]:
    """Per block, what PEFT's LoRA forward keeps for the adapters' backward (``activations.lora_*``):

    * ``lora_adapted_linears``: how many Linears are adapted;
    * ``lora_adapted_in``: the sum of their input widths (each adapted layer makes its own fp32
      cast / dropout copy of its input: peft ``tuners/lora/layer.py`` ``Linear.forward``);
    * ``lora_unique_in``: the widths of the distinct input tensors when neither happens (q/k/v
      share the attention norm's output, gate/up the MLP norm's; o_proj's input is the attention
      output SDPA saves anyway: 0);
    * ``lora_rank_out``: rank × adapted Linears (each ``lora_A`` output, saved by ``lora_B``);
    * ``lora_qkv_adapted``: how many of q/k/v are adapted (their input is the block's first norm);
    * ``lora_mlp_adapted``: 1 when the MLP projections are adapted.
    Targets as ``lora_params_per_block``: q,v; attention (q,k,v,o); all-linear (+ the MLP)."""
    h = spec.hidden_size
    mlp_width = _lora_mlp_width(spec, spec.moe is not None)
    names = {"qv": ["q", "v"], "attention": ["q", "k", "v", "o"]}.get(
        targets, ["q", "k", "v", "o"] + ((["gate", "up", "down"] if spec.gated_mlp else ["up", "down"]) if mlp_width else []))
    width = {"q": h, "k": h, "v": h, "o": spec.attn_out_width, "gate": h, "up": h, "down": mlp_width}
    unique = (h if {"q", "k", "v"} & set(names) else 0) + (h if {"gate", "up"} & set(names) else 0) \
        + (mlp_width if "down" in names else 0)
    # a fused Linear (Phi-3 qkv_proj, gate_up_proj) is one adapted layer with one input copy
    linears = [n for n in names
               if not (spec.fused_qkv and n in ("k", "v") and "q" in names)
               and not (spec.fused_gate_up and n == "up")]
    return {"lora_adapted_in": sum(width[n] for n in linears), "lora_unique_in": unique,
            "lora_adapted_linears": len(linears), "lora_rank_out": rank * len(linears),
            "lora_qkv_adapted": sum(n in ("q", "k", "v") for n in linears),
            "lora_mlp_adapted": int("down" in names)}


def block_linear_bias_params(spec: ModelSpec) -> int:
    """Biases of the blocks' Linear layers (e.g. Qwen2's q/k/v): the blocks' 1-D tensors less norms."""
    ones = sum(math.prod(t) for unit, shapes in spec.parameter_shapes().items() if unit != "root"
               for t in shapes if len(t) == 1)
    return ones - spec.num_layers * spec.block_norm_params


def block_linear_params(spec: ModelSpec) -> int:
    """Weights of all Linear layers in the blocks (what QLoRA quantizes to 4 bit): the blocks'
    parameters less norms and biases (bitsandbytes ``Linear4bit`` keeps its bias in the float
    dtype; measured: Qwen2's q/k/v biases, hf_stack_cpu.jsonl)."""
    biases = sum(math.prod(t) for unit, shapes in spec.parameter_shapes().items() if unit != "root"
                 for t in shapes if len(t) == 1)
    return spec.blocks_params - biases
