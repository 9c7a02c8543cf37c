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

Interruption (SIGKILL, power loss): no process can remove its own temporary file when it is killed,
so the temporary files carry a recognisable name, ``.NAME.shardplan-HOST-PID-RANDOM.tmp`` (NAME the
target's name, shortened so the whole stays within 255 bytes; HOST a short hash of the host name;
PID the writing process), and the next write to the same target removes those left by writers on
this host that are gone (``os.kill(pid, 0)`` finds no such process; POSIX only; a temporary file of
another host, or of a process still running, is never touched). ``clean_stale_temps(path)`` does the
same on demand. The target itself is never partial: it is only ever replaced by a rename.

Symlinks: writing to a path that is a symbolic link writes *through* it: the file the link points
to is replaced (atomically, with its temporary file in that file's folder) and the link stays a link
to the new content, as ``open(path, "w")`` would behave. A dangling link gets its target created.

Appending: calibration resume files (``calibrate fsdp --out X.jsonl``) gain one record per
configuration through ``shardplan.calibrate.results.append_jsonl``, which rewrites the whole file
through this writer rather than opening it in append mode, so an interrupted write never leaves a
torn last line (the files hold tens to hundreds of records, so the rewrite costs nothing that
matters). The one append-mode writer left is ``benchmarks/gpu_campaign.py`` (a development script,
not part of the package), which appends one complete line per ``write`` call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "clean_stale_temps", "write_bytes_atomic", "write_text_atomic"]


_MAX_NAME_BYTES = 255  # one path component on ext4, XFS, APFS, NTFS
_TAG = ".shardplan-"


def _host_tag() -> str:
    import hashlib
    import socket

    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:6]


def _temp_prefix(name: str) -> str:
    """``.NAME.shardplan-`` with NAME cut (on a character boundary) so that a whole temporary name
    (prefix + HOST-PID-RANDOM.tmp: 6 + 1 + at most 10 + 1 + 12 + 4 = 34 bytes) fits in one path
    component even when the target's own name is 255 bytes long."""
    room = _MAX_NAME_BYTES - 1 - len(_TAG) - 34
    cut = name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
    return f".{cut}{_TAG}"


def _new_temp(folder: Path, name: str) -> Path:
    """Create (exclusively) an empty ``.NAME.shardplan-HOST-PID-RANDOM.tmp`` in ``folder`` with mode
    0o666 & ~umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    prefix = _temp_prefix(name)
    for _ in range(100):
        tmp = folder / f"{prefix}{_host_tag()}-{os.getpid()}-{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, flags, 0o666))
            return tmp
        except FileExistsError:  # a name collision: draw another
            continue
    raise FileExistsError(f"could not create a temporary file next to {folder / name}")


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False  # it exists (another user's), or the question cannot be answered: keep the file
    return False


def clean_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that writers of ``path`` on this host left when they were killed
    (their process is gone); returns what was removed. POSIX only (elsewhere nothing is removed:
    ``os.kill(pid, 0)`` is not a harmless question on Windows)."""
    if os.name != "posix":
        return []
    try:
        path = _resolved(Path(path))
        entries = list(os.scandir(path.parent))
    except OSError:  # a name too long, a folder that is not there: nothing to clean
        return []
    prefix, host = _temp_prefix(path.name), _host_tag()
    removed = []
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        parts = name[len(prefix):-len(".tmp")].split("-")
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid() or not _process_gone(pid):
            continue
        try:
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:  # removed meanwhile by another writer's cleanup
            pass
    return removed


def _resolved(path: Path) -> Path:
    """``path``, or the file a symbolic link at ``path`` points to (followed to the end)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


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
    content is fsync-ed and moved onto ``path`` (through a symlink: onto the file it points to).
    For writers that want a file name (pandas' ``to_csv`` / ``to_parquet``). Creates missing parent
    folders; first removes temporary files that killed writers of ``path`` left (``clean_stale_temps``).
    An operating-system refusal (no space, no permission, a folder of that name, a name over 255
    bytes) is raised as one ``ShardplanError`` naming the path, the temporary file removed."""
    shown = str(path)
    try:
        path = _resolved(Path(path))
        if len(path.name.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
            raise OSError(errno.ENAMETOOLONG, f"file name longer than {_MAX_NAME_BYTES} bytes")
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path)
        tmp = _new_temp(path.parent, path.name)
    except OSError as err:
        raise _write_error(shown, err) from None
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):  # disk full, a folder at the target's name, a read-only file system
            raise _write_error(shown, err) from None
        raise
    _fsync_folder(path.parent)


def _write_error(path: str, err: OSError):
    """An OS refusal to write as shardplan's one-line error (the path and the system's reason)."""
    from shardplan.support.errors import ShardplanError
    from shardplan.support.limits import _shown

    return ShardplanError("path", _shown(path), f"cannot write: {err.strerror or err}")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically, newlines as given (no platform translation)."""
    return write_bytes_atomic(path, text.encode("utf-8"))
