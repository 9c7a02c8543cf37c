"""Find, load and validate profile files (models, GPUs, links).

Profiles are data: JSON files validated by frozen pydantic models with ``extra="forbid"``.
Built-in profiles ship inside the package (``shardplan/data``); users add their own by passing a
path, or by listing folders in the ``SHARDPLAN_PROFILE_PATH`` environment variable (os.pathsep
separated). Every error names the file, the field and the value.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from shardplan.support.errors import ShardplanError
from shardplan.support.input_files import path_kind, read_json_object
from shardplan.support.limits import MAX_PROFILE_FILE_BYTES
from shardplan.support.names import did_you_mean, normalize

DATA_DIR = Path(__file__).parents[1] / "data"
PROFILE_PATH_ENV = "SHARDPLAN_PROFILE_PATH"

T = TypeVar("T", bound=BaseModel)


def _describe_validation_error(path: Path, err: ValidationError, whole_path: bool = False) -> ShardplanError:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(root)"
    value = first.get("input")
    if isinstance(value, dict):
        value = "{...}"
    return ShardplanError(f"{path if whole_path else path.name}: {field}", value, first["msg"])


def read_json(path: Path, field: str = "profile") -> dict:
    """Read one JSON object from a file through the bounded reader (input_files.py): one-line
    errors for a missing, oversized, binary, malformed or too deeply nested file."""
    return read_json_object(path, field, MAX_PROFILE_FILE_BYTES)


def load_profile(path: Path, model: type[T]) -> T:
    """Validate one profile file against its schema."""
    data = read_json(path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _describe_validation_error(Path(path), err) from None


def search_dirs(kind: str) -> list[Path]:
    """Folders holding profiles of ``kind`` ('model_profiles', 'hardware_profiles/gpus', ...).

    User folders (from the environment) come first so a user profile can shadow a built-in one.
    """
    dirs: list[Path] = []
    for entry in os.environ.get(PROFILE_PATH_ENV, "").split(os.pathsep):
        if entry:
            candidate = Path(entry).expanduser() / kind
            dirs.append(candidate if path_kind(candidate) == "dir" else Path(entry).expanduser())
    dirs.append(DATA_DIR / kind)
    return dirs


@lru_cache(maxsize=None)
def _load_dir(kind: str, model: type[T], env_value: str) -> tuple[T, ...]:
    seen: dict[str, T] = {}
    user_files: dict[str, Path] = {}
    for folder in search_dirs(kind):
        if path_kind(folder) != "dir":
            continue
        built_in = folder.is_relative_to(DATA_DIR)
        for path in sorted(folder.glob("*.json")):
            profile = load_profile(path, model) if built_in else _user_profile(path, model)
            if profile is None:
                continue
            if built_in:
                _note_shadowed((kind, env_value), profile, seen, user_files)
            elif profile.name not in seen:
                user_files[profile.name] = path
            seen.setdefault(profile.name, profile)
    return tuple(seen.values())


def _user_profile(path: Path, model: type[T]) -> T | None:
    """A profile file on SHARDPLAN_PROFILE_PATH, or None: a broken file, or a profile of this kind
    that fails its schema, is skipped with one warning line naming the file and the field; valid
    JSON of another kind (a GPU profile beside model profiles) is skipped silently."""
    try:
        data = read_json(path)
    except ShardplanError as err:
        _warn_unreadable(path, err)
        return None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        if _mostly_fields_of(data, model):
            _warn_unreadable(path, _describe_validation_error(path, err, whole_path=True))
        return None


def _mostly_fields_of(data: dict, model: type[BaseModel]) -> bool:
    """A file is meant as a ``model`` profile when more than half of its keys are that schema's
    fields (in a kind's sub-folder or in a folder searched for every kind alike). Why that rule:
    the built-in profiles hold 100 % of their own schema's keys and at most 40 % of another's (a
    link profile read as a GPU: name, display_name, aliases, sources), so a profile with a bad
    value or a misspelt key is told apart from another kind's (tests/test_hostile_inputs.py)."""
    return bool(data) and 2 * len(set(data) & set(model.model_fields)) > len(data)


# (kind, SHARDPLAN_PROFILE_PATH, user profile name) -> what it shadows: a user profile whose name or an alias is also a
# built-in profile's name or alias answers the queries that name it in place of the built-in one.
_SHADOWS: dict[tuple[str, str, str], str] = {}


def _names(profile) -> set[str]:
    return {normalize_name(n) for n in (profile.name, *getattr(profile, "aliases", ()))}


def _note_shadowed(where: tuple[str, str], built_in, seen: dict, user_files: dict[str, Path]) -> None:
    """Record each user profile that takes a name or alias of the built-in profile ``built_in``."""
    theirs = _names(built_in)
    for name, path in user_files.items():
        shared = sorted(_names(seen[name]) & theirs)
        if shared:
            _SHADOWS[(*where, name)] = (f"{PROFILE_PATH_ENV}: '{name}' is your profile {path}, which shadows the "
                                      f"built-in {built_in.name} (same name or alias: {', '.join(shared)})")


_announced: set[tuple[str, str, str]] = set()


def announce_shadowing(kind: str, name: str) -> None:
    """One stderr line, once per process, when the profile ``name`` an answer uses is a user profile
    that shadows a built-in one (why not silent: '8xa100-80gb' must not quietly mean a user's 1 GiB
    card; why stderr: ``--json`` output stays one JSON document)."""
    key = (kind, os.environ.get(PROFILE_PATH_ENV, ""), name)
    message = _SHADOWS.get(key)
    if message and key not in _announced:
        _announced.add(key)
        print(f"shardplan: note: {message}", file=sys.stderr)


_warned: set[str] = set()


def _warn_unreadable(path: Path, err: ShardplanError) -> None:
    """One stderr line per broken file on SHARDPLAN_PROFILE_PATH, once per process.

    Why a warning and not an error: the folders are the user's and may hold other files; one
    broken file (binary, truncated, not UTF-8, a FIFO named *.json) must not stop every command,
    including those that never use its kind. Why not silence: the user who put a profile there
    must learn why it is not found (a file of this kind that fails its schema too:
    ``_user_profile``). A file that is valid JSON but another kind's schema is skipped silently (a
    folder without kind subfolders is searched for every kind)."""
    key = str(path)
    if key not in _warned:
        _warned.add(key)
        print(f"shardplan: warning: {PROFILE_PATH_ENV}: skipped {err}", file=sys.stderr)


def load_all(kind: str, model: type[T]) -> tuple[T, ...]:
    """Every profile of one kind: user folders first, then the built-in ones."""
    return _load_dir(kind, model, os.environ.get(PROFILE_PATH_ENV, ""))


normalize_name = normalize  # the one rule for names (shardplan/support/names.py)


def find_by_name(profiles: tuple[T, ...], name: str, field: str) -> T:
    """Match a name or alias, ignoring case, dashes, underscores and spaces."""
    key = normalize_name(name)
    for profile in profiles:
        names = [profile.name, *getattr(profile, "aliases", ())]
        if any(normalize_name(n) == key for n in names):
            return profile
    owner = {n: p.name for p in profiles for n in (p.name, *getattr(p, "aliases", ()))}
    raise ShardplanError(field, name, f"unknown{did_you_mean(name, owner)}; "
                                      f"known: {', '.join(sorted(p.name for p in profiles))}")
