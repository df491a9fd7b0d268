"""The status page on the edge's ``monitor`` listener (interop.md 2), end to end in Chromium.

A real ``mp-edge`` (auth on, so the test also proves the monitor listener needs none)
runs the demo's flow, fed the demo's own ffmpeg H.264 + AAC test stream over RTP. Debian's
chromium (never downloaded; see test_setup_browser.py) loads the page, waits for a live
number to change and for the thumbnail of the stream, and screenshots the page at
1280x800 and at a phone's 390x844 into ``tmp_path/artifacts`` (the paths are printed).
Also: ``GET /api/stats`` is the data of ``GET /api/v1/stats`` without a token, the
listener serves nothing else (no config, no API), nothing listens when ``monitor`` is
unset, and a monitor port that cannot be bound leaves the edge running without the page.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS
from tests.helpers.browser import need_chromium as _need_chromium
from tests.helpers.edge import Edge, auth_section, free_port, free_udp_port, running_edge, wait_for
from tests.helpers.procfs import children, listening_tcp_ports
from tools.demo import FFMPEG as DEMO_FFMPEG
from tools.demo import FLOW as DEMO_FLOW

pytestmark = [pytest.mark.e2e]

TAP_ID = "mp-status-thumbnail"


def _config(monitor_port: int | None, input_port: int, output_port: int) -> dict[str, Any]:
    flow = {
        **DEMO_FLOW,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{input_port}"},
        "outputs": [{"type": "udp", "id": "ts-out", "name": "Raw TS", "dest_addr": f"127.0.0.1:{output_port}"}],
    }
    return {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 18080, "auth": auth_section()},
        "monitor": {"listen_addr": "127.0.0.1", "listen_port": monitor_port} if monitor_port else None,
        "flows": [flow],
    }


@pytest.fixture
def demo_stream() -> Iterator[int]:
    """The demo's ffmpeg test stream, sent to a free port (yielded) until the test ends."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    port = free_udp_port()
    command = [*DEMO_FFMPEG[:-1], f"rtp://127.0.0.1:{port}?pkt_size=1328"]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        yield port
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _running_with_video(edge: Edge) -> bool:
    with edge.client("monitor") as client:
        flow = client.get("/api/v1/stats/demo").json()["data"]
    media = flow.get("media_analysis") or {}
    return flow["state"] == "Running" and bool(media.get("video_streams"))


