"""What the store takes and hands back: enums with the interface's strings, and frozen records.

Records are plain frozen dataclasses, not the API's pydantic models: the routes build
their response bodies from them (and leave out what a response must never carry:
password hashes, ciphertext, digests). Fields that hold ciphertext or a hash are
``repr=False`` so a record in a log line or a traceback shows none of them.

All times are aware UTC ``datetime`` values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TypeAlias, TypedDict
from uuid import UUID

JsonValue: TypeAlias = dict[str, "JsonValue"] | list["JsonValue"] | str | int | float | bool | None
JsonObject: TypeAlias = dict[str, JsonValue]


class Role(StrEnum):
    """Interop 7.1, lowest first; compare with ``ROLE_RANK``."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    SUPER_ADMIN = "super_admin"


ROLE_RANK: dict[Role, int] = {role: rank for rank, role in enumerate(Role)}


class DeviceType(StrEnum):
    EDGE = "edge"
    RELAY = "relay"


class NodeStatus(StrEnum):
    """Interop 7.2."""

    PENDING = "pending"
    ONLINE = "online"
    OFFLINE = "offline"
    DEGRADED = "degraded"
    ERROR = "error"


class EventSeverity(StrEnum):
    """Interop 11: there is no ``error`` severity."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @classmethod
    def from_wire(cls, text: object) -> EventSeverity:
        """Interop 11: the manager stores any unknown severity as ``info``."""
        for severity in cls:
            if severity.value == text:
                return severity
        return cls.INFO


class AiProvider(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    GEMINI = "gemini"


class AttemptKind(StrEnum):
    """What a counted authentication attempt was, and so what its identifier is."""

    LOGIN = "login"  # interop 7.1: identifier = the client IP; successes count too
    NODE_AUTH = "node_auth"  # interop 6: identifier = node_id, or "token:<first 8 chars>"


# --- users -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewUser:
    """A user to create. ``password_hash`` is the Argon2id PHC string, never a password."""

    username: str
    password_hash: str = field(repr=False)
    role: Role
    display_name: str | None = None
    email: str | None = None
    allowed_node_ids: tuple[UUID, ...] | None = None  # None: every node (interop 7.1)
    is_active: bool = True
    is_temporary: bool = False
    expires_at: datetime | None = None


class UserChanges(TypedDict, total=False):
    """A partial user update (interop 13: ``PUT /users/{id}`` takes any subset).

    A key that is absent is left unchanged; a key set to None clears a nullable column.
    """

    username: str
    password_hash: str
    role: Role
    display_name: str | None
    email: str | None
    allowed_node_ids: tuple[UUID, ...] | None
    is_active: bool
    is_temporary: bool
    expires_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class UserRecord:
    id: UUID
    username: str
    password_hash: str = field(repr=False)
    role: Role
    display_name: str | None
    email: str | None
    allowed_node_ids: tuple[UUID, ...] | None
    is_active: bool
    is_temporary: bool
    expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_login_at: datetime | None


# --- sessions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """One issued session JWT: ``id`` is its ``jti``."""

    id: UUID
    user_id: UUID
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None

    def is_valid_at(self, now: datetime) -> bool:
        """Not revoked and not yet expired."""
        return self.revoked_at is None and now < self.expires_at


# --- nodes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewNode:
    """A node to register (interop 7.2). The token itself never reaches the store."""

    name: str
    device_type: DeviceType = DeviceType.EDGE
    registration_token_digest: str = field(repr=False)  # SHA-256 hex of the token
    description: str | None = None
    expires_at: datetime | None = None
    metadata: JsonObject | None = None


class NodeChanges(TypedDict, total=False):
    """A partial node metadata update (``PUT /nodes/{id}``); absent keys stay unchanged."""

    name: str
    description: str | None
    expires_at: datetime | None
    metadata: JsonObject | None


class NodeRuntime(TypedDict, total=False):
    """What the node hub learns from a connected node; absent keys stay unchanged.

    ``software_version`` is truncated to 256 chars (interop 6).
    """

    status: NodeStatus
    last_seen_at: datetime | None
    software_version: str | None
    protocol_version: int | None
    last_health: JsonValue


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRecord:
    """A node's public fields (interop 7.2), without its secret or token digest."""

    id: UUID
    name: str
    description: str | None
    device_type: DeviceType
    status: NodeStatus
    expires_at: datetime | None
    software_version: str | None
    protocol_version: int | None
    last_seen_at: datetime | None
    last_health: JsonValue
    metadata: JsonObject | None
    config_cached_at: datetime | None  # when the cached config arrived; None: no cache
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCredentials:
    """What the node hub checks at auth (interop 6): ciphertext only, decrypted by the caller."""

    node_id: UUID
    status: NodeStatus
    expires_at: datetime | None
    secret_ciphertext: str | None = field(repr=False)
    pending_secret_ciphertext: str | None = field(repr=False)  # during rotate_secret


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedConfig:
    """A node's last ``config_response``, as received (interop 13: never normalised)."""

    node_id: UUID
    config_json: str
    cached_at: datetime


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event to store; over-long text is truncated by the store (interop 6)."""

    node_id: UUID | None
    severity: EventSeverity
    category: str
    message: str
    details: JsonValue = None
    flow_id: str | None = None
    created_at: datetime | None = None  # None: the store's clock


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    """An event row (interop 7.3)."""

    id: int
    node_id: UUID | None
    severity: EventSeverity
    category: str
    message: str
    details: JsonValue
    flow_id: str | None
    created_at: datetime
    acknowledged: bool
    acknowledged_by: str | None
    acknowledged_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventFilter:
    """The filters of ``GET /api/v1/events`` (interop 7.3); None means "any".

    ``since``/``until`` are the query's ``from``/``to`` (inclusive). ``search`` is a
    case-insensitive substring match over message, category, node_id and severity.
    ``node_ids`` limits to a set of nodes (a user's ``allowed_node_ids``); an empty set
    matches nothing, and events of no node are outside every set.
    """

    node_id: UUID | None = None
    node_ids: frozenset[UUID] | None = None
    severity: EventSeverity | None = None
    category: str | None = None
    flow_id: str | None = None
    acknowledged: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    search: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventPage:
    """One page of events, newest first, and how many match in all (``X-Total-Count``)."""

    rows: list[EventRecord]
    total: int


# --- AI keys -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AiKeyRecord:
    """A user's key for one provider (interop 7.6); the key is ciphertext (interop 7.7)."""

    id: UUID
    user_id: UUID
    provider: AiProvider
    api_key_ciphertext: str = field(repr=False)
    model_preference: str | None
    created_at: datetime
    updated_at: datetime
