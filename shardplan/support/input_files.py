"""The one way shardplan reads a file a user hands it: bounded, checked, one-line errors.

Every file shardplan reads (profiles, Hugging Face ``config.json``, calibration overlays, accuracy
bands, plan files and stdin for ``export``, calibration records, nccl-tests logs) comes through
here, so each failure a hostile or mistaken file can cause is one ``ShardplanError`` naming the
field and the file:

* the path: a name component over ``MAX_FILE_NAME_BYTES`` or a path over ``MAX_PATH_BYTES``
  (``OSError: File name too long`` otherwise), missing, a folder, unreadable, or not a regular
  file — a FIFO, socket or device is refused from ``stat`` alone and never opened (opening a FIFO
  for reading blocks until a writer appears);
* the size: past the caller's cap (``limits.MAX_*_FILE_BYTES``), refused before reading, and a file
  that grows while read is cut at the cap and refused;
* the bytes: UTF-8 only (a UTF-8 byte-order mark is allowed); binary or another encoding is named
  with the offset of the first bad byte;
* the JSON: syntax errors with their line; a key repeated in one object (``json`` would keep the
  last silently); nesting deeper than ``MAX_JSON_DEPTH`` (the C parser
  otherwise recurses into ``RecursionError``); ``NaN``/``Infinity`` literals and numbers that
  overflow a float (``1e999`` -> inf) refused, since JSON has no non-finite numbers and every
  quantity shardplan reads must be finite; integers longer than ``MAX_DIGITS`` digits refused
  before Python converts them (4,300-digit limit, and no field's range is that wide).

Shapes and ranges of the values inside are checked by each file's pydantic model (extra="forbid",
bounds from ``limits``), not here.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from shardplan.support.errors import ShardplanError
from shardplan.support.limits import MAX_DIGITS, MAX_FILE_NAME_BYTES, MAX_JSON_DEPTH, MAX_PATH_BYTES, MAX_PROFILE_FILE_BYTES


def shown_path(path: object) -> str:
    """A path as errors show it: whole up to 160 characters (the file must be recognisable), else its
    start and end."""
    text = str(path)
    return text if len(text) <= 160 else f"{text[:60]}…{text[-60:]} ({len(text)} chars)"


def _path_problem(text: str) -> str | None:
    """Why ``text`` cannot be a path at all, before any system call sees it."""
    if "\x00" in text:
        return "a path cannot contain a NUL byte"
    try:
        encoded = os.fsencode(text)
        longest = max((len(os.fsencode(part)) for part in Path(text).parts), default=0)
    except UnicodeError:
        return "not a path the file system can encode"
    if len(encoded) > MAX_PATH_BYTES:
        return f"path longer than {MAX_PATH_BYTES} bytes"
    if longest > MAX_FILE_NAME_BYTES:
        return f"a file or folder name longer than {MAX_FILE_NAME_BYTES} bytes (the file-system limit)"
    return None


def path_kind(path: str | Path) -> str | None:
    """'file', 'dir', 'other' (FIFO, socket, device) or None when nothing is there or the text cannot
    name a path (too long, NUL byte, a file where a folder is expected, unreadable parent). Never
    raises: callers use it to decide whether a word is a path."""
    text = str(path)
    if not text or _path_problem(text):
        return None
    try:
        mode = os.stat(text).st_mode
    except (OSError, ValueError):
        return None
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


def check_file(path: str | Path, field: str) -> os.stat_result:
    """``stat`` of a regular file at ``path``, or a one-line error saying what is there instead."""
    text = str(path)
    problem = _path_problem(text) if text else "empty path"
    if problem:
        raise ShardplanError(field, shown_path(text), problem)
    try:
        info = os.stat(text)
    except FileNotFoundError:
        raise ShardplanError(field, shown_path(text), "no such file") from None
    except NotADirectoryError:
        raise ShardplanError(field, shown_path(text), "no such file (a part of the path is a file, not a folder)") from None
    except PermissionError:
        raise ShardplanError(field, shown_path(text), "permission denied") from None
    except OSError as exc:
        raise ShardplanError(field, shown_path(text), f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ShardplanError(field, shown_path(text), "is a folder; give a file")
    if not stat.S_ISREG(info.st_mode):
        raise ShardplanError(field, shown_path(text), "not a regular file (a FIFO, socket or device); give a file")
    return info


def read_bytes(path: str | Path, field: str, max_bytes: int = MAX_PROFILE_FILE_BYTES) -> bytes:
    """The bytes of a regular file no larger than ``max_bytes``, or a one-line error."""
    info = check_file(path, field)
    too_big = f"larger than the {max_bytes / 2**20:g} MiB this file may have (limits.py)"
    if info.st_size > max_bytes:
        raise ShardplanError(field, shown_path(path), f"{info.st_size:,} bytes: {too_big}")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since stat, open() returns instead of waiting
        fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ShardplanError(field, shown_path(path), "not a regular file (a FIFO, socket or device); give a file")
            data = f.read(max_bytes + 1)
    except PermissionError:
        raise ShardplanError(field, shown_path(path), "permission denied") from None
    except OSError as exc:
        raise ShardplanError(field, shown_path(path), f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ShardplanError(field, shown_path(path), too_big)
    return data


def decode_utf8(data: bytes, field: str, source: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped), or a one-line error naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ShardplanError(field, shown_path(source), f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                                        f"{exc.start:,}): a binary file or another encoding") from None


def read_text(path: str | Path, field: str, max_bytes: int = MAX_PROFILE_FILE_BYTES) -> str:
    """A bounded UTF-8 text file (see the module docstring)."""
    return decode_utf8(read_bytes(path, field, max_bytes), field, str(path))


def read_stdin(field: str, max_bytes: int) -> str:
    """Standard input as bounded UTF-8 text."""
    if sys.stdin is None:  # started with stdin closed (``<&-``)
        raise ShardplanError(field, "-", "standard input is closed; give a file, or pipe the JSON in")
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes underneath (tests, notebooks)
        text = sys.stdin.read(max_bytes + 1)
        data = text.encode("utf-8", "surrogateescape")
    else:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ShardplanError(field, "-", f"standard input is larger than the {max_bytes / 2**20:g} MiB allowed (limits.py)")
    return decode_utf8(data, field, "-")


class _Refused(ValueError):
    pass


def _no_constant(name: str) -> float:
    raise _Refused(f"{name} is not a JSON number (JSON has no NaN or Infinity; every value must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"number {text[:30]} overflows a 64-bit float")
    return value


def _short_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_DIGITS})")
    return int(text)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_JSON_DEPTH:
                return level
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """An object's keys, each once: ``json`` keeps the last of a repeated key silently, so a file
    saying ``memory_bytes`` twice would be read as whichever came last."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"duplicate key {key[:60]!r} in one object (JSON would keep only the last; say it once)")
        out[key] = value
    return out


