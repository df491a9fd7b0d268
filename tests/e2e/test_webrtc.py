"""WebRTC through real mp-edge processes and real WebRTC stacks (issue 20, interop.md 2.3, 2.5, 4, 11).

Peers: Debian's Chromium (playwright; fake camera and microphone, or a canvas painting the clock
for glass-to-glass latency) and aiortc clients (``tests/helpers/webrtc.py``), a second mp-edge
for the edge-to-edge modes, ffmpeg for the TS that feeds the WHEP side and for decoding what
comes out. Everything runs on loopback.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, free_port, free_udp_port, start_edge, wait_for
from tests.helpers.edge import edge_events as events
from tests.helpers.edge import flow_stats as stats
from tests.helpers.media import UdpSink, ts_decode_errors
from tests.helpers.procfs import webrtc_worker
from tests.helpers.tools import need_tool
from tests.helpers.webrtc import (
    chromium,
    delete_session,
    post_sdp,
    publish_whip,
    stop_whip,
    view_whep,
    whep_receive,
    whep_state,
    whip_send_file,
    whip_state,
)
from tests.helpers.webrtc import wait_for as page_wait

pytestmark = [pytest.mark.e2e, pytest.mark.interop]

TOKEN = "whip-Token-0123456789"
LATENCY_BUDGET_MS = 500  # issue 20: WHIP in -> WHEP out, glass to glass, on loopback


@pytest.fixture(scope="module")
def source_ts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 s of H.264 High (no B-frames: what a live encoder for WebRTC sends) and AAC, in TS."""
    path = tmp_path_factory.mktemp("webrtc-src") / "src.ts"
    subprocess.run(
        [
            need_tool("ffmpeg"), "-v", "error", "-y",
            "-f", "lavfi", "-i", "testsrc2=size=640x360:rate=30",
            "-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000",
            "-t", "20", "-c:v", "libx264", "-profile:v", "high", "-bf", "0", "-g", "30", "-b:v", "2M",
            "-c:a", "aac", "-f", "mpegts", str(path),
        ],
        check=True,
        timeout=120,
    )  # fmt: skip
    return path


class Setup:
    """Two edges: ``a`` runs the WHIP server, the fed WHEP server and the viewer-limit flows;
    ``b`` takes ``a``'s WHIP client and pulls ``a``'s WHEP output."""

    def __init__(self, a: Edge, b: Edge, ports: dict[str, int]) -> None:
        self.a, self.b, self.ports = a, b, ports


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, source_ts: Path) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("webrtc")
    ports = {name: free_udp_port() for name in ("feed", "whip_out", "limited_in", "ingest_out", "pull_out")}
    port_a, port_b = free_port(), free_port()
    base_a = f"http://127.0.0.1:{port_a}"
    config_a = {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": port_a},
        "flows": [
            {
                "id": "whip",
                "name": "WHIP in",
                "input": {"type": "webrtc", "bearer_token": TOKEN},
                "outputs": [
                    {"type": "udp", "id": "u", "name": "u", "dest_addr": f"127.0.0.1:{ports['whip_out']}"},
                    {"type": "webrtc", "id": "w", "name": "monitor", "mode": "whep_server"},
                ],
            },
            {
                "id": "feed",
                "name": "TS fed, WHEP out",
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{ports['feed']}"},
                "outputs": [{"type": "webrtc", "id": "w", "name": "viewers", "mode": "whep_server"}],
            },
            {
                "id": "limited",
                "name": "one viewer",
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{ports['limited_in']}"},
                "outputs": [{"type": "webrtc", "id": "w", "name": "w", "mode": "whep_server", "max_viewers": 1}],
            },
            {"id": "idle", "name": "not running", "enabled": False, "input": {"type": "webrtc"}},
        ],
    }
    config_b = {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": port_b},
        "flows": [
            {
                "id": "ingest",
                "name": "from edge a over WHIP",
                "input": {"type": "webrtc", "bearer_token": TOKEN},
                "outputs": [{"type": "udp", "id": "u", "name": "u", "dest_addr": f"127.0.0.1:{ports['ingest_out']}"}],
            },
            {
                "id": "pull",
                "name": "from edge a over WHEP",
                "input": {"type": "whep", "whep_url": f"{base_a}/api/v1/flows/feed/whep"},
                "outputs": [{"type": "udp", "id": "u", "name": "u", "dest_addr": f"127.0.0.1:{ports['pull_out']}"}],
            },
        ],
    }
    a = start_edge(root / "a", config=config_a, port=port_a)
    b = start_edge(root / "b", config=config_b, port=port_b)
    feeder = subprocess.Popen(
        [need_tool("ffmpeg"), "-v", "error", "-re", "-stream_loop", "-1", "-i", str(source_ts), "-c", "copy",
         "-f", "mpegts", f"udp://127.0.0.1:{ports['feed']}?pkt_size=1316"],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: stats(a, "feed")["input"]["state"] == "receiving", timeout=20)
        yield Setup(a, b, ports)
    finally:
        feeder.kill()
        feeder.wait(5)
        b.stop()
        a.stop()


