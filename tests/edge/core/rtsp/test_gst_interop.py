"""A real peer: RtspClient against Debian's gst-rtsp-server (tests/helpers/rtsp_server.py), over
TCP interleaved and UDP, without auth and with Basic and Digest. Plain blocking sockets on
127.0.0.1; every wait is a socket timeout and every loop is bounded by a deadline."""

from __future__ import annotations

import secrets
import socket
import time
from dataclasses import dataclass, field

import pytest

from services.edge.core.rtsp import (
    Described,
    Failed,
    InterleavedData,
    KeepaliveAnswered,
    Playing,
    RtspClient,
    RtspEvent,
    TrackReady,
)
from tests.helpers.rtsp_server import Audio, Auth, GstRtspServer, Video, need_gst_rtsp

pytestmark = pytest.mark.interop

PASSWORD = "pw-Secret-1"
DEADLINE_S = 10.0


@dataclass
class Run:
    events: list[RtspEvent] = field(default_factory=list)
    udp_rtp: list[bytes] = field(default_factory=list)

    def of(self, kind: type[RtspEvent]) -> list[RtspEvent]:
        return [e for e in self.events if isinstance(e, kind)]


def session(client: RtspClient, port: int, transport: str, *, rtp_wanted: int = 50) -> Run:
    """Drive ``client`` over one TCP connection until PLAY, a keepalive answer and some RTP."""
    run = Run()
    udp: list[socket.socket] = []
    deadline = time.monotonic() + DEADLINE_S
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        try:
            client.start()
            sock.sendall(client.data_to_send())
            while time.monotonic() < deadline:
                data = sock.recv(65536)
                if not data:
                    break
                for event in client.receive_data(data):
                    run.events.append(event)
                    if isinstance(event, Described):
                        ports = None
                        if transport == "udp":
                            ports = []
                            for _ in event.tracks:
                                rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                                rtp.bind(("127.0.0.1", 0))
                                rtp.settimeout(DEADLINE_S)
                                udp.append(rtp)
                                ports.append((rtp.getsockname()[1], rtp.getsockname()[1] + 1))
                        client.setup(event.tracks, ports)
                    elif isinstance(event, Playing):
                        client.keepalive()
                sock.sendall(client.data_to_send())
                if run.of(Failed):
                    break
                if run.of(KeepaliveAnswered) and (transport == "udp" or len(run.of(InterleavedData)) >= rtp_wanted):
                    break
            if transport == "udp" and run.of(Playing):
                while len(run.udp_rtp) < 5 and time.monotonic() < deadline:
                    datagram = udp[0].recv(65536)
                    if len(datagram) >= 12 and datagram[0] >> 6 == 2:  # RTP version 2 (RFC 3550 §5.1)
                        run.udp_rtp.append(datagram)
            client.teardown()
            sock.sendall(client.data_to_send())
        finally:
            for s in udp:
                s.close()
    return run


@pytest.mark.parametrize("transport", ["tcp", "udp"])
@pytest.mark.parametrize("auth", ["none", "basic", "digest"])
def test_plays_from_gst_rtsp_server(auth: Auth, transport: str) -> None:
    need_gst_rtsp()
    with GstRtspServer(auth=auth, user="user", password=PASSWORD) as camera:
        client = RtspClient(camera.url_with_credentials, transport=transport, cnonce=lambda: secrets.token_hex(8))  # type: ignore[arg-type]
        run = session(client, camera.port, transport)
    assert not run.of(Failed), run.of(Failed)
    (described,) = run.of(Described)
    assert isinstance(described, Described)
    assert [(t.media, t.encoding, t.clock_rate) for t in described.tracks] == [
        ("video", "H264", 90000),
        ("audio", "MPEG4-GENERIC", 48000),
    ]
    ready = run.of(TrackReady)
    assert len(ready) == 2
    (playing,) = run.of(Playing)
    assert isinstance(playing, Playing)
    assert set(playing.rtp_info) == {t.control_url for t in described.tracks}
    if transport == "tcp":
        assert [r.interleaved for r in ready if isinstance(r, TrackReady)] == [(0, 1), (2, 3)]
        rtp = [e for e in run.of(InterleavedData) if isinstance(e, InterleavedData) and e.channel in (0, 2)]
        assert len(rtp) >= 20 and all(e.data[0] >> 6 == 2 for e in rtp)
    else:
        assert all(isinstance(r, TrackReady) and r.server_ports for r in ready)
        assert len(run.udp_rtp) == 5
    assert client.display_url == camera.url


@pytest.mark.parametrize(("video", "audio", "encodings"), [("h265", "aac-latm", ["H265", "MP4A-LATM"])])
def test_h265_and_latm(video: Video, audio: Audio, encodings: list[str]) -> None:
    need_gst_rtsp(video, audio)
    with GstRtspServer(video=video, audio=audio) as camera:
        client = RtspClient(camera.url, cnonce=lambda: "c")
        run = session(client, camera.port, "tcp")
    (described,) = run.of(Described)
    assert isinstance(described, Described) and [t.encoding for t in described.tracks] == encodings
    assert run.of(Playing)


@pytest.mark.parametrize("auth", ["basic", "digest"])
@pytest.mark.parametrize("credentials", ["wrong", "missing"])
def test_refused_credentials(auth: Auth, credentials: str) -> None:
    need_gst_rtsp()
    with GstRtspServer(auth=auth, user="user", password=PASSWORD) as camera:
        password = "not-the-" + PASSWORD if credentials == "wrong" else None
        user = "user" if credentials == "wrong" else None
        client = RtspClient(camera.url, username=user, password=password, cnonce=lambda: "c")
        run = session(client, camera.port, "tcp")
    (failed,) = run.of(Failed)
    assert isinstance(failed, Failed) and failed.auth and failed.status == 401
    assert ("authentication failed" if credentials == "wrong" else "no credentials") in failed.reason
    assert PASSWORD not in failed.reason
