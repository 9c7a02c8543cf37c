"""Free-text capacity queries: "70B on 4x24GB", "llama 3 70b on 8 h100 seq 8192 batch 2 qlora",
"will llama 3 8b fit on a 4090 with lora".

Grammar: MODEL on [COUNTx]GPU [WORD ...] (``GRAMMAR``). MODEL is everything before " on " (it may
hold spaces; question words around it, "will ... fit", are dropped); GPU is the GPU phrase after
it ("8xh100-sxm", "8 h100", "4x24 GB", "a 4090", "h100"), handed whole to ``hardware.parse_gpus``;
it ends at the first query word. "a"/"an"/"one" before the GPU is a count of 1; no count at all
is left to the command (``fit`` then finds the fewest GPUs that fit). The words come from the one
vocabulary (shardplan/inputs/vocabulary.py, docs/vocabulary.md), the same the ``--options`` take:

- a knob's value on its own where it names one knob ("zero3", "deepspeed", "qlora", "bf16",
  "adamw-8bit", "gc", "torchtune", "nf4" (a 4-bit base: implies qlora), "meta_init", "sdpa");
- "KEY VALUE" for every knob ("strategy hsdp", "offload all", "ac selective", "targets qv",
  "reduce bf16", "stack litgpt", "load meta_init", "quant gptq"); "ac" alone = full
  checkpointing, "offload" alone = what the engine usually offloads;
- flags ("oib", "chunked-ce", "offload-activations", "paged", "checkpoint-wrapper", ...);
- "KEY N" numbers ("seq 8192", "batch 2", "accum 4", "rank 64", "ce-chunks 4", "group 8");
  a sequence length in k counts 1,024s ("seq 32k" = 32,768), and the answer says so;
- filler words people type around them ("with", "using", "finetune", ...: ``FILLER``).

Two words that set one knob to different values ("zero3 ddp", "lora qlora", "seq 4096 seq 8192")
are an error naming both; anything else unrecognised is an error that shows the grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from shardplan.inputs import vocabulary as vocab
from shardplan.inputs.units import parse_count
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import INT_RANGES
from shardplan.support.names import normalize

GRAMMAR = "MODEL on [COUNTx]GPU [words]"
EXAMPLE = "8b on 2x4090 lora"
# the one-line error of a query that is not one; short enough for 100 columns with the word it names
# (the words themselves: shardplan fit --help, docs/vocabulary.md)
GRAMMAR_HINT = f"{GRAMMAR}, e.g. '{EXAMPLE}'"


@dataclass
class ParsedQuery:
    model: str
    gpus: str
    options: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how a word was read ("seq 32k" = 32,768)


# Words a GPU phrase is made of besides counts and GPU names: "x" between count and GPU, units.
_GPU_JOINERS = {"x", "×", "*", "gb", "gib", "g"}
# Question words around the model name ("will llama 3 8b fit", "can i train qwen2.5 7b"): they name
# no model, so they are dropped from its ends.
_MODEL_FILLER = frozenset({"will", "would", "can", "could", "does", "do", "is", "i", "we", "how", "about",
                           "what", "train", "training", "finetune", "fine-tune", "finetuning", "fine-tuning",
                           "tune", "fit", "fits", "run", "a", "an", "the", "my"})
# Words between the query words that set nothing ("... with lora", "using qlora", "full finetune").
FILLER = frozenset({"with", "using", "and", "in", "at", "for", "via", "by", "please", "mode", "to", "it",
                    "finetune", "fine-tune", "finetuning", "fine-tuning", "training", "train", "tuning", "tune",
                    "fit", "fits", "run"})
# Count words in front of the GPU ("on a 4090", "on one h100", "on two 3090s").
_COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "six": 6, "eight": 8}
# Sequence lengths are counted in 1,024s where people write "32k" (a 32k context is 32,768 tokens:
# Llama 3.1's rope scaling and Qwen2.5's configs declare 32768 / 131072 = 128k).
_BINARY_SEQ = re.compile(r"^(\d+)\s*([km])$", re.IGNORECASE)


@lru_cache(maxsize=1)
def _gpu_name_tokens() -> frozenset[str]:
    """Every word of a GPU profile's name, display name or alias ("rtx", "a10g", "h100"), and the
    Apple words ("mps", "m2"), so that the GPU phrase reaches parse_gpus, which says they are unsupported."""
    from shardplan.inputs.hardware import APPLE_WORDS, GPU_KIND
    from shardplan.inputs.profile_index import entries

    tokens: set[str] = set(APPLE_WORDS)
    for g in entries(GPU_KIND):
        for text in (g.name, g.display_name, *getattr(g, "aliases", ())):
            tokens.update(normalize(t) for t in re.split(r"[\s\-_/]+", str(text)) if t)
    return frozenset(t for t in tokens if t)


def _continues_gpus(word: str) -> bool:
    """A word after the first one still belongs to the GPU phrase: not a query word, and a
    count, a joiner ("x", "GB"), or a word of a GPU profile's name."""
    if vocab.is_query_word(word):
        return False
    key = normalize(word)  # the one name rule; "×" and "*" are no letters, so they are matched as typed
    return (any(ch.isdigit() for ch in word) or key in _GPU_JOINERS or word in _GPU_JOINERS
            or key.startswith("x") or word.startswith(("×", "*")) or key in _gpu_name_tokens())


