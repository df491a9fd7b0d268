"""The trio QUIC driver against real aioquic connections over loopback UDP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from aioquic.quic import events

from appliance.quic import (
    ManagedConnection,
    QuicEndpoint,
    client_configuration,
    open_udp_socket,
    server_configuration,
)
from appliance.quic.connection import MAX_BIDI_STREAMS, MAX_UNI_STREAMS

ALPN = "mediaplane-relay"


@dataclass
class Recorder:
    """A handler that records events and lets a test react to them."""

    events: list[events.QuicEvent] = field(default_factory=list)
    terminated: trio.Event = field(default_factory=trio.Event)
    changed: trio.Event = field(default_factory=trio.Event)
    on_event: Callable[[events.QuicEvent], None] | None = None

    def quic_event(self, event: events.QuicEvent) -> None:
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        self.changed.set()
        self.changed = trio.Event()

    def connection_terminated(self, event: events.ConnectionTerminated) -> None:
        self.events.append(event)
        self.terminated.set()

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()


@asynccontextmanager
async def endpoints(
    accept: Callable[[ManagedConnection, tuple[str, int]], Recorder | None],
    server_alpn: str = ALPN,
) -> AsyncIterator[tuple[QuicEndpoint, QuicEndpoint]]:
    server_sock = open_udp_socket(("127.0.0.1", 0))
    client_sock = open_udp_socket(("127.0.0.1", 0))
    server = QuicEndpoint(server_sock, server_configuration=server_configuration(server_alpn), accept=accept)
    client = QuicEndpoint(client_sock)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await nursery.start(client.run)
        yield server, client
        nursery.cancel_scope.cancel()


async def test_handshake_stream_and_datagram_echo() -> None:
    server_connections: list[ManagedConnection] = []
    server_endpoint: list[QuicEndpoint] = []

    def accept(connection: ManagedConnection, address: tuple[str, int]) -> Recorder:
        recorder = Recorder()

        def echo(event: events.QuicEvent) -> None:
            if isinstance(event, events.StreamDataReceived):
                connection.send_stream_data(event.stream_id, event.data, event.end_stream)
            elif isinstance(event, events.DatagramFrameReceived):
                connection.send_datagram_frame(event.data)
            server_endpoint[0].transmit(connection)

        recorder.on_event = echo
        server_connections.append(connection)
        return recorder

    async with endpoints(accept) as (server, client):
        server_endpoint.append(server)
        recorder = Recorder()
        connection = client.connect(server.local_address, client_configuration(ALPN), recorder)
        await recorder.wait_for(lambda: bool(recorder.of(events.HandshakeCompleted)))
        assert recorder.of(events.HandshakeCompleted)[0].alpn_protocol == ALPN
        stream_id = connection.get_next_available_stream_id()
        connection.send_stream_data(stream_id, b"hello relay", end_stream=True)
        connection.send_datagram_frame(b"x" * 1368)  # a 1316-byte TS datagram sealed (interop 10)
        client.transmit(connection)
        await recorder.wait_for(
            lambda: (
                bool(recorder.of(events.DatagramFrameReceived))
                and any(e.end_stream for e in recorder.of(events.StreamDataReceived))
            )
        )
        assert b"".join(e.data for e in recorder.of(events.StreamDataReceived)) == b"hello relay"
        assert recorder.of(events.DatagramFrameReceived)[0].data == b"x" * 1368
        # interop.md 8.1 stream limits, as the client sees them from the server's parameters.
        assert connection._remote_max_streams_bidi == MAX_BIDI_STREAMS
        assert connection._remote_max_streams_uni == MAX_UNI_STREAMS
        assert server.counters.connections_accepted == 1


async def test_other_alpn_fails_the_handshake() -> None:
    async with endpoints(lambda c, a: Recorder()) as (server, client):
        recorder = Recorder()
        client.connect(server.local_address, client_configuration("h3"), recorder)
        with trio.fail_after(10):
            await recorder.terminated.wait()
        assert not recorder.of(events.HandshakeCompleted)


async def test_refused_connection_is_closed() -> None:
    async with endpoints(lambda c, a: None) as (server, client):
        recorder = Recorder()
        client.connect(server.local_address, client_configuration(ALPN), recorder)
        with trio.fail_after(10):
            await recorder.terminated.wait()
        terminated = recorder.of(events.ConnectionTerminated)
        assert terminated and terminated[0].error_code == 0x2
        assert server.counters.connections_refused == 1


def test_datagram_queue_is_bounded_drop_oldest() -> None:
    connection = ManagedConnection(configuration=client_configuration(ALPN), datagram_queue_limit=4)
    for index in range(10):
        connection.send_datagram_frame(bytes([index]))
    assert connection.datagrams_queued == 4
    assert connection.datagrams_dropped == 6
    assert list(connection._datagrams_pending) == [bytes([i]) for i in range(6, 10)]


async def test_controlled_stream_window_is_backpressure() -> None:
    window = 64 * 1024
    received: list[int] = [0]
    held: list[tuple[ManagedConnection, int]] = []

    def accept(connection: ManagedConnection, address: tuple[str, int]) -> Recorder:
        recorder = Recorder()

        def count(event: events.QuicEvent) -> None:
            if isinstance(event, events.StreamDataReceived):
                if not held:
                    connection.control_stream_window(event.stream_id, window)
                    held.append((connection, event.stream_id))
                received[0] += len(event.data)

        recorder.on_event = count
        return recorder

    async with endpoints(accept) as (server, client):
        recorder = Recorder()
        server_config = client_configuration(ALPN)
        connection = client.connect(server.local_address, server_config, recorder)
        await recorder.wait_for(lambda: bool(recorder.of(events.HandshakeCompleted)))
        stream_id = connection.get_next_available_stream_id()
        total = 8 * 1024 * 1024
        connection.send_stream_data(stream_id, bytes(total))
        client.transmit(connection)
        # Nothing is consumed: the sender stops at its initial credit (1 MiB, aioquic's default
        # max_stream_data) instead of aioquic's doubling window running ahead.
        with trio.fail_after(10):
            while received[0] < 1024 * 1024:
                await trio.sleep(0.01)
        await trio.sleep(0.3)  # allow a stray growth to show (it must not)
        assert received[0] <= 1024 * 1024
        server_connection, sid = held[0]
        consumed = 0
        with trio.fail_after(20):
            while received[0] < total:
                server_connection.consume(sid, received[0] - consumed)
                consumed = received[0]
                server.transmit(server_connection)
                await trio.sleep(0.005)
                assert received[0] <= consumed + 1024 * 1024 + window


def test_pacing_bursts_hold_64_packets() -> None:
    """aioquic's pacer allows 16-packet bursts; each burst costs the driver a wake-up, so ours
    allows 64 (still paced at cwnd/srtt); docs/quic.md has the measured gain."""
    connection = ManagedConnection(configuration=client_configuration(ALPN))
    pacer = connection._loss._pacer
    size = connection._max_datagram_size
    pacer.update_rate(congestion_window=1000 * size, smoothed_rtt=0.010)
    rate = 1000 * size / 0.010
    assert abs(pacer.bucket_max * rate - 64 * size) < 1
    pacer.update_rate(congestion_window=20 * size, smoothed_rtt=0.010)  # a small window: half of it
    assert abs(pacer.bucket_max * (20 * size / 0.010) - 10 * size) < 1
