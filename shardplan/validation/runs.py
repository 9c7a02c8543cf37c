"""Published runs as shardplan queries: each row of a runs CSV (the columns of
``tests/data/published_runs/runs.csv``, described in its README) becomes the model, cluster and
``TrainingConfig`` that ``fit`` evaluates, or a named reason it cannot be expressed.

A row's settings are free text written by whoever transcribed the source ("bf16 mixed (FSDP2
param bf16 / reduce fp32; fp32 master)"). They are read by ordered tables of patterns, the first
match winning; text no table recognises is a reason (``unrecognised_<field>``), never a guess.
Settings a row leaves unstated are left to the stack's defaults (``stacks.resolve_stack``), as a
user's query would; what the reading assumed is listed in ``RunQuery.assumed``.

The counter a row's peak memory was read from decides what it is compared with
(``COUNTER_CLASSES``): ``max_memory_allocated`` (and torch's ``active`` peak, which the caching
allocator keeps within a block's rounding of it) -> peak allocated; ``max_memory_reserved`` and
torchtitan's memory field -> peak reserved; nvidia-smi / NVML -> the device total; a number whose
counter the source does not name -> ``unnamed``.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Union

from shardplan.inputs.config import TrainingConfig
from shardplan.inputs.hardware import Cluster, at_power_limit, parse_gpus
from shardplan.inputs.model import ModelSpec, attention_flops_per_token
from shardplan.inputs.stacks import resolve_stack
from shardplan.support.errors import ShardplanError

GIB = 2 ** 30
COUNTER_CLASSES = ("allocated", "reserved", "device_total", "unnamed")

# Every reason a row cannot be expressed, with what it means (the report counts rows per reason).
REASONS: dict[str, str] = {
    "not_a_run": "a capacity claim: the source gives no run details",
    "architecture_not_stated": "the row's architecture columns are empty and its model is no catalogue profile",
    "architecture_not_decoder": "not a decoder-only transformer (an encoder-decoder demo model)",
    "mixture_of_experts": "a mixture-of-experts model: the architecture columns cannot state its experts",
    "model_parallel": "tensor, pipeline or context parallelism: shardplan plans data-parallel sharding only",
    "fp8_training": "fp8 / MX linears (torchao, TransformerEngine): not modelled",
    "optimizer_not_modelled": "an optimizer shardplan does not model (4-bit AdamW)",
    "seq_len_not_stated": "the sequence length is not stated",
    "micro_batch_not_stated": "the micro-batch is not stated",
    "gpus_not_stated": "the GPU count is not stated",
    "gpu_not_stated": "the GPU is not stated",
    "gpu_capacity_not_stated": "the GPU's memory size is not stated",
    "ac_fraction_not_stated": "selective checkpointing of a fraction of blocks whose fraction is not stated",
    "measured_below_its_states": "the measured peak is below the weights, gradients and AdamW moments the stated "
                                 "one-GPU full fine-tune holds at its optimizer step: not this configuration's peak",
    "rate_above_peak": "the published tokens/s needs more FLOP/s than the GPU's dense 16-bit peak under the row's "
                       "stated or inferred settings: not a per-GPU rate of this configuration",
    "rejected_by_shardplan": "shardplan refuses the configuration (its one-line error is the detail)",
    "unrecognised_framework": "the framework text matches no stack pattern",
    "unrecognised_strategy": "the strategy text matches no strategy pattern",
    "unrecognised_precision": "the precision text matches no precision pattern",
    "unrecognised_act_ckpt": "the activation-checkpointing text matches no pattern",
    "unrecognised_offload": "the offload text matches no pattern",
    "unrecognised_optimizer": "the optimizer text matches no pattern",
    "unrecognised_gpu": "the GPU text matches no hardware profile pattern",
}


@dataclass(frozen=True)
class RunQuery:
    """One row as ``fit`` evaluates it, with what it measured."""

    row_id: str
    source: str                       # the row-id prefix (README: it names the source)
    row_type: str
    spec: ModelSpec
    cluster: Cluster
    config: TrainingConfig
    counter: str | None               # one of COUNTER_CLASSES, None without a memory number
    measured_bytes: int | None
    measured_tokens_per_s_per_gpu: float | None
    assumed: tuple[str, ...] = ()     # what the reading assumed for settings the row does not state
    row: dict[str, str] = field(default_factory=dict, repr=False)  # the CSV row as read

    @property
    def oom(self) -> bool:
        return self.row_type == "measured_oom"


@dataclass(frozen=True)
class Unexpressible:
    row_id: str
    source: str
    row_type: str
    reason: str                        # a key of REASONS
    detail: str = ""
    row: dict[str, str] = field(default_factory=dict, repr=False)


Row = Union[RunQuery, Unexpressible]
REQUIRED_COLUMNS = ("row_id", "row_type", "model", "params_b", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn",
                    "vocab", "framework", "strategy", "dp_shard", "tp", "pp", "cp", "offload", "precision", "act_ckpt",
                    "optimizer", "gpu", "n_gpus", "n_nodes", "gpus_per_node", "seq_len", "micro_batch", "grad_accum",
                    "measured_mem_gib", "mem_counter", "measured_tokens_per_s_per_gpu")


class _Refused(Exception):
    """A row that cannot be expressed: ``reason`` (a REASONS key) and the text that decided it."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def read_runs(path: str | Path) -> list[Row]:
    """Every row of a runs CSV as a ``RunQuery`` or an ``Unexpressible`` (none dropped), in file order."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ShardplanError(f"{path.name}: columns", ", ".join(missing), "missing (see tests/data/published_runs/README.md)")
            rows = list(reader)
    except (OSError, UnicodeDecodeError) as err:
        raise ShardplanError("runs", str(path), f"cannot be read ({type(err).__name__})") from None
    return [express(row) for row in rows]


def express(row: dict[str, str]) -> Row:
    """One row as a ``RunQuery``, or an ``Unexpressible`` naming why not."""
    row = {k: (v or "").strip() for k, v in row.items() if k is not None}
    ident = dict(row_id=row["row_id"], source=source_of(row["row_id"]), row_type=row["row_type"])
    try:
        return _query(row, ident)
    except _Refused as refused:
        return Unexpressible(**ident, reason=refused.reason, detail=refused.detail[:160], row=row)


def source_of(row_id: str) -> str:
    """'TTN012' -> 'TTN': the row-id prefix names the source (README)."""
    match = re.match(r"[A-Za-z]+", row_id)
    return match.group() if match else row_id


def _query(row: dict[str, str], ident: dict[str, str]) -> RunQuery:
    if row["row_type"] == "capacity_claim":
        raise _Refused("not_a_run", row["row_type"])
    assumed: list[str] = []
    _check_data_parallel(row)
    spec = model_spec(row, assumed)
    cluster = cluster_of(row, assumed)
    config = training_config(row, cluster, assumed)
    counter, measured = measured_memory(row)
    resolved = resolve_stack(config, cluster.world_size)
    _check_measure_holds_the_states(spec, resolved, measured)
    rate = _float(row.get("measured_tokens_per_s_per_gpu", ""))
    _check_rate_within_peak(spec, resolved, cluster, rate)
    return RunQuery(**ident, spec=spec, cluster=cluster, config=config, counter=counter, measured_bytes=measured,
                    measured_tokens_per_s_per_gpu=rate, assumed=tuple(assumed), row=row)


# torch.optim.AdamW keeps exp_avg and exp_avg_sq as zeros_like(param) (torch/optim/adamw.py
# _init_group), so at the optimizer step of a one-GPU full fine-tune the weights, their gradients
# and the two moments are alive together, all in the weights' dtype: 4 copies of the weights.
DENSE_ADAMW_COPIES = 4


def _check_measure_holds_the_states(spec: ModelSpec, config: TrainingConfig, measured: int | None) -> None:
    """A peak measured below what the stated configuration must hold at once is no measure of it
    (a transcription or a run that differed from its stated settings): refused with both numbers.
    ``config`` is resolved (``stacks.resolve_stack``): what the row leaves unstated is its stack's.
    Only where the floor is certain: full fine-tune, one GPU, torch AdamW, no offload, no paging,
    no step in backward, 16-bit-pure or fp32 weights (no master copy question)."""
    plain = (config.method == "full" and config.strategy == "single" and config.optimizer == "adamw"
             and config.offload == "none" and not config.paged_optimizer and not config.optimizer_in_backward)
    if measured is None or not plain or config.precision not in ("bf16-pure", "fp32"):
        return
    floor = DENSE_ADAMW_COPIES * (4 if config.precision == "fp32" else 2) * spec.total_params
    if measured < floor:
        raise _Refused("measured_below_its_states", f"{measured / GIB:.2f} GiB measured < {floor / GIB:.2f} GiB "
                                                    "of weights, gradients and AdamW moments")


def min_flops_per_token(spec: ModelSpec, config: TrainingConfig):
    """The fewest FLOPs one trained token costs under ``config`` (resolved), a floor no kernel
    beats. Matmuls (PaLM App. B's N: block weights + lm_head): forward 2·N, the input gradient 2·N
    (every LoRA/QLoRA run needs it down to the first block's adapters), the weight gradient 2·N
    only for a full fine-tune, and the recomputed forward 2·N under full checkpointing. Attention
    at its causal half (FlashAttention-2 §4.1): forward 1×, backward ≥ 2× (dV, dP, dQ, dK: twice
    the forward's two matmuls), recompute 1×. Left out, so the floor stays a floor: adapters,
    element-wise work, selective recompute, dequantisation, the optimizer."""
    recompute = config.ac == "full"
    matmul = (4 + 2 * (config.method == "full") + 2 * recompute) * spec.matmul_params_per_token
    attention = attention_flops_per_token(spec.num_layers, spec.q_width, config.seq_len, causal=True)
    return matmul + (3 + recompute) * attention


def _check_rate_within_peak(spec: ModelSpec, config: TrainingConfig, cluster, rate: float | None) -> None:
    """A published tokens/s per GPU that needs more FLOP/s than the GPU's dense 16-bit tensor peak
    under the row's settings (``min_flops_per_token``) cannot be that configuration's per-GPU rate:
    an aggregate printed as per-GPU, or a setting (often one inferred from a config default) the
    run did not use. Refused with the implied share of the peak; the row's memory reading rests on
    the same settings, so the whole row goes (counted under ``rate_above_peak``, not dropped).
    A card measured above its nameplate (``gemm_efficiency`` > 1: a GeForce boost past the
    datasheet clock) is held to that measured rate, not to the nameplate it was seen to beat."""
    if not rate:
        return
    peak = max(cluster.gpu.dense_peak(d) for d in ("bf16", "fp16"))
    share = rate * float(min_flops_per_token(spec, config)) / peak
    if share > max(1.0, cluster.gpu.gemm_efficiency):
        raise _Refused("rate_above_peak", f"{rate:,.0f} tokens/s needs {share:.2f}x the {cluster.gpu.name} dense "
                                          f"16-bit peak (ac {config.ac}, {config.method})")


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(text: str) -> int | None:
    value = _float(text)
    return int(value) if value is not None and value == int(value) else None


def _first(table: Iterable[tuple[str, Any]], text: str) -> Any:
    """The value of the first pattern in ``table`` that matches ``text`` (case-insensitive), or None."""
    for pattern, value in table:
        if re.search(pattern, text, re.IGNORECASE):
            return value
    return None


def _check_data_parallel(row: dict[str, str]) -> None:
    degrees = [_int(row[k]) or 1 for k in ("tp", "pp", "cp")]
    text = f"{row['strategy']} {row['framework']}"
    if max(degrees) > 1 or re.search(r"\bx tp\b|\btp\b x|context parallel|tensor parallel|4d parallel", text, re.I):
        raise _Refused("model_parallel", row["strategy"])


# --- the model -----------------------------------------------------------------------------------------

def model_spec(row: dict[str, str], assumed: list[str]) -> ModelSpec:
    """The catalogue profile the row's model names when its dimensions agree with the row's columns
    (it knows the family's layout: Gemma's norms, Mixtral's experts, Falcon's fused attention);
    otherwise a spec built from the columns; a row with neither is refused."""
    dims = {k: _int(row[k]) for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn", "vocab")}
    if re.search(r"nn\.Transformer|enc-dec|encoder-decoder", row["model"], re.I):
        raise _Refused("architecture_not_decoder", row["model"])
    profile = _catalogue_profile(row["model"])
    if profile is not None and _agrees(profile, dims):
        if profile.moe is None or dims["n_layers"] is not None:
            assumed.append(f"model: catalogue profile {profile.name} (its dimensions agree with the row's)")
            return profile
    if re.search(r"mixtral|\bmoe\b|experts", row["model"], re.I):
        raise _Refused("mixture_of_experts", row["model"])
    if any(dims[k] is None for k in ("n_layers", "hidden", "n_heads", "vocab")):
        if profile is not None:
            assumed.append(f"model: catalogue profile {profile.name} (the row states no architecture)")
            return profile
        raise _Refused("architecture_not_stated", row["model"])
    return _spec_from_columns(row["model"], dims, assumed, _learned_positions(row))


def _catalogue_profile(name: str) -> ModelSpec | None:
    """The profile a model name resolves to by name or hub id (never by a bare size: a row's
    'GPT-like 13B' is no particular model)."""
    from shardplan.inputs.models import resolve_model

    cleaned = re.sub(r"\s*\(.*?\)\s*", " ", name).strip()
    bare = re.sub(r"-(gptq|awq|instruct|chat|hf)\b", "", cleaned.split("/")[-1], flags=re.I)  # a quantized upload's base
    for text in dict.fromkeys((name, cleaned, bare)):
        if not text or re.fullmatch(r"[\w\s-]*\d+(\.\d+)?\s*[mbt]", text, re.I) and " " in text:
            continue
        try:
            return resolve_model(text).spec
        except ShardplanError:
            continue
    return None


def _agrees(spec: ModelSpec, dims: dict[str, int | None]) -> bool:
    ours = dict(n_layers=spec.num_layers, hidden=spec.hidden_size, n_heads=spec.num_heads,
                n_kv_heads=spec.num_kv_heads, vocab=spec.vocab_size)
    return all(dims[k] is None or dims[k] == v for k, v in ours.items())


def _learned_positions(row: dict[str, str]) -> int:
    """Rows of a learned position table when the row's architecture note says the model has one
    (MPT's ``learned_pos_emb``, its config default, whose NumParams grows with seq_len): seq_len;
    0 otherwise."""
    return (_int(row["seq_len"]) or 0) if re.search(r"learned pos", row.get("arch_source", ""), re.I) else 0


def _spec_from_columns(name: str, dims: dict[str, int | None], assumed: list[str], positions: int = 0) -> ModelSpec:
    """A decoder from the row's dimensions. A 4h MLP is a GELU MLP with LayerNorm and tied
    embeddings, with a learned position table of ``positions`` rows where the row says so (else
    none: GPT-3-style models' learned positions are < 0.1 % of the parameters, and they have no
    RoPE either way); any other width is a gated SwiGLU MLP with RMSNorm (the Llama layout)."""
    h, ffn = dims["hidden"], dims["ffn"] or 4 * dims["hidden"]
    gelu = ffn == 4 * h
    kv = dims["n_kv_heads"] or dims["n_heads"]
    layout = (dict(family="gpt2", mlp="gelu", norm="layernorm", tie_word_embeddings=True) if gelu
              else dict(family="llama", mlp="swiglu", norm="rmsnorm"))
    if gelu and positions:
        layout.update(learned_position_embeddings=True)
    assumed.append(f"model: built from the row's columns with the {'GELU/LayerNorm' if gelu else 'Llama'} layout")
    try:
        return ModelSpec(name=re.sub(r"[^\w.-]+", "-", name).strip("-").lower() or "run", display_name=name,
                         vocab_size=dims["vocab"], hidden_size=h, num_layers=dims["n_layers"], num_heads=dims["n_heads"],
                         num_kv_heads=kv, intermediate_size=ffn, max_position_embeddings=positions or 1 << 17, **layout)
    except ValueError as err:
        raise _Refused("rejected_by_shardplan", str(err).splitlines()[0]) from None


# --- the cluster ---------------------------------------------------------------------------------------

# (pattern, profile): the first that matches the row's gpu text. A card emulated by capping an
# A100's memory (torchtune's footnote) is planned as the card it emulates: only capacity differs.
GPU_PATTERNS = (
    (r"^not stated$", None), (r"emulate rtx 4090|rtx 4090", "rtx4090"), (r"a10g", "a10g"),
    (r"rtx a6000", "rtx-a6000"), (r"titan rtx|4070 ti", "capacity"), (r"v100", "v100-32gb"),
    (r"mi300x", "mi300x"), (r"b200|blackwell", "b200"), (r"h200", "h200"), (r"h100", "h100-sxm"),
    (r"a100.*(40/80|size not stated)", "a100-unsized"), (r"a100.*80\s*gb", "a100-80gb"), (r"a100.*40\s*gb", "a100-40gb"),
    (r"a100", "a100-unsized"),
)


# (pattern over "source source_locator", what the source's own files state about the cards its table
# ran on, citation): hardware a benchmark table leaves out but its repository states elsewhere. The
# text is read like the row's gpu column (memory, "TB/s", "NNN W power limit").
SOURCE_HARDWARE = (
    (r"pytorch/ao docs/source/workflows/training\.md.*section 'NVIDIA H100' table",
     "96GB HBM2e, 2.4 TB/s, 500W power limit",
     "torchao 890e0ac8 (the table's torchao) torchao/testing/float8/roofline_utils.py 'NVIDIA H100': "
     "'2.4 TB per second, custom to Meta's H100 variant' (since 027bf39c9, #668); that variant per torchtitan "
     "benchmarks/llama3_h100_202412_torchtitan.md: '96GB HBM2e with 2.4 TB/sec', 'the default 500W power limit'"),
    (r"pytorch/ao docs/source/workflows/training\.md.*NVIDIA B200' table",
     "750W power limit",
     "pytorch/ao d8bb51f63 (#2777, the commit adding the table): '8xB200 GPUs limited to 750W', reworded "
     "'power limited' by 9e3758d15 (#2778, 'change B200 verbiage') with the numbers unchanged"),
)


def _gpu_text(row: dict[str, str], assumed: list[str]) -> str:
    """The row's gpu column, plus what its source states about the cards elsewhere (``SOURCE_HARDWARE``)."""
    where = f"{row.get('source', '')} {row.get('source_locator', '')}"
    for pattern, stated, citation in SOURCE_HARDWARE:
        if re.search(pattern, where, re.I):
            assumed.append(f"gpu: {stated} as {citation}")
            return f"{row['gpu']}; {stated}"
    return row["gpu"]


def cluster_of(row: dict[str, str], assumed: list[str]) -> Cluster:
    """GPU x count (in nodes of ``gpus_per_node`` when the row has several nodes), at the row's
    stated memory size when it differs from the profile's nominal one."""
    text = _gpu_text(row, assumed)
    name = _first(GPU_PATTERNS, text)
    if name is None:
        raise _Refused("gpu_not_stated" if re.fullmatch(r"(not stated)?", text, re.I) else "unrecognised_gpu", text)
    if name == "a100-unsized":
        if not re.search(r"(\d+)\s*GB\s*(implied|\))|implies\s*80", text, re.I):
            raise _Refused("gpu_capacity_not_stated", text)
        name = "a100-80gb"
    n_gpus, nodes = _int(row["n_gpus"]), _int(row["n_nodes"]) or 1
    if not n_gpus:
        raise _Refused("gpus_not_stated", row["n_gpus"])
    per_node = _int(row["gpus_per_node"]) or n_gpus // nodes
    stated_gb = _stated_gb(text)
    gpu_text = f"{stated_gb:g}GB" if name == "capacity" else name
    layout = f"{nodes}x{per_node}x{gpu_text}" if nodes > 1 else f"{n_gpus}x{gpu_text}"
    try:
        cluster = parse_gpus(layout)
    except ShardplanError as err:
        raise _Refused("rejected_by_shardplan", str(err)) from None
    gpu = cluster.gpu
    if stated_gb and name not in ("capacity", "rtx4090") and abs(stated_gb - gpu.nominal_memory_gb) >= 1:
        gpu = gpu.model_copy(update={"memory_bytes": int(gpu.memory_bytes * stated_gb / gpu.nominal_memory_gb)})
        assumed.append(f"gpu: {gpu.name} at the stated {stated_gb:g} GB")
        cluster = cluster.model_copy(update={"gpu": gpu})
    if not re.search(r"\d+\s*GB", text, re.I) and name != "capacity":
        assumed.append(f"gpu: {text!r} read as {gpu.name}")
    return _at_stated_power_limit(_at_stated_bandwidth(cluster, text, assumed), text, assumed)


def _at_stated_bandwidth(cluster: Cluster, text: str, assumed: list[str]) -> Cluster:
    """The cluster with the HBM bandwidth the row states for its card ('2.4 TB/s HBM': torchtitan's
    HBM2e H100), where it differs from the profile's; element-wise kernels stream at it."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*TB/s", text, re.I)
    stated = float(match.group(1)) * 1e12 if match else 0.0
    if not stated or abs(stated - cluster.gpu.memory_bandwidth_bytes_per_s) < 0.05e12:
        return cluster
    assumed.append(f"gpu: {cluster.gpu.name} at the stated {stated / 1e12:g} TB/s HBM")
    return cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"memory_bandwidth_bytes_per_s": stated})})


def _at_stated_power_limit(cluster: Cluster, text: str, assumed: list[str]) -> Cluster:
    """The cluster at the power limit the row states for its card ('500W power limit': torchtitan's
    Grand Teton H100s, whose benchmark page says their peak lies "between SXM and NVL" and that
    700 W "can potentially provide further speedups"), below the profile's TDP: matmuls and
    attention at the capped clock (``hardware.at_power_limit``)."""
    match = re.search(r"(\d+)\s*W\s+power\s+limit", text, re.I)
    if not match:
        return cluster
    capped, factor = at_power_limit(cluster.gpu, float(match.group(1)))
    if factor == 1.0:
        return cluster
    assumed.append(f"gpu: {cluster.gpu.name} at the stated {match.group(1)} W power limit "
                   f"(tensor peaks x{factor:.3f}, POWER_CLOCK_EXPONENT)")
    return cluster.model_copy(update={"gpu": capped})


def _stated_gb(text: str) -> float:
    """The card's memory as the row states it ('H100 SXM 96GB', '~184 GiB implied'), 0 if none."""
    match = re.search(r"(\d+(?:\.\d+)?)\s*Gi?B", text, re.I)
    return float(match.group(1)) if match else 0.0


# --- the configuration ---------------------------------------------------------------------------------

STACK_PATTERNS = (
    (r"torchtitan", "torchtitan"), (r"torchtune", "torchtune"), (r"litgpt|lightning", "lightning"),
    (r"hf |hugging ?face|accelerate|transformers|llama-factory|peft", "hf"),
    (r"composer|fms-fsdp|fairseq|fairscale|deepspeed|megatron|plain pytorch|pytorch fsdp|torchao", "plain"),
)
# (pattern, (strategy, engine or None: the stack's)) over "strategy framework"
STRATEGY_PATTERNS = (
    (r"zero3|zero-3", ("full_shard", "deepspeed")), (r"zero2|zero-2", ("zero2", "deepspeed")),
    (r"zero1|zero-1", ("zero1", "deepspeed")), (r"none \(1 gpu\)", ("single", None)),
    (r"\bddp\b", ("ddp", None)), (r"hybrid_shard", ("hybrid_shard", "fsdp")), (r"shard_grad_op", ("shard_grad_op", "fsdp")),
    (r"no_shard", ("no_shard", "fsdp")), (r"full_shard", ("full_shard", "fsdp")),
)
# fms-acceleration's ``baseline-peft-bnb`` QLoRA rows ("HF/PEFT baseline loading") go through TRL's
# SFTTrainer, which runs PEFT's ``prepare_model_for_kbit_training`` on a 4-bit model (``kbit_prep``:
# norms, embeddings and lm_head cast to fp32, an fp32 stream). The harness's own plugin says so
# (fms-acceleration ``plugins/accelerated-peft/src/fms_acceleration_peft/framework_plugin_bnb.py``
# @876e2ed: SFTTrainer's preparation "will cause a slowdown in training speed due to extraneous dtype
# casting"); its ``accelerated-peft-bnb`` rows freeze the base without the cast (``_prepare_model_for_kbit_training``).
KBIT_PREP_PATTERN = r"HF/PEFT baseline loading"
PRECISION_PATTERNS = (
    (r"fp8|float8|mxfp8", "fp8"), (r"compute not stated", "stack"),
    (r"bf16-true|no fp32 master|full bf16|bfloat16 params, grads|params, grads(, optimizer states)? bf16|"
     r"\(params/grads/adamw states bf16|full bf16 weights|^bf16$", "bf16-pure"),
    (r"fp32 master|bf16 mixed|bf16 autocast|autocast|mixed_precision=pure|bf16 frozen base|lora|"
     r"bf16 \(baseline\)|bf16 compute|^bf16\b", "bf16-mixed"),
    (r"fp16", "fp16-mixed"), (r"fp32", "fp32"), (r"4-bit base", "stack"),
)
AC_PATTERNS = (
    (r"fraction not stated", "refuse"), (r"every 2nd|every nth|layer-level", "every-k"),
    # "not stated (torchtitan default selective)": the stack's default, not the word after it
    (r"^not stated", "stack"), (r"op-level sac|per-op sac", "selective-op"), (r"selective", "selective"),
    (r"^full|gradient_checkpointing|default enables|default true", "full"),
    (r"^none", "none"), (r"^na$|not stated|^$", "stack"),
)
OFFLOAD_PATTERNS = (
    (r"^none|activation cpu offload: false|^na$|^$", "none"), (r"activations to cpu", "activations"),
    (r"param|zero-3 offload|^cpu$", "optimizer+params"), (r"optimizer", "optimizer"),
)
OPTIMIZER_PATTERNS = (
    (r"^not stated", "stack"), (r"4-bit", "refuse"), (r"8bit|8-bit", "adamw-8bit"), (r"sgd", "sgd"), (r"adam", "adamw"),
    (r"^na$|not stated|^$", "stack"),
)
# How the row's AdamW steps, where its optimizer text names it (otherwise the stack's default):
# torchtune's "AdamW fused" rows; Transformers' optim='adamw_torch' builds torch.optim.AdamW with
# neither flag (foreach on CUDA: optim/optimizer.py _default_to_fused_or_foreach); Composer's
# DecoupledAdamW (llm-foundry's decoupled_adamw) steps each parameter in a Python loop
# (composer/optim/decoupled_weight_decay.py DecoupledAdamW.adamw).
OPTIMIZER_IMPL_PATTERNS = (
    (r"fused(?! into)", "fused"), (r"adamw_torch\b", "foreach"), (r"decoupled_adamw", "for_loop"),
)
# torchtune configs read at commits before "add fused = true to adam, except pagedAdam" (#1575,
# cca50f02e, 2024-09-14; each checked with git merge-base) build torch.optim.AdamW with no flag:
# foreach, not the stack's current fused default.
TORCHTUNE_BEFORE_FUSED_ADAM = r"\b(5f0d64c6b|fef3ed10d|7d05579fe|0217d44c2)"
# torchtitan's AdamW was foreach until 6e4988550 (#881, 2025-02-24, "use Fused AdamW as default"):
# at 9dec370 config_manager's ``--optimizer.fused`` is a store_true flag (default False) and
# optimizer.py builds AdamW with ``"fused": fused, "foreach": not fused``
TORCHTITAN_FUSED_ADAM_SINCE = "2025-02-24"

# What a framework with no stack profile of its own sets for the stack knobs, read from its code:
# (pattern over "framework strategy", knobs, source). The plain stack's defaults fill the rest.
FRAMEWORK_KNOBS = (
    (r"composer", {"load_mode": "meta_init", "fused_ce": True, "metric_ce": True},
     "llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml model.init_device: meta (built on the meta device, "
     "FSDP materialises each rank's shard); ComposerMPTCausalLM loss_fn default 'fused_crossentropy' "
     "(flash_attn.losses.cross_entropy.CrossEntropyLoss); its train_metrics LanguageCrossEntropy + "
     "LanguagePerplexity, which composer v0.16.3 Trainer._train_microbatch updates after every micro-batch's backward "
     "(_eval_train_metrics) with an eager torch CrossEntropyLoss each"),
    (r"megatron-deepspeed.*zero-?3|zero-?3.*megatron-deepspeed", {"load_mode": "meta_init"},
     "Megatron-DeepSpeed pretrain_gpt.py model_provider: the model is built inside "
     "deepspeed.zero.Init(enabled=args.zero_stage == 3), which partitions each parameter as it is created"),
    (r"fms-fsdp", {"load_mode": "rank0_broadcast", "rope_form": "matrix"},
     "fms-fsdp main_training.py: the model is built on the CPU (on the meta device with low_cpu_fsdp) and handed "
     "to FSDP1 with device_id and a per-block auto_wrap_policy, which moves, flattens and shards one unit at a "
     "time (torch fsdp/_init_utils.py _move_module_to_device): the shard plus one unit on the GPU; its LLaMA is "
     "ibm-fms's (requirements.txt ibm-fms>=0.0.3 @4ffb9bd and @ed74fd5), whose RotaryEmbedding.adjusted_qk "
     "(fms/modules/positions.py v0.0.3 l.246-262, v0.0.5 l.246-268) rotates q and k by a 2x2 fp32 matrix"),
    # LLaMA-Factory is read as the hf stack (Transformers + PEFT + Trainer), but it is its own entry
    # point: it never calls PEFT's prepare_model_for_kbit_training and does not use TRL's ModelConfig,
    # whose lora_dropout 0.05 is the hf stack's default.
    (r"llama-factory", {"lora_dropout": 0.0, "kbit_prep": False},
     "LLaMA-Factory src/llmtuner/hparams/finetuning_args.py FinetuningArguments.lora_dropout default 0.0 "
     "(from 6faf9c35a, 2023-12-23, to after the wiki's 2024-04-15 tables; 0.1 before); "
     "src/llmtuner/model/patcher.py _prepare_model_for_training @efa808069 (2024-04-16): its own preparation "
     "instead of PEFT's, norms and lm_head left in the compute dtype (upcast_layernorm and upcast_lmhead_output "
     "default False in hparams/model_args.py), gradient checkpointing with use_reentrant=True and use_cache False"),
    # the HF Trainer without bf16/fp16 = True over a bf16-loaded model: accelerate's mixed precision
    # stays "no", so no autocast and no FSDP MixedPrecision (activations.lora_adapter_dtype_bytes)
    (r"HF bf16=unset", {"autocast": False},
     "fms-acceleration scripts/benchmarks/refs/a100_80gb.csv @24bdadb: the bf16 column is empty for these rows; "
     "accelerate.yaml mixed_precision 'no'; transformers 4.48.1 training_args.py keeps ACCELERATE_MIXED_PRECISION "
     "unless bf16/fp16; accelerate 1.0.1 state.py gives FSDP a MixedPrecision only when it is not 'no' and "
     "accelerator.py autocasts only under native_amp"),
    (r"fms-acceleration.*autogptq|autogptq.*fms-acceleration", {"quant_buffers_sharded": True},
     "fms-acceleration accelerated-peft framework_plugin_autogptq.py model_loader (876e2ed): with world_size > 1 "
     "under accelerate FSDP, each QuantLinear's qweight and qzeros become float nn.Parameters 'so FSDP can shard "
     "them' (autogptq_utils.py PATCH_FOR_FSDP_TRITON_V2); scales stay buffers"),
)


# (pattern over the row's source, knobs, source): what a benchmark harness ran that its rows do not
# state. fms-acceleration's harness (scripts/benchmarks @24bdadb, the commit that last wrote
# refs/a100_80gb.csv) pins transformers==4.48.1 (refs/requirements.txt), whose Trainer
# ``gradient_checkpointing: True`` (defaults.yaml) is reentrant (HF_REENTRANT_UNTIL), and launches
# multi-GPU runs with accelerate.yaml, which sets no fsdp_activation_checkpointing (accelerate
# launch's default "false"): no checkpoint_wrapper. One-GPU runs are launched with plain ``python``
# (benchmark.py: ``COMMAND_PYTHON`` unless ``num_gpus > 1``): no FSDP at all (``_strategy``).
SOURCE_KNOBS = (
    (r"fms-acceleration scripts/benchmarks", {"reentrant_checkpointing": True, "checkpoint_wrapper": False},
     "fms-acceleration scripts/benchmarks @24bdadb: refs/requirements.txt transformers==4.48.1 (reentrant "
     "gradient checkpointing), accelerate.yaml without fsdp_activation_checkpointing"),
    (r"llm-foundry scripts/train/benchmarking", {"lowp_norm": True},
     "llm-foundry scripts/train/benchmarking/submit_benchmarks.py @8c8dd48f: norm_type = "
     "'low_precision_layernorm' (llmfoundry/models/layers/norm.py LPLayerNorm: one 16-bit F.layer_norm)"),
)
SINGLE_PROCESS_SOURCES = r"fms-acceleration scripts/benchmarks"


def _source_knobs(row: dict[str, str], assumed: list[str]) -> dict[str, Any]:
    for pattern, knobs, source in SOURCE_KNOBS:
        if re.search(pattern, row.get("source", ""), re.I):
            assumed.append(f"harness knobs {knobs} as {source}")
            return dict(knobs)
    return {}


def _framework_knobs(row: dict[str, str], assumed: list[str]) -> dict[str, Any]:
    text = f"{row['framework']} {row['strategy']} {row['precision']}"
    for pattern, knobs, source in FRAMEWORK_KNOBS:
        if re.search(pattern, text, re.I):
            assumed.append(f"stack knobs {knobs} as {source}")
            return dict(knobs)
    return {}


def training_config(row: dict[str, str], cluster: Cluster, assumed: list[str]) -> TrainingConfig:
    """The row's settings as a ``TrainingConfig``; what the row leaves unstated is the stack's."""
    stack = _stack(row, assumed)
    dated = _dating(row, stack)
    knobs: dict[str, Any] = {"stack": stack}
    for part in (_compiled_loss(row, stack, dated), _compile(row), _sac_attention(stack, dated, cluster),
                 _bnb_keeps_input(stack, dated), _hf_reentrant(stack, dated),
                 _torchtune_loss(row, stack, dated), _torchtune_nf4(stack, dated),
                 _framework_knobs(row, assumed), _source_knobs(row, assumed), _strategy(row, cluster),
                 _precision_and_method(row, assumed),
                 _checkpointing(row, assumed), _offload(row), _optimizer(row, stack, dated, assumed), _workload(row),
                 _attention(row, assumed), _loss(row)):
        knobs.update(part)  # two columns may both say activations go to the CPU
    knobs.update(_torchtune_measured_config(dated, assumed))
    knobs.update(_recipe_dtype(knobs, assumed))
    try:
        return TrainingConfig(**knobs)
    except ShardplanError as err:
        raise _Refused("rejected_by_shardplan", str(err)) from None


# torchtune has no mixed precision: its recipes build the whole model under
# ``training.set_default_dtype(cfg.dtype)``, LoRA adapters included, and check them
# (``validate_expected_param_dtype(self.adapter_params.items(), dtype=self._dtype)``); the recipe
# docstring: "When dtype=bf16, all activations, gradients and optimizer states are in bfloat16"
# (recipes/lora_finetune_single_device.py at 1814feb17). A bf16 row ("bf16 frozen base", "bf16
# compute") is that recipe dtype, not an fp32 copy of the trainable weights.
TORCHTUNE_RECIPE_DTYPE = ("bf16-mixed", "bf16-pure")


def _recipe_dtype(knobs: dict[str, Any], assumed: list[str]) -> dict[str, Any]:
    """A torchtune row's bf16 read as its recipe dtype (``TORCHTUNE_RECIPE_DTYPE``); nothing elsewhere."""
    read, recipe = TORCHTUNE_RECIPE_DTYPE
    if knobs["stack"] != "torchtune" or knobs.get("precision") != read:
        return {}
    assumed.append(f"precision: {recipe} (torchtune's dtype: bf16 builds adapters, gradients and AdamW states in bf16)")
    return {"precision": recipe}


def _stack(row: dict[str, str], assumed: list[str]) -> str:
    stack = _first(STACK_PATTERNS, row["framework"])
    if stack is None:
        raise _Refused("unrecognised_framework", row["framework"])
    if stack == "plain" and not re.search(r"plain pytorch|pytorch fsdp", row["framework"], re.I):
        assumed.append(f"stack: {row['framework']!r} has no profile: counted as a plain loop")
    return stack


def _strategy(row: dict[str, str], cluster: Cluster) -> dict[str, Any]:
    found = _first(STRATEGY_PATTERNS, f"{row['strategy']} {row['framework']}")
    if found is None:
        raise _Refused("unrecognised_strategy", row["strategy"])
    strategy, engine = found
    if cluster.world_size == 1 and re.search(SINGLE_PROCESS_SOURCES, row.get("source", ""), re.I):
        return {"strategy": "single"}  # launched as one plain process: FSDP never wraps it
    if engine == "fsdp":
        engine = "fsdp2" if re.search(r"fsdp2|fully_shard", f"{row['strategy']} {row['framework']}", re.I) else "fsdp1"
    out: dict[str, Any] = {"strategy": strategy} if engine is None else {"strategy": strategy, "engine": engine}
    if strategy == "hybrid_shard" and (_int(row["dp_shard"]) or 0) > 1:
        out["shard_group_size"] = _int(row["dp_shard"])
    if strategy == "single" and cluster.world_size != 1:
        raise _Refused("unrecognised_strategy", f"{row['strategy']} on {cluster.world_size} GPUs")
    return out


def _precision_and_method(row: dict[str, str], assumed: list[str]) -> dict[str, Any]:
    text = row["precision"]
    precision = _first(PRECISION_PATTERNS, text)
    if precision is None:
        raise _Refused("unrecognised_precision", text)
    if precision == "fp8":
        raise _Refused("fp8_training", text)
    quantized = re.search(r"q-?lora|4-bit|nf4|gptq", text, re.I)
    method = "qlora" if quantized else "lora" if re.search(r"lora", text, re.I) else "full"
    out: dict[str, Any] = {"method": method}
    if method == "qlora" and re.search(r"gptq", text, re.I):
        out["quant_format"] = "gptq"
    if precision == "stack":  # a 4-bit base whose compute dtype the row does not state
        assumed.append("precision: compute dtype not stated, the stack's default")
    else:
        out["precision"] = precision
    if method != "full":
        out.update(_lora(text))
    if method == "qlora" and re.search(KBIT_PREP_PATTERN, text, re.I):
        out["kbit_prep"] = True
        assumed.append("kbit_prep: TRL's SFTTrainer prepares a 4-bit model with prepare_model_for_kbit_training")
    return out


def _lora(text: str) -> dict[str, Any]:
    rank = re.search(r"\br(?:ank)?\s*(\d+)", text, re.I)
    targets = _first(((r"all linear|mlp|w1,w2|all attention projections \+ mlp|q,k,v,proj", "all-linear"),
                      (r"k_proj v_proj o_proj|q,k,v\b|q_proj k_proj", "attention"),
                      (r"q_proj,v_proj|query,value|q_proj\b", "qv")), text)
    out: dict[str, Any] = {"lora_rank": int(rank.group(1))} if rank else {}
    return out if targets is None else {**out, "lora_targets": targets}


def _word(patterns, text: str, unrecognised: str, refused: str) -> str:
    """The pattern table's word for a column's free text; a text no pattern reads, or one the table
    marks 'refuse' (stated, but not expressible), is a named reason."""
    word = _first(patterns, text)
    if word is None:
        raise _Refused(unrecognised, text)
    if word == "refuse":
        raise _Refused(refused, text)
    return word


def _checkpointing(row: dict[str, str], assumed: list[str]) -> dict[str, Any]:
    text = row["act_ckpt"]
    mode = _word(AC_PATTERNS, text, "unrecognised_act_ckpt", "ac_fraction_not_stated")
    out: dict[str, Any] = {}
    if re.search(r"activation offloading", text, re.I):
        out["activation_offload"] = True
    if mode == "stack":
        assumed.append("activation checkpointing: not stated, the stack's default")
        return out
    return {**out, "ac": mode, **({"ac_every_k": 2} if mode == "every-k" else {})}


def _offload(row: dict[str, str]) -> dict[str, Any]:
    mode = _first(OFFLOAD_PATTERNS, row["offload"])
    if mode is None:
        raise _Refused("unrecognised_offload", row["offload"])
    return {"activation_offload": True} if mode == "activations" else {"offload": mode}


def _optimizer(row: dict[str, str], stack: str, dated: _Dating, assumed: list[str]) -> dict[str, Any]:
    text = row["optimizer"]
    name = _word(OPTIMIZER_PATTERNS, text, "unrecognised_optimizer", "optimizer_not_modelled")
    if name == "stack":
        assumed.append("optimizer: not stated, the stack's default")
        return _optimizer_impl(row, stack, dated, assumed)
    # a named optimizer says whether it is paged and stepped in backward: "AdamW" in torchtune's
    # flags table is torch.optim.AdamW, not the recipe's default PagedAdamW8bit-in-backward
    return {"optimizer": name, "paged_optimizer": bool(re.search(r"paged", text, re.I)),
            "optimizer_in_backward": bool(re.search(r"optimizer_in_bwd=true|step fused into backward", text, re.I)),
            **_optimizer_impl(row, stack, dated, assumed)}


def _optimizer_impl(row: dict[str, str], stack: str, dated: _Dating, assumed: list[str]) -> dict[str, Any]:
    """The AdamW kernel the row's optimizer text or its torchtune config commit names; none: the stack's."""
    impl = _first(OPTIMIZER_IMPL_PATTERNS, row["optimizer"])
    if impl is None and stack == "torchtune" and re.search(TORCHTUNE_BEFORE_FUSED_ADAM, row["source_commit_or_url"]):
        impl = "foreach"
        assumed.append("optimizer_impl: foreach (torchtune configs before #1575 set no fused flag)")
    if impl is None and stack == "torchtitan" and (dated.revision or "9999") < TORCHTITAN_FUSED_ADAM_SINCE:
        impl = "foreach"
        assumed.append("optimizer_impl: foreach (torchtitan before #881 built AdamW with foreach=not fused, fused off)")
    return {} if impl is None else {"optimizer_impl": impl}


# (pattern over the notes, chunks): the loss a row's notes name (torchtune's flags table); a row
# whose notes name none is left to its stack's default
LOSS_PATTERNS = ((r"\bloss: standard ce\b", 0), (r"\bloss: (chunked ce|cewithchunkedoutputloss)\b", 8))


# stack -> (first date, source): from then on the stack's ``compile: True`` compiles the loss too,
# and a compiled cross-entropy allocates as a fused kernel does (``fused_ce``: activations.py)
COMPILED_LOSS_SINCE = {
    "torchtune": ("2024-09-07", "torchtune c169bcddd (#1512) training.compile_loss: compile: True compiles the "
                                "loss (CEWithChunkedOutputLoss: compute_cross_entropy per chunk)"),
    "torchtitan": ("2025-04-02", "torchtitan bbb1b616e (#1033) components/loss.py build_loss_fn: "
                                 "torch.compile(loss_fn) when training.compile (9dec370 train.py: '# loss_fn = "
                                 "torch.compile(loss_fn)', commented out)"),
}

# torchtitan revisions the rows name only by hash (or by the doc that carries the run) -> the date
# of that commit in torchtitan's git history (github:pytorch/torchtitan): the run used that revision
TORCHTITAN_REVISION_DATES = (
    (r"torchtitan 9dec370", "2024-12-26"),
    (r"torchtitan 2c8b5947", "2025-08-08"),
    (r"torchtitan 6fc499f6", "2025-08-14"),
    # docs/performance.md at 1d5815c4b (2024-10-30) carries the 2024 A100 tables: the runs used a
    # revision on or before it (the tables first appear 2024-04)
    (r"\b1d5815c4", "2024-10-30"),
    # the NVFP4 converter's doc (its BF16 row is that experiment's baseline): first added in
    # bcc09297a (#3914), so the runs used a revision with the converter
    (r"components/quantization/nvfp4\.md", "2026-08-05"),
)


# torchtune README revisions the rows name by hash -> the date of that commit in torchtune's git
# history (github:pytorch/torchtune): the README table at that revision
TORCHTUNE_REVISION_DATES = (
    (r"\b5f0d64c6b", "2024-04-15"), (r"\bfef3ed10d", "2024-04-16"), (r"\b7d05579fe", "2024-05-02"),
    (r"\b0217d44c2", "2024-05-09"),
)
# A README number carried unchanged from an earlier commit was measured with the code and configs
# of the commit that wrote it (``git log -S '<number> GB' -- README.md``): (pattern over the row's
# source locator, commit column and notes, that commit, its date, what its config set that the
# row's later config does not). 12.01 GB (4 x RTX 4090 full fine-tune) was written by a95c6b931
# (#551) while recipes/configs/full_finetune_distributed.yaml built ``torch.optim.SGD`` with ``lr``
# only (no momentum: torch.optim.SGD keeps no state); AdamW came with b65426dc1 (#571, 2024-03-24).
# The Llama 3.1 "Memory and training speed" table the rows read at 9bafd16fc was written by
# 30b8519e8 (#1664, 2024-09-24; ``git log -S '| 3083 |' -- README.md``). Its configs:
# llama3_1/8B_lora_single_device.yaml adapted ``['q_proj', 'v_proj']`` with ``apply_lora_to_mlp:
# False`` (``qv``), 70B_lora.yaml ``['q_proj', 'k_proj', 'v_proj']`` without the MLP (the nearest
# target set, ``attention``, adds output_proj's adapter); 8B_qlora_single_device and 405B_qlora
# adapted q, k, v, output_proj and the MLP (``all-linear``, as read). The q, v, output_proj + MLP
# sets the rows read came with e137afeba (#1954, 2024-11-07), after the numbers.
TORCHTUNE_WRITTEN_AT = (
    (r"5f0d64c6b.*Raw 12\.01 GB", "a95c6b931", "2024-03-21", {"optimizer": "sgd-plain"}),
    (r"5f0d64c6b.*Raw (14\.17|17\.18) GB", "a95c6b931", "2024-03-21", {}),
    (r"5f0d64c6b.*Raw 9\.29 GB", "412a4ecd7", "2024-03-22", {}),
    (r"5f0d64c6b.*Raw 15\.97 GB", "5cbc1967b", "2024-03-28", {}),
    (r"7d05579fe.*Raw 8\.57 GB", "20747cd87", "2024-04-18", {}),
    (r"'Llama 3\.1 8B \| LoRA \|.*9bafd16fc \(first appearance\)", "30b8519e8", "2024-09-24", {"lora_targets": "qv"}),
    (r"'Llama 3\.1 70B \| LoRA \|.*9bafd16fc \(first appearance\)", "30b8519e8", "2024-09-24",
     {"lora_targets": "attention"}),
    (r"9bafd16fc \(first appearance\)", "30b8519e8", "2024-09-24", {}),
)


def _torchtune_written_at(row: dict[str, str]) -> tuple[str, str, dict[str, Any]] | None:
    text = " ".join(row.get(k, "") for k in ("source_locator", "source_commit_or_url", "notes"))
    return next(((commit, date, knobs) for pattern, commit, date, knobs in TORCHTUNE_WRITTEN_AT
                 if re.search(pattern, text, re.S)), None)


def _torchtune_measured_config(dated: _Dating, assumed: list[str]) -> dict[str, Any]:
    """What the config of the commit that wrote a torchtune row's number set differently from the
    config the row was read at (``TORCHTUNE_WRITTEN_AT``)."""
    written = dated.written
    if not written or not written[2]:
        return {}
    assumed.append(f"measured at torchtune {written[0]} ({written[1]}), whose config set {written[2]}")
    return dict(written[2])


@dataclass(frozen=True)
class _Dating:
    """When a row's run was made, read once per row (``_dating``) for every knob that depends on it.
    Two dates, because the knobs compare with two kinds of boundary: ``stated`` is the date the
    source gives (the source locator's, else the commit/url column's), and the run was made on or
    before it, which decides an "until" boundary (bitsandbytes, transformers' reentrant default);
    ``revision`` is the date of the code revision the run used (``TORCHTITAN_REVISION_DATES``,
    ``TORCHTUNE_WRITTEN_AT``, ``TORCHTUNE_REVISION_DATES``, else ``stated``), which the "since"
    boundaries of a stack's own code need. A torchtitan row names no revision unless it names its
    commit: its page's date is only when the table was published, so it has no ``revision`` then."""

    stated: str | None
    revision: str | None
    written: tuple[str, str, dict[str, Any]] | None  # torchtune: the commit that wrote the number


def _dating(row: dict[str, str], stack: str) -> _Dating:
    found = (re.search(r"\b(20\d\d-\d\d-\d\d)\b", row.get(c, "")) for c in ("source_locator", "source_commit_or_url"))
    stated = next((m.group(1) for m in found if m), None)
    text = " ".join(row.get(k, "") for k in ("source", "source_commit_or_url"))
    written = _torchtune_written_at(row) if stack == "torchtune" else None
    if stack == "torchtitan":
        revision = next((d for pattern, d in TORCHTITAN_REVISION_DATES if re.search(pattern, text)), None)
    elif stack == "torchtune":
        named = next((d for pattern, d in TORCHTUNE_REVISION_DATES if re.search(pattern, text)), None)
        revision = written[1] if written else named or stated
    else:
        revision = stated
    return _Dating(stated=stated, revision=revision, written=written)


# torchtune's loss before its chunked cross-entropy: the configs' ``loss: torch.nn.CrossEntropyLoss``
# on the whole ``self.output(h).float()`` until 4fba6cd44 (#1390, 2024-08-28) made them
# ``CEWithChunkedOutputLoss``; and the recipes kept ``logits`` referenced through ``loss.backward()``
# until "del logits" (recipe pattern, first date without it)
TORCHTUNE_CHUNKED_CE_SINCE = "2024-08-28"
TORCHTUNE_DEL_LOGITS_SINCE = (
    (r"lora_finetune_distributed", "2024-06-04"),  # cb3ed29d7 (#1046) recipes/lora_finetune_distributed.py
    (r".", "2024-07-28"),  # 8a98fbaa3 (#1235): full_finetune_distributed, full_finetune_single_device, lora_single_device
)


def _torchtune_loss(row: dict[str, str], stack: str, dated: _Dating) -> dict[str, Any]:
    """The loss as a torchtune run dated before the chunked loss and "del logits" ran it: the whole
    logits (``ce_chunks`` 0) and the loop holding them through backward (``loop_keeps_logits``)."""
    date = dated.revision
    if stack != "torchtune" or date is None:
        return {}
    out: dict[str, Any] = {"ce_chunks": 0} if date < TORCHTUNE_CHUNKED_CE_SINCE else {}
    if date < _first(TORCHTUNE_DEL_LOGITS_SINCE, row["framework"]):
        out["loop_keeps_logits"] = True
    return out


# torchtune's NF4 is torchao's: ``torchao-nightly`` until f97bcdaa0 (2024-04-09), then pinned
# ``torchao==0.1`` until c1c9f308a (#1125, 2024-06-26, ``torchao==0.3``); torchao quantizes a weight in
# one piece until 6081796bc (2024-05-01, first released in 0.2.0), so every torchtune run dated before
# the 0.3 pin quantized whole weights (``nf4_whole_quantize``, formulas/nf4_load_cache.py)
TORCHTUNE_CHUNKED_NF4_SINCE = "2024-06-26"


def _torchtune_nf4(stack: str, dated: _Dating) -> dict[str, Any]:
    date = dated.revision
    if stack != "torchtune" or date is None or date >= TORCHTUNE_CHUNKED_NF4_SINCE:
        return {}
    return {"nf4_whole_quantize": True}


# stack -> (first date it runs a bitsandbytes whose MatMul4Bit no longer keeps its input, source):
# a 4-bit run dated before it keeps every 4-bit Linear's input (``quant_saves_input``,
# activations.quant_saved_input_bytes_per_token); torchtune's NF4 is torchao's, not bitsandbytes'
BNB_KEEPS_INPUT_UNTIL = {
    "default": ("2024-07-23", "bitsandbytes 0.43.2 (2024-07-23, PR #1270 'delete useless buffered activation'): "
                              "before it MatMul4Bit stored ctx.tensors = (A, B)"),
    "lightning": ("2024-12-28", "LitGPT pyproject.toml pins bitsandbytes==0.42.0 from 929f9c79 (2024-03-15) "
                                "to d2ed13c3 (2024-12-28, 'Bump ... BnB versions')"),
}


# Hugging Face's gradient checkpointing ran torch's reentrant variant until transformers #43203
# (opened 2026-01-09, "Switch gradient checkpointing default to use_reentrant=False"): #28538
# (2024-01) pinned {"use_reentrant": True} when no kwargs are given, torch's own default before it
HF_REENTRANT_UNTIL = ("2026-01-09", "transformers #43203 (2026-01-09): gradient_checkpointing_enable without kwargs "
                                    "was use_reentrant=True (#28538) before it")


def _hf_reentrant(stack: str, dated: _Dating) -> dict[str, Any]:
    """``reentrant_checkpointing`` for a Hugging Face row dated before ``HF_REENTRANT_UNTIL`` (it only
    matters where the row checkpoints); nothing without a date or on another stack."""
    date = dated.stated
    return {"reentrant_checkpointing": True} if stack == "hf" and date and date < HF_REENTRANT_UNTIL[0] else {}


def _bnb_keeps_input(stack: str, dated: _Dating) -> dict[str, Any]:
    """``quant_saves_input`` for a run whose revision date is before its stack's bitsandbytes
    stopped keeping the 4-bit Linears' inputs (``BNB_KEEPS_INPUT_UNTIL``); nothing without a date."""
    date = dated.stated
    if stack == "torchtune" or date is None:
        return {}
    return {"quant_saves_input": True} if date < BNB_KEEPS_INPUT_UNTIL.get(stack, BNB_KEEPS_INPUT_UNTIL["default"])[0] else {}


def _compiled_loss(row: dict[str, str], stack: str, dated: _Dating) -> dict[str, Any]:
    """``fused_ce`` for a compiled run of a stack whose revision (``_Dating.revision``) compiles its
    loss; nothing when the row states no compile or no date."""
    since = COMPILED_LOSS_SINCE.get(stack)
    date = dated.revision
    if since is None or date is None or not re.match(r"yes", row.get("compile", ""), re.I):
        return {}
    return {"fused_ce": True} if date >= since[0] else {}


def _compile(row: dict[str, str]) -> dict[str, Any]:
    """``compile`` as the row's compile column states it ("yes …" / "no"); unstated: the stack's."""
    text = row.get("compile", "")
    if re.match(r"yes", text, re.I):
        return {"compile": True}
    return {"compile": False} if re.match(r"no\b", text, re.I) else {}


# torchtitan revisions whose op-level SAC recomputes attention on sm100: ``models/attention.py`` puts
# cuDNN SDPA first there from 3b85aa31f (#1196, 2025-05-14) while ``_save_list`` held only the flash
# and efficient kernels until b39377f9f (#2095, 2025-12-01) added cuDNN's. Elsewhere torchtitan asks
# for [FLASH, EFFICIENT, MATH] (cuDNN only when ``has_cuda_capability(10, 0)``), and torch builds
# before 2.9 (#162073) do not default H100 to cuDNN, so the saved kernel is flash.
TORCHTITAN_CUDNN_RECOMPUTED = ("2025-05-14", "2025-12-01")
SM100_GPUS = r"^(b200|gb200)"


def _sac_attention(stack: str, dated: _Dating, cluster: Cluster) -> dict[str, Any]:
    """``sac_saves_attention`` False for a torchtitan revision in ``TORCHTITAN_CUDNN_RECOMPUTED`` on
    an sm100 GPU; nothing elsewhere (saved: the stack default)."""
    since, until = TORCHTITAN_CUDNN_RECOMPUTED
    date = dated.revision
    if stack != "torchtitan" or date is None or not re.match(SM100_GPUS, cluster.gpu.name):
        return {}
    return {"sac_saves_attention": False} if since <= date < until else {}


def _loss(row: dict[str, str]) -> dict[str, Any]:
    """Chunked cross-entropy as the notes state it (CEWithChunkedOutputLoss: 8 chunks by default)."""
    chunks = _first(LOSS_PATTERNS, row.get("notes", ""))
    return {} if chunks is None else {"ce_chunks": chunks}


# (pattern over the row's source, attention kernel): what a source's harness ran when the row does
# not say. llm-foundry's benchmark tables come from scripts/train/benchmarking/submit_benchmarks.py,
# whose ``--attn_impl`` defaulted to 'triton' at the commits that wrote them (b2a43a147, 5e85bd62d):
# llm-foundry's Triton FlashAttention (``triton_flash_attn_fn``; the MPT yamls say ``attn_impl: triton`` too).
ATTENTION_PATTERNS = ((r"llm-foundry scripts/train/benchmarking", "triton"),)


def _attention(row: dict[str, str], assumed: list[str]) -> dict[str, Any]:
    kernel = _first(ATTENTION_PATTERNS, row.get("source", ""))
    if kernel is None:
        return {}
    assumed.append(f"attention: {kernel} (the source's benchmark harness default)")
    return {"attention": kernel}


def _workload(row: dict[str, str]) -> dict[str, Any]:
    seq, micro = _int(row["seq_len"]), _int(row["micro_batch"])
    if not seq:
        raise _Refused("seq_len_not_stated", row["seq_len"])
    if not micro:
        raise _Refused("micro_batch_not_stated", row["micro_batch"])
    return dict(seq_len=seq, micro_batch=micro, grad_accum=_int(row["grad_accum"]) or 1)


# --- what was measured ---------------------------------------------------------------------------------

COUNTER_PATTERNS = (
    (r"^oom|failed run|caching allocator fill", None), (r"nvidia-smi|nvml", "device_total"),
    (r"max_memory_reserved|max_reserved|reserved_bytes|peak reserved", "reserved"),
    (r"max_memory_allocated|peak allocated|active_bytes|memory allocated", "allocated"),
)


def measured_memory(row: dict[str, str]) -> tuple[str | None, int | None]:
    """(counter class, bytes) of the row's peak memory, (None, None) when it has none or when it
    is no measure of need (an OOM, a screenshot of a full card)."""
    gib = _float(row["measured_mem_gib"])
    if gib is None or row["row_type"] == "measured_oom":
        return None, None
    counter = _first(COUNTER_PATTERNS, row["mem_counter"]) if row["mem_counter"] else "unnamed"
    if counter is None and not _first(COUNTER_PATTERNS[:1], row["mem_counter"]):
        counter = "unnamed"
    return counter, (None if counter is None else int(round(gib * GIB)))


def summary(rows: list[Row]) -> dict[str, int]:
    """How many rows became queries and how many each reason refused (every row counted once)."""
    out = {"expressed": sum(isinstance(r, RunQuery) for r in rows)}
    for r in rows:
        if isinstance(r, Unexpressible):
            out[r.reason] = out.get(r.reason, 0) + 1
    return out
