"""One vocabulary for every categorical knob: the words a query, an ``--option``, a sweep list and
the Python API (``TrainingConfig``) accept, and what each means.

Each knob lists its canonical names (the tuples of ``knob_names.py``, which formulas index) and its
aliases: other words people use for one of them ("zero3" = full_shard, "offload all" =
optimizer+params, "gc" = full checkpointing). An alias whose meaning depends on another knob
says which: "bf16" means what the chosen training STACK means by it (Transformers' ``bf16=True``
is mixed precision, torchtune's ``dtype: bf16`` is pure bf16; declared with sources in
``data/stack_profiles/*.json`` under ``words``), and "offload auto" what the ENGINE offloads
by default. Spellings are compared with the one name rule (``names.normalize``).

The query grammar (``query.py``), the ``--help`` strings (``help_text``), ``TrainingConfig``'s
validator (``canonical_config``), ``strategy.code`` (so sweeps and exports accept the same words)
and ``docs/vocabulary.md`` (``markdown``) are all generated from these tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

from shardplan.inputs import knob_names as st
from shardplan.inputs.engines import engine_profiles
from shardplan.inputs.stack_files import read_stacks, stack_word
from shardplan.support.errors import ShardplanError
from shardplan.support.names import did_you_mean, normalize


@dataclass(frozen=True)
class Alias:
    """Another word for a canonical name. ``by`` names the knob the meaning depends on ("stack":
    each stack profile's ``words``; "engine": ``by_value``); ``also`` sets other knobs unless stated."""

    word: str
    value: str | None
    why: str
    by: str | None = None
    by_value: tuple[tuple[str, str], ...] = ()
    also: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Knob:
    """One categorical knob: its ``TrainingConfig`` field, names, aliases and query forms."""

    field: str
    what: str
    names: tuple[str, ...]
    aliases: tuple[Alias, ...] = ()
    keys: tuple[str, ...] = ()          # query "KEY VALUE" forms ("offload all", "targets qv")
    key_alone: str | None = None        # what a KEY with no value after it means ("ac" = full)
    bare: bool = False                  # its words may stand alone in a query ("zero3", "qlora")
    implies: tuple[tuple[str, Any], ...] = ()  # in a query, also sets (unless stated): nf4 -> qlora
    option: str = ""                    # the CLI option ("--strategy")

    def words(self) -> tuple[str, ...]:
        """Every word accepted: the names, then the aliases."""
        return self.names + tuple(a.word for a in self.aliases)


_PRECISION_BY_STACK = "the chosen stack's meaning (data/stack_profiles/*.json 'words'; docs/vocabulary.md)"

KNOBS: dict[str, Knob] = {k.field: k for k in (
    Knob("strategy", "sharding strategy", st.STRATEGIES, (
        Alias("zero3", "full_shard", "DeepSpeed ZeRO stage 3 shards parameters, gradients and optimizer states: "
                                     "FSDP FULL_SHARD (ZeRO paper, SC'20, §5)"),
        Alias("fsdp", "full_shard", "FSDP's default ShardingStrategy is FULL_SHARD (torch.distributed.fsdp "
                                    "FullyShardedDataParallel; fully_shard reshards after forward by default)"),
        Alias("hsdp", "hybrid_shard", "hybrid sharded data parallel: FSDP HYBRID_SHARD, fully_shard on a 2-D mesh"),
        Alias("zero0", "ddp", "DeepSpeed stage 0 shards nothing: data parallelism (DeepSpeed ZeroStageEnum.disabled)"),
    ), keys=("strategy",), bare=True, option="--strategy"),
    Knob("engine", "sharding engine", st.ENGINES, tuple(  # each engine's declaration names its words
        Alias(w.word, e.name, w.why) for e in engine_profiles() for w in e.words
    ), keys=("engine",), bare=True, option="--engine"),
    Knob("method", "fine-tuning method", st.METHODS, (
        Alias("full-finetune", "full", "every weight trained (no adapters)"),
    ), keys=("method",), bare=True, option="--method"),
    Knob("precision", "precision", st.PRECISIONS, (
        Alias("bf16", None, _PRECISION_BY_STACK, by="stack"),
        Alias("fp16", None, _PRECISION_BY_STACK, by="stack"),
        Alias("bf16-true", "bf16-pure", "Lightning precision='bf16-true' (HalfPrecision: the module in bfloat16, "
                                        "no fp32 copy)"),
        Alias("16-mixed", "fp16-mixed", "Lightning precision='16-mixed' (torch.autocast float16 + GradScaler)"),
        Alias("32-true", "fp32", "Lightning precision='32-true'"),
    ), keys=("precision", "dtype"), bare=True, option="--precision"),
    Knob("optimizer", "optimizer", st.OPTIMIZERS, (
        Alias("adam", "adamw", "Adam keeps the same two fp32 states per parameter as AdamW (torch.optim.Adam)"),
        Alias("adamw_torch", "adamw", "Transformers TrainingArguments optim='adamw_torch'"),
        Alias("adamw_torch_fused", "adamw", "Transformers TrainingArguments optim='adamw_torch_fused'"),
        Alias("adamw_bnb_8bit", "adamw-8bit", "Transformers TrainingArguments optim='adamw_bnb_8bit' "
                                              "(bitsandbytes AdamW8bit)"),
        Alias("paged_adamw_8bit", "adamw-8bit", "Transformers optim='paged_adamw_8bit' (bitsandbytes PagedAdamW8bit: "
                                                "8-bit states in CUDA unified memory)", also=(("paged_optimizer", True),)),
    ), keys=("optimizer", "optim"), bare=True, option="--optimizer"),
    Knob("ac", "activation checkpointing", st.AC_MODES, (
        Alias("gc", "full", "Transformers gradient_checkpointing=True: every decoder layer recomputed"),
        Alias("checkpointing", "full", "activation checkpointing of every block"),
        Alias("gradient-checkpointing", "full", "Transformers TrainingArguments gradient_checkpointing"),
        Alias("sac", "selective-op", "torchtitan ActivationCheckpoint(mode='selective', selective_ac_option='op'): "
                                    "every second matmul output recomputed"),
    ), keys=("ac",), key_alone="full", bare=True, option="--ac"),
    Knob("offload", "CPU offload", st.OFFLOADS, (
        Alias("all", "optimizer+params", "parameters, gradients and optimizer states on the CPU (FSDP "
                                         "CPUOffload(offload_params=True) also steps the optimizer there)"),
        Alias("params", "optimizer+params", "FSDP CPUOffload(offload_params=True) offloads parameters and their "
                                            "gradients, and the optimizer step runs on the CPU"),
        Alias("auto", None, "what the engine usually offloads: DeepSpeed ZeRO-Offload offload_optimizer, FSDP "
                            "CPUOffload(offload_params=True)", by="engine",
              by_value=tuple((e.name, e.default_offload.value) for e in engine_profiles())),
    ), keys=("offload",), key_alone="auto", option="--offload"),
    Knob("lora_targets", "LoRA targets", st.LORA_TARGETS, (
        Alias("q_proj,v_proj", "qv", "PEFT target_modules=['q_proj', 'v_proj']"),
        Alias("attn", "attention", "q, k, v and o projections"),
        Alias("all", "all-linear", "PEFT target_modules='all-linear'"),
        Alias("all-linear+lm_head", "all-linear+embeddings", "all-linear plus the embedding and lm_head"),
        Alias("all-linear+embedding", "all-linear+embeddings", "all-linear plus the embedding and lm_head"),
    ), keys=("targets", "lora_targets"), option="--lora-targets"),
    Knob("attention", "attention kernel", st.ATTENTIONS, (), keys=("attention", "attn"), bare=True,
         option="--attention"),
    Knob("reduce_dtype", "gradient reduction dtype", st.REDUCE_DTYPES, (
        Alias("float32", "fp32", "torch.float32"), Alias("bfloat16", "bf16", "torch.bfloat16"),
        Alias("float16", "fp16", "torch.float16"),
    ), keys=("reduce", "reduce_dtype"), option="--reduce-dtype"),
    Knob("stack", "training stack", st.STACKS, (
        Alias("transformers", "hf", "Hugging Face Transformers + Trainer"),
        Alias("litgpt", "lightning", "LitGPT runs on Lightning Fabric"),
        Alias("fabric", "lightning", "Lightning Fabric"),
    ), keys=("stack",), bare=True, option="--stack"),
    Knob("quant_format", "4-bit base", st.QUANT_FORMATS, (
        Alias("bnb-4bit", "nf4", "bitsandbytes load_in_4bit with bnb_4bit_quant_type='nf4' (the QLoRA recipe)"),
    ), keys=("quant", "quant_format"), bare=True, implies=(("method", "qlora"),), option="--quant-format"),
    Knob("load_mode", "weight loading", st.LOAD_MODES, (
        Alias("cpu_ram_efficient_loading", "rank0_broadcast", "accelerate FullyShardedDataParallelPlugin"
                                                              "(cpu_ram_efficient_loading=True)"),
        Alias("meta", "meta_init", "built on the meta device, each rank fills its shard"),
    ), keys=("load", "load_mode"), bare=True, option="--load-mode"),
    Knob("optimizer_impl", "AdamW kernel", st.OPTIMIZER_IMPLS, (
        Alias("for-loop", "for_loop", "torchtitan optimizer.implementation 'for-loop'; torch foreach=False"),
        Alias("adamw_torch_fused", "fused", "Transformers TrainingArguments optim='adamw_torch_fused'"),
    ), keys=("optim_impl", "optimizer_impl"), option="--optimizer-impl"),
)}


@dataclass(frozen=True)
class Flag:
    """A query word that sets fixed values (``sets``), and others only when unstated (``defaults``)."""

    words: tuple[str, ...]
    sets: tuple[tuple[str, Any], ...]
    why: str
    defaults: tuple[tuple[str, Any], ...] = field(default=())


FLAGS: tuple[Flag, ...] = (
    Flag(("oib", "optimizer-in-backward", "optimizer_in_bwd"), (("optimizer_in_backward", True),),
         "torchtune optimizer_in_bwd: True (the step runs in each parameter's post-accumulate-grad hook)"),
    Flag(("chunked-ce",), (("ce_chunks", 8),),
         "torchtune CEWithChunkedOutputLoss(num_output_chunks=8)"),
    Flag(("offload-activations", "activation-offload"), (("activation_offload", True),),
         "torchtune enable_activation_offloading: True"),
    Flag(("checkpoint-wrapper", "fsdp-ac"), (("checkpoint_wrapper", True),),
         "accelerate FSDP activation_checkpointing (torch checkpoint_wrapper around each block)"),
    Flag(("use-cache",), (("use_cache", True),),
         "the model config's use_cache left on during training (transformers' default outside its own checkpointing)"),
    Flag(("fused-lm-head", "trl-fused-head"), (("fused_lm_head", True),),
         "TRL SFTTrainer's chunked LM head (TRL >= 1.16 add_fused_lm_head): 4,096-token tiles, no full logits"),
    Flag(("kbit-prep",), (("kbit_prep", True),),
         "QLoRA prepared by PEFT's prepare_model_for_kbit_training (norms, embeddings, lm_head in fp32: an fp32 stream)"),
    Flag(("fms-gptq",), (("quant_buffers_sharded", True),),
         "fms-acceleration's GPTQ plugin (accelerated-peft autogptq): under FSDP each QuantLinear's qweight and "
         "qzeros become float parameters FSDP shards (scales stay whole per rank)",
         (("quant_format", "gptq"), ("method", "qlora"))),
    Flag(("expandable-segments",), (("expandable_segments", True),),
         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    Flag(("paged",), (("paged_optimizer", True),),
         "bitsandbytes paged optimizer (Transformers optim='paged_adamw_8bit')", (("optimizer", "adamw-8bit"),)),
    Flag(("compile", "torch-compile", "compiled"), (("compile", True),),
         "the blocks run under torch.compile (torchtitan training.compile, torchtune compile: True, "
         "fms-fsdp use_torch_compile): inductor fuses their element-wise work"),
    Flag(("no-compile",), (("compile", False),), "eager blocks (no torch.compile)"),
    Flag(("fp32-master",), (("fp32_master", True),), "an fp32 master copy of the weights"),
    Flag(("no-fp32-master",), (("fp32_master", False),), "16-bit weights, no fp32 master copy"),
)

# "KEY N" words: the integer knobs.
NUMBER_KEYS: dict[str, str] = {
    "seq": "seq_len", "seqlen": "seq_len", "seq_len": "seq_len", "sequence": "seq_len", "ctx": "seq_len",
    "batch": "micro_batch", "mb": "micro_batch", "micro_batch": "micro_batch",
    "accum": "grad_accum", "grad_accum": "grad_accum", "ga": "grad_accum",
    "rank": "lora_rank", "lora_rank": "lora_rank", "r": "lora_rank",
    "ce-chunks": "ce_chunks",
    "group": "shard_group_size", "shard_group_size": "shard_group_size",
    "every": "ac_every_k", "ac_every_k": "ac_every_k",
}


def knob(field_name: str) -> Knob:
    return KNOBS[field_name]


@lru_cache(maxsize=None)
def _lookup(field_name: str) -> dict[str, tuple[str | None, Alias | None]]:
    """normalized word -> (canonical name, None) or (None, alias) for one knob."""
    k = KNOBS[field_name]
    out: dict[str, tuple[str | None, Alias | None]] = {}
    for a in k.aliases:
        out[normalize(a.word)] = (a.value, a) if a.by else (a.value, None)
    out.update({normalize(n): (n, None) for n in k.names})  # a canonical name always wins
    return out


def _options(text: Any) -> list[str]:
    if text is None:
        return []
    return [text] if isinstance(text, str) else list(text)


def _dependent(field_name: str, word: Any, alias: Alias, context: dict[str, Any]) -> str:
    """The canonical name of a word whose meaning depends on ``alias.by`` (one or several values:
    they must agree)."""
    given = _options(context.get(alias.by))
    if not given:
        raise ShardplanError(field_name, word, f"depends on the {alias.by} and none is given: "
                                               f"name one of {', '.join(KNOBS[field_name].names)}")
    meanings: dict[str, str] = {}
    for value in given:
        owner = canonical(alias.by, value)
        if alias.by == "stack":
            meanings[owner] = stack_word(owner, field_name, alias.word)
        else:
            meanings[owner] = dict(alias.by_value)[owner]
    if len(set(meanings.values())) > 1:
        spelled = ", ".join(f"{v} for {k}" for k, v in meanings.items())
        raise ShardplanError(field_name, word, f"means {spelled}: name one of {', '.join(KNOBS[field_name].names)}")
    return next(iter(meanings.values()))


def canonical(field_name: str, word: Any, **context: Any) -> str:
    """The canonical name ``word`` spells for knob ``field_name``; ``context`` gives the knobs a
    dependent alias needs (``stack=``, ``engine=``: a name or a list of names that must agree).
    Unknown words get a one-line error with the closest words and the full list."""
    k = KNOBS[field_name]
    if word in k.names:  # already canonical (the common case on hot paths)
        return word
    name, alias = _lookup(field_name).get(normalize(word), (None, None))
    if alias is not None:
        return _dependent(field_name, word, alias, context)
    if name is None:
        raise ShardplanError(field_name, word, f"unknown{did_you_mean(word, k.words())}; choose one of "
                                               f"{', '.join(k.words())}")
    return name


def accepts(field_name: str, word: Any) -> bool:
    return normalize(word) in _lookup(field_name)


def spelled(field_name: str, word: Any) -> str:
    """``word`` as a query keeps it: the canonical name, or the alias itself when its meaning
    depends on another knob (resolved once the whole configuration is known)."""
    name, alias = _lookup(field_name)[normalize(word)]
    return alias.word if alias is not None else name


def also_sets(field_name: str, word: Any) -> dict[str, Any]:
    """Knobs an alias sets besides its own (``paged_adamw_8bit`` -> paged_optimizer)."""
    if field_name not in _ALSO:  # normalized once per knob: every TrainingConfig asks for each word
        first: dict[str, Any] = {}
        for a in KNOBS[field_name].aliases:
            first.setdefault(normalize(a.word), a.also)
        _ALSO[field_name] = {w: also for w, also in first.items() if also}  # most knobs: none
    table = _ALSO[field_name]
    return dict(table.get(normalize(word), ())) if table else {}


_ALSO: dict[str, dict[str, Any]] = {}


# Resolved first: the knobs other words depend on.
_ORDER = ("stack", "engine") + tuple(f for f in KNOBS if f not in ("stack", "engine"))
_RANK = {name: i for i, name in enumerate(_ORDER)}


def canonical_config(data: dict[str, Any]) -> dict[str, Any]:
    """A TrainingConfig's input with every categorical word made canonical (aliases resolved, the
    stack's meaning of 'bf16', the engine's of 'offload auto'); knobs an alias also sets are added
    unless stated. Unknown words raise a one-line ShardplanError."""
    out = dict(data)
    for name in sorted(out.keys() & _RANK.keys(), key=_RANK.__getitem__):  # the knobs given, in _ORDER
        value = out[name]
        if not isinstance(value, str):
            continue
        # a stack or engine that is not a word (``engine={}``) is refused by the schema after this;
        # until then words resolve in the defaults' context (an unhashable key would be a TypeError)
        stack, engine = out.get("stack", "hf"), out.get("engine", "fsdp2")
        key = (name, value, stack if isinstance(stack, str) else "hf", engine if isinstance(engine, str) else "fsdp2")
        known = _resolved.get(key)
        if known is None:
            known = _resolve_word(*key)
        out[name] = known[0]
        for other, v in known[1]:
            out.setdefault(other, v)
    return out


# (knob, word, stack, engine) -> (canonical name, knobs the alias also sets): every TrainingConfig
# resolves its words (its validator), mostly the same few words. Only
# answers are kept (an unknown word raises each time); the vocabulary and stacks are fixed data.
_resolved: dict[tuple, tuple[str, tuple]] = {}


def _resolve_word(name: str, word: str, stack: Any, engine: Any) -> tuple[str, tuple]:
    # what an alias also sets is canonical too (a knob added after its turn in _ORDER is not revisited)
    also = tuple((k, canonical(k, v, stack=stack, engine=engine) if isinstance(v, str) and k in _RANK else v)
                 for k, v in also_sets(name, word).items())
    known = (canonical(name, word, stack=stack, engine=engine), also)
    if len(_resolved) >= 4096:  # words from user input: bounded
        _resolved.clear()
    _resolved[(name, word, stack, engine)] = known
    return known


# --- text generated from the tables -----------------------------------------------------------------
def help_text(field_name: str, default: str | None = None, tail: str = "") -> str:
    """An option's help: '<what>: name, name, ... (default X); aliases: word, word, ...'. What each
    alias means is in docs/vocabulary.md (``markdown``): ``--help`` stays short (issue 22)."""
    k = KNOBS[field_name]
    text = f"{k.what}: {', '.join(k.names)}"
    if default:
        text += f" (default {default})"
    if k.aliases:
        text += "; aliases: " + ", ".join(a.word for a in k.aliases)
    return text + (f"; {tail}" if tail else "")


def query_words() -> list[tuple[str, dict[str, Any]]]:
    """Every query phrase the grammar accepts for a knob, with the ``--option`` values it equals:
    bare words, "KEY VALUE" for every key and every word, a KEY alone, the flags and number keys."""
    out: list[tuple[str, dict[str, Any]]] = []
    for k in KNOBS.values():
        for word in k.words():
            implied = dict(k.implies)
            if k.bare and bare_owner(word) == k.field:
                out.append((word, {k.field: word, **implied}))
            for key in k.keys:
                out.append((f"{key} {word}", {k.field: word, **implied}))
        if k.key_alone:
            for key in k.keys:
                out.append((key, {k.field: k.key_alone}))
    for flag in FLAGS:
        for word in flag.words:
            out.append((word, {**dict(flag.defaults), **dict(flag.sets)}))
    for key, field_name in NUMBER_KEYS.items():
        out.append((f"{key} 2", {field_name: 2}))
    return out


@lru_cache(maxsize=None)
def _bare() -> dict[str, str]:
    """normalized bare word -> knob; the first knob (in KNOBS order) that claims a word keeps it
    ('full' is the method, not the AC mode: 'ac full' says the other)."""
    out: dict[str, str] = {}
    for k in KNOBS.values():
        if k.bare:
            for w in k.words():
                out.setdefault(normalize(w), k.field)
    return out


def bare_owner(word: Any) -> str | None:
    return _bare().get(normalize(word))


@lru_cache(maxsize=None)
def key_owner_map() -> dict[str, str]:
    return {normalize(key): k.field for k in KNOBS.values() for key in k.keys}


@lru_cache(maxsize=None)
def flag_map() -> dict[str, Flag]:
    return {normalize(w): f for f in FLAGS for w in f.words}


@lru_cache(maxsize=None)
def number_key_map() -> dict[str, str]:
    return {normalize(k): f for k, f in NUMBER_KEYS.items()}


def is_query_word(word: Any) -> bool:
    """A word that starts a query term (a key, a flag, a bare value): it ends the GPU phrase."""
    key = normalize(word)
    return bool(key) and (key in key_owner_map() or key in flag_map() or key in number_key_map() or key in _bare())


def markdown(stacks: Iterable[Any] = ()) -> str:
    """The vocabulary as Markdown tables (docs/vocabulary.md embeds this text; a test keeps it equal)."""
    lines = ["| knob | option | query forms | names | aliases |", "| --- | --- | --- | --- | --- |"]
    for k in KNOBS.values():
        forms = [f"`{key} VALUE`" for key in k.keys] + (["bare VALUE"] if k.bare else [])
        forms += [f"`{key}` alone = {k.key_alone}" for key in k.keys[:1] if k.key_alone]
        aliases = "<br>".join(f"`{a.word}` = {a.value or 'by ' + a.by}: {a.why}" for a in k.aliases)
        lines.append(f"| {k.field} | `{k.option}` | {', '.join(forms)} | {', '.join(f'`{n}`' for n in k.names)} "
                     f"| {aliases} |")
    lines += ["", "| query word | sets | why |", "| --- | --- | --- |"]
    for f in FLAGS:
        sets = ", ".join(f"{k}={v}" for k, v in f.sets) + "".join(f" ({k}={v} unless given)" for k, v in f.defaults)
        lines.append(f"| {', '.join(f'`{w}`' for w in f.words)} | {sets} | {f.why} |")
    lines += ["", "| query key | sets (a number follows) |", "| --- | --- |"]
    by_field: dict[str, list[str]] = {}
    for key, f in NUMBER_KEYS.items():
        by_field.setdefault(f, []).append(f"`{key} N`")
    lines += [f"| {', '.join(keys)} | {f} |" for f, keys in by_field.items()]
    profiles = list(stacks)
    if profiles:
        words = sorted({w for p in profiles for w in p.words.get("precision", {})})
        lines += ["", "| stack | " + " | ".join(f"`{w}` means" for w in words) + " |",
                  "| --- |" + " --- |" * len(words)]
        for p in profiles:
            cells = []
            for w in words:
                d = p.words.get("precision", {}).get(w)
                cells.append("—" if d is None else f"{d.value or 'refused'}: {d.source}")
            lines.append(f"| {p.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def document() -> str:
    """The generated part of docs/vocabulary.md (``python -m shardplan.inputs.vocabulary`` prints it)."""
    return markdown(read_stacks())


if __name__ == "__main__":
    print(document(), end="")
