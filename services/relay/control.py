"""The relay side of the relay ↔ edge QUIC control protocol (interop.md 8.1, 8.2, 8.4 and 13), sans-IO.

:class:`RelayTunnels` is the relay's tunnel table: for each tunnel, which connection holds its
``ingress`` and its ``egress`` leg, its status (``waiting_ingress`` / ``waiting_egress`` /
``ready``), the manager's bind authorizations (``authorize_tunnel`` / ``revoke_tunnel``) and the
8.1 limits. :class:`RelayConnection` is one edge's control connection; the driver feeds it the
decoded control messages (or the stream's raw bytes) and ``now``. Every call answers a
:class:`RelayOutput`: the messages to send, as ``(connection_id, message)`` pairs (a bind can
answer the binding edge *and* its peer, or the edge a newer bind replaced), and the events.

Theory of operation (interop.md 8.2, 13):

- ``hello`` → ``hello_ack``; anything else before ``hello`` is dropped (8.1: logged and skipped).
- ``identify`` names the edge, before any bind; without it the edge is ``<remote addr>#<counter>``.
- ``tunnel_bind`` is checked in this order: bind token (8.4, :func:`bind_allowed`), the
  per-connection tunnel limit (8.1), the peer leg's protocol. A failure answers ``tunnel_down``
  with the fixed reason and changes no entry. Otherwise an older holder of the same leg gets
  ``tunnel_down`` ``replaced by newer bind``; then ``tunnel_ready`` goes to both legs when the
  peer leg is bound, else ``tunnel_waiting`` to the binder.
- ``tunnel_unbind`` or a lost connection frees the leg. The entry stays (status ``waiting_*``,
  that side's edge id null) while the other leg is bound, and that leg is told ``tunnel_waiting``;
  the entry goes when no leg is left.
- :meth:`RelayTunnels.close_tunnel` (the admin DELETE and the manager's ``close_tunnel``):
  ``tunnel_down`` to every bound leg, and the entry is removed at once.

No I/O, no clock reads, no randomness: ``now`` is the caller's monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from appliance.protocol.errors import ErrorKind, ProtocolError
from appliance.protocol.session import FrameDropped
from appliance.relayproto import (
    BIND_AUTH_FAILED,
    EDGE_MESSAGE_TYPES,
    PROTOCOL_MISMATCH,
    REPLACED_BY_NEWER_BIND,
    TUNNEL_LIMIT_EXCEEDED,
    BindAuthorization,
    Direction,
    FrameDecoder,
    FrameTooLarge,
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
    bind_allowed,
    decode,
)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS_PER_IP",
    "DEFAULT_MAX_TUNNELS_PER_CONNECTION",
    "TUNNEL_CLOSED",
    "BindRejected",
    "ConnectionClosed",
    "ConnectionId",
    "EdgeIdentified",
    "HelloReceived",
    "LegBound",
    "LegReleased",
    "RelayConnection",
    "RelayCounters",
    "RelayEvent",
    "RelayOutput",
    "RelayTunnels",
    "Send",
    "TunnelEntry",
    "TunnelLeg",
    "TunnelRemoved",
    "TunnelStatus",
]

ConnectionId = int
"""The driver's handle for one QUIC connection (any int unique among live connections)."""
Send = tuple[ConnectionId, Message]
"""One control message to send on that connection's control stream."""

DEFAULT_MAX_CONNECTIONS_PER_IP: Final = 64
"""interop.md 1.2 ``max_connections_per_ip``."""
DEFAULT_MAX_TUNNELS_PER_CONNECTION: Final = 100
"""interop.md 1.2 ``max_tunnels_per_connection``."""
TUNNEL_CLOSED: Final = "tunnel closed"
"""Not fixed by interop.md: the default ``tunnel_down`` reason of :meth:`RelayTunnels.close_tunnel`."""

_DIRECTIONS: Final[tuple[Direction, Direction]] = ("ingress", "egress")
_OTHER: Final[dict[Direction, Direction]] = {"ingress": "egress", "egress": "ingress"}


class TunnelStatus(StrEnum):
    """``GET /api/v1/tunnels`` ``status`` (interop.md 13)."""

    WAITING_INGRESS = "waiting_ingress"
    WAITING_EGRESS = "waiting_egress"
    READY = "active"  # the spec word; READY names the state, both legs bound
    EMPTY = "empty"  # never listed: an entry with no leg left is removed (interop.md 13)


