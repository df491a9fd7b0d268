"""The dashboard stream behind ``/ws/dashboard`` (interop.md 6 "Dashboard stream").

Theory of operation
-------------------
One :class:`DashboardStream` per manager process. Each browser socket holds a
:class:`Subscription`: a mailbox of at most :data:`QUEUE_CAPACITY` (256) encoded frames, the set
of node ids it may see (a viewer's ``allowed_node_ids``; None: every node) and the time its next
update is due. :meth:`DashboardStream.run` is the only producer:

- it sleeps until the earliest due subscription, or until a new one arrives (due at once, so a
  browser gets its first update without waiting a period);
- it builds one snapshot: the node rows of the store (cached :data:`NODE_ROWS_CACHE_S`, so
  browsers whose periods drift apart cost one query between them) joined with the hub's live
  status, stats and health (always fresh, read from memory);
- it puts one ``dashboard_update`` into every due mailbox, filtered for that browser, and
  schedules that browser's next update one period later.

The period is ``stats_broadcast_interval_ms`` (interop.md 7.5, default 1000, 100-60000), read
from the settings on every snapshot so that a change takes effect live, and capped at
:data:`HEARTBEAT_S` (5 s): "at most one per interval and at least one every 5 s" can only both
hold up to 5000 ms, and above it the 5 s floor wins (a browser may use it as its liveness check).

Back-pressure: the producer never awaits a browser. A mailbox that is full drops its *oldest*
frame (a lagging browser skips messages and, when it catches up, gets the newest state); the
drop is counted. A browser that stops reading blocks only its own send loop in the route.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Protocol

import trio

from appliance.protocol import DashboardNode, DashboardPayload, DashboardUpdateMessage, encode
from appliance.protocol import DeviceType as ProtocolDeviceType
from appliance.protocol import NodeStatus as ProtocolNodeStatus
from services.manager.store import NodeRecord, NodeStatus

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "HEARTBEAT_S",
    "NODE_ROWS_CACHE_S",
    "QUEUE_CAPACITY",
    "DashboardStream",
    "LiveNodes",
    "NodeRows",
    "Subscription",
]

_log = logging.getLogger("mediaplane.manager.dashboard")

DEFAULT_INTERVAL_MS: Final = 1000
"""interop.md 7.5 ``stats_broadcast_interval_ms``'s default: the period before the first read."""
HEARTBEAT_S: Final = 5.0
"""interop.md 6: at least one update every 5 s."""
QUEUE_CAPACITY: Final = 256
"""interop.md 6: frames queued per browser; a full queue drops its oldest frame."""
NODE_ROWS_CACHE_S: Final = 0.25
"""How long the store's node rows are reused between snapshots (live data is never cached)."""
RETRY_AFTER_FAILURE_S: Final = 1.0
_CONNECTED: Final = frozenset({NodeStatus.ONLINE, NodeStatus.DEGRADED, NodeStatus.ERROR})
_CONNECTED_WIRE: Final = frozenset(ProtocolNodeStatus(status.value) for status in _CONNECTED)


class NodeRows(Protocol):
    """What the stream reads from the store (``Store`` fits)."""

    async def list_nodes(self) -> list[NodeRecord]: ...


class LiveNodes(Protocol):
    """What the stream reads from the node hub (``NodeHub`` fits)."""

    def live_status(self, node_id: uuid.UUID) -> NodeStatus | None: ...

    def latest_stats(self, node_id: uuid.UUID) -> dict[str, object] | None: ...

    def latest_health(self, node_id: uuid.UUID) -> dict[str, object] | None: ...

    def live_versions(self, node_id: uuid.UUID) -> tuple[str, int] | None: ...


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(eq=False, slots=True)
class Subscription:
    """One browser's mailbox. Iterate it (``async for frame in sub``) to get frames in order."""

    visible: frozenset[uuid.UUID] | None
    """The node ids this browser may see; None: every node. The route may replace it."""
    capacity: int = QUEUE_CAPACITY
    next_due: float = -math.inf
    skipped: int = 0
    """Frames dropped because the browser lagged a full queue behind."""
    closed: bool = False
    _frames: deque[str] = field(default_factory=deque)
    _arrived: trio.Event = field(default_factory=trio.Event)

    def put(self, frame: str) -> None:
        """Queue ``frame``; never blocks. A full mailbox drops its oldest frame."""
        if len(self._frames) >= self.capacity:
            self._frames.popleft()
            self.skipped += 1
        self._frames.append(frame)
        self._arrived.set()

    def pending(self) -> int:
        return len(self._frames)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> str:
        while not self._frames:
            if self.closed:
                raise StopAsyncIteration
            self._arrived = trio.Event()
            await self._arrived.wait()
        return self._frames.popleft()

    def close(self) -> None:
        self.closed = True
        self._arrived.set()


@dataclass(frozen=True, slots=True)
class _Snapshot:
    nodes: tuple[DashboardNode, ...]
    taken_at: datetime


