"""A logical snapshot of the whole store: read in one consistent view, loaded into an empty database.

``mp-manager backup`` and ``restore`` (docs/manager.md, "Backup and restore") are built on
the two functions here; the file format around them (compression, encryption with the
master key) lives in ``services.manager.backup``. This module knows tables, not keys: the
secret columns are copied as the ciphertext they are (interop 7.7), so a snapshot is only
useful with the master key they were sealed with.

**Consistency.** Every table is read from one point in time while the manager keeps
serving:

- SQLite: the online backup API (``sqlite3.Connection.backup``) copies the database into a
  private temporary file in one step, which holds one read transaction in WAL mode, so
  writers are never blocked and the copy is one instant of the database. The rows are
  then read from the copy.
- PostgreSQL: one ``REPEATABLE READ, READ ONLY`` transaction: every ``SELECT`` in it sees
  the snapshot taken at its first statement.

**Portability.** The snapshot is the rows as Python values (UUIDs, aware UTC datetimes,
JSON values), not a database file, so a snapshot of SQLite loads into PostgreSQL and back.

**Stream.** One JSON document per line (UTF-8, ``\\n``)::

    {"format": "mediaplane-manager-snapshot", "version": 1, "schema_revision": "0001", ...}
    {"table": "users", "columns": ["id", "username", ...]}
    ["6f1c…", "admin", ...]                      one array per row, in column order
    ...
    {"end": {"users": 1, "sessions": 3, ...}}   the row count of every table

**Loading** happens in one transaction that first migrates the empty database (the same
Alembic revisions as every start), checks that every table is empty, inserts the rows and,
on PostgreSQL, moves the id sequences past the loaded ids. Any problem rolls it all back:
a database is never left half restored.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from uuid import UUID

import sqlalchemy as sa

from appliance.errors import ApplianceError, Conflict, InvalidInput

from .engine import create_private_file, create_store_engine, resolve_url, run_in_transaction
from .errors import StoreFailed
from .migrate import current_revision, head_revision, upgrade_then
from .tables import UtcDateTime, metadata

__all__ = [
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_VERSION",
    "SnapshotDamaged",
    "SnapshotSummary",
    "TargetNotEmpty",
    "WrongSchemaRevision",
    "load_snapshot",
    "write_snapshot",
]

SNAPSHOT_FORMAT: Final = "mediaplane-manager-snapshot"
SNAPSHOT_VERSION: Final = 1
_BATCH_ROWS: Final = 1000  # rows per SELECT fetch and per INSERT executemany


class SnapshotDamaged(InvalidInput):
    """The snapshot stream is not one this code wrote (a bad line, a missing end); nothing was loaded."""


class TargetNotEmpty(Conflict):
    """The database to restore into already holds rows; restore only fills an empty one."""


class WrongSchemaRevision(ApplianceError):
    """The database or the snapshot is at another schema revision than this code's head."""


@dataclass(frozen=True)
class SnapshotSummary:
    """What a snapshot holds: its header fields and the row count of every table."""

    schema_revision: str
    source_backend: str
    created_at: dt.datetime
    software_version: str
    rows: dict[str, int] = field(default_factory=dict)


# --- values: Python (as the tables' types give them) <-> JSON ---------------------------


def _encoder(column: sa.Column[Any]) -> Callable[[Any], Any]:
    if isinstance(column.type, UtcDateTime):
        return lambda value: None if value is None else value.isoformat()
    if isinstance(column.type, sa.Uuid):
        return lambda value: None if value is None else str(value)
    return lambda value: value  # str, int, bool, and JSON values (already JSON)


def _decoder(column: sa.Column[Any]) -> Callable[[Any], Any]:
    if isinstance(column.type, UtcDateTime):

        def to_datetime(value: Any) -> dt.datetime | None:
            if value is None:
                return None
            parsed = dt.datetime.fromisoformat(value)
            if parsed.tzinfo is None:
                raise ValueError("a naive timestamp")
            return parsed

        return to_datetime
    if isinstance(column.type, sa.Uuid):
        return lambda value: None if value is None else UUID(value)
    return lambda value: value


# --- writing ----------------------------------------------------------------------------


