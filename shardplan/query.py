"""Free-text capacity queries: "70B on 4x24GB", "llama-3.1-8b on 8xh100-sxm seq 8192 batch 2 qlora".

Grammar: MODEL on GPUS [WORD ...], where a WORD is a strategy or engine or method or precision or
optimizer name, "seq N", "batch N" / "mb N", "accum N", "ac MODE", "offload [optimizer|all]", "reduce DTYPE" (fp32, bf16, fp16, param).
Stack words: a stack name (hf, torchtitan, torchtune, lightning / litgpt, plain) or "stack NAME";
"single" (one GPU, no wrapper); "oib" / "optimizer-in-backward"; "chunked-ce" (8 chunks) or
"ce-chunks N"; "offload-activations"; "paged" (paged 8-bit AdamW); "nf4" / "gptq" / "awq" (a 4-bit
base: implies qlora); "load MODE" (full_per_gpu, rank0_broadcast, meta_init); "targets T"
(qv, attention, all-linear, all-linear+embeddings); "bf16-true" (= bf16-pure).
Anything else is an error that names the word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shardplan import strategy as st
from shardplan.errors import ShardplanError
from shardplan.names import normalize
from shardplan.units import parse_count

_KEYED = {
    "seq": "seq_len", "seqlen": "seq_len", "seq_len": "seq_len", "sequence": "seq_len", "ctx": "seq_len",
    "batch": "micro_batch", "mb": "micro_batch", "micro_batch": "micro_batch", "micro-batch": "micro_batch",
    "accum": "grad_accum", "grad_accum": "grad_accum", "ga": "grad_accum",
    "rank": "lora_rank", "lora_rank": "lora_rank", "r": "lora_rank",
    "ce-chunks": "ce_chunks", "ce_chunks": "ce_chunks",
}
# words that set one knob (name, value); a stack name sets the stack
_FLAGS = {
    "oib": ("optimizer_in_backward", True), "optimizer-in-backward": ("optimizer_in_backward", True),
    "optimizer_in_bwd": ("optimizer_in_backward", True), "chunked-ce": ("ce_chunks", 8),
    "offload-activations": ("activation_offload", True), "activation-offload": ("activation_offload", True),
    "nf4": ("quant_format", "nf4"), "gptq": ("quant_format", "gptq"), "awq": ("quant_format", "awq"),
    "bf16-true": ("precision", "bf16-pure"), "litgpt": ("stack", "lightning"), "fabric": ("stack", "lightning"),
    "transformers": ("stack", "hf"),
    "checkpoint-wrapper": ("checkpoint_wrapper", True), "fsdp-ac": ("checkpoint_wrapper", True),
    "expandable-segments": ("expandable_segments", True), "expandable_segments": ("expandable_segments", True),
}
_NAMED = (
    ("strategy", st.STRATEGIES), ("engine", st.ENGINES), ("method", st.METHODS),
    ("precision", st.PRECISIONS), ("optimizer", st.OPTIMIZERS),
)
_ALIASES = {"zero3": ("strategy", "full_shard"), "fsdp": ("strategy", "full_shard"),
            "hsdp": ("strategy", "hybrid_shard"), "zero0": ("strategy", "ddp"),
            "checkpointing": ("ac", "full"), "gc": ("ac", "full"), "bf16": ("precision", "bf16-mixed"),
            "fp16": ("precision", "fp16-mixed")}


@dataclass
class ParsedQuery:
    model: str
    gpus: str
    options: dict[str, object] = field(default_factory=dict)


_squash = normalize  # the one rule for names (shardplan/names.py)


def parse_query(text: str) -> ParsedQuery:
    parts = re.split(r"\s+on\s+", str(text).strip(), maxsplit=1, flags=re.IGNORECASE)
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
        raise ShardplanError("query", text, "expected 'MODEL on GPUS', e.g. '70B on 4x24GB'")
    model = parts[0].strip()
    words = parts[1].split()
    gpus, rest = words[0], words[1:]
    options: dict[str, object] = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        key = word.lower()
        if key in _KEYED:
            if i + 1 >= len(rest):
                raise ShardplanError("query", word, "needs a number after it")
            options[_KEYED[key]] = parse_count(rest[i + 1], field=_KEYED[key])
            i += 2
            continue
        if key == "ac":
            if i + 1 < len(rest) and _squash(rest[i + 1]) in {_squash(m) for m in st.AC_MODES}:
                options["ac"] = rest[i + 1]
                i += 2
            else:
                options["ac"] = "full"
                i += 1
            continue
        if key == "offload":
            nxt = rest[i + 1].lower() if i + 1 < len(rest) else ""
            if nxt in ("optimizer", "all", "optimizer+params", "params"):
                options["offload"] = "optimizer" if nxt == "optimizer" else "optimizer+params"
                i += 2
            else:
                options["offload"] = "auto"
                i += 1
            continue
        if key in ("stack", "load", "targets", "lora_targets"):  # "stack torchtune", "load meta_init", "targets qv"
            if i + 1 >= len(rest):
                raise ShardplanError("query", word, "needs a value after it")
            options[{"stack": "stack", "load": "load_mode"}.get(key, "lora_targets")] = rest[i + 1].lower()
            i += 2
            continue
        if key == "paged":  # bitsandbytes paged AdamW 8-bit (paged_adamw_8bit)
            options["paged_optimizer"] = True
            options.setdefault("optimizer", "adamw-8bit")
            i += 1
            continue
        if key in _FLAGS or _squash(key) in {_squash(n) for n in st.STACKS}:
            name, value = _FLAGS.get(key, ("stack", key))
            options[name] = value
            if name == "quant_format":
                options.setdefault("method", "qlora")
            i += 1
            continue
        if key in ("reduce", "reduce_dtype", "reduce-dtype"):  # "reduce bf16": gradient reduction dtype
            if i + 1 >= len(rest) or _squash(rest[i + 1]) not in {_squash(d) for d in st.REDUCE_DTYPES}:
                raise ShardplanError("query", word, f"needs a dtype after it: {', '.join(st.REDUCE_DTYPES)}")
            options["reduce_dtype"] = rest[i + 1].lower()
            i += 2
            continue
        if key in _ALIASES:
            name, value = _ALIASES[key]
            options[name] = value
            i += 1
            continue
        for name, vocabulary in _NAMED:
            if _squash(word) in {_squash(v) for v in vocabulary}:
                options[name] = word
                break
        else:
            raise ShardplanError("query", word, "unrecognised word; see 'shardplan fit --help' for the grammar")
        i += 1
    return ParsedQuery(model=model, gpus=gpus, options=options)
