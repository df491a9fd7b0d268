"""The ``hls`` output through a real mp-edge: a udp input fed an ffmpeg-made MPEG-TS in real time,
segments and playlist PUT to ``tests/helpers/http_sink.py``; the stored files pass the RFC 8216
checker (``tests/helpers/hls_check.py``), FFmpeg decodes them without an error, and hls.js
(vendored, pinned: tools/npm-assets.json) plays the live stream in Debian's headless Chromium.
Every wait is on a condition and bounded."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.browser import CHROMIUM, IN_CI, WAIT_MS, need_chromium
from tests.helpers.browser import CHROMIUM_ARGS as BROWSER_ARGS
from tests.helpers.edge import Edge, free_udp_port, running_edge, wait_for
from tests.helpers.hls_check import (
    SegmentInfo,
    check_durations,
    check_playlist_sequence,
    check_segment,
    check_upload_order,
    parse_playlist,
)
from tests.helpers.http_sink import HttpSink
from tests.helpers.media import send_datagrams

pytestmark = [pytest.mark.e2e, pytest.mark.interop]

FFMPEG = shutil.which("ffmpeg") or "/usr/bin/ffmpeg"
ROOT = Path(__file__).resolve().parents[2]
HLS_JS = ROOT / "build" / "vendor" / "npm" / "hls.js" / "dist" / "hls.min.js"
CHROMIUM_ARGS = [*BROWSER_ARGS, "--autoplay-policy=no-user-gesture-required"]
TOKEN = "hls-bearer-0123456789abcdef"
PLAYER = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>hls</title></head>
<body><video id="v" muted autoplay playsinline></video>
<script src="/vendor/hls.min.js"></script>
<script>
window.log = {errors: [], loaded: [], buffered: [], supported: Hls.isSupported()};
const video = document.getElementById("v");
const hls = new Hls();
hls.on(Hls.Events.ERROR, (e, d) => window.log.errors.push(
  {type: d.type, details: d.details, fatal: d.fatal, reason: String(d.reason || d.error || "")}));
hls.on(Hls.Events.FRAG_LOADED, (e, d) => window.log.loaded.push(d.frag.sn));
hls.on(Hls.Events.FRAG_BUFFERED, (e, d) => window.log.buffered.push(d.frag.sn));
hls.on(Hls.Events.MANIFEST_PARSED, () => video.play());
hls.loadSource("/live/index.m3u8");
hls.attachMedia(video);
</script></body></html>
"""


@pytest.fixture(autouse=True)
def need_ffmpeg() -> None:
    if shutil.which("ffmpeg") is None:
        if IN_CI:
            pytest.fail("ffmpeg is missing in CI (tools/ensure-debs.sh installs it)")
        pytest.skip("ffmpeg not installed")


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("hls-edge")) as started:
        yield started


def make_ts(path: Path, seconds: int) -> list[bytes]:
    """A CBR H.264 (keyframe every 25 frames, B frames) + AAC TS, as 1316-byte datagrams."""
    cmd = [FFMPEG, "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"]
    cmd += ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-c:v", "libx264", "-b:v", "400k"]
    cmd += ["-maxrate", "400k", "-bufsize", "200k", "-g", "25", "-bf", "2", "-c:a", "aac", "-b:a", "64k"]
    cmd += ["-t", str(seconds), "-muxrate", "700k", "-f", "mpegts", str(path)]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    data = path.read_bytes()
    return [data[i : i + 1316] for i in range(0, len(data), 1316)]


class Sender(threading.Thread):
    def __init__(self, port: int, datagrams: list[bytes], seconds: float) -> None:
        super().__init__(daemon=True)
        self.port, self.datagrams, self.pps = port, datagrams, len(datagrams) / seconds
        self.sent = 0

    def run(self) -> None:
        self.sent = send_datagrams(("127.0.0.1", self.port), self.datagrams, pps=self.pps)


def flow(flow_id: str, udp_port: int, ingest_url: str, **output: Any) -> dict[str, Any]:
    hls = {"type": "hls", "id": "cdn", "name": "CDN", "ingest_url": ingest_url, "segment_duration_secs": 1.0}
    return {
        "id": flow_id,
        "name": "HLS push",
        "input": {"type": "udp", "bind_addr": f"127.0.0.1:{udp_port}"},
        "outputs": [{**hls, **output}],
    }


