"""SRT flows through a real mp-edge against Debian's srt-live-transmit (interop)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.edge import Edge, free_udp_port, running_edge, wait_for
from tests.helpers.media import Pacer, TsSource, UdpSink, rtp_stream, send_datagrams
from tests.helpers.srt import SLT, Slt, require, stats

pytestmark = [pytest.mark.e2e, pytest.mark.interop]


@pytest.fixture(autouse=True)
def need_slt() -> None:
    require(SLT, "srt-live-transmit (srt-tools)")


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    with running_edge(tmp_path) as edge:
        yield edge


PASSPHRASE = "correct-horse-42"


def raw_ts(count: int) -> list[bytes]:
    source = TsSource()
    return [source.datagram() for _ in range(count)]


def leg_states(edge: Edge, flow_id: str) -> list[str | None]:
    """Each SRT leg's state; None before the first report from the worker."""
    inp = stats(edge, flow_id)["input"]
    return [(inp.get(key) or {}).get("state") for key in ("srt_stats", "srt_leg2_stats")]  # type: ignore[union-attr]


def test_srt_listener_input_with_passphrase_from_srt_live_transmit(edge: Edge, tmp_path: Path) -> None:
    srt_port, udp_in, out = free_udp_port(), free_udp_port(), free_udp_port()
    flow = {
        "id": "srtin",
        "name": "SRT in",
        "input": {
            "type": "srt",
            "mode": "listener",
            "local_addr": f"127.0.0.1:{srt_port}",
            "latency_ms": 80,
            "passphrase": PASSPHRASE,
        },
        "outputs": [{"type": "udp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }
    with edge.client() as api:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
    wait_for(lambda: stats(edge, "srtin")["input"]["state"] == "connecting", timeout=10)  # type: ignore[index]
    slt = Slt(
        tmp_path / "slt.log",
        f"udp://127.0.0.1:{udp_in}",
        f"srt://127.0.0.1:{srt_port}?mode=caller&latency=80&passphrase={PASSPHRASE}&pbkeylen=16",
    )
    try:
        wait_for(lambda: stats(edge, "srtin")["input"]["state"] == "connected", timeout=10)  # type: ignore[index]
        datagrams = raw_ts(600)
        with UdpSink(out) as sink:
            send_datagrams(("127.0.0.1", udp_in), datagrams, pps=1000)
            wait_for(lambda: len(sink.datagrams) >= 600, timeout=10)
        assert sink.datagrams == datagrams
        s = wait_for(lambda: (x := stats(edge, "srtin"))["input"]["packets_received"] == 600 and x)  # type: ignore[index]
        srt = s["input"]["srt_stats"]
        assert srt["state"] == "connected" and srt["rtt_ms"] >= 0 and srt["uptime_ms"] > 0
        assert s["input"]["packets_received"] == 600 and s["tr101290"]["cc_errors"] == 0  # type: ignore[index]
    finally:
        slt.stop()
    # The caller went away: the flow stays Running, the input shows the broken connection.
    wait_for(lambda: stats(edge, "srtin")["input"]["state"] in ("broken", "connecting"), timeout=10)  # type: ignore[index]
    assert stats(edge, "srtin")["state"] == "Running"


def test_rtp_in_to_srt_caller_output_into_srt_live_transmit(edge: Edge, tmp_path: Path) -> None:
    rtp_in, srt_port, out = free_udp_port(), free_udp_port(), free_udp_port()
    slt = Slt(tmp_path / "slt.log", f"srt://127.0.0.1:{srt_port}?mode=listener&latency=80", f"udp://127.0.0.1:{out}")
    try:
        time.sleep(0.5)
        flow = {
            "id": "srtout",
            "name": "SRT out",
            "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{rtp_in}"},
            "outputs": [
                {
                    "type": "srt",
                    "id": "s",
                    "name": "to slt",
                    "mode": "caller",
                    "local_addr": "0.0.0.0:0",
                    "remote_addr": f"127.0.0.1:{srt_port}",
                    "latency_ms": 80,
                }
            ],
        }
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=flow).status_code == 200
        wait_for(lambda: stats(edge, "srtout")["outputs"][0]["state"] == "connected", timeout=10)  # type: ignore[index]
        packets = list(rtp_stream(500))
        with UdpSink(out) as sink:
            send_datagrams(("127.0.0.1", rtp_in), packets, pps=1000)
            wait_for(lambda: len(sink.datagrams) >= 500, timeout=10)
        assert sink.datagrams == [p[12:] for p in packets]  # RTP stripped: SRT carries raw TS
        output = wait_for(lambda: (o := stats(edge, "srtout")["outputs"][0])["packets_sent"] == 500 and o)  # type: ignore[index]
        assert output["packets_sent"] == 500 and output["output_type"] == "srt"
        assert output["srt_stats"]["state"] == "connected" and output["srt_stats"]["send_rate_mbps"] >= 0
    finally:
        slt.stop()


def test_a_wrong_passphrase_is_reported_not_hung(edge: Edge, tmp_path: Path) -> None:
    srt_port, udp_in = free_udp_port(), free_udp_port()
    flow = {
        "id": "pw",
        "name": "pw",
        "input": {"type": "srt", "mode": "listener", "local_addr": f"127.0.0.1:{srt_port}", "passphrase": PASSPHRASE},
        "outputs": [],
    }
    with edge.client() as api:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
    slt = Slt(
        tmp_path / "slt.log",
        f"udp://127.0.0.1:{udp_in}",
        f"srt://127.0.0.1:{srt_port}?mode=caller&passphrase=not-the-right-one",
    )
    try:
        send_datagrams(("127.0.0.1", udp_in), raw_ts(50), pps=200)
        s = stats(edge, "pw")
        assert s["state"] == "Running" and s["input"]["state"] in ("connecting", "broken")  # type: ignore[index]
        assert s["input"]["packets_received"] == 0  # type: ignore[index]
        with edge.client() as api:
            assert api.get("/health").status_code == 200  # nothing hangs
    finally:
        slt.stop()
    assert PASSPHRASE not in edge.log()


def test_srt_input_redundancy_survives_a_killed_leg(edge: Edge, tmp_path: Path) -> None:
    leg1, leg2, udp1, udp2, out = (free_udp_port() for _ in range(5))
    flow = {
        "id": "red",
        "name": "two legs",
        "input": {
            "type": "srt",
            "mode": "listener",
            "local_addr": f"127.0.0.1:{leg1}",
            "latency_ms": 80,
            "redundancy": {"mode": "listener", "local_addr": f"127.0.0.1:{leg2}", "latency_ms": 80},
        },
        "outputs": [{"type": "udp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }
    with edge.client() as api:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
    # 4 MiB UDP input buffers and a paced feed without bursts (tests/helpers/media.Pacer says why).
    feed = "rcvbuf=4194304"
    slt1 = Slt(
        tmp_path / "slt1.log", f"udp://127.0.0.1:{udp1}?{feed}", f"srt://127.0.0.1:{leg1}?mode=caller&latency=80"
    )
    slt2 = Slt(
        tmp_path / "slt2.log", f"udp://127.0.0.1:{udp2}?{feed}", f"srt://127.0.0.1:{leg2}?mode=caller&latency=80"
    )
    try:
        wait_for(lambda: leg_states(edge, "red") == ["connected", "connected"], timeout=10)
        datagrams = raw_ts(1500)
        import socket

        with UdpSink(out) as sink, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            pacer = Pacer(1000)
            for i, d in enumerate(datagrams):
                tx.sendto(d, ("127.0.0.1", udp1))
                tx.sendto(d, ("127.0.0.1", udp2))
                if i == 600:
                    threading.Thread(target=slt1.stop).start()  # leg 1 dies mid-stream
                pacer.sent_one()
            wait_for(lambda: len(sink.datagrams) >= 1500, timeout=10)
        assert sink.datagrams == datagrams  # no gap, no duplicate
        s = wait_for(lambda: leg_states(edge, "red")[0] in ("broken", "connecting") and stats(edge, "red"))
        assert s["input"]["packets_lost"] == 0  # type: ignore[index]
        assert s["input"]["srt_leg2_stats"]["state"] == "connected"  # type: ignore[index]
    finally:
        slt1.stop()
        slt2.stop()


def test_unsupported_srt_settings_are_400(edge: Edge) -> None:
    from services.edge.engine.srt import library_info

    flow = {
        "id": "gcm",
        "name": "gcm",
        "input": {
            "type": "srt",
            "mode": "listener",
            "local_addr": f"127.0.0.1:{free_udp_port()}",
            "passphrase": PASSPHRASE,
            "crypto_mode": "aes-gcm",
        },
        "outputs": [],
    }
    with edge.client() as api:
        r = api.post("/api/v1/flows", json=flow)
    if library_info().aes_gcm:
        assert r.status_code == 200
    else:
        assert r.status_code == 400 and "aes-gcm" in r.json()["error"]
    assert PASSPHRASE not in r.text


FFMPEG = shutil.which("ffmpeg")


def send_test_pattern(muxer: str, url: str) -> subprocess.CompletedProcess[str]:
    """Four seconds of 320x240 H.264 (ffmpeg's test source) to ``url``, in real time."""
    return subprocess.run(
        [
            str(FFMPEG),
            "-hide_banner",
            "-loglevel",
            "error",
            "-re",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=320x240:rate=25",
            "-t",
            "4",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "25",
            "-f",
            muxer,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def need_ffmpeg_srt() -> None:
    if (
        FFMPEG is None
        or "srt"
        not in subprocess.run(
            [FFMPEG, "-hide_banner", "-protocols"], capture_output=True, text=True, timeout=30
        ).stdout.split()
    ):
        if os.environ.get("CI") == "true":
            pytest.fail("ffmpeg with SRT is missing in CI")
        pytest.skip("ffmpeg without SRT support")


def test_ffmpeg_publishes_over_srt_into_our_listener(edge: Edge, tmp_path: Path) -> None:
    need_ffmpeg_srt()
    srt_port, out = free_udp_port(), free_udp_port()
    flow = {
        "id": "ffin",
        "name": "ffmpeg in",
        "input": {"type": "srt", "mode": "listener", "local_addr": f"127.0.0.1:{srt_port}", "passphrase": PASSPHRASE},
        "outputs": [{"type": "udp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }
    with edge.client() as api:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
    with UdpSink(out) as sink:
        ff = send_test_pattern(
            "mpegts", f"srt://127.0.0.1:{srt_port}?mode=caller&passphrase={PASSPHRASE}&pkt_size=1316"
        )
        assert ff.returncode == 0, ff.stderr
        wait_for(lambda: len(sink.datagrams) > 20, timeout=10)
    s = wait_for(lambda: (x := stats(edge, "ffin"))["media_analysis"]["video_streams"] and x)  # type: ignore[index]
    video = s["media_analysis"]["video_streams"][0]
    assert (video["codec"], video["resolution"]) == ("h264", "320x240")
    assert s["tr101290"]["cc_errors"] == 0  # type: ignore[index]


def test_our_srt_caller_output_into_ffmpeg_listener(edge: Edge, tmp_path: Path) -> None:
    need_ffmpeg_srt()
    rtp_in, srt_port = free_udp_port(), free_udp_port()
    out_file = tmp_path / "received.ts"
    receiver = subprocess.Popen(
        [
            str(FFMPEG),
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            "-i",
            f"srt://127.0.0.1:{srt_port}?mode=listener&timeout=20000000",
            "-c",
            "copy",
            "-f",
            "mpegts",
            str(out_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)
        flow = {
            "id": "ffout",
            "name": "to ffmpeg",
            "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{rtp_in}"},
            "outputs": [
                {
                    "type": "srt",
                    "id": "s",
                    "name": "s",
                    "mode": "caller",
                    "local_addr": "0.0.0.0:0",
                    "remote_addr": f"127.0.0.1:{srt_port}",
                }
            ],
        }
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=flow).status_code == 200
        wait_for(lambda: stats(edge, "ffout")["outputs"][0]["state"] == "connected", timeout=10)  # type: ignore[index]
        sender = send_test_pattern("rtp_mpegts", f"rtp://127.0.0.1:{rtp_in}?pkt_size=1328")
        assert sender.returncode == 0, sender.stderr
        time.sleep(1.0)
        with edge.client() as api:
            assert api.delete("/api/v1/flows/ffout").status_code == 200  # closes SRT: ffmpeg ends
        receiver.wait(20)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait(5)
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-show_entries", "stream=codec_name,width,height", "-of", "csv=p=0", str(out_file)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert probe.stdout.strip().splitlines()[0] == "h264,320,240", probe.stdout + probe.stderr
