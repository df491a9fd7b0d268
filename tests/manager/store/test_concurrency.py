"""The trio facade under concurrency: bounded threads, WAL on SQLite, two stores on one database."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
import trio

from services.manager.store import EventSeverity, NewEvent, Store
from services.manager.store import engine as engine_module


def new_event(i: int) -> NewEvent:
    return NewEvent(node_id=None, severity=EventSeverity.INFO, category="load", message=f"event {i}")


async def test_twenty_concurrent_inserts_all_land(store: Store) -> None:
    ids: list[int] = []

    async def insert(i: int) -> None:
        ids.append((await store.add_event(new_event(i))).id)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(insert, i)
    assert len(set(ids)) == 20
    page = await store.query_events(per_page=50)
    assert page.total == 20
    assert sorted(row.message for row in page.rows) == sorted(f"event {i}" for i in range(20))


async def test_two_stores_on_one_database_write_concurrently(store_url: str) -> None:
    # Two instances (or `serve` and a CLI command) on one file or one PostgreSQL database.
    async with await Store.open(store_url) as first, await Store.open(store_url) as second:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(first.add_event, new_event(i))
                    nursery.start_soon(second.add_event, new_event(100 + i))
        assert (await first.query_events()).total == 40
        assert (await second.query_events()).total == 40


async def test_threads_in_use_never_exceed_the_limiter(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 4 if store.backend == "sqlite" else 8
    in_use = 0
    peak = 0
    lock = threading.Lock()
    real_run = engine_module.run_in_transaction

    def counting_run(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_use, peak
        with lock:
            in_use += 1
            peak = max(peak, in_use)
        try:
            threading.Event().wait(0.05)  # hold the thread long enough for others to pile up
            return real_run(*args, **kwargs)
        finally:
            with lock:
                in_use -= 1

    monkeypatch.setattr("services.manager.store.store.run_in_transaction", counting_run)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(3 * limit):
                nursery.start_soon(store.query_events)
    assert peak == limit
    # Writes: SQLite has one writer, so the store queues them in trio (never in SQLite's
    # sleeping busy handler); PostgreSQL takes them up to the limit.
    peak = 0
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(3 * limit):
                nursery.start_soon(store.add_event, new_event(i))
    assert (await store.query_events()).total == 3 * limit
    assert peak == (1 if store.backend == "sqlite" else limit)


async def test_connection_setup(store: Store) -> None:
    # Three connections checked out at once: the pool must open new ones, and each gets the setup.
    with store.engine.connect() as first, store.engine.connect() as second, store.engine.connect() as third:
        for conn in (first, second, third):
            if store.backend == "sqlite":
                pragmas = {
                    name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                    for name in ("journal_mode", "foreign_keys", "busy_timeout")
                }
                assert pragmas == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 10_000}
            else:
                assert store.backend == "postgresql"
                assert store.engine.dialect.driver == "psycopg"
                version = conn.execute(sa.text("SELECT current_setting('server_version_num')::int")).scalar_one()
                assert version >= 120000
