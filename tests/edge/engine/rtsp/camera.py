"""A scripted RTSP camera for the ``rtsp`` driver's tests: a trio TCP server on 127.0.0.1.

It answers OPTIONS, DESCRIBE, SETUP, PLAY, GET_PARAMETER and TEARDOWN as each connection's
:class:`Behaviour` says (session timeout, ``Public``, a Basic challenge, a stalled PLAY answer,
media that stops after N packets with the connection left open, a request of its own
mid-stream), records every request, ``$`` frame and answer it gets with ``trio.current_time()``,
and streams real RTP (``tests/edge/core/depay/rtpgen``: H.264 + AAC-hbr) over the interleaved
channels, paced by the packets' arrival times (so by the MockClock in the tests).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from services.edge.core.rtsp.message import (
    InterleavedFrame,
    RtspReader,
    RtspRequest,
    RtspResponse,
    build_request,
    build_response,
)
from tests.edge.core.depay.rtpgen import AUDIO_PT, VIDEO_PT, Packet, Stream

SESSION_ID = "1234"
FULL_PUBLIC = "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN, GET_PARAMETER"
NO_GET_PARAMETER = "OPTIONS, DESCRIBE, SETUP, PLAY, PAUSE, TEARDOWN"


@dataclass
class Behaviour:
    """How the camera behaves on one connection."""

    session_timeout: int | None = 4  # ``Session: 1234;timeout=N`` (None: no timeout parameter)
    public: str = FULL_PUBLIC  # the OPTIONS answer's Public
    credentials: tuple[str, str] | None = None  # Basic; ``reject_auth`` refuses even these
    reject_auth: bool = False  # 401 to every DESCRIBE, with or without Authorization
    play_stall: float = 0.0  # seconds before the PLAY answer (inf: never)
    media_packets: int | None = None  # stop sending after this many RTP packets (None: all)
    server_request_after: int | None = None  # send our own OPTIONS after this many packets


@dataclass
class Seen:
    """A request the camera got."""

    conn: int
    time: float
    request: RtspRequest

    @property
    def method(self) -> str:
        return self.request.method


@dataclass
class Connection:
    """One accepted TCP connection."""

    index: int
    opened_at: float
    behaviour: Behaviour
    closed_at: float | None = None  # when the driver's side closed (EOF seen)
    play_answered_at: float | None = None
    packets_sent: int = 0
    last_packet_at: float | None = None
    channels: dict[int, int] = field(default_factory=dict)  # track index -> RTP channel
    rtcp: list[tuple[float, int, bytes]] = field(default_factory=list)  # (time, channel, data)
    answers: list[tuple[float, RtspResponse]] = field(default_factory=list)  # to our own requests


class Signal:
    """Wakes every waiter when something was recorded (an awaited condition, no polling)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def changed(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait_for(self, predicate: Callable[[], object], timeout: float = 120.0) -> None:
        """Until ``predicate()`` holds; ``timeout`` is MockClock time."""
        with trio.fail_after(timeout):
            while not predicate():
                await self._event.wait()


def sdp(stream: Stream) -> str:
    """The SDP of the two tracks of ``stream`` (``trackID=0`` video, ``trackID=1`` audio)."""
    video, audio = stream.tracks()
    lines = ["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=scripted camera", "t=0 0", "a=control:*"]
    for spec, pt, kind in ((video, VIDEO_PT, "video"), (audio, AUDIO_PT, "audio")):
        rtpmap = f"{spec.encoding}/{spec.clock_rate}" + (f"/{spec.channels}" if spec.channels else "")
        fmtp = ";".join(f"{k}={v}" for k, v in spec.fmtp.items())
        lines += [f"m={kind} 0 RTP/AVP {pt}", f"a=rtpmap:{pt} {rtpmap}", f"a=fmtp:{pt} {fmtp}"]
        lines.append(f"a=control:trackID={spec.index}")
    return "\r\n".join(lines) + "\r\n"


class Camera:
    """Serve with ``await nursery.start(camera.serve)``; ``camera.url`` is then the stream's URL.

    ``behaviours[i]`` is connection ``i``'s (the last one repeats for later connections).
    """

    def __init__(self, packets: list[Packet], description: str, behaviours: list[Behaviour]) -> None:
        self.packets = packets
        self.description = description
        self.behaviours = behaviours
        self.port = 0
        self.connections: list[Connection] = []
        self.requests: list[Seen] = []
        self.signal = Signal()

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}/stream"

    def methods(self, conn: int | None = None) -> list[str]:
        return [s.method for s in self.requests if conn is None or s.conn == conn]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        index = len(self.connections)
        behaviour = self.behaviours[min(index, len(self.behaviours) - 1)]
        conn = Connection(index, trio.current_time(), behaviour)
        self.connections.append(conn)
        self.signal.changed()
        session = _CameraSession(self, conn, stream)
        try:
            await session.run()
        finally:
            conn.closed_at = conn.closed_at if conn.closed_at is not None else trio.current_time()
            self.signal.changed()
            await trio.aclose_forcefully(stream)


