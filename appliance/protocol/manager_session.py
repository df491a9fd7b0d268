"""The manager's side of one node WebSocket (``/ws/node``, interop.md 6), sans-IO.

Theory of operation
-------------------
The hub creates one :class:`ManagerSession` per accepted socket, with the time it accepted it.
The node has 10 s to send ``auth`` (interop.md 6 "Handshake"); :meth:`ManagerSession.deadline`
says until when, and :meth:`ManagerSession.on_timer` answers ``auth_error`` and a close once it
has passed. The first frame must be ``auth``: anything else is answered with ``auth_error`` and a
close.

A valid ``auth`` becomes an :class:`AuthRequest` event. The session does not know the node table:
the driver checks the lockout (``policy.Lockout``), the registration token or the node secret and
``expires_at``, then calls :meth:`~ManagerSession.accept` (``register_ack`` for a registration,
``auth_ok`` for a login) or :meth:`~ManagerSession.reject` (``auth_error``, then close).

Once authenticated, each frame becomes one event: ``stats``, ``health``, ``event`` (bounded by
:func:`~appliance.protocol.node.normalise_event`), ``pong``, and the answers to the commands this
session sent. ``command_ack`` is matched to its command by ``command_id`` (an unknown id is
counted and ignored); ``get_config`` is answered by ``config_response``, which carries no id, so it
completes the oldest ``get_config`` still waiting. A command not answered within 10 s yields
:class:`CommandTimedOut` (the route's 504); when the socket closes, every command still waiting
yields :class:`CommandAbandoned` (the route's 502).

Frames the session cannot use are :class:`~appliance.protocol.session.FrameDropped` events: a frame
over 5 MiB (interop.md 6 "Limits": dropped and logged, the connection stays up), malformed JSON,
a type this protocol does not define (a newer node), a manager-only type. When nothing at all
has arrived for ``offline_threshold_s`` the session closes (interop.md 6 "Online and offline").

Transitions (``MANAGER_TRANSITIONS``)::

    AWAITING_AUTH  --auth frame-->          AUTHENTICATING   (AuthRequest)
    AWAITING_AUTH  --other frame-->         CLOSED           (auth_error, close)
    AWAITING_AUTH  --10 s passed-->         CLOSED           (auth_error, close)
    AUTHENTICATING --accept()-->            AUTHENTICATED    (register_ack | auth_ok)
    AUTHENTICATING --reject()-->            CLOSED           (auth_error, close)
    AUTHENTICATING --frame-->               AUTHENTICATING   (FrameDropped: the node spoke early)
    AUTHENTICATED  --frame-->               AUTHENTICATED    (one event)
    AUTHENTICATED  --send_command() etc.--> AUTHENTICATED
    AUTHENTICATED  --idle threshold-->      CLOSED           (close)
    any            --close()-->             CLOSED           (CommandAbandoned for each waiting)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

from pydantic import SecretStr

from appliance.models.events import Severity
from appliance.protocol.actions import GetConfig, KnownAction
from appliance.protocol.errors import ErrorKind, LocalProtocolError, ProtocolError
from appliance.protocol.node import (
    AUTH_TIMEOUT_S,
    COMMAND_TIMEOUT_S,
    MANAGER_FRAME_MAX_BYTES,
    NODE_FRAME_MAX_BYTES,
    OFFLINE_THRESHOLD_S,
    PROTOCOL_VERSION,
    AuthErrorMessage,
    AuthErrorPayload,
    AuthMessage,
    AuthOkMessage,
    CommandAckMessage,
    CommandMessage,
    CommandPayload,
    ConfigPayload,
    ConfigResponseMessage,
    EventMessage,
    HealthMessage,
    HealthPayload,
    Message,
    NodeEvent,
    PingMessage,
    PongMessage,
    RegisterAckMessage,
    RegisterAckPayload,
    SecretAuth,
    StatsMessage,
    StatsPayload,
    decode,
    encode,
    normalise_event,
    normalise_version,
)
from appliance.protocol.policy import lockout_identifier
from appliance.protocol.session import Close, CloseCause, FrameDropped, Step, short_reason, transition

__all__ = [
    "COMPATIBILITY_CATEGORY",
    "MANAGER_TRANSITIONS",
    "AuthRequest",
    "CommandAbandoned",
    "CommandCompleted",
    "CommandTimedOut",
    "CompatibilityWarning",
    "ConfigReceived",
    "CredentialKind",
    "EventReceived",
    "HealthReceived",
    "ManagerCounters",
    "ManagerEvent",
    "ManagerSession",
    "ManagerState",
    "ManagerTrigger",
    "NodeAuthenticated",
    "PongReceived",
    "StatsReceived",
]

COMPATIBILITY_CATEGORY: Final = "compatibility"
"""A manager-side event category (interop.md 6 "Protocol version"), not an edge one."""
AUTH_TIMEOUT_MESSAGE: Final = "Authentication timed out"
EXPECTED_AUTH_MESSAGE: Final = "Expected an auth message"


class ManagerState(StrEnum):
    AWAITING_AUTH = "awaiting_auth"
    """Socket accepted; waiting for the ``auth`` frame (10 s)."""
    AUTHENTICATING = "authenticating"
    """``auth`` received; waiting for the driver's ``accept`` or ``reject``."""
    AUTHENTICATED = "authenticated"
    """The node is online: frames become events, commands may be sent."""
    CLOSED = "closed"
    """Terminal. Late frames are ignored."""


