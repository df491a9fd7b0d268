"""Settings (interop 7.5) and AI provider keys (interop 7.6): key/value rows and per-user upserts.

The store keeps only the keys that were set; the settings module of the manager owns
the defaults, the ranges and the rule that every key is validated before any is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .engine import constraint_errors
from .errors import AiKeyNotFound, UserNotFound
from .records import AiKeyRecord, AiProvider, JsonValue
from .tables import ai_keys, settings


def _upsert(
    conn: sa.Connection,
    table: sa.Table,
    rows: Sequence[Mapping[str, Any]],
    conflict_columns: Sequence[str],
    update_columns: Sequence[str],
) -> sa.CursorResult[Any]:
    """INSERT … ON CONFLICT DO UPDATE, which both backends speak with the same meaning."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(table).values(list(rows))
    statement = statement.on_conflict_do_update(
        index_elements=list(conflict_columns),
        set_={name: statement.excluded[name] for name in update_columns},
    )
    return conn.execute(statement.returning(*table.c))


def get_settings(conn: sa.Connection) -> dict[str, JsonValue]:
    return {row.key: row.value for row in conn.execute(sa.select(settings.c.key, settings.c.value))}


def put_settings(conn: sa.Connection, values: Mapping[str, JsonValue], now: datetime) -> dict[str, JsonValue]:
    if any(value is None for value in values.values()):
        raise ValueError("a setting cannot be null (interop 13); leave the key out instead")
    if values:
        rows = [{"key": key, "value": value, "updated_at": now} for key, value in values.items()]
        _upsert(conn, settings, rows, ["key"], ["value", "updated_at"])
    return get_settings(conn)


def _ai_key(row: sa.Row[Any]) -> AiKeyRecord:
    return AiKeyRecord(
        id=row.id,
        user_id=row.user_id,
        provider=AiProvider(row.provider),
        api_key_ciphertext=row.api_key_ciphertext,
        model_preference=row.model_preference,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def put_ai_key(
    conn: sa.Connection,
    user_id: UUID,
    provider: AiProvider,
    api_key_ciphertext: str,
    model_preference: str | None,
    now: datetime,
) -> AiKeyRecord:
    row = {
        "id": uuid4(),
        "user_id": user_id,
        "provider": AiProvider(provider).value,
        "api_key_ciphertext": api_key_ciphertext,
        "model_preference": model_preference,
        "created_at": now,
        "updated_at": now,
    }
    with constraint_errors(foreign_key=UserNotFound(user_id)):
        result = _upsert(
            conn,
            ai_keys,
            [row],
            ["user_id", "provider"],
            ["api_key_ciphertext", "model_preference", "updated_at"],
        )
    return _ai_key(result.one())


def get_ai_key(conn: sa.Connection, user_id: UUID, provider: AiProvider) -> AiKeyRecord | None:
    row = conn.execute(
        sa.select(ai_keys).where(ai_keys.c.user_id == user_id, ai_keys.c.provider == AiProvider(provider).value)
    ).one_or_none()
    return None if row is None else _ai_key(row)


def list_ai_keys(conn: sa.Connection, user_id: UUID) -> list[AiKeyRecord]:
    rows = conn.execute(sa.select(ai_keys).where(ai_keys.c.user_id == user_id).order_by(ai_keys.c.provider))
    return [_ai_key(row) for row in rows]


def delete_ai_key(conn: sa.Connection, user_id: UUID, provider: AiProvider) -> None:
    result = conn.execute(
        ai_keys.delete().where(ai_keys.c.user_id == user_id, ai_keys.c.provider == AiProvider(provider).value)
    )
    if result.rowcount == 0:
        raise AiKeyNotFound(AiProvider(provider).value)
