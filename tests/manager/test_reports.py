"""The hub's write-behind (services/manager/reports.py) against a real SQLite store."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

from services.manager.reports import NodeReports
from services.manager.store import (
    EventSeverity,
    NewEvent,
    NewNode,
    NodeStatus,
    Store,
    StoreFailed,
    sqlite_url,
)

ARRIVAL = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.UTC)


def event(message: str, node_id: uuid.UUID | None = None) -> NewEvent:
    return NewEvent(node_id=node_id, severity=EventSeverity.INFO, category="connection", message=message)


async def messages(store: Store) -> list[str]:
    return [e.message for e in reversed((await store.query_events(per_page=100)).rows)]


async def new_node(store: Store, name: str = "n") -> uuid.UUID:
    """A node that registered and then went offline (only such nodes have reports)."""
    token_digest = uuid.uuid4().hex * 2
    node_id = (await store.create_node(NewNode(name=name, registration_token_digest=token_digest))).id
    assert await store.consume_registration_token(token_digest, "ciphertext") is not None
    await store.update_node_runtime(node_id, status=NodeStatus.OFFLINE)
    return node_id


async def test_updates_coalesce_per_node_and_events_keep_their_order(tmp_path: Path) -> None:
    async with await Store.open(sqlite_url(tmp_path)) as store:
        node_id = await new_node(store)
        reports = NodeReports(store, wall_clock=lambda: ARRIVAL)
        reports.update_runtime(node_id, status=NodeStatus.ONLINE, software_version="1.0", protocol_version=1)
        reports.add_event(event("connected", node_id))
        reports.update_runtime(node_id, status=NodeStatus.OFFLINE)
        reports.add_event(event("disconnected", node_id))
        reports.update_runtime(node_id, status=NodeStatus.ONLINE, last_seen_at=ARRIVAL)
        reports.add_event(event("connected again", node_id))
        assert (await store.get_node(node_id)).status is NodeStatus.OFFLINE  # type: ignore[union-attr]

        await reports.flush()

        record = await store.get_node(node_id)
        assert record is not None
        assert (record.status, record.software_version, record.last_seen_at) == (NodeStatus.ONLINE, "1.0", ARRIVAL)
        assert await messages(store) == ["connected", "disconnected", "connected again"]
        stored = (await store.query_events(per_page=1)).rows[0]
        assert stored.created_at == ARRIVAL  # the arrival time, not the write time
        assert reports.writes == 1 and not reports.waiting


async def test_a_node_deleted_meanwhile_is_skipped_and_the_rest_written(tmp_path: Path) -> None:
    async with await Store.open(sqlite_url(tmp_path)) as store:
        kept, deleted = await new_node(store, "kept"), await new_node(store, "gone")
        reports = NodeReports(store)
        reports.update_runtime(deleted, status=NodeStatus.ONLINE)
        reports.update_runtime(kept, status=NodeStatus.DEGRADED)
        reports.add_event(event("e", kept))
        await store.delete_node(deleted)

        await reports.flush()

        assert (await store.get_node(kept)).status is NodeStatus.DEGRADED  # type: ignore[union-attr]
        assert await messages(store) == ["e"]


async def test_a_report_queued_before_a_new_token_leaves_the_node_pending(tmp_path: Path) -> None:
    """CI: a node's socket closed, its ``offline`` waited in the batch, an admin made a new
    token (the node ``pending``), and the batch then wrote ``offline`` over it: the node's
    registration with the new token was refused, since only a pending node registers."""
    async with await Store.open(sqlite_url(tmp_path)) as store:
        node_id = await new_node(store)
        reports = NodeReports(store, wall_clock=lambda: ARRIVAL)
        reports.update_runtime(node_id, status=NodeStatus.OFFLINE, last_seen_at=ARRIVAL)
        reports.add_event(event("disconnected", node_id))
        new_digest = "ab" * 32
        await store.reset_registration_token(node_id, new_digest)

        await reports.flush()

        record = await store.get_node(node_id)
        assert record is not None and record.status is NodeStatus.PENDING
        assert record.last_seen_at == ARRIVAL  # the rest of the report is written
        assert await messages(store) == ["disconnected"]
        registered = await store.consume_registration_token(new_digest, "new-ciphertext")
        assert registered is not None and registered.status is NodeStatus.OFFLINE


async def test_events_beyond_the_bound_drop_the_oldest(tmp_path: Path) -> None:
    async with await Store.open(sqlite_url(tmp_path)) as store:
        reports = NodeReports(store, max_events=3)
        for index in range(5):
            reports.add_event(event(f"e{index}"))
        assert reports.events_dropped == 2
        await reports.flush()
        assert await messages(store) == ["e2", "e3", "e4"]


class FailingStore(Store):
    """A real store whose batch write fails the first ``failures`` times (the database down)."""

    failures = 0

    async def record_node_reports(
        self, runtime: Mapping[uuid.UUID, Mapping[str, Any]], batch: Sequence[NewEvent]
    ) -> int:
        if self.failures:
            self.failures -= 1
            raise StoreFailed("the database operation failed")
        return await super().record_node_reports(runtime, batch)


async def test_a_failed_write_is_retried_with_newer_values_winning(tmp_path: Path) -> None:
    async with await FailingStore.open(sqlite_url(tmp_path)) as store:
        assert isinstance(store, FailingStore)
        node_id = await new_node(store)
        reports = NodeReports(store)
        reports.update_runtime(node_id, status=NodeStatus.ONLINE, software_version="1.0")
        reports.add_event(event("first", node_id))
        store.failures = 1

        await reports.flush()  # fails: everything is put back
        assert reports.waiting and reports.writes == 0
        reports.update_runtime(node_id, status=NodeStatus.ERROR)
        reports.add_event(event("second", node_id))
        await reports.flush()

        record = await store.get_node(node_id)
        assert record is not None and (record.status, record.software_version) == (NodeStatus.ERROR, "1.0")
        assert await messages(store) == ["first", "second"]


async def test_run_writes_within_the_interval_and_on_cancellation(tmp_path: Path) -> None:
    async with await Store.open(sqlite_url(tmp_path)) as store:
        node_id = await new_node(store)
        reports = NodeReports(store, interval_s=0.05)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reports.run)
            reports.add_event(event("soon", node_id))
            with trio.fail_after(5):
                while await messages(store) != ["soon"]:
                    await trio.sleep(0.01)
            # Nothing waiting: no empty transaction.
            await reports.flush()
            assert reports.writes == 1
            reports.add_event(event("at the end", node_id))
            nursery.cancel_scope.cancel()
        assert await messages(store) == ["soon", "at the end"]
