"""The edge event bus: numbering, the ring, ``since``, the journal line, listeners, timestamps."""

from __future__ import annotations

import logging
import re

import pytest

from appliance.models.events import EventCategory, Severity, StoredEvent, critical, info, warning
from services.edge.events import EventBus, journal_line, rfc3339_utc_ms

T0 = 1_795_770_723.412  # 2026-11-27T09:12:03.412Z


def clock_at(t: float) -> list[float]:
    return [t]


def test_ids_start_at_one_and_increase_by_one() -> None:
    bus = EventBus(clock=lambda: T0)
    assert bus.last_id == 0 and bus.since(0) == []
    stored = [bus.publish(info(EventCategory.FLOW, f"flow started {n}", flow_id="f")) for n in range(5)]
    assert [e.id for e in stored] == [1, 2, 3, 4, 5]
    assert bus.last_id == 5
    assert isinstance(stored[0], StoredEvent)
    assert (
        stored[0].model_dump(exclude={"id", "timestamp"})
        == info(EventCategory.FLOW, "flow started 0", flow_id="f").model_dump()
    )


def test_the_ring_keeps_the_last_capacity_events_and_ids_are_never_reused() -> None:
    bus = EventBus(clock=lambda: T0)
    for n in range(1005):
        bus.publish(info(EventCategory.FLOW, f"e{n + 1}"))
    kept = bus.since(0)
    assert len(kept) == 1000
    assert [e.id for e in kept] == list(range(6, 1006))
    assert [e.message for e in kept[:2]] == ["e6", "e7"]
    assert bus.last_id == 1005
    assert bus.publish(info(EventCategory.FLOW, "next")).id == 1006  # not 1001: ids outlive the ring


def test_a_small_ring() -> None:
    bus = EventBus(capacity=3, clock=lambda: T0)
    for n in range(7):
        bus.publish(warning(EventCategory.SRT, f"e{n + 1}"))
    assert [e.id for e in bus.since(0)] == [5, 6, 7]
    with pytest.raises(ValueError):
        EventBus(capacity=0)


@pytest.mark.parametrize(
    ("since", "limit", "ids"),
    [
        (0, None, [3, 4, 5, 6, 7, 8]),  # everything kept (1 and 2 were dropped)
        (1, None, [3, 4, 5, 6, 7, 8]),  # asked from a dropped id: the oldest kept
        (2, None, [3, 4, 5, 6, 7, 8]),
        (3, None, [4, 5, 6, 7, 8]),
        (7, None, [8]),
        (8, None, []),  # nothing newer
        (99, None, []),  # ahead of the bus (an edge that restarted): nothing
        (0, 2, [3, 4]),  # a limit keeps the oldest, so the client pages on from 4
        (4, 2, [5, 6]),
        (7, 2, [8]),
        (3, 0, []),
    ],
)
def test_since(since: int, limit: int | None, ids: list[int]) -> None:
    bus = EventBus(capacity=6, clock=lambda: T0)
    for n in range(8):
        bus.publish(info(EventCategory.FLOW, f"e{n + 1}"))
    assert [e.id for e in bus.since(since, limit)] == ids


def test_the_timestamp_is_rfc3339_utc_with_milliseconds_from_the_clock() -> None:
    now = clock_at(T0)
    bus = EventBus(clock=lambda: now[0])
    assert bus.publish(info(EventCategory.FLOW, "a")).timestamp == "2026-11-27T09:12:03.412Z"
    now[0] = 0.0
    assert bus.publish(info(EventCategory.FLOW, "b")).timestamp == "1970-01-01T00:00:00.000Z"
    now[0] = 1_795_770_723.9999  # truncated to the millisecond, never rounded into the next second
    assert bus.publish(info(EventCategory.FLOW, "c")).timestamp == "2026-11-27T09:12:03.999Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rfc3339_utc_ms(1_234_567_890.5))
    assert rfc3339_utc_ms(1_234_567_890.5) == "2009-02-13T23:31:30.500Z"


def test_the_default_clock_is_wall_time() -> None:
    stored = EventBus().publish(info(EventCategory.CONFIG, "config applied"))
    assert stored.timestamp.startswith(("202", "203"))