def output_state(edge: Edge, flow_id: str) -> dict[str, Any] | None:
    with edge.client() as api:
        data = api.get(f"/api/v1/stats/{flow_id}").json().get("data") or {}
    outputs = data.get("outputs") or []
    return outputs[0] if outputs and "state" in outputs[0] else None


def hls_events(edge: Edge, flow_id: str) -> list[dict[str, Any]]:
    with edge.client() as api:
        events: list[dict[str, Any]] = api.get("/api/v1/events").json()["data"]["events"]
    return [e for e in events if e["category"] == "hls" and e["flow_id"] == flow_id]


def decode_errors(path: Path) -> str:
    done = subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-i", str(path), "-f", "null", "-"], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.decode()


def playlist_entries(sink: HttpSink) -> int:
    body = sink.latest("/live/index.m3u8")
    return len(parse_playlist(body.decode()).entries) if body else 0


def check_stored(sink: HttpSink, prefix: str) -> tuple[list[Any], dict[str, SegmentInfo]]:
    """(a): upload order, every playlist version, the sequence across them, every segment."""
    stored = [(u.path, u.body) for u in sink.stored() if u.path.startswith(prefix)]
    versions = check_upload_order(stored)
    assert versions, "no playlist was uploaded"
    check_playlist_sequence(versions)
    infos = {path.rsplit("/", 1)[-1]: check_segment(body) for path, body in stored if path.endswith(".ts")}
    for version in versions:
        check_durations(version, infos, 1.0, tolerance=0.05)
    # The audio of each segment starts with its video, within one AAC frame (21.3 ms at 48 kHz):
    # no hole at a segment's start for a player that joins there.
    for name, info in infos.items():
        assert all(abs(offset) <= 0.022 for offset in info.starts.values()), (name, info.starts)
    return versions, infos