def capture(port: int, seconds: float, tmp_path: Path) -> tuple[bytes, str]:
    """What a flow's udp output sends for ``seconds`` (from its first keyframe on, as a decoder that
    tunes in would start, to the end of each stream's last whole PES) and what ffmpeg says decoding it."""
    sink = UdpSink(port)
    done = threading.Event()
    done.wait(seconds)  # a bounded capture window, not a synchronisation
    ts = from_first_keyframe(b"".join(sink.stop()))
    return ts, ts_decode_errors(ts, tmp_path)


def from_first_keyframe(ts: bytes) -> bytes:
    """``ts`` from the packet that starts the first H.264 IDR access unit, behind a copy of the
    first PAT and PMT (ISO/IEC 13818-1 §2.4.4), without the last PES of each stream (the capture
    window may have cut it): a capture cut where a receiver tuning in could start and stop."""
    packets = [ts[i : i + 188] for i in range(0, len(ts) - 187, 188) if ts[i] == 0x47]
    pid_of = [((p[1] & 0x1F) << 8) | p[2] for p in packets]
    pat = next((p for p, pid in zip(packets, pid_of, strict=True) if pid == 0), None)
    assert pat is not None, "no PAT in the capture"
    pmt_pid = ((pat[15] & 0x1F) << 8) | pat[16]  # the first program of a single-program PAT
    pmt = next(p for p, pid in zip(packets, pid_of, strict=True) if pid == pmt_pid)
    section_end = 8 + (((pmt[6] & 0x0F) << 8) | pmt[7]) - 4 + 1
    info_len = ((pmt[15] & 0x0F) << 8) | pmt[16]
    index, video_pid = 17 + info_len, None
    while index + 5 <= section_end:
        stream_type, pid = pmt[index], ((pmt[index + 1] & 0x1F) << 8) | pmt[index + 2]
        if stream_type == 0x1B:
            video_pid = pid
        index += 5 + (((pmt[index + 3] & 0x0F) << 8) | pmt[index + 4])
    assert video_pid is not None, "no H.264 stream in the PMT"
    for k, (packet, pid) in enumerate(zip(packets, pid_of, strict=True)):
        if (
            pid == video_pid
            and packet[1] & 0x40
            and any(packet[i] & 0x1F == 5 for i in range(4, 185) if packet[i - 3 : i] == b"\x00\x00\x01")
        ):
            kept = list(zip(packets[k:], pid_of[k:], strict=True))
            last_start: dict[int, int] = {}
            for index, (packet, pid) in enumerate(kept):
                if pid not in (0, pmt_pid) and packet[1] & 0x40:
                    last_start[pid] = index
            cut = set()
            for pid, start in last_start.items():
                cut |= {i for i in range(start, len(kept)) if kept[i][1] == pid}
            return pat + pmt + b"".join(p for i, (p, _) in enumerate(kept) if i not in cut)
    raise AssertionError("no IDR in the capture")


def session_count(edge: Edge, flow_id: str, where: str = "input") -> int:
    data = stats(edge, flow_id)
    side = data["input"] if where == "input" else data["outputs"][-1]
    webrtc = side.get("webrtc_stats") or {}
    return sum(1 for s in webrtc.get("sessions", []) if s["state"] == "connected")


def event_texts(edge: Edge, flow_id: str) -> list[str]:
    return [e["message"] for e in events(edge) if e.get("flow_id") == flow_id and e["category"] == "webrtc"]


# --------------------------------------------------------------------------- the HTTP contract