class ManagerTrigger(StrEnum):
    AUTH_RECEIVED = "auth_received"  # peer: a valid auth as the first frame
    BAD_FIRST_FRAME = "bad_first_frame"  # peer: anything else as the first frame
    AUTH_TIMEOUT = "auth_timeout"  # timer: no auth within 10 s
    ACCEPT = "accept"  # driver: credentials valid
    REJECT = "reject"  # driver: credentials invalid, or the identifier is locked out
    EARLY_FRAME = "early_frame"  # peer: a frame before the auth reply
    FRAME = "frame"  # peer: any frame once authenticated (or after the close)
    SEND = "send"  # driver: a command, get_config or ping
    COMMAND_TIMEOUT = "command_timeout"  # timer: a command unanswered for 10 s
    IDLE_TIMEOUT = "idle_timeout"  # timer: nothing received for the offline threshold
    CLOSE = "close"  # driver: the socket closed (or is being closed)


_M, _T = ManagerState, ManagerTrigger
MANAGER_TRANSITIONS: Final[dict[tuple[ManagerState, ManagerTrigger], ManagerState]] = {
    (_M.AWAITING_AUTH, _T.AUTH_RECEIVED): _M.AUTHENTICATING,
    (_M.AWAITING_AUTH, _T.BAD_FIRST_FRAME): _M.CLOSED,
    (_M.AWAITING_AUTH, _T.AUTH_TIMEOUT): _M.CLOSED,
    (_M.AWAITING_AUTH, _T.CLOSE): _M.CLOSED,
    (_M.AUTHENTICATING, _T.ACCEPT): _M.AUTHENTICATED,
    (_M.AUTHENTICATING, _T.REJECT): _M.CLOSED,
    (_M.AUTHENTICATING, _T.EARLY_FRAME): _M.AUTHENTICATING,
    (_M.AUTHENTICATING, _T.CLOSE): _M.CLOSED,
    (_M.AUTHENTICATED, _T.FRAME): _M.AUTHENTICATED,
    (_M.AUTHENTICATED, _T.SEND): _M.AUTHENTICATED,
    (_M.AUTHENTICATED, _T.COMMAND_TIMEOUT): _M.AUTHENTICATED,
    (_M.AUTHENTICATED, _T.IDLE_TIMEOUT): _M.CLOSED,
    (_M.AUTHENTICATED, _T.CLOSE): _M.CLOSED,
    (_M.CLOSED, _T.FRAME): _M.CLOSED,
    (_M.CLOSED, _T.CLOSE): _M.CLOSED,
}
"""Every allowed ``(state, trigger)``; anything else raises ``LocalProtocolError``."""


class CredentialKind(StrEnum):
    """Which of the two ``auth`` variants the node sent (interop.md 6 "Handshake")."""

    REGISTRATION_TOKEN = "registration_token"
    NODE_SECRET = "node_secret"


