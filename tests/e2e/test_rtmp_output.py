"""The ``rtmp`` output through a real mp-edge: a udp input fed an ffmpeg-made MPEG-TS, pushed to
Debian's FFmpeg as an RTMP listener (``-listen 1``), which records FLV; RTMPS through stunnel4
in front of it. Every subprocess is bounded by a timeout; every wait is on a condition."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.edge.core.mux.codec import join_annexb, length_prefixed_to_annexb, parse_hvcc
from services.edge.core.rtmp import (
    AudioData,
    PacketKind,
    PublishRequested,
    RtmpServerConnection,
    VideoCodec,
    VideoData,
)
from services.edge.engine.kinds.rtmp_output import parse_target
from tests.helpers.certs import self_signed
from tests.helpers.edge import Edge, free_port, free_udp_port, running_edge, wait_for
from tests.helpers.media import UdpSink, send_datagrams

pytestmark = [pytest.mark.e2e, pytest.mark.interop]

FFMPEG = shutil.which("ffmpeg") or "/usr/bin/ffmpeg"
FFPROBE = shutil.which("ffprobe") or "/usr/bin/ffprobe"
STUNNEL = shutil.which("stunnel4") or shutil.which("stunnel")
KEY = "s3cret-stream-key-42"
# FFmpeg's listener reports the TCP close that ends a push as an I/O error (docs/rtmp-protocol.md).
ALLOWED_LISTENER_LINES = ("Input/output error", "Error during demuxing", "Error retrieving a packet")


@pytest.fixture(autouse=True)
def need_ffmpeg() -> None:
    if shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None:
        if os.environ.get("CI"):
            pytest.fail("ffmpeg is missing in CI (tools/ensure-debs.sh installs it)")
        pytest.skip("ffmpeg not installed")


def make_ts(
    path: Path,
    seconds: int,
    *,
    video: list[str] | None = None,
    rate: str | None = "1500k",
    source: str = "testsrc2=size=640x360:rate=25",
) -> Path:
    """A CBR (``-muxrate``) H.264/AAC MPEG-TS, so a constant datagram rate paces it in real time."""
    video = video or ["-c:v", "libx264", "-b:v", "1000k", "-maxrate", "1000k", "-bufsize", "500k"]
    cmd = [FFMPEG, "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", source]
    cmd += ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", *video, "-g", "25", "-bf", "2"]
    cmd += ["-c:a", "aac", "-b:a", "128k", "-t", str(seconds), *(["-muxrate", rate] if rate else [])]
    cmd += ["-f", "mpegts", str(path)]
    subprocess.run(cmd, check=True, timeout=180, capture_output=True)
    return path


def ts_datagrams(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[i : i + 1316] for i in range(0, len(data), 1316)]


def media_duration(path: Path) -> float:
    done = subprocess.run(
        [FFPROBE, "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return float(done.stdout)


def decode_errors(path: Path) -> str:
    done = subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-i", str(path), "-f", "null", "-"], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.decode()


def tcp_listening(port: int) -> bool:
    """Whether a socket listens on TCP ``port`` (from /proc: connecting would take FFmpeg's one client)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[1].endswith(want) and fields[3] == "0A":  # local address, state LISTEN
                return True
    return False


class Listener:
    """``ffmpeg -listen 1`` recording an RTMP push to FLV."""

    def __init__(self, port: int, out: Path, log: Path) -> None:
        self.out, self.log = out, log
        cmd = [
            FFMPEG,
            "-nostdin",
            "-v",
            "error",
            "-listen",
            "1",
            "-f",
            "flv",
            "-i",
            f"rtmp://127.0.0.1:{port}/live/{KEY}",
        ]
        cmd += ["-c", "copy", "-y", str(out)]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
        wait_for(lambda: tcp_listening(port) or self.process.poll() is not None, timeout=20)
        assert self.process.poll() is None, log.read_text()

    def wait(self, timeout: float = 30) -> str:
        self.process.wait(timeout=timeout)
        return self.log.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def unexpected(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line and not any(a in line for a in ALLOWED_LISTENER_LINES)]


class Sender(threading.Thread):
    """Sends the TS datagrams paced at the stream's rate (CBR), in a thread."""

    def __init__(self, port: int, datagrams: list[bytes], seconds: float) -> None:
        super().__init__(daemon=True)
        self.port, self.datagrams, self.pps = port, datagrams, len(datagrams) / seconds
        self.sent = 0
        self.started_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        self.sent = send_datagrams(("127.0.0.1", self.port), self.datagrams, pps=self.pps)


def flow(udp_port: int, dest_url: str, **output: Any) -> dict[str, Any]:
    return {
        "id": "push",
        "name": "RTMP push",
        "input": {"type": "udp", "bind_addr": f"127.0.0.1:{udp_port}"},
        "outputs": [{"type": "rtmp", "id": "yt", "name": "YouTube", "dest_url": dest_url, "stream_key": KEY, **output}],
    }


def output_state(edge: Edge) -> dict[str, Any] | None:
    with edge.client() as api:
        data = api.get("/api/v1/stats/push").json().get("data") or {}
    outputs = data.get("outputs") or []
    return outputs[0] if outputs and "state" in outputs[0] else None  # None before the worker's first report


def rtmp_events(edge: Edge) -> list[dict[str, Any]]:
    with edge.client() as api:
        events: list[dict[str, Any]] = api.get("/api/v1/events").json()["data"]["events"]
    return [e for e in events if e["category"] == "rtmp"]


def delete_flow(edge: Edge) -> None:
    with edge.client() as api:
        assert api.delete("/api/v1/flows/push").status_code == 200


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    with running_edge(tmp_path) as started:
        yield started


def check_recording(path: Path, sent_seconds: float, tolerance: float = 0.5) -> float:
    assert path.exists() and path.stat().st_size > 0
    assert decode_errors(path) == ""
    got = media_duration(path)
    assert abs(got - sent_seconds) <= tolerance, (got, sent_seconds)
    return got


def test_push_to_ffmpeg_records_a_clean_flv(edge: Edge, tmp_path: Path) -> None:
    seconds = 6
    source = make_ts(tmp_path / "in.ts", seconds)
    sent_duration = media_duration(source)
    udp, rtmp = free_udp_port(), free_port()
    listener = Listener(rtmp, tmp_path / "out.flv", tmp_path / "listener.log")
    try:
        with edge.client() as api:
            r = api.post("/api/v1/flows", json=flow(udp, f"rtmp://127.0.0.1:{rtmp}/live"))
            assert r.status_code == 200, r.text
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=20)
        sender = Sender(udp, ts_datagrams(source), seconds)
        sender.start()
        sender.join(timeout=seconds + 30)
        assert not sender.is_alive()
        counters = wait_for(lambda: (o := output_state(edge)) and o["packets_sent"] >= sender.sent and o, timeout=10)
        assert counters["packets_dropped"] == 0
        delete_flow(edge)
        stderr = listener.wait(timeout=30)
    finally:
        listener.kill()
    assert listener.process.returncode == 0, stderr
    assert unexpected(stderr) == []
    check_recording(tmp_path / "out.flv", sent_duration)
    events = rtmp_events(edge)
    assert events and events[0]["severity"] == "info" and "connected" in events[0]["message"]
    assert all(KEY not in e["message"] and KEY not in str(e["details"]) for e in events)
    assert KEY not in edge.log()


