"""The relay's QUIC plane (interop.md 8, 13): edges' control connections, UDP datagrams and TCP
streams, on one UDP socket through :class:`appliance.quic.QuicEndpoint`.

The protocol decisions live in the sans-IO :class:`~services.relay.control.RelayTunnels`; this
module is the glue between it and QUIC:

- **Control.** The first bidirectional stream an edge opens is its control stream (8.1). Its
  bytes go to :meth:`RelayConnection.receive_data`; every answer is framed and written back on
  the addressed connection's control stream. A connection beyond ``max_connections_per_ip`` is
  refused during the handshake.
- **UDP.** A DATAGRAM frame is ``[16-byte tunnel UUID][payload]`` (8.3). When the tunnel is
  active and the frame came from one of its two legs, it is queued unchanged on the other leg.
  The queue is bounded (drop oldest, counted: :attr:`QuicTraffic.datagrams_dropped`).
- **TCP.** Every other bidirectional stream an edge opens is a data stream: a framed header
  ``{tunnel_id, stream_type: "tcp", stream_nonce}``, then bytes (8.3, 13). The relay opens a
  stream to the peer leg, writes the same header, and copies both ways. The receive window of
  each side is held at ``STREAM_WINDOW`` beyond what the other side has taken
  (:meth:`ManagedConnection.control_stream_window`): a slow leg slows its peer's sender instead
  of filling the relay's memory. FIN and reset cross over at once (13: within 5 s).
- **Counters** (13): payload bytes without the 16-byte prefix; ``bytes_ingress`` /
  ``bytes_egress`` count what arrives from the leg bound as ingress / egress; datagram and
  forwarded counters count both directions.

The payload is end-to-end encrypted by the edges (section 10); the relay never holds a key.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import trio
from aioquic.quic import events

from appliance.protocol.errors import ProtocolError
from appliance.quic import ManagedConnection, QuicEndpoint, server_configuration
from appliance.relayproto import (
    ALPN_RELAY,
    FrameDecoder,
    FrameTooLarge,
    Message,
    decode_stream_header,
    encode,
    encode_stream_header,
)
from appliance.relayproto.messages import StreamHeader
from services.relay.control import (
    TUNNEL_CLOSED,
    ConnectionClosed,
    ConnectionId,
    LegReleased,
    RelayConnection,
    RelayOutput,
    RelayTunnels,
    TunnelRemoved,
)

__all__ = [
    "STREAM_WINDOW",
    "EdgeConnected",
    "EdgeDisconnected",
    "QuicRelay",
    "QuicTraffic",
    "TunnelTraffic",
]

STREAM_WINDOW: Final = 256 * 1024
"""Receive credit a TCP data stream keeps beyond what the peer leg has taken."""
_SEND_HIGH_WATER: Final = 512 * 1024
"""Unacknowledged bytes on the outgoing stream above which the incoming stream stops being credited."""
_RELEASE_POLL_S: Final = 0.005
_H3_NO_ERROR: Final = 0  # stream reset codes are application-defined; 0 = "cancelled, no detail"
_log = logging.getLogger("mediaplane.relay")


@dataclass(frozen=True, slots=True)
class EdgeConnected:
    connection_id: ConnectionId
    remote_addr: str


@dataclass(frozen=True, slots=True)
class EdgeDisconnected:
    connection_id: ConnectionId
    edge_id: str
    remote_addr: str


@dataclass(slots=True)
class TunnelTraffic:
    """One tunnel's counters (``GET /api/v1/tunnels`` ``stats``)."""

    bytes_ingress: int = 0
    bytes_egress: int = 0
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    udp_datagrams_total: int = 0


@dataclass(slots=True)
class QuicTraffic:
    """Relay-wide lifetime counters of the QUIC plane."""

    bytes_ingress: int = 0
    bytes_egress: int = 0
    bytes_forwarded: int = 0
    udp_datagrams: int = 0
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    datagrams_dropped: int = 0
    """Datagrams a full per-connection queue dropped (the oldest), plus those for a tunnel
    that was not active or from a connection that is not one of its legs."""
    streams_refused: int = 0


