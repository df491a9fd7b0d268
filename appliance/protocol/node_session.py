"""A node's side of its manager WebSocket (interop.md 6), sans-IO: the edge link and the relay
link both drive it.

Theory of operation
-------------------
One :class:`NodeSession` per connection attempt. Once the socket is open the driver sends
:meth:`NodeSession.start`'s ``auth`` frame: ``node_id`` + ``node_secret`` when the node holds both,
else the registration token (interop.md 6 "Which credential"). The manager answers once:

- ``register_ack``: :class:`Registered` (persist the new credentials: the edge writes
  ``manager.node_id`` to ``config.json`` and the secret to ``secrets.json`` and clears the token,
  the relay rewrites ``relay.json``), then :class:`Authenticated`;
- ``auth_ok``: :class:`Authenticated`;
- ``auth_error``: :class:`AuthRejected` (the text from the top level or the payload) and a close.

No reply within 10 s: :class:`AuthTimedOut` and a close (interop.md 6 "Node client"). On
:class:`Authenticated` the driver resets its ``Backoff``, sends ``health`` at once, flushes its
``EventQueue`` in order, then sends ``stats`` every 1 s and ``health`` every 15 s.

Then ``ping`` is answered with ``pong`` inside the session (the step's ``frames``), and each
``command`` becomes :class:`CommandReceived`. Its action is a model, or an ``UnknownAction``
(a type the protocol or this device type does not run) or an ``InvalidAction`` whose ``error``
is the ack text. The driver answers every command with :meth:`NodeSession.command_ack`, except
``get_config``, answered with :meth:`NodeSession.config_response`.

Transitions (``NODE_TRANSITIONS``)::

    IDLE           --start()-->          AWAITING_REPLY   (auth frame)
    IDLE           --frame-->            CLOSED           (close: the manager spoke first)
    AWAITING_REPLY --register_ack-->     AUTHENTICATED    (Registered, Authenticated)
    AWAITING_REPLY --auth_ok-->          AUTHENTICATED    (Authenticated)
    AWAITING_REPLY --auth_error-->       CLOSED           (AuthRejected, close)
    AWAITING_REPLY --10 s passed-->      CLOSED           (AuthTimedOut, close)
    AWAITING_REPLY --other frame-->      CLOSED           (close)
    AUTHENTICATED  --frame-->            AUTHENTICATED    (pong, CommandReceived, FrameDropped)
    AUTHENTICATED  --auth_error-->       CLOSED           (AuthRejected, close)
    AUTHENTICATED  --stats() etc.-->     AUTHENTICATED
    any            --close()-->          CLOSED
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

from pydantic import SecretStr

from appliance.models.events import Event
from appliance.protocol._wire import JsonObject
from appliance.protocol.actions import (
    AnyAction,
    DeviceType,
    InvalidAction,
    UnknownAction,
    action_types_for,
)
from appliance.protocol.errors import ErrorKind, LocalProtocolError, ProtocolError
from appliance.protocol.node import (
    AUTH_TIMEOUT_S,
    MANAGER_FRAME_MAX_BYTES,
    NODE_FRAME_MAX_BYTES,
    PROTOCOL_VERSION,
    AuthErrorMessage,
    AuthMessage,
    AuthOkMessage,
    CommandAckMessage,
    CommandAckPayload,
    CommandMessage,
    ConfigPayload,
    ConfigResponseMessage,
    EventMessage,
    EventPayload,
    HealthMessage,
    HealthPayload,
    Message,
    PingMessage,
    PongMessage,
    RegisterAckMessage,
    SecretAuth,
    StatsMessage,
    StatsPayload,
    TokenAuth,
    decode,
    encode,
)
from appliance.protocol.session import Close, CloseCause, FrameDropped, Step, short_reason, transition

__all__ = [
    "NODE_TRANSITIONS",
    "AuthRejected",
    "AuthTimedOut",
    "Authenticated",
    "CommandReceived",
    "NodeCounters",
    "NodeCredentials",
    "NodeSession",
    "NodeSessionEvent",
    "NodeState",
    "NodeTrigger",
    "Registered",
]

REPLY_TIMEOUT_MESSAGE: Final = "No auth reply from the manager within the timeout"


class NodeState(StrEnum):
    IDLE = "idle"
    """Connected; ``auth`` not sent yet."""
    AWAITING_REPLY = "awaiting_reply"
    """``auth`` sent; waiting 10 s for ``register_ack``, ``auth_ok`` or ``auth_error``."""
    AUTHENTICATED = "authenticated"
    """Online: commands come in, stats/health/events go out."""
    CLOSED = "closed"
    """Terminal: the driver backs off and starts a new session."""


class NodeTrigger(StrEnum):
    SEND_AUTH = "send_auth"  # driver: start()
    REGISTERED = "registered"  # peer: register_ack
    AUTH_OK = "auth_ok"  # peer: auth_ok
    AUTH_ERROR = "auth_error"  # peer: auth_error
    REPLY_TIMEOUT = "reply_timeout"  # timer: no reply within 10 s
    UNEXPECTED_FRAME = "unexpected_frame"  # peer: anything else before the reply
    FRAME = "frame"  # peer: any other frame once authenticated (or after the close)
    SEND = "send"  # driver: stats, health, event, command_ack, config_response
    CLOSE = "close"  # driver: the socket closed


_N, _T = NodeState, NodeTrigger
NODE_TRANSITIONS: Final[dict[tuple[NodeState, NodeTrigger], NodeState]] = {
    (_N.IDLE, _T.SEND_AUTH): _N.AWAITING_REPLY,
    (_N.IDLE, _T.UNEXPECTED_FRAME): _N.CLOSED,
    (_N.IDLE, _T.CLOSE): _N.CLOSED,
    (_N.AWAITING_REPLY, _T.REGISTERED): _N.AUTHENTICATED,
    (_N.AWAITING_REPLY, _T.AUTH_OK): _N.AUTHENTICATED,
    (_N.AWAITING_REPLY, _T.AUTH_ERROR): _N.CLOSED,
    (_N.AWAITING_REPLY, _T.REPLY_TIMEOUT): _N.CLOSED,
    (_N.AWAITING_REPLY, _T.UNEXPECTED_FRAME): _N.CLOSED,
    (_N.AWAITING_REPLY, _T.CLOSE): _N.CLOSED,
    (_N.AUTHENTICATED, _T.FRAME): _N.AUTHENTICATED,
    (_N.AUTHENTICATED, _T.AUTH_ERROR): _N.CLOSED,
    (_N.AUTHENTICATED, _T.SEND): _N.AUTHENTICATED,
    (_N.AUTHENTICATED, _T.CLOSE): _N.CLOSED,
    (_N.CLOSED, _T.FRAME): _N.CLOSED,
    (_N.CLOSED, _T.CLOSE): _N.CLOSED,
}
"""Every allowed ``(state, trigger)``; anything else raises ``LocalProtocolError``."""


@dataclass(frozen=True, slots=True)
class NodeCredentials:
    """What the node holds (edge: ``manager`` in config.json + secrets.json; relay: relay.json).

    interop.md 6 "Which credential": ``node_id`` + ``node_secret`` are used whenever both are held,
    even if a registration token is held too.
    """

    node_id: str | None = None
    node_secret: SecretStr | None = field(default=None, repr=False)
    registration_token: SecretStr | None = field(default=None, repr=False)

    @property
    def uses_node_secret(self) -> bool:
        """Whether ``auth`` will carry the node id and secret (else the registration token)."""
        return self.node_id is not None and self.node_secret is not None


# --------------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Registered:
    """``register_ack``: persist these before anything else (interop.md 6 "Credential persistence")."""

    node_id: str
    node_secret: SecretStr = field(repr=False)


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The manager accepted the node: reset the backoff, send ``health``, flush queued events."""

    registered: bool
    """True when this was the registration (a :class:`Registered` came just before)."""