# --------------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class AuthRequest:
    """A node presented credentials; the driver decides (``accept`` or ``reject``)."""

    credential: CredentialKind
    identifier: str
    """The lockout identifier: the ``node_id``, or ``token:<first 8 chars>`` (interop.md 6 "Lockout")."""
    node_id: str | None
    """The claimed node id (login path); None on the registration path."""
    secret: SecretStr = field(repr=False)
    """The registration token or the node secret. Compare it in constant time; never log it."""
    software_version: str
    """Truncated to 256 chars (interop.md 6 "Limits")."""
    protocol_version: int


@dataclass(frozen=True, slots=True)
class NodeAuthenticated:
    """The driver accepted the node: it is online (record the ``connection`` event, send get_config)."""

    node_id: str
    registered: bool
    """True on the registration path (``register_ack`` was sent)."""
    software_version: str
    protocol_version: int


@dataclass(frozen=True, slots=True)
class CompatibilityWarning:
    """The node speaks another protocol version: allowed, and recorded as a ``warning`` event with
    category ``compatibility`` (interop.md 6 "Protocol version")."""

    node_protocol_version: int
    manager_protocol_version: int

    @property
    def event(self) -> NodeEvent:
        """The manager-side event to record for the node."""
        return NodeEvent(
            severity=Severity.WARNING,
            category=COMPATIBILITY_CATEGORY,
            message=(
                f"Node speaks protocol version {self.node_protocol_version}; "
                f"this manager speaks version {self.manager_protocol_version}"
            ),
            details={
                "node_protocol_version": self.node_protocol_version,
                "manager_protocol_version": self.manager_protocol_version,
            },
        )


@dataclass(frozen=True, slots=True)
class StatsReceived:
    stats: StatsPayload
    timestamp: datetime
    """The node's ``timestamp``."""


@dataclass(frozen=True, slots=True)
class HealthReceived:
    health: HealthPayload
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class EventReceived:
    event: NodeEvent
    """Already bounded for storage (message 10 000, category 256; unknown severity -> info)."""
    timestamp: datetime


@dataclass(frozen=True, slots=True)
class CommandCompleted:
    """The node acknowledged a command this session sent (``success:false`` is the route's 422)."""

    command_id: uuid.UUID
    action_type: str
    success: bool
    error: str | None
    data: object


@dataclass(frozen=True, slots=True)
class ConfigReceived:
    """A ``config_response``: the node's config, to cache and serve as received (interop.md 13)."""

    command_id: uuid.UUID | None
    """The ``get_config`` it answers (the oldest waiting), or None when none was waiting."""
    config: ConfigPayload


@dataclass(frozen=True, slots=True)
class CommandTimedOut:
    """No answer within ``command_timeout_s`` (the route's 504). A late answer is then ignored."""

    command_id: uuid.UUID
    action_type: str


@dataclass(frozen=True, slots=True)
class CommandAbandoned:
    """The session closed while the command waited for its answer (the route's 502)."""

    command_id: uuid.UUID
    action_type: str


@dataclass(frozen=True, slots=True)
class PongReceived:
    timestamp: datetime


ManagerEvent = (
    AuthRequest
    | NodeAuthenticated
    | CompatibilityWarning
    | StatsReceived
    | HealthReceived
    | EventReceived
    | CommandCompleted
    | ConfigReceived
    | CommandTimedOut
    | CommandAbandoned
    | PongReceived
    | FrameDropped
)
"""Every event a ``ManagerSession`` reports."""


@dataclass(slots=True)
class ManagerCounters:
    """Plain-int counters for the hub's metrics."""

    frames_received: int = 0
    frames_dropped: dict[ErrorKind, int] = field(default_factory=lambda: dict.fromkeys(ErrorKind, 0))
    commands_sent: int = 0
    commands_timed_out: int = 0
    acks_unmatched: int = 0
    """``command_ack`` for an id this session is not waiting for (unknown, or already timed out)."""


@dataclass(frozen=True, slots=True)
class _Waiting:
    action_type: str
    deadline: float