def parse_json(text: str, field: str, source: str) -> Any:
    """JSON text -> value under the module docstring's rules, or a one-line error naming ``source``."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_short_int,
                           object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}" if "\n" in text.strip() else f"column {exc.colno}"
        raise ShardplanError(field, shown_path(source), f"not valid JSON ({where}: {exc.msg})") from None
    except RecursionError:
        raise ShardplanError(field, shown_path(source), f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except _Refused as exc:
        raise ShardplanError(field, shown_path(source), str(exc)) from None
    except ValueError as exc:  # anything else the number converters refuse
        raise ShardplanError(field, shown_path(source), f"not valid JSON ({exc})") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ShardplanError(field, shown_path(source), f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json(path: str | Path, field: str, max_bytes: int = MAX_PROFILE_FILE_BYTES) -> Any:
    """Any JSON value from a bounded file."""
    return parse_json(read_text(path, field, max_bytes), field, str(path))


def read_json_object(path: str | Path, field: str, max_bytes: int = MAX_PROFILE_FILE_BYTES) -> dict:
    """One JSON object (the top level of every profile and config) from a bounded file."""
    value = read_json(path, field, max_bytes)
    if not isinstance(value, dict):
        raise ShardplanError(field, shown_path(path), f"expected a JSON object at the top level, not a {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "null")