def write_snapshot(url: str | sa.URL, emit: Callable[[bytes], None], *, software_version: str) -> SnapshotSummary:
    """Reads the whole database at ``url`` in one consistent view and hands each line to ``emit``.

    The database must be at this code's schema head (start ``mp-manager serve`` once after an
    upgrade); else ``WrongSchemaRevision``. Blocking: run it in a worker thread. Database
    errors become ``StoreFailed``.
    """
    resolved = resolve_url(url)
    if resolved.get_backend_name() == "sqlite":
        assert resolved.database is not None  # resolve_url refuses a SQLite URL without a file
        with _sqlite_copy(Path(resolved.database)) as copy_url:
            return _write_from(copy_url, emit, software_version, source_backend="sqlite")
    return _write_from(resolved, emit, software_version, source_backend="postgresql")


@contextmanager
def _sqlite_copy(database: Path) -> Iterator[sa.URL]:
    """A private copy of a live SQLite database made with the online backup API; removed after."""
    if not database.is_file():
        raise StoreFailed("there is no database to back up (no manager.db in the data directory)")
    # TemporaryDirectory is 0700: the copy holds password hashes and ciphertext.
    with tempfile.TemporaryDirectory(prefix="mediaplane-backup-") as scratch:
        copy_path = Path(scratch) / "snapshot.db"
        try:
            source = sqlite3.connect(database, timeout=10)
            try:
                target = sqlite3.connect(copy_path)
                try:
                    # pages=-1 (the default): the whole database in one step, so in one read
                    # transaction, never interleaved with a writer's commit.
                    source.backup(target)
                finally:
                    target.close()
            finally:
                source.close()
        except sqlite3.Error as exc:
            raise StoreFailed("reading the SQLite database for the backup failed") from exc
        yield resolve_url(sa.URL.create("sqlite", database=str(copy_path)))


def _write_from(
    url: sa.URL, emit: Callable[[bytes], None], software_version: str, *, source_backend: str
) -> SnapshotSummary:
    engine = create_store_engine(url, pool_size=1)
    try:
        revision = current_revision(engine)
        head = head_revision()
        if revision != head:
            raise WrongSchemaRevision(
                f"the database is at schema revision {revision or 'none'} and this mp-manager writes {head}: "
                "start mp-manager serve once with this version (it migrates), then back up"
            )
        summary = SnapshotSummary(
            schema_revision=head,
            source_backend=source_backend,
            created_at=dt.datetime.now(dt.UTC),
            software_version=software_version,
        )
        reader = engine
        if source_backend == "postgresql":
            reader = engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        run_in_transaction(reader, False, _dump_tables, emit, summary)
        return summary
    finally:
        engine.dispose()