def test_listener_killed_mid_stream_then_the_push_resumes(edge: Edge, tmp_path: Path) -> None:
    seconds = 16
    source = make_ts(tmp_path / "in.ts", seconds)
    udp, rtmp = free_udp_port(), free_port()
    first = Listener(rtmp, tmp_path / "first.flv", tmp_path / "first.log")
    second: Listener | None = None
    try:
        with edge.client() as api:
            body = flow(udp, f"rtmp://127.0.0.1:{rtmp}/live", reconnect_delay_secs=1)
            assert api.post("/api/v1/flows", json=body).status_code == 200
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=20)
        sender = Sender(udp, ts_datagrams(source), seconds)
        sender.start()
        wait_for(lambda: (tmp_path / "first.flv").exists() and (tmp_path / "first.flv").stat().st_size > 300_000)
        first.kill()
        wait_for(lambda: (o := output_state(edge)) and o["state"] != "connected", timeout=10)
        second = Listener(rtmp, tmp_path / "second.flv", tmp_path / "second.log")
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=15)
        resumed_at = time.monotonic()
        sender.join(timeout=seconds + 30)
        assert not sender.is_alive()
        remaining = sender.started_at + seconds - resumed_at
        delete_flow(edge)
        stderr = second.wait(timeout=30)
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert second.process.returncode == 0, stderr
    assert unexpected(stderr) == []
    assert decode_errors(tmp_path / "second.flv") == ""
    got = media_duration(tmp_path / "second.flv")
    assert got >= 3 and abs(got - remaining) <= 1.5, (got, remaining)  # resumes at the next keyframe
    events = rtmp_events(edge)
    severities = [e["severity"] for e in events]
    assert severities[:3] == ["info", "warning", "info"], events
    assert "disconnected" in events[1]["message"] and "connected" in events[2]["message"]
    assert all(KEY not in e["message"] for e in events)


