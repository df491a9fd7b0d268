"""Nodes (interop 6, 7.2): registration, credentials, runtime state and the cached config.

``updated_at`` moves when the node's record changes (metadata, token, credentials),
not with runtime state (status, last seen, health, versions, cached config), which a
connected node changes every few seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final
from uuid import UUID, uuid4

import sqlalchemy as sa

from .engine import constraint_errors
from .errors import Duplicate, NodeNotFound
from .records import (
    CachedConfig,
    DeviceType,
    NewNode,
    NodeChanges,
    NodeCredentials,
    NodeRecord,
    NodeRuntime,
    NodeStatus,
)
from .tables import SHORT_TEXT_MAX, nodes

_CHANGEABLE: Final = frozenset(NodeChanges.__annotations__)
_RUNTIME: Final = frozenset(NodeRuntime.__annotations__)

# Everything a NodeRecord is built from: never the secret, the token digest or the config.
_PUBLIC_COLUMNS: Final = tuple(
    c for c in nodes.c if c.name not in {"registration_token_digest", "cached_config"} and "secret" not in c.name
)


def _node(row: sa.Row[Any]) -> NodeRecord:
    return NodeRecord(
        id=row.id,
        name=row.name,
        description=row.description,
        device_type=DeviceType(row.device_type),
        status=NodeStatus(row.status),
        expires_at=row.expires_at,
        software_version=row.software_version,
        protocol_version=row.protocol_version,
        last_seen_at=row.last_seen_at,
        last_health=row.last_health,
        metadata=row.metadata,
        config_cached_at=row.config_cached_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _duplicate_token() -> Duplicate:
    return Duplicate("another node already has this registration token")


def _update_returning(conn: sa.Connection, node_id: UUID, values: Mapping[str, Any]) -> NodeRecord:
    with constraint_errors(unique=_duplicate_token()):
        row = conn.execute(
            nodes.update().where(nodes.c.id == node_id).values(dict(values)).returning(*_PUBLIC_COLUMNS)
        ).one_or_none()
    if row is None:
        raise NodeNotFound(node_id)
    return _node(row)


def create_node(conn: sa.Connection, new: NewNode, now: datetime) -> NodeRecord:
    with constraint_errors(unique=_duplicate_token()):
        row = conn.execute(
            nodes.insert()
            .values(
                id=uuid4(),
                name=new.name,
                description=new.description,
                device_type=DeviceType(new.device_type).value,
                status=NodeStatus.PENDING.value,
                registration_token_digest=new.registration_token_digest,
                expires_at=new.expires_at,
                metadata=new.metadata,
                created_at=now,
                updated_at=now,
            )
            .returning(*_PUBLIC_COLUMNS)
        ).one()
    return _node(row)


def get_node(conn: sa.Connection, node_id: UUID) -> NodeRecord | None:
    row = conn.execute(sa.select(*_PUBLIC_COLUMNS).where(nodes.c.id == node_id)).one_or_none()
    return None if row is None else _node(row)


def list_nodes(conn: sa.Connection, device_type: DeviceType | None) -> list[NodeRecord]:
    query = sa.select(*_PUBLIC_COLUMNS).order_by(nodes.c.created_at, nodes.c.id)
    if device_type is not None:
        query = query.where(nodes.c.device_type == DeviceType(device_type).value)
    return [_node(row) for row in conn.execute(query)]


def update_node(conn: sa.Connection, node_id: UUID, changes: Mapping[str, Any], now: datetime) -> NodeRecord:
    unknown = set(changes) - _CHANGEABLE
    if unknown:
        raise TypeError(f"not a node metadata field: {', '.join(sorted(unknown))}")
    return _update_returning(conn, node_id, {**changes, "updated_at": now})


def delete_node(conn: sa.Connection, node_id: UUID) -> None:
    if conn.execute(nodes.delete().where(nodes.c.id == node_id)).rowcount == 0:
        raise NodeNotFound(node_id)


def find_node_by_token_digest(conn: sa.Connection, token_digest: str) -> NodeRecord | None:
    row = conn.execute(
        sa.select(*_PUBLIC_COLUMNS).where(nodes.c.registration_token_digest == token_digest)
    ).one_or_none()
    return None if row is None else _node(row)


def reset_registration_token(conn: sa.Connection, node_id: UUID, token_digest: str, now: datetime) -> NodeRecord:
    # Interop 7.2: a new token resets the node to pending and clears its secret.
    return _update_returning(
        conn,
        node_id,
        {
            "registration_token_digest": token_digest,
            "status": NodeStatus.PENDING.value,
            "node_secret_ciphertext": None,
            "pending_secret_ciphertext": None,
            "updated_at": now,
        },
    )


def consume_registration_token(
    conn: sa.Connection, token_digest: str, secret_ciphertext: str, now: datetime
) -> NodeRecord | None:
    # Interop 6: the token is valid only while the node is pending and not expired, and is
    # consumed on use. One conditional UPDATE, so two sockets racing with one token get one node.
    row = conn.execute(
        nodes.update()
        .where(
            nodes.c.registration_token_digest == token_digest,
            nodes.c.status == NodeStatus.PENDING.value,
            sa.or_(nodes.c.expires_at.is_(None), nodes.c.expires_at > now),
        )
        .values(
            registration_token_digest=None,
            node_secret_ciphertext=secret_ciphertext,
            pending_secret_ciphertext=None,
            # Out of ``pending`` here, in the same statement: the hub's reports never move a
            # pending node (update_node_runtime's ``keep_pending``). ``offline`` until the hub's
            # ``online``, written behind, lands (within its batch interval, 0.25 s).
            status=NodeStatus.OFFLINE.value,
            updated_at=now,
        )
        .returning(*_PUBLIC_COLUMNS)
    ).one_or_none()
    return None if row is None else _node(row)


def get_node_credentials(conn: sa.Connection, node_id: UUID) -> NodeCredentials | None:
    row = conn.execute(
        sa.select(
            nodes.c.id,
            nodes.c.status,
            nodes.c.expires_at,
            nodes.c.node_secret_ciphertext,
            nodes.c.pending_secret_ciphertext,
        ).where(nodes.c.id == node_id)
    ).one_or_none()
    if row is None:
        return None
    return NodeCredentials(
        node_id=row.id,
        status=NodeStatus(row.status),
        expires_at=row.expires_at,
        secret_ciphertext=row.node_secret_ciphertext,
        pending_secret_ciphertext=row.pending_secret_ciphertext,
    )


def begin_secret_rotation(conn: sa.Connection, node_id: UUID, new_secret_ciphertext: str, now: datetime) -> None:
    _update_returning(conn, node_id, {"pending_secret_ciphertext": new_secret_ciphertext, "updated_at": now})


def finish_secret_rotation(conn: sa.Connection, node_id: UUID, now: datetime) -> bool:
    result = conn.execute(
        nodes.update()
        .where(nodes.c.id == node_id, nodes.c.pending_secret_ciphertext.is_not(None))
        .values(
            node_secret_ciphertext=nodes.c.pending_secret_ciphertext,
            pending_secret_ciphertext=None,
            updated_at=now,
        )
    )
    if result.rowcount > 0:
        return True
    if get_node(conn, node_id) is None:
        raise NodeNotFound(node_id)
    return False


def update_node_runtime(
    conn: sa.Connection, node_id: UUID, runtime: Mapping[str, Any], *, keep_pending: bool = False
) -> None:
    unknown = set(runtime) - _RUNTIME
    if unknown:
        raise TypeError(f"not a node runtime field: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = dict(runtime)
    if "status" in values:
        status = NodeStatus(values["status"]).value
        if keep_pending:
            # A report written behind (services/manager/reports.py) may have been queued before
            # an admin's new token set the node ``pending`` (interop 7.2): it must not take the
            # node out of it, or the new token is refused (registration needs ``pending``).
            pending = NodeStatus.PENDING.value
            values["status"] = sa.case((nodes.c.status == pending, pending), else_=status)
        else:
            values["status"] = status
    if values.get("software_version") is not None:
        values["software_version"] = values["software_version"][:SHORT_TEXT_MAX]  # interop 6: versions ≤256
    if not values:
        return
    if conn.execute(nodes.update().where(nodes.c.id == node_id).values(values)).rowcount == 0:
        raise NodeNotFound(node_id)


def mark_all_nodes_offline(conn: sa.Connection) -> int:
    connected = (NodeStatus.ONLINE.value, NodeStatus.DEGRADED.value, NodeStatus.ERROR.value)
    result = conn.execute(nodes.update().where(nodes.c.status.in_(connected)).values(status=NodeStatus.OFFLINE.value))
    return result.rowcount


def cache_node_config(conn: sa.Connection, node_id: UUID, config_json: str | None, now: datetime) -> None:
    result = conn.execute(
        nodes.update()
        .where(nodes.c.id == node_id)
        .values(cached_config=config_json, config_cached_at=None if config_json is None else now)
    )
    if result.rowcount == 0:
        raise NodeNotFound(node_id)


def get_cached_config(conn: sa.Connection, node_id: UUID) -> CachedConfig | None:
    row = conn.execute(
        sa.select(nodes.c.cached_config, nodes.c.config_cached_at).where(
            nodes.c.id == node_id, nodes.c.cached_config.is_not(None)
        )
    ).one_or_none()
    if row is None:
        return None
    return CachedConfig(node_id=node_id, config_json=row.cached_config, cached_at=row.config_cached_at)