@dataclass(frozen=True, slots=True)
class TunnelLeg:
    """One bound leg: the connection that holds it and that edge's id."""

    connection_id: ConnectionId
    edge_id: str
    remote_addr: str
    bound_at: float


@dataclass(slots=True)
class TunnelEntry:
    """One tunnel the relay knows: exists from the first bind until no leg is left (or
    ``close_tunnel``). ``protocol`` is the one the legs named."""

    tunnel_id: str
    protocol: TunnelProtocol
    created_at: float
    ingress: TunnelLeg | None = None
    egress: TunnelLeg | None = None

    def leg(self, direction: Direction) -> TunnelLeg | None:
        return self.ingress if direction == "ingress" else self.egress

    def _set(self, direction: Direction, leg: TunnelLeg | None) -> None:
        if direction == "ingress":
            self.ingress = leg
        else:
            self.egress = leg

    @property
    def status(self) -> TunnelStatus:
        """``active`` (READY) with both legs; else waiting for the missing one (interop.md 13)."""
        if self.ingress is None:
            return TunnelStatus.WAITING_INGRESS
        if self.egress is None:
            return TunnelStatus.WAITING_EGRESS
        return TunnelStatus.READY

    @property
    def ingress_edge_id(self) -> str | None:
        return None if self.ingress is None else self.ingress.edge_id

    @property
    def egress_edge_id(self) -> str | None:
        return None if self.egress is None else self.egress.edge_id


# --------------------------------------------------------------------------- events (H3)
@dataclass(frozen=True, slots=True)
class HelloReceived:
    """The edge said ``hello`` (its ``protocol_version`` is reported, not judged)."""

    connection_id: ConnectionId
    protocol_version: int
    software_version: str


@dataclass(frozen=True, slots=True)
class EdgeIdentified:
    connection_id: ConnectionId
    edge_id: str


@dataclass(frozen=True, slots=True)
class LegBound:
    """A bind was accepted; ``ready`` when both legs are now bound."""

    tunnel_id: str
    direction: Direction
    connection_id: ConnectionId
    edge_id: str
    ready: bool


@dataclass(frozen=True, slots=True)
class BindRejected:
    """A bind answered ``tunnel_down``; ``reason`` is the wire reason (no token in it)."""

    tunnel_id: str
    direction: Direction
    connection_id: ConnectionId
    reason: str


@dataclass(frozen=True, slots=True)
class LegReleased:
    """A leg left: ``reason`` is ``unbind``, ``connection lost``, ``replaced by newer bind`` or a
    ``close_tunnel`` reason."""

    tunnel_id: str
    direction: Direction
    connection_id: ConnectionId
    reason: str


