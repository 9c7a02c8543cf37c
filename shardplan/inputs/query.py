"""Free-text capacity queries: "70B on 4x24GB", "llama 3 70b on 8 h100 seq 8192 batch 2 qlora".

Grammar: MODEL on GPUS [WORD ...]. MODEL is everything before " on " (it may hold spaces); GPUS is
the GPU phrase after it ("8xh100-sxm", "8 h100", "4x24 GB", "1 x a10g"), handed whole to
``hardware.parse_gpus``; it ends at the first query word. The words come from the one
vocabulary (shardplan/inputs/vocabulary.py, docs/vocabulary.md), the same the ``--options`` take:

- a knob's value on its own where it names one knob ("zero3", "deepspeed", "qlora", "bf16",
  "adamw-8bit", "gc", "torchtune", "nf4" (a 4-bit base: implies qlora), "meta_init", "sdpa");
- "KEY VALUE" for every knob ("strategy hsdp", "offload all", "ac selective", "targets qv",
  "reduce bf16", "stack litgpt", "load meta_init", "quant gptq"); "ac" alone = full
  checkpointing, "offload" alone = what the engine usually offloads;
- flags ("oib", "chunked-ce", "offload-activations", "paged", "checkpoint-wrapper", ...);
- "KEY N" numbers ("seq 8192", "batch 2", "accum 4", "rank 64", "ce-chunks 4", "group 8").

Anything else is an error that names the word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from shardplan.inputs import vocabulary as vocab
from shardplan.support.errors import ShardplanError
from shardplan.support.limits import INT_RANGES
from shardplan.support.names import normalize
from shardplan.inputs.units import parse_count


@dataclass
class ParsedQuery:
    model: str
    gpus: str
    options: dict[str, object] = field(default_factory=dict)


# Words a GPU phrase is made of besides counts and GPU names: "x" between count and GPU, units.
_GPU_JOINERS = {"x", "×", "*", "gb", "gib", "g"}


@lru_cache(maxsize=1)
def _gpu_name_tokens() -> frozenset[str]:
    """Every word of a GPU profile's name, display name or alias ("rtx", "a10g", "h100")."""
    from shardplan.inputs.hardware import GPU_KIND
    from shardplan.inputs.profile_index import entries

    tokens: set[str] = set()
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
    """(the GPU phrase, the remaining words) of what follows " on "."""
    n = 1
    while n < len(words) and _continues_gpus(words[n]):
        n += 1
    return " ".join(words[:n]), words[n:]


def _value_after(rest: list[str], i: int, word: str, what: str) -> str:
    if i + 1 >= len(rest):
        raise ShardplanError("query", word, f"needs {what} after it")
    return rest[i + 1]


def parse_query(text: str) -> ParsedQuery:
    parts = re.split(r"\s+on\s+", str(text).strip(), maxsplit=1, flags=re.IGNORECASE)
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
        raise ShardplanError("query", text, "expected 'MODEL on GPUS', e.g. '70B on 4x24GB'")
    model = " ".join(parts[0].split())
    gpus, rest = split_gpus(parts[1].split())
    options: dict[str, object] = {}
    implied: dict[str, object] = {}  # set only where no word states them (nf4 -> qlora)
    keys, flags, numbers = vocab.key_owner_map(), vocab.flag_map(), vocab.number_key_map()
    i = 0
    while i < len(rest):
        word = rest[i]
        key = normalize(word)
        if key in numbers:
            name = numbers[key]
            lo, hi = INT_RANGES[name]
            options[name] = parse_count(_value_after(rest, i, word, "a number"), field=name, hi=hi, lo=lo)
            i += 2
        elif key in keys:
            knob = vocab.knob(keys[key])
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            if nxt is not None and vocab.accepts(knob.field, nxt):
                options[knob.field] = vocab.spelled(knob.field, nxt)
                implied.update(vocab.also_sets(knob.field, nxt))
                i += 2
            elif knob.key_alone is not None:
                options[knob.field] = knob.key_alone
                i += 1
            else:
                value = _value_after(rest, i, word, f"a {knob.what}")
                vocab.canonical(knob.field, value)  # the error names the value and the choices
            implied.update(knob.implies)
        elif key in flags:
            options.update(dict(flags[key].sets))
            implied.update(dict(flags[key].defaults))
            i += 1
        elif vocab.bare_owner(word) is not None:
            knob = vocab.knob(vocab.bare_owner(word))
            options[knob.field] = vocab.spelled(knob.field, word)
            implied.update(knob.implies)
            implied.update(vocab.also_sets(knob.field, word))
            i += 1
        else:
            raise ShardplanError("query", word, "unrecognised word; see docs/vocabulary.md or 'shardplan fit --help'")
    for name, value in implied.items():
        options.setdefault(name, value)
    return ParsedQuery(model=model, gpus=gpus, options=options)
