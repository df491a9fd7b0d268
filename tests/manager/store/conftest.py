"""Every store test runs twice: on a SQLite file and on a real PostgreSQL database.

The PostgreSQL cluster starts once per session (tests/helpers/postgres.py), and only
when a ``postgresql`` case runs. Without the binaries those cases skip, or fail when
``CI=true``.

- ``database_url`` is an empty database: a new SQLite file, or a new PostgreSQL
  database (``CREATE DATABASE``, a few hundred ms on a busy machine);
- ``store_url`` is a database for the ``store`` fixture: a new SQLite file, or one
  PostgreSQL database migrated once per session and emptied (``TRUNCATE``) before
  each test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from services.manager.store import Store, sqlite_url, upgrade_to_head
from services.manager.store.tables import fleet_metadata, metadata
from tests.helpers.postgres import PostgresCluster, require_postgres, running_postgres

BACKENDS = ("sqlite", "postgresql")
START = datetime(2026, 11, 21, 15, 4, 5, 123456, tzinfo=UTC)


@dataclass
class FakeClock:
    """The store's clock in tests: starts at START, moves only when told."""

    now: datetime = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        self.now += delta
        return self.now


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    bin_dir = require_postgres()
    with running_postgres(bin_dir) as cluster:
        yield cluster


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a new SQLite file, or a new database in the session's cluster."""
    if backend == "sqlite":
        return sqlite_url(tmp_path)
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return cluster.create_database()


@pytest.fixture(scope="session")
def postgres_store_database(postgres_cluster: PostgresCluster) -> str:
    url = postgres_cluster.create_database("store")
    upgrade_to_head(url)
    return url


@pytest.fixture
def store_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database for a Store: a new SQLite file, or the session's PostgreSQL store database, emptied."""
    if backend == "sqlite":
        return sqlite_url(tmp_path)
    url: str = request.getfixturevalue("postgres_store_database")
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    tables = ", ".join(t.name for t in [*metadata.sorted_tables, *fleet_metadata.sorted_tables])
    cluster.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE", database=sa.make_url(url).database or "")
    return url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[Store]:
    async with await Store.open(store_url, clock=clock) as opened:
        yield opened
