"""Sessions and their revocation (interop 7.1, 13), and counted authentication attempts.

A session row exists for every session JWT issued; its ``id`` is the JWT's ``jti``.
Logout and ``reset-password`` set ``revoked_at``; the row stays until it expires, so
a revocation survives a restart. A JWT whose row is missing (purged after expiry, or
its user deleted) is as invalid as a revoked one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import sqlalchemy as sa

from .engine import constraint_errors
from .errors import UserNotFound
from .records import AttemptKind, SessionRecord
from .tables import login_attempts, sessions


def _session(row: sa.Row[Any]) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        user_id=row.user_id,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


def create_session(
    conn: sa.Connection, user_id: UUID, expires_at: datetime, now: datetime, session_id: UUID | None = None
) -> SessionRecord:
    with constraint_errors(foreign_key=UserNotFound(user_id)):
        row = conn.execute(
            sessions.insert()
            .values(id=session_id or uuid4(), user_id=user_id, created_at=now, expires_at=expires_at, revoked_at=None)
            .returning(*sessions.c)
        ).one()
    return _session(row)


def get_session(conn: sa.Connection, session_id: UUID) -> SessionRecord | None:
    row = conn.execute(sa.select(sessions).where(sessions.c.id == session_id)).one_or_none()
    return None if row is None else _session(row)


def revoke_session(conn: sa.Connection, session_id: UUID, now: datetime) -> bool:
    result = conn.execute(
        sessions.update().where(sessions.c.id == session_id, sessions.c.revoked_at.is_(None)).values(revoked_at=now)
    )
    return result.rowcount > 0


def revoke_user_sessions(conn: sa.Connection, user_id: UUID, now: datetime) -> int:
    result = conn.execute(
        sessions.update().where(sessions.c.user_id == user_id, sessions.c.revoked_at.is_(None)).values(revoked_at=now)
    )
    return result.rowcount


def purge_expired_sessions(conn: sa.Connection, now: datetime) -> int:
    # An expired JWT fails its own `exp` check, so its row (revoked or not) is no longer needed.
    return conn.execute(sessions.delete().where(sessions.c.expires_at <= now)).rowcount


def record_attempt(conn: sa.Connection, kind: AttemptKind, identifier: str, succeeded: bool, now: datetime) -> None:
    conn.execute(
        login_attempts.insert().values(
            kind=AttemptKind(kind).value, identifier=identifier, succeeded=succeeded, attempted_at=now
        )
    )


def count_attempts(
    conn: sa.Connection, kind: AttemptKind, identifier: str, since: datetime, failures_only: bool
) -> int:
    query = (
        sa.select(sa.func.count())
        .select_from(login_attempts)
        .where(
            login_attempts.c.kind == AttemptKind(kind).value,
            login_attempts.c.identifier == identifier,
            login_attempts.c.attempted_at >= since,
        )
    )
    if failures_only:
        query = query.where(login_attempts.c.succeeded.is_(False))
    return int(conn.execute(query).scalar_one())


def clear_attempts(conn: sa.Connection, kind: AttemptKind, identifier: str) -> int:
    result = conn.execute(
        login_attempts.delete().where(
            login_attempts.c.kind == AttemptKind(kind).value, login_attempts.c.identifier == identifier
        )
    )
    return result.rowcount


def purge_attempts(conn: sa.Connection, before: datetime) -> int:
    return conn.execute(login_attempts.delete().where(login_attempts.c.attempted_at < before)).rowcount
