"""Migrations from an empty database, on both backends, end exactly at tables.py; connection setup."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from services.manager.store import (
    Store,
    StoreFailed,
    create_store_engine,
    current_revision,
    head_revision,
    upgrade_to_head,
)
from services.manager.store.tables import fleet_metadata, metadata

TABLES = {"users", "sessions", "login_attempts", "nodes", "events", "settings", "ai_keys"}
# Alembic compares against a sequence of MetaData too (its stub says one).
BOTH = cast(sa.MetaData, [metadata, fleet_metadata])
FLEET_TABLES = {"manager_instances", "node_connections", "fleet_messages", "fleet_live"}


def test_every_migration_from_empty_matches_the_metadata(database_url: str) -> None:
    engine = create_store_engine(database_url)
    try:
        assert current_revision(engine) is None
        assert set(sa.inspect(engine).get_table_names()) == set()

        upgrade_to_head(database_url)

        assert current_revision(engine) == head_revision()
        assert set(sa.inspect(engine).get_table_names()) == TABLES | FLEET_TABLES | {"alembic_version"}
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), BOTH)
        assert diff == []
    finally:
        engine.dispose()


def test_the_comparison_sees_a_difference(database_url: str) -> None:
    # Guards the test above against passing vacuously: drop an index, and it must show.
    upgrade_to_head(database_url)
    engine = create_store_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP INDEX ix_events_flow_id_created_at"))
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), BOTH)
        assert [entry[0] for entry in diff] == ["add_index"]
    finally:
        engine.dispose()


def test_upgrading_twice_changes_nothing(database_url: str) -> None:
    upgrade_to_head(database_url)
    upgrade_to_head(database_url)
    engine = create_store_engine(database_url)
    try:
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


async def test_open_migrates_and_can_skip_it(database_url: str) -> None:
    async with await Store.open(database_url, migrate=False) as store:
        assert current_revision(store.engine) is None
    async with await Store.open(database_url) as store:
        assert current_revision(store.engine) == head_revision()
        assert await store.count_users() == 0


async def test_an_unreachable_database_is_store_failed(backend: str, database_url: str, tmp_path: Path) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/no/such/dir/manager.db"
    else:
        url = database_url.replace("/test_", "/missing_")
    with pytest.raises(StoreFailed) as caught:
        await Store.open(url)
    assert isinstance(caught.value.__cause__, sa.exc.OperationalError)
    assert "missing_" not in caught.value.message and "/no/such" not in caught.value.message
