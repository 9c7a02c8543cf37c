"""The profile catalogues' index: every model, GPU and link profile's names and the facts a lookup
searches (a model's size, a GPU's capacity), so a query finds its profiles without validating
every file; only the profiles it names are read and validated.

The built-in profiles' entries come from ``shardplan/data/profile_index.json``, written from the
validated profiles by ``python -m shardplan.inputs.profile_index`` (tests/test_cli_latency.py
checks it is current). Per kind it records the SHA-256 of each profile file and of the module that
computes the facts (``model.py`` counts a model's parameters): where any of them differs from what
is on disk (an edited checkout), or where user folders are on SHARDPLAN_PROFILE_PATH, that kind's
entries are computed from its validated profiles instead. The index makes a lookup faster, never
different.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, NamedTuple

from shardplan.inputs.profiles import DATA_DIR, PROFILE_PATH_ENV, announce_shadowing, find_by_name, load_all, load_profile
from shardplan.support.errors import ShardplanError
from shardplan.support.names import normalize

INDEX_PATH = DATA_DIR / "profile_index.json"
PACKAGE = Path(__file__).parents[1]


def _model_facts(spec) -> dict[str, Any]:
    return {"display_name": spec.display_name, "total_params": int(spec.total_params), "dense": spec.moe is None,
            "max_position_embeddings": int(spec.max_position_embeddings)}


class Kind(NamedTuple):
    """One catalogue: its schema, the facts its lookups search, and the modules that compute them."""

    schema: tuple[str, str]  # (module, class), imported when a profile is validated
    facts: Callable[[Any], dict[str, Any]]
    computed_by: tuple[str, ...] = ()  # package files (besides the profiles) the facts depend on


KINDS = {
    "model_profiles": Kind(("shardplan.inputs.model", "ModelSpec"), _model_facts, ("inputs/model.py",)),
    "hardware_profiles/gpus": Kind(("shardplan.inputs.hardware", "GPUProfile"),
                                   lambda g: {"display_name": g.display_name, "nominal_memory_gb": g.nominal_memory_gb}),
    "hardware_profiles/links": Kind(("shardplan.inputs.hardware", "LinkProfile"),
                                    lambda link: {"display_name": link.display_name}),
}


class Entry(NamedTuple):
    """One profile as its catalogue searches it: ``name``, ``aliases`` and the kind's facts, read
    as attributes (``entry.total_params``) under the profile's own field names."""

    name: str
    aliases: tuple[str, ...]
    file: str  # the built-in profile's file name; "" for one computed from validated profiles
    facts: dict[str, Any]

    def __getattr__(self, field: str):
        try:
            return self.facts[field]
        except KeyError:
            raise AttributeError(field) from None


def _schema(kind: str):
    module, name = KINDS[kind].schema
    return getattr(importlib.import_module(module), name)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _built_in_files(kind: str) -> list[Path]:
    return sorted((DATA_DIR / kind).glob("*.json"))


def _sources(kind: str) -> dict[str, str]:
    """What a kind's entries are computed from, by SHA-256: each built-in profile file and the modules."""
    return {**{m: _digest(PACKAGE / m) for m in KINDS[kind].computed_by},
            **{p.name: _digest(p) for p in _built_in_files(kind)}}


def _entry(kind: str, profile, file: str) -> Entry:
    return Entry(profile.name, tuple(profile.aliases), file, KINDS[kind].facts(profile))


def build_index() -> dict:
    """The index of the built-in profiles, validated (what ``profile_index.json`` holds)."""
    out = {}
    for kind in KINDS:
        entries = [_entry(kind, load_profile(p, _schema(kind)), p.name) for p in _built_in_files(kind)]
        names = [e.name for e in entries]
        entries = [e for i, e in enumerate(entries) if e.name not in names[:i]]  # the first of a name, as load_all keeps
        out[kind] = {"sources": _sources(kind), "entries": [e._asdict() for e in entries]}
    return out


