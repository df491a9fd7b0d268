"""The node <-> manager WebSocket messages (interop.md 6), their limits and their codec.

Every message is one text frame ``{"type": "...", "timestamp": "<RFC 3339>", "payload": ...}``;
only ``auth`` may leave out ``timestamp`` (interop.md 6 "Envelope"). Each ``type`` is one frozen
pydantic model here, and :data:`MESSAGE_MODELS` maps the type to its model (style H4):

=====================  ==============  =====================================================
type                   direction       payload
=====================  ==============  =====================================================
``auth``               node → manager  token variant or node_id + node_secret variant
``stats``              node → manager  edge or relay shape, kept as a JSON object
``health``             node → manager  edge or relay shape, kept as a JSON object
``event``              node → manager  ``{severity, category, message, details?, flow_id?}``
``command_ack``        node → manager  ``{command_id, success, error, data?}``
``config_response``    node → manager  the bare config object
``pong``               node → manager  ``null``
``register_ack``       manager → node  ``{node_id, node_secret}``
``auth_ok``            manager → node  ``null``
``auth_error``         manager → node  ``{message}``, and ``message`` at the top level too
``ping``               manager → node  ``null``
``command``            manager → node  ``{command_id, action}`` (``actions.py``)
``dashboard_update``   manager → browser  ``{nodes: [...], online_count}``
=====================  ==============  =====================================================

Shapes the interop document fixes are ``extra="forbid"``. Three are read leniently on purpose:
``stats`` and ``health`` (a newer node's extra fields must not cost its stats), and ``event``
(unknown keys ignored; an unknown severity is stored as ``info``, interop.md 11; relay categories
such as ``edge`` and the manager's ``compatibility`` are not edge :class:`EventCategory` values,
and a message may be up to 10 000 chars where the edge's :class:`Event` stops at 1 024).

:func:`decode` checks the size before anything else, then JSON (with the appliance's nesting
limit), then the model; every failure is a :class:`ProtocolError` whose text never holds a value
from the frame. :func:`encode` writes compact JSON.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar, Final, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    PlainValidator,
    RootModel,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)

from appliance.models.events import Event, Severity
from appliance.models.stats import FlowStats, HealthStatus
from appliance.protocol._wire import JsonObject, Timestamp, WireSecret, parse_typed_json
from appliance.protocol.actions import AnyAction, DeviceType, parse_action, wire_action
from appliance.protocol.errors import (
    FrameTooLarge,
    LocalProtocolError,
)

# --------------------------------------------------------------------------- limits (interop.md 6)
PROTOCOL_VERSION: Final = 1
"""interop.md 6 "Protocol version": 1 for the edge and the relay."""
NODE_FRAME_MAX_BYTES: Final = 5 * 1024 * 1024
"""interop.md 6 "Limits": node frames over 5 MiB are dropped and logged (the connection stays up)."""
MANAGER_FRAME_MAX_BYTES: Final = 1024 * 1024
"""interop.md 6 "Limits": manager → node frames are ≤ 1 MiB."""
EVENT_MESSAGE_MAX_CHARS: Final = 10_000
"""interop.md 6 "Limits": an event ``message`` is truncated to 10 000 chars."""
CATEGORY_MAX_CHARS: Final = 256
"""interop.md 6 "Limits": ``category`` is truncated to 256 chars."""
VERSION_MAX_CHARS: Final = 256
"""interop.md 6 "Limits": versions are truncated to 256 chars."""
FLOW_ID_MAX_CHARS: Final = 256
"""Not in interop.md: a flow id is ≤ 64 chars (2.2), so 256 only bounds what a broken node stores."""
MAX_ACTION_BYTES: Final = 50 * 1024
"""interop.md 6 "Commands" / 7.2: an action over 50 KiB serialized is refused with 413."""
MAX_CONFIG_BYTES: Final = 100 * 1024
"""interop.md 7.2: ``PUT /nodes/{id}/config`` takes a config of at most 100 KiB."""
AUTH_TIMEOUT_S: Final = 10.0
"""interop.md 6 "Handshake": the node sends ``auth`` within 10 s (and waits 10 s for the reply)."""
COMMAND_TIMEOUT_S: Final = 10.0
"""interop.md 6 "Commands": the manager waits 10 s for the matching ``command_ack`` (504)."""
KEEPALIVE_INTERVAL_S: Final = 15.0
"""interop.md 6: ``ping`` every ``ws_keepalive_interval_secs`` (default 15)."""
OFFLINE_THRESHOLD_S: Final = 30.0
"""interop.md 6 "Online and offline": ``node_offline_threshold_secs`` default."""
STATS_INTERVAL_S: Final = 1.0
"""interop.md 6: ``stats`` every 1 s."""
HEALTH_INTERVAL_S: Final = 15.0
"""interop.md 6: ``health`` right after auth, then every 15 s."""
REGISTRATION_TOKEN_MAX_CHARS: Final = 4096  # interop.md 2.1: registration_token ≤ 4096 chars
NODE_SECRET_MAX_CHARS: Final = 4096
NODE_ID_MAX_CHARS: Final = 256


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _OmitNone(_Model):
    """Drops the keys named in ``_omit_if_none`` when they are None: the interop's ``key?``."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> object:
        data = handler(self)
        if isinstance(data, dict):
            for key in self._omit_if_none:
                if data.get(key) is None:
                    data.pop(key, None)
        return data