def test_offers_are_checked_before_any_session(setup: Setup) -> None:
    base = setup.a.url
    offer = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n"
    missing = post_sdp(base, "/api/v1/flows/whip/whip", offer)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    wrong = post_sdp(base, "/api/v1/flows/whip/whip", offer, token="not-the-token")
    assert wrong.status_code == 401 and "not-the-token" not in wrong.text
    typed = post_sdp(base, "/api/v1/flows/whip/whip", offer, token=TOKEN, content_type="text/plain")
    assert typed.status_code == 415 and typed.json()["success"] is False
    assert post_sdp(base, "/api/v1/flows/nope/whip", offer).status_code == 404
    assert post_sdp(base, "/api/v1/flows/feed/whip", offer).status_code == 404  # a udp input takes no publisher
    assert post_sdp(base, "/api/v1/flows/idle/whip", offer).status_code == 409  # not running
    garbage = post_sdp(base, "/api/v1/flows/whip/whip", "hello <script>", token=TOKEN)
    assert garbage.status_code == 400 and "<script>" not in garbage.text
    assert delete_session(base, "/api/v1/flows/feed/whep/no-such-session").status_code == 404


def test_viewer_limit_and_delete(setup: Setup) -> None:
    """``max_viewers`` 1: a second viewer gets 503 (Retry-After); DELETE frees the place."""
    first = whep_offer_only(setup.a.url, "limited")
    assert first.status_code == 201, first.text
    assert first.headers["Content-Type"].startswith("application/sdp")
    location = first.headers["Location"]
    assert location.startswith("/api/v1/flows/limited/whep/") and first.headers["ETag"]
    second = whep_offer_only(setup.a.url, "limited")
    assert second.status_code == 503 and second.headers.get("Retry-After") and "viewer limit" in second.json()["error"]
    assert delete_session(setup.a.url, location).status_code == 200
    assert delete_session(setup.a.url, location).status_code == 404
    again = whep_offer_only(setup.a.url, "limited")
    assert again.status_code == 201
    assert delete_session(setup.a.url, again.headers["Location"]).status_code == 200


def test_trickle_ice_patch(setup: Setup) -> None:
    """RFC 9725 §4.3.1: PATCH with a trickle-ice-sdpfrag and the session's ETag adds candidates
    (204); an ICE restart (a new ufrag) is refused 422; a stale ETag 412, none 428."""
    base = setup.a.url
    created = whep_offer_only(base, "limited")
    assert created.status_code == 201
    location, etag = created.headers["Location"], created.headers["ETag"]
    assert created.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"
    ufrag = re.search(r"a=ice-ufrag:(\S+)", created.request.content.decode()).group(1)  # type: ignore[union-attr]
    fragment = (
        f"a=ice-ufrag:{ufrag}\r\na=ice-pwd:whatever0123456789abcdef\r\nm=video 9 UDP/TLS/RTP/SAVPF 0\r\n"
        "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
    )

    def patch(body: str, **headers: str) -> httpx.Response:
        with httpx.Client(timeout=10) as client:
            return client.patch(base + location, content=body, headers=headers)

    trickle = "application/trickle-ice-sdpfrag"
    try:
        assert patch(fragment, **{"Content-Type": "application/sdp", "If-Match": etag}).status_code == 415
        assert patch(fragment, **{"Content-Type": trickle}).status_code == 428
        assert patch(fragment, **{"Content-Type": trickle, "If-Match": '"stale"'}).status_code == 412
        restart = fragment.replace(ufrag, "newufrag")
        assert patch(restart, **{"Content-Type": trickle, "If-Match": etag}).status_code == 422
        assert patch(fragment, **{"Content-Type": trickle, "If-Match": etag}).status_code == 204
    finally:
        assert delete_session(base, location).status_code == 200


def whep_offer_only(base: str, flow_id: str) -> httpx.Response:
    """POST a real aiortc offer (recvonly H.264 + Opus) and never connect: the session still counts."""
    import asyncio

    from aiortc import RTCConfiguration, RTCPeerConnection

    async def offer() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return post_sdp(base, f"/api/v1/flows/{flow_id}/whep", asyncio.run(offer()))


# --------------------------------------------------------------------------- media


