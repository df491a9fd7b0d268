"""The fleet's coordination in PostgreSQL: instances, node connections, the outbox, live views.

Plain functions on a ``Connection`` inside the caller's transaction, as the rest of the store;
``Store`` wraps them for trio. Only PostgreSQL runs them (``services.manager.fleet`` is off on
SQLite): upserts use ``INSERT … ON CONFLICT`` and the outbox wakes listeners with ``pg_notify``,
which PostgreSQL delivers when the transaction commits (so a listener never wakes before the
row it is told about is visible).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from .events import add_events
from .records import EventSeverity, NewEvent, NodeStatus
from .tables import fleet_live, fleet_messages, manager_instances, node_connections, nodes

NOTIFY_CHANNEL = "mediaplane_fleet"
"""The LISTEN/NOTIFY channel; the payload names the target instance, or ``*`` for all."""

_CONNECTED = (NodeStatus.ONLINE.value, NodeStatus.DEGRADED.value, NodeStatus.ERROR.value)


@dataclass(frozen=True, slots=True)
class FleetMessage:
    """One outbox row as read by its receiver."""

    id: int
    target: UUID | None
    sender: UUID
    kind: str
    body: str


def register_instance(conn: sa.Connection, instance_id: UUID, name: str, now: datetime) -> None:
    conn.execute(manager_instances.insert().values(id=instance_id, name=name[:256], started_at=now, heartbeat_at=now))


def remove_instance(conn: sa.Connection, instance_id: UUID) -> None:
    """A clean stop: this instance's rows go now rather than lapse (its nodes reconnect elsewhere)."""
    conn.execute(fleet_live.delete().where(fleet_live.c.instance_id == instance_id))
    conn.execute(manager_instances.delete().where(manager_instances.c.id == instance_id))


def beat(
    conn: sa.Connection, instance_id: UUID, live_body: str, now: datetime, lease: timedelta, fresh: timedelta
) -> list[tuple[UUID, str]]:
    """The heartbeat: this instance's row, the lease on its node connections and its live view
    pushed forward; returns the other instances' live views published within ``fresh``."""
    found = conn.execute(
        manager_instances.update().where(manager_instances.c.id == instance_id).values(heartbeat_at=now)
    ).rowcount
    if not found:  # swept as dead after a long stall: register again
        conn.execute(manager_instances.insert().values(id=instance_id, name="", started_at=now, heartbeat_at=now))
    conn.execute(
        node_connections.update().where(node_connections.c.instance_id == instance_id).values(expires_at=now + lease)
    )
    upsert = postgresql.insert(fleet_live).values(instance_id=instance_id, body=live_body, updated_at=now)
    conn.execute(
        upsert.on_conflict_do_update(
            index_elements=[fleet_live.c.instance_id], set_={"body": live_body, "updated_at": now}
        )
    )
    rows = conn.execute(
        sa.select(fleet_live.c.instance_id, fleet_live.c.body).where(
            fleet_live.c.instance_id != instance_id, fleet_live.c.updated_at > now - fresh
        )
    ).all()
    return [(row.instance_id, row.body) for row in rows]


def claim_node(conn: sa.Connection, node_id: UUID, instance_id: UUID, now: datetime, lease: timedelta) -> None:
    """This instance holds the node's socket now (a newer connection wins over an older row)."""
    upsert = postgresql.insert(node_connections).values(
        node_id=node_id, instance_id=instance_id, connected_at=now, expires_at=now + lease
    )
    conn.execute(
        upsert.on_conflict_do_update(
            index_elements=[node_connections.c.node_id],
            set_={"instance_id": instance_id, "connected_at": now, "expires_at": now + lease},
        )
    )


def release_node(conn: sa.Connection, node_id: UUID, instance_id: UUID) -> bool:
    """The socket closed; whether this instance still held the node (False: another took it over)."""
    result = conn.execute(
        node_connections.delete().where(
            node_connections.c.node_id == node_id, node_connections.c.instance_id == instance_id
        )
    )
    return result.rowcount > 0


HOLDER_SILENT: Final = timedelta(seconds=3)
"""An instance whose heartbeat (every second) is this old is taken for dead when routing: a
command to its nodes fails at once (502) instead of waiting out the reply timeout (504), while
the lease (10 s) still keeps a survivor from marking them offline too early."""


