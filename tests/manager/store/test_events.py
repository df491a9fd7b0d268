"""Events: truncation, every filter, search, pagination with its total, ack, counts, retention."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from services.manager.store import (
    EventFilter,
    EventNotFound,
    EventSeverity,
    NewEvent,
    Store,
)
from tests.manager.store.conftest import START, FakeClock

NODE_A = uuid.UUID("5b0c7d4e-1f2a-4b3c-8d9e-0a1b2c3d4e5f")
NODE_B = uuid.UUID("9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a")
INFO, WARNING, CRITICAL = EventSeverity.INFO, EventSeverity.WARNING, EventSeverity.CRITICAL


def event(message: str = "Flow started", **overrides: object) -> NewEvent:
    fields: dict[str, object] = {"node_id": NODE_A, "severity": INFO, "category": "flow", "message": message}
    fields.update(overrides)
    return NewEvent(**fields)  # type: ignore[arg-type]


async def test_add_and_read_back(store: Store, clock: FakeClock) -> None:
    details = {"input": "rtp://239.1.1.1:5000", "lost": [1, 2], "ok": False}
    stored = await store.add_event(event(details=details, flow_id="cam1"))
    assert stored.id > 0
    assert stored.node_id == NODE_A and stored.severity is INFO and stored.category == "flow"
    assert stored.details == details and stored.flow_id == "cam1"
    assert stored.created_at == START
    assert (stored.acknowledged, stored.acknowledged_by, stored.acknowledged_at) == (False, None, None)
    assert await store.get_event(stored.id) == stored
    assert await store.get_event(stored.id + 1000) is None

    # A node's own timestamp, when given, is kept; an event may have no node.
    at = START - timedelta(minutes=5)
    own = await store.add_event(event(node_id=None, created_at=at))
    assert own.created_at == at and own.node_id is None and own.details is None


async def test_text_from_a_node_is_truncated(store: Store) -> None:
    stored = await store.add_event(event("m" * 10_500, category="c" * 300, flow_id="f" * 300))
    assert stored.message == "m" * 10_000  # interop 6
    assert stored.category == "c" * 256
    assert stored.flow_id == "f" * 256
    assert await store.get_event(stored.id) == stored


def test_an_unknown_severity_from_a_node_is_info() -> None:
    assert EventSeverity.from_wire("critical") is CRITICAL
    assert EventSeverity.from_wire("error") is INFO  # interop 11: there is no error severity
    assert EventSeverity.from_wire(None) is INFO
    assert EventSeverity.from_wire(3) is INFO


async def seed(store: Store, clock: FakeClock) -> list[int]:
    """Six events a minute apart (ids in insertion order), over two nodes and three severities."""
    rows = [
        event("Flow started", flow_id="cam1"),
        event("Input lost", severity=CRITICAL, flow_id="cam1"),
        event("SRT caller connected", category="srt", node_id=NODE_B, flow_id="cam2"),
        event("Leg 2 lost", severity=WARNING, category="redundancy", flow_id="cam1"),
        event("Disk at 95%_full", severity=WARNING, category="system", node_id=NODE_B),
        event("Node connected to manager", category="connection", node_id=NODE_B),
    ]
    ids = []
    for row in rows:
        ids.append((await store.add_event(row)).id)
        clock.advance(timedelta(minutes=1))
    return ids


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (EventFilter(), [5, 4, 3, 2, 1, 0]),
        (EventFilter(node_id=NODE_B), [5, 4, 2]),
        (EventFilter(severity=WARNING), [4, 3]),
        (EventFilter(category="flow"), [1, 0]),
        (EventFilter(flow_id="cam1"), [3, 1, 0]),
        (EventFilter(since=START + timedelta(minutes=2)), [5, 4, 3, 2]),  # inclusive
        (EventFilter(until=START + timedelta(minutes=2)), [2, 1, 0]),  # inclusive
        (EventFilter(since=START + timedelta(minutes=1), until=START + timedelta(minutes=3)), [3, 2, 1]),
        (EventFilter(node_id=NODE_A, severity=WARNING), [3]),
        (EventFilter(search="LOST"), [3, 1]),  # case-insensitive, in the message
        (EventFilter(search="redund"), [3]),  # in the category
        (EventFilter(search="critical"), [1]),  # in the severity
        (EventFilter(search=str(NODE_B)[:13]), [5, 4, 2]),  # in the node id, hyphens and all
        (EventFilter(search="95%_"), [4]),  # % and _ are literal
        (EventFilter(search="5%"), [4]),
        (EventFilter(search="nothing like this"), []),
    ],
)
async def test_filters(store: Store, clock: FakeClock, where: EventFilter, expected: list[int]) -> None:
    ids = await seed(store, clock)
    page = await store.query_events(where)
    assert [row.id for row in page.rows] == [ids[i] for i in expected]
    assert page.total == len(expected)


async def test_acknowledged_filter(store: Store, clock: FakeClock) -> None:
    ids = await seed(store, clock)
    await store.acknowledge_event(ids[1], "alice")
    acknowledged = await store.query_events(EventFilter(acknowledged=True))
    pending = await store.query_events(EventFilter(acknowledged=False))
    assert [row.id for row in acknowledged.rows] == [ids[1]]
    assert ids[1] not in [row.id for row in pending.rows] and pending.total == 5


async def test_pagination_newest_first_with_the_total(store: Store, clock: FakeClock) -> None:
    ids = [(await store.add_event(event(f"event {i}"))).id for i in range(7)]  # all at one instant
    clock.advance(timedelta(seconds=1))
    newest = (await store.add_event(event("newest"))).id
    clock.advance(timedelta(seconds=1))
    older = (await store.add_event(event("older", created_at=START - timedelta(hours=1)))).id

    pages = [await store.query_events(page=n, per_page=4) for n in (1, 2, 3, 4)]
    assert [page.total for page in pages] == [9, 9, 9, 9]
    assert [len(page.rows) for page in pages] == [4, 4, 1, 0]
    order = [row.id for page in pages for row in page.rows]
    # By created_at, then id, newest first: a late-arriving older event sorts by its own time.
    assert order == [newest, *reversed(ids), older]

    filtered = await store.query_events(EventFilter(search="event"), page=2, per_page=5)
    assert filtered.total == 7 and [row.id for row in filtered.rows] == [ids[1], ids[0]]


@pytest.mark.parametrize(("page", "per_page"), [(0, 50), (1, 0), (1, 201)])
async def test_pagination_bounds(store: Store, page: int, per_page: int) -> None:
    with pytest.raises(ValueError):
        await store.query_events(page=page, per_page=per_page)


async def test_per_page_200_is_allowed(store: Store) -> None:
    await store.add_events([event(f"e{i}") for i in range(201)])
    page = await store.query_events(per_page=200)
    assert len(page.rows) == 200 and page.total == 201


async def test_acknowledge_is_idempotent_and_keeps_the_first(store: Store, clock: FakeClock) -> None:
    stored = await store.add_event(event(severity=CRITICAL))
    first = clock.advance(timedelta(minutes=1))
    acked = await store.acknowledge_event(stored.id, "alice")
    assert (acked.acknowledged, acked.acknowledged_by, acked.acknowledged_at) == (True, "alice", first)
    clock.advance(timedelta(minutes=1))
    again = await store.acknowledge_event(stored.id, "bob")
    assert again == acked
    with pytest.raises(EventNotFound):
        await store.acknowledge_event(stored.id + 1000, "alice")


async def test_unacknowledged_counts(store: Store, clock: FakeClock) -> None:
    assert await store.count_unacknowledged_events() == {INFO: 0, WARNING: 0, CRITICAL: 0}
    assert await store.count_unacknowledged_alerts() == 0
    ids = await seed(store, clock)  # 3 info, 2 warning, 1 critical
    assert await store.count_unacknowledged_events() == {INFO: 3, WARNING: 2, CRITICAL: 1}
    assert await store.count_unacknowledged_alerts() == 3  # interop 7.3: warning + critical

    await store.acknowledge_event(ids[1], "alice")  # the critical one
    await store.acknowledge_event(ids[0], "alice")  # an info one
    assert await store.count_unacknowledged_events() == {INFO: 2, WARNING: 2, CRITICAL: 0}
    assert await store.count_unacknowledged_alerts() == 2


async def test_retention_deletes_only_older_events(store: Store, clock: FakeClock) -> None:
    old = await store.add_event(event("old", created_at=START - timedelta(days=31)))
    edge = await store.add_event(event("edge", created_at=START - timedelta(days=30)))
    recent = await store.add_event(event("recent", created_at=START - timedelta(days=1)))
    assert await store.delete_events_older_than(timedelta(days=30)) == 1
    assert await store.get_event(old.id) is None
    assert await store.get_event(edge.id) is not None  # exactly 30 days old: kept
    assert await store.get_event(recent.id) is not None
    assert await store.delete_events_older_than(timedelta(days=30)) == 0


async def test_add_events_in_one_batch(store: Store) -> None:
    assert await store.add_events([]) == 0
    assert await store.add_events([event(f"queued {i} " + "x" * 10_001) for i in range(3)]) == 3
    page = await store.query_events()
    assert page.total == 3 and all(len(row.message) == 10_000 for row in page.rows)


async def test_a_set_of_node_ids_limits_the_page_and_the_total(store: Store) -> None:
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for node_id in (first, second, third, None):
        await store.add_event(NewEvent(node_id=node_id, severity=EventSeverity.INFO, category="c", message="m"))

    page = await store.query_events(EventFilter(node_ids=frozenset({first, third})))
    assert page.total == 2 and {e.node_id for e in page.rows} == {first, third}
    none = await store.query_events(EventFilter(node_ids=frozenset()))
    assert (none.total, none.rows) == (0, [])
    both = await store.query_events(EventFilter(node_ids=frozenset({first, second}), node_id=second))
    assert [e.node_id for e in both.rows] == [second]
