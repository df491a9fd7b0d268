"""The ``rtsp`` input driver's timing and protocol behaviour against a scripted camera.

tests/e2e/test_rtsp_input.py shows media, transports, auth and reconnects against a real
gst-rtsp-server; here the camera is scripted (``camera.py``) and time is trio's MockClock, so the
driver's timers (keep-alive, RTCP reports, no-media and handshake deadlines, reconnect delay),
its TEARDOWN, its once-per-outage warnings and its answers to the camera's own requests are
checked to the millisecond, over real TCP on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from appliance.models.config import RtspInput
from appliance.models.events import Event, Severity
from services.edge.engine.kinds.rtsp import RTCP_INTERVAL_S, TEARDOWN_GRACE_S, RtspInputDriver
from tests.edge.core.depay.rtpgen import Packet, Stream, encode

from .camera import FULL_PUBLIC, NO_GET_PARAMETER, SESSION_ID, Behaviour, Camera, Signal, sdp

DATAGRAM = 1316
EPS = 0.05  # MockClock: the driver's timers fire on time; this only absorbs the event-loop steps


@dataclass
class Media:
    packets: list[Packet]
    description: str


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Media:
    stream = Stream(encode(tmp_path_factory.mktemp("rtsp-camera"), "h264", seconds=2.0))
    return Media(stream.packets(), sdp(stream))


class FakeFlow:
    """The ``FlowPort`` side the driver uses: TS datagrams, batch ends and events, in order."""

    flow_id = "cam"

    def __init__(self, signal: Signal) -> None:
        self.signal = signal
        self.ts: list[bytes] = []
        self.log: list[str] = []  # "ts" per datagram, "end" per end_batch
        self.events: list[Event] = []

    def on_ts(self, leg: int, view: memoryview, arrival: float) -> None:
        self.ts.append(bytes(view))
        self.log.append("ts")
        self.signal.changed()

    def end_batch(self) -> None:
        self.log.append("end")
        self.signal.changed()

    def publish(self, event: Event) -> None:
        self.events.append(event)
        self.signal.changed()

    def internal_error(self, where: str, exc: BaseException) -> None:
        raise AssertionError(f"{where}: {exc!r}")

    def warnings(self) -> list[str]:
        return [e.message for e in self.events if e.severity == Severity.WARNING]

    def infos(self) -> list[str]:
        return [e.message for e in self.events if e.severity == Severity.INFO]


@dataclass
class Rig:
    camera: Camera
    driver: RtspInputDriver
    flow: FakeFlow
    served: trio.Event

    async def until(self, predicate: Any, timeout: float = 120.0) -> None:
        await self.camera.signal.wait_for(predicate, timeout)


@asynccontextmanager
async def running(media: Media, behaviours: list[Behaviour], **config: Any) -> AsyncIterator[Rig]:
    camera = Camera(media.packets, media.description, behaviours)
    async with trio.open_nursery() as nursery:
        await nursery.start(camera.serve)
        flow = FakeFlow(camera.signal)
        driver = RtspInputDriver(RtspInput(rtsp_url=camera.url, **config), flow)  # type: ignore[arg-type]
        driver.open()  # as the engine does before serve
        served = trio.Event()

        async def serve() -> None:
            await driver.serve()
            served.set()
            camera.signal.changed()

        nursery.start_soon(serve)
        try:
            yield Rig(camera, driver, flow, served)
        finally:
            driver.close()
            nursery.cancel_scope.cancel()


def near(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) < EPS


@pytest.mark.parametrize(("public", "method"), [(FULL_PUBLIC, "GET_PARAMETER"), (NO_GET_PARAMETER, "OPTIONS")])
async def test_keepalive_every_half_session_timeout(
    autojump_clock: trio.testing.MockClock, media: Media, public: str, method: str
) -> None:
    behaviour = Behaviour(session_timeout=4, public=public, media_packets=0)  # silence: keep-alives only
    async with running(media, [behaviour], timeout_secs=60) as rig:
        camera = rig.camera

        def keepalives() -> list[Any]:
            play = camera.connections[0].play_answered_at if camera.connections else None
            return [s for s in camera.requests if play is not None and s.time > play]

        await rig.until(lambda: len(keepalives()) >= 4)
        play = camera.connections[0].play_answered_at
        assert play is not None
        sent = keepalives()
        assert [s.method for s in sent] == [method] * 4
        for k, seen in enumerate(sent, 1):
            assert near(seen.time - play, 2.0 * k), [s.time - play for s in sent]
            assert seen.request.get("Session") == SESSION_ID
            assert seen.request.url == camera.url + "/"  # the aggregate control URL (a=control:*)
        assert len(camera.connections) == 1 and not rig.flow.warnings()


async def test_close_sends_teardown_with_the_session_before_closing(
    autojump_clock: trio.testing.MockClock, media: Media
) -> None:
    async with running(media, [Behaviour()], timeout_secs=10) as rig:
        camera = rig.camera
        await rig.until(lambda: camera.connections and camera.connections[0].packets_sent >= 30)
        assert rig.flow.ts
        closing = trio.current_time()
        rig.driver.close()  # what a flow stop does
        await rig.until(lambda: camera.connections[0].closed_at is not None and rig.served.is_set())
        conn = camera.connections[0]
        last = camera.requests[-1]
        assert last.method == "TEARDOWN" and last.conn == 0
        assert last.request.get("Session") == SESSION_ID
        assert conn.closed_at is not None and last.time <= conn.closed_at < closing + TEARDOWN_GRACE_S
        assert camera.methods() == ["OPTIONS", "DESCRIBE", "SETUP", "SETUP", "PLAY", "TEARDOWN"]


async def test_no_media_reconnects_and_warns_once_per_outage(
    autojump_clock: trio.testing.MockClock, media: Media
) -> None:
    behaviours = [
        Behaviour(media_packets=40),  # plays, then goes silent with the connection open
        Behaviour(play_stall=math.inf),  # the retry never plays: same outage, no second warning
        Behaviour(media_packets=40),  # plays again: the next failure is a new outage
    ]
    async with running(media, behaviours, timeout_secs=2, reconnect_delay_secs=3) as rig:
        camera, driver, flow = rig.camera, rig.driver, rig.flow
        display = camera.url

        await rig.until(lambda: flow.warnings())
        first = camera.connections[0]
        assert first.packets_sent == 40 and first.closed_at is not None
        assert near(first.closed_at - (first.last_packet_at or 0), 2.0)
        assert flow.warnings() == [f"RTSP input: disconnected from {display} (no media for 2 s); reconnecting in 3 s"]
        assert flow.events[-1].category == "rtsp"
        assert driver.state(0) == "reconnecting" and driver.last_error == "no media for 2 s"

        await rig.until(lambda: len(camera.connections) >= 3)  # the second session is over
        second, third = camera.connections[1], camera.connections[2]
        assert near(second.opened_at - first.closed_at, 3.0)
        assert near((second.closed_at or 0) - second.opened_at, 2.0)
        assert near(third.opened_at - (second.closed_at or 0), 3.0)
        assert driver.last_error == "the camera did not start playing within 2 s"
        assert len(flow.warnings()) == 1 and driver.state(0) == "reconnecting"

        await rig.until(lambda: len(flow.warnings()) >= 2)
        third = camera.connections[2]
        assert third.packets_sent == 40
        assert flow.warnings()[1] == flow.warnings()[0]
        assert len(flow.infos()) == 2 and all(
            m.startswith(f"RTSP input: connected to {display} (") for m in flow.infos()
        )
        assert driver.connections == 2 and driver.state(0) == "reconnecting"


async def test_a_camera_that_plays_but_never_sends_is_one_outage(
    autojump_clock: trio.testing.MockClock, media: Media
) -> None:
    """PLAY answered, then no RTP: no "connected" (nothing came), and every retry belongs to the
    same outage (one warning), not a connect/disconnect pair per attempt."""
    silent = [Behaviour(media_packets=0) for _ in range(3)]
    async with running(media, silent, timeout_secs=2, reconnect_delay_secs=3) as rig:
        camera, driver, flow = rig.camera, rig.driver, rig.flow
        # Playing without a packet is "connected", never "receiving" (CI: a test killed the
        # camera on "receiving" before the first RTP and waited for a disconnect that was none).
        await rig.until(lambda: camera.connections and camera.connections[0].play_answered_at is not None)
        assert driver.state(0) == "connected"
        await rig.until(lambda: len(camera.connections) >= 3 and camera.connections[2].closed_at is not None)
        assert all(c.play_answered_at is not None for c in camera.connections[:3])
        assert flow.warnings() == [
            f"RTSP input: connection to {camera.url} failed (no media for 2 s); retrying every 3 s"
        ]
        assert not flow.infos() and not flow.ts
        assert driver.connections == 3 and driver.state(0) == "reconnecting"


async def test_the_tail_flushed_at_a_session_end_ends_a_batch(
    autojump_clock: trio.testing.MockClock, media: Media
) -> None:
    """The muxer's tail (pending units, the last padded datagram) reaches the outputs at the
    session's end, not a reconnect later: ``end_batch`` follows it."""
    async with running(media, [Behaviour(media_packets=40)], timeout_secs=2, reconnect_delay_secs=30) as rig:
        flow = rig.flow
        await rig.until(lambda: flow.warnings())
        tail_start = len(flow.log)
        await rig.until(lambda: len(rig.camera.connections) >= 2)  # still nothing more by the reconnect
        assert len(flow.log) == tail_start
        assert flow.log[-1] == "end", flow.log[-8:]