@dataclass(eq=False, slots=True)
class _Side:
    link: _EdgeLink
    stream_id: int
    finished: bool = False  # FIN or reset received from this side
    unreleased: int = 0  # bytes taken from this side, not yet credited back


@dataclass(eq=False, slots=True)
class _Pipe:
    """One TCP data stream: the originating edge's stream and the relay's stream to the peer."""

    tunnel_id: str
    origin: _Side
    peer: _Side | None = None
    decoder: FrameDecoder | None = field(default_factory=FrameDecoder)  # None once the header is read

    def other(self, side: _Side) -> _Side | None:
        return self.peer if side is self.origin else self.origin


class _EdgeLink:
    """The :class:`ConnectionHandler` of one edge's QUIC connection."""

    def __init__(self, relay: QuicRelay, connection: ManagedConnection, control: RelayConnection) -> None:
        self.relay = relay
        self.connection = connection
        self.control = control
        self.control_stream: int | None = None
        self.pipes: dict[int, tuple[_Pipe, _Side]] = {}

    @property
    def connection_id(self) -> ConnectionId:
        return self.control.connection_id

    def quic_event(self, event: events.QuicEvent) -> None:
        relay = self.relay
        if isinstance(event, events.DatagramFrameReceived):
            relay._datagram(self, event.data)
        elif isinstance(event, events.StreamDataReceived):
            stream_id = event.stream_id
            if stream_id == self.control_stream:
                relay._apply(self.control.receive_data(event.data, relay._clock()))
                if event.end_stream:
                    self.relay.endpoint.close(self.connection, reason="control stream ended")
            elif stream_id in self.pipes:
                pipe, side = self.pipes[stream_id]
                relay._pipe_data(pipe, side, event.data, event.end_stream)
            elif stream_id % 4 == 0 and self.control_stream is None:
                # interop.md 8.1: the edge opens the first bidirectional stream for control.
                self.control_stream = stream_id
                relay._apply(self.control.receive_data(event.data, relay._clock()))
            elif stream_id % 4 == 0:
                relay._new_pipe(self, stream_id, event.data, event.end_stream)
            else:
                self.connection.stop_stream(stream_id, _H3_NO_ERROR)  # not ours to open
        elif isinstance(event, events.StreamReset):
            if event.stream_id in self.pipes:
                pipe, side = self.pipes[event.stream_id]
                relay._pipe_reset(pipe, side)
        elif isinstance(event, events.StopSendingReceived):
            if event.stream_id in self.pipes:
                pipe, side = self.pipes[event.stream_id]
                relay._pipe_reset(pipe, side)

    def connection_terminated(self, event: events.ConnectionTerminated) -> None:
        self.relay._lost(self)

    def send(self, message: Message) -> None:
        if self.control_stream is None:
            return
        self.connection.send_stream_data(self.control_stream, encode(message))
        self.relay.endpoint.transmit(self.connection)