@pytest.mark.parametrize(
    ("event", "level", "line"),
    [
        (
            warning(EventCategory.SRT, "SRT peer 127.0.0.1:9000 disconnected", flow_id="cam1"),
            logging.WARNING,
            "event 1 warning srt flow=cam1: SRT peer 127.0.0.1:9000 disconnected",
        ),
        (info(EventCategory.MANAGER, "connected"), logging.INFO, "event 1 info manager: connected"),
        (
            critical(EventCategory.FLOW, "input lost", flow_id="cam2", output_id="o1", legs=[1, 2]),
            logging.ERROR,
            'event 1 critical flow flow=cam2: input lost {"output_id":"o1","legs":[1,2]}',
        ),
        (
            info(EventCategory.FLOW, "two\nlines\\ here\r", flow_id="f"),
            logging.INFO,
            "event 1 info flow flow=f: two\\nlines\\\\ here\\r",
        ),
    ],
)
def test_one_journal_line_per_event_at_the_severity_level(
    caplog: pytest.LogCaptureFixture, event: object, level: int, line: str
) -> None:
    bus = EventBus(clock=lambda: T0)
    with caplog.at_level(logging.DEBUG, logger="mediaplane.events"):
        stored = bus.publish(event)  # type: ignore[arg-type]
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("mediaplane.events", level, line)]
    assert journal_line(stored) == line
    assert "\n" not in caplog.records[0].getMessage()


def test_every_severity_has_a_level(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus(clock=lambda: T0)
    with caplog.at_level(logging.DEBUG, logger="mediaplane.events"):
        for severity in Severity:
            bus.publish(info(EventCategory.FLOW, "x").model_copy(update={"severity": severity}))
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING, logging.ERROR]


def test_listeners_get_each_event_and_a_failing_one_is_isolated(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus(clock=lambda: T0)
    first: list[StoredEvent] = []
    last: list[StoredEvent] = []

    def broken(event: StoredEvent) -> None:
        raise RuntimeError(f"listener broke on {event.id}")

    bus.listeners.extend([first.append, broken, last.append])
    with caplog.at_level(logging.DEBUG, logger="mediaplane.events"):
        one = bus.publish(warning(EventCategory.REDUNDANCY, "leg 2 lost", flow_id="f"))
        two = bus.publish(info(EventCategory.REDUNDANCY, "leg 2 restored", flow_id="f"))
    assert first == [one, two] and last == [one, two]
    assert bus.since(0) == [one, two]
    failures = [r for r in caplog.records if r.exc_info]
    assert len(failures) == 2  # one record (with its traceback) per failure
    assert failures[0].levelno == logging.ERROR and "event 1: listener" in failures[0].getMessage()
    assert failures[0].exc_info is not None and str(failures[0].exc_info[1]) == "listener broke on 1"
    journal = [r for r in caplog.records if not r.exc_info]
    assert [r.getMessage() for r in journal] == [
        "event 1 warning redundancy flow=f: leg 2 lost",
        "event 2 info redundancy flow=f: leg 2 restored",
    ]


def test_a_listener_may_remove_itself() -> None:
    bus = EventBus(clock=lambda: T0)
    seen: list[int] = []

    def once(event: StoredEvent) -> None:
        seen.append(event.id)
        bus.listeners.remove(once)

    bus.listeners.extend([once, lambda e: seen.append(-e.id)])
    bus.publish(info(EventCategory.FLOW, "a"))
    bus.publish(info(EventCategory.FLOW, "b"))
    assert seen == [1, -1, -2]


def test_a_stored_event_round_trips_as_the_api_serves_it() -> None:
    stored = EventBus(clock=lambda: T0).publish(critical(EventCategory.SRT, "connection failed", flow_id="s", code=5))
    dumped = stored.model_dump(mode="json")
    assert dumped == {
        "severity": "critical",
        "category": "srt",
        "message": "connection failed",
        "details": {"code": 5},
        "flow_id": "s",
        "id": 1,
        "timestamp": "2026-11-27T09:12:03.412Z",
    }
    assert StoredEvent.model_validate_json(stored.model_dump_json()) == stored