class _CameraSession:
    def __init__(self, camera: Camera, conn: Connection, stream: trio.SocketStream) -> None:
        self.camera = camera
        self.conn = conn
        self.behaviour = conn.behaviour
        self.stream = stream
        self.lock = trio.Lock()
        self.reader = RtspReader()
        self.cseq = 100

    async def send(self, data: bytes) -> None:
        async with self.lock:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the driver went away; ``run`` sees the EOF

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    data = await self.stream.receive_some(65536)
                    if not data:
                        self.conn.closed_at = trio.current_time()
                        nursery.cancel_scope.cancel()
                        return
                    for message in self.reader.feed(data):
                        now = trio.current_time()
                        if isinstance(message, InterleavedFrame):
                            self.conn.rtcp.append((now, message.channel, message.data))
                        elif isinstance(message, RtspResponse):
                            self.conn.answers.append((now, message))
                        else:
                            self.camera.requests.append(Seen(self.conn.index, now, message))
                            nursery.start_soon(self.answer, message, nursery)
                        self.camera.signal.changed()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def answer(self, request: RtspRequest, nursery: trio.Nursery) -> None:
        b = self.behaviour
        headers = [("CSeq", request.get("CSeq") or "0")]
        session = SESSION_ID + (f";timeout={b.session_timeout}" if b.session_timeout is not None else "")
        body = b""
        status, reason = 200, "OK"
        method = request.method
        if method == "OPTIONS":
            headers.append(("Public", b.public))
        elif method == "DESCRIBE":
            if not self._authorised(request):
                status, reason = 401, "Unauthorized"
                headers.append(("WWW-Authenticate", 'Basic realm="scripted camera"'))
            else:
                headers += [("Content-Base", self.camera.url + "/"), ("Content-Type", "application/sdp")]
                body = self.camera.description.encode()
        elif method == "SETUP":
            track = int(request.url.rpartition("trackID=")[2])
            transport = request.get("Transport") or ""
            channels = transport.partition("interleaved=")[2].split(";")[0]
            self.conn.channels[track] = int(channels.split("-")[0])
            headers += [("Transport", f"RTP/AVP/TCP;unicast;interleaved={channels}"), ("Session", session)]
        elif method == "PLAY":
            await trio.sleep(b.play_stall)
            headers += [("Session", session), ("Range", "npt=0.000-")]
        elif method in ("GET_PARAMETER", "TEARDOWN"):
            headers.append(("Session", SESSION_ID))
        else:
            status, reason = 501, "Not Implemented"
        await self.send(build_response(status, reason, headers, body))
        if method == "PLAY":
            self.conn.play_answered_at = trio.current_time()
            self.camera.signal.changed()
            nursery.start_soon(self.media)

    def _authorised(self, request: RtspRequest) -> bool:
        b = self.behaviour
        if b.reject_auth:
            return False
        if b.credentials is None:
            return True
        expected = "Basic " + base64.b64encode(":".join(b.credentials).encode()).decode()
        return request.get("Authorization") == expected

    async def media(self) -> None:
        b = self.behaviour
        packets = self.camera.packets if b.media_packets is None else self.camera.packets[: b.media_packets]
        start = trio.current_time()
        for count, packet in enumerate(packets, 1):
            await trio.sleep_until(start + packet.arrival)
            channel = self.conn.channels[packet.track]
            await self.send(b"$" + bytes((channel,)) + len(packet.data).to_bytes(2, "big") + packet.data)
            self.conn.packets_sent = count
            self.conn.last_packet_at = trio.current_time()
            self.camera.signal.changed()
            if count == b.server_request_after:
                await self.send(build_request("OPTIONS", self.camera.url, [("CSeq", str(self.cseq))]))
