"""Events (interop 6, 7.3): insert with truncation, the filtered and paged list, ack, count, retention."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import sqlalchemy as sa

from .errors import EventNotFound
from .records import EventFilter, EventPage, EventRecord, EventSeverity, NewEvent
from .tables import EVENT_MESSAGE_MAX, SHORT_TEXT_MAX, USERNAME_MAX, events

MAX_PER_PAGE: Final = 200  # interop 7.3
SEARCH_MAX: Final = 256  # interop 7.3: longer search terms are refused by the route


def _event(row: sa.Row[Any]) -> EventRecord:
    return EventRecord(
        id=row.id,
        node_id=None if row.node_id is None else UUID(row.node_id),
        severity=EventSeverity(row.severity),
        category=row.category,
        message=row.message,
        details=row.details,
        flow_id=row.flow_id,
        created_at=row.created_at,
        acknowledged=row.acknowledged,
        acknowledged_by=row.acknowledged_by,
        acknowledged_at=row.acknowledged_at,
    )


def _row_values(new: NewEvent, now: datetime) -> dict[str, Any]:
    # Interop 6: message truncated to 10 000 chars, category to 256. A flow id is at most 64
    # chars (interop 2.2), but a node's text is not trusted to the column's width.
    return {
        "node_id": None if new.node_id is None else str(new.node_id),
        "severity": EventSeverity(new.severity).value,
        "category": new.category[:SHORT_TEXT_MAX],
        "message": new.message[:EVENT_MESSAGE_MAX],
        "details": new.details,
        "flow_id": None if new.flow_id is None else new.flow_id[:SHORT_TEXT_MAX],
        "created_at": new.created_at or now,
        "acknowledged": False,
        "acknowledged_by": None,
        "acknowledged_at": None,
    }


def add_event(conn: sa.Connection, new: NewEvent, now: datetime) -> EventRecord:
    row = conn.execute(events.insert().values(_row_values(new, now)).returning(*events.c)).one()
    return _event(row)


def add_events(conn: sa.Connection, batch: Sequence[NewEvent], now: datetime) -> int:
    if batch:
        conn.execute(events.insert(), [_row_values(new, now) for new in batch])
    return len(batch)


def _conditions(where: EventFilter) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = []
    if where.node_id is not None:
        conditions.append(events.c.node_id == str(where.node_id))
    if where.node_ids is not None:
        # IN () is valid in SQLAlchemy (it renders an always-false expression) on both backends.
        conditions.append(events.c.node_id.in_(sorted(str(n) for n in where.node_ids)))
    if where.severity is not None:
        conditions.append(events.c.severity == EventSeverity(where.severity).value)
    if where.category is not None:
        conditions.append(events.c.category == where.category)
    if where.flow_id is not None:
        conditions.append(events.c.flow_id == where.flow_id)
    if where.acknowledged is not None:
        conditions.append(events.c.acknowledged.is_(where.acknowledged))
    if where.since is not None:
        conditions.append(events.c.created_at >= where.since)
    if where.until is not None:
        conditions.append(events.c.created_at <= where.until)
    if where.search:
        # ILIKE on PostgreSQL, lower() LIKE lower() on SQLite: case-insensitive on both;
        # autoescape makes % and _ in the term literal.
        term = where.search[:SEARCH_MAX]
        conditions.append(
            sa.or_(
                *(
                    column.icontains(term, autoescape=True)
                    for column in (events.c.message, events.c.category, events.c.node_id, events.c.severity)
                )
            )
        )
    return conditions


def query_events(conn: sa.Connection, where: EventFilter, page: int, per_page: int) -> EventPage:
    if page < 1 or not 1 <= per_page <= MAX_PER_PAGE:
        raise ValueError(f"page must be at least 1 and per_page 1 to {MAX_PER_PAGE}")
    conditions = _conditions(where)
    total = conn.execute(sa.select(sa.func.count()).select_from(events).where(*conditions)).scalar_one()
    rows = conn.execute(
        sa.select(events)
        .where(*conditions)
        .order_by(events.c.created_at.desc(), events.c.id.desc())  # interop 7.3: newest first
        .limit(per_page)
        .offset((page - 1) * per_page)
    )
    return EventPage(rows=[_event(row) for row in rows], total=int(total))


def get_event(conn: sa.Connection, event_id: int) -> EventRecord | None:
    row = conn.execute(sa.select(events).where(events.c.id == event_id)).one_or_none()
    return None if row is None else _event(row)


def acknowledge_event(conn: sa.Connection, event_id: int, acknowledged_by: str, now: datetime) -> EventRecord:
    # Interop 7.3: idempotent; the first acknowledgement's who and when are kept.
    conn.execute(
        events.update()
        .where(events.c.id == event_id, events.c.acknowledged.is_(False))
        .values(acknowledged=True, acknowledged_by=acknowledged_by[:USERNAME_MAX], acknowledged_at=now)
    )
    record = get_event(conn, event_id)
    if record is None:
        raise EventNotFound(event_id)
    return record


def count_unacknowledged(conn: sa.Connection) -> dict[EventSeverity, int]:
    rows = conn.execute(
        sa.select(events.c.severity, sa.func.count())
        .where(events.c.acknowledged.is_(False))
        .group_by(events.c.severity)
    )
    counts = dict.fromkeys(EventSeverity, 0)
    for severity, count in rows:
        counts[EventSeverity(severity)] = int(count)
    return counts


def delete_events_before(conn: sa.Connection, cutoff: datetime) -> int:
    return conn.execute(events.delete().where(events.c.created_at < cutoff)).rowcount
