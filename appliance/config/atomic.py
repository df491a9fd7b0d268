"""Atomic file replacement: the one way every Mediaplane service writes a file.

interop.md (conventions): every file is written atomically: a temp file in the same
directory, fsync, rename, fsync the directory. A reader therefore sees either the old
file or the new one, never a torn write, and a crash at any point leaves the old file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from appliance.errors import PersistFailed

__all__ = ["atomic_write"]


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
    directory = path.parent
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as tmp:
                # Mode first: fchmod is not subject to the umask, and the content is never
                # on disk with wider permissions than asked for.
                os.fchmod(tmp.fileno(), mode)
                tmp.write(data)
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


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