async def test_play_answer_stalled_past_the_timeout(autojump_clock: trio.testing.MockClock, media: Media) -> None:
    async with running(media, [Behaviour(play_stall=math.inf)], timeout_secs=3, reconnect_delay_secs=5) as rig:
        camera, driver, flow = rig.camera, rig.driver, rig.flow
        await rig.until(lambda: len(camera.connections) >= 3 and camera.connections[2].closed_at is not None)
        first = camera.connections[0]
        assert near((first.closed_at or 0) - first.opened_at, 3.0)
        assert camera.methods(0) == ["OPTIONS", "DESCRIBE", "SETUP", "SETUP", "PLAY", "TEARDOWN"]  # SETUP made one
        assert flow.warnings() == [
            f"RTSP input: connection to {camera.url} failed (the camera did not start playing within 3 s); "
            "retrying every 5 s"
        ]
        assert not flow.infos() and not flow.ts
        assert driver.last_error == "the camera did not start playing within 3 s"
        assert driver.state(0) == "reconnecting" and driver.connections == 0


async def test_refused_credentials_never_leak(autojump_clock: trio.testing.MockClock, media: Media) -> None:
    camera_port_url = "rtsp://admin:urlSecret99@127.0.0.1:{port}/stream"
    camera = Camera(media.packets, media.description, [Behaviour(reject_auth=True)])
    async with trio.open_nursery() as nursery:
        await nursery.start(camera.serve)
        flow = FakeFlow(camera.signal)
        config = RtspInput(
            rtsp_url=camera_port_url.format(port=camera.port),
            username="operator",
            password="cfgSecret77",
            timeout_secs=5,
            reconnect_delay_secs=2,
        )
        driver = RtspInputDriver(config, flow)  # type: ignore[arg-type]
        driver.open()
        nursery.start_soon(driver.serve)
        await camera.signal.wait_for(lambda: len(camera.connections) >= 2 and camera.connections[1].closed_at)
        driver.close()
        nursery.cancel_scope.cancel()

    describes = [s for s in camera.requests if s.conn == 0 and s.method == "DESCRIBE"]
    assert [d.request.get("Authorization") for d in describes] == [
        None,
        "Basic " + base64.b64encode(b"operator:cfgSecret77").decode(),
    ]
    assert all("admin" not in s.request.url and "urlSecret99" not in s.request.url for s in camera.requests)
    assert driver.state(0) == "auth_failed"
    assert len(flow.warnings()) == 1 and "authentication failed" in flow.warnings()[0]
    assert driver.last_error is not None and "authentication failed" in driver.last_error
    counters = json.dumps(driver.extra_counters(), default=lambda o: o.model_dump(mode="json"))
    texts = [e.model_dump_json() for e in flow.events] + [driver.last_error, counters]
    for text in texts:
        for secret in ("cfgSecret77", "urlSecret99", "admin:"):
            assert secret not in text, text


