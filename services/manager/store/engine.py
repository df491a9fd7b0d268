"""The database engine: which URLs we take, how connections are set up, one transaction per call.

SQLite (the embedded default, ``DATA_DIR/manager.db``) gets on every new connection:

- ``journal_mode=WAL``: readers never wait for the writer, and a crash mid-write
  leaves the file consistent;
- ``foreign_keys=ON``: SQLite leaves them off unless asked, per connection, and the
  cascades from ``users`` to ``sessions`` and ``ai_keys`` depend on them;
- ``busy_timeout``: a writer waits for another process's write (``mp-manager
  reset-password`` while ``serve`` runs) instead of failing at once;
- transaction control taken from the ``sqlite3`` module (``isolation_level=None``):
  we emit ``BEGIN`` ourselves, ``BEGIN IMMEDIATE`` for a write. Python's own
  handling would run a transaction's first SELECT outside the transaction, and a
  read that later upgrades to a write can fail with SQLITE_BUSY however long the
  busy timeout is. This is the recipe of SQLAlchemy's SQLite dialect documentation.

PostgreSQL uses psycopg 3 (``postgresql+psycopg://``); plain ``postgresql://`` and
``postgres://`` URLs are mapped to it. Connections are checked before use
(``pool_pre_ping``), so a restarted server costs one retry, not an error.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Concatenate, Final, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from appliance.errors import ApplianceError

from .errors import StoreFailed, UnsupportedDatabaseUrl

P = ParamSpec("P")
R = TypeVar("R")

SQLITE_FILE_NAME: Final = "manager.db"
SQLITE_BUSY_TIMEOUT_MS: Final = 10_000
WRITE_OPTION: Final = "mediaplane_write"  # execution option: this transaction writes

# SQLSTATE codes (PostgreSQL's, also used for SQLite's extended result codes below).
UNIQUE_VIOLATION: Final = "23505"
FOREIGN_KEY_VIOLATION: Final = "23503"
_SQLITE_CONSTRAINT_STATES: Final = {
    "SQLITE_CONSTRAINT_UNIQUE": UNIQUE_VIOLATION,
    "SQLITE_CONSTRAINT_PRIMARYKEY": UNIQUE_VIOLATION,
    "SQLITE_CONSTRAINT_FOREIGNKEY": FOREIGN_KEY_VIOLATION,
}


def sqlite_url(data_dir: Path) -> str:
    """The URL of the embedded database, ``DATA_DIR/manager.db`` (interop 1.3)."""
    return sa.URL.create("sqlite", database=str(Path(data_dir).resolve() / SQLITE_FILE_NAME)).render_as_string()


def create_private_file(path: Path) -> None:
    """Creates an empty database file readable by its owner only, unless it exists.

    SQLite gives the -wal and -shm files the database file's mode, so all three stay
    private. A missing directory is left for SQLite to report (``StoreFailed``).
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except (FileExistsError, FileNotFoundError):
        pass


def resolve_url(url: str | sa.URL) -> sa.URL:
    """Checks a database URL and names the driver we use for it.

    Takes ``sqlite:///<file>``, ``postgresql://…``, ``postgres://…`` and
    ``postgresql+psycopg://…``. Raises ``UnsupportedDatabaseUrl`` for anything else,
    naming at most the scheme (the URL may hold a password).
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        # from None: SQLAlchemy's message quotes the whole URL, password included.
        raise UnsupportedDatabaseUrl("the database URL cannot be parsed") from None
    # Split the scheme ourselves: URL.get_driver_name() loads the dialect, and there is no
    # "postgres" dialect to load.
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgresql", "postgres") and driver in ("", "psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
            raise UnsupportedDatabaseUrl("SQLite needs a database file path (sqlite:////path/to/manager.db)")
        return parsed.set(drivername="sqlite+pysqlite")
    raise UnsupportedDatabaseUrl(
        f"unsupported database scheme {parsed.drivername!r}: use sqlite:///<file> or postgresql://…"
    )


def create_store_engine(url: str | sa.URL, *, pool_size: int = 4) -> sa.Engine:
    """An engine for ``url`` (see ``resolve_url``) with the connection setup described above.

    ``pool_size`` should be at least the number of threads the caller lets in at once.
    Creating the engine opens no connection; for SQLite the file's directory must exist.
    """
    resolved = resolve_url(url)
    if resolved.get_backend_name() == "sqlite":
        engine = sa.create_engine(
            resolved,
            pool_size=pool_size,
            max_overflow=2,
            # Connections move between trio's worker threads; the pool hands each to one
            # thread at a time.
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        )
        event.listen(engine, "connect", _on_sqlite_connect)
        event.listen(engine, "begin", _on_sqlite_begin)
        return engine
    return sa.create_engine(resolved, pool_size=pool_size, max_overflow=2, pool_pre_ping=True)


def _on_sqlite_connect(dbapi_connection: DBAPIConnection, connection_record: ConnectionPoolEntry) -> None:
    assert isinstance(dbapi_connection, sqlite3.Connection)
    dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (_on_sqlite_begin)
    dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    dbapi_connection.execute("PRAGMA journal_mode = WAL")
    dbapi_connection.execute("PRAGMA foreign_keys = ON")


def _on_sqlite_begin(conn: sa.Connection) -> None:
    # IMMEDIATE takes the write lock up front, waiting (busy_timeout) for another writer.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "BEGIN")


def run_in_transaction(
    engine: sa.Engine,
    write: bool,
    operation: Callable[Concatenate[sa.Connection, P], R],
    *args: P.args,
    **kwargs: P.kwargs,
) -> R:
    """Runs ``operation(conn, *args, **kwargs)`` in one transaction: committed, or rolled back on error.

    ``write`` marks a transaction that writes (SQLite then takes the write lock at
    ``BEGIN``). Store errors (``ApplianceError``) pass through; any other database error
    becomes ``StoreFailed``, chained.
    """
    try:
        with engine.connect() as conn:
            if write:
                conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                return operation(conn, *args, **kwargs)
    except ApplianceError:
        raise
    except sa.exc.SQLAlchemyError as exc:
        raise StoreFailed("the database operation failed") from exc


def constraint_violation(exc: sa.exc.IntegrityError) -> str | None:
    """The SQLSTATE of a unique or foreign-key violation, on either backend; None for others."""
    state = getattr(exc.orig, "sqlstate", None)  # psycopg
    if isinstance(state, str):
        return state
    return _SQLITE_CONSTRAINT_STATES.get(getattr(exc.orig, "sqlite_errorname", ""))


@contextmanager
def constraint_errors(
    *, unique: ApplianceError | None = None, foreign_key: ApplianceError | None = None
) -> Iterator[None]:
    """Turns a unique or foreign-key violation inside the block into the given store error."""
    try:
        yield
    except sa.exc.IntegrityError as exc:
        state = constraint_violation(exc)
        if state == UNIQUE_VIOLATION and unique is not None:
            raise unique from exc
        if state == FOREIGN_KEY_VIOLATION and foreign_key is not None:
            raise foreign_key from exc
        raise
