"""``rtmp`` input through a real mp-edge, with Debian's ffmpeg as the publisher (interop 2.3)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.edge import Edge, free_port, free_udp_port, running_edge, wait_for
from tests.helpers.edge import create_flow as create
from tests.helpers.edge import edge_events as events
from tests.helpers.edge import flow_stats as stats
from tests.helpers.media import UdpSink
from tests.helpers.media import ts_decode_errors as decode_errors
from tests.helpers.tools import need_tool

pytestmark = [pytest.mark.e2e, pytest.mark.interop]
KEY = "s3cret-key"


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    with running_edge(tmp_path) as edge:
        yield edge


def rtmp_flow(flow_id: str, port: int, out: int, **input_fields: Any) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": flow_id,
        "input": {"type": "rtmp", "listen_addr": f"127.0.0.1:{port}", **input_fields},
        "outputs": [{"type": "udp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }


def publish(url: str, seconds: float = 4, *, tls: bool = False, log: Path | None = None) -> subprocess.Popen[bytes]:
    ffmpeg = need_tool("ffmpeg")
    args = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-re"]
    args += ["-f", "lavfi", "-i", "testsrc2=size=640x360:rate=25", "-f", "lavfi", "-i", "sine=frequency=1000"]
    args += ["-c:v", "libx264", "-preset", "veryfast", "-g", "25", "-c:a", "aac", "-t", str(seconds), "-f", "flv"]
    args += ["-tls_verify", "0"] if tls else []
    stderr = log.open("wb") if log is not None else subprocess.DEVNULL
    return subprocess.Popen([*args, url], stdout=subprocess.DEVNULL, stderr=stderr)


def check_publication(edge: Edge, tmp_path: Path, *, tls: bool) -> None:
    port, out = free_port(), free_udp_port()
    create(edge, rtmp_flow("rtmpin", port, out, stream_key=KEY, tls=tls))
    wait_for(lambda: stats(edge, "rtmpin")["input"]["state"] == "listening", timeout=15)
    scheme = "rtmps" if tls else "rtmp"
    with UdpSink(out) as sink:
        proc = publish(f"{scheme}://127.0.0.1:{port}/live/{KEY}", tls=tls, log=tmp_path / "ffmpeg.log")
        try:
            wait_for(lambda: stats(edge, "rtmpin")["input"]["state"] == "receiving", timeout=15)
            peer = wait_for(lambda: stats(edge, "rtmpin")["input"]["peer_addr"], timeout=10)
            assert peer.startswith("127.0.0.1:"), peer  # the publisher's address, in the REST stats
            media = wait_for(
                lambda: (
                    (m := (stats(edge, "rtmpin").get("media_analysis") or {})).get("audio_streams")
                    and m.get("video_streams")
                    and m
                ),
                timeout=15,
            )
            assert proc.wait(timeout=30) == 0, (tmp_path / "ffmpeg.log").read_text()
        finally:
            proc.kill()
        wait_for(lambda: stats(edge, "rtmpin")["input"]["state"] == "listening", timeout=15)
        assert stats(edge, "rtmpin")["input"]["peer_addr"] is None
    video, audio = media["video_streams"][0], media["audio_streams"][0]
    assert video["codec"].lower() in ("h264", "h.264", "avc"), video
    assert video["resolution"] == "640x360" and round(video["frame_rate"]) == 25, video
    assert audio["codec"].lower() == "aac", audio
    received = b"".join(sink.datagrams)
    assert len(received) > 100_000 and all(len(d) == 1316 for d in sink.datagrams[:-1])
    assert decode_errors(received, tmp_path) == ""
    connected = [e for e in events(edge) if e["category"] == "rtmp" and "connected" in e["message"]]
    assert connected and connected[0]["severity"] == "info" and "127.0.0.1" in connected[0]["message"]


def test_ffmpeg_publishes_h264_aac(edge: Edge, tmp_path: Path) -> None:
    check_publication(edge, tmp_path, tls=False)


def test_ffmpeg_publishes_over_rtmps(edge: Edge, tmp_path: Path) -> None:
    check_publication(edge, tmp_path, tls=True)


def test_wrong_key_is_rejected_with_a_warning(edge: Edge, tmp_path: Path) -> None:
    port, out = free_port(), free_udp_port()
    create(edge, rtmp_flow("keyed", port, out, stream_key=KEY))
    wait_for(lambda: stats(edge, "keyed")["input"]["state"] == "listening", timeout=15)
    proc = publish(f"rtmp://127.0.0.1:{port}/live/not-the-key", seconds=2)
    try:
        assert proc.wait(timeout=20) != 0
    finally:
        proc.kill()
    warned = wait_for(
        lambda: [e for e in events(edge) if e["category"] == "rtmp" and e["severity"] == "warning"], timeout=10
    )
    assert "wrong stream key" in warned[0]["message"] and warned[0].get("flow_id") == "keyed"
    assert stats(edge, "keyed")["input"]["state"] == "listening"


def test_a_publisher_over_max_publishers_is_rejected(edge: Edge, tmp_path: Path) -> None:
    port, out = free_port(), free_udp_port()
    create(edge, rtmp_flow("one", port, out))  # any key, max_publishers 1
    wait_for(lambda: stats(edge, "one")["input"]["state"] == "listening", timeout=15)
    first = publish(f"rtmp://127.0.0.1:{port}/live/a", seconds=8)
    try:
        wait_for(lambda: stats(edge, "one")["input"]["state"] == "receiving", timeout=15)
        second = publish(f"rtmp://127.0.0.1:{port}/live/b", seconds=2)
        try:
            assert second.wait(timeout=20) != 0  # refused at once, not left hanging
        finally:
            second.kill()
        assert first.poll() is None and stats(edge, "one")["input"]["state"] == "receiving"
        wait_for(lambda: any("max_publishers" in e["message"] for e in events(edge)), timeout=10)
    finally:
        first.kill()
        first.wait(timeout=10)


def test_two_flows_share_one_listener(tmp_path: Path) -> None:
    # Three workers: without the placement rule "fb" would go to an idle worker and fail to bind.
    with running_edge(tmp_path, extra_args=["--workers", "3"]) as edge:
        check_shared_listener(edge)


def check_shared_listener(edge: Edge) -> None:
    port, out_a, out_b = free_port(), free_udp_port(), free_udp_port()
    create(edge, rtmp_flow("fa", port, out_a, stream_key="key-a"))
    udp_in = {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"}
    create(edge, {"id": "u", "name": "u", "input": udp_in, "outputs": []})  # loads another worker
    create(edge, rtmp_flow("fb", port, out_b, stream_key="key-b"))
    for flow_id in ("fa", "fb"):
        wait_for(lambda f=flow_id: stats(edge, f)["input"]["state"] == "listening", timeout=15)
    with UdpSink(out_a) as sink_a, UdpSink(out_b) as sink_b:
        pa = publish(f"rtmp://127.0.0.1:{port}/live/key-a", seconds=3)
        pb = publish(f"rtmp://127.0.0.1:{port}/live/key-b", seconds=3)
        try:
            wait_for(lambda: all(stats(edge, f)["input"]["state"] == "receiving" for f in ("fa", "fb")), timeout=15)
            assert pa.wait(timeout=30) == 0 and pb.wait(timeout=30) == 0
        finally:
            pa.kill()
            pb.kill()
        wait_for(lambda: len(sink_a.datagrams) > 100 and len(sink_b.datagrams) > 100, timeout=10)
    # stopping one flow leaves the other's route on the shared listener
    with edge.client() as api:
        assert api.delete("/api/v1/flows/fa").status_code in (200, 204)
    wait_for(lambda: stats(edge, "fb")["input"]["state"] == "listening", timeout=15)
    pb = publish(f"rtmp://127.0.0.1:{port}/live/key-b", seconds=1)
    try:
        assert pb.wait(timeout=30) == 0
    finally:
        pb.kill()


def test_an_enhanced_rtmp_hevc_publisher_is_analysed_as_hevc(edge: Edge, tmp_path: Path) -> None:
    """Enhanced RTMP (FourCC ``hvc1``), from FFmpeg 8 through PyAV (Debian's 5.1 cannot publish it):
    the flow's analysis sees HEVC at the source's size and rate, and the TS decodes cleanly."""
    port, out = free_port(), free_udp_port()
    create(edge, rtmp_flow("hevc", port, out, stream_key=KEY))
    with UdpSink(out) as sink:
        publisher = subprocess.run(
            [
                *(sys.executable, "-m", "tests.helpers.av_publish", f"rtmp://127.0.0.1:{port}/live/{KEY}"),
                *("--codec", "hevc", "--seconds", "4", "--size", "320x240"),
            ],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert publisher.returncode == 0, publisher.stderr
        video = wait_for(
            lambda: ((stats(edge, "hevc").get("media_analysis") or {}).get("video_streams") or [None])[0],
            timeout=15,
        )
        audio = wait_for(lambda: (stats(edge, "hevc").get("media_analysis") or {}).get("audio_streams"), timeout=15)
    assert video["codec"].lower() in ("hevc", "h265", "h.265"), video
    assert video["resolution"] == "320x240" and round(video["frame_rate"]) == 25, video
    assert audio[0]["codec"].lower() == "aac", audio
    assert decode_errors(b"".join(sink.datagrams), tmp_path) == ""