@pytest.mark.browser
def test_chromium_publishes_over_whip_into_a_clean_ts(setup: Setup, tmp_path: Path) -> None:
    """Chromium's fake camera and microphone over WHIP: the flow's UDP output decodes with zero
    errors, the media analysis shows H.264 and AAC, DELETE ends the session."""
    a = setup.a
    with chromium() as context:
        page = context.new_page()
        state = publish_whip(page, a.url, "whip", TOKEN, source="camera")
        assert state["status"] == 201, state
        page_wait(page, "window.__whip.connectionState === 'connected' && window.__whip.framesSent > 30")
        wait_for(lambda: stats(a, "whip")["input"]["state"] == "receiving", timeout=20)
        ts, errors = capture(setup.ports["whip_out"], 4.0, tmp_path)
        assert len(ts) > 100_000 and errors == "", errors
        data = stats(a, "whip")
        assert data["media_analysis"]["video_streams"][0]["codec"] == "h264"
        assert data["media_analysis"]["audio_streams"][0]["codec"] == "aac"
        sessions = data["input"]["webrtc_stats"]["sessions"]
        assert len(sessions) == 1 and sessions[0]["role"] == "publisher" and sessions[0]["state"] == "connected"
        assert sessions[0]["peer"] and data["input"]["peer_addr"] == sessions[0]["peer"]
        assert "WebRTC publisher connected" in event_texts(a, "whip")
        stop_whip(page, delete=True)
        assert whip_state(page)["deleteStatus"] == 200 if "deleteStatus" in whip_state(page) else True
        wait_for(lambda: session_count(a, "whip") == 0, timeout=10)
        wait_for(lambda: "WebRTC publisher disconnected" in event_texts(a, "whip"), timeout=10)


@pytest.mark.browser
def test_a_ts_flow_is_watched_by_chromium_and_aiortc(setup: Setup) -> None:
    """ffmpeg's H.264 High + AAC TS, watched over WHEP: Chromium renders frames (High profile
    accepted), aiortc decodes them; a DELETE from elsewhere ends aiortc's session and it sees so."""
    a = setup.a
    with chromium() as context:
        page = context.new_page()
        state = view_whep(page, a.url, "feed", decode_clock=False)
        assert state["status"] == 201, state
        page_wait(page, "window.__whep.framesRendered > 30 && window.__whep.videoWidth === 640")
        received = in_thread(lambda: whep_receive(a.url, "feed", min_frames=30, seconds=15))
        assert received["status"] == 201 and received["frames"] >= 30, received
        assert (received["width"], received["height"]) == (640, 360) and received["audio_frames"] > 0
        assert whep_state(page)["framesRendered"] > 60  # still playing beside the second viewer
        # The stream is High profile; the answer names the highest profile the browser offered
        # (RFC 6184 profile-level-id: High 64xxxx, or Main 4dxxxx where Debian's Chromium stops),
        # and the browser renders the High stream.
        assert stats(a, "feed")["media_analysis"]["video_streams"][0]["profile"] == "High"
        offered = re.findall(r"profile-level-id=([0-9a-f]{2})", whep_state(page)["offer"])
        answered = re.findall(r"profile-level-id=([0-9a-f]{2})", whep_state(page)["answer"])
        assert answered[0] == ("64" if "64" in offered else "4d"), (offered, answered)

    # DELETE from the API side: the aiortc viewer sees its connection end.
    result: dict[str, Any] = {}
    before = set(viewer_locations(a, "feed"))  # edge b's WHEP client input is a viewer too
    thread = threading.Thread(
        target=lambda: result.update(whep_receive(a.url, "feed", seconds=30, delete=False)), daemon=True
    )
    thread.start()
    location = wait_for(lambda: next(iter(set(viewer_locations(a, "feed")) - before), None), timeout=15)
    session_id = location.rsplit("/", 1)[1]
    wait_for(lambda: session_bytes(a, "feed", session_id) > 500_000, timeout=15)  # past a keyframe: frames decode
    assert delete_session(a.url, location).status_code == 200
    thread.join(20)
    assert not thread.is_alive() and result["ended"] is True and result["frames"] > 0, result


