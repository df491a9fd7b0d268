"""Users (interop 7.1): synchronous operations, each given a connection inside its transaction."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final
from uuid import UUID, uuid4

import sqlalchemy as sa

from appliance.errors import Conflict

from .engine import constraint_errors
from .errors import Duplicate, UserNotFound
from .records import NewUser, Role, UserChanges, UserRecord
from .tables import users

_CHANGEABLE: Final = frozenset(UserChanges.__annotations__)


class UsersExist(Conflict):
    """``mp-manager setup`` creates only the first user (interop 1.3)."""

    def __init__(self) -> None:
        super().__init__("a user already exists")


def _duplicate_username() -> Duplicate:
    return Duplicate("a user with this username already exists")


def _node_ids_to_json(node_ids: tuple[UUID, ...] | None) -> list[str] | None:
    return None if node_ids is None else [str(node_id) for node_id in node_ids]


def _user(row: sa.Row[Any]) -> UserRecord:
    allowed = row.allowed_node_ids
    return UserRecord(
        id=row.id,
        username=row.username,
        password_hash=row.password_hash,
        role=Role(row.role),
        display_name=row.display_name,
        email=row.email,
        allowed_node_ids=None if allowed is None else tuple(UUID(text) for text in allowed),
        is_active=row.is_active,
        is_temporary=row.is_temporary,
        expires_at=row.expires_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_login_at=row.last_login_at,
    )


def create_user(conn: sa.Connection, new: NewUser, now: datetime) -> UserRecord:
    with constraint_errors(unique=_duplicate_username()):
        row = conn.execute(
            users.insert()
            .values(
                id=uuid4(),
                username=new.username,
                password_hash=new.password_hash,
                role=Role(new.role).value,
                display_name=new.display_name,
                email=new.email,
                allowed_node_ids=_node_ids_to_json(new.allowed_node_ids),
                is_active=new.is_active,
                is_temporary=new.is_temporary,
                expires_at=new.expires_at,
                created_at=now,
                updated_at=now,
                last_login_at=None,
            )
            .returning(*users.c)
        ).one()
    return _user(row)


def create_first_user(conn: sa.Connection, new: NewUser, now: datetime) -> UserRecord:
    if conn.dialect.name == "postgresql":
        # Two concurrent setups must not both see an empty table (SQLite's BEGIN IMMEDIATE
        # already serialises them). This mode blocks writers, not readers.
        conn.execute(sa.text("LOCK TABLE users IN SHARE ROW EXCLUSIVE MODE"))
    if count_users(conn) > 0:
        raise UsersExist()
    return create_user(conn, new, now)


def get_user(conn: sa.Connection, user_id: UUID) -> UserRecord | None:
    row = conn.execute(sa.select(users).where(users.c.id == user_id)).one_or_none()
    return None if row is None else _user(row)


def get_user_by_username(conn: sa.Connection, username: str) -> UserRecord | None:
    row = conn.execute(sa.select(users).where(users.c.username == username)).one_or_none()
    return None if row is None else _user(row)


def list_users(conn: sa.Connection) -> list[UserRecord]:
    rows = conn.execute(sa.select(users).order_by(users.c.created_at, users.c.username))
    return [_user(row) for row in rows]


def count_users(conn: sa.Connection) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(users)).scalar_one())


def update_user(conn: sa.Connection, user_id: UUID, changes: Mapping[str, Any], now: datetime) -> UserRecord:
    unknown = set(changes) - _CHANGEABLE
    if unknown:
        raise TypeError(f"not a user field: {', '.join(sorted(unknown))}")
    values = dict(changes)
    if "role" in values:
        values["role"] = Role(values["role"]).value
    if "allowed_node_ids" in values:
        values["allowed_node_ids"] = _node_ids_to_json(values["allowed_node_ids"])
    values["updated_at"] = now
    with constraint_errors(unique=_duplicate_username()):
        row = conn.execute(users.update().where(users.c.id == user_id).values(values).returning(*users.c)).one_or_none()
    if row is None:
        raise UserNotFound(user_id)
    return _user(row)


def record_login(conn: sa.Connection, user_id: UUID, now: datetime) -> None:
    result = conn.execute(users.update().where(users.c.id == user_id).values(last_login_at=now))
    if result.rowcount == 0:
        raise UserNotFound(user_id)


def delete_user(conn: sa.Connection, user_id: UUID) -> None:
    # The user's sessions and AI keys go with it (ON DELETE CASCADE).
    if conn.execute(users.delete().where(users.c.id == user_id)).rowcount == 0:
        raise UserNotFound(user_id)