# --------------------------------------------------------------------------- payloads
class TokenAuth(_Model):
    """``auth`` payload, registration path: a one-time registration token (a UUIDv4)."""

    registration_token: WireSecret = Field(min_length=1, max_length=REGISTRATION_TOKEN_MAX_CHARS)
    software_version: str
    protocol_version: int = Field(strict=True, ge=0)


class SecretAuth(_Model):
    """``auth`` payload, login path: the node id and secret from ``register_ack``."""

    node_id: str = Field(min_length=1, max_length=NODE_ID_MAX_CHARS)
    node_secret: WireSecret = Field(min_length=1, max_length=NODE_SECRET_MAX_CHARS)
    software_version: str
    protocol_version: int = Field(strict=True, ge=0)


def _auth_variant(value: object) -> str:
    # A payload naming node_id or node_secret is the login variant; it then forbids a token key,
    # so sending both kinds is a validation error rather than a silent choice.
    if isinstance(value, Mapping):
        return "secret" if "node_id" in value or "node_secret" in value else "token"
    return "secret" if isinstance(value, SecretAuth) else "token"


AuthPayload = Annotated[
    Annotated[SecretAuth, Tag("secret")] | Annotated[TokenAuth, Tag("token")],
    Discriminator(_auth_variant),
]


class RegisterAckPayload(_Model):
    """The credentials the node persists (interop.md 6 "Credential persistence")."""

    node_id: str = Field(min_length=1, max_length=NODE_ID_MAX_CHARS)
    node_secret: WireSecret = Field(min_length=1, max_length=NODE_SECRET_MAX_CHARS)


class AuthErrorPayload(_Model):
    message: str


class StatsPayload(RootModel[JsonObject]):
    """``stats`` payload, kept as the JSON object the node sent (read leniently, interop.md 6).

    Edge: ``{flows: [FlowStats], tunnels: [tunnel summary], uptime_secs, active_flows,
    total_flows}`` (:func:`edge_stats_payload`). Relay: its REST Stats object plus
    ``udp_sessions_active``.
    """

    model_config = ConfigDict(frozen=True)


class HealthPayload(RootModel[JsonObject]):
    """``health`` payload, kept as the JSON object the node sent (read leniently, interop.md 6).

    Edge: ``{status: "ok", version, uptime_secs, active_flows, total_flows, api_addr,
    monitor_addr}`` (:func:`edge_health_payload`). Relay: its REST Health object plus
    ``quic_addr``, ``public_quic_addr``, ``public_udp_addr`` and ``capabilities``.
    """

    model_config = ConfigDict(frozen=True)


class ConfigPayload(RootModel[JsonObject]):
    """``config_response`` payload: the bare config, secrets stripped, not wrapped in ``{config}``.
    The manager caches and serves it as received (interop.md 13)."""

    model_config = ConfigDict(frozen=True)


class EventPayload(_OmitNone):
    """``event`` payload ``{severity, category, message, details?, flow_id?}`` (interop.md 11).

    Read leniently: unknown keys are ignored and any severity or category string is kept (the
    manager maps an unknown severity to ``info`` in :func:`normalise_event`). Nodes build it from
    the edge's :class:`appliance.models.events.Event` with :meth:`from_event`.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)
    _omit_if_none: ClassVar[tuple[str, ...]] = ("details", "flow_id")

    severity: str
    category: str
    message: str
    details: JsonObject | None = None
    flow_id: str | None = None

    @classmethod
    def from_event(cls, event: Event) -> EventPayload:
        """The wire form of an edge event."""
        return cls(
            severity=event.severity.value,
            category=event.category.value,
            message=event.message,
            details=event.details,
            flow_id=event.flow_id,
        )


class CommandAckPayload(_OmitNone):
    """``{command_id, success, error: null or text, data?}`` (interop.md 6)."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ("data",)

    command_id: uuid.UUID = Field(strict=False)
    success: bool = Field(strict=True)
    error: str | None = None
    data: object = None
    """For ``list_*`` relay commands: ``{tunnels}``, ``{edges}`` or ``{sessions}``."""