@pytest.mark.browser
def test_status_page_in_chromium(tmp_path: Path, demo_stream: int) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    monitor_port = free_port()
    monitor = f"http://127.0.0.1:{monitor_port}"
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    with running_edge(tmp_path, config=_config(monitor_port, demo_stream, free_udp_port())) as edge:
        assert listening_tcp_ports(edge.process.pid) == {edge.port, monitor_port}
        wait_for(lambda: _running_with_video(edge), timeout=30, interval=0.5)

        # GET /api/stats: the data of /api/v1/stats, with no token although auth is on.
        assert httpx.get(edge.url + "/api/v1/stats", timeout=10).status_code == 401
        public = httpx.get(monitor + "/api/stats", timeout=10)
        assert public.status_code == 200, public.text
        with edge.client("monitor") as client:
            api = client.get("/api/v1/stats").json()
        body = public.json()
        assert body["success"] is True and api["success"] is True
        assert body["data"].keys() == api["data"].keys() == {"system", "flows"}
        assert body["data"]["system"].keys() == api["data"]["system"].keys()
        assert [f["flow_id"] for f in body["data"]["flows"]] == ["demo"]
        assert body["data"]["flows"][0].keys() == api["data"]["flows"][0].keys()
        assert body["data"]["system"]["version"] == api["data"]["system"]["version"]
        # Read-only, statistics only: no configuration, no API, no mutation.
        for path in ("/api/v1/config", "/api/v1/stats", "/api/v1/flows", "/metrics", "/setup/status"):
            assert httpx.get(monitor + path, timeout=10).status_code == 404, path
        assert httpx.post(monitor + "/api/stats", timeout=10).status_code == 405
        assert "jwt_secret" not in httpx.get(monitor + "/", timeout=10).text

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(WAIT_MS)
                script_errors: list[str] = []
                page.on("pageerror", lambda e: script_errors.append(str(e)))
                response = page.goto(monitor + "/", timeout=WAIT_MS)
                assert response is not None and response.status == 200
                expect(page).to_have_title("Mediaplane edge status", timeout=WAIT_MS)
                card = page.locator("#flow-demo")
                expect(card.locator("h2")).to_have_text("Demo test pattern")
                expect(page.locator("#conn")).to_have_text("live", timeout=WAIT_MS)

                # Live numbers: the packet count changes without a reload.
                packets = card.locator("[data-k=packets]")
                first = packets.inner_text()
                page.wait_for_function(
                    "first => document.querySelector('#flow-demo [data-k=packets]').textContent !== first",
                    arg=first,
                    timeout=WAIT_MS,
                )
                expect(card.locator("[data-k=state]")).to_have_text("Running")
                # A loaded test machine may show PCR accuracy warnings: any health, shown as a badge.
                expect(card.locator("[data-k=health]")).to_have_text(re.compile("^(Healthy|Warning|Error|Critical)$"))
                expect(card.locator("[data-ind=cc_errors]")).to_contain_text("continuity count error")
                expect(card.locator(".media")).to_contain_text("1280x720")
                expect(card.locator(".outs")).to_contain_text("Raw TS")
                expect(card.locator(".outs")).not_to_contain_text("thumbnail")  # the tap stays hidden

                # The thumbnail of the demo stream, decoded out of the data path.
                page.wait_for_function(
                    "() => { const i = document.querySelector('#flow-demo img[data-thumb]');"
                    " return i && !i.hidden && i.complete && i.naturalWidth > 0; }",
                    timeout=45_000,
                )
                size = page.evaluate(
                    "() => { const i = document.querySelector('#flow-demo img[data-thumb]');"
                    " return [i.naturalWidth, i.naturalHeight]; }"
                )
                assert size == [320, 180], size
                assert len(children(edge.process.pid, comm="ffmpeg")) == 1  # one decoder for the one flow
                # The demo's 1 kHz tone has a level (the same ffmpeg measures each audio PID).
                expect(card.locator(".media .level")).to_contain_text("dBFS", timeout=WAIT_MS)
                page.wait_for_timeout(1500)  # a sparkline with a few points
                wide = artifacts / "status-1280x800.png"
                page.screenshot(path=str(wide))

                page.set_viewport_size({"width": 390, "height": 844})
                page.wait_for_timeout(1200)
                # On a phone: one column, nothing wider than the screen.
                assert page.evaluate("document.documentElement.scrollWidth") <= 390
                expect(card.locator("img[data-thumb]")).to_be_visible()
                phone = artifacts / "status-390x844.png"
                page.screenshot(path=str(phone), full_page=True)
                for shot in (wide, phone):
                    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
                    print(f"status page screenshot: {shot}")
                assert script_errors == []
            finally:
                browser.close()

        # The last viewer gone, the decoding stops: no ffmpeg is left under the edge.
        wait_for(lambda: not children(edge.process.pid, comm="ffmpeg"), timeout=10, interval=0.2)
        # The tap is never configuration: it is not in the config or the stats.
        with edge.client("admin") as admin:
            config = admin.get("/api/v1/config").json()["data"]
            stats = admin.get("/api/v1/stats/demo").json()["data"]
        assert [o["id"] for o in config["flows"][0]["outputs"]] == ["ts-out"]
        assert [o["output_id"] for o in stats["outputs"]] == ["ts-out"]
        assert TAP_ID not in (edge.config_dir / "config.json").read_text()


def test_no_monitor_listener_when_unset(tmp_path: Path) -> None:
    with running_edge(tmp_path, config=_config(None, free_udp_port(), free_udp_port())) as edge:
        assert listening_tcp_ports(edge.process.pid) == {edge.port}
        assert httpx.get(edge.url + "/api/stats", timeout=10).status_code == 404
        assert "status page" not in edge.log()


def test_monitor_port_taken_leaves_the_edge_running(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with running_edge(tmp_path, config=_config(port, free_udp_port(), free_udp_port())) as edge:
            assert httpx.get(edge.url + "/health", timeout=10).status_code == 200
            wait_for(lambda: "status page: cannot listen on 127.0.0.1:" in edge.log(), timeout=10)
            assert listening_tcp_ports(edge.process.pid) == {edge.port}
