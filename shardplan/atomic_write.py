"""The one way shardplan writes a file: whole or not at all, with the permissions ``open()`` gives.

Every file shardplan writes (exports, ``sweep -o`` CSV/Parquet, calibration overlays, result
JSON/CSV/markdown, calibration JSONL resume files, the ranks' hand-off files) goes through
``atomic_path``: the content is written to a temporary file in the target's own folder (so the
final ``os.replace`` is a rename within one file system, atomic on POSIX and Windows), flushed
and ``fsync``-ed, then moved over the target. A reader, or a run interrupted half-way, sees the
old file or the new one, never a torn one; on any exception the temporary file is removed.

Permissions: the temporary file is created with ``os.open(..., O_CREAT | O_EXCL, 0o666)``, so the
kernel applies the user's umask (and a folder's default ACL) exactly as for a plain ``open(path,
"w")``: ``0o644`` under umask 022, ``0o600`` under 077. (``tempfile.mkstemp`` would create
``0o600`` regardless, which is what shardplan's exports used to get.) A target that already
exists is replaced by a new file with those permissions; its old mode is not carried over.

Appending: calibration resume files (``calibrate fsdp --out X.jsonl``) gain one record per
configuration through ``shardplan.calibrate.results.append_jsonl``, which rewrites the whole file
through this writer rather than opening it in append mode, so an interrupted write never leaves a
torn last line (the files hold tens to hundreds of records, so the rewrite costs nothing that
matters). The one append-mode writer left is ``benchmarks/gpu_campaign.py`` (a development script,
not part of the package), which appends one complete line per ``write`` call.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "write_bytes_atomic", "write_text_atomic"]


def _new_temp(folder: Path, name: str) -> Path:
    """Create (exclusively) an empty ``.NAME.<random>.tmp`` in ``folder`` with mode 0o666 & ~umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, flags, 0o666))
            return tmp
        except FileExistsError:  # a name collision: draw another
            continue
    raise FileExistsError(f"could not create a temporary file next to {folder / name}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))  # Windows' fsync needs a writable handle
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable where the platform allows opening a folder (not Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without an exception, its
    content is fsync-ed and moved onto ``path``. For writers that want a file name (pandas'
    ``to_csv`` / ``to_parquet``). Creates missing parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp(path.parent, path.name)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically, newlines as given (no platform translation)."""
    return write_bytes_atomic(path, text.encode("utf-8"))
