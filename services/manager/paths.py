"""Where the manager's state lives: the data directory and the database URL (interop.md 1.3).

Kept apart from ``main`` so that the store tools of the CLI (``backup``, ``restore``) start
without importing the web stack.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from services.manager.settings import StartupError
from services.manager.store.engine import sqlite_url

__all__ = ["database_url", "ensure_data_dir"]

_log = logging.getLogger("mediaplane.manager")


def ensure_data_dir(data_dir: Path) -> None:
    """Creates the data directory 0700 when missing; warns when it is open to others. StartupError."""
    if not data_dir.exists():
        try:
            data_dir.mkdir(mode=0o700, parents=True)
            os.chmod(data_dir, 0o700)  # mkdir's mode is filtered by the umask
        except OSError as exc:
            raise StartupError(f"cannot create the data directory {data_dir}: {exc.strerror}") from exc
        _log.info("created the data directory %s (0700)", data_dir)
        return
    if not data_dir.is_dir():
        raise StartupError(f"the data directory {data_dir} is not a directory")
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:
        _log.warning("the data directory %s is open to other users (mode %04o): it should be 0700", data_dir, mode)


def database_url(data_dir: Path, url: str | None) -> str:
    """``url`` when given, else the embedded SQLite file ``DATA_DIR/manager.db`` (interop.md 1.3)."""
    return url if url else sqlite_url(data_dir)
