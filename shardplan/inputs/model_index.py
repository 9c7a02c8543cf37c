"""The model catalogue's index: every model profile's names and size, so a query finds its model
(by name, alias or bare size) without validating every profile; only the profile it names is read
and validated.

The built-in profiles' entries come from ``shardplan/data/model_index.json``, written from the
validated profiles by ``python -m shardplan.inputs.model_index`` (tests/test_cli_latency.py checks
it is current). It records the SHA-256 of each profile file and of ``model.py`` (which counts the
parameters): where any of them differs from what is on disk (an edited checkout), or where user
folders are on SHARDPLAN_PROFILE_PATH, the entries are computed from the validated profiles
instead. The index makes a lookup faster, never different.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from shardplan.inputs.profiles import DATA_DIR, PROFILE_PATH_ENV, load_all, load_profile
from shardplan.support.errors import ShardplanError

KIND = "model_profiles"
INDEX_PATH = DATA_DIR / "model_index.json"
COUNTED_BY = Path(__file__).with_name("model.py")  # ModelSpec.total_params


@dataclass(frozen=True)
class Entry:
    """One model profile as the catalogue searches it (``ModelSpec``'s fields of the same names)."""

    name: str
    display_name: str
    aliases: tuple[str, ...]
    total_params: int
    dense: bool  # no mixture of experts: a bare size may stand for it
    max_position_embeddings: int
    file: str  # the built-in profile's file name


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _built_in_files() -> list[Path]:
    return sorted((DATA_DIR / KIND).glob("*.json"))


def _sources() -> dict[str, str]:
    """What the index is computed from, by SHA-256: each built-in profile file and ``model.py``."""
    return {"model.py": _digest(COUNTED_BY), **{p.name: _digest(p) for p in _built_in_files()}}


def _entry(spec, file: str) -> Entry:
    return Entry(name=spec.name, display_name=spec.display_name, aliases=tuple(spec.aliases),
                 total_params=int(spec.total_params), dense=spec.moe is None,
                 max_position_embeddings=int(spec.max_position_embeddings), file=file)


def build_index() -> dict:
    """The index of the built-in profiles, validated and counted (what ``model_index.json`` holds)."""
    from shardplan.inputs.model import ModelSpec

    entries = [_entry(load_profile(p, ModelSpec), p.name) for p in _built_in_files()]
    names = [e.name for e in entries]
    entries = [e for i, e in enumerate(entries) if e.name not in names[:i]]  # the first of a name, as load_all keeps
    return {"sources": _sources(), "entries": [asdict(e) for e in entries]}


def parse_index(index: dict, path: Path) -> tuple[Entry, ...]:
    """An index's entries (a one-line error naming the file where it holds no index)."""
    try:
        return tuple(Entry(**{**e, "aliases": tuple(e["aliases"])}) for e in index["entries"])
    except (KeyError, TypeError) as err:
        raise ShardplanError(f"{Path(path).name}: entries", type(err).__name__,
                             "not a model index (python -m shardplan.inputs.model_index writes one)") from None


def is_current(index: dict) -> bool:
    """Whether an index was computed from the profile files and ``model.py`` on disk."""
    return index.get("sources") == _sources()


def _read_index() -> tuple[Entry, ...] | None:
    """The shipped index's entries; None when it is missing, unreadable or not of the files on disk."""
    try:
        index = json.loads(INDEX_PATH.read_text(encoding="utf-8"))
        return parse_index(index, INDEX_PATH) if is_current(index) else None
    except (OSError, ValueError, AttributeError):  # ShardplanError is a ValueError
        return None


@lru_cache(maxsize=None)
def _entries(env_value: str) -> tuple[tuple[Entry, ...], dict]:
    """(entries, name -> already validated spec): from the index when it holds, else from every profile."""
    from shardplan.inputs.model import ModelSpec

    indexed = None if env_value else _read_index()
    if indexed is not None:
        return indexed, {}
    specs = load_all(KIND, ModelSpec)
    return tuple(_entry(s, "") for s in specs), {s.name: s for s in specs}


def entries() -> tuple[Entry, ...]:
    """Every model profile's entry, in ``models.model_profiles()`` order (user folders first)."""
    return _entries(os.environ.get(PROFILE_PATH_ENV, ""))[0]


def spec_of(entry: Entry):
    """The validated ``ModelSpec`` of one entry (read from its file once)."""
    loaded = _entries(os.environ.get(PROFILE_PATH_ENV, ""))[1]
    return loaded[entry.name] if entry.name in loaded else _load_built_in(entry.file)


@lru_cache(maxsize=None)
def _load_built_in(file: str):
    from shardplan.inputs.model import ModelSpec

    return load_profile(DATA_DIR / KIND / file, ModelSpec)


def write_index(path: Path = INDEX_PATH) -> None:
    from shardplan.support.atomic_write import write_text_atomic

    write_text_atomic(path, json.dumps(build_index(), indent=1) + "\n")


if __name__ == "__main__":
    write_index()
    print(f"wrote {INDEX_PATH}", file=sys.stderr)