@dataclass(frozen=True, slots=True)
class AuthRejected:
    """``auth_error``: the manager refused the credentials (and closes the socket)."""

    message: str
    """The manager's text, e.g. "Invalid node secret" (record a critical ``manager`` event)."""


@dataclass(frozen=True, slots=True)
class AuthTimedOut:
    """No reply to ``auth`` within ``reply_timeout_s`` (10 s)."""


@dataclass(frozen=True, slots=True)
class CommandReceived:
    """A ``command``. Answer it with ``command_ack`` (``config_response`` for ``get_config``)."""

    command_id: uuid.UUID
    action: AnyAction
    """A known action model; or ``UnknownAction`` / ``InvalidAction``: ack ``success=False,
    error=action.error``."""


NodeSessionEvent = Registered | Authenticated | AuthRejected | AuthTimedOut | CommandReceived | FrameDropped
"""Every event a ``NodeSession`` reports."""


@dataclass(slots=True)
class NodeCounters:
    """Plain-int counters for the link's metrics."""

    frames_received: int = 0
    frames_dropped: dict[ErrorKind, int] = field(default_factory=lambda: dict.fromkeys(ErrorKind, 0))
    pings_answered: int = 0
    commands_received: int = 0


class NodeSession:
    """A node's side of one manager connection. See the module docstring for the sequence.

    Never does I/O and never reads a clock: ``now`` is the caller's monotonic clock, and
    ``wall_clock`` gives the UTC time stamped into frames. Never raises on anything the manager
    sends; raises :class:`LocalProtocolError` when the driver makes a call the state does not
    allow, or builds a frame over 5 MiB (interop.md 6 "Limits": the manager would drop it).
    """

    def __init__(
        self,
        *,
        credentials: NodeCredentials,
        software_version: str,
        device_type: DeviceType,
        wall_clock: Callable[[], datetime],
        protocol_version: int = PROTOCOL_VERSION,
        reply_timeout_s: float = AUTH_TIMEOUT_S,
    ) -> None:
        """Raises :class:`LocalProtocolError` when ``credentials`` hold neither a node id + secret
        nor a registration token (there is nothing to authenticate with)."""
        if not credentials.uses_node_secret and credentials.registration_token is None:
            raise LocalProtocolError("no node id + secret and no registration token to authenticate with")
        self.state = NodeState.IDLE
        self.counters = NodeCounters()
        self.credentials = credentials
        """The credentials in use; replaced by the new ones on ``register_ack``."""
        self.device_type = device_type
        self._software_version = software_version
        self._protocol_version = protocol_version
        self._wall_clock = wall_clock
        self._reply_timeout_s = reply_timeout_s
        self._reply_deadline: float | None = None
        self._supported = action_types_for(device_type)

    # ------------------------------------------------------------------ handshake
    def start(self, now: float) -> str:
        """The ``auth`` frame to send first; the 10 s for the reply start at ``now``."""
        self._fire(NodeTrigger.SEND_AUTH)
        self._reply_deadline = now + self._reply_timeout_s
        creds = self.credentials
        payload: SecretAuth | TokenAuth
        if creds.node_id is not None and creds.node_secret is not None:
            payload = SecretAuth(
                node_id=creds.node_id,
                node_secret=creds.node_secret,
                software_version=self._software_version,
                protocol_version=self._protocol_version,
            )
        else:
            assert creds.registration_token is not None  # checked in __init__
            payload = TokenAuth(
                registration_token=creds.registration_token,
                software_version=self._software_version,
                protocol_version=self._protocol_version,
            )
        # interop.md 6 "Envelope": only auth may leave out the timestamp; ours does, as the example.
        return self._encode(AuthMessage(payload=payload))

    def deadline(self) -> float | None:
        """When the auth reply is due (caller's clock) while waiting for it, else None."""
        return self._reply_deadline if self.state is NodeState.AWAITING_REPLY else None

    def on_timer(self, now: float) -> Step[NodeSessionEvent]:
        """At or after :meth:`deadline`: :class:`AuthTimedOut` and a close; before it, nothing."""
        if self.state is not NodeState.AWAITING_REPLY or self._reply_deadline is None or now < self._reply_deadline:
            return Step()
        self._fire(NodeTrigger.REPLY_TIMEOUT)
        return Step(events=(AuthTimedOut(),), close=Close(CloseCause.AUTH_TIMEOUT, REPLY_TIMEOUT_MESSAGE))

    # ------------------------------------------------------------------ input
    def on_frame(self, frame: str | bytes, now: float) -> Step[NodeSessionEvent]:
        """Take one frame from the manager."""
        self.counters.frames_received += 1
        if self.state is NodeState.CLOSED:
            self._fire(NodeTrigger.FRAME)
            return Step()
        try:
            message: Message | None = decode(frame, max_bytes=MANAGER_FRAME_MAX_BYTES)
            error: ProtocolError | None = None
        except ProtocolError as exc:
            message, error = None, exc
        if isinstance(message, AuthErrorMessage) and self.state is not NodeState.IDLE:
            self._fire(NodeTrigger.AUTH_ERROR)
            text = message.text
            return Step(events=(AuthRejected(text),), close=Close(CloseCause.AUTH_FAILED, short_reason(text)))
        if self.state is NodeState.IDLE:
            self._fire(NodeTrigger.UNEXPECTED_FRAME)
            self.counters.frames_dropped[error.kind if error else ErrorKind.UNEXPECTED_TYPE] += 1
            return Step(close=Close(CloseCause.PROTOCOL_VIOLATION, "Frame before auth was sent"))
        if self.state is NodeState.AWAITING_REPLY:
            return self._on_reply(message, error)
        self._fire(NodeTrigger.FRAME)
        if error is not None:
            return Step(events=(self._dropped(error.kind, error.message),))
        if isinstance(message, PingMessage):
            self.counters.pings_answered += 1
            return Step(frames=(self._encode(PongMessage(timestamp=self._wall_clock())),))
        if isinstance(message, CommandMessage):
            self.counters.commands_received += 1
            command = message.payload
            return Step(events=(CommandReceived(command.command_id, self._for_this_node(command.action)),))
        assert message is not None
        return Step(events=(self._dropped(ErrorKind.UNEXPECTED_TYPE, f"Unexpected {message.type} message"),))

    # ------------------------------------------------------------------ output (AUTHENTICATED only)
    def stats(self, payload: StatsPayload | JsonObject) -> str:
        """A ``stats`` frame (every 1 s). Edge: build ``payload`` with ``edge_stats_payload``."""
        body = payload if isinstance(payload, StatsPayload) else StatsPayload(payload)
        return self._send(StatsMessage(timestamp=self._wall_clock(), payload=body))

    def health(self, payload: HealthPayload | JsonObject) -> str:
        """A ``health`` frame (right after auth, then every 15 s). Edge: ``edge_health_payload``."""
        body = payload if isinstance(payload, HealthPayload) else HealthPayload(payload)
        return self._send(HealthMessage(timestamp=self._wall_clock(), payload=body))

    def event(self, event: Event | EventPayload) -> str:
        """An ``event`` frame. The edge passes its :class:`Event`; the relay, whose categories
        (``edge``...) are not edge ones, passes an :class:`EventPayload`."""
        body = event if isinstance(event, EventPayload) else EventPayload.from_event(event)
        return self._send(EventMessage(timestamp=self._wall_clock(), payload=body))

    def command_ack(
        self, command_id: uuid.UUID, *, success: bool, error: str | None = None, data: object = None
    ) -> str:
        """A ``command_ack`` frame ``{command_id, success, error, data?}`` (interop.md 6)."""
        if success and error is not None:
            raise LocalProtocolError("a successful command_ack carries no error")
        if not success and not error:
            raise LocalProtocolError("a failed command_ack needs its error text")
        payload = CommandAckPayload(command_id=command_id, success=success, error=error, data=data)
        return self._send(CommandAckMessage(timestamp=self._wall_clock(), payload=payload))

    def config_response(self, config: ConfigPayload | JsonObject) -> str:
        """The answer to ``get_config``: the config with secrets stripped, bare (not ``{config}``)."""
        body = config if isinstance(config, ConfigPayload) else ConfigPayload(config)
        return self._send(ConfigResponseMessage(timestamp=self._wall_clock(), payload=body))

    def close(self) -> None:
        """The socket closed (or the driver closes it). The next attempt is a new session."""
        self._fire(NodeTrigger.CLOSE)

    # ------------------------------------------------------------------ internals
    def _fire(self, trigger: NodeTrigger) -> None:
        self.state = transition(NODE_TRANSITIONS, self.state, trigger)

    def _encode(self, message: Message) -> str:
        return encode(message, max_bytes=NODE_FRAME_MAX_BYTES)  # interop.md 6: the manager drops > 5 MiB

    def _send(self, message: Message) -> str:
        # Check the state before building, so a refused call changes nothing.
        transition(NODE_TRANSITIONS, self.state, NodeTrigger.SEND)
        frame = self._encode(message)
        self._fire(NodeTrigger.SEND)
        return frame

    def _dropped(self, kind: ErrorKind, reason: str) -> FrameDropped:
        self.counters.frames_dropped[kind] += 1
        return FrameDropped(kind, reason)

    def _on_reply(self, message: Message | None, error: ProtocolError | None) -> Step[NodeSessionEvent]:
        if isinstance(message, RegisterAckMessage):
            self._fire(NodeTrigger.REGISTERED)
            ack = message.payload
            # The session now holds the new credentials; the token is spent (interop.md 6).
            self.credentials = NodeCredentials(node_id=ack.node_id, node_secret=ack.node_secret)
            return Step(events=(Registered(ack.node_id, ack.node_secret), Authenticated(registered=True)))
        if isinstance(message, AuthOkMessage):
            self._fire(NodeTrigger.AUTH_OK)
            return Step(events=(Authenticated(registered=False),))
        # interop.md 6 "Handshake": the manager answers once, with one of the three replies.
        self._fire(NodeTrigger.UNEXPECTED_FRAME)
        if error is not None:
            self.counters.frames_dropped[error.kind] += 1
            reason = f"Bad auth reply: {error.message}"
        else:
            assert message is not None
            self.counters.frames_dropped[ErrorKind.UNEXPECTED_TYPE] += 1
            reason = f"Expected an auth reply, got {message.type}"
        return Step(close=Close(CloseCause.PROTOCOL_VIOLATION, short_reason(reason)))

    def _for_this_node(self, action: AnyAction) -> AnyAction:
        # A known type this device type does not run (an edge asked to list_tunnels) is answered
        # like a type nobody knows (interop.md 6: "Unknown command: <type>").
        if isinstance(action, UnknownAction) or action.type in self._supported:
            return action
        raw = action.raw if isinstance(action, InvalidAction) else action.model_dump(mode="json")
        return UnknownAction(type=action.type, raw=raw)
