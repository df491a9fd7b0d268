"""The manager's store: SQLAlchemy Core tables, Alembic migrations, SQLite (WAL) or PostgreSQL.

``Store`` is the trio facade the manager uses; ``records`` holds what goes in and comes
out; ``errors`` the errors it raises. docs/manager-store.md describes the tables.
"""

from __future__ import annotations

from .engine import create_store_engine, resolve_url, sqlite_url
from .errors import (
    AiKeyNotFound,
    Duplicate,
    EventNotFound,
    NodeNotFound,
    StoreFailed,
    UnsupportedDatabaseUrl,
    UserNotFound,
)
from .migrate import current_revision, head_revision, upgrade_to_head
from .records import (
    ROLE_RANK,
    AiKeyRecord,
    AiProvider,
    AttemptKind,
    CachedConfig,
    DeviceType,
    EventFilter,
    EventPage,
    EventRecord,
    EventSeverity,
    JsonObject,
    JsonValue,
    NewEvent,
    NewNode,
    NewUser,
    NodeChanges,
    NodeCredentials,
    NodeRecord,
    NodeRuntime,
    NodeStatus,
    Role,
    SessionRecord,
    UserChanges,
    UserRecord,
)
from .store import Store
from .users import UsersExist

__all__ = [
    "ROLE_RANK",
    "AiKeyNotFound",
    "AiKeyRecord",
    "AiProvider",
    "AttemptKind",
    "CachedConfig",
    "DeviceType",
    "Duplicate",
    "EventFilter",
    "EventNotFound",
    "EventPage",
    "EventRecord",
    "EventSeverity",
    "JsonObject",
    "JsonValue",
    "NewEvent",
    "NewNode",
    "NewUser",
    "NodeChanges",
    "NodeCredentials",
    "NodeNotFound",
    "NodeRecord",
    "NodeRuntime",
    "NodeStatus",
    "Role",
    "SessionRecord",
    "Store",
    "StoreFailed",
    "UnsupportedDatabaseUrl",
    "UserChanges",
    "UserNotFound",
    "UserRecord",
    "UsersExist",
    "create_store_engine",
    "current_revision",
    "head_revision",
    "resolve_url",
    "sqlite_url",
    "upgrade_to_head",
]