class QuicRelay:
    """The QUIC plane of one relay. Start :meth:`serve` in a nursery."""

    def __init__(
        self,
        tunnels: RelayTunnels,
        *,
        certificate_pem: bytes | None = None,
        private_key_pem: bytes | None = None,
        on_event: Callable[[object], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tunnels = tunnels
        self.traffic = QuicTraffic()
        self._configuration = server_configuration(ALPN_RELAY, certificate_pem, private_key_pem)
        self._on_event = on_event
        self._clock = clock
        self._ids = itertools.count(1)
        self._links: dict[ConnectionId, _EdgeLink] = {}
        self._tunnel_traffic: dict[str, TunnelTraffic] = {}
        self._tunnel_pipes: dict[str, set[_Pipe]] = {}
        self._blocked: set[_Side] = set()
        self._prefix_ids: dict[bytes, str] = {}
        self._endpoint: QuicEndpoint | None = None

    @property
    def endpoint(self) -> QuicEndpoint:
        if self._endpoint is None:
            raise RuntimeError("the QUIC relay is not serving")
        return self._endpoint

    # ------------------------------------------------------------------ public surface
    async def serve(
        self, sock: trio.socket.SocketType, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve edges on the bound UDP socket ``sock`` until cancelled."""
        self._endpoint = QuicEndpoint(sock, server_configuration=self._configuration, accept=self._accept)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._endpoint.run)
            nursery.start_soon(self._release_loop)
            task_status.started()

    @property
    def local_address(self) -> tuple[str, int]:
        return self.endpoint.local_address

    def tunnel_traffic(self, tunnel_id: str) -> TunnelTraffic:
        return self._tunnel_traffic.get(tunnel_id) or TunnelTraffic()

    def edges(self) -> list[tuple[str, str]]:
        """``(edge_id, remote_addr)`` of every connected edge (``GET /api/v1/edges``)."""
        return [(link.control.edge_id, link.control.remote_addr) for link in self._links.values()]

    def disconnect_edge(self, edge_id: str) -> bool:
        """Close every connection of ``edge_id`` (manager ``disconnect_edge``); whether one existed."""
        found = [link for link in self._links.values() if link.control.edge_id == edge_id]
        for link in found:
            self._lost(link)
            self.endpoint.close(link.connection, reason="disconnected by the manager")
        return bool(found)

    def close_tunnel(self, tunnel_id: str, reason: str = TUNNEL_CLOSED) -> bool:
        """Admin DELETE / ``close_tunnel``: ``tunnel_down`` to every bound leg, the entry removed
        (interop.md 13), its TCP streams reset. False for an unknown tunnel."""
        output = self.tunnels.close_tunnel(tunnel_id, reason)
        if output is None:
            return False
        self._apply(output)
        return True

    # ------------------------------------------------------------------ connections
    def _accept(self, connection: ManagedConnection, address: tuple[str, int]) -> _EdgeLink | None:
        connection_id = next(self._ids)
        control = self.tunnels.open_connection(connection_id, address, self._clock())
        if control is None:
            return None  # interop.md 8.1: beyond max_connections_per_ip, closed at once
        link = _EdgeLink(self, connection, control)
        self._links[connection_id] = link
        self._emit(EdgeConnected(connection_id, control.remote_addr))
        return link

    def _lost(self, link: _EdgeLink) -> None:
        if self._links.pop(link.connection_id, None) is None:
            return
        for pipe, _side in list(link.pipes.values()):
            self._close_pipe(pipe, reset=True)
        self._apply(link.control.connection_lost(self._clock()))
        self._emit(EdgeDisconnected(link.connection_id, link.control.edge_id, link.control.remote_addr))

    def _apply(self, output: RelayOutput) -> None:
        for connection_id, message in output.sends:
            link = self._links.get(connection_id)
            if link is not None:
                link.send(message)
        for event in output.events:
            if isinstance(event, ConnectionClosed):
                link = self._links.get(event.connection_id)
                if link is not None:
                    self._lost(link)
                    self.endpoint.close(link.connection, reason=event.reason)
            elif isinstance(event, LegReleased):
                for pipe in list(self._tunnel_pipes.get(event.tunnel_id, ())):
                    if pipe.origin.link.connection_id == event.connection_id or (
                        pipe.peer is not None and pipe.peer.link.connection_id == event.connection_id
                    ):
                        self._close_pipe(pipe, reset=True)
            elif isinstance(event, TunnelRemoved):
                for pipe in list(self._tunnel_pipes.pop(event.tunnel_id, ())):
                    self._close_pipe(pipe, reset=True)
                self._tunnel_traffic.pop(event.tunnel_id, None)
            self._emit(event)

    def _emit(self, event: object) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                _log.exception("relay event listener failed")

    # ------------------------------------------------------------------ legs
    def _peer_of(self, tunnel_id: str, link: _EdgeLink) -> tuple[_EdgeLink, bool] | None:
        """The other leg's link of an active tunnel, and whether ``link`` is the egress leg;
        None unless ``link`` holds one leg and the other is bound."""
        entry = self.tunnels.tunnel(tunnel_id)
        if entry is None or entry.ingress is None or entry.egress is None:
            return None
        cid = link.connection_id
        if entry.egress.connection_id == cid:
            other, from_egress = entry.ingress.connection_id, True
        elif entry.ingress.connection_id == cid:
            other, from_egress = entry.egress.connection_id, False
        else:
            return None
        peer = self._links.get(other)
        return None if peer is None else (peer, from_egress)

    def _count(self, tunnel_id: str) -> TunnelTraffic:
        traffic = self._tunnel_traffic.get(tunnel_id)
        if traffic is None:
            traffic = self._tunnel_traffic[tunnel_id] = TunnelTraffic()
        return traffic

    def _account(self, tunnel_id: str, from_egress: bool, size: int) -> TunnelTraffic:
        traffic, total = self._count(tunnel_id), self.traffic
        if from_egress:
            traffic.bytes_egress += size
            total.bytes_egress += size
        else:
            traffic.bytes_ingress += size
            total.bytes_ingress += size
        total.bytes_forwarded += size
        return traffic

    # ------------------------------------------------------------------ UDP (8.3)
    def _datagram(self, link: _EdgeLink, data: bytes) -> None:
        prefix = data[:16]
        tunnel_id = self._prefix_ids.get(prefix)
        if tunnel_id is None:
            if len(data) < 16:
                self.traffic.datagrams_dropped += 1
                return
            tunnel_id = str(uuid.UUID(bytes=prefix))
            if len(self._prefix_ids) > 65536:
                self._prefix_ids.clear()
            self._prefix_ids[prefix] = tunnel_id
        found = self._peer_of(tunnel_id, link)
        if found is None:
            self.traffic.datagrams_dropped += 1
            return
        peer, from_egress = found
        connection = peer.connection
        before = connection.datagrams_dropped
        connection.send_datagram_frame(data)
        self.traffic.datagrams_dropped += connection.datagrams_dropped - before
        self.endpoint.transmit(connection)
        traffic = self._account(tunnel_id, from_egress, len(data) - 16)
        traffic.udp_datagrams_total += 1
        self.traffic.udp_datagrams += 1

    # ------------------------------------------------------------------ TCP (8.3)
    def _new_pipe(self, link: _EdgeLink, stream_id: int, data: bytes, end_stream: bool) -> None:
        pipe = _Pipe(tunnel_id="", origin=_Side(link, stream_id))
        link.pipes[stream_id] = (pipe, pipe.origin)
        link.connection.control_stream_window(stream_id, STREAM_WINDOW)
        self._pipe_data(pipe, pipe.origin, data, end_stream)

    def _open_peer(self, pipe: _Pipe, header_body: bytes) -> bool:
        origin = pipe.origin
        try:
            header: StreamHeader = decode_stream_header(header_body)
        except ProtocolError:
            return False
        found = self._peer_of(header.tunnel_id, origin.link)
        if found is None:
            return False
        peer_link, _from_egress = found
        entry = self.tunnels.tunnel(header.tunnel_id)
        if entry is None or entry.protocol != "tcp":
            return False
        pipe.tunnel_id = header.tunnel_id
        connection = peer_link.connection
        stream_id = connection.get_next_available_stream_id()
        connection.send_stream_data(stream_id, encode_stream_header(header))
        connection.control_stream_window(stream_id, STREAM_WINDOW)
        pipe.peer = _Side(peer_link, stream_id)
        peer_link.pipes[stream_id] = (pipe, pipe.peer)
        self._tunnel_pipes.setdefault(header.tunnel_id, set()).add(pipe)
        traffic = self._count(header.tunnel_id)
        traffic.tcp_streams_total += 1
        traffic.tcp_streams_active += 1
        self.traffic.tcp_streams_total += 1
        self.traffic.tcp_streams_active += 1
        self.endpoint.transmit(connection)
        return True

    def _pipe_data(self, pipe: _Pipe, side: _Side, data: bytes, end_stream: bool) -> None:
        if pipe.decoder is not None:
            # The header frame first (13: the control framing); the relay writes none back.
            try:
                pipe.decoder.receive_data(data)
                body = pipe.decoder.next_frame()
            except FrameTooLarge:
                self._refuse(pipe)
                return
            if body is None:
                if end_stream:
                    self._refuse(pipe)
                return
            data = pipe.decoder.take_remaining()
            pipe.decoder = None
            side.unreleased += 4 + len(body)  # the header frame's bytes count against the window
            if not self._open_peer(pipe, body):
                self._refuse(pipe)
                return
        other = pipe.other(side)
        if other is None:
            return
        if data or end_stream:
            other_connection = other.link.connection
            other_connection.send_stream_data(other.stream_id, data, end_stream=end_stream)
            self.endpoint.transmit(other_connection)
        if data:
            entry = self.tunnels.tunnel(pipe.tunnel_id)
            from_egress = (
                entry is not None
                and entry.egress is not None
                and (entry.egress.connection_id == side.link.connection_id)
            )
            self._account(pipe.tunnel_id, from_egress, len(data))
            side.unreleased += len(data)
            self._release(side, other)
        if end_stream:
            side.finished = True
            if other.finished:
                self._close_pipe(pipe, reset=False)

    def _release(self, side: _Side, other: _Side) -> None:
        """Credit ``side`` for what it sent once ``other``'s send buffer has room (backpressure)."""
        if other.link.connection.send_buffered(other.stream_id) > _SEND_HIGH_WATER:
            self._blocked.add(side)
            return
        self._blocked.discard(side)
        if side.unreleased:
            side.link.connection.consume(side.stream_id, side.unreleased)
            side.unreleased = 0
            self.endpoint.transmit(side.link.connection)

    async def _release_loop(self) -> None:
        # aioquic reports no event when the peer acknowledges stream data, so a blocked side
        # is looked at again on a short timer.
        while True:
            await trio.sleep(_RELEASE_POLL_S)
            for side in list(self._blocked):
                pipe_side = side.link.pipes.get(side.stream_id)
                if pipe_side is None:
                    self._blocked.discard(side)
                    continue
                other = pipe_side[0].other(side)
                if other is None:
                    self._blocked.discard(side)
                else:
                    self._release(side, other)

    def _pipe_reset(self, pipe: _Pipe, side: _Side) -> None:
        side.finished = True
        self._close_pipe(pipe, reset=True)

    def _refuse(self, pipe: _Pipe) -> None:
        self.traffic.streams_refused += 1
        self._close_pipe(pipe, reset=True)

    def _close_pipe(self, pipe: _Pipe, *, reset: bool) -> None:
        for side in (pipe.origin, pipe.peer):
            if side is None:
                continue
            self._blocked.discard(side)
            if side.link.pipes.pop(side.stream_id, None) is None:
                continue
            connection = side.link.connection
            connection.forget_stream_window(side.stream_id)
            if reset and side.link.connection_id in self._links:
                try:
                    connection.reset_stream(side.stream_id, _H3_NO_ERROR)
                except (ValueError, AssertionError):
                    pass  # already finished in that direction
                try:
                    connection.stop_stream(side.stream_id, _H3_NO_ERROR)
                except (ValueError, AssertionError):
                    pass
                self.endpoint.transmit(connection)
        pipes = self._tunnel_pipes.get(pipe.tunnel_id)
        if pipes is not None and pipe in pipes:
            pipes.discard(pipe)
            traffic = self._tunnel_traffic.get(pipe.tunnel_id)
            if traffic is not None:
                traffic.tcp_streams_active -= 1
            self.traffic.tcp_streams_active -= 1