class DashboardStream:
    """The producer of ``dashboard_update`` frames for every subscribed browser."""

    def __init__(
        self,
        rows: NodeRows,
        live: LiveNodes,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], datetime] = _utc_now,
        heartbeat_s: float = HEARTBEAT_S,
        queue_capacity: int = QUEUE_CAPACITY,
        rows_cache_s: float = NODE_ROWS_CACHE_S,
        interval_ms: Callable[[], Awaitable[int]],
    ) -> None:
        """``interval_ms`` reads ``stats_broadcast_interval_ms`` (the route passes the live
        setting, ``ManagerService.runtime_settings``); it is called once per snapshot."""
        self._rows = rows
        self._live = live
        self._clock = clock
        self._wall_clock = wall_clock
        self._heartbeat_s = heartbeat_s
        self._capacity = queue_capacity
        self._rows_cache_s = rows_cache_s
        self._interval_ms = interval_ms
        self._subscriptions: set[Subscription] = set()
        self._changed = trio.Event()
        self._cached_rows: list[NodeRecord] = []
        self._rows_read_at = -math.inf
        self.period_s = min(DEFAULT_INTERVAL_MS / 1000, heartbeat_s)
        """The period in force (updated on every snapshot)."""

    @property
    def subscriber_count(self) -> int:
        return len(self._subscriptions)

    @contextmanager
    def subscribe(self, visible: frozenset[uuid.UUID] | None) -> Iterator[Subscription]:
        """A mailbox for one browser for the duration of the ``with``; its first update is due now."""
        sub = Subscription(visible=visible, capacity=self._capacity)
        self._subscriptions.add(sub)
        self._changed.set()
        try:
            yield sub
        finally:
            self._subscriptions.discard(sub)
            sub.close()

    async def run(self) -> None:
        """Produce updates forever (until cancelled). Never raises for a store failure: it logs
        it and tries again :data:`RETRY_AFTER_FAILURE_S` later."""
        while True:
            now = self._clock()
            due = [sub for sub in self._subscriptions if sub.next_due <= now]
            if due:
                try:
                    snapshot = await self._snapshot()
                except Exception as exc:  # a store outage must not end the stream
                    _log.error("dashboard snapshot failed: %s", type(exc).__name__)
                    await trio.sleep(RETRY_AFTER_FAILURE_S)
                    continue
                self.publish(snapshot, due)
                continue
            wake = self._changed = trio.Event()
            deadline = min((sub.next_due for sub in self._subscriptions), default=math.inf)
            with trio.move_on_at(deadline):
                await wake.wait()

    def publish(self, snapshot: _Snapshot, due: Sequence[Subscription]) -> None:
        """Put the snapshot, filtered, into each mailbox of ``due``; schedule their next one."""
        next_due = self._clock() + self.period_s
        everyone: str | None = None
        for sub in due:
            if sub.closed:
                continue
            if sub.visible is None:
                if everyone is None:
                    everyone = self._frame(snapshot, snapshot.nodes)
                frame = everyone
            else:
                allowed = sub.visible
                frame = self._frame(snapshot, tuple(n for n in snapshot.nodes if uuid.UUID(n.node_id) in allowed))
            sub.put(frame)
            sub.next_due = next_due

    @staticmethod
    def _frame(snapshot: _Snapshot, nodes: tuple[DashboardNode, ...]) -> str:
        online = sum(1 for node in nodes if node.status in _CONNECTED_WIRE)
        message = DashboardUpdateMessage(
            timestamp=snapshot.taken_at, payload=DashboardPayload(nodes=list(nodes), online_count=online)
        )
        return encode(message)

    async def _snapshot(self) -> _Snapshot:
        interval_ms = await self._interval_ms()
        self.period_s = min(interval_ms / 1000, self._heartbeat_s)
        if self._clock() - self._rows_read_at >= self._rows_cache_s:
            self._cached_rows = await self._rows.list_nodes()
            self._rows_read_at = self._clock()
        nodes = tuple(self._node(record) for record in self._cached_rows)
        return _Snapshot(nodes=nodes, taken_at=self._wall_clock())

    def _node(self, record: NodeRecord) -> DashboardNode:
        live_status = self._live.live_status(record.id)
        stats = self._live.latest_stats(record.id) if live_status is not None else None
        health = self._live.latest_health(record.id) if live_status is not None else None
        if health is None and isinstance(record.last_health, dict):
            health = dict(record.last_health)
        status = live_status if live_status is not None else record.status
        if live_status is None and status in _CONNECTED:
            status = NodeStatus.OFFLINE  # a row not yet updated: no socket means not online
        uptime = _uptime(stats)
        if uptime is None and live_status is not None:
            uptime = _uptime(health)
        # A connected node's versions from its socket: the row is written a moment later.
        versions = self._live.live_versions(record.id) if live_status is not None else None
        software_version, protocol_version = versions or (record.software_version, record.protocol_version)
        return DashboardNode(
            node_id=str(record.id),
            name=record.name,
            device_type=ProtocolDeviceType(record.device_type.value),
            status=ProtocolNodeStatus(status.value),
            stats=stats,
            health=health,
            software_version=software_version,
            protocol_version=protocol_version,
            uptime_secs=uptime,
        )


def _uptime(payload: Mapping[str, object] | None) -> int | None:
    if payload is None:
        return None
    value = payload.get("uptime_secs")
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None
