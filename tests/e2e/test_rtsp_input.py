"""``rtsp`` input through a real mp-edge, pulling from a real gst-rtsp-server (interop 2.3, 11).

The camera is Debian's gst-rtsp-server (``tests/helpers/gst_rtsp_server.py`` under Debian's
python3-gi): live H.264 or H.265 with AAC (RFC 3640 or RFC 6416 packing), over TCP interleaved
or UDP, with Basic or Digest auth. The flow's media analysis is compared with what ffprobe
reads from the same URL, and the flow's UDP output is decoded by ffmpeg.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.edge.core.mux import TsDemuxer
from tests.helpers.certs import self_signed
from tests.helpers.edge import Edge, free_udp_port, running_edge, wait_for
from tests.helpers.edge import create_flow as create
from tests.helpers.edge import edge_events as events
from tests.helpers.edge import flow_stats as stats
from tests.helpers.media import UdpSink, ts_decode_errors
from tests.helpers.rtsp_server import GstRtspServer, need_gst_rtsp
from tests.helpers.tools import need_tool

pytestmark = [pytest.mark.e2e, pytest.mark.interop]
USER, PASSWORD = "operator", "cam-Secret-42"
_CODEC_NAMES = {"h264": {"h264", "h.264", "avc"}, "hevc": {"hevc", "h265", "h.265"}}


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    need_gst_rtsp()
    with running_edge(tmp_path) as edge:
        yield edge


def rtsp_flow(flow_id: str, url: str, out: int, **input_fields: Any) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": flow_id,
        "input": {"type": "rtsp", "rtsp_url": url, **input_fields},
        "outputs": [{"type": "udp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }


def ffprobe_streams(url: str, transport: str) -> dict[str, dict[str, Any]]:
    """What ffprobe reads from the camera: the first video and audio stream, by codec_type."""
    run = subprocess.run(
        [need_tool("ffprobe"), "-v", "error", "-rtsp_transport", transport, "-show_streams", "-of", "json", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    found: dict[str, dict[str, Any]] = {}
    for stream in json.loads(run.stdout)["streams"]:
        found.setdefault(stream["codec_type"], stream)
    return found


def decode_errors(ts: bytes, tmp_path: Path) -> str:
    demux = TsDemuxer()
    demux.feed(ts)
    assert demux.stats.cc_errors == 0, demux.stats  # the capture itself lost nothing
    return ts_decode_errors(ts, tmp_path)


def up_to_last_pat(ts: bytes) -> bytes:
    """The capture cut before its last PAT: the muxer writes its tables between whole access
    units, so everything before one is whole (the capture's tail, cut by the test, is not)."""
    for offset in range(len(ts) - 188, -1, -188):
        if ts[offset + 1] & 0x1F == 0 and ts[offset + 2] == 0:
            return ts[:offset]
    return ts


def analysed(edge: Edge, flow_id: str) -> dict[str, Any]:
    """The flow's media analysis once it names both a video and an audio stream."""
    result: dict[str, Any] = wait_for(
        lambda: (
            (m := (stats(edge, flow_id).get("media_analysis") or {}))
            and (m.get("audio_streams") or [{}])[0].get("sample_rate_hz")
            and (m.get("video_streams") or [{}])[0].get("frame_rate")
            and m
        ),
        timeout=20,
    )
    return result


@pytest.mark.parametrize(
    ("video", "audio", "transport", "auth"),
    [
        ("h264", "aac-hbr", "tcp", "basic"),
        ("h264", "aac-latm", "udp", "digest"),
        ("h265", "aac-hbr", "udp", "basic"),
        ("h265", "aac-latm", "tcp", "digest"),
    ],
)
def test_camera_stream_is_analysed_like_ffprobe_sees_it(
    edge: Edge, tmp_path: Path, video: str, audio: str, transport: str, auth: str
) -> None:
    out = free_udp_port()
    with GstRtspServer(video=video, audio=audio, auth=auth, user=USER, password=PASSWORD) as camera:
        probe = ffprobe_streams(camera.url_with_credentials, transport)
        flow = rtsp_flow("cam", camera.url, out, username=USER, password=PASSWORD, transport=transport)
        with UdpSink(out) as sink:
            create(edge, flow)
            wait_for(lambda: stats(edge, "cam")["input"]["state"] == "receiving", timeout=20)
            media = analysed(edge, "cam")
            wait_for(lambda: len(sink.datagrams) > 300, timeout=20)
            # A VBR TS has no byte clock for PCR accuracy: no priority-2 warning for ever.
            wait_for(lambda: stats(edge, "cam")["health"] == "Healthy", timeout=20)
            inp = stats(edge, "cam")["input"]
    v, a = media["video_streams"][0], media["audio_streams"][0]
    pv, pa = probe["video"], probe["audio"]
    assert v["codec"].lower() in _CODEC_NAMES[pv["codec_name"]], (v, pv["codec_name"])
    assert v["resolution"] == f"{pv['width']}x{pv['height']}", (v, pv)
    num, den = (int(x) for x in pv["r_frame_rate"].split("/"))
    assert abs(v["frame_rate"] - num / den) < 0.5, (v, pv["r_frame_rate"])
    assert a["codec"].lower() == pa["codec_name"] == "aac", (a, pa)
    assert a["sample_rate_hz"] == int(pa["sample_rate"]) and a["channels"] == pa["channels"], (a, pa)
    rtsp = inp["rtsp_stats"]
    assert rtsp["transport"] == transport and rtsp["connections"] == 1 and rtsp["rtp_packets"] > 100, rtsp
    assert inp["peer_addr"] == f"127.0.0.1:{camera.port}"
    datagrams = sink.datagrams
    assert all(len(d) == 1316 for d in datagrams[:-1])
    assert decode_errors(up_to_last_pat(b"".join(datagrams)), tmp_path) == ""
    connected = [e for e in events(edge) if e["category"] == "rtsp" and e["severity"] == "info"]
    assert connected and "connected to rtsp://127.0.0.1" in connected[0]["message"], connected
    texts = json.dumps(events(edge)) + json.dumps(inp)
    assert PASSWORD not in texts


def test_camera_killed_and_restarted_is_reconnected(edge: Edge, tmp_path: Path) -> None:
    out = free_udp_port()
    with GstRtspServer(video="h264", audio="aac-hbr") as camera, UdpSink(out) as sink:
        create(edge, rtsp_flow("cam", camera.url, out, timeout_secs=3, reconnect_delay_secs=1))
        wait_for(lambda: stats(edge, "cam")["input"]["state"] == "receiving", timeout=20)
        camera.kill()  # the camera dies mid-stream: no TEARDOWN, no FIN from a clean close
        wait_for(lambda: stats(edge, "cam")["input"]["state"] == "reconnecting", timeout=15)
        # The disconnect's own warning: a first attempt the camera closed before PLAY (seen once on
        # a loaded CI host) is a "connection … failed" warning of its own, earlier in the list.
        warned = wait_for(
            lambda: [
                e
                for e in events(edge)
                if e["category"] == "rtsp" and e["severity"] == "warning" and "disconnected" in e["message"]
            ],
            timeout=10,
        )
        assert len(warned) == 1 and warned[0]["flow_id"] == "cam", warned
        before = len(sink.datagrams)
        camera.restart()  # same port: the input finds it again on its own
        wait_for(lambda: stats(edge, "cam")["input"]["state"] == "receiving", timeout=20)
        wait_for(lambda: len(sink.datagrams) > before + 300, timeout=20)
        inp = stats(edge, "cam")["input"]
        # One transport stream across both sessions: the muxer lives on, so no CC error at the seam.
        tr = stats(edge, "cam")["tr101290"]
    assert inp["rtsp_stats"]["connections"] == 2, inp
    connected = [e for e in events(edge) if e["category"] == "rtsp" and e["severity"] == "info"]
    assert len(connected) == 2, connected
    assert tr["cc_errors"] == 0, tr
    assert decode_errors(up_to_last_pat(b"".join(sink.datagrams)), tmp_path) == ""


def test_wrong_credentials_are_an_event_and_a_clear_state(edge: Edge) -> None:
    out = free_udp_port()
    with GstRtspServer(video="h264", audio="aac-hbr", auth="digest", user=USER, password=PASSWORD) as camera:
        create(edge, rtsp_flow("cam", camera.url, out, username=USER, password="not-the-password"))
        wait_for(lambda: stats(edge, "cam")["input"]["state"] == "auth_failed", timeout=20)
        warned = wait_for(
            lambda: [e for e in events(edge) if e["category"] == "rtsp" and e["severity"] == "warning"], timeout=10
        )
        inp = stats(edge, "cam")["input"]
    assert "authentication failed" in warned[0]["message"], warned
    assert "authentication failed" in (inp["rtsp_stats"]["last_error"] or ""), inp
    assert "not-the-password" not in json.dumps(events(edge)) + json.dumps(inp)
    # the flow itself runs (the camera may be fixed without touching it)
    assert stats(edge, "cam")["state"] == "Running"


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_rtsps_camera_with_a_certificate_the_edge_trusts(tmp_path: Path) -> None:
    """RTSP over TLS (``rtsps://``): gst-rtsp-server with a certificate for 127.0.0.1 that the
    edge trusts through ``SSL_CERT_FILE`` (the config has no switch to skip the check); an edge
    that does not trust it reports the TLS failure and never plays."""
    need_gst_rtsp()
    cert, key = self_signed(tmp_path, ip="127.0.0.1")
    out = free_udp_port()
    with GstRtspServer(video="h264", audio="aac-hbr", tls=(cert, key)) as camera:
        assert camera.url.startswith("rtsps://")
        with (
            running_edge(mkdir(tmp_path / "trusting"), extra_env={"SSL_CERT_FILE": str(cert)}) as edge,
            UdpSink(out) as sink,
        ):
            create(edge, rtsp_flow("cam", camera.url, out))
            wait_for(lambda: stats(edge, "cam")["input"]["state"] == "receiving", timeout=20)
            media = analysed(edge, "cam")
            wait_for(lambda: len(sink.datagrams) > 200, timeout=20)
        assert media["video_streams"][0]["resolution"] == "320x240"
        assert decode_errors(up_to_last_pat(b"".join(sink.datagrams)), tmp_path) == ""
        with running_edge(mkdir(tmp_path / "doubting")) as edge:
            create(edge, rtsp_flow("cam", camera.url, out))
            warned = wait_for(
                lambda: [e for e in events(edge) if e["category"] == "rtsp" and e["severity"] == "warning"], timeout=20
            )
            assert "TLS handshake failed" in warned[0]["message"], warned
            assert stats(edge, "cam")["input"]["state"] == "reconnecting"