class CommandPayload(_Model):
    """``{command_id: <uuid4>, action: {type, ...}}``; ``action`` is parsed by :func:`parse_action`."""

    command_id: uuid.UUID = Field(strict=False)
    action: Annotated[AnyAction, PlainValidator(parse_action), PlainSerializer(wire_action)]


class NodeStatus(StrEnum):
    """A node's status in the manager (interop.md 7.2)."""

    PENDING = "pending"
    ONLINE = "online"
    OFFLINE = "offline"
    DEGRADED = "degraded"
    ERROR = "error"


class DashboardNode(_Model):
    """One node in a ``dashboard_update`` (interop.md 6 "Dashboard stream")."""

    node_id: str
    name: str
    device_type: DeviceType
    status: NodeStatus
    stats: JsonObject | None
    health: JsonObject | None
    software_version: str | None
    protocol_version: int | None
    uptime_secs: int | None


class DashboardPayload(_Model):
    nodes: list[DashboardNode]
    online_count: int = Field(ge=0)


# --------------------------------------------------------------------------- messages
class _Envelope(_Model):
    type: str
    timestamp: Timestamp


class AuthMessage(_OmitNone):
    """``auth``, the node's first frame. The only message that may leave out ``timestamp``."""

    _omit_if_none: ClassVar[tuple[str, ...]] = ("timestamp",)

    type: Literal["auth"] = "auth"
    timestamp: Timestamp | None = None
    payload: AuthPayload


class RegisterAckMessage(_Envelope):
    type: Literal["register_ack"] = "register_ack"
    payload: RegisterAckPayload


class AuthOkMessage(_Envelope):
    type: Literal["auth_ok"] = "auth_ok"
    payload: None = None


class AuthErrorMessage(_Envelope):
    """``auth_error``: the reason at the top level *and* in the payload; readers take either."""

    type: Literal["auth_error"] = "auth_error"
    message: str | None = None
    payload: AuthErrorPayload | None = None

    @model_validator(mode="after")
    def _has_a_message(self) -> AuthErrorMessage:
        if self.message is None and self.payload is None:
            raise ValueError("auth_error needs a message at the top level or in the payload")
        return self

    @property
    def text(self) -> str:
        """The reason: the top-level ``message``, else the payload's (interop.md 6 ``auth_error``)."""
        if self.message is not None:
            return self.message
        return self.payload.message if self.payload is not None else ""


class StatsMessage(_Envelope):
    type: Literal["stats"] = "stats"
    payload: StatsPayload


class HealthMessage(_Envelope):
    type: Literal["health"] = "health"
    payload: HealthPayload


class EventMessage(_Envelope):
    type: Literal["event"] = "event"
    payload: EventPayload


class CommandAckMessage(_Envelope):
    type: Literal["command_ack"] = "command_ack"
    payload: CommandAckPayload


class ConfigResponseMessage(_Envelope):
    type: Literal["config_response"] = "config_response"
    payload: ConfigPayload


class PongMessage(_Envelope):
    type: Literal["pong"] = "pong"
    payload: None = None


class PingMessage(_Envelope):
    type: Literal["ping"] = "ping"
    payload: None = None


class CommandMessage(_Envelope):
    type: Literal["command"] = "command"
    payload: CommandPayload


class DashboardUpdateMessage(_Envelope):
    """The browser stream's message (``/ws/dashboard``, push-only)."""

    type: Literal["dashboard_update"] = "dashboard_update"
    payload: DashboardPayload


NodeMessage = (
    AuthMessage | StatsMessage | HealthMessage | EventMessage | CommandAckMessage | ConfigResponseMessage | PongMessage
)
"""What a node sends to the manager."""
ManagerMessage = RegisterAckMessage | AuthOkMessage | AuthErrorMessage | PingMessage | CommandMessage
"""What the manager sends to a node."""
Message = NodeMessage | ManagerMessage | DashboardUpdateMessage
"""Every message of the protocol."""

NODE_MESSAGE_TYPES: Final = frozenset({"auth", "stats", "health", "event", "command_ack", "config_response", "pong"})
MANAGER_MESSAGE_TYPES: Final = frozenset({"register_ack", "auth_ok", "auth_error", "ping", "command"})

MESSAGE_MODELS: Final[dict[str, type[BaseModel]]] = {
    "auth": AuthMessage,
    "stats": StatsMessage,
    "health": HealthMessage,
    "event": EventMessage,
    "command_ack": CommandAckMessage,
    "config_response": ConfigResponseMessage,
    "pong": PongMessage,
    "register_ack": RegisterAckMessage,
    "auth_ok": AuthOkMessage,
    "auth_error": AuthErrorMessage,
    "ping": PingMessage,
    "command": CommandMessage,
    "dashboard_update": DashboardUpdateMessage,
}
"""``type`` -> model: the decoder's dispatch table."""


