"""Write-behind for what nodes report: the node hub's read loops never wait on the database.

Every node sends ``stats`` each second and ``health`` every 15 s, and connects and goes with
an event each time; at a fleet's size, one transaction per message is what limits the
manager (bench/manager.py measured 100 nodes held with a write per message, SQLite
committing each). So the hub hands these to :class:`NodeReports`, which

- coalesces the node runtime fields per node (status, ``last_seen_at``, versions,
  ``last_health``): a later value of a field replaces an earlier one not yet written, the
  order in which a node went offline and came back is kept, and only the newest is stored;
- appends events in arrival order, each stamped with its arrival time;
- writes all of it in one transaction (``Store.record_node_reports``) at most every
  ``interval_s``, from its own task.

What is delayed: the stored status, ``last_seen_at`` and events, by up to ``interval_s``
(the live views of the hub are not). What stays direct: anything a caller waits for, such as
credentials, registration, the config cache and secret rotation.

Bounded: at most ``max_events`` events wait (the oldest are dropped beyond, counted and
logged, as a node's own queue does, interop 6); runtime fields are one entry per node. When
a write fails (the database is down), the batch is put back under what arrived meanwhile and
retried at the next interval.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, Unpack
from uuid import UUID

import trio

from services.manager.store import NewEvent, NodeRuntime, Store, StoreFailed

__all__ = ["DEFAULT_INTERVAL_S", "MAX_WAITING_EVENTS", "NodeReports"]

DEFAULT_INTERVAL_S: Final = 0.25
MAX_WAITING_EVENTS: Final = 20_000

_log = logging.getLogger("mediaplane.manager.hub")


def _utc_now() -> datetime:
    return datetime.now(UTC)


class NodeReports:
    """The hub's pending runtime fields and events, and the task that writes them."""

    def __init__(
        self,
        store: Store,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_events: int = MAX_WAITING_EVENTS,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._store = store
        self._interval_s = interval_s
        self._wall_clock = wall_clock
        self._runtime: dict[UUID, dict[str, Any]] = {}
        self._events: deque[NewEvent] = deque(maxlen=max_events)
        self._pending = trio.Event()
        self._write_lock = trio.Lock()
        self._failures = 0
        self.events_dropped = 0
        """Events dropped because ``max_events`` were waiting (the database too slow or down)."""
        self.writes = 0
        """Transactions written (for tests and the benchmark)."""

    def update_runtime(self, node_id: UUID, **fields: Unpack[NodeRuntime]) -> None:
        """Records runtime fields of a node; written with the next batch."""
        self._runtime.setdefault(node_id, {}).update(fields)
        self._pending.set()

    def add_event(self, new: NewEvent) -> None:
        """Queues an event; its ``created_at`` is now unless given."""
        if new.created_at is None:
            new = NewEvent(
                node_id=new.node_id,
                severity=new.severity,
                category=new.category,
                message=new.message,
                details=new.details,
                flow_id=new.flow_id,
                created_at=self._wall_clock(),
            )
        if len(self._events) == self._events.maxlen:
            self.events_dropped += 1
            if self.events_dropped == 1 or self.events_dropped % 1000 == 0:
                _log.warning("the database is behind: %d node event(s) dropped so far", self.events_dropped)
        self._events.append(new)
        self._pending.set()

    @property
    def waiting(self) -> bool:
        """Whether anything is waiting to be written."""
        return bool(self._runtime or self._events)

    async def run(self) -> None:
        """Writes batches until cancelled; on cancellation writes what waits, shielded, within 5 s."""
        try:
            while True:
                await self._pending.wait()
                # The batching window: everything that arrives in it shares one transaction.
                await trio.sleep(self._interval_s)
                await self.flush()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.flush()

    async def flush(self) -> None:
        """Writes what waits now, in one transaction; a failure is logged and retried later."""
        async with self._write_lock:
            self._pending = trio.Event()
            if not self.waiting:
                return
            runtime, self._runtime = self._runtime, {}
            batch = list(self._events)
            self._events.clear()
            try:
                await self._store.record_node_reports(runtime, batch)
            except StoreFailed:
                self._failures += 1
                if self._failures == 1 or self._failures % 100 == 0:
                    _log.exception(
                        "writing %d node update(s) and %d event(s) failed (%d time(s) in a row); retrying",
                        len(runtime),
                        len(batch),
                        self._failures,
                    )
                self._put_back(runtime, batch)
                return
            self.writes += 1
            if self._failures:
                _log.info("node updates are written again after %d failure(s)", self._failures)
                self._failures = 0

    def _put_back(self, runtime: dict[UUID, dict[str, Any]], batch: list[NewEvent]) -> None:
        for node_id, fields in runtime.items():
            newer = self._runtime.get(node_id, {})
            self._runtime[node_id] = {**fields, **newer}
        newer_events = list(self._events)
        self._events.clear()
        for event in batch + newer_events:
            self.add_event(event)
        self._pending.set()