@dataclass(frozen=True, slots=True)
class TunnelRemoved:
    """The entry is gone (no leg left, or ``close_tunnel``)."""

    tunnel_id: str


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Close this QUIC connection (a frame over 1 MiB, interop.md 8.1; or refused at open)."""

    connection_id: ConnectionId
    reason: str


RelayEvent = (
    HelloReceived
    | EdgeIdentified
    | LegBound
    | BindRejected
    | LegReleased
    | TunnelRemoved
    | ConnectionClosed
    | FrameDropped
)


@dataclass(frozen=True, slots=True)
class RelayOutput:
    """Send each ``sends`` item in order, then handle ``events`` (close on :class:`ConnectionClosed`)."""

    sends: tuple[Send, ...] = ()
    events: tuple[RelayEvent, ...] = ()


@dataclass(slots=True)
class RelayCounters:
    """Counters (interop.md 13): ``connections_total`` and ``peak_*`` are lifetime figures."""

    connections_total: int = 0
    connections_refused: int = 0
    peak_connections: int = 0
    peak_tunnels: int = 0
    binds_accepted: int = 0
    binds_rejected_auth: int = 0
    binds_rejected_limit: int = 0
    binds_rejected_protocol: int = 0
    legs_replaced: int = 0
    tunnels_closed: int = 0
    frames_dropped: int = 0


@dataclass(slots=True)
class _Collector:
    sends: list[Send] = field(default_factory=list)
    events: list[RelayEvent] = field(default_factory=list)

    def output(self) -> RelayOutput:
        return RelayOutput(tuple(self.sends), tuple(self.events))


def _format_addr(remote_addr: tuple[str, int]) -> str:
    host, port = remote_addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --------------------------------------------------------------------------- the table
class RelayTunnels:
    """The relay's tunnels, authorizations and live control connections."""

    def __init__(
        self,
        *,
        software_version: str,
        require_bind_auth: bool = False,
        max_tunnels_per_connection: int = DEFAULT_MAX_TUNNELS_PER_CONNECTION,
        max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP,
    ) -> None:
        self.software_version = software_version
        self.require_bind_auth = require_bind_auth
        self.max_tunnels_per_connection = max_tunnels_per_connection
        self.max_connections_per_ip = max_connections_per_ip
        self.counters = RelayCounters()
        self._tunnels: dict[str, TunnelEntry] = {}
        self._authorizations: dict[str, BindAuthorization] = {}
        self._connections: dict[ConnectionId, RelayConnection] = {}
        self._per_ip: dict[str, int] = {}

    # ------------------------------------------------------------------ queries
    @property
    def tunnels(self) -> dict[str, TunnelEntry]:
        """The live entries (a copy of the mapping; the entries themselves are live)."""
        return dict(self._tunnels)

    def tunnel(self, tunnel_id: str) -> TunnelEntry | None:
        return self._tunnels.get(tunnel_id)

    @property
    def total_tunnels(self) -> int:
        """Tunnels that exist now, half-bound included (interop.md 13)."""
        return len(self._tunnels)

    @property
    def active_connections(self) -> int:
        return len(self._connections)

    def connection(self, connection_id: ConnectionId) -> RelayConnection | None:
        return self._connections.get(connection_id)

    def authorization(self, tunnel_id: str) -> BindAuthorization | None:
        return self._authorizations.get(tunnel_id)

    # ------------------------------------------------------------------ manager / admin
    def authorize_tunnel(self, authorization: BindAuthorization) -> None:
        """``authorize_tunnel``: overwrites any earlier entry (interop.md 8.4 "Updating")."""
        self._authorizations[authorization.tunnel_id] = authorization

    def revoke_tunnel(self, tunnel_id: str) -> bool:
        """``revoke_tunnel``: removes only the authorization; live legs remain. Whether one existed."""
        return self._authorizations.pop(tunnel_id, None) is not None

    def close_tunnel(self, tunnel_id: str, reason: str = TUNNEL_CLOSED) -> RelayOutput | None:
        """Admin DELETE / ``close_tunnel``: ``tunnel_down`` to every bound leg, entry removed at
        once (interop.md 13). None when no such tunnel (the API's 404)."""
        entry = self._tunnels.pop(tunnel_id, None)
        if entry is None:
            return None
        out = _Collector()
        for direction in _DIRECTIONS:
            leg = entry.leg(direction)
            if leg is None:
                continue
            self._connections[leg.connection_id]._legs.discard((tunnel_id, direction))
            out.sends.append((leg.connection_id, TunnelDownMessage(tunnel_id=tunnel_id, reason=reason)))
            out.events.append(LegReleased(tunnel_id, direction, leg.connection_id, reason))
        out.events.append(TunnelRemoved(tunnel_id))
        self.counters.tunnels_closed += 1
        return out.output()

    # ------------------------------------------------------------------ connections
    def open_connection(
        self, connection_id: ConnectionId, remote_addr: tuple[str, int], now: float
    ) -> RelayConnection | None:
        """A QUIC connection (ALPN ``mediaplane-relay``) was accepted. None when it is beyond
        ``max_connections_per_ip``: close it at once (interop.md 8.1). Raises ``ValueError`` for
        a ``connection_id`` already live (a driver bug)."""
        if connection_id in self._connections:
            raise ValueError("connection id already live")
        ip = remote_addr[0]
        if self._per_ip.get(ip, 0) >= self.max_connections_per_ip:
            self.counters.connections_refused += 1
            return None
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        self.counters.connections_total += 1
        address = _format_addr(remote_addr)
        connection = RelayConnection(self, connection_id, address, f"{address}#{self.counters.connections_total}", now)
        self._connections[connection_id] = connection
        self.counters.peak_connections = max(self.counters.peak_connections, len(self._connections))
        return connection

    # ------------------------------------------------------------------ internals
    def _bind(self, conn: RelayConnection, message: TunnelBindMessage, now: float, out: _Collector) -> None:
        tunnel_id, direction, protocol = message.tunnel_id, message.direction, message.protocol
        cid = conn.connection_id

        def reject(reason: str) -> None:
            out.sends.append((cid, TunnelDownMessage(tunnel_id=tunnel_id, reason=reason)))
            out.events.append(BindRejected(tunnel_id, direction, cid, reason))

        # interop.md 8.4 "Checking a bind".
        if not bind_allowed(
            self._authorizations.get(tunnel_id), direction, message.token(), require_bind_auth=self.require_bind_auth
        ):
            self.counters.binds_rejected_auth += 1
            reject(BIND_AUTH_FAILED)
            return
        # interop.md 8.1: a rebind of a leg this connection holds already takes no new slot.
        if (tunnel_id, direction) not in conn._legs and len(conn._legs) >= self.max_tunnels_per_connection:
            self.counters.binds_rejected_limit += 1
            reject(TUNNEL_LIMIT_EXCEEDED)
            return
        entry = self._tunnels.get(tunnel_id)
        peer = None if entry is None else entry.leg(_OTHER[direction])
        if entry is not None and peer is not None and entry.protocol != protocol:
            self.counters.binds_rejected_protocol += 1
            reject(PROTOCOL_MISMATCH)
            return

        if entry is None:
            entry = TunnelEntry(tunnel_id=tunnel_id, protocol=protocol, created_at=now)
            self._tunnels[tunnel_id] = entry
            self.counters.peak_tunnels = max(self.counters.peak_tunnels, len(self._tunnels))
        elif peer is None:
            entry.protocol = protocol  # only this side is (or was) bound: the newest bind decides
        old = entry.leg(direction)
        if old is not None and old.connection_id != cid:
            # interop.md 8.2 "Rebinding": the newer bind wins; the old leg is told.
            self._connections[old.connection_id]._legs.discard((tunnel_id, direction))
            out.sends.append((old.connection_id, TunnelDownMessage(tunnel_id=tunnel_id, reason=REPLACED_BY_NEWER_BIND)))
            out.events.append(LegReleased(tunnel_id, direction, old.connection_id, REPLACED_BY_NEWER_BIND))
            self.counters.legs_replaced += 1
        entry._set(direction, TunnelLeg(cid, conn.edge_id, conn.remote_addr, now))
        conn._legs.add((tunnel_id, direction))
        conn._bound_once = True
        self.counters.binds_accepted += 1
        if peer is None:
            out.sends.append((cid, TunnelWaitingMessage(tunnel_id=tunnel_id)))
        else:
            # To both edges once the second leg binds (interop.md 8.2); the binder first.
            out.sends.append((cid, TunnelReadyMessage(tunnel_id=tunnel_id)))
            out.sends.append((peer.connection_id, TunnelReadyMessage(tunnel_id=tunnel_id)))
        out.events.append(LegBound(tunnel_id, direction, cid, conn.edge_id, peer is not None))

    def _release(
        self, conn: RelayConnection, tunnel_id: str, direction: Direction, reason: str, out: _Collector
    ) -> None:
        """Free one leg ``conn`` holds (unbind or connection lost, interop.md 13)."""
        conn._legs.discard((tunnel_id, direction))
        entry = self._tunnels.get(tunnel_id)
        if entry is None:
            return
        leg = entry.leg(direction)
        if leg is None or leg.connection_id != conn.connection_id:
            return
        entry._set(direction, None)
        out.events.append(LegReleased(tunnel_id, direction, conn.connection_id, reason))
        peer = entry.leg(_OTHER[direction])
        if peer is None:
            del self._tunnels[tunnel_id]
            out.events.append(TunnelRemoved(tunnel_id))
        elif peer.connection_id != conn.connection_id:
            # The entry stays waiting_*; the remaining leg waits for a peer again.
            out.sends.append((peer.connection_id, TunnelWaitingMessage(tunnel_id=tunnel_id)))

    def _forget(self, conn: RelayConnection) -> None:
        del self._connections[conn.connection_id]
        ip = conn.remote_ip
        left = self._per_ip.get(ip, 0) - 1
        if left > 0:
            self._per_ip[ip] = left
        else:
            self._per_ip.pop(ip, None)


