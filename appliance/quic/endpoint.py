"""A trio driver for aioquic's sans-IO QUIC: one UDP socket, any number of connections.

aioquic's own driver is asyncio; this is the thin trio one the relay and the edge's tunnel
worker share (architecture.md "Relay"). A :class:`QuicEndpoint` owns one UDP socket. As a
server it accepts connections (``server_configuration``), as a client it dials them
(:meth:`QuicEndpoint.connect`); both at once work too.

Each connection has a :class:`ConnectionHandler`: plain synchronous callbacks, called from the
endpoint's receive loop with each aioquic event, like an asyncio protocol. A handler that wants
to send calls the connection's ``send_*`` methods and then :meth:`QuicEndpoint.transmit`, which
only marks the connection: everything marked is flushed together once the current batch is done,
so a burst of received datagrams becomes a burst of sent packets (aioquic builds packets per
``datagrams_to_send`` call; calling it per datagram halves the throughput).

The loop:

- the receive task drains the socket in batches (non-blocking ``recvfrom`` until ``EAGAIN`` or
  ``RECV_BATCH``), feeds each datagram to its connection (routed by destination connection id,
  RFC 9000 section 5.2), hands out the events, then flushes;
- the timer task sleeps until the earliest aioquic timer (loss detection, pacing, idle) or a
  wake-up, runs the due timers and flushes whatever was marked from outside the receive task;
- every ``keepalive_s`` each established connection sends a PING (interop.md 8.1: 5 s).

Sends never block: the socket is non-blocking and a full send buffer drops the packet, which
QUIC's loss recovery resends (a blocked sender would stop every connection on the socket).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import trio
from aioquic._buffer import Buffer
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.packet import (
    QuicPacketType,
    encode_quic_version_negotiation,
    pull_quic_header,
)

from appliance.netio.sockopts import set_socket_buffers
from appliance.quic.connection import ManagedConnection

__all__ = [
    "RECV_BATCH",
    "ConnectionHandler",
    "EndpointCounters",
    "QuicEndpoint",
    "open_udp_socket",
]

Address = tuple[str, int]
RECV_BATCH: Final = 256
RECV_BUFFER_BYTES: Final = 65536
DEFAULT_KEEPALIVE_S: Final = 5.0  # interop.md 8.1
DEFAULT_SOCKET_BUFFER_BYTES: Final = 2 * 1024 * 1024  # interop.md 8.1 / relay spec section 8
_log = logging.getLogger("mediaplane.quic")


class ConnectionHandler(Protocol):
    """What the endpoint calls for one connection. Called synchronously: never block."""

    def quic_event(self, event: events.QuicEvent) -> None:
        """One aioquic event (stream data, datagram, handshake done, …)."""

    def connection_terminated(self, event: events.ConnectionTerminated) -> None:
        """The connection is gone (closed by either side, or idle): its last call."""


HandlerFactory = Callable[[ManagedConnection, Address], ConnectionHandler | None]
"""For a server: the handler of a new connection, or None to refuse it (closed at once)."""


@dataclass(slots=True)
class EndpointCounters:
    datagrams_received: int = 0
    datagrams_sent: int = 0
    send_errors: int = 0
    """Packets the kernel would not take (full buffer): dropped, QUIC resends them."""
    connections_accepted: int = 0
    connections_refused: int = 0
    unroutable: int = 0


@dataclass(eq=False, slots=True)
class _Entry:
    connection: ManagedConnection
    handler: ConnectionHandler | None
    address: Address
    cids: set[bytes]
    last_ping: float
    closed: bool = False


def open_udp_socket(
    address: Address, *, buffer_bytes: int = DEFAULT_SOCKET_BUFFER_BYTES, reuse_port: bool = False
) -> trio.socket.SocketType:
    """A bound, non-blocking UDP socket with ``buffer_bytes`` send and receive buffers
    (``SO_*BUFFORCE`` when permitted, else the plain options, which the kernel caps)."""
    host = address[0]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        set_socket_buffers(sock, rcvbuf=buffer_bytes, sndbuf=buffer_bytes)
        sock.bind(address)  # a literal address: no name lookup blocks here
    except BaseException:
        sock.close()
        raise
    return trio.socket.from_stdlib_socket(sock)


class QuicEndpoint:
    """One UDP socket and its QUIC connections. Start :meth:`run` in a nursery first."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        *,
        server_configuration: QuicConfiguration | None = None,
        accept: HandlerFactory | None = None,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        datagram_queue_limit: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trio_sock = sock
        self._sock: socket.socket = socket.socket(fileno=os.dup(sock.fileno()))  # blocking calls bypass trio
        self._sock.setblocking(False)
        self._server_configuration = server_configuration
        self._accept = accept
        self._keepalive_s = keepalive_s
        self._datagram_queue_limit = datagram_queue_limit
        self._clock = clock
        self._by_cid: dict[bytes, _Entry] = {}
        self._entries: dict[ManagedConnection, _Entry] = {}
        self._dirty: set[_Entry] = set()
        self._wake = trio.Event()
        self.counters = EndpointCounters()
        self.cid_length = server_configuration.connection_id_length if server_configuration else 8

    @property
    def local_address(self) -> Address:
        host, port = self._trio_sock.getsockname()[:2]
        return host, port

    @property
    def connections(self) -> list[ManagedConnection]:
        return list(self._entries)

    # ------------------------------------------------------------------ public calls
    def connect(
        self, address: Address, configuration: QuicConfiguration, handler: ConnectionHandler
    ) -> ManagedConnection:
        """Dial ``address``; ``handler`` gets the connection's events (HandshakeCompleted first)."""
        connection = self._new_connection(configuration)
        entry = _Entry(connection, handler, address, set(), self._clock())
        self._register(entry, connection.host_cid)
        connection.connect(address, now=self._clock())
        self.transmit(connection)
        return connection

    def transmit(self, connection: ManagedConnection) -> None:
        """Mark ``connection`` for sending; flushed at the end of the current batch, or at once
        by the timer task when called from outside the receive loop."""
        entry = self._entries.get(connection)
        if entry is not None:
            self._dirty.add(entry)
            self._wake.set()

    def close(self, connection: ManagedConnection, error_code: int = 0, reason: str = "") -> None:
        """Close one connection (CONNECTION_CLOSE is sent; the handler's last call follows).

        What is queued goes out first: a closing aioquic connection sends nothing but
        CONNECTION_CLOSE, so a last message (``peer_auth_error``, ``tunnel_down``) would be lost."""
        entry = self._entries.get(connection)
        if entry is not None:
            self._send(entry)
        connection.close(error_code=error_code, reason_phrase=reason)
        self.transmit(connection)

    def address_of(self, connection: ManagedConnection) -> Address | None:
        entry = self._entries.get(connection)
        return None if entry is None else entry.address

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; on cancellation every connection is closed politely."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._timer_loop)
                task_status.started()
                await self._receive_loop()
        finally:
            for entry in list(self._entries.values()):
                entry.connection.close(error_code=0, reason_phrase="shutting down")
                self._send(entry)
            self._sock.close()
            self._trio_sock.close()  # the endpoint owns the socket it was given

    # ------------------------------------------------------------------ internals
    def _new_connection(self, configuration: QuicConfiguration, **kwargs: object) -> ManagedConnection:
        extra = {} if self._datagram_queue_limit is None else {"datagram_queue_limit": self._datagram_queue_limit}
        return ManagedConnection(configuration=configuration, **extra, **kwargs)  # type: ignore[arg-type]

    def _register(self, entry: _Entry, cid: bytes) -> None:
        self._entries[entry.connection] = entry
        entry.cids.add(cid)
        self._by_cid[cid] = entry

    async def _receive_loop(self) -> None:
        sock = self._sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = self._clock()
            for _ in range(RECV_BATCH):
                try:
                    data, address = sock.recvfrom(RECV_BUFFER_BYTES)
                except BlockingIOError:
                    break
                except OSError as exc:
                    # ICMP errors surface as ECONNREFUSED on the next read; nothing to do.
                    if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                        continue
                    raise
                self.counters.datagrams_received += 1
                self._datagram(data, address[:2], now)
            self._flush()
            await trio.lowlevel.checkpoint()

    def _datagram(self, data: bytes, address: Address, now: float) -> None:
        buf = Buffer(data=data)
        try:
            header = pull_quic_header(buf, host_cid_length=self.cid_length)
        except ValueError:
            self.counters.unroutable += 1
            return
        entry = self._by_cid.get(header.destination_cid)
        if entry is None:
            entry = self._maybe_accept(data, header, address, now)
            if entry is None:
                return
        connection = entry.connection
        connection.receive_datagram(data, address, now=now)
        entry.address = address  # a migrated client (NAT rebinding) is followed, RFC 9000 section 9
        self._dispatch(entry)
        self._dirty.add(entry)

    def _maybe_accept(self, data: bytes, header: object, address: Address, now: float) -> _Entry | None:
        configuration = self._server_configuration
        packet_type = getattr(header, "packet_type", None)
        if configuration is None or self._accept is None:
            self.counters.unroutable += 1
            return None
        version = getattr(header, "version", None)
        if version is not None and version not in configuration.supported_versions:
            self._sendto(
                encode_quic_version_negotiation(
                    source_cid=header.destination_cid,  # type: ignore[attr-defined]
                    destination_cid=header.source_cid,  # type: ignore[attr-defined]
                    supported_versions=configuration.supported_versions,
                ),
                address,
            )
            return None
        # RFC 9000 section 14.1: an Initial that can start a connection fills a 1200-byte datagram.
        if packet_type != QuicPacketType.INITIAL or len(data) < 1200:
            self.counters.unroutable += 1
            return None
        connection = self._new_connection(
            configuration,
            original_destination_connection_id=header.destination_cid,  # type: ignore[attr-defined]
        )
        entry = _Entry(connection, None, address, set(), now)
        self._register(entry, header.destination_cid)  # type: ignore[attr-defined]
        self._register(entry, connection.host_cid)
        handler = self._accept(connection, address)
        if handler is None:
            self.counters.connections_refused += 1
            connection.receive_datagram(data, address, now=now)
            # A transport-level CONNECTION_REFUSED (RFC 9000 section 20.1); frame_type makes it transport.
            connection.close(error_code=0x2, frame_type=0, reason_phrase="connection refused")
            self._send(entry)
            self._forget(entry)
            return None
        entry.handler = handler
        self.counters.connections_accepted += 1
        return entry

    def _dispatch(self, entry: _Entry) -> None:
        connection = entry.connection
        while (event := connection.next_event()) is not None:
            if isinstance(event, events.ConnectionIdIssued):
                entry.cids.add(event.connection_id)
                self._by_cid[event.connection_id] = entry
            elif isinstance(event, events.ConnectionIdRetired):
                entry.cids.discard(event.connection_id)
                if self._by_cid.get(event.connection_id) is entry:
                    del self._by_cid[event.connection_id]
            elif isinstance(event, events.ConnectionTerminated):
                self._terminated(entry, event)
                return
            elif entry.handler is not None:
                try:
                    entry.handler.quic_event(event)
                except Exception:
                    _log.exception("QUIC event handler failed; closing the connection")
                    connection.close(error_code=0x1, reason_phrase="internal error")  # INTERNAL_ERROR
                    self._dirty.add(entry)

    def _terminated(self, entry: _Entry, event: events.ConnectionTerminated) -> None:
        if entry.closed:
            return
        self._forget(entry)
        if entry.handler is not None:
            try:
                entry.handler.connection_terminated(event)
            except Exception:
                _log.exception("QUIC termination handler failed")

    def _forget(self, entry: _Entry) -> None:
        entry.closed = True
        self._entries.pop(entry.connection, None)
        self._dirty.discard(entry)
        for cid in entry.cids:
            if self._by_cid.get(cid) is entry:
                del self._by_cid[cid]

    def _flush(self) -> None:
        while self._dirty:
            entry = self._dirty.pop()
            self._send(entry)
            self._dispatch(entry)  # closing emits ConnectionTerminated only from the timer

    def _send(self, entry: _Entry) -> None:
        for data, address in entry.connection.datagrams_to_send(now=self._clock()):
            self._sendto(data, address)

    def _sendto(self, data: bytes, address: Address) -> None:
        try:
            self._sock.sendto(data, address)
            self.counters.datagrams_sent += 1
        except (BlockingIOError, InterruptedError):
            self.counters.send_errors += 1
        except OSError as exc:
            if exc.errno not in (errno.ENOBUFS, errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                raise
            self.counters.send_errors += 1

    async def _timer_loop(self) -> None:
        while True:
            deadline = self._next_deadline()
            with trio.move_on_at(deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            now = self._clock()
            for entry in list(self._entries.values()):
                connection = entry.connection
                timer = connection.get_timer()
                if timer is not None and timer <= now:
                    connection.handle_timer(now=now)
                    self._dispatch(entry)
                    self._dirty.add(entry)
                if entry.handler is not None and now - entry.last_ping >= self._keepalive_s and not entry.closed:
                    entry.last_ping = now
                    connection.send_ping(0)
                    self._dirty.add(entry)
            self._flush()

    def _next_deadline(self) -> float:
        now = self._clock()
        deadline = now + self._keepalive_s
        for entry in self._entries.values():
            timer = entry.connection.get_timer()
            if timer is not None and timer < deadline:
                deadline = timer
            if entry.last_ping + self._keepalive_s < deadline:
                deadline = entry.last_ping + self._keepalive_s
        # aioquic timers are in the caller's clock; trio's deadline is in trio's clock.
        return trio.current_time() + max(0.0, deadline - now)
