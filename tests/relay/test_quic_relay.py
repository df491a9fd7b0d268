"""The relay's QUIC plane with real aioquic clients over loopback: control, datagrams, TCP streams."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from aioquic.quic import events

from appliance.quic import QuicEndpoint, client_configuration, open_udp_socket
from appliance.relayproto import (
    ALPN_RELAY,
    BindAuthorization,
    FrameDecoder,
    StreamHeader,
    compute_bind_token,
    decode,
    encode,
    encode_stream_header,
)
from services.relay.control import RelayTunnels, TunnelStatus
from services.relay.quic_relay import QuicRelay

TUNNEL = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
SECRET = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


class FakeEdge:
    """A bare QUIC client speaking interop 8.2 by hand (the relay must not need our edge)."""

    def __init__(self, endpoint: QuicEndpoint, address: tuple[str, int]) -> None:
        self.endpoint = endpoint
        self.connection = endpoint.connect(address, client_configuration(ALPN_RELAY), self)
        self.control = self.connection.get_next_available_stream_id()
        self.decoder = FrameDecoder()
        self.messages: list[dict] = []
        self.datagrams: list[bytes] = []
        self.streams: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.reset: set[int] = set()
        self.terminated = False
        self.changed = trio.Event()

    def quic_event(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            if event.stream_id == self.control:
                for body in self.decoder.feed(event.data):
                    self.messages.append(decode(body).model_dump())
            else:
                self.streams.setdefault(event.stream_id, bytearray()).extend(event.data)
                if event.end_stream:
                    self.ended.add(event.stream_id)
        elif isinstance(event, events.DatagramFrameReceived):
            self.datagrams.append(event.data)
        elif isinstance(event, events.StreamReset):
            self.reset.add(event.stream_id)
        self.changed.set()
        self.changed = trio.Event()

    def connection_terminated(self, event: events.ConnectionTerminated) -> None:
        self.terminated = True
        self.changed.set()

    def send(self, **message: object) -> None:
        from appliance.relayproto.messages import MESSAGE_MODELS

        model = MESSAGE_MODELS[str(message["type"])].model_validate(message)
        self.connection.send_stream_data(self.control, encode(model))
        self.endpoint.transmit(self.connection)

    async def wait(self, predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
        with trio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()

    def types(self) -> list[str]:
        return [m["type"] for m in self.messages]


@asynccontextmanager
async def relay_and_edges(require_bind_auth: bool = False) -> AsyncIterator[tuple[QuicRelay, FakeEdge, FakeEdge]]:
    tunnels = RelayTunnels(software_version="test", require_bind_auth=require_bind_auth)
    relay = QuicRelay(tunnels)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.serve, open_udp_socket(("127.0.0.1", 0)))
        edges = []
        for _ in range(2):
            endpoint = QuicEndpoint(open_udp_socket(("127.0.0.1", 0)))
            await nursery.start(endpoint.run)
            edges.append(FakeEdge(endpoint, relay.local_address))
        for edge in edges:
            edge.send(type="hello", protocol_version=2, software_version="t")
            await edge.wait(lambda e=edge: "hello_ack" in e.types())
        yield relay, edges[0], edges[1]
        nursery.cancel_scope.cancel()


async def bind(edge: FakeEdge, direction: str, protocol: str, token: str | None = None) -> None:
    message: dict[str, object] = {
        "type": "tunnel_bind",
        "tunnel_id": TUNNEL,
        "direction": direction,
        "protocol": protocol,
    }
    if token is not None:
        message["bind_token"] = token
    edge.send(**message)


async def test_udp_datagrams_cross_the_relay_unchanged_and_counted() -> None:
    async with relay_and_edges() as (relay, source, sink):
        await bind(source, "egress", "udp")
        await source.wait(lambda: "tunnel_waiting" in source.types())
        await bind(sink, "ingress", "udp")
        await sink.wait(lambda: "tunnel_ready" in sink.types())
        await source.wait(lambda: "tunnel_ready" in source.types())
        assert relay.tunnels.tunnel(TUNNEL).status is TunnelStatus.READY
        prefix = bytes.fromhex(TUNNEL.replace("-", ""))
        payloads = [prefix + os.urandom(1352) for _ in range(50)]
        for payload in payloads:
            source.connection.send_datagram_frame(payload)
        source.endpoint.transmit(source.connection)
        await sink.wait(lambda: len(sink.datagrams) >= 45)  # datagrams are best-effort
        assert set(sink.datagrams) <= set(payloads)
        traffic = relay.tunnel_traffic(TUNNEL)
        assert traffic.bytes_egress == 1352 * traffic.udp_datagrams_total  # prefix excluded (13)
        assert relay.traffic.bytes_forwarded == traffic.bytes_egress
        # and back: the sink's datagrams reach the source, counted as ingress
        sink.connection.send_datagram_frame(prefix + b"back")
        sink.endpoint.transmit(sink.connection)
        await source.wait(lambda: prefix + b"back" in source.datagrams)
        assert relay.tunnel_traffic(TUNNEL).bytes_ingress == 4
        assert sorted(e[0] for e in relay.edges())[0].startswith("127.0.0.1:")


async def test_tcp_stream_header_data_and_fin_both_ways() -> None:
    async with relay_and_edges() as (relay, source, sink):
        await bind(source, "egress", "tcp")
        await bind(sink, "ingress", "tcp")
        await source.wait(lambda: "tunnel_ready" in source.types())
        stream = source.connection.get_next_available_stream_id()
        header = StreamHeader(tunnel_id=TUNNEL, stream_type="tcp", stream_nonce="00" * 16)
        body = os.urandom(3 * 1024 * 1024)
        source.connection.send_stream_data(stream, encode_stream_header(header) + body, end_stream=True)
        source.endpoint.transmit(source.connection)
        await sink.wait(lambda: bool(sink.ended), timeout=20)
        (peer_stream,) = sink.ended
        received = bytes(sink.streams[peer_stream])
        decoder = FrameDecoder()
        decoder.receive_data(received[:200])
        assert decoder.next_frame() == encode_stream_header(header)[4:]  # the same header (8.3)
        assert received[len(encode_stream_header(header)) :] == body
        assert relay.tunnel_traffic(TUNNEL).tcp_streams_total == 1
        # the reply direction, then its FIN closes the pipe
        sink.connection.send_stream_data(peer_stream, b"reply", end_stream=True)
        sink.endpoint.transmit(sink.connection)
        await source.wait(lambda: stream in source.ended)
        assert bytes(source.streams[stream]) == b"reply"  # no header written back (13)
        assert relay.traffic.tcp_streams_active == 0
        assert relay.tunnel_traffic(TUNNEL).bytes_egress == len(body)


async def test_bind_refused_without_token_under_require_bind_auth() -> None:
    async with relay_and_edges(require_bind_auth=True) as (relay, source, sink):
        await bind(source, "egress", "udp")
        await source.wait(lambda: "tunnel_down" in source.types())
        assert source.messages[-1]["reason"] == "bind authentication failed"
        relay.tunnels.authorize_tunnel(
            BindAuthorization(
                tunnel_id=TUNNEL,
                ingress_token=compute_bind_token(SECRET, TUNNEL, "ingress"),
                egress_token=compute_bind_token(SECRET, TUNNEL, "egress"),
            )
        )
        await bind(sink, "ingress", "udp", token=compute_bind_token(SECRET, TUNNEL, "egress"))  # wrong direction
        await sink.wait(lambda: "tunnel_down" in sink.types())
        await bind(sink, "ingress", "udp", token=compute_bind_token(SECRET, TUNNEL, "ingress"))
        await sink.wait(lambda: "tunnel_waiting" in sink.types())


async def test_close_tunnel_and_disconnect_edge() -> None:
    async with relay_and_edges() as (relay, source, sink):
        await bind(source, "egress", "tcp")
        await bind(sink, "ingress", "tcp")
        await sink.wait(lambda: "tunnel_ready" in sink.types())
        stream = source.connection.get_next_available_stream_id()
        header = StreamHeader(tunnel_id=TUNNEL, stream_type="tcp", stream_nonce="11" * 16)
        source.connection.send_stream_data(stream, encode_stream_header(header) + b"x")
        source.endpoint.transmit(source.connection)
        await sink.wait(lambda: bool(sink.streams))
        assert relay.close_tunnel(TUNNEL)
        await source.wait(lambda: "tunnel_down" in source.types() and stream in source.reset)
        await sink.wait(lambda: "tunnel_down" in sink.types())
        assert relay.tunnels.tunnel(TUNNEL) is None
        assert relay.traffic.tcp_streams_active == 0
        assert not relay.close_tunnel(TUNNEL)
        edge_id = relay.edges()[0][0]
        assert relay.disconnect_edge(edge_id)
        assert len(relay.edges()) == 1


async def test_a_slow_sink_holds_the_source_back() -> None:
    """TCP backpressure (issue 16): the sink never reads, so its stream window stays shut; the
    relay stops crediting the source once its own send buffer is full, and the bytes waiting in
    the relay stay bounded while the source's pile up at the source."""
    async with relay_and_edges() as (relay, source, sink):
        original = sink.quic_event

        def never_read(event: events.QuicEvent) -> None:
            if isinstance(event, events.StreamDataReceived) and event.stream_id not in sink.streams:
                sink.connection.control_stream_window(event.stream_id, 64 * 1024)  # and never consume
            original(event)

        sink.quic_event = never_read  # type: ignore[method-assign]
        await bind(source, "egress", "tcp")
        await bind(sink, "ingress", "tcp")
        await source.wait(lambda: "tunnel_ready" in source.types())
        stream = source.connection.get_next_available_stream_id()
        header = StreamHeader(tunnel_id=TUNNEL, stream_type="tcp", stream_nonce="22" * 16)
        total = 16 * 1024 * 1024
        source.connection.send_stream_data(stream, encode_stream_header(header) + bytes(total))
        source.endpoint.transmit(source.connection)
        await sink.wait(lambda: bool(sink.streams))

        def relay_buffered() -> int:
            links = list(relay._links.values())
            return sum(link.connection.send_buffered(sid) for link in links for sid in link.pipes)

        with trio.fail_after(10):  # the flow settles: the source stops being credited
            previous = -1
            while (now := source.connection.send_buffered(stream)) != previous:
                previous = now
                await trio.sleep(0.2)
        assert source.connection.send_buffered(stream) > total - 4 * 1024 * 1024  # most still at the source
        assert relay_buffered() < 4 * 1024 * 1024  # the relay holds a bounded amount
        assert sum(len(b) for b in sink.streams.values()) <= 1024 * 1024 + 64 * 1024


async def test_connections_beyond_the_per_ip_limit_are_refused() -> None:
    tunnels = RelayTunnels(software_version="test", max_connections_per_ip=1)
    relay = QuicRelay(tunnels)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.serve, open_udp_socket(("127.0.0.1", 0)))
        edges = []
        for _ in range(2):
            endpoint = QuicEndpoint(open_udp_socket(("127.0.0.1", 0)))
            await nursery.start(endpoint.run)
            edges.append(FakeEdge(endpoint, relay.local_address))
        await edges[1].wait(lambda: edges[1].terminated)
        assert not edges[0].terminated
        assert relay.tunnels.counters.connections_refused == 1
        nursery.cancel_scope.cancel()