class _ConnState(StrEnum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


# --------------------------------------------------------------------------- one connection
class RelayConnection:
    """One edge's control connection; made by :meth:`RelayTunnels.open_connection`."""

    def __init__(
        self, table: RelayTunnels, connection_id: ConnectionId, remote_addr: str, default_edge_id: str, now: float
    ) -> None:
        self._table = table
        self.connection_id = connection_id
        self.remote_addr = remote_addr
        self.remote_ip = remote_addr.rpartition(":")[0].strip("[]")
        self.edge_id = default_edge_id
        """``identify``'s edge id, else ``<remote addr>#<counter>`` (interop.md 8.2)."""
        self.opened_at = now
        self.edge_software_version: str | None = None
        self.edge_protocol_version: int | None = None
        self._state = _ConnState.AWAITING_HELLO
        self._legs: set[tuple[str, Direction]] = set()
        self._bound_once = False
        self._decoder = FrameDecoder()

    @property
    def state(self) -> str:
        return self._state.value

    @property
    def legs(self) -> frozenset[tuple[str, Direction]]:
        """``(tunnel_id, direction)`` of every leg this connection holds."""
        return frozenset(self._legs)

    def receive_data(self, data: bytes, now: float) -> RelayOutput:
        """Control-stream bytes in chunks of any size. A frame over 1 MiB closes the connection
        (its legs go as on :meth:`connection_lost`); a frame that does not decode is dropped."""
        if self._state is _ConnState.CLOSED:
            return RelayOutput()
        try:
            bodies = self._decoder.feed(data)
        except FrameTooLarge as exc:
            lost = self.connection_lost(now)
            return RelayOutput(lost.sends, (*lost.events, ConnectionClosed(self.connection_id, exc.message)))
        sends: list[Send] = []
        events: list[RelayEvent] = []
        for body in bodies:
            try:
                message = decode(body)
            except ProtocolError as exc:
                self._table.counters.frames_dropped += 1
                events.append(FrameDropped(exc.kind, exc.message))
                continue
            step = self.receive(message, now)
            sends.extend(step.sends)
            events.extend(step.events)
        return RelayOutput(tuple(sends), tuple(events))

    def receive(self, message: Message, now: float) -> RelayOutput:
        """One decoded control message from this edge."""
        out = _Collector()
        if self._state is _ConnState.CLOSED:
            return out.output()
        if message.type not in EDGE_MESSAGE_TYPES:
            self._drop(out, f"Unexpected {message.type} message from an edge")
        elif isinstance(message, HelloMessage):
            if self._state is not _ConnState.AWAITING_HELLO:
                self._drop(out, "Repeated hello")
            else:
                self._state = _ConnState.OPEN
                self.edge_protocol_version = message.protocol_version
                self.edge_software_version = message.software_version
                out.sends.append((self.connection_id, HelloAckMessage(software_version=self._table.software_version)))
                out.events.append(HelloReceived(self.connection_id, message.protocol_version, message.software_version))
        elif self._state is _ConnState.AWAITING_HELLO:
            self._drop(out, f"{message.type} before hello")
        elif isinstance(message, IdentifyMessage):
            if self._bound_once:
                self._drop(out, "identify after a bind")
            else:
                self.edge_id = message.edge_id
                out.events.append(EdgeIdentified(self.connection_id, message.edge_id))
        elif isinstance(message, TunnelBindMessage):
            self._table._bind(self, message, now, out)
        elif isinstance(message, TunnelUnbindMessage):
            held = [d for d in _DIRECTIONS if (message.tunnel_id, d) in self._legs]
            if not held:
                self._drop(out, "tunnel_unbind for a tunnel not bound here")
            for direction in held:
                self._table._release(self, message.tunnel_id, direction, "unbind", out)
        elif isinstance(message, PingMessage):
            out.sends.append((self.connection_id, PongMessage()))
        return out.output()

    def connection_lost(self, now: float) -> RelayOutput:
        """The QUIC connection went: free every leg it held (interop.md 13). Idempotent."""
        del now  # kept for symmetry with the other calls; nothing here is timed
        out = _Collector()
        if self._state is _ConnState.CLOSED:
            return out.output()
        self._state = _ConnState.CLOSED
        for tunnel_id, direction in sorted(self._legs):
            self._table._release(self, tunnel_id, direction, "connection lost", out)
        self._legs.clear()
        self._table._forget(self)
        return out.output()

    def _drop(self, out: _Collector, reason: str) -> None:
        self._table.counters.frames_dropped += 1
        out.events.append(FrameDropped(ErrorKind.UNEXPECTED_TYPE, reason))
