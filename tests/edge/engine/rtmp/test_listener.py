"""The shared RTMP listener in-process: routes, standby takeover, rejects, timeouts, binding."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

from appliance.models.events import Event
from services.edge.core.rtmp import ConnectionClosed, ErrorReceived, PublishStarted, RtmpClientConnection
from services.edge.core.rtmp import Event as RtmpEvent
from services.edge.core.rtmp.flv import AudioCodec, AudioTag, FrameType, PacketKind, VideoCodec, VideoTag
from services.edge.engine.rtmp import listener as rtmp_listener
from services.edge.engine.rtmp.listener import Route, join, leave
from services.edge.engine.udp import FlowStartError
from tests.edge.core.mux.test_from_flv import ASC, AVCC, avc_frame
from tests.helpers.ports import free_port


class FakeFlow:
    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        self.ts: list[bytes] = []
        self.events: list[Event] = []
        self.batches = 0

    def on_ts(self, leg: int, view: memoryview, arrival: float) -> None:
        self.ts.append(bytes(view))

    def end_batch(self) -> None:
        self.batches += 1

    def publish(self, event: Event) -> None:
        self.events.append(event)

    def internal_error(self, where: str, exc: BaseException) -> None:
        raise AssertionError(f"{where}: {exc!r}")

    def messages(self) -> list[str]:
        return [e.message for e in self.events]


class Client:
    def __init__(self, stream: trio.SocketStream, conn: RtmpClientConnection) -> None:
        self.stream, self.conn = stream, conn
        self.events: list[RtmpEvent] = []

    @classmethod
    async def publish(cls, port: int, key: str, app: str = "live") -> Client:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        conn = RtmpClientConnection(app=app, tc_url=f"rtmp://127.0.0.1:{port}/{app}")
        conn.publish(key)
        client = cls(stream, conn)
        await client.until(lambda e: isinstance(e, (PublishStarted, ErrorReceived, ConnectionClosed)))
        return client

    async def flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            await self.stream.send_all(out)

    async def until(self, predicate: Any, timeout: float = 5.0) -> RtmpEvent:
        with trio.fail_after(timeout):
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                await self.flush()
                data = await self.stream.receive_some(65536)
                self.events += self.conn.receive_data(data)
                if not data:
                    self.events.append(ConnectionClosed())

    @property
    def accepted(self) -> bool:
        return any(isinstance(e, PublishStarted) for e in self.events)

    async def send_media(self, frames: int = 30, start_ms: int = 0) -> None:
        self.conn.send_video(start_ms, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, AVCC))
        self.conn.send_audio(start_ms, AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, ASC))
        for i in range(frames):
            self.conn.send_video(start_ms + i * 40, avc_frame(i, key=i % 25 == 0))
            self.conn.send_audio(start_ms + i * 40, AudioTag(AudioCodec.AAC, PacketKind.FRAME, bytes(100)))
        await self.flush()

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


async def test_routes_keys_and_standby_takeover() -> None:
    port = free_port()
    a, b = FakeFlow("a"), FakeFlow("b")
    route_a, route_b = Route(a, "live", "key-a", 2), Route(b, "live", "key-b", 1)  # type: ignore[arg-type]
    listener = join("127.0.0.1", port, False, route_a)
    assert join("127.0.0.1", port, False, route_b) is listener  # the second flow shares it
    try:
        first = await Client.publish(port, "key-a")
        second = await Client.publish(port, "key-a")  # a standby
        third = await Client.publish(port, "key-a")  # over max_publishers: refused, not left hanging
        wrong = await Client.publish(port, "nope")
        assert first.accepted and second.accepted and not third.accepted and not wrong.accepted
        await third.until(lambda e: isinstance(e, ConnectionClosed))
        assert any("max_publishers (2) reached" in m for m in a.messages())
        assert any("wrong stream key" in m for m in a.messages() + b.messages())
        await first.send_media(60)
        await second.send_media(60)
        await wait_until(lambda: len(a.ts) > 20)
        assert route_a.active is not None and route_a.active.peer.startswith("127.0.0.1:")
        fed_by_first = len(a.ts)
        await first.close()
        await wait_until(lambda: any("takes over" in m for m in a.messages()))
        await second.send_media(60, start_ms=2400)
        await wait_until(lambda: len(a.ts) > fed_by_first + 10)
        assert not b.ts and all(len(d) == 1316 for d in a.ts)
        other = await Client.publish(port, "key-b")
        assert other.accepted
        await other.send_media(40)
        await wait_until(lambda: len(b.ts) > 10)
        for client in (second, other, wrong):
            await client.close()
    finally:
        leave(listener, route_a)
        assert not listener.closed  # route_b still holds it
        leave(listener, route_b)
    assert listener.closed and rtmp_listener.listeners() == {}
    with socket.socket() as probe:  # nobody listens on the port any more, at once
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


async def test_garbage_and_silence_are_closed_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtmp_listener, "IDLE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(rtmp_listener, "UNROUTED_EVENT_EVERY_S", 0.0)
    port = free_port()
    flow = FakeFlow("f")
    route = Route(flow, "live", None, 1)  # type: ignore[arg-type]
    listener = join("127.0.0.1", port, False, route)
    try:
        garbage = await trio.open_tcp_stream("127.0.0.1", port)
        await garbage.send_all(b"\x07" + bytes(2000))  # RTMP version 7: a protocol error
        with trio.fail_after(5):
            assert await garbage.receive_some(100) == b""
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            while await silent.receive_some(100):
                pass
        await wait_until(lambda: len(flow.events) >= 2)
        messages = flow.messages()
        assert any("protocol error" in m for m in messages) and any("no data for" in m for m in messages)
        assert all(e.severity == "warning" and e.category == "rtmp" for e in flow.events)
        assert listener.connections == 0
    finally:
        leave(listener, route)


async def test_a_busy_address_fails_the_start() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(FlowStartError, match=r"cannot listen for RTMP on 127\.0\.0\.1"):
            join("127.0.0.1", port, False, Route(FakeFlow("x"), "live", None, 1))  # type: ignore[arg-type]
    assert rtmp_listener.listeners() == {}


async def test_the_driver_reports_state_and_the_publisher_address() -> None:
    from appliance.models.config import RtmpInput
    from appliance.models.stats import InputCounters
    from services.edge.engine.kinds.rtmp import RtmpInputDriver

    port = free_port()
    flow = FakeFlow("d")
    driver = RtmpInputDriver(RtmpInput(listen_addr=f"127.0.0.1:{port}", stream_key="k"), flow)  # type: ignore[arg-type]
    driver.open()
    try:
        assert driver.state(0.0) == "listening" and driver.extra_counters() == {}
        client = await Client.publish(port, "k")
        assert driver.state(0.0) == "receiving"
        peer = driver.extra_counters()["peer_addr"]
        assert peer.startswith("127.0.0.1:")
        assert InputCounters(state="receiving", **driver.extra_counters()).peer_addr == peer
        assert "connected (active, stream key accepted)" in flow.messages()[0] and peer in flow.messages()[0]
        await client.close()
        await wait_until(lambda: driver.state(0.0) == "listening")
    finally:
        driver.close()
        driver.close()  # idempotent
    assert rtmp_listener.listeners() == {}


def test_rtmps_certificate_files_from_the_start_command(tmp_path: Any) -> None:
    import datetime as dt

    from appliance.tls_cert import generate_self_signed
    from services.edge.engine.rtmp import tls as rtmp_tls

    cert, key = generate_self_signed("edge", [], dt.datetime.now(dt.UTC))
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    rtmp_tls.reset()
    try:
        rtmp_tls.configure(None)
        ephemeral = rtmp_tls.server_context()  # none named: a self-signed one of this worker
        assert rtmp_tls.server_context() is ephemeral
        rtmp_tls.configure({"cert_path": str(tmp_path / "c.pem"), "key_path": str(tmp_path / "k.pem")})
        assert rtmp_tls.server_context() is not ephemeral
        rtmp_tls.configure({"cert_path": str(tmp_path / "missing.pem"), "key_path": str(tmp_path / "k.pem")})
        with pytest.raises(FlowStartError, match="RTMPS: cannot load"):
            rtmp_tls.server_context()
    finally:
        rtmp_tls.reset()


async def test_a_publisher_that_stops_reading_is_closed_and_the_others_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that floods pings (RTMP 1.0 §7.1.7: each one is answered) but never reads fills the
    edge's send buffer: the write times out, that connection is closed with a warning, and another
    publisher on the same listener keeps feeding its flow."""
    monkeypatch.setattr(rtmp_listener, "SEND_TIMEOUT_S", 0.5)
    port = free_port()
    flooded, healthy = FakeFlow("flooded"), FakeFlow("healthy")
    routes = [Route(flooded, "live", "k1", 1), Route(healthy, "live", "k2", 1)]  # type: ignore[arg-type]
    listener = join("127.0.0.1", port, False, routes[0])
    join("127.0.0.1", port, False, routes[1])
    try:
        stopper = await Client.publish(port, "k1")
        good = await Client.publish(port, "k2")
        assert stopper.accepted and good.accepted
        # User Control PingRequest (type 4, event 6) on chunk stream 2, fmt 0: 12 + 6 bytes each.
        ping = b"\x02" + bytes(3) + (6).to_bytes(3, "big") + b"\x04" + bytes(4) + (6).to_bytes(2, "big") + bytes(4)
        with trio.move_on_after(20):
            for _ in range(4000):  # up to ~290 MB of pings, never reading the pongs
                try:
                    await stopper.stream.send_all(ping * 4000)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break  # the edge closed it
                if any("not reading" in m for m in flooded.messages()):
                    break
        await wait_until(lambda: any(e.severity == "warning" for e in flooded.events), timeout=10)
        assert any("not reading (a write waited 0.5 s); closed" in m for m in flooded.messages()), flooded.messages()
        before = len(healthy.ts)
        await good.send_media(frames=30)
        await wait_until(lambda: len(healthy.ts) > before, timeout=5)
        await good.close()
        await stopper.close()
    finally:
        for route in routes:
            leave(listener, route)