def in_thread(call: Any) -> Any:
    """``call()`` in a thread of its own (playwright's sync API keeps an event loop in this one)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(60)
    assert result, "the call did not finish in 60 s"
    return result[0]


def session_bytes(edge: Edge, flow_id: str, session_id: str) -> int:
    sessions = stats(edge, flow_id)["outputs"][0]["webrtc_stats"]["sessions"]
    return next((int(s["bytes"]) for s in sessions if s["session_id"] == session_id), 0)


def viewer_locations(edge: Edge, flow_id: str) -> list[str]:
    outputs = stats(edge, flow_id)["outputs"]
    sessions = outputs[0]["webrtc_stats"]["sessions"]
    return [f"/api/v1/flows/{flow_id}/whep/{s['session_id']}" for s in sessions if s["state"] == "connected"]


def test_edge_to_edge_whip_client_and_whep_client(setup: Setup, tmp_path: Path) -> None:
    """Edge a's WHIP client publishes its fed flow to edge b's WHIP input; edge b's WHEP client
    input pulls edge a's WHEP output. Both of b's outputs decode with zero errors."""
    a, b = setup.a, setup.b
    push = {
        "type": "webrtc",
        "id": "push",
        "name": "to edge b",
        "mode": "whip_client",
        "whip_url": f"{b.url}/api/v1/flows/ingest/whip",
        "bearer_token": TOKEN,
    }
    with a.client() as api:
        assert api.post("/api/v1/flows/feed/outputs", json=push).status_code == 200
    try:
        wait_for(lambda: stats(b, "ingest")["input"]["state"] == "receiving", timeout=30)
        wait_for(lambda: stats(b, "pull")["input"]["state"] == "receiving", timeout=30)
        for flow_id, port in (("ingest", setup.ports["ingest_out"]), ("pull", setup.ports["pull_out"])):
            ts, errors = capture(port, 4.0, tmp_path)
            assert len(ts) > 100_000 and errors == "", (flow_id, errors)
            media = stats(b, flow_id)["media_analysis"]
            assert media["video_streams"][0]["codec"] == "h264" and media["video_streams"][0]["resolution"] == "640x360"
            assert media["audio_streams"][0]["codec"] == "aac" and media["audio_streams"][0]["bitrate_bps"] > 0
        pushed = next(o for o in stats(a, "feed")["outputs"] if o["output_id"] == "push")
        assert pushed["state"] == "connected" and pushed["packets_sent"] > 0
        assert pushed["webrtc_stats"]["sessions"][0]["role"] == "whip_client"
    finally:
        with a.client() as api:
            api.delete("/api/v1/flows/feed/outputs/push")
    # Removing the output ends the WHIP session (DELETE sent): b's publisher goes away.
    wait_for(lambda: session_count(b, "ingest") == 0, timeout=15)


@pytest.mark.browser
def test_glass_to_glass_latency_whip_in_whep_out(setup: Setup) -> None:
    """A canvas painting the clock, published by Chromium over WHIP, watched by Chromium over WHEP
    from the same flow: the clock read off the rendered frames, against the clock now."""
    a = setup.a
    with chromium() as context:
        publisher, viewer = context.new_page(), context.new_page()
        assert publish_whip(publisher, a.url, "whip", TOKEN, source="clock")["status"] == 201
        page_wait(publisher, "window.__whip.connectionState === 'connected'")
        wait_for(lambda: stats(a, "whip")["input"]["state"] == "receiving", timeout=20)
        assert view_whep(viewer, a.url, "whip", decode_clock=True)["status"] == 201
        page_wait(viewer, "window.__whep.latencies.length >= 90", timeout_ms=30_000)
        latencies = whep_state(viewer)["latencies"][30:]  # past the start-up
        stop_whip(publisher)
    median = statistics.median(latencies)
    p95 = sorted(latencies)[int(len(latencies) * 0.95)]
    print(f"glass-to-glass WHIP -> WHEP: median {median:.0f} ms, p95 {p95:.0f} ms over {len(latencies)} frames")
    assert median < LATENCY_BUDGET_MS, latencies


def test_a_crashed_webrtc_worker_ends_its_sessions_and_comes_back(setup: Setup, tmp_path: Path) -> None:
    """SIGKILL to the webrtc worker: its sessions are reported failed with a webrtc warning, the
    other flows run on, the worker is restarted and takes a new publisher."""
    a = setup.a
    result: dict[str, Any] = {}
    publisher = threading.Thread(
        target=lambda: result.update(
            whip_send_file(
                a.url, "whip", TOKEN, source_path="testsrc=size=320x180:rate=30", media_format="lavfi", seconds=20
            )
        ),
        daemon=True,
    )
    publisher.start()
    wait_for(lambda: session_count(a, "whip") == 1, timeout=30)
    old = webrtc_worker(a.process.pid)
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: any("webrtc worker exited" in t for t in event_texts(a, "whip")), timeout=15)
    assert stats(a, "feed")["state"] == "Running" and stats(a, "whip")["state"] == "Running"
    wait_for(lambda: webrtc_worker(a.process.pid) not in (None, old), timeout=60)
    publisher.join(40)
    again = whip_send_file(
        a.url, "whip", TOKEN, source_path="testsrc=size=320x180:rate=30", media_format="lavfi", seconds=3
    )
    assert again["status"] == 201 and again["connected"], again