def test_unreachable_server_gives_up_after_max_attempts(edge: Edge, tmp_path: Path) -> None:
    udp, rtmp = free_udp_port(), free_port()  # nobody listens there
    with edge.client() as api:
        body = flow(udp, f"rtmp://127.0.0.1:{rtmp}/live", reconnect_delay_secs=1, max_reconnect_attempts=2)
        assert api.post("/api/v1/flows", json=body).status_code == 200
    wait_for(lambda: (o := output_state(edge)) and o["state"] == "failed", timeout=20)
    events = rtmp_events(edge)
    assert [e["severity"] for e in events] == ["warning", "critical"], events
    assert "giving up" in events[1]["message"] and "2 reconnect" in events[1]["message"]
    with edge.client() as api:  # the flow itself runs on
        assert api.get("/api/v1/stats/push").json()["data"]["state"] == "Running"


# ------------------------------------------------------------------ RTMPS through stunnel4


def test_rtmps_through_stunnel(tmp_path: Path) -> None:
    if STUNNEL is None:
        if os.environ.get("CI"):
            pytest.fail("stunnel4 is missing in CI (tools/ensure-debs.sh installs it)")
        pytest.skip("stunnel4 not installed")
    cert, key = self_signed(tmp_path)
    tls_port, rtmp, udp = free_port(), free_port(), free_udp_port()
    conf = tmp_path / "stunnel.conf"
    conf.write_text(
        f"foreground = yes\npid =\noutput = {tmp_path / 'stunnel.log'}\n"
        f"[rtmps]\naccept = 127.0.0.1:{tls_port}\nconnect = 127.0.0.1:{rtmp}\ncert = {cert}\nkey = {key}\n"
    )
    seconds = 4
    source = make_ts(tmp_path / "in.ts", seconds)
    sent_duration = media_duration(source)
    stunnel = subprocess.Popen([STUNNEL, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listener: Listener | None = None
    try:
        wait_for(lambda: tcp_listening(tls_port) or stunnel.poll() is not None, timeout=20)
        assert stunnel.poll() is None
        listener = Listener(rtmp, tmp_path / "out.flv", tmp_path / "listener.log")
        # The config has no switch to skip certificate checks: the edge trusts the test's CA
        # through OpenSSL's SSL_CERT_FILE (the system store otherwise).
        with running_edge(tmp_path, extra_env={"SSL_CERT_FILE": str(cert)}) as edge:
            with edge.client() as api:
                r = api.post("/api/v1/flows", json=flow(udp, f"rtmps://localhost:{tls_port}/live"))
                assert r.status_code == 200, r.text
            wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=20)
            sender = Sender(udp, ts_datagrams(source), seconds)
            sender.start()
            sender.join(timeout=seconds + 30)
            wait_for(lambda: (o := output_state(edge)) and o["packets_sent"] >= sender.sent, timeout=10)
            delete_flow(edge)
            stderr = listener.wait(timeout=30)
            assert KEY not in edge.log()
    finally:
        if listener is not None:
            listener.kill()
        stunnel.kill()
        stunnel.wait(timeout=10)
    assert unexpected(stderr) == []
    check_recording(tmp_path / "out.flv", sent_duration)


def test_rtmps_with_an_untrusted_certificate_is_refused(edge: Edge, tmp_path: Path) -> None:
    if STUNNEL is None:
        pytest.skip("stunnel4 not installed")
    cert, key = self_signed(tmp_path)
    tls_port, udp = free_port(), free_udp_port()
    conf = tmp_path / "stunnel.conf"
    conf.write_text(
        f"foreground = yes\npid =\noutput = {tmp_path / 'stunnel.log'}\n"
        f"[rtmps]\naccept = 127.0.0.1:{tls_port}\nconnect = 127.0.0.1:{free_port()}\ncert = {cert}\nkey = {key}\n"
    )
    stunnel = subprocess.Popen([STUNNEL, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: tcp_listening(tls_port) or stunnel.poll() is not None, timeout=20)
        with edge.client() as api:
            body = flow(udp, f"rtmps://localhost:{tls_port}/live", max_reconnect_attempts=0)
            assert api.post("/api/v1/flows", json=body).status_code == 200
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "failed", timeout=20)
        events = rtmp_events(edge)
        assert "TLS handshake failed" in events[0]["message"] and "certificate" in events[0]["message"], events
    finally:
        stunnel.kill()
        stunnel.wait(timeout=10)


# ------------------------------------------------------------------ HEVC (Enhanced RTMP)


def test_hevc_push_to_an_ffmpeg_8_listener(edge: Edge, tmp_path: Path) -> None:
    """HEVC as Enhanced RTMP (hvc1) to FFmpeg 8's RTMP listener (through PyAV: Debian's ffmpeg 5.1
    cannot read hvc1), recorded as TS, which decodes cleanly for the length sent."""
    seconds = 4
    video = ["-c:v", "libx265", "-b:v", "1000k", "-x265-params", "log-level=error"]
    source = make_ts(tmp_path / "in.ts", seconds, video=video)
    udp, rtmp = free_udp_port(), free_port()
    recording, log = tmp_path / "out.ts", tmp_path / "listener.log"
    listener = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.av_listen", f"rtmp://127.0.0.1:{rtmp}/live/{KEY}", str(recording)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        wait_for(lambda: tcp_listening(rtmp) or listener.poll() is not None, timeout=20)
        assert listener.poll() is None, log.read_text()
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=flow(udp, f"rtmp://127.0.0.1:{rtmp}/live")).status_code == 200
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=20)
        sender = Sender(udp, ts_datagrams(source), seconds)
        sender.start()
        sender.join(timeout=seconds + 30)
        delete_flow(edge)
        assert listener.wait(timeout=30) == 0, log.read_text()
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait(timeout=10)
    probe = subprocess.run(
        [
            FFMPEG.replace("ffmpeg", "ffprobe"),
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name",
            "-of",
            "csv=p=0",
            str(recording),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "hevc" in probe.stdout.split(), probe.stdout + probe.stderr
    check_recording(recording, media_duration(source))


# ------------------------------------------------------------------ a server that stops reading


class StalledServer(threading.Thread):
    """An RTMP server (the sans-IO core on a blocking socket) that accepts the publish, then never
    reads again: the edge's TCP send blocks."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        self.listener.settimeout(20)
        self.port: int = self.listener.getsockname()[1]
        self.published = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(20)
            server = RtmpServerConnection()
            for _ in range(1000):
                data = conn.recv(65536)
                for event in server.receive_data(data):
                    if isinstance(event, PublishRequested):
                        server.accept_publish(event.stream_id)
                        self.published.set()
                conn.sendall(server.data_to_send())
                if self.published.is_set() or not data:
                    break
            self.release.wait(timeout=120)

    def stop(self) -> None:
        self.release.set()
        self.join(timeout=10)
        self.listener.close()


def test_a_stalled_server_drops_and_counts_but_never_stalls_the_flow(edge: Edge, tmp_path: Path) -> None:
    # ~47 Mbit/s of real H.264 (noise at qp 20): 4 s of it is beyond the 8 MiB queue + TCP buffers.
    noisy = ["-c:v", "libx264", "-preset", "ultrafast", "-qp", "20"]
    noise = "testsrc2=size=640x360:rate=25,noise=alls=60:allf=t"
    source = make_ts(tmp_path / "in.ts", 4, video=noisy, rate=None, source=noise)
    datagrams = [d for d in ts_datagrams(source) if len(d) == 1316]  # whole 7-packet datagrams only
    assert len(datagrams) * 1316 > 16_000_000
    server = StalledServer()
    server.start()
    udp, out = free_udp_port(), free_udp_port()
    body = flow(udp, f"rtmp://127.0.0.1:{server.port}/live")
    body["outputs"].append({"type": "udp", "id": "copy", "name": "copy", "dest_addr": f"127.0.0.1:{out}"})
    try:
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=body).status_code == 200
        assert server.published.wait(timeout=20)
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=20)
        with UdpSink(out) as sink:
            send_datagrams(("127.0.0.1", udp), datagrams, pps=6000)
            wait_for(lambda: len(sink.datagrams) >= len(datagrams), timeout=15)
        assert sink.datagrams == datagrams  # the other output got everything, on time

        # A stats report taken once the input had counted every datagram (an earlier one, on a
        # loaded host, still counts input in flight as "queued": CI once saw 8.6 MB that way).
        def settled() -> dict[str, Any] | None:
            with edge.client() as api:
                data = api.get("/api/v1/stats/push").json().get("data") or {}
            outputs = data.get("outputs") or []
            received = (data.get("input") or {}).get("packets_received", 0)
            if received >= len(datagrams) and outputs and outputs[0].get("packets_dropped", 0) > 0:
                return dict(outputs[0])
            return None

        o = wait_for(settled, timeout=10)
        assert o["state"] == "connected" and o["packets_sent"] + o["packets_dropped"] <= len(datagrams)
        # What was neither sent nor dropped waits in the queue: at most its 8 MiB.
        assert (len(datagrams) - o["packets_sent"] - o["packets_dropped"]) * 1316 <= 8 * 1024 * 1024
    finally:
        server.stop()


# ------------------------------------------------------------------ the URL (no peer needed)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("rtmp://a.example/live", ("rtmp", "a.example", 1935, "live", "rtmp://a.example/live")),
        ("rtmps://a.example/live2/", ("rtmps", "a.example", 443, "live2", "rtmps://a.example/live2")),
        ("rtmp://[::1]:1936/app/inst", ("rtmp", "::1", 1936, "app/inst", "rtmp://[::1]:1936/app/inst")),
        ("rtmp://h/app?token=x", ("rtmp", "h", 1935, "app?token=x", "rtmp://h/app?token=x")),
    ],
)
def test_parse_target(url: str, expected: tuple[str, str, int, str, str]) -> None:
    t = parse_target(url)
    assert (t.scheme, t.host, t.port, t.app, t.tc_url) == expected
    assert "token" not in t.display


@pytest.mark.parametrize("url", ["rtmp://host", "rtmp://host/", "http://host/app", "rtmp:///app"])
def test_parse_target_refuses(url: str) -> None:
    with pytest.raises(ValueError):
        parse_target(url)


class RecordingServer(threading.Thread):
    """The sans-IO RTMP server on a blocking socket, recording what one publisher sends."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(20)
        self.port: int = self.listener.getsockname()[1]
        self.events: list[object] = []

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(30)
            server = RtmpServerConnection()
            deadline = time.monotonic() + 60
            for _ in range(200_000):
                data = conn.recv(65536)
                for event in server.receive_data(data):
                    self.events.append(event)
                    if isinstance(event, PublishRequested):
                        server.accept_publish(event.stream_id)
                conn.sendall(server.data_to_send())
                if not data or server.closed or time.monotonic() > deadline:
                    break

    def stop(self) -> None:
        self.join(timeout=30)
        self.listener.close()


def test_hevc_push_as_enhanced_rtmp_decodes(edge: Edge, tmp_path: Path) -> None:
    """HEVC through E-RTMP (hvc1) without an FFmpeg >= 6.1 listener: our server core records the
    tags, and the Annex B stream rebuilt from them (HVCC parameter sets + length-prefixed frames)
    must decode with FFmpeg without an error."""
    seconds = 4
    video = ["-c:v", "libx265", "-b:v", "1000k", "-x265-params", "log-level=error"]
    source = make_ts(tmp_path / "in.ts", seconds, video=video)
    server = RecordingServer()
    server.start()
    udp = free_udp_port()
    try:
        with edge.client() as api:
            body = flow(udp, f"rtmp://127.0.0.1:{server.port}/live")
            assert api.post("/api/v1/flows", json=body).status_code == 200
        wait_for(lambda: (o := output_state(edge)) and o["state"] == "connected", timeout=20)
        sender = Sender(udp, ts_datagrams(source), seconds)
        sender.start()
        sender.join(timeout=seconds + 30)
        wait_for(lambda: (o := output_state(edge)) and o["packets_sent"] >= sender.sent, timeout=10)
        delete_flow(edge)
    finally:
        server.stop()
    requests = [e for e in server.events if isinstance(e, PublishRequested)]
    assert [(r.app, r.stream_key) for r in requests] == [("live", KEY)]
    video_tags = [e.tag for e in server.events if isinstance(e, VideoData)]
    head = video_tags[0]
    assert head.codec is VideoCodec.HEVC and head.enhanced and head.packet is PacketKind.SEQUENCE_HEADER
    record = parse_hvcc(head.payload)
    assert record is not None
    frames = [t for t in video_tags if t.packet is PacketKind.FRAME]
    assert frames[0].is_keyframe and len(frames) >= seconds * 25 - 2
    assert any(isinstance(e, AudioData) for e in server.events)
    annexb = bytearray(join_annexb(record.parameter_sets.nals()))
    for frame in frames:
        converted = length_prefixed_to_annexb(frame.payload, record.nal_length_size)
        assert converted is not None
        annexb += converted
    raw = tmp_path / "out.hevc"
    raw.write_bytes(annexb)
    done = subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-f", "hevc", "-i", str(raw), "-f", "null", "-"],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == b"", done.stderr
