"""Which database URLs the store takes, and that none of them leaks into an error text."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.manager.store import Store, UnsupportedDatabaseUrl, resolve_url, sqlite_url


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("postgresql://u:pw@db.example:5432/manager", "postgresql+psycopg"),
        ("postgres://u:pw@db.example/manager", "postgresql+psycopg"),
        ("postgresql+psycopg://u@/manager?host=/run/postgresql", "postgresql+psycopg"),
        ("sqlite:////var/lib/mediaplane/manager/manager.db", "sqlite+pysqlite"),
        ("sqlite+pysqlite:///relative.db", "sqlite+pysqlite"),
    ],
)
def test_accepted_urls_name_our_driver(given: str, driver: str) -> None:
    resolved = resolve_url(given)
    assert resolved.drivername == driver
    assert resolved.database == resolve_url(resolved).database  # resolving is idempotent


@pytest.mark.parametrize(
    "given",
    [
        "mysql://u:hunter2@db/manager",
        "postgresql+psycopg2://u:hunter2@db/manager",
        "sqlite://",
        "sqlite:///:memory:",
        "not a url hunter2",
    ],
)
def test_other_urls_are_refused_without_echoing_them(given: str) -> None:
    with pytest.raises(UnsupportedDatabaseUrl) as caught:
        resolve_url(given)
    assert "hunter2" not in caught.value.message
    assert "hunter2" not in str(caught.value.__cause__ or "")


def test_sqlite_url_is_data_dir_manager_db(tmp_path: Path) -> None:
    assert resolve_url(sqlite_url(tmp_path)).database == str(tmp_path / "manager.db")


async def test_the_url_a_user_writes_opens_the_store(backend: str, store_url: str, tmp_path: Path) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/manager.db"
    else:
        url = store_url.replace("postgresql+psycopg://", "postgresql://")
    async with await Store.open(url) as store:
        assert await store.count_users() == 0
        assert store.backend == backend
        if backend == "sqlite":
            # A new database holds password hashes and ciphertext: owner only, WAL file included.
            for name in ("manager.db", "manager.db-wal"):
                assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name
