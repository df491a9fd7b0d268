"""One tunnel's data plane, run inside the tunnel worker process (architecture.md).

A :class:`TunnelRunner` carries a tunnel (interop.md 2.6) until it is cancelled:

- **Carriers.** ``relay`` + ``quic``: a QUIC connection to the relay (ALPN ``mediaplane-relay``),
  ``hello``/``identify``/``tunnel_bind`` with the bind token (8.2, 8.4), rebinding on every
  reconnect; ``relay`` + ``udp``: the relay's native plane (9): ``register`` every 5 s, ``ready``
  means Connected, 25 s without an ack means the relay is dead (Connecting, retry every 1 s);
  ``direct``: the egress edge dials ``peer_addr`` and authenticates with ``peer_auth`` (8.3),
  the ingress edge listens on ``direct_listen_addr`` (its own QUIC endpoint, ALPN
  ``mediaplane-direct``).
- **Payload.** UDP: each local datagram becomes one tunnel datagram
  ``[uuid][seq][nonce][ciphertext][tag]`` (10), opened on the far side through the replay
  window; replies come back the same way (the egress side answers the last local sender).
  TCP (QUIC carriers only): the egress side accepts local connections and opens one stream
  each, with the 8.3 header and a fresh ``stream_nonce``; the ingress side connects to
  ``local_addr`` for each stream. Chunks are sealed per stream and direction (10); a gap, a
  repeat or a failed tag resets both TCP connections. Direct mode without a key carries the
  plain forms inside QUIC.
- **State** (2.6): ``Connecting`` → ``Waiting`` (bound, peer absent) → ``Connected``; ``Failed``
  when the tunnel cannot run as configured (bad address, bind refused); each change is reported
  through ``on_state(state, reason)``. Network trouble never raises out of :meth:`run`: the
  runner retries with backoff.

Backpressure: a TCP stream's receive window is held at ``STREAM_WINDOW`` beyond what has been
written to the local socket, and the local socket is read only while the stream's send buffer
is below ``_SEND_HIGH_WATER``. UDP never waits: a datagram that finds the carrier down is
dropped and counted.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import trio
from aioquic.quic import events

from appliance.models.config import TunnelConfig, split_host_port
from appliance.netio.sockopts import set_socket_buffers
from appliance.protocol.errors import ProtocolError
from appliance.quic import ManagedConnection, QuicEndpoint, client_configuration, open_udp_socket, server_configuration
from appliance.relayproto import (
    ALPN_DIRECT,
    ALPN_RELAY,
    BIND_AUTH_FAILED,
    FrameDecoder,
    FrameTooLarge,
    StreamHeader,
    compute_bind_token,
    decode_stream_header,
    encode_stream_header,
)
from appliance.relayproto.direct import DirectDialler, DirectListener, DirectStep, PeerAuthenticated, PeerRejected
from appliance.relayproto.messages import PingMessage, PongMessage, decode, encode
from appliance.relayproto.native import (
    EDGE_DEAD_AFTER_S,
    EDGE_REGISTER_INTERVAL_S,
    EDGE_RETRY_INTERVAL_S,
    NIL_PREFIX,
    ControlError,
    Register,
    decode_ack,
    encode_register,
)
from appliance.relayproto.session import (
    EdgeRelaySession,
    HelloAcknowledged,
    RelayStep,
    TunnelDown,
    TunnelReady,
    TunnelWaiting,
)
from appliance.tunnel.payload import Side, TunnelReceiver, TunnelSender, parse_key
from appliance.tunnel.stream import StreamBroken, StreamOpener, StreamSealer

__all__ = ["STREAM_WINDOW", "TunnelCounters", "TunnelRunner", "TunnelStateName"]

TunnelStateName = Literal["Connecting", "Waiting", "Connected", "Failed"]
STREAM_WINDOW: Final = 256 * 1024
_SEND_HIGH_WATER: Final = 512 * 1024
_LOCAL_READ_BYTES: Final = 64 * 1024  # = the 64 KiB chunk limit of interop.md 10
_UDP_BATCH: Final = 256
_CLOSED_STREAMS_KEPT: Final = 4096
_LOCAL_SOCKET_BUFFER: Final = 8 * 1024 * 1024  # ~0.2 s at 300 Mbit/s: rides out a busy moment
_RECONNECT_MIN_S: Final = 1.0
_RECONNECT_MAX_S: Final = 10.0
_FAILED_RETRY_S: Final = 5.0
_CONNECT_TIMEOUT_S: Final = 10.0
_TICK_S: Final = 1.0
_log = logging.getLogger("mediaplane.tunnel")


@dataclass(slots=True)
class TunnelCounters:
    """Payload counters of one tunnel (plaintext bytes; ``dropped``: datagrams that found no carrier).

    The fields of ``appliance.models.stats.TunnelCounters`` (a test keeps them equal), as a plain
    dataclass: incremented per packet, where a pydantic model's attribute write costs 6x more."""

    bytes_sent: int = 0
    bytes_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    replayed: int = 0
    decrypt_errors: int = 0
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    dropped: int = 0


