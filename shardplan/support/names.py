"""One rule for the names users type: profiles, strategies, engines, query words, option values.

Two spellings are the same name when they agree after lowercasing and dropping everything but
letters, digits and dots ("Llama-3.1-8B" = "llama 3.1 8b" = "LLAMA_3.1_8B"; "full_shard" =
"FULL-SHARD" = "fullshard"). Dots stay because they carry versions ("3.1" is not "31").
"""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping

from shardplan.support.errors import ShardplanError


def normalize(text: object) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum() or ch == ".")


def same_name(a: object, b: object) -> bool:
    return normalize(a) == normalize(b)


def suggest(text: object, candidates: Iterable[str] | Mapping[str, str], limit: int = 3) -> list[str]:
    """The candidates closest to ``text`` under :func:`normalize` (difflib ratio ≥ 0.6), best first.

    ``candidates`` may map spellings to the name they spell ({alias: profile name}): every spelling
    is compared, and the names they belong to are suggested, each once.
    """
    owner = candidates if isinstance(candidates, Mapping) else {name: name for name in candidates}
    by_key: dict[str, str] = {}
    for spelling, name in owner.items():
        by_key.setdefault(normalize(spelling), name)
    close = difflib.get_close_matches(normalize(text), list(by_key), n=max(len(by_key), 1), cutoff=0.6)
    return list(dict.fromkeys(by_key[key] for key in close))[:limit]


def did_you_mean(text: object, candidates: Iterable[str] | Mapping[str, str]) -> str:
    """' (did you mean X?)' or '' — appended to an 'unknown' error; ``candidates`` as in :func:`suggest`."""
    close = suggest(text, candidates)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def lookup(text: object, names: Iterable[str]) -> str | None:
    """The name among ``names`` that ``text`` spells under :func:`normalize`, or None."""
    key = normalize(text)
    return next((name for name in names if normalize(name) == key), None)


def choose(text: object, names: Iterable[str], field: str) -> str:
    """The canonical name among ``names`` that ``text`` spells, or a one-line error listing them."""
    names = tuple(names)
    name = lookup(text, names)
    if name is not None:
        return name
    raise ShardplanError(field, text, f"unknown{did_you_mean(text, names)}; choose one of {', '.join(names)}")