def parse_index(index: dict, path: Path) -> dict[str, tuple[Entry, ...]]:
    """An index's entries per kind (a one-line error naming the file where it holds no index)."""
    try:
        return {kind: tuple(Entry(e["name"], tuple(e["aliases"]), e["file"], dict(e["facts"]))
                            for e in index[kind]["entries"]) for kind in KINDS}
    except (KeyError, TypeError) as err:
        raise ShardplanError(f"{Path(path).name}: entries", type(err).__name__,
                             "not a profile index (python -m shardplan.inputs.profile_index writes one)") from None


def stale_kinds(index: dict, kinds: tuple[str, ...] = tuple(KINDS)) -> list[str]:
    """Those of ``kinds`` whose entries in ``index`` were not computed from the files on disk."""
    return [kind for kind in kinds if not isinstance(index.get(kind), dict) or index[kind].get("sources") != _sources(kind)]


@lru_cache(maxsize=1)
def _shipped() -> dict:
    try:
        return json.loads(INDEX_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _read_index(kind: str) -> tuple[Entry, ...] | None:
    """The shipped index's entries of ``kind``; None when missing, unreadable or not of the files on
    disk (also where a source cannot be read, e.g. an install without ``model.py``'s source)."""
    index = _shipped()
    try:
        return None if stale_kinds(index, (kind,)) else parse_index(index, INDEX_PATH)[kind]
    except (OSError, ShardplanError):
        return None


@lru_cache(maxsize=None)
def _entries(kind: str, env_value: str) -> tuple[tuple[Entry, ...], dict]:
    """(entries, name -> already validated profile): from the index when it holds, else from every profile."""
    indexed = None if env_value else _read_index(kind)
    if indexed is not None:
        return indexed, {}
    profiles = load_all(kind, _schema(kind))
    return tuple(_entry(kind, p, "") for p in profiles), {p.name: p for p in profiles}


def entries(kind: str) -> tuple[Entry, ...]:
    """Every profile's entry of ``kind``, in ``profiles.load_all`` order (user folders first)."""
    return _entries(kind, os.environ.get(PROFILE_PATH_ENV, ""))[0]


@lru_cache(maxsize=None)
def _by_name(kind: str, env_value: str) -> dict[str, Entry]:
    """Each normalized name and alias -> the first entry that has it (``profiles.find_by_name``'s match)."""
    out: dict[str, Entry] = {}
    for e in _entries(kind, env_value)[0]:
        for n in (e.name, *e.aliases):
            out.setdefault(normalize(n), e)
    return out


def lookup(kind: str, name: str) -> Entry | None:
    """The entry of a name or alias; None when no profile of ``kind`` has it."""
    return _by_name(kind, os.environ.get(PROFILE_PATH_ENV, "")).get(normalize(name))


def find_entry(kind: str, name: str, field: str) -> Entry:
    """The entry of a name or alias (``profiles.find_by_name``, its one-line error included)."""
    found = lookup(kind, name)
    return found if found is not None else find_by_name(entries(kind), name, field)


def profile_of(kind: str, entry: Entry):
    """The validated profile of one entry (read from its file once)."""
    loaded = _entries(kind, os.environ.get(PROFILE_PATH_ENV, ""))[1]
    if entry.name not in loaded:
        return _load_built_in(kind, entry.file)
    announce_shadowing(kind, entry.name)  # a user profile in a built-in's place says so
    return loaded[entry.name]


@lru_cache(maxsize=None)
def _load_built_in(kind: str, file: str):
    return load_profile(DATA_DIR / kind / file, _schema(kind))


def write_index(path: Path = INDEX_PATH) -> None:
    from shardplan.support.atomic_write import write_text_atomic

    write_text_atomic(path, json.dumps(build_index(), indent=1) + "\n")


if __name__ == "__main__":
    write_index()
    print(f"wrote {INDEX_PATH}", file=sys.stderr)
