"""The dashboard stream's producer (services/manager/dashboard.py) on trio's mock clock.

Pacing, the 5 s floor, live interval changes, the viewer filter, a lagging browser skipping
frames while the others keep their pace, and a store failure that does not end the stream.
"""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio
import trio.testing

from services.manager.dashboard import DashboardStream, Subscription
from services.manager.store import DeviceType, NodeRecord, NodeStatus

EPOCH = datetime(2026, 11, 21, 15, 4, 5, tzinfo=UTC)


def _record(name: str, status: NodeStatus = NodeStatus.OFFLINE, **kwargs: Any) -> NodeRecord:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "name": name,
        "description": None,
        "device_type": DeviceType.EDGE,
        "status": status,
        "expires_at": None,
        "software_version": "0.3.0",
        "protocol_version": 1,
        "last_seen_at": None,
        "last_health": None,
        "metadata": None,
        "config_cached_at": None,
        "created_at": EPOCH,
        "updated_at": EPOCH,
    }
    values.update(kwargs)
    return NodeRecord(**values)


class FakeRows:
    def __init__(self, records: list[NodeRecord]) -> None:
        self.records = records
        self.reads = 0
        self.failing = False

    async def list_nodes(self) -> list[NodeRecord]:
        self.reads += 1
        if self.failing:
            raise RuntimeError("database down")
        return list(self.records)


class FakeHub:
    def __init__(self) -> None:
        self.status: dict[uuid.UUID, NodeStatus] = {}
        self.stats: dict[uuid.UUID, dict[str, object]] = {}
        self.health: dict[uuid.UUID, dict[str, object]] = {}
        self.versions: dict[uuid.UUID, tuple[str, int]] = {}

    def live_status(self, node_id: uuid.UUID) -> NodeStatus | None:
        return self.status.get(node_id)

    def latest_stats(self, node_id: uuid.UUID) -> dict[str, object] | None:
        return self.stats.get(node_id)

    def latest_health(self, node_id: uuid.UUID) -> dict[str, object] | None:
        return self.health.get(node_id)

    def live_versions(self, node_id: uuid.UUID) -> tuple[str, int] | None:
        return self.versions.get(node_id)


class Interval:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    async def __call__(self) -> int:
        return self.ms


def _wall() -> datetime:
    return EPOCH + timedelta(seconds=trio.current_time())


def _stream(rows: FakeRows, hub: FakeHub, interval: Interval, **kwargs: Any) -> DashboardStream:
    return DashboardStream(rows, hub, interval_ms=interval, wall_clock=_wall, **kwargs)


async def _collect(sub: Subscription, count: int) -> list[tuple[float, dict[str, Any]]]:
    got = []
    async for frame in sub:
        got.append((trio.current_time(), json.loads(frame)))
        if len(got) == count:
            break
    return got


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(times)]


async def test_first_update_at_once_then_one_per_interval(autojump_clock: trio.testing.MockClock) -> None:
    edge = _record("ob-truck-3")
    rows, hub = FakeRows([edge]), FakeHub()
    hub.status[edge.id] = NodeStatus.ONLINE
    hub.stats[edge.id] = {"flows": [], "uptime_secs": 42, "active_flows": 0, "total_flows": 0}
    hub.health[edge.id] = {"status": "ok", "uptime_secs": 41}
    stream = _stream(rows, hub, Interval(250))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        await trio.sleep(10)  # nothing is built while nobody listens
        assert rows.reads == 0
        start = trio.current_time()
        with stream.subscribe(None) as sub:
            got = await _collect(sub, 6)
        nursery.cancel_scope.cancel()
    times = [t for t, _ in got]
    assert times[0] == start
    assert _gaps(times) == [0.25] * 5
    message = got[0][1]
    assert message["type"] == "dashboard_update"
    assert message["timestamp"].endswith("Z")
    assert message["payload"] == {
        "nodes": [
            {
                "node_id": str(edge.id),
                "name": "ob-truck-3",
                "device_type": "edge",
                "status": "online",
                "stats": hub.stats[edge.id],
                "health": hub.health[edge.id],
                "software_version": "0.3.0",
                "protocol_version": 1,
                "uptime_secs": 42,
            }
        ],
        "online_count": 1,
    }


