"""Output paths the user names (``sweep -o``, ``export -o``, ``--export FORMAT=PATH``, the
calibrate commands' ``--out`` / ``--csv`` / ``--json`` / ``--md`` ...), checked before any work is
done, so a path that cannot be written is a one-line error naming the option and the path, not a
traceback after a long sweep or measurement.

What is refused (each would otherwise fail inside ``shardplan.support.atomic_write`` or ``open``):

- an existing folder, or a path ending in a separator (``os.replace`` cannot put a file there);
- an existing file, folder or link that is not a regular file (a FIFO, a device, a socket):
  the atomic writer would replace it with a regular file, which is not what the user asked for;
- a name longer than the file system allows (the atomic writer shortens its temporary name to fit
  beside any target that fits, shardplan/support/atomic_write.py ``_new_temp``), or a whole path longer
  than ``PATH_MAX`` (POSIX ``pathconf``; 255 and 4096 on Linux when it cannot be asked);
- a parent that exists but is a file, or a folder the user may not write to;
- a symbolic link (shardplan never writes through one: name the file it points to), and a
  read-only file unless ``force`` (the commands' ``--force``); the policy is the atomic writer's
  (shardplan/support/atomic_write.py), checked here before any work is done.

Missing parent folders are fine: the atomic writer creates them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shardplan.support.errors import ShardplanError
from shardplan.support.limits import _shown

# The help of every writing command's --force (sweep, export, fit --export, the calibrate commands).
FORCE_OUTPUT_HELP = ("replace an output file even where it is read-only (it stays read-only; "
                     "a symbolic link is never written through)")

DEFAULT_NAME_MAX = 255    # bytes, Linux / macOS file systems, when pathconf cannot answer
DEFAULT_PATH_MAX = 4096   # bytes, Linux


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError, AttributeError):
        return default


def _nearest_existing(path: Path) -> Path:
    for parent in path.parents:
        if os.path.lexists(parent):
            return parent
    return Path(".")


def writable_output(path: str | os.PathLike | None, field: str = "output", force: bool = False) -> Path | None:
    """``path`` as a Path when shardplan can write a file there, else a one-line ShardplanError
    naming ``field`` and the path (shortened when long). None passes through (no output asked).
    ``force``: a read-only file may be replaced."""
    if path is None:
        return None
    text = os.fspath(path)
    if not text.strip():
        raise ShardplanError(field, text, "empty file name")
    if "\x00" in text:
        raise ShardplanError(field, _shown(text), "a file name cannot hold a NUL character")
    if text.endswith(("/", os.sep)):
        raise ShardplanError(field, _shown(text), "names a folder; give a file name")
    target = Path(text)
    existing = _nearest_existing(target.absolute())
    if not existing.is_dir():
        raise ShardplanError(field, _shown(text), f"'{_shown(str(existing))}' is not a folder")
    name_max = _limit(existing, "PC_NAME_MAX", DEFAULT_NAME_MAX)
    path_max = _limit(existing, "PC_PATH_MAX", DEFAULT_PATH_MAX)
    for part in target.parts:
        if len(os.fsencode(part)) > name_max:
            raise ShardplanError(field, _shown(text), f"a name of {len(os.fsencode(part))} bytes is longer than "
                                                      f"the {name_max} bytes this file system allows")
    if len(os.fsencode(str(target.absolute()))) > path_max:
        raise ShardplanError(field, _shown(text), f"path longer than the {path_max} bytes this system allows")
    try:
        info = os.lstat(target)  # the name itself: a link is refused, not followed
    except FileNotFoundError:
        info = None
    except OSError as exc:  # a component that is a file, a link loop above it
        raise ShardplanError(field, _shown(text), f"cannot write there: {exc.strerror or exc}") from None
    _check_replaceable(target, info, field, text, force)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise ShardplanError(field, _shown(text), "is a folder; give a file name inside it")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ShardplanError(field, _shown(text), "exists and is not a regular file (a FIFO, device or socket); "
                                                  "shardplan writes regular files only")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ShardplanError(field, _shown(text), f"cannot write in '{_shown(str(existing))}' (permission denied)")
    return target


def _check_replaceable(target: Path, info: os.stat_result | None, field: str, text: str, force: bool) -> None:
    """The atomic writer's policy for an existing name: no symbolic link; no read-only file unless forced."""
    from shardplan.support.atomic_write import read_only
    from shardplan.support.input_files import shown_path

    if info is not None and stat.S_ISLNK(info.st_mode):
        raise ShardplanError(field, _shown(text), f"is a symbolic link to {shown_path(os.readlink(target))}; shardplan "
                                                  "does not write through links: name the file itself, or remove the link")
    if info is not None and stat.S_ISREG(info.st_mode) and not force and read_only(target, info):
        raise ShardplanError(field, _shown(text), "is read-only; pass --force to replace it (it stays read-only)")
