"""Alembic's environment for the manager's store.

Run only through ``services.manager.store.migrate``, which puts an open connection (inside
its transaction and lock) into ``config.attributes["connection"]``. There is no offline
(SQL script) mode and no ``alembic.ini``.
"""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from alembic import context
from alembic.autogenerate.api import AutogenContext

from services.manager.store.tables import UtcDateTime, fleet_metadata, metadata


def render_item(kind: str, item: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Autogenerate writes our column type as the plain SQLAlchemy type it stands for."""
    if kind == "type" and isinstance(item, UtcDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, sa.Connection):
        raise RuntimeError("run migrations through services.manager.store.migrate, not the alembic command")
    context.configure(
        connection=connection,
        target_metadata=[metadata, fleet_metadata],
        # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        render_item=render_item,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")
run_migrations()