# --------------------------------------------------------------------------- codec
def frame_size_exceeds(frame: str | bytes, max_bytes: int) -> bool:
    """Whether ``frame`` is longer than ``max_bytes`` once UTF-8 encoded (encodes only when the
    character count cannot decide)."""
    if isinstance(frame, bytes):
        return len(frame) > max_bytes
    chars = len(frame)
    if chars > max_bytes:
        return True
    if chars * 4 <= max_bytes:  # a code point is at most 4 UTF-8 bytes
        return False
    return len(frame.encode("utf-8", "surrogatepass")) > max_bytes


def decode(frame: str | bytes, *, max_bytes: int) -> Message:
    """Parse one received frame into its message model.

    ``max_bytes`` is the limit of the frame's direction: :data:`NODE_FRAME_MAX_BYTES` on the
    manager, :data:`MANAGER_FRAME_MAX_BYTES` on a node. A binary frame is read as UTF-8 text.

    Raises :class:`FrameTooLarge` (checked first, before any parsing), :class:`UnknownMessageType`,
    or :class:`ProtocolError` (``MALFORMED`` or ``INVALID``). No error text holds frame content.
    """
    if frame_size_exceeds(frame, max_bytes):
        raise FrameTooLarge(max_bytes)
    return cast("Message", parse_typed_json(frame, MESSAGE_MODELS))


def encode(message: Message, *, max_bytes: int | None = None) -> str:
    """One compact JSON text frame (secrets revealed: this is what goes on the wire).

    Raises :class:`LocalProtocolError` when ``max_bytes`` is given and the frame is longer.
    """
    frame = message.model_dump_json()
    if max_bytes is not None and frame_size_exceeds(frame, max_bytes):
        raise LocalProtocolError(f"{message.type} frame larger than {max_bytes} bytes")
    return frame


# --------------------------------------------------------------------------- manager-side normaliser
def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters (interop.md 6 "Limits" truncates, never refuses)."""
    return text if len(text) <= max_chars else text[:max_chars]


def normalise_version(text: str) -> str:
    """A software version as the manager stores it: at most 256 chars (interop.md 6 "Limits")."""
    return truncate(text, VERSION_MAX_CHARS)


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """An event as the manager records it (interop.md 7.3 row, without id and bookkeeping).

    Node events arrive through :func:`normalise_event`; the manager's own (``connection``,
    ``compatibility``) are built directly. ``category`` is free text: edge categories (interop.md
    11), relay ones (``edge``, ``tunnel``, ``manager``) and the manager's.
    """

    severity: Severity
    category: str
    message: str
    details: JsonObject | None = None
    flow_id: str | None = None


_SEVERITIES: Final = {s.value: s for s in Severity}


def normalise_event(payload: EventPayload) -> NodeEvent:
    """Bound a received event for storage: ``message`` to 10 000 chars, ``category`` to 256
    (interop.md 6 "Limits"), an unknown severity to ``info`` (interop.md 11 "Severities")."""
    flow_id = payload.flow_id
    return NodeEvent(
        severity=_SEVERITIES.get(payload.severity, Severity.INFO),
        category=truncate(payload.category, CATEGORY_MAX_CHARS),
        message=truncate(payload.message, EVENT_MESSAGE_MAX_CHARS),
        details=payload.details,
        flow_id=truncate(flow_id, FLOW_ID_MAX_CHARS) if flow_id is not None else None,
    )


# --------------------------------------------------------------------------- node-side payload builders
def edge_stats_payload(
    *,
    flows: Sequence[FlowStats],
    tunnels: Sequence[JsonObject],
    uptime_secs: int,
    active_flows: int,
    total_flows: int,
) -> StatsPayload:
    """The edge's ``stats`` payload (interop.md 6 table): the same ``FlowStats`` the REST route serves."""
    return StatsPayload(
        {
            "flows": [flow.model_dump(mode="json") for flow in flows],
            "tunnels": list(tunnels),
            "uptime_secs": uptime_secs,
            "active_flows": active_flows,
            "total_flows": total_flows,
        }
    )


def edge_health_payload(health: HealthStatus, *, api_addr: str, monitor_addr: str | None) -> HealthPayload:
    """The edge's ``health`` payload: ``GET /health``'s body plus ``api_addr`` and ``monitor_addr``."""
    return HealthPayload({**health.model_dump(mode="json"), "api_addr": api_addr, "monitor_addr": monitor_addr})
