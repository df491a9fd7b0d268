"""The fleet's coordination tables: manager_instances, node_connections, fleet_messages, fleet_live.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28

Several mp-manager instances on one PostgreSQL coordinate through them (docs/manager.md "A
fleet"). Created on SQLite too, so both backends have one schema; nothing uses them there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

AUTOINCREMENT_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "manager_instances",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_manager_instances")),
    )
    op.create_table(
        "node_connections",
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("instance_id", sa.Uuid(), nullable=False),
        sa.Column("connected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_connections")),
    )
    op.create_index("ix_node_connections_instance_id", "node_connections", ["instance_id"])
    op.create_index("ix_node_connections_expires_at", "node_connections", ["expires_at"])
    op.create_table(
        "fleet_messages",
        sa.Column("id", AUTOINCREMENT_ID, autoincrement=True, nullable=False),
        sa.Column("target", sa.Uuid(), nullable=True),
        sa.Column("sender", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_messages")),
    )
    op.create_index("ix_fleet_messages_target_id", "fleet_messages", ["target", "id"])
    op.create_index("ix_fleet_messages_created_at", "fleet_messages", ["created_at"])
    op.create_table(
        "fleet_live",
        sa.Column("instance_id", sa.Uuid(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_fleet_live")),
    )


def downgrade() -> None:
    for table in ("fleet_live", "fleet_messages", "node_connections", "manager_instances"):
        op.drop_table(table)