class ManagerSession:
    """The manager's side of one node socket. See the module docstring for the sequence.

    Never does I/O and never reads a clock: ``now`` is the caller's monotonic clock (e.g.
    ``trio.current_time()``), and ``wall_clock`` gives the UTC time stamped into frames.
    Never raises on anything the node sends; raises :class:`LocalProtocolError` when the driver
    makes a call the current state does not allow.
    """

    def __init__(
        self,
        *,
        now: float,
        wall_clock: Callable[[], datetime],
        protocol_version: int = PROTOCOL_VERSION,
        auth_timeout_s: float = AUTH_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        offline_threshold_s: float | None = OFFLINE_THRESHOLD_S,
    ) -> None:
        """``now``: when the socket was accepted (the 10 s for ``auth`` run from here).
        ``offline_threshold_s``: the ``node_offline_threshold_secs`` setting; None: never."""
        self.state = ManagerState.AWAITING_AUTH
        self.counters = ManagerCounters()
        self.node_id: str | None = None
        """The authenticated node's id (set by ``accept``)."""
        self.software_version: str | None = None
        self.protocol_version: int | None = None
        self._wall_clock = wall_clock
        self._manager_protocol_version = protocol_version
        self._auth_deadline = now + auth_timeout_s
        self._command_timeout_s = command_timeout_s
        self._offline_threshold_s = offline_threshold_s
        self._last_received = now
        self._request: AuthRequest | None = None
        self._waiting: dict[uuid.UUID, _Waiting] = {}  # insertion order = send order
        self._handlers: dict[type[Message], Callable[[Message], ManagerEvent | None]] = {
            StatsMessage: self._on_stats,
            HealthMessage: self._on_health,
            EventMessage: self._on_event,
            CommandAckMessage: self._on_command_ack,
            ConfigResponseMessage: self._on_config_response,
            PongMessage: self._on_pong,
        }

    # ------------------------------------------------------------------ input
    def on_frame(self, frame: str | bytes, now: float) -> Step[ManagerEvent]:
        """Take one frame from the node."""
        self.counters.frames_received += 1
        self._last_received = now
        if self.state is ManagerState.CLOSED:
            self._fire(ManagerTrigger.FRAME)
            return Step()
        try:
            message: Message | None = decode(frame, max_bytes=NODE_FRAME_MAX_BYTES)
            error: ProtocolError | None = None
        except ProtocolError as exc:
            message, error = None, exc
        if self.state is ManagerState.AWAITING_AUTH:
            return self._on_first_frame(message, error)
        if self.state is ManagerState.AUTHENTICATING:
            # interop.md 6: the node waits for the reply; a frame now is out of turn. Dropped rather
            # than closed, so a driver still deciding can always answer.
            self._fire(ManagerTrigger.EARLY_FRAME)
            return Step(events=(self._dropped(ErrorKind.UNEXPECTED_TYPE, "Frame before the auth reply"),))
        self._fire(ManagerTrigger.FRAME)
        if error is not None:
            return Step(events=(self._dropped(error.kind, error.message),))
        assert message is not None
        handler = self._handlers.get(type(message))
        if handler is None:  # auth again, or a manager -> node type
            return Step(events=(self._dropped(ErrorKind.UNEXPECTED_TYPE, f"Unexpected {message.type} message"),))
        event = handler(message)
        return Step(events=(event,) if event is not None else ())

    def deadline(self) -> float | None:
        """When :meth:`on_timer` next has something to do (caller's clock), or None."""
        if self.state is ManagerState.AWAITING_AUTH:
            return self._auth_deadline
        if self.state is not ManagerState.AUTHENTICATED:
            return None
        times = [w.deadline for w in self._waiting.values()]
        if self._offline_threshold_s is not None:
            times.append(self._last_received + self._offline_threshold_s)
        return min(times) if times else None

    def on_timer(self, now: float) -> Step[ManagerEvent]:
        """Handle whatever is due at ``now``: the auth timeout, command timeouts, the idle close."""
        if self.state is ManagerState.AWAITING_AUTH:
            if now < self._auth_deadline:
                return Step()
            self._fire(ManagerTrigger.AUTH_TIMEOUT)
            return self._auth_error(AUTH_TIMEOUT_MESSAGE, CloseCause.AUTH_TIMEOUT)
        if self.state is not ManagerState.AUTHENTICATED:
            return Step()
        events: list[ManagerEvent] = []
        for command_id, waiting in list(self._waiting.items()):
            if now >= waiting.deadline:
                self._fire(ManagerTrigger.COMMAND_TIMEOUT)
                del self._waiting[command_id]
                self.counters.commands_timed_out += 1
                events.append(CommandTimedOut(command_id, waiting.action_type))
        threshold = self._offline_threshold_s
        if threshold is not None and now >= self._last_received + threshold:
            self._fire(ManagerTrigger.IDLE_TIMEOUT)
            events.extend(self._abandon_all())
            close = Close(CloseCause.IDLE, f"Nothing received for {threshold:g} s")
            return Step(events=tuple(events), close=close)
        return Step(events=tuple(events))

    # ------------------------------------------------------------------ the driver's decisions
    def accept(self, node_id: str, node_secret: SecretStr | str | None = None) -> Step[ManagerEvent]:
        """The credentials are valid. Registration path: pass the node's id and its fresh secret
        (a UUIDv4, sent in ``register_ack``). Login path: pass the node id, no secret (``auth_ok``).

        Events: :class:`NodeAuthenticated`, then :class:`CompatibilityWarning` on a version mismatch.
        """
        next_state = transition(MANAGER_TRANSITIONS, self.state, ManagerTrigger.ACCEPT)  # raises first
        request = self._request
        assert request is not None  # set on AUTH_RECEIVED, the only way into AUTHENTICATING
        registered = request.credential is CredentialKind.REGISTRATION_TOKEN
        if registered and node_secret is None:
            raise LocalProtocolError("accepting a registration needs the new node secret")
        if not registered and node_secret is not None:
            raise LocalProtocolError("a node-secret login is answered with auth_ok: pass no secret")
        if not registered and node_id != request.node_id:
            raise LocalProtocolError("accept() must name the node id the node presented")
        self.state = next_state
        self.node_id = node_id
        self.software_version = request.software_version
        self.protocol_version = request.protocol_version
        timestamp = self._wall_clock()
        reply: Message
        if node_secret is not None:
            secret = node_secret if isinstance(node_secret, SecretStr) else SecretStr(node_secret)
            payload = RegisterAckPayload(node_id=node_id, node_secret=secret)
            reply = RegisterAckMessage(timestamp=timestamp, payload=payload)
        else:
            reply = AuthOkMessage(timestamp=timestamp)
        events: list[ManagerEvent] = [
            NodeAuthenticated(node_id, registered, request.software_version, request.protocol_version)
        ]
        if request.protocol_version != self._manager_protocol_version:
            events.append(CompatibilityWarning(request.protocol_version, self._manager_protocol_version))
        self._request = None  # the secret is not kept past the decision
        return Step(events=tuple(events), frames=(self._encode(reply),))

    def reject(self, message: str) -> Step[ManagerEvent]:
        """The credentials are invalid, expired, or the identifier is locked out: ``auth_error``
        with ``message`` (a safe text, e.g. "Invalid node secret"), then close (interop.md 6)."""
        self._fire(ManagerTrigger.REJECT)
        self._request = None
        return self._auth_error(message, CloseCause.AUTH_FAILED)

    def send_command(self, action: KnownAction, command_id: uuid.UUID, *, now: float) -> str:
        """The ``command`` frame for ``action``; its answer is awaited for ``command_timeout_s``.

        ``command_id`` is the caller's fresh UUIDv4 (the session draws no random numbers). The
        caller has already refused an action over 50 KiB (413) or one the device type does not run.
        """
        self._fire(ManagerTrigger.SEND)
        if command_id in self._waiting:
            raise LocalProtocolError("command_id is already waiting for an answer")
        message = CommandMessage(
            timestamp=self._wall_clock(), payload=CommandPayload(command_id=command_id, action=action)
        )
        frame = self._encode(message)
        self._waiting[command_id] = _Waiting(action.type, now + self._command_timeout_s)
        self.counters.commands_sent += 1
        return frame

    def get_config(self, command_id: uuid.UUID, *, now: float) -> str:
        """A ``get_config`` command; it completes with :class:`ConfigReceived`."""
        return self.send_command(GetConfig(), command_id, now=now)

    def ping(self) -> str:
        """A ``ping`` frame (sent every ``ws_keepalive_interval_secs``, interop.md 6)."""
        self._fire(ManagerTrigger.SEND)
        return self._encode(PingMessage(timestamp=self._wall_clock()))

    def close(self) -> Step[ManagerEvent]:
        """The socket closed, or the driver closes it (e.g. a new registration token was issued,
        interop.md 7.2). Every command still waiting yields :class:`CommandAbandoned`."""
        self._fire(ManagerTrigger.CLOSE)
        self._request = None
        return Step(events=tuple(self._abandon_all()))

    @property
    def waiting_commands(self) -> frozenset[uuid.UUID]:
        """The ids of the commands still waiting for an answer."""
        return frozenset(self._waiting)

    # ------------------------------------------------------------------ internals
    def _fire(self, trigger: ManagerTrigger) -> None:
        self.state = transition(MANAGER_TRANSITIONS, self.state, trigger)

    def _encode(self, message: Message) -> str:
        return encode(message, max_bytes=MANAGER_FRAME_MAX_BYTES)  # interop.md 6: ≤ 1 MiB

    def _dropped(self, kind: ErrorKind, reason: str) -> FrameDropped:
        self.counters.frames_dropped[kind] += 1
        return FrameDropped(kind, reason)

    def _auth_error(self, text: str, cause: CloseCause) -> Step[ManagerEvent]:
        frame = self._encode(
            AuthErrorMessage(timestamp=self._wall_clock(), message=text, payload=AuthErrorPayload(message=text))
        )
        return Step(frames=(frame,), close=Close(cause, short_reason(text)))

    def _on_first_frame(self, message: Message | None, error: ProtocolError | None) -> Step[ManagerEvent]:
        if not isinstance(message, AuthMessage):
            self._fire(ManagerTrigger.BAD_FIRST_FRAME)
            if error is not None:
                self.counters.frames_dropped[error.kind] += 1
                text = error.message  # safe: never holds frame content
            else:
                self.counters.frames_dropped[ErrorKind.UNEXPECTED_TYPE] += 1
                text = EXPECTED_AUTH_MESSAGE
            return self._auth_error(text, CloseCause.PROTOCOL_VIOLATION)
        self._fire(ManagerTrigger.AUTH_RECEIVED)
        payload = message.payload
        if isinstance(payload, SecretAuth):
            credential, node_id, secret = CredentialKind.NODE_SECRET, payload.node_id, payload.node_secret
        else:
            credential, node_id, secret = CredentialKind.REGISTRATION_TOKEN, None, payload.registration_token
        request = AuthRequest(
            credential=credential,
            identifier=lockout_identifier(node_id=node_id, registration_token=secret),
            node_id=node_id,
            secret=secret,
            software_version=normalise_version(payload.software_version),
            protocol_version=payload.protocol_version,
        )
        self._request = request
        return Step(events=(request,))

    def _on_stats(self, message: Message) -> ManagerEvent:
        assert isinstance(message, StatsMessage)
        return StatsReceived(message.payload, message.timestamp)

    def _on_health(self, message: Message) -> ManagerEvent:
        assert isinstance(message, HealthMessage)
        return HealthReceived(message.payload, message.timestamp)

    def _on_event(self, message: Message) -> ManagerEvent:
        assert isinstance(message, EventMessage)
        return EventReceived(normalise_event(message.payload), message.timestamp)

    def _on_pong(self, message: Message) -> ManagerEvent:
        assert isinstance(message, PongMessage)
        return PongReceived(message.timestamp)

    def _on_command_ack(self, message: Message) -> ManagerEvent | None:
        assert isinstance(message, CommandAckMessage)
        ack = message.payload
        waiting = self._waiting.pop(ack.command_id, None)
        if waiting is None:  # interop.md 6: matched by command_id; an unknown id is ignored
            self.counters.acks_unmatched += 1
            return None
        # A get_config normally completes on config_response; a node that cannot produce its
        # config may still ack it with success:false, which completes it too.
        return CommandCompleted(ack.command_id, waiting.action_type, ack.success, ack.error, ack.data)

    def _on_config_response(self, message: Message) -> ManagerEvent:
        assert isinstance(message, ConfigResponseMessage)
        # config_response has no command_id (interop.md 6): it answers the oldest get_config.
        command_id = next((cid for cid, w in self._waiting.items() if w.action_type == "get_config"), None)
        if command_id is not None:
            del self._waiting[command_id]
        return ConfigReceived(command_id, message.payload)

    def _abandon_all(self) -> list[ManagerEvent]:
        events: list[ManagerEvent] = [CommandAbandoned(cid, w.action_type) for cid, w in self._waiting.items()]
        self._waiting.clear()
        return events
