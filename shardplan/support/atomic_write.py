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
exists keeps its mode: the new file gets the old one's permission bits (and, where the process
may, its owner and group) before the rename, so replacing a ``0600`` file never leaves a ``0644``
one. A read-only target (no write bit, or one this user may not write) is refused unless the
caller passes ``force=True`` (the CLI's ``--force``); forced, it is replaced and stays read-only.

Symlinks: a path whose last component is a symbolic link is refused, dangling or not: shardplan
never writes through a link the user did not name the target of (``ln -s ~/.ssh/config out.csv``
planted in a shared folder must not make a sweep overwrite it). To replace the file a link points
to, name that file. A link swapped in after the check is harmless: ``os.replace`` renames over the
link itself and never follows it. Links in the folders above the file are followed as usual.

Interruption (SIGKILL, power loss): no process can remove its own temporary file when it is killed,
so the temporary files carry a recognisable name, ``.NAME.shardplan-HOST-PID-RANDOM.tmp`` (NAME the
target's name, shortened so the whole stays within 255 bytes; HOST a short hash of the host name;
PID the writing process), and the next write *into the same folder* removes those left by writers
on this host that are gone (``os.kill(pid, 0)`` finds no such process; POSIX only; a temporary file
of another host, or of a process still running, is never touched), whatever target they were for.
``clean_stale_temps(path)`` does the same on demand. SIGTERM does not leave one: ``shardplan``'s
``main`` turns it into ``SystemExit``, which removes the temporary file on the way out. The target
itself is never partial: it is only ever replaced by a rename.

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
import stat
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "clean_stale_temps", "read_only", "write_bytes_atomic", "write_generated", "write_text_atomic"]


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
    """Remove the temporary files that shardplan writers on this host left in ``path``'s folder when
    they were killed (their process is gone), whatever file they were writing; returns what was
    removed. POSIX only (elsewhere nothing is removed: ``os.kill(pid, 0)`` is not a harmless
    question on Windows)."""
    if os.name != "posix":
        return []
    try:
        entries = list(os.scandir(Path(path).parent))
    except OSError:  # a name too long, a folder that is not there: nothing to clean
        return []
    host = _host_tag()
    removed = []
    for entry in entries:
        pid = _stale_pid(entry.name, host)
        if pid is None or pid == os.getpid() or not _process_gone(pid):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:  # removed meanwhile by another writer's cleanup
            pass
    return removed


def _stale_pid(name: str, host: str) -> int | None:
    """The writer's PID of a ``.NAME.shardplan-HOST-PID-RANDOM.tmp`` name of this host, else None."""
    if not (name.startswith(".") and name.endswith(".tmp")) or _TAG not in name:
        return None
    parts = name[:-len(".tmp")].rsplit(_TAG, 1)[1].split("-")
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit() or len(parts[1]) > 10:
        return None
    return int(parts[1])


def _existing_target(path: Path, force: bool) -> os.stat_result | None:
    """``lstat`` of the file about to be replaced (None when there is none), after the policy's
    checks: never a symbolic link; a read-only file only with ``force``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise _refused(path, f"is a symbolic link to {os.readlink(path)}; shardplan does not write through "
                             "links: name the file itself, or remove the link")
    if stat.S_ISREG(info.st_mode) and not force and read_only(path, info):
        raise _refused(path, "is read-only; pass --force to replace it (it stays read-only)")
    return info


def read_only(path: Path, info: os.stat_result) -> bool:
    """No write bit at all (which root's ``os.access`` ignores), or none this user holds."""
    return not info.st_mode & 0o222 or not os.access(path, os.W_OK)


def _keep_mode(tmp: Path, old: os.stat_result | None) -> None:
    """Give the new file the replaced file's permission bits and, where allowed, its owner."""
    if old is None or not stat.S_ISREG(old.st_mode):
        return
    os.chmod(tmp, stat.S_IMODE(old.st_mode))
    if hasattr(os, "chown") and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
        try:
            os.chown(tmp, old.st_uid, old.st_gid)
        except OSError:  # not root: the file becomes this user's, as any rewrite by them would
            pass


def _refused(path: Path, reason: str):
    from shardplan.support.errors import ShardplanError
    from shardplan.support.limits import _shown

    return ShardplanError("path", _shown(str(path)), reason)


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
def atomic_path(path: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without an exception, its
    content is fsync-ed, given the replaced file's mode, and moved onto ``path``. For writers that
    want a file name (pandas' ``to_csv`` / ``to_parquet``). Refuses a symbolic link at ``path``, and
    a read-only file unless ``force``. Creates missing parent folders; first removes temporary files
    that killed writers left in the folder (``clean_stale_temps``). An operating-system refusal (no
    space, no permission, a folder of that name, a name over 255 bytes) is raised as one
    ``ShardplanError`` naming the path, the temporary file removed."""
    shown = str(path)
    path = Path(path)
    try:
        if len(path.name.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
            raise OSError(errno.ENAMETOOLONG, f"file name longer than {_MAX_NAME_BYTES} bytes")
        old = _existing_target(path, force)
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(path)
        tmp = _new_temp(path.parent, path.name)
    except OSError as err:
        raise _write_error(shown, err) from None
    try:
        yield tmp
        _fsync_file(tmp)
        _keep_mode(tmp, old)
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


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring; ``force``: replace a read-only file)."""
    with atomic_path(path, force=force) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str, *, force: bool = False) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically, newlines as given (no platform translation)."""
    return write_bytes_atomic(path, text.encode("utf-8"), force=force)


def write_generated(files: dict[Path, str], check: bool) -> list[str]:
    """The generated files among ``files`` ({path: text}) whose text on disk differs (or that are
    missing), by name; each of them written with ``write_text_atomic`` unless ``check`` (the
    ``--check`` of the tools that regenerate documented numbers: tools/update_accuracy.py,
    benchmarks/gpu_heldout_report.py)."""
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    if not check:
        for path in stale:
            write_text_atomic(path, files[path])
    return [p.name for p in stale]