def split_gpus(words: list[str]) -> tuple[str, list[str]]:
    """(the GPU phrase, the remaining words) of what follows " on "; a count word in front
    ("a 4090", "two 3090s") becomes the number."""
    if len(words) > 1 and words[0].lower() in _COUNT_WORDS:
        words = [str(_COUNT_WORDS[words[0].lower()]), *words[1:]]
    n = 1
    while n < len(words) and _continues_gpus(words[n]):
        n += 1
    return " ".join(words[:n]), words[n:]


def _value_after(rest: list[str], i: int, word: str, what: str) -> str:
    if i + 1 >= len(rest):
        raise ShardplanError("query", word, f"needs {what} after it")
    return rest[i + 1]


def _model_text(text: str) -> str:
    """The model phrase without the question words around it ("will llama 3 8b fit" -> "llama 3 8b")."""
    words = text.split()
    while len(words) > 1 and words[0].lower() in _MODEL_FILLER:
        words = words[1:]
    while len(words) > 1 and words[-1].lower() in _MODEL_FILLER:
        words = words[:-1]
    return " ".join(words)


def parse_query(text: str) -> ParsedQuery:
    cleaned = str(text).strip().rstrip("?").strip()
    parts = re.split(r"\s+on\s+", cleaned, maxsplit=1, flags=re.IGNORECASE)
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
        raise ShardplanError("query", text, GRAMMAR_HINT)
    gpus, rest = split_gpus(parts[1].split())
    words = _Words()
    i = 0
    while i < len(rest):
        i = words.read(rest, i)
    return ParsedQuery(model=_model_text(parts[0]), gpus=gpus, options=words.options(), notes=words.notes)


class _Words:
    """The query words after the GPU phrase, read one term at a time; each knob remembers the
    word that set it, so a second word setting it otherwise is an error naming both."""

    def __init__(self) -> None:
        self.stated: dict[str, object] = {}
        self.said: dict[str, str] = {}
        self.implied: dict[str, object] = {}  # set only where no word states them (nf4 -> qlora)
        self.notes: list[str] = []

    def options(self) -> dict[str, object]:
        return {**self.implied, **self.stated}

    def _set(self, name: str, value: object, phrase: str) -> None:
        if name in self.stated and self.stated[name] != value:
            raise ShardplanError("query", f"{self.said[name]} ... {phrase}",
                                 f"both set {name} ({self.stated[name]} vs {value}); keep one")
        self.stated[name], self.said[name] = value, phrase

    def read(self, rest: list[str], i: int) -> int:
        """Read the term starting at ``rest[i]``; the index of the next one."""
        word = rest[i]
        key = normalize(word)
        keys, flags, numbers = vocab.key_owner_map(), vocab.flag_map(), vocab.number_key_map()
        if key in numbers:
            self._number(numbers[key], word, _value_after(rest, i, word, "a number"))
            return i + 2
        if key in keys:
            return self._keyed(vocab.knob(keys[key]), rest, i)
        if key in flags:
            for name, value in flags[key].sets:
                self._set(name, value, word)
            self.implied.update(dict(flags[key].defaults))
            return i + 1
        owner = vocab.bare_owner(word)
        if owner is not None:
            knob = vocab.knob(owner)
            self._set(knob.field, vocab.spelled(knob.field, word), word)
            self.implied.update(knob.implies)
            self.implied.update(vocab.also_sets(knob.field, word))
            return i + 1
        if word.lower() in FILLER:
            return i + 1
        raise ShardplanError("query", word, f"unknown; {GRAMMAR_HINT}")

    def _number(self, name: str, word: str, value_text: str) -> None:
        lo, hi = INT_RANGES[name]
        binary = _BINARY_SEQ.match(value_text) if name == "seq_len" else None
        if binary:
            value = int(binary.group(1)) * (1024 if binary.group(2).lower() == "k" else 1024**2)
            value = parse_count(value, field=name, hi=hi, lo=lo)
            self.notes.append(f"query: '{word} {value_text}' read as {value:,} tokens (k = 1,024 for a "
                              f"sequence length); write '{word} {value}' for another")
        else:
            value = parse_count(value_text, field=name, hi=hi, lo=lo)
        self._set(name, value, f"{word} {value_text}")

    def _keyed(self, knob, rest: list[str], i: int) -> int:
        """'KEY VALUE' (or a KEY alone where it has a meaning, 'ac' = full)."""
        word = rest[i]
        nxt = rest[i + 1] if i + 1 < len(rest) else None
        self.implied.update(knob.implies)
        if nxt is not None and vocab.accepts(knob.field, nxt):
            self._set(knob.field, vocab.spelled(knob.field, nxt), f"{word} {nxt}")
            self.implied.update(vocab.also_sets(knob.field, nxt))
            return i + 2
        if knob.key_alone is not None:
            self._set(knob.field, knob.key_alone, word)
            return i + 1
        value = _value_after(rest, i, word, f"a {knob.what}")
        vocab.canonical(knob.field, value)  # names the value and the choices (accepts() refused it)
        raise ShardplanError("query", f"{word} {value}", f"needs a {knob.what}")