def play_in_chromium(sink: HttpSink) -> dict[str, Any]:
    """(c): hls.js in headless Chromium plays the live playlist for 4 s of media."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(WAIT_MS)
            page_errors: list[str] = []
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            response = page.goto(sink.url + "/player.html", timeout=WAIT_MS)
            assert response is not None and response.status == 200
            mse = page.evaluate("""() => MediaSource.isTypeSupported('video/mp4; codecs="avc1.42E01E,mp4a.40.2"')""")
            assert mse, "this Chromium cannot play H.264/AAC through MSE"
            page.wait_for_function(
                "() => document.getElementById('v').currentTime > 4 || window.log.errors.some(e => e.fatal)",
                timeout=WAIT_MS,
            )
            log: dict[str, Any] = page.evaluate("() => window.log")
            log["current_time"] = page.evaluate("() => document.getElementById('v').currentTime")
            log["page_errors"] = page_errors
            return log
        finally:
            browser.close()


def test_hls_upload_checks_decodes_and_plays_in_hls_js(edge: Edge, tmp_path: Path) -> None:
    assert HLS_JS.is_file(), "hls.js is not vendored: run `make vendor` (python -m tools.vendor_npm)"
    seconds = 14
    datagrams = make_ts(tmp_path / "in.ts", seconds)
    udp = free_udp_port()
    with HttpSink(static={"/player.html": PLAYER, "/vendor/hls.min.js": HLS_JS}) as sink:
        with edge.client() as api:
            body = flow("hls", udp, sink.url + "/live/", auth_token=TOKEN, max_segments=5)
            r = api.post("/api/v1/flows", json=body)
            assert r.status_code == 200, r.text
        wait_for(lambda: (o := output_state(edge, "hls")) and o["state"] == "waiting", timeout=20)
        sender = Sender(udp, datagrams, seconds)
        sender.start()
        wait_for(lambda: playlist_entries(sink) >= 3, timeout=15)
        assert (o := output_state(edge, "hls")) and o["state"] == "active"
        log = play_in_chromium(sink)
        sender.join(timeout=seconds + 30)
        assert not sender.is_alive()
        counters = wait_for(lambda: (o := output_state(edge, "hls")) and o["packets_sent"] > 0 and o, timeout=10)
        with edge.client() as api:
            assert api.delete("/api/v1/flows/hls").status_code == 200

        # (a) the RFC 8216 checker over everything stored, in upload order
        versions, infos = check_stored(sink, "/live/")
        assert len(infos) >= seconds - 3  # one-second segments; the last one stays open
        assert versions[-1].target_duration == 1 and versions[-1].media_sequence > 0
        assert counters["packets_dropped"] == 0 and counters["state"] == "active"
        # (b) FFmpeg decodes the playlist (the last 5 segments) and all segments in a row
        files = sink.save(tmp_path / "out", "/live/")
        # A live playlist has no EXT-X-ENDLIST (§4.3.3.4), so FFmpeg would reload it forever: it
        # reads a copy that ends it.
        ended = tmp_path / "out" / "ended.m3u8"
        ended.write_text((tmp_path / "out" / "index.m3u8").read_text() + "#EXT-X-ENDLIST\n")
        assert decode_errors(ended) == ""
        everything = tmp_path / "all.ts"
        everything.write_bytes(b"".join(sink.latest(f"/live/{name}") or b"" for name in sorted(infos, key=_number)))
        assert decode_errors(everything) == ""
        # (e) the Bearer token on every request, the right content types; never in events or logs
        uploads = sink.all_uploads()
        assert uploads and all(u.headers.get("authorization") == f"Bearer {TOKEN}" for u in uploads)
        assert all(u.method == "PUT" for u in uploads)
        for u in uploads:
            want = "video/mp2t" if u.path.endswith(".ts") else "application/vnd.apple.mpegurl"
            assert u.headers.get("content-type") == want
        assert len(files) == len(infos) + 1
    # (c) hls.js played it: no error, every fragment from the first one loaded to the last, in order
    assert log["supported"] and log["page_errors"] == []
    assert log["errors"] == [], log["errors"]
    loaded = log["loaded"]
    assert len(loaded) >= 4 and loaded == list(range(loaded[0], loaded[0] + len(loaded))), loaded
    assert set(loaded[:-1]) <= set(log["buffered"])
    assert log["current_time"] > 4
    events = hls_events(edge, "hls")
    assert all(TOKEN not in str(e) for e in events)
    assert TOKEN not in edge.log()


def _number(name: str) -> int:
    return int(name.removeprefix("seg_").removesuffix(".ts"))


def test_failed_puts_are_warnings_and_later_segments_still_arrive(edge: Edge, tmp_path: Path) -> None:
    seconds = 8
    datagrams = make_ts(tmp_path / "in.ts", seconds)
    udp = free_udp_port()
    failing = {"/up/seg_2.ts", "/up/seg_3.ts"}  # every attempt at these two answers 500
    with HttpSink(fail=lambda path, index: path in failing) as sink:
        with edge.client() as api:
            r = api.post("/api/v1/flows", json=flow("hlsfail", udp, sink.url + "/up", auth_token=TOKEN))
            assert r.status_code == 200, r.text
        wait_for(lambda: output_state(edge, "hlsfail"), timeout=20)
        sender = Sender(udp, datagrams, seconds)
        sender.start()
        sender.join(timeout=seconds + 30)
        assert not sender.is_alive()
        wait_for(lambda: sink.latest("/up/seg_5.ts") is not None, timeout=10)
        with edge.client() as api:
            assert api.get("/api/v1/stats/hlsfail").json()["data"]["state"] == "Running"
            assert api.delete("/api/v1/flows/hlsfail").status_code == 200
        attempts = [u for u in sink.all_uploads() if u.path == "/up/seg_2.ts"]
        assert len(attempts) == 3 and all(u.status == 500 for u in attempts)  # UPLOAD_ATTEMPTS
        versions, infos = check_stored(sink, "/up/")
        assert "seg_2.ts" not in infos and "seg_3.ts" not in infos and "seg_4.ts" in infos
        text = (sink.latest("/up/index.m3u8") or b"").decode()
        assert "seg_2.ts" not in text
        after = next(v for v in versions if any(e.uri == "seg_4.ts" for e in v.entries))
        assert next(e for e in after.entries if e.uri == "seg_4.ts").discontinuity
    events = hls_events(edge, "hlsfail")
    warnings = [e for e in events if e["severity"] == "warning"]
    assert len(warnings) == 2, events
    assert "seg_2.ts" in warnings[0]["message"] and "HTTP 500" in warnings[0]["message"]
    assert "seg_3.ts" in warnings[1]["message"]
    assert all("secret-server-detail" not in str(e) and TOKEN not in str(e) for e in events)
    assert not any(e["severity"] == "critical" for e in events)
