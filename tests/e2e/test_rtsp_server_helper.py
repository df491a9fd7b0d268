"""tests/helpers/rtsp_server.py against a real RTSP client: Debian's ffprobe (FFmpeg 5.1).

The RTSP input tests trust this server; these tests show it serves what it says: the codecs,
over the transport asked for, behind basic and digest auth, and again on the same port after a
SIGKILL.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tests.helpers.rtsp_server import GstRtspServer, RtspServerError, need_gst_rtsp
from tests.helpers.tools import need_tool

pytestmark = [pytest.mark.e2e, pytest.mark.interop]


def ffprobe(url: str, transport: Literal["tcp", "udp"]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_tool("ffprobe"), "-v", "error", "-rtsp_transport", transport, "-show_streams", "-of", "json", url],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def streams(url: str, transport: Literal["tcp", "udp"]) -> dict[str, dict[str, Any]]:
    """codec_type -> stream, from ffprobe; fails the test with ffprobe's stderr if it fails."""
    proc = ffprobe(url, transport)
    assert proc.returncode == 0, f"ffprobe {url} over {transport} failed: {proc.stderr}"
    found: dict[str, dict[str, Any]] = {}
    for s in json.loads(proc.stdout)["streams"]:
        found.setdefault(s["codec_type"], s)
    return found


def assert_av(found: dict[str, dict[str, Any]], video_codec: str) -> None:
    video, audio = found["video"], found["audio"]
    assert video["codec_name"] == video_codec
    assert (video["width"], video["height"]) == (320, 240)
    assert video["r_frame_rate"] == "25/1"
    assert audio["codec_name"] == "aac"
    assert (audio["sample_rate"], audio["channels"]) == ("48000", 2)


@pytest.fixture
def server_factory() -> Iterator[list[GstRtspServer]]:
    """Servers the test made; each is stopped even when the test fails."""
    made: list[GstRtspServer] = []
    yield made
    for s in made:
        s.stop()


def serve(made: list[GstRtspServer], **kwargs: Any) -> GstRtspServer:
    need_gst_rtsp(kwargs.get("video", "h264"), kwargs.get("audio", "aac-hbr"))
    server = GstRtspServer(**kwargs)
    made.append(server)
    return server.start()


def test_h264_aac_hbr_over_tcp(server_factory: list[GstRtspServer]) -> None:
    cam = serve(server_factory, video="h264", audio="aac-hbr", protocols="tcp")
    assert cam.url == f"rtsp://127.0.0.1:{cam.port}/cam"
    assert_av(streams(cam.url, "tcp"), "h264")
    # tcp only: an RTP/UDP SETUP is refused (461 Unsupported transport)
    refused = ffprobe(cam.url, "udp")
    assert refused.returncode != 0
    assert "461" in refused.stderr


def test_h265_aac_latm_over_udp(server_factory: list[GstRtspServer]) -> None:
    cam = serve(server_factory, video="h265", audio="aac-latm", protocols="udp")
    assert_av(streams(cam.url, "udp"), "hevc")


@pytest.mark.parametrize("auth", ["basic", "digest"])
def test_auth(server_factory: list[GstRtspServer], auth: Literal["basic", "digest"]) -> None:
    cam = serve(server_factory, auth=auth, user="cam", password="s3cr:t@/x", protocols="tcp")
    assert "s3cr%3At%40%2Fx@" in cam.url_with_credentials
    assert_av(streams(cam.url_with_credentials, "tcp"), "h264")
    for url in (cam.url, cam.url_with_credentials.replace("s3cr%3At", "wrong")):
        denied = ffprobe(url, "tcp")
        assert denied.returncode != 0
        assert "401" in denied.stderr, denied.stderr


def test_kill_mid_stream_and_restart_on_the_same_port(server_factory: list[GstRtspServer]) -> None:
    cam = serve(server_factory, protocols="tcp")
    port = cam.port
    # a client is playing when the server dies: its TCP connection is reset, and the port
    # (with that connection in TIME_WAIT) must still be free for the restart
    player = subprocess.Popen(
        [need_tool("ffmpeg"), "-nostdin", "-v", "error", "-rtsp_transport", "tcp", "-i", cam.url, "-f", "null", "-"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert streams(cam.url, "tcp")["video"]["codec_name"] == "h264"  # both are connected now
        assert player.poll() is None
        assert cam.kill() == -9
        _, player_err = player.communicate(timeout=15)  # ffmpeg notices the dead server and exits
    finally:
        if player.poll() is None:
            player.kill()
            player.wait()
    assert ffprobe(cam.url, "tcp").returncode != 0  # nothing listens
    cam.restart()
    assert cam.port == port
    assert streams(cam.url, "tcp")["video"]["codec_name"] == "h264", player_err
    assert cam.stop() == 0  # SIGTERM: the GLib loop quits, exit 0


def test_a_bad_argument_reports_stderr() -> None:
    need_gst_rtsp()
    with pytest.raises(RtspServerError, match="unknown protocol"):
        GstRtspServer(protocols="sctp").start()


def test_a_busy_port_reports_stderr(server_factory: list[GstRtspServer]) -> None:
    cam = serve(server_factory, audio="none")
    with pytest.raises(RtspServerError, match="cannot listen"):
        GstRtspServer(port=cam.port, audio="none").start()
