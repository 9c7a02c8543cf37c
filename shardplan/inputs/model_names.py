"""Which spellings of a model name to try: the Hugging Face ids people copy, reduced to a profile name.

A hub id carries words that say who published the weights and how they were fine-tuned, not what
the network is: "meta-llama/Meta-Llama-3.1-8B-Instruct" is the Llama-3.1-8B architecture. The
words that are safe to drop are data (below), each with the reason it changes no config.json
architecture field; resolve_model (models.py) tries the name as typed first, then these reduced
forms, and says in its answer what it dropped. Spellings are compared with the one name rule
(names.normalize), so case, spaces, dashes and underscores never matter here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shardplan.support.names import lookup, normalize

# Publisher words in front of the family name (a first word, before -, _ or a space). Meta published
# Llama 3 and 3.1 as "Meta-Llama-3(.1)-*" and later renamed the repositories "Llama-3.1-*"; the
# files are the same.
NAME_PREFIXES = ("Meta",)

# (word, what it names). Each word marks a checkpoint trained from the base model without changing
# the network: its config.json declares the same architecture fields (hidden size, layers, heads,
# kv heads, head_dim, intermediate size, vocab, tying, MoE fields) as the base model's, so every
# parameter count and memory term is the base profile's. What can differ is the declared context
# (max_position_embeddings; e.g. the Qwen2.5 instruct configs declare 32768 where the base declares
# 131072), which shardplan uses only to warn about a sequence longer than the context.
VARIANT_WORDS = (
    ("instruct", "instruct variant"),  # Llama-3.x-*-Instruct, Qwen2.5-*-Instruct, Mistral-7B-Instruct-v0.1
    ("chat", "chat variant"),  # Llama-2-*-chat-hf, Qwen1.5-*-Chat: supervised + RLHF fine-tunes
    ("hf", "transformers-format upload"),  # Llama-2-*-hf: Meta's weights converted to the transformers layout
    ("it", "instruction-tuned variant"),  # gemma-2-*-it, gemma-3-*-it
    ("pt", "pretrained checkpoint"),  # gemma-3-*-pt: Google's name for the base model
    ("base", "base checkpoint"),  # Qwen3-*-Base: the pretrained model, named explicitly
)

_WORD_SPLIT = re.compile(r"([-_\s]+)")


@dataclass(frozen=True)
class NameForm:
    """One spelling to look up, and what was dropped from the typed name to get it."""

    text: str
    dropped_variants: tuple[str, ...] = ()  # labels from VARIANT_WORDS, in the order they appear

    @property
    def note(self) -> str:
        """'' or ' (instruct variant: same architecture)' for the answer's model line."""
        return f" ({', '.join(self.dropped_variants)}: same architecture)" if self.dropped_variants else ""


def _without_org(text: str) -> str:
    """'Qwen/Qwen2.5-7B' -> 'Qwen2.5-7B' (a hub id has exactly one '/'); anything else unchanged."""
    org, slash, rest = text.partition("/")
    return rest if slash and org and rest and "/" not in rest else text


def _without_prefix(text: str) -> str:
    """'Meta-Llama-3.1-8B' -> 'Llama-3.1-8B': drop a first word that NAME_PREFIXES lists."""
    parts = _WORD_SPLIT.split(text, maxsplit=1)
    if len(parts) == 3 and parts[2] and lookup(parts[0], NAME_PREFIXES) is not None:
        return parts[2]
    return text


def _without_variants(text: str) -> NameForm:
    """Drop every whole word (between -, _ or spaces) that VARIANT_WORDS lists, except the first word."""
    labels = dict(VARIANT_WORDS)
    parts = _WORD_SPLIT.split(text)  # words at even indices, separators at odd ones
    kept, dropped = [parts[0]], []
    for i in range(2, len(parts), 2):
        word = lookup(parts[i], labels)
        label = None if word is None else labels[word]
        if label is None:
            kept.extend([parts[i - 1], parts[i]])
        else:
            dropped.append(label)
    return NameForm("".join(kept), tuple(dict.fromkeys(dropped)))


def name_forms(text: str) -> list[NameForm]:
    """The spellings to try, in order: as typed; without fine-tune words; without 'org/';
    without a publisher prefix; without both. Duplicates (under names.normalize) are tried once."""
    bare = _without_prefix(_without_org(text))
    candidates = [NameForm(text), _without_variants(text), NameForm(_without_org(text)), NameForm(bare),
                  _without_variants(bare)]
    seen: set[str] = set()
    forms = []
    for form in candidates:
        key = normalize(form.text)
        if key and key not in seen:
            seen.add(key)
            forms.append(form)
    return forms


def base_name(text: str) -> str:
    """The most reduced spelling (for 'did you mean' when nothing matched)."""
    return _without_variants(_without_prefix(_without_org(text))).text