def holder_of(conn: sa.Connection, node_id: UUID, now: datetime) -> UUID | None:
    """The instance holding the node's socket under a live lease and beating, or None."""
    return conn.execute(
        sa.select(node_connections.c.instance_id)
        .join(manager_instances, manager_instances.c.id == node_connections.c.instance_id)
        .where(
            node_connections.c.node_id == node_id,
            node_connections.c.expires_at > now,
            manager_instances.c.heartbeat_at > now - HOLDER_SILENT,
        )
    ).scalar_one_or_none()


def send_message(conn: sa.Connection, sender: UUID, target: UUID | None, kind: str, body: str, now: datetime) -> int:
    """Appends to the outbox and wakes the listeners when the transaction commits."""
    message_id = conn.execute(
        fleet_messages.insert()
        .values(target=target, sender=sender, kind=kind, body=body, created_at=now)
        .returning(fleet_messages.c.id)
    ).scalar_one()
    conn.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, str(target) if target is not None else "*")))
    return int(message_id)


def take_messages(conn: sa.Connection, instance_id: UUID, limit: int) -> list[FleetMessage]:
    """The messages addressed to this instance, removed as they are read: each is taken once,
    whatever order their ids committed in (a cursor over ids could skip a late commit)."""
    oldest = (
        sa.select(fleet_messages.c.id)
        .where(fleet_messages.c.target == instance_id)
        .order_by(fleet_messages.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    rows = conn.execute(
        fleet_messages.delete().where(fleet_messages.c.id.in_(oldest.scalar_subquery())).returning(*fleet_messages.c)
    ).all()
    return sorted((_message(row) for row in rows), key=lambda m: m.id)


def broadcasts_since(conn: sa.Connection, since: datetime, exclude: Sequence[int]) -> list[FleetMessage]:
    """Messages to every instance created at or after ``since``, except the ids already seen."""
    query = sa.select(fleet_messages).where(fleet_messages.c.target.is_(None), fleet_messages.c.created_at >= since)
    if exclude:
        query = query.where(fleet_messages.c.id.not_in(list(exclude)))
    return [_message(row) for row in conn.execute(query.order_by(fleet_messages.c.id)).all()]


def _message(row: sa.Row[tuple[object, ...]]) -> FleetMessage:
    mapping = row._mapping
    return FleetMessage(
        id=int(mapping["id"]),
        target=mapping["target"],
        sender=mapping["sender"],
        kind=str(mapping["kind"]),
        body=str(mapping["body"]),
    )


def sweep(conn: sa.Connection, now: datetime, *, message_age: timedelta, instance_age: timedelta) -> list[UUID]:
    """Lapsed connections (their instance died): those nodes go offline with interop 6's
    "Node disconnected from manager" event. ``DELETE … RETURNING`` gives each lapsed row to
    exactly one sweeping instance. Also drops dead instances and old messages. Returns the nodes."""
    lapsed = [
        row.node_id
        for row in conn.execute(
            node_connections.delete().where(node_connections.c.expires_at <= now).returning(node_connections.c.node_id)
        ).all()
    ]
    if lapsed:
        marked = conn.execute(
            nodes.update()
            .where(nodes.c.id.in_(lapsed), nodes.c.status.in_(_CONNECTED))
            .values(status=NodeStatus.OFFLINE.value)
            .returning(nodes.c.id)
        ).all()
        add_events(
            conn,
            [
                NewEvent(
                    node_id=row.id,
                    severity=EventSeverity.CRITICAL,
                    category="connection",
                    message="Node disconnected from manager",
                    details={"reason": "its manager instance stopped answering"},
                )
                for row in marked
            ],
            now,
        )
    conn.execute(manager_instances.delete().where(manager_instances.c.heartbeat_at <= now - instance_age))
    conn.execute(fleet_live.delete().where(fleet_live.c.updated_at <= now - instance_age))
    conn.execute(fleet_messages.delete().where(fleet_messages.c.created_at <= now - message_age))
    return lapsed


def mark_orphans_offline(conn: sa.Connection, now: datetime) -> int:
    """At start in a fleet: ``online`` nodes that no instance holds under a live lease go
    offline (the one-box start marks every node offline; here others may hold theirs)."""
    held = sa.select(node_connections.c.node_id).where(node_connections.c.expires_at > now)
    result = conn.execute(
        nodes.update()
        .where(nodes.c.status.in_(_CONNECTED), nodes.c.id.not_in(held))
        .values(status=NodeStatus.OFFLINE.value)
    )
    return result.rowcount


def try_advisory_xact_lock(conn: sa.Connection, key: int) -> bool:
    """``pg_try_advisory_xact_lock``: held until this transaction ends, by one session at a time."""
    return bool(conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(key))).scalar_one())
