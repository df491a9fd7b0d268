"""Atomic file replacement: the one way every Mediaplane service writes a file.

interop.md (conventions): every file is written atomically: a temp file in the same
directory, fsync, rename, fsync the directory. A reader therefore sees either the old
file or the new one, never a torn write, and a crash at any point leaves the old file.

A crash (kill -9, power cut) between creating the temp file and the rename leaves the
temp file, ``.<name>.<8 random characters>.tmp``, behind; the owner of a directory calls
:func:`remove_stale_temp_files` at start, when nothing is writing, to clear them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Final

from appliance.errors import PersistFailed

__all__ = ["atomic_write", "atomic_writer", "remove_stale_temp_files"]

_TEMP_SUFFIX: Final = ".tmp"
# tempfile.mkstemp's random part: 8 characters of [a-z0-9_] (CPython 3.11,
# tempfile._RandomNameSequence); a test checks a real temp name against this.
_TEMP_RANDOM: Final = r"[a-z0-9_]{8}"

log = logging.getLogger(__name__)


def _temp_prefix(name: str) -> str:
    return f".{name}."


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically, the file ending with permission ``mode``.

    The bytes go to a temp file in the same directory (created 0600, so a secret is never
    readable by others, not even for a moment), which is fsynced, given ``mode``, renamed
    over ``path``, and then the directory is fsynced so the rename itself is durable.
    Blocking: call it from a worker thread (``trio.to_thread.run_sync``) in async code.

    Raises PersistFailed (message names the file and the OS reason, never the content)
    chained to the OSError. On failure the old file is intact and no temp file is left,
    except when only the final directory fsync fails: the new file is then in place but
    its rename may not survive a power cut.
    """
    with atomic_writer(path, mode) as out:
        out.write(data)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o600) -> Iterator[BinaryIO]:
    """:func:`atomic_write` for content written in pieces: ``with atomic_writer(p) as out: out.write(...)``.

    ``path`` is replaced only when the block ends without an exception; an exception
    (any, cancellation included) removes the temp file and leaves the old ``path``. The
    same guarantees and the same PersistFailed as :func:`atomic_write`. Blocking.
    """
    directory = path.parent
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=_TEMP_SUFFIX, dir=directory)
        try:
            with os.fdopen(fd, "wb") as tmp:
                # Mode first: fchmod is not subject to the umask, and the content is never
                # on disk with wider permissions than asked for.
                os.fchmod(tmp.fileno(), mode)
                yield tmp
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        _fsync_directory(directory)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PersistFailed(f"cannot write {path}: {reason}") from exc


def remove_stale_temp_files(directory: Path, names: Iterable[str]) -> int:
    """Remove the temp files that interrupted :func:`atomic_write` calls left; the count removed.

    Only regular files in ``directory`` named as ``atomic_write`` names the temp file of
    one of ``names`` (``.config.json.k3x9_a0q.tmp`` for ``config.json``) are removed;
    anything else (another name, a directory, a symlink) is left alone. Call it only when
    nothing writes those files (at start). A file that cannot be removed is logged and
    left: this never fails. Blocking.
    """
    pattern = re.compile(
        "|".join(re.escape(_temp_prefix(name)) + _TEMP_RANDOM + re.escape(_TEMP_SUFFIX) for name in names)
    )
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        log.warning("cannot list %s for stale temp files: %s", directory, exc.strerror)
        return 0
    removed = 0
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                continue
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot remove the stale temp file %s: %s", entry.path, exc.strerror)
            continue
        removed += 1
    return removed


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