async def test_media_counters_and_receiver_reports(autojump_clock: trio.testing.MockClock, media: Media) -> None:
    async with running(media, [Behaviour()], timeout_secs=30) as rig:
        camera, driver, flow = rig.camera, rig.driver, rig.flow
        await rig.until(lambda: camera.connections and camera.connections[0].packets_sent >= len(media.packets) // 2)
        assert driver.state(0) == "receiving"
        await rig.until(lambda: len(camera.connections[0].rtcp) >= 4)
        conn = camera.connections[0]
        play = conn.play_answered_at
        assert play is not None
        assert conn.packets_sent == len(media.packets)  # all sent by now (2 s of media)

        assert flow.ts and all(len(d) == DATAGRAM for d in flow.ts)
        assert flow.log[-1] == "end" and flow.log.count("end") > 10
        counters = driver.extra_counters()
        stats = counters["rtsp_stats"]
        assert stats.rtp_packets == conn.packets_sent and stats.rtp_lost == 0
        assert (stats.video_codec, stats.audio_codec, stats.connections, stats.transport) == ("h264", "aac", 1, "tcp")
        assert counters["peer_addr"] == f"127.0.0.1:{camera.port}" and counters["packets_lost"] == 0
        assert driver.state(0) == "connected"  # playing, no media for over 2 s

        for channel in (conn.channels[0] + 1, conn.channels[1] + 1):  # each track's RTCP channel
            reports = [(t, data) for t, ch, data in conn.rtcp if ch == channel]
            assert [round(t - play, 2) for t, _ in reports] == [RTCP_INTERVAL_S, 2 * RTCP_INTERVAL_S]
            assert all(data[0] >> 6 == 2 and data[1] == 201 for _, data in reports)  # RTCP RR (RFC 3550 §6.4.2)
        assert {ch for _, ch, _ in conn.rtcp} == {1, 3}


async def test_a_camera_request_mid_stream_is_answered(autojump_clock: trio.testing.MockClock, media: Media) -> None:
    async with running(media, [Behaviour(server_request_after=30)], timeout_secs=10) as rig:
        camera, driver, flow = rig.camera, rig.driver, rig.flow
        await rig.until(lambda: camera.connections and camera.connections[0].answers)
        conn = camera.connections[0]
        answered_at, answer = conn.answers[0]
        assert answer.status == 200 and answer.get("CSeq") == "100"
        assert near(answered_at, conn.last_packet_at or 0)
        delivered = len(flow.ts)
        await rig.until(lambda: conn.packets_sent == len(media.packets))
        await rig.until(lambda: len(flow.ts) > delivered + 20)
        assert driver.connections == 1 and not flow.warnings() and len(camera.connections) == 1
        dialogue = [m for m in camera.methods() if m != "GET_PARAMETER"]  # keep-alives aside
        assert dialogue == ["OPTIONS", "DESCRIBE", "SETUP", "SETUP", "PLAY"]
        assert driver.state(0) == "receiving"
