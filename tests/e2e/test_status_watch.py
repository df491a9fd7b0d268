"""The status page's "watch" button: a flow played in the page over WHEP (``/watch/<flow_id>``
on the ``monitor`` listener, services/edge/status/app.py), end to end.

A real ``mp-edge`` (auth on: the monitor listener needs none, watching is reading) runs a
``udp`` flow fed by ffmpeg (H.264 High without B-frames and AAC in TS, ``-re``, looped) and a
disabled flow. Debian's chromium (playwright, tests/helpers/webrtc.py) opens the page, clicks
the flow's watch button and waits for decoded frames of the right size while the page keeps
re-rendering from ``/ws``; "stop" ends the session (its Location answers 404 afterwards) and a
second watch plays again. Over plain HTTP: 415, 413, 404 and 409, and the per-flow viewer cap
(4; the 5th concurrent aiortc viewer gets 503, and of offers POSTed all at once exactly 4 are
answered, the others 503 with ``Retry-After``). A refused first viewer leaves no tap behind.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, auth_section, free_port, free_udp_port, running_edge, wait_for
from tests.helpers.procfs import engine_workers, udp_socket_count, webrtc_worker
from tests.helpers.tools import need_tool
from tests.helpers.webrtc import _h264_preferences, _peer_connection, _post_offer, chromium, post_sdp
from tests.helpers.webrtc import wait_for as page_wait

pytestmark = [pytest.mark.e2e, pytest.mark.interop]

WIDTH, HEIGHT = 640, 360
WATCH_TAP = "mp-status-watch"
MAX_VIEWERS = 4  # services/edge/webrtc/sessions.py WATCH_MAX_VIEWERS


@pytest.fixture(scope="module")
def source_ts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 s of H.264 High (no B-frames) and AAC, in TS."""
    path = tmp_path_factory.mktemp("watch-src") / "src.ts"
    subprocess.run(
        [
            need_tool("ffmpeg"), "-v", "error", "-y",
            "-f", "lavfi", "-i", f"testsrc2=size={WIDTH}x{HEIGHT}:rate=30",
            "-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000",
            "-t", "10", "-c:v", "libx264", "-profile:v", "high", "-bf", "0", "-g", "30", "-b:v", "1M",
            "-c:a", "aac", "-f", "mpegts", str(path),
        ],
        check=True,
        timeout=120,
    )  # fmt: skip
    return path