class _Retry(Exception):
    """The carrier went; reconnect after ``delay`` seconds."""

    def __init__(self, reason: str, *, failed: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.failed = failed


def _reveal(value: object) -> str | None:
    return None if value is None else value.get_secret_value()  # type: ignore[attr-defined]


async def _resolve(text: str) -> tuple[str, int]:
    host, port = split_host_port(text)
    host = host.strip("[]")
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(errno.EHOSTUNREACH, "no address")
    address = infos[0][4]
    return str(address[0]), int(address[1])


# --------------------------------------------------------------------------- payload codec
class _Codec:
    """Seals and opens this tunnel's payload (interop.md 10), or the plain forms without a key."""

    def __init__(self, tunnel: TunnelConfig, counters: TunnelCounters) -> None:
        self.tunnel_uuid = tunnel.id
        self.prefix = tunnel.id.bytes
        key_hex = _reveal(tunnel.tunnel_encryption_key)
        self.key = None if key_hex is None else parse_key(key_hex)
        self.side = Side.of_direction(tunnel.direction)
        self.counters = counters
        self._sender: TunnelSender | None = None
        self._receiver: TunnelReceiver | None = None
        if self.key is not None:
            # interop.md 10: seq starts at the wall clock in ns, so a restarted sender goes on above.
            self._sender = TunnelSender(self.key, tunnel.id, self.side, time.time_ns())
            self._receiver = TunnelReceiver(self.key, tunnel.id, self.side.peer)

    def seal_datagram(self, payload: bytes) -> bytes:
        if self._sender is None:
            return self.prefix + payload
        return self._sender.seal(payload, os.urandom(12))

    def open_datagram(self, datagram: bytes) -> bytes | None:
        receiver = self._receiver
        if receiver is None:
            return datagram[16:] if datagram[:16] == self.prefix else None
        replayed, failed = receiver.replayed, receiver.decrypt_errors
        plaintext = receiver.open(datagram)
        self.counters.replayed += receiver.replayed - replayed
        self.counters.decrypt_errors += receiver.decrypt_errors - failed
        return plaintext

    def stream_sealer(self, stream_nonce: bytes) -> StreamSealer | None:
        return None if self.key is None else StreamSealer(self.key, self.tunnel_uuid, self.side, stream_nonce)

    def stream_opener(self, stream_nonce: bytes) -> StreamOpener | None:
        return None if self.key is None else StreamOpener(self.key, self.tunnel_uuid, self.side.peer, stream_nonce)


# --------------------------------------------------------------------------- UDP payload
class _UdpPlane:
    """The local UDP side. Egress: listens on ``local_addr``; ingress: sends to ``local_addr``."""

    def __init__(self, tunnel: TunnelConfig, codec: _Codec, counters: TunnelCounters) -> None:
        self.codec = codec
        self.counters = counters
        self.egress = tunnel.direction == "egress"
        host, port = split_host_port(tunnel.local_addr)
        self.local_addr = (host.strip("[]"), port)
        family = socket.AF_INET6 if ":" in self.local_addr[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        set_socket_buffers(self.sock, rcvbuf=_LOCAL_SOCKET_BUFFER, sndbuf=_LOCAL_SOCKET_BUFFER)
        if self.egress:
            self.sock.bind(self.local_addr)
            self.reply_to: tuple[str, int] | None = None
        else:
            self.sock.bind(("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0))
            self.reply_to = self.local_addr
        self.send: Callable[[bytes], bool] | None = None
        """The carrier's send, or None while there is no carrier (datagrams are then dropped)."""
        self.flush: Callable[[], None] = lambda: None

    def close(self) -> None:
        self.sock.close()

    def deliver(self, datagram: bytes) -> None:
        """A tunnel datagram arrived: open it and hand the payload to the local side."""
        payload = self.codec.open_datagram(datagram)
        if payload is None:
            return
        self.counters.datagrams_received += 1
        self.counters.bytes_received += len(payload)
        if self.reply_to is None:
            self.counters.dropped += 1  # the egress side has no local sender to answer yet
            return
        try:
            self.sock.sendto(payload, self.reply_to)
        except OSError:
            self.counters.dropped += 1

    async def pump(self) -> None:
        """Local datagrams into the tunnel, in batches (one flush per batch)."""
        sock = self.sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            for _ in range(_UDP_BATCH):
                try:
                    payload, source = sock.recvfrom(65536)
                except BlockingIOError:
                    break
                except OSError:
                    continue  # ICMP from an earlier send
                if self.egress:
                    self.reply_to = source[:2]
                elif source[:2] != self.local_addr:
                    continue
                send = self.send
                if send is None:
                    self.counters.dropped += 1
                    continue
                if send(self.codec.seal_datagram(payload)):
                    self.counters.datagrams_sent += 1
                    self.counters.bytes_sent += len(payload)
                else:
                    self.counters.dropped += 1
            self.flush()
            await trio.lowlevel.checkpoint()


# --------------------------------------------------------------------------- TCP payload
class _StreamPipe:
    """One tunnelled TCP connection: a local TCP stream and one QUIC stream."""

    def __init__(self, carrier: _QuicCarrier, stream_id: int, stream_nonce: bytes) -> None:
        self.carrier = carrier
        self.stream_id = stream_id
        self.sealer = carrier.codec.stream_sealer(stream_nonce)
        self.opener = carrier.codec.stream_opener(stream_nonce)
        self.header_decoder: FrameDecoder | None = None
        send, receive = trio.open_memory_channel[tuple[bytes, int, bool]](math.inf)  # bounded by the window
        self.to_local = send
        self.from_quic = receive
        self.done = False
        self.broken = False

    # from the QUIC handler (synchronous)
    def quic_data(self, data: bytes, end_stream: bool) -> None:
        raw = len(data)
        if self.header_decoder is not None:
            decoder = self.header_decoder
            decoder.receive_data(data)
            try:
                body = decoder.next_frame()
            except FrameTooLarge:
                self.abort()
                return
            if body is None:
                if end_stream:
                    self.abort()
                return
            try:
                header = decode_stream_header(body)
            except ProtocolError:
                self.abort()
                return
            if header.tunnel_id != str(self.carrier.tunnel.id):
                self.abort()
                return
            data = decoder.take_remaining()
            raw = len(data)
            self.header_decoder = None
            self.sealer = self.carrier.codec.stream_sealer(header.nonce_bytes())
            self.opener = self.carrier.codec.stream_opener(header.nonce_bytes())
            self.carrier.connection_consume(self.stream_id, 4 + len(body))  # the header's share of the window
            self.carrier.start_inbound(self)
        if self.opener is not None:
            try:
                plain = b"".join(self.opener.feed(data))
            except StreamBroken:
                self.abort()
                return
        else:
            plain = data
        try:
            self.to_local.send_nowait((plain, raw, end_stream))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def abort(self) -> None:
        """Reset both sides (interop.md 10: gap, repeat or bad tag resets both TCP connections)."""
        if self.done:
            return
        self.broken = True
        self.carrier.reset_stream(self.stream_id)
        self.to_local.close()
        self.finish()

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.carrier.pipe_done(self)

    async def run(self, tcp: trio.SocketStream) -> None:
        """Copy both ways until both directions ended (or one broke)."""
        counters = self.carrier.counters
        counters.tcp_streams_total += 1
        counters.tcp_streams_active += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._local_to_quic, tcp, nursery.cancel_scope)
                await self._quic_to_local(tcp)
                if self.broken:
                    nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.abort()
        finally:
            counters.tcp_streams_active -= 1
            if self.broken:
                _reset_tcp(tcp)
            with trio.CancelScope(shield=True):
                await tcp.aclose()
            self.finish()

    async def _quic_to_local(self, tcp: trio.SocketStream) -> None:
        async for plain, raw, end_stream in self.from_quic:
            if plain:
                await tcp.send_all(plain)
                self.carrier.counters.bytes_received += len(plain)
            self.carrier.connection_consume(self.stream_id, raw)
            if end_stream:
                if self.opener is not None:
                    try:
                        self.opener.eof()
                    except StreamBroken:
                        self.abort()
                        return
                try:
                    await tcp.send_eof()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                return

    async def _local_to_quic(self, tcp: trio.SocketStream, scope: trio.CancelScope) -> None:
        carrier = self.carrier
        while True:
            while carrier.send_buffered(self.stream_id) > _SEND_HIGH_WATER:
                await trio.sleep(0.005)  # aioquic has no "acknowledged" event to wait on
            try:
                data = await tcp.receive_some(_LOCAL_READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.abort()
                scope.cancel()
                return
            if not data:
                carrier.send_stream(self.stream_id, b"", end_stream=True)
                return
            wire = data if self.sealer is None else self.sealer.seal_chunk(data, os.urandom(12))
            if not carrier.send_stream(self.stream_id, wire):
                self.abort()
                scope.cancel()
                return
            carrier.counters.bytes_sent += len(data)


def _reset_tcp(tcp: trio.SocketStream) -> None:
    """Close with RST (SO_LINGER 0) so the local peer sees the reset, not a clean end."""
    try:
        tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass


# --------------------------------------------------------------------------- QUIC carrier
class _QuicCarrier:
    """One QUIC connection carrying this tunnel (to the relay, or to the direct peer)."""

    def __init__(
        self, runner: TunnelRunner, endpoint: QuicEndpoint, connection: ManagedConnection | None = None
    ) -> None:
        self.runner = runner
        self.tunnel = runner.tunnel
        self.codec = runner.codec
        self.counters = runner.counters
        self.endpoint = endpoint
        self.connection: ManagedConnection = connection  # type: ignore[assignment]  # set by the dialler at once
        self.control_stream: int | None = None
        self.control_decoder = FrameDecoder()
        self.pipes: dict[int, _StreamPipe] = {}
        self._closed_streams: dict[int, None] = {}
        """Streams closed here, the newest ``_CLOSED_STREAMS_KEPT`` (an ordered set): their late
        frames are ignored, not taken for a new stream."""
        self.data_ready = False
        self.nursery: trio.Nursery | None = None
        self.gone = trio.Event()
        self.on_control: Callable[[bytes], None] = lambda data: None

    @property
    def is_client(self) -> bool:
        return bool(self.connection._is_client)

    # -- used by the planes
    def send_datagram(self, datagram: bytes) -> bool:
        if not self.data_ready or self.gone.is_set():
            return False
        self.connection.send_datagram_frame(datagram)
        return True

    def flush(self) -> None:
        self.endpoint.transmit(self.connection)

    def send_stream(self, stream_id: int, data: bytes, end_stream: bool = False) -> bool:
        if self.gone.is_set() or stream_id not in self.pipes:
            return False
        try:
            self.connection.send_stream_data(stream_id, data, end_stream=end_stream)
        except (ValueError, AssertionError):
            return False
        self.endpoint.transmit(self.connection)
        return True

    def send_buffered(self, stream_id: int) -> int:
        return self.connection.send_buffered(stream_id)

    def connection_consume(self, stream_id: int, count: int) -> None:
        if count > 0:
            self.connection.consume(stream_id, count)
            self.endpoint.transmit(self.connection)

    def reset_stream(self, stream_id: int) -> None:
        if self.gone.is_set():
            return
        for call in (self.connection.reset_stream, self.connection.stop_stream):
            try:
                call(stream_id, 0)
            except (ValueError, AssertionError):
                pass
        self.endpoint.transmit(self.connection)

    def pipe_done(self, pipe: _StreamPipe) -> None:
        if self.pipes.pop(pipe.stream_id, None) is not None:
            self.connection.forget_stream_window(pipe.stream_id)
            self._closed_streams[pipe.stream_id] = None
            if len(self._closed_streams) > _CLOSED_STREAMS_KEPT:
                del self._closed_streams[next(iter(self._closed_streams))]

    def send_control(self, data: bytes) -> None:
        if data and self.control_stream is not None and not self.gone.is_set():
            self.connection.send_stream_data(self.control_stream, data)
            self.endpoint.transmit(self.connection)

    # -- TCP streams
    def open_outbound(self, tcp: trio.SocketStream) -> None:
        """A local TCP connection (egress side): one new stream with the 8.3 header."""
        assert self.nursery is not None
        stream_id = self.connection.get_next_available_stream_id()
        stream_nonce = os.urandom(16)
        pipe = _StreamPipe(self, stream_id, stream_nonce)
        self.pipes[stream_id] = pipe
        self.connection.control_stream_window(stream_id, STREAM_WINDOW)
        header = StreamHeader(tunnel_id=str(self.tunnel.id), stream_type="tcp", stream_nonce=stream_nonce.hex())
        self.connection.send_stream_data(stream_id, encode_stream_header(header))
        self.endpoint.transmit(self.connection)
        self.nursery.start_soon(pipe.run, tcp)

    def start_inbound(self, pipe: _StreamPipe) -> None:
        """A stream's header was read (ingress side): connect to ``local_addr`` and copy."""
        assert self.nursery is not None
        self.nursery.start_soon(self._connect_local, pipe)

    async def _connect_local(self, pipe: _StreamPipe) -> None:
        host, port = split_host_port(self.tunnel.local_addr)
        try:
            tcp = await trio.open_tcp_stream(host.strip("[]"), port)
        except OSError:
            pipe.abort()
            return
        await pipe.run(tcp)

    # -- the ConnectionHandler
    def quic_event(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.DatagramFrameReceived):
            if self.data_ready and self.runner.udp is not None:
                self.runner.udp.deliver(event.data)
        elif isinstance(event, events.StreamDataReceived):
            stream_id = event.stream_id
            if stream_id == self.control_stream:
                self.on_control(event.data)
                return
            pipe = self.pipes.get(stream_id)
            if pipe is None:
                if self.control_stream is None and not self.is_client and stream_id % 4 == 0:
                    self.control_stream = stream_id  # the direct listener: the dialler's first stream
                    self.on_control(event.data)
                    return
                locally_initiated = (stream_id % 2 == 0) == self.is_client
                if stream_id in self._closed_streams:
                    return  # closed here already: late data, a FIN or a reset of it
                if (
                    locally_initiated
                    or not self.data_ready
                    or self.tunnel.protocol != "tcp"
                    or self.tunnel.direction != "ingress"
                ):
                    try:
                        self.connection.stop_stream(stream_id, 0)
                        self.connection.reset_stream(stream_id, 0)
                    except (ValueError, AssertionError):
                        pass
                    self.endpoint.transmit(self.connection)
                    return
                pipe = _StreamPipe(self, stream_id, bytes(16))
                pipe.header_decoder = FrameDecoder()
                self.pipes[stream_id] = pipe
                self.connection.control_stream_window(stream_id, STREAM_WINDOW)
            pipe.quic_data(event.data, event.end_stream)
        elif isinstance(event, events.StreamReset | events.StopSendingReceived):
            pipe = self.pipes.get(event.stream_id)
            if pipe is not None:
                pipe.abort()
        elif isinstance(event, events.HandshakeCompleted):
            self.runner._handshake(self)

    def connection_terminated(self, event: events.ConnectionTerminated) -> None:
        self.data_ready = False
        self.gone.set()
        for pipe in list(self.pipes.values()):
            pipe.abort()
        self.runner._carrier_lost(self, event.reason_phrase or "connection closed")


# --------------------------------------------------------------------------- the runner
class TunnelRunner:
    """Runs one tunnel until cancelled (see the module docstring)."""

    def __init__(
        self,
        tunnel: TunnelConfig,
        *,
        edge_id: str | None,
        software_version: str,
        on_state: Callable[[str, str | None], None],
    ) -> None:
        self.tunnel = tunnel
        self.edge_id = edge_id
        self.software_version = software_version
        self._on_state = on_state
        self.state: str = "Connecting"
        self.counters = TunnelCounters()
        self.codec = _Codec(tunnel, self.counters)
        self.udp: _UdpPlane | None = None
        self._carrier: _QuicCarrier | None = None
        self._carrier_events: trio.MemorySendChannel[tuple[str, object]] | None = None
        self.reason: str | None = None

    def __repr__(self) -> str:  # never the secrets
        return f"TunnelRunner(id={self.tunnel.id}, state={self.state!r})"

    def _set_state(self, state: TunnelStateName, reason: str | None = None) -> None:
        if state == self.state and reason == self.reason:
            return
        self.state, self.reason = state, reason
        try:
            self._on_state(state, reason)
        except Exception:
            _log.exception("tunnel state listener failed")

    async def run(self) -> None:
        """Carry the tunnel until cancelled."""
        self._on_state(self.state, None)
        delay = _RECONNECT_MIN_S
        while True:
            try:
                await self._carry()
            except _Retry as retry:
                if self.state in ("Connected", "Waiting"):
                    delay = _RECONNECT_MIN_S  # it was up: the backoff starts again
                if retry.failed:
                    self._set_state("Failed", retry.reason)
                    await trio.sleep(_FAILED_RETRY_S)
                    continue
                self._set_state("Connecting", retry.reason)
                await trio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_MAX_S)
            except OSError as exc:
                # A local address in use, an unresolvable relay: the config cannot run as it is.
                self._set_state("Failed", os.strerror(exc.errno) if exc.errno else "network error")
                await trio.sleep(_FAILED_RETRY_S)

    async def _carry(self) -> None:
        """One attempt: the local side and one carrier, until the carrier goes (raises _Retry)."""
        tunnel = self.tunnel
        if tunnel.protocol == "udp":
            self.udp = _UdpPlane(tunnel, self.codec, self.counters)
        stopped: list[BaseException] = []
        try:
            async with trio.open_nursery() as nursery:
                if self.udp is not None:
                    nursery.start_soon(self.udp.pump)
                try:
                    if tunnel.protocol == "tcp" and tunnel.direction == "egress":
                        host, port = split_host_port(tunnel.local_addr)
                        listeners = await trio.open_tcp_listeners(port, host=host.strip("[]"))
                        nursery.start_soon(self._accept_local_tcp, listeners)
                    if tunnel.mode == "relay" and tunnel.transport == "udp":
                        await self._run_native()
                    elif tunnel.mode == "relay":
                        await self._run_quic(ALPN_RELAY, tunnel.relay_addr)
                    elif tunnel.direction == "egress":
                        await self._run_quic(ALPN_DIRECT, tunnel.peer_addr)
                    else:
                        await self._run_direct_listener()
                except (_Retry, OSError) as exc:
                    stopped.append(exc)  # raised below, outside the nursery (no exception group)
                nursery.cancel_scope.cancel()
        finally:
            if self.udp is not None:
                self.udp.close()
                self.udp = None
        if stopped:
            raise stopped[0]
        raise _Retry("carrier ended")

    # ------------------------------------------------------------------ QUIC (relay or dialler)
    async def _run_quic(self, alpn: str, address_text: str | None) -> None:
        if address_text is None:
            raise _Retry("relay_addr or peer_addr is not set", failed=True)
        address = await _resolve(address_text)
        sock = open_udp_socket(("::", 0) if ":" in address[0] else ("0.0.0.0", 0))
        endpoint = QuicEndpoint(sock)
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.run)
            carrier = _QuicCarrier(self, endpoint)
            carrier.nursery = nursery
            carrier.connection = endpoint.connect(address, client_configuration(alpn), carrier)
            self._carrier = carrier
            outcome: list[_Retry] = []
            if alpn == ALPN_RELAY:
                await self._relay_control(carrier, outcome)
            else:
                await self._dialler_control(carrier, outcome)
            nursery.cancel_scope.cancel()
        self._carrier = None
        raise outcome[0] if outcome else _Retry("connection closed")

    def _handshake(self, carrier: _QuicCarrier) -> None:
        if not carrier.is_client:
            return  # the direct listener takes the dialler's first stream as control
        carrier.control_stream = carrier.connection.get_next_available_stream_id()
        if self._carrier_events is not None:
            self._carrier_events.send_nowait(("handshake", None))

    def _carrier_lost(self, carrier: _QuicCarrier, reason: str) -> None:
        if self._carrier_events is not None:
            try:
                self._carrier_events.send_nowait(("lost", reason))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass

    async def _relay_control(self, carrier: _QuicCarrier, outcome: list[_Retry]) -> None:
        tunnel = self.tunnel
        session = EdgeRelaySession(software_version=self.software_version, edge_id=self.edge_id)
        secret = _reveal(tunnel.tunnel_bind_secret)
        token = None if secret is None else compute_bind_token(secret, str(tunnel.id), tunnel.direction)
        send, receive = trio.open_memory_channel[tuple[str, object]](math.inf)
        self._carrier_events = send
        carrier.on_control = lambda data: send.send_nowait(("control", data))
        clock = time.monotonic

        def apply(step: RelayStep) -> None:
            carrier.send_control(step.data)
            if step.close is not None:
                carrier.endpoint.close(carrier.connection, reason=step.close.reason)
            for event in step.events:
                if isinstance(event, TunnelWaiting):
                    carrier.data_ready = False
                    self._set_state("Waiting")
                elif isinstance(event, TunnelReady):
                    carrier.data_ready = True
                    self._attach(carrier)
                    self._set_state("Connected")
                elif isinstance(event, TunnelDown):
                    carrier.data_ready = False
                    self._detach()
                    failed = event.reason == BIND_AUTH_FAILED
                    outcome.append(_Retry(event.reason, failed=failed))
                    carrier.endpoint.close(carrier.connection, reason="tunnel down")
                elif isinstance(event, HelloAcknowledged):
                    pass

        try:
            with trio.move_on_after(_CONNECT_TIMEOUT_S) as scope:
                kind, _ = await receive.receive()
            if scope.cancelled_caught or kind != "handshake":
                outcome.append(_Retry("relay unreachable"))
                return
            apply(session.start(clock()))
            apply(session.bind(str(tunnel.id), tunnel.direction, tunnel.protocol, token))
            while not outcome:
                with trio.move_on_after(_TICK_S):
                    kind, value = await receive.receive()
                    if kind == "control":
                        apply(session.receive_data(value))  # type: ignore[arg-type]
                    elif kind == "lost":
                        apply(session.connection_lost())
                        outcome.append(_Retry(f"relay link down: {value}"))
                apply(session.tick(clock()))
        finally:
            self._carrier_events = None
            self._detach()

    async def _dialler_control(self, carrier: _QuicCarrier, outcome: list[_Retry]) -> None:
        tunnel = self.tunnel
        psk = _reveal(tunnel.tunnel_psk) or ""
        dialler = DirectDialler(tunnel_id=str(tunnel.id), tunnel_psk=psk)
        send, receive = trio.open_memory_channel[tuple[str, object]](math.inf)
        self._carrier_events = send
        carrier.on_control = lambda data: send.send_nowait(("control", data))
        clock = time.monotonic
        pings = FrameDecoder()
        try:
            with trio.move_on_after(_CONNECT_TIMEOUT_S) as scope:
                kind, _ = await receive.receive()
            if scope.cancelled_caught or kind != "handshake":
                outcome.append(_Retry("peer unreachable"))
                return
            self._apply_direct(carrier, dialler.start(clock()), outcome)
            next_ping = clock() + 15.0
            while not outcome:
                with trio.move_on_after(_TICK_S):
                    kind, value = await receive.receive()
                    if kind == "lost":
                        outcome.append(_Retry(f"peer link down: {value}"))
                        break
                    if kind == "control":
                        if dialler.authenticated:
                            for body in pings.feed(value):  # type: ignore[arg-type]
                                _ignore_pong(body)
                        else:
                            self._apply_direct(carrier, dialler.receive_data(value, clock()), outcome)  # type: ignore[arg-type]
                            if dialler.authenticated:
                                for body in pings.feed(dialler.take_remaining()):
                                    _ignore_pong(body)
                if not dialler.authenticated:
                    self._apply_direct(carrier, dialler.tick(clock()), outcome)
                elif clock() >= next_ping:
                    next_ping = clock() + 15.0
                    carrier.send_control(encode(PingMessage()))
        finally:
            self._carrier_events = None
            self._detach()

    def _apply_direct(self, carrier: _QuicCarrier, step: DirectStep, outcome: list[_Retry]) -> None:
        carrier.send_control(step.data)
        for event in step.events:
            if isinstance(event, PeerAuthenticated):
                carrier.data_ready = True
                self._attach(carrier)
                self._set_state("Connected")
            elif isinstance(event, PeerRejected):
                outcome.append(_Retry(event.reason, failed=not event.local))
        if step.close is not None:
            carrier.endpoint.close(carrier.connection, reason=step.close.reason)
            if not outcome:
                outcome.append(_Retry(step.close.reason))

    def _attach(self, carrier: _QuicCarrier) -> None:
        if self.udp is not None:
            self.udp.send = carrier.send_datagram
            self.udp.flush = carrier.flush

    def _detach(self) -> None:
        if self.udp is not None:
            self.udp.send = None
            self.udp.flush = lambda: None

    async def _accept_local_tcp(self, listeners: list[trio.SocketListener]) -> None:
        """Egress, TCP: each local connection becomes a stream on the current carrier; while
        there is none, the connection is reset (the application sees the tunnel down)."""
        try:
            while True:
                tcp = await listeners[0].accept()
                carrier = self._carrier
                if carrier is None or not carrier.data_ready or carrier.gone.is_set():
                    _reset_tcp(tcp)
                    await tcp.aclose()
                    continue
                carrier.open_outbound(tcp)
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()

    # ------------------------------------------------------------------ direct listener
    async def _run_direct_listener(self) -> None:
        tunnel = self.tunnel
        if tunnel.direct_listen_addr is None:
            raise _Retry("direct_listen_addr is not set", failed=True)
        host, port = split_host_port(tunnel.direct_listen_addr)
        cert = _reveal(tunnel.tls_cert_pem)
        key = _reveal(tunnel.tls_key_pem)
        configuration = server_configuration(
            ALPN_DIRECT, None if cert is None else cert.encode(), None if key is None else key.encode()
        )
        psk = _reveal(tunnel.tunnel_psk) or ""
        sock = open_udp_socket((host.strip("[]"), port))
        self._set_state("Waiting")
        clock = time.monotonic
        listeners: dict[ManagedConnection, tuple[_QuicCarrier, DirectListener, FrameDecoder]] = {}

        async with trio.open_nursery() as nursery:

            def accept(connection: ManagedConnection, address: tuple[str, int]) -> _QuicCarrier:
                carrier = _QuicCarrier(self, endpoint, connection)
                carrier.nursery = nursery
                machine = DirectListener(tunnel_id=str(tunnel.id), tunnel_psk=psk)
                machine.start(clock())
                pings = FrameDecoder()
                listeners[connection] = (carrier, machine, pings)

                def on_control(data: bytes) -> None:
                    if machine.authenticated:
                        rest = data
                    else:
                        step = machine.receive_data(data, clock())
                        carrier.send_control(step.data)
                        if step.close is not None:
                            endpoint.close(connection, reason=step.close.reason)
                        if not any(isinstance(e, PeerAuthenticated) for e in step.events):
                            return
                        # The newest authenticated peer wins (a restarted dialler replaces its old self).
                        if self._carrier is not None and self._carrier is not carrier:
                            endpoint.close(self._carrier.connection, reason="replaced by a newer peer")
                        self._carrier = carrier
                        carrier.data_ready = True
                        self._attach(carrier)
                        self._set_state("Connected")
                        rest = machine.take_remaining()
                    for body in pings.feed(rest):
                        try:
                            message = decode(body)
                        except Exception:
                            continue
                        if isinstance(message, PingMessage):
                            carrier.send_control(encode(PongMessage()))

                carrier.on_control = on_control
                return carrier

            endpoint = QuicEndpoint(sock, server_configuration=configuration, accept=accept)
            await nursery.start(endpoint.run)
            while True:
                await trio.sleep(_TICK_S)
                now = clock()
                for connection, (carrier, machine, _pings) in list(listeners.items()):
                    if carrier.gone.is_set():
                        del listeners[connection]
                        if self._carrier is carrier:
                            self._carrier = None
                            self._detach()
                            self._set_state("Waiting", "peer disconnected")
                        continue
                    if not machine.authenticated:
                        step = machine.tick(now)
                        carrier.send_control(step.data)
                        if step.close is not None:
                            endpoint.close(connection, reason=step.close.reason)

    # ------------------------------------------------------------------ native UDP plane (9)
    async def _run_native(self) -> None:
        tunnel = self.tunnel
        assert tunnel.relay_addr is not None and self.udp is not None
        relay = await _resolve(tunnel.relay_addr)
        family = socket.AF_INET6 if ":" in relay[0] else socket.AF_INET
        raw = socket.socket(family, socket.SOCK_DGRAM)
        raw.setblocking(False)
        set_socket_buffers(raw, rcvbuf=_LOCAL_SOCKET_BUFFER, sndbuf=_LOCAL_SOCKET_BUFFER)
        raw.connect(relay)  # only the relay's datagrams are read (its acks leave from this port)
        secret = _reveal(tunnel.tunnel_bind_secret)
        token = None if secret is None else compute_bind_token(secret, str(tunnel.id), tunnel.direction)
        register = encode_register(Register(tunnel.id, tunnel.direction, token))
        udp = self.udp
        clock = time.monotonic
        last_ack: float | None = None
        ready = False

        def send(datagram: bytes) -> bool:
            try:
                raw.send(datagram)
                return True
            except OSError:
                return False

        try:
            async with trio.open_nursery() as nursery:

                async def reader() -> None:
                    nonlocal last_ack, ready
                    while True:
                        await trio.lowlevel.wait_readable(raw)
                        for _ in range(_UDP_BATCH):
                            try:
                                data = raw.recv(2048)
                            except BlockingIOError:
                                break
                            except OSError:
                                continue  # ICMP port unreachable: the relay is not there (yet)
                            if data[:16] == NIL_PREFIX:
                                try:
                                    ack = decode_ack(data)
                                except ControlError:
                                    continue
                                if ack.tunnel_id != tunnel.id:
                                    continue
                                last_ack = clock()
                                ready = ack.ready
                                if ready:
                                    udp.send, udp.flush = send, (lambda: None)
                                    self._set_state("Connected")
                                else:
                                    udp.send = None
                                    self._set_state("Waiting")
                            elif ready:
                                udp.deliver(data)
                        await trio.lowlevel.checkpoint()

                nursery.start_soon(reader)
                started = clock()
                while True:
                    send(register)
                    now = clock()
                    dead = now - (started if last_ack is None else last_ack) >= EDGE_DEAD_AFTER_S
                    if dead:
                        # interop.md 9 "Edge timers": no ack for 25 s, the relay counts as dead.
                        ready = False
                        udp.send = None
                        self._set_state("Connecting", "relay not answering")
                    # Every 5 s while the relay answers; every 1 s until it does (again).
                    alive = last_ack is not None and not dead
                    await trio.sleep(EDGE_REGISTER_INTERVAL_S if alive else EDGE_RETRY_INTERVAL_S)
        finally:
            udp.send = None
            raw.close()


def _ignore_pong(body: bytes) -> None:
    """After authentication the direct control stream carries ping/pong only (8.3)."""
    del body
