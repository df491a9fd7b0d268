"""The manager's tables: SQLAlchemy Core on one ``MetaData``, the same on SQLite and PostgreSQL.

This module is the schema as the code sees it; the Alembic revisions under
``migrations/versions/`` build it from an empty database, and a test checks that the
two agree (Alembic's ``compare_metadata`` finds no difference on either backend).
Change both together: edit a table here, then add a revision (docs/manager-store.md).

Portability rules followed throughout:

- enumerations are ``String`` columns with a named ``CHECK`` (no PostgreSQL ``ENUM``
  types, which need their own migrations);
- timestamps are ``UtcDateTime``: ``timestamptz`` on PostgreSQL, ISO text on SQLite,
  and always an aware UTC ``datetime`` in Python;
- ids are ``Uuid`` (native ``uuid`` on PostgreSQL, ``CHAR(32)`` hex on SQLite), except
  the autoincrementing integer ids of ``events`` and ``login_attempts``;
- ciphertext (interop 7.7: base64 of nonce ‖ ciphertext ‖ tag) is ``Text`` and opaque
  here; the store never sees a plaintext secret, and never a registration token,
  only its SHA-256 hex digest;
- every constraint has a name (the naming convention below), so later migrations can
  drop or alter it on both backends.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

NAMING_CONVENTION: Final = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata: Final = sa.MetaData(naming_convention=NAMING_CONVENTION)

# Lengths fixed by interop 7 and 6 (the store truncates what a node sends, the API
# validates what a user sends).
USERNAME_MAX: Final = 64
DISPLAY_NAME_MAX: Final = 128
EMAIL_MAX: Final = 254
NODE_NAME_MAX: Final = 128
NODE_DESCRIPTION_MAX: Final = 512
SHORT_TEXT_MAX: Final = 256  # interop 6: event category and software versions
EVENT_MESSAGE_MAX: Final = 10_000  # interop 6: event message
MODEL_PREFERENCE_MAX: Final = 128
SETTING_KEY_MAX: Final = 64
ATTEMPT_IDENTIFIER_MAX: Final = 128
SHA256_HEX_LEN: Final = 64


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC ``datetime`` on both backends.

    SQLite has no timezone type and hands back naive values; PostgreSQL hands back
    the session's zone. Binding a naive ``datetime`` is a bug (raises ``ValueError``).
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        # SQLite stores text: a naive UTC value keeps its ordering and comparisons exact.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _one_of(column: str, values: tuple[str, ...], name: str) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({allowed})", name=name)


# The wire strings (interop 7.1, 7.2, 7.3, 7.6); records.py holds the matching enums.
ROLES: Final = ("viewer", "operator", "admin", "super_admin")
DEVICE_TYPES: Final = ("edge", "relay")
NODE_STATUSES: Final = ("pending", "online", "offline", "degraded", "error")
SEVERITIES: Final = ("info", "warning", "critical")
AI_PROVIDERS: Final = ("openai", "anthropic", "gemini")
ATTEMPT_KINDS: Final = ("login", "node_auth")

# SQLite only autoincrements an INTEGER PRIMARY KEY (the rowid alias).
AUTOINCREMENT_ID: Final = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

users: Final = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("username", sa.String(USERNAME_MAX), nullable=False),
    sa.Column("password_hash", sa.Text(), nullable=False),  # Argon2id PHC string (interop 7.1)
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("display_name", sa.String(DISPLAY_NAME_MAX), nullable=True),
    sa.Column("email", sa.String(EMAIL_MAX), nullable=True),
    sa.Column("allowed_node_ids", sa.JSON(none_as_null=True), nullable=True),  # list of uuid text; NULL = all
    sa.Column("is_active", sa.Boolean(), nullable=False),
    sa.Column("is_temporary", sa.Boolean(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.Column("last_login_at", UtcDateTime(), nullable=True),
    sa.UniqueConstraint("username"),
    _one_of("role", ROLES, "role"),
)

# One row per issued session JWT (its jti). Interop 13: sessions and revocations survive a
# restart, so logout sets revoked_at instead of forgetting the row.
sessions: Final = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),  # the JWT's jti
    sa.Column("user_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    sa.Index("ix_sessions_user_id", "user_id"),
    sa.Index("ix_sessions_expires_at", "expires_at"),
)

# Interop 7.1 (login: every attempt per client IP, successes included) and interop 6
# (node auth: failures per node id or token prefix). Kept in the database so several
# manager instances share one count.
login_attempts: Final = sa.Table(
    "login_attempts",
    metadata,
    sa.Column("id", AUTOINCREMENT_ID, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("identifier", sa.String(ATTEMPT_IDENTIFIER_MAX), nullable=False),
    sa.Column("succeeded", sa.Boolean(), nullable=False),
    sa.Column("attempted_at", UtcDateTime(), nullable=False),
    sa.Index("ix_login_attempts_kind_identifier_attempted_at", "kind", "identifier", "attempted_at"),
    sa.Index("ix_login_attempts_attempted_at", "attempted_at"),
    _one_of("kind", ATTEMPT_KINDS, "kind"),
)

nodes: Final = sa.Table(
    "nodes",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.String(NODE_NAME_MAX), nullable=False),
    sa.Column("description", sa.String(NODE_DESCRIPTION_MAX), nullable=True),
    sa.Column("device_type", sa.String(8), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    # Interop 7.7: only the SHA-256 hex digest of the registration token; NULL once consumed.
    sa.Column("registration_token_digest", sa.String(SHA256_HEX_LEN), nullable=True),
    # Interop 7.7: AES-256-GCM ciphertext (base64 text), the current secret and a pending rotation.
    sa.Column("node_secret_ciphertext", sa.Text(), nullable=True),
    sa.Column("pending_secret_ciphertext", sa.Text(), nullable=True),
    sa.Column("expires_at", UtcDateTime(), nullable=True),
    sa.Column("software_version", sa.String(SHORT_TEXT_MAX), nullable=True),
    sa.Column("protocol_version", sa.Integer(), nullable=True),
    sa.Column("last_seen_at", UtcDateTime(), nullable=True),
    sa.Column("last_health", sa.JSON(none_as_null=True), nullable=True),
    sa.Column("metadata", sa.JSON(none_as_null=True), nullable=True),
    # Interop 13: the config_response is cached and served as received, so it is kept as text.
    sa.Column("cached_config", sa.Text(), nullable=True),
    sa.Column("config_cached_at", UtcDateTime(), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("registration_token_digest"),
    _one_of("device_type", DEVICE_TYPES, "device_type"),
    _one_of("status", NODE_STATUSES, "status"),
)

# Interop 7.3. node_id is the node's uuid as text (lower-case, hyphenated), with no foreign
# key: events outlive a deleted node until retention removes them, and `search` matches it
# as a substring the same way on both backends.
events: Final = sa.Table(
    "events",
    metadata,
    sa.Column("id", AUTOINCREMENT_ID, primary_key=True, autoincrement=True),
    sa.Column("node_id", sa.String(36), nullable=True),
    sa.Column("severity", sa.String(16), nullable=False),
    sa.Column("category", sa.String(SHORT_TEXT_MAX), nullable=False),
    sa.Column("message", sa.Text(), nullable=False),
    sa.Column("details", sa.JSON(none_as_null=True), nullable=True),
    sa.Column("flow_id", sa.String(SHORT_TEXT_MAX), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("acknowledged", sa.Boolean(), nullable=False),
    sa.Column("acknowledged_by", sa.String(USERNAME_MAX), nullable=True),
    sa.Column("acknowledged_at", UtcDateTime(), nullable=True),
    # Newest first (created_at, id) and the retention delete use the first index; the
    # filters of GET /events use the next three; /events/count uses the last.
    sa.Index("ix_events_created_at_id", "created_at", "id"),
    sa.Index("ix_events_node_id_created_at", "node_id", "created_at"),
    sa.Index("ix_events_category_created_at", "category", "created_at"),
    sa.Index("ix_events_flow_id_created_at", "flow_id", "created_at"),
    sa.Index("ix_events_acknowledged_severity", "acknowledged", "severity"),
    _one_of("severity", SEVERITIES, "severity"),
)

# Interop 7.5: one row per key that was ever set; defaults live in the settings module.
settings: Final = sa.Table(
    "settings",
    metadata,
    sa.Column("key", sa.String(SETTING_KEY_MAX), primary_key=True),
    sa.Column("value", sa.JSON(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
)

# Interop 7.6: one key per user and provider; the key itself is ciphertext (interop 7.7).
ai_keys: Final = sa.Table(
    "ai_keys",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("user_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("provider", sa.String(16), nullable=False),
    sa.Column("api_key_ciphertext", sa.Text(), nullable=False),
    sa.Column("model_preference", sa.String(MODEL_PREFERENCE_MAX), nullable=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("user_id", "provider"),
    _one_of("provider", AI_PROVIDERS, "provider"),
)

# --- the fleet's coordination (docs/manager.md "A fleet") --------------------------------
# Several mp-manager instances on one PostgreSQL coordinate through these. They hold no data
# of their own (who holds which socket now, messages in flight, the live stats last published),
# so they live on their own MetaData: a backup (snapshot.py walks ``metadata``) leaves them out,
# and a restore starts with none. The migrations create them on SQLite too (one schema), where
# nothing uses them.
fleet_metadata: Final = sa.MetaData(naming_convention=NAMING_CONVENTION)

# One row per running instance, its heartbeat refreshed every second.
manager_instances: Final = sa.Table(
    "manager_instances",
    fleet_metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.String(SHORT_TEXT_MAX), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("heartbeat_at", UtcDateTime(), nullable=False),
)

# Which instance holds each connected node's socket. The holder pushes expires_at forward
# every second; a dead instance's rows lapse and a survivor marks those nodes offline.
node_connections: Final = sa.Table(
    "node_connections",
    fleet_metadata,
    sa.Column("node_id", sa.Uuid(), primary_key=True),
    sa.Column("instance_id", sa.Uuid(), nullable=False),
    sa.Column("connected_at", UtcDateTime(), nullable=False),
    sa.Column("expires_at", UtcDateTime(), nullable=False),
    sa.Index("ix_node_connections_instance_id", "instance_id"),
    sa.Index("ix_node_connections_expires_at", "expires_at"),
)

# The outbox: a message to one instance (target) or to all (target NULL). The body is always
# here, never in the NOTIFY payload (8,000 bytes at most), and a listener that was away reads
# what it missed from here.
fleet_messages: Final = sa.Table(
    "fleet_messages",
    fleet_metadata,
    sa.Column("id", AUTOINCREMENT_ID, primary_key=True, autoincrement=True),
    sa.Column("target", sa.Uuid(), nullable=True),
    sa.Column("sender", sa.Uuid(), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("body", sa.Text(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Index("ix_fleet_messages_target_id", "target", "id"),
    sa.Index("ix_fleet_messages_created_at", "created_at"),
)

# Each instance's connected nodes as last published (status, stats, health, versions), so the
# others' dashboards and routes see every node of the fleet live.
fleet_live: Final = sa.Table(
    "fleet_live",
    fleet_metadata,
    sa.Column("instance_id", sa.Uuid(), primary_key=True),
    sa.Column("body", sa.Text(), nullable=False),
    sa.Column("updated_at", UtcDateTime(), nullable=False),
)