async def test_an_interval_over_5_s_still_sends_every_5_s_and_changes_apply_live(
    autojump_clock: trio.testing.MockClock,
) -> None:
    interval = Interval(60000)
    stream = _stream(FakeRows([_record("a")]), FakeHub(), interval)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        with stream.subscribe(None) as sub:
            slow = await _collect(sub, 3)
            interval.ms = 100
            fast = await _collect(sub, 4)
        nursery.cancel_scope.cancel()
    assert _gaps([t for t, _ in slow]) == [5.0, 5.0]
    # The update already scheduled keeps its time; the ones after it follow the new interval.
    assert _gaps([t for t, _ in fast])[1:] == [0.1, 0.1]


async def test_a_viewer_sees_only_its_allowed_nodes(autojump_clock: trio.testing.MockClock) -> None:
    a, b, c = _record("a"), _record("b"), _record("c", status=NodeStatus.ONLINE)  # c: stale row, no socket
    hub = FakeHub()
    hub.status[a.id] = NodeStatus.DEGRADED
    hub.status[b.id] = NodeStatus.ONLINE
    stream = _stream(FakeRows([a, b, c]), hub, Interval(1000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        with stream.subscribe(frozenset({a.id, c.id})) as viewer, stream.subscribe(None) as admin:
            (_, seen), *_ = await _collect(viewer, 1)
            (_, everything), *_ = await _collect(admin, 1)
        nursery.cancel_scope.cancel()
    assert [(n["name"], n["status"]) for n in seen["payload"]["nodes"]] == [("a", "degraded"), ("c", "offline")]
    assert seen["payload"]["online_count"] == 1
    assert [n["name"] for n in everything["payload"]["nodes"]] == ["a", "b", "c"]
    assert everything["payload"]["online_count"] == 2
    assert everything["payload"]["nodes"][2]["stats"] is None


async def test_a_lagging_browser_skips_frames_and_delays_nobody(autojump_clock: trio.testing.MockClock) -> None:
    stream = _stream(FakeRows([_record("a")]), FakeHub(), Interval(100), queue_capacity=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        with stream.subscribe(None) as lagging, stream.subscribe(None) as reader:
            got = await _collect(reader, 20)  # the lagging one never reads meanwhile
            assert lagging.pending() == 4
            assert lagging.skipped == 16
            kept = [json.loads(frame)["timestamp"] for frame in await _drain(lagging, 4)]
        nursery.cancel_scope.cancel()
    assert _gaps([t for t, _ in got]) == [0.1] * 19
    # It kept the newest four: the same as the reader's last four.
    assert kept == [message["timestamp"] for _, message in got[-4:]]


async def _drain(sub: Subscription, count: int) -> list[str]:
    frames = []
    async for frame in sub:
        frames.append(frame)
        if len(frames) == count:
            break
    return frames


async def test_a_store_failure_does_not_end_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    rows = FakeRows([_record("a")])
    rows.failing = True
    stream = _stream(rows, FakeHub(), Interval(1000), rows_cache_s=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        with stream.subscribe(None) as sub:
            await trio.sleep(3.5)
            assert sub.pending() == 0 and rows.reads >= 3
            rows.failing = False
            (_, message), *_ = await _collect(sub, 1)
        nursery.cancel_scope.cancel()
    assert message["payload"]["nodes"][0]["name"] == "a"


async def test_node_rows_are_cached_briefly_between_browsers(autojump_clock: trio.testing.MockClock) -> None:
    rows = FakeRows([_record("a")])
    stream = _stream(rows, FakeHub(), Interval(1000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        with stream.subscribe(None) as first:
            await _collect(first, 1)
            await trio.sleep(0.1)
            with stream.subscribe(None) as second:
                await _collect(second, 1)
        nursery.cancel_scope.cancel()
    assert rows.reads == 1
    assert stream.subscriber_count == 0


@pytest.mark.parametrize("uptime", [None, "12", True, -1])
async def test_a_bad_uptime_is_left_out(uptime: object, autojump_clock: trio.testing.MockClock) -> None:
    node = _record("a")
    hub = FakeHub()
    hub.status[node.id] = NodeStatus.ONLINE
    hub.stats[node.id] = {"flows": [], "uptime_secs": uptime}
    stream = _stream(FakeRows([node]), hub, Interval(1000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.run)
        with stream.subscribe(None) as sub:
            (_, message), *_ = await _collect(sub, 1)
        nursery.cancel_scope.cancel()
    assert message["payload"]["nodes"][0]["uptime_secs"] is None