class Watched:
    def __init__(self, edge: Edge, monitor: str) -> None:
        self.edge, self.monitor = edge, monitor

    def flow(self, flow_id: str) -> dict[str, Any]:
        data = httpx.get(self.monitor + "/api/stats", timeout=10).json()["data"]
        return next(f for f in data["flows"] if f["flow_id"] == flow_id)


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory, source_ts: Path) -> Iterator[Watched]:
    root = tmp_path_factory.mktemp("status-watch")
    feed, monitor_port = free_udp_port(), free_port()
    config = {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 18080, "auth": auth_section()},
        "monitor": {"listen_addr": "127.0.0.1", "listen_port": monitor_port},
        "flows": [
            {
                "id": "feed",
                "name": "TS fed",
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{feed}"},
                "outputs": [],
            },
            {
                "id": "idle",
                "name": "not running",
                "enabled": False,
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
                "outputs": [],
            },
        ],
    }
    with running_edge(root, config=config) as edge:
        feeder = subprocess.Popen(
            [need_tool("ffmpeg"), "-v", "error", "-re", "-stream_loop", "-1", "-i", str(source_ts), "-c", "copy",
             "-f", "mpegts", f"udp://127.0.0.1:{feed}?pkt_size=1316"],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            setup = Watched(edge, f"http://127.0.0.1:{monitor_port}")
            wait_for(lambda: setup.flow("feed")["input"]["state"] == "receiving", timeout=20, interval=0.2)
            yield setup
        finally:
            feeder.kill()
            feeder.wait(5)


def _frames(page: Any) -> int:
    return int(
        page.evaluate(
            "() => { const v = document.querySelector('#flow-feed .player video');"
            " return v ? v.getVideoPlaybackQuality().totalVideoFrames : -1; }"
        )
    )


def _play(page: Any) -> str:
    """Click watch on the feed flow and wait for decoded frames of the source's size: the Location."""
    button = page.locator("#flow-feed button[data-watch]")
    assert button.inner_text() == "watch"
    button.click()
    page_wait(page, "document.querySelector('#flow-feed button[data-watch]').textContent === 'stop'")
    page_wait(
        page,
        "(() => { const v = document.querySelector('#flow-feed .player video');"
        " return v && v.getVideoPlaybackQuality().totalVideoFrames > 10 && v.videoWidth > 0; })()",
        timeout_ms=30_000,
    )
    size = page.evaluate(
        "() => { const v = document.querySelector('#flow-feed .player video'); return [v.videoWidth, v.videoHeight]; }"
    )
    assert size == [WIDTH, HEIGHT], size
    location = page.evaluate("document.querySelector('#flow-feed .player').dataset.location")
    assert location.startswith("/watch/feed/"), location
    return str(location)


@pytest.mark.browser
def test_watch_button_plays_the_flow(watched: Watched) -> None:
    monitor = watched.monitor
    with chromium() as context:
        page = context.new_page()
        page.set_viewport_size({"width": 1280, "height": 800})
        script_errors: list[str] = []
        page.on("pageerror", lambda e: script_errors.append(str(e)))
        response = page.goto(monitor + "/")
        assert response is not None and response.status == 200
        page_wait(page, "document.getElementById('conn').textContent === 'live'")
        # Only a running flow can be watched.
        assert page.locator("#flow-feed button[data-watch]").is_enabled()
        assert page.locator("#flow-idle button[data-watch]").is_disabled()

        location = _play(page)
        # The player and the button survive the page's live updates (a few /ws messages).
        page.evaluate(
            "() => { window.__video = document.querySelector('#flow-feed .player video');"
            " window.__button = document.querySelector('#flow-feed button[data-watch]'); }"
        )
        packets = page.locator("#flow-feed [data-k=packets]").inner_text()
        page_wait(page, f"document.querySelector('#flow-feed [data-k=packets]').textContent !== {packets!r}")
        before = _frames(page)
        page_wait(page, f"document.querySelector('#flow-feed .player video').getVideoPlaybackQuality()"
                        f".totalVideoFrames > {before + 30}")  # fmt: skip
        assert page.evaluate(
            "window.__video === document.querySelector('#flow-feed .player video') && "
            "window.__button === document.querySelector('#flow-feed button[data-watch]') && "
            "window.__button.textContent === 'stop' && !window.__video.paused"
        )
        # The watch tap stays hidden: not an output of the flow in the stats.
        assert all(o["output_id"] != WATCH_TAP for o in watched.flow("feed")["outputs"])

        # Stop: the player goes, the session is gone on the edge.
        page.locator("#flow-feed button[data-watch]").click()
        page_wait(page, "!document.querySelector('#flow-feed .player') && "
                        "document.querySelector('#flow-feed button[data-watch]').textContent === 'watch'")  # fmt: skip
        wait_for(lambda: httpx.delete(monitor + location, timeout=10).status_code == 404, timeout=10, interval=0.2)

        # A second watch plays again.
        second = _play(page)
        assert second != location
        page.locator("#flow-feed button[data-watch]").click()
        page_wait(page, "!document.querySelector('#flow-feed .player')")
        wait_for(lambda: httpx.delete(monitor + second, timeout=10).status_code == 404, timeout=10, interval=0.2)
        assert script_errors == []


def test_watch_http_errors(watched: Watched) -> None:
    monitor = watched.monitor
    offer = "v=0\r\n"  # the route checks come before the offer is read
    wrong = post_sdp(monitor, "/watch/feed", offer, content_type="text/plain")
    assert wrong.status_code == 415, wrong.text
    assert wrong.json() == {"success": False, "error": "Content-Type must be application/sdp"}
    big = post_sdp(monitor, "/watch/feed", "a" * (64 * 1024 + 1))
    assert big.status_code == 413, big.text
    unknown = post_sdp(monitor, "/watch/nosuchflow", offer)
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["success"] is False
    stopped = post_sdp(monitor, "/watch/idle", offer)
    assert stopped.status_code == 409, stopped.text
    assert stopped.json()["success"] is False and "not running" in stopped.json()["error"]
    # No token needed (auth is on for the API), and DELETE of an unknown session is a 404.
    assert httpx.delete(monitor + "/watch/feed/nosuchsession", timeout=10).status_code == 404
    assert httpx.delete(monitor + "/watch/nosuchflow/x", timeout=10).status_code == 404
    assert httpx.get(monitor + "/watch/feed", timeout=10).status_code == 405


async def _viewer_cap(monitor: str) -> list[dict[str, Any]]:
    """``MAX_VIEWERS + 1`` concurrent aiortc offers to ``/watch/feed``; each one's result. Every
    accepted session is deleted and every peer connection closed at the end."""
    pcs, results = [], []
    try:
        for _ in range(MAX_VIEWERS + 1):
            pc = _peer_connection(max_bundle=False, loopback=True)
            pcs.append(pc)
            pc.addTransceiver("video", direction="recvonly").setCodecPreferences(_h264_preferences())
            pc.addTransceiver("audio", direction="recvonly")
            result: dict[str, Any] = {}
            await _post_offer(pc, monitor + "/watch/feed", None, result, 10.0)
            results.append(result)
    finally:
        async with httpx.AsyncClient(timeout=10.0) as client:
            for result in results:
                if result.get("location"):
                    result["delete_status"] = (await client.delete(monitor + result["location"])).status_code
        for pc in pcs:
            await asyncio.wait_for(pc.close(), 10.0)
    return results


def test_watch_viewer_cap(watched: Watched) -> None:
    results = asyncio.run(asyncio.wait_for(_viewer_cap(watched.monitor), 120))
    statuses = [r["status"] for r in results]
    assert statuses == [201] * MAX_VIEWERS + [503], [(r["status"], r.get("error")) for r in results]
    for r in results[:MAX_VIEWERS]:
        assert r["content_type"] == "application/sdp"
        assert r["location"].startswith("/watch/feed/")
        assert r["delete_status"] == 200
    assert "viewer limit" in results[-1]["error"]
    # The cap is per flow and frees up: after the deletes one more viewer is answered.
    again = asyncio.run(asyncio.wait_for(_one_more(watched.monitor), 60))
    assert again["status"] == 201, again


async def _one_more(monitor: str) -> dict[str, Any]:
    pc = _peer_connection(max_bundle=False, loopback=True)
    pc.addTransceiver("video", direction="recvonly").setCodecPreferences(_h264_preferences())
    result: dict[str, Any] = {}
    try:
        await _post_offer(pc, monitor + "/watch/feed", None, result, 10.0)
        if result.get("location"):
            async with httpx.AsyncClient(timeout=10.0) as client:
                result["delete_status"] = (await client.delete(monitor + result["location"])).status_code
    finally:
        await asyncio.wait_for(pc.close(), 10.0)
    return result


async def _offers_at_once(monitor: str, count: int) -> list[httpx.Response]:
    """``count`` valid offers (aiortc, gathered first) POSTed to ``/watch/feed`` concurrently;
    the accepted sessions are deleted and the peer connections closed at the end."""
    pcs = []
    try:
        for _ in range(count):
            pc = _peer_connection(max_bundle=False, loopback=True)
            pcs.append(pc)
            pc.addTransceiver("video", direction="recvonly").setCodecPreferences(_h264_preferences())
            pc.addTransceiver("audio", direction="recvonly")
            await asyncio.wait_for(pc.setLocalDescription(await pc.createOffer()), 10.0)
        headers = {"Content-Type": "application/sdp"}
        async with httpx.AsyncClient(timeout=30.0) as client:
            responses = await asyncio.gather(
                *(client.post(monitor + "/watch/feed", content=pc.localDescription.sdp, headers=headers) for pc in pcs)
            )
            for response in responses:
                if response.status_code == 201:
                    assert (await client.delete(monitor + response.headers["location"])).status_code == 200
        return list(responses)
    finally:
        for pc in pcs:
            await asyncio.wait_for(pc.close(), 10.0)


def test_watch_viewer_cap_holds_for_concurrent_offers(watched: Watched) -> None:
    responses = asyncio.run(asyncio.wait_for(_offers_at_once(watched.monitor, MAX_VIEWERS + 3), 120))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * MAX_VIEWERS + [503] * 3, [(r.status_code, r.text[:120]) for r in responses]
    for refused in (r for r in responses if r.status_code == 503):
        assert refused.headers.get("retry-after") == "10"
        assert refused.json() == {"success": False, "error": f"viewer limit reached ({MAX_VIEWERS})"}


def _workers(edge: Edge) -> dict[str, int]:
    """The edge's engine and webrtc worker processes by kind."""
    engine, webrtc = engine_workers(edge.process.pid), webrtc_worker(edge.process.pid)
    return {**({"engine": engine[0]} if engine else {}), **({"webrtc": webrtc} if webrtc else {})}


def test_refused_first_viewer_leaves_no_tap(watched: Watched) -> None:
    """An offer refused while nobody watches (here 400: audio only) takes the tap and the webrtc
    worker's watch socket away again: the engine worker keeps only its input socket. (Run alone,
    the offer is what starts the webrtc worker: it starts when first needed.)"""

    def unwatched() -> bool:
        workers = _workers(watched.edge)
        if "webrtc" in workers and udp_socket_count(workers["webrtc"]) != 0:
            return False
        return "engine" in workers and udp_socket_count(workers["engine"]) == 1

    wait_for(unwatched, timeout=15, interval=0.2)  # whatever the other tests left has gone

    async def audio_only() -> dict[str, Any]:
        pc = _peer_connection(max_bundle=False, loopback=True)
        pc.addTransceiver("audio", direction="recvonly")
        result: dict[str, Any] = {}
        try:
            await _post_offer(pc, watched.monitor + "/watch/feed", None, result, 10.0)
        finally:
            await asyncio.wait_for(pc.close(), 10.0)
        return result

    result = asyncio.run(asyncio.wait_for(audio_only(), 60))
    assert result["status"] == 400, result
    assert _workers(watched.edge).keys() == {"engine", "webrtc"}
    wait_for(unwatched, timeout=10, interval=0.2)
