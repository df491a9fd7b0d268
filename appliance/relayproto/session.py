"""The edge side of one relay control connection (interop.md 8.2), as a sans-IO state machine.

The driver opens the QUIC connection (ALPN ``mediaplane-relay``) and the first bidirectional
stream, then feeds :class:`EdgeRelaySession` the stream's bytes and the clock, and sends what
each :class:`RelayStep` says. The connection and each tunnel have a state:

- connection: ``idle`` → (``start``) ``hello_sent`` → (``hello_ack``) ``open`` → ``closed``;
- tunnel: ``binding`` → (``tunnel_waiting``) ``waiting`` → (``tunnel_ready``) ``ready``; any of them
  → (``tunnel_down`` / ``unbind`` / connection lost) ``down``, and the tunnel is forgotten.

``tunnel_ready`` may come without a ``tunnel_waiting`` first (the edge bound second). Binds may be
sent right after ``hello`` (the stream keeps the order); ``identify`` goes right after ``hello``,
before any bind.

Received frames never raise: bad JSON, an unknown ``type``, an invalid message, or a relay
message about a tunnel this side has not bound is a :class:`~appliance.protocol.session.FrameDropped`
event and the connection stays up (interop.md 8.1). A frame over 1 MiB closes the connection
(``RelayStep.close``). The driver's own misuse (a call the state does not allow, binding a tunnel
twice) raises :class:`~appliance.protocol.errors.LocalProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from appliance.protocol.errors import ErrorKind, LocalProtocolError, ProtocolError
from appliance.protocol.session import FrameDropped
from appliance.relayproto.framing import FrameDecoder, FrameTooLarge
from appliance.relayproto.messages import (
    PING_INTERVAL_S,
    RELAY_MESSAGE_TYPES,
    Direction,
    HelloAckMessage,
    HelloMessage,
    IdentifyMessage,
    Message,
    PingMessage,
    PongMessage,
    TunnelBindMessage,
    TunnelDownMessage,
    TunnelProtocol,
    TunnelReadyMessage,
    TunnelUnbindMessage,
    TunnelWaitingMessage,
    decode,
    encode,
)

__all__ = [
    "CONNECTION_LOST",
    "ConnectionState",
    "EdgeRelaySession",
    "HelloAcknowledged",
    "PongReceived",
    "RelayClose",
    "RelayEvent",
    "RelayStep",
    "TunnelDown",
    "TunnelReady",
    "TunnelState",
    "TunnelWaiting",
]

CONNECTION_LOST = "relay connection lost"
"""The ``reason`` of the local ``TunnelDown`` events when the connection goes (not a wire text)."""


class ConnectionState(StrEnum):
    IDLE = "idle"
    HELLO_SENT = "hello_sent"
    OPEN = "open"
    CLOSED = "closed"


class TunnelState(StrEnum):
    BINDING = "binding"
    WAITING = "waiting"
    READY = "ready"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class HelloAcknowledged:
    """The relay answered ``hello``. Its ``protocol_version`` is reported, not judged."""

    protocol_version: int
    software_version: str


@dataclass(frozen=True, slots=True)
class TunnelWaiting:
    tunnel_id: str


@dataclass(frozen=True, slots=True)
class TunnelReady:
    """Both legs are bound: the data plane of ``tunnel_id`` may start."""

    tunnel_id: str


@dataclass(frozen=True, slots=True)
class TunnelDown:
    """The leg is down: from the relay's ``tunnel_down`` (``local`` false) or because the
    connection went (``local`` true, ``reason`` :data:`CONNECTION_LOST`)."""

    tunnel_id: str
    reason: str
    local: bool = False


@dataclass(frozen=True, slots=True)
class PongReceived:
    pass


RelayEvent = HelloAcknowledged | TunnelWaiting | TunnelReady | TunnelDown | PongReceived | FrameDropped


@dataclass(frozen=True, slots=True)
class RelayClose:
    """Close the QUIC connection (the session is ``closed`` already). ``reason`` is safe to log."""

    reason: str


@dataclass(frozen=True, slots=True)
class RelayStep:
    """Send ``data`` on the control stream, then close if ``close``, then handle ``events``."""

    events: tuple[RelayEvent, ...] = ()
    data: bytes = b""
    close: RelayClose | None = None


@dataclass(slots=True)
class _Tunnel:
    direction: Direction
    protocol: TunnelProtocol
    state: TunnelState


class EdgeRelaySession:
    """One edge → relay control connection. Feed it the stream's bytes and ``now`` (seconds,
    any monotonic origin); it never reads a clock itself."""

    def __init__(self, *, software_version: str, edge_id: str | None = None) -> None:
        self._software_version = software_version
        self._edge_id = edge_id
        self._decoder = FrameDecoder()
        self._state = ConnectionState.IDLE
        self._tunnels: dict[str, _Tunnel] = {}
        self._next_ping: float | None = None
        self.relay_software_version: str | None = None

    # ------------------------------------------------------------------ queries
    @property
    def state(self) -> ConnectionState:
        return self._state

    def tunnel_state(self, tunnel_id: str) -> TunnelState:
        """The tunnel's state; ``down`` for one not bound (or no longer) on this connection."""
        tunnel = self._tunnels.get(tunnel_id)
        return TunnelState.DOWN if tunnel is None else tunnel.state

    @property
    def tunnels(self) -> dict[str, TunnelState]:
        return {tunnel_id: t.state for tunnel_id, t in self._tunnels.items()}

    # ------------------------------------------------------------------ driver calls
    def start(self, now: float) -> RelayStep:
        """The stream is open: ``hello`` (then ``identify`` when an edge id was given)."""
        self._require(ConnectionState.IDLE, "start")
        self._state = ConnectionState.HELLO_SENT
        self._next_ping = now + PING_INTERVAL_S
        data = encode(HelloMessage(software_version=self._software_version))
        if self._edge_id is not None:
            data += encode(IdentifyMessage(edge_id=self._edge_id))
        return RelayStep(data=data)

    def bind(
        self, tunnel_id: str, direction: Direction, protocol: TunnelProtocol, bind_token: str | None = None
    ) -> RelayStep:
        """Send ``tunnel_bind``; the tunnel is ``binding`` until the relay answers."""
        self._require_started("bind")
        if tunnel_id in self._tunnels:
            raise LocalProtocolError("tunnel already bound on this connection")
        message = TunnelBindMessage.model_validate(
            {"tunnel_id": tunnel_id, "direction": direction, "protocol": protocol, "bind_token": bind_token}
        )
        self._tunnels[tunnel_id] = _Tunnel(direction, protocol, TunnelState.BINDING)
        return RelayStep(data=encode(message))

    def unbind(self, tunnel_id: str) -> RelayStep:
        """Send ``tunnel_unbind`` and forget the tunnel (no event: the driver asked)."""
        self._require_started("unbind")
        if self._tunnels.pop(tunnel_id, None) is None:
            raise LocalProtocolError("tunnel not bound on this connection")
        return RelayStep(data=encode(TunnelUnbindMessage(tunnel_id=tunnel_id)))

    def tick(self, now: float) -> RelayStep:
        """Send ``ping`` when 15 s have passed since the last one (interop.md 8.2)."""
        if self._state not in (ConnectionState.HELLO_SENT, ConnectionState.OPEN) or self._next_ping is None:
            return RelayStep()
        if now < self._next_ping:
            return RelayStep()
        self._next_ping = now + PING_INTERVAL_S
        return RelayStep(data=encode(PingMessage()))

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do (None when closed or not started)."""
        return self._next_ping if self._state in (ConnectionState.HELLO_SENT, ConnectionState.OPEN) else None

    def connection_lost(self) -> RelayStep:
        """The QUIC connection went: every tunnel is down (local events). Idempotent."""
        if self._state is ConnectionState.CLOSED:
            return RelayStep()
        return RelayStep(events=self._close_all())

    def receive_data(self, data: bytes) -> RelayStep:
        """Bytes from the control stream, in chunks of any size."""
        if self._state is ConnectionState.CLOSED:
            return RelayStep()
        events: list[RelayEvent] = []
        try:
            bodies = self._decoder.feed(data)
        except FrameTooLarge as exc:
            return RelayStep(events=self._close_all(), close=RelayClose(exc.message))
        for body in bodies:
            events.extend(self._receive_frame(body))
        return RelayStep(events=tuple(events))

    # ------------------------------------------------------------------ internals
    def _receive_frame(self, body: bytes) -> list[RelayEvent]:
        try:
            message = decode(body)
        except ProtocolError as exc:
            return [FrameDropped(exc.kind, exc.message)]
        if message.type not in RELAY_MESSAGE_TYPES:
            return [FrameDropped(ErrorKind.UNEXPECTED_TYPE, f"Unexpected {message.type} message from a relay")]
        return self._handle(message)

    def _handle(self, message: Message) -> list[RelayEvent]:
        if isinstance(message, HelloAckMessage):
            if self._state is not ConnectionState.HELLO_SENT:
                return [FrameDropped(ErrorKind.UNEXPECTED_TYPE, "Repeated hello_ack")]
            self._state = ConnectionState.OPEN
            self.relay_software_version = message.software_version
            return [HelloAcknowledged(message.protocol_version, message.software_version)]
        if isinstance(message, PongMessage):
            return [PongReceived()]
        if isinstance(message, TunnelWaitingMessage | TunnelReadyMessage | TunnelDownMessage):
            tunnel = self._tunnels.get(message.tunnel_id)
            if tunnel is None:
                return [FrameDropped(ErrorKind.UNEXPECTED_TYPE, f"{message.type} for a tunnel not bound here")]
            if isinstance(message, TunnelDownMessage):
                del self._tunnels[message.tunnel_id]
                return [TunnelDown(message.tunnel_id, message.reason)]
            if isinstance(message, TunnelReadyMessage):
                tunnel.state = TunnelState.READY
                return [TunnelReady(message.tunnel_id)]
            # From binding, or from ready (the relay waits for a peer leg again).
            tunnel.state = TunnelState.WAITING
            return [TunnelWaiting(message.tunnel_id)]
        return [FrameDropped(ErrorKind.UNEXPECTED_TYPE, f"Unexpected {message.type} message from a relay")]

    def _close_all(self) -> tuple[RelayEvent, ...]:
        self._state = ConnectionState.CLOSED
        self._next_ping = None
        events = tuple(TunnelDown(tunnel_id, CONNECTION_LOST, local=True) for tunnel_id in self._tunnels)
        self._tunnels.clear()
        return events

    def _require(self, state: ConnectionState, call: str) -> None:
        if self._state is not state:
            raise LocalProtocolError(f"{call!r} is not allowed in state {self._state.value!r}")

    def _require_started(self, call: str) -> None:
        if self._state not in (ConnectionState.HELLO_SENT, ConnectionState.OPEN):
            raise LocalProtocolError(f"{call!r} is not allowed in state {self._state.value!r}")