def _line(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _dump_tables(conn: sa.Connection, emit: Callable[[bytes], None], summary: SnapshotSummary) -> None:
    emit(
        _line(
            {
                "format": SNAPSHOT_FORMAT,
                "version": SNAPSHOT_VERSION,
                "schema_revision": summary.schema_revision,
                "source_backend": summary.source_backend,
                "created_at": summary.created_at.isoformat(),
                "software_version": summary.software_version,
            }
        )
    )
    # sorted_tables: parents before children, so a load never meets a dangling reference.
    for table in metadata.sorted_tables:
        columns = list(table.columns)
        encoders = [_encoder(column) for column in columns]
        emit(_line({"table": table.name, "columns": [column.name for column in columns]}))
        count = 0
        query = sa.select(*columns).order_by(*table.primary_key.columns)
        for row in conn.execution_options(yield_per=_BATCH_ROWS).execute(query):
            emit(_line([encode(value) for encode, value in zip(encoders, row, strict=True)]))
            count += 1
        summary.rows[table.name] = count
    emit(_line({"end": summary.rows}))


# --- loading ----------------------------------------------------------------------------


def load_snapshot(url: str | sa.URL, lines: Iterable[bytes]) -> SnapshotSummary:
    """Loads a snapshot into the (empty) database at ``url``, all in one transaction.

    Creates the schema when the database is new. Raises ``TargetNotEmpty`` if any table
    already holds a row, ``WrongSchemaRevision`` if the snapshot was written at another
    revision than this code's head, ``SnapshotDamaged`` for a stream this module did not
    write; in each case nothing is written. Blocking: run it in a worker thread.
    """
    resolved = resolve_url(url)
    if resolved.get_backend_name() == "sqlite" and resolved.database:
        create_private_file(Path(resolved.database))
    engine = create_store_engine(resolved, pool_size=1)
    try:
        revision = current_revision(engine)
        if revision is not None and revision != head_revision():
            raise WrongSchemaRevision(
                f"the target database is at schema revision {revision}; restore into an empty database"
            )
        loader = _Loader(iter(lines))
        try:
            upgrade_then(engine, loader.load)
        except ApplianceError:
            raise
        except sa.exc.SQLAlchemyError as exc:
            raise StoreFailed("loading the snapshot into the database failed") from exc
        assert loader.summary is not None
        return loader.summary
    finally:
        engine.dispose()


class _Loader:
    """Reads the snapshot stream and inserts its rows, inside the migration's transaction."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines = lines
        self.summary: SnapshotSummary | None = None

    def _next(self) -> Any:
        try:
            raw = next(self._lines)
        except StopIteration:
            raise SnapshotDamaged("the snapshot ends early (truncated)") from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise SnapshotDamaged("the snapshot holds a line that is not JSON") from None

    def load(self, conn: sa.Connection) -> None:
        self.summary = summary = self._header(self._next())
        for table in metadata.sorted_tables:
            if conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one():
                raise TargetNotEmpty(
                    f"the target database already holds data (table {table.name}): restore only into an empty one"
                )
        expected = [table.name for table in metadata.sorted_tables]
        document = self._next()
        while isinstance(document, dict) and "table" in document:
            name = document["table"]
            if not expected or name != expected[0]:
                raise SnapshotDamaged("the snapshot's tables are not the ones of its schema revision")
            expected.pop(0)
            document = self._load_table(conn, metadata.tables[name], document.get("columns"), summary)
        if not isinstance(document, dict) or document.get("end") != summary.rows or expected:
            raise SnapshotDamaged("the snapshot's end does not match its rows (damaged)")
        # Read the source to its end inside the transaction: a wrapper that checks the
        # stream's integrity at its end (the backup file's last chunk) can still refuse it.
        if next(self._lines, None) is not None:
            raise SnapshotDamaged("the snapshot has data after its end")
        if conn.dialect.name == "postgresql":
            _advance_sequences(conn)

    def _header(self, header: Any) -> SnapshotSummary:
        if not (
            isinstance(header, dict)
            and header.get("format") == SNAPSHOT_FORMAT
            and header.get("version") == SNAPSHOT_VERSION
        ):
            raise SnapshotDamaged("this is not a Mediaplane manager snapshot of a known version")
        head = head_revision()
        if header.get("schema_revision") != head:
            raise WrongSchemaRevision(
                f"the backup was made at schema revision {header.get('schema_revision')!s:.16} and this "
                f"mp-manager restores {head}: restore with the version that made it, then upgrade"
            )
        try:
            return SnapshotSummary(
                schema_revision=head,
                source_backend=str(header["source_backend"]),
                created_at=dt.datetime.fromisoformat(header["created_at"]),
                software_version=str(header["software_version"]),
            )
        except (KeyError, TypeError, ValueError):
            raise SnapshotDamaged("the snapshot's header is incomplete") from None

    def _load_table(self, conn: sa.Connection, table: sa.Table, names: Any, summary: SnapshotSummary) -> Any:
        if names != [column.name for column in table.columns]:
            raise SnapshotDamaged(f"the columns of table {table.name} differ from its schema revision")
        columns = list(table.columns)
        decoders = [_decoder(column) for column in columns]
        batch: list[dict[str, Any]] = []
        count = 0
        while True:
            document = self._next()
            if not isinstance(document, list):
                break
            if len(document) != len(columns):
                raise SnapshotDamaged(f"a row of table {table.name} has the wrong number of values")
            try:
                batch.append(
                    {
                        column.name: decode(value)
                        for column, decode, value in zip(columns, decoders, document, strict=True)
                    }
                )
            except (TypeError, ValueError, AttributeError):
                raise SnapshotDamaged(f"a row of table {table.name} holds a value of the wrong type") from None
            count += 1
            if len(batch) >= _BATCH_ROWS:
                conn.execute(table.insert(), batch)
                batch = []
        if batch:
            conn.execute(table.insert(), batch)
        summary.rows[table.name] = count
        return document


def _advance_sequences(conn: sa.Connection) -> None:
    """Moves each identity sequence past the ids just inserted (PostgreSQL does not, for explicit ids)."""
    for table in metadata.sorted_tables:
        for column in table.primary_key.columns:
            if column.autoincrement is True:
                conn.execute(
                    sa.text(
                        f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'), "
                        f"COALESCE((SELECT MAX({column.name}) FROM {table.name}), 0) + 1, false)"
                    )
                )
