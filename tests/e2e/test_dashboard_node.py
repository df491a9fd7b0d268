"""The node detail page (issue 21) against a real ``mp-manager`` and a real ``mp-edge`` registered
over the real link, its one ``udp`` flow fed real MPEG-TS (H.264 + AAC made by ffmpeg, sent by
ffmpeg ``-re`` over UDP, looped) with one ``udp`` output.

As the super_admin in Chromium: the flow card shows Running with a non-zero input bit rate, the
media (codec, resolution) and a drawn bit-rate chart; Stop and Start from the page change the
state the stream reports; an output added through the form is listed (and by the edge's own
API), then removed after a confirmation; the config editor validates an edit (the diff shown),
sends it and the edge applies it, and invalid JSON is refused in the page with nothing sent.
A viewer sees the same live page with no command, output or editor control, and the page
never asks for the (operator-only) config. A real ``mp-relay`` registered the same way gets a
page of its live statistics and health, with no flows.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.dashboard import (
    PASSWORD,
    DashboardFleet,
    create_node,
    create_user,
    dashboard_fleet,
    edge_manager_block,
    shoot,
    signed_in,
)
from tests.helpers.edge import Edge, free_port, free_udp_port, start_edge, wait_for
from tests.helpers.media import UdpSink
from tests.helpers.relay import LOOPBACK, Relay, start_relay
from tests.helpers.tools import need_tool

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

WIDTH, HEIGHT = 320, 240
FEED_LIMIT_S = 180  # the feeder ends by itself after this, whatever happens to the test


@dataclass
class NodeFleet:
    fleet: DashboardFleet
    edge: Edge
    node_id: str
    relay: Relay
    relay_id: str

    def edge_flow(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.edge.url}/api/v1/flows/cam1", timeout=5)
        assert answer.status_code == 200, answer.text
        flow: dict[str, Any] = answer.json()["data"]
        return flow


@pytest.fixture(scope="module")
def source_ts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 s of H.264 (no B-frames) and AAC in TS: small and quick to make."""
    path = tmp_path_factory.mktemp("node-src") / "src.ts"
    subprocess.run(
        [
            need_tool("ffmpeg"), "-nostdin", "-v", "error", "-y",
            "-f", "lavfi", "-i", f"testsrc2=size={WIDTH}x{HEIGHT}:rate=25",
            "-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000",
            "-t", "4", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0", "-g", "25", "-b:v", "600k",
            "-c:a", "aac", "-b:a", "64k", "-f", "mpegts", str(path),
        ],
        check=True,
        timeout=60,
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def node_fleet(tmp_path_factory: pytest.TempPathFactory, source_ts: Path) -> Iterator[NodeFleet]:
    tmp_path = tmp_path_factory.mktemp("node")
    with dashboard_fleet(tmp_path) as fleet:
        node_id, token = create_node(fleet.admin, "studio-edge")
        in_port, out_port, edge_port = free_udp_port(), free_udp_port(), free_port()
        config = {
            "version": 1,
            "device_name": "studio-edge",
            "server": {"listen_addr": "127.0.0.1", "listen_port": edge_port},
            "manager": edge_manager_block(fleet.manager, token),
            "flows": [
                {
                    "id": "cam1",
                    "name": "Camera one",
                    "input": {"type": "udp", "bind_addr": f"127.0.0.1:{in_port}"},
                    "outputs": [
                        {"id": "out1", "name": "To studio", "type": "udp", "dest_addr": f"127.0.0.1:{out_port}"}
                    ],
                }
            ],
        }
        feeder = subprocess.Popen(
            [need_tool("ffmpeg"), "-nostdin", "-v", "error", "-re", "-stream_loop", "-1", "-i", str(source_ts),
             "-t", str(FEED_LIMIT_S), "-c", "copy", "-f", "mpegts", f"udp://127.0.0.1:{in_port}?pkt_size=1316"],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        relay_id, relay_token = create_node(fleet.admin, "relay-east", "relay")
        relay_config = tmp_path / "relay" / "relay.json"
        relay_config.parent.mkdir()
        relay_manager = edge_manager_block(fleet.manager, relay_token)
        relay_json = {"api_token": "relay-api-token-" + "5" * 24, "manager": relay_manager}
        relay_config.write_text(json.dumps(relay_json))
        edge: Edge | None = None
        relay: Relay | None = None
        try:
            with UdpSink(out_port):
                relay = start_relay(relay_config, *LOOPBACK)
                edge = start_edge(tmp_path / "edge", port=edge_port, config=config)
                for node in (node_id, relay_id):
                    wait_for(
                        lambda node=node: fleet.admin.get(f"/api/v1/nodes/{node}").json()["status"] == "online",
                        timeout=40,
                        interval=0.2,
                    )
                yield NodeFleet(fleet, edge, node_id, relay, relay_id)
        finally:
            feeder.kill()
            feeder.wait(5)
            if edge is not None:
                edge.stop()
            if relay is not None:
                relay.stop()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def test_an_operator_runs_the_flow_from_the_node_page(node_fleet: NodeFleet) -> None:
    manager = node_fleet.fleet.manager
    with signed_in(manager) as session:
        page = session.page
        config_puts: list[str] = []
        page.on("request", lambda r: config_puts.append(r.url) if r.method == "PUT" and "/config" in r.url else None)
        page.goto(f"{manager.url}/nodes/{node_fleet.node_id}")
        expect(page.locator("#node-name")).to_have_text("studio-edge")
        expect(page.locator("#node-status")).to_have_text("online")
        expect(page.locator("#fact-version")).to_have_text(re.compile(r"^\d+\.\d+"))
        card = page.locator("#flow-cam1")
        state = card.locator(".flow-head .badge").first
        expect(state).to_have_text("Running", timeout=30_000)
        expect(card.locator(".input-bitrate")).to_have_text(re.compile(r"^[\d.]+ [kM]b/s$"), timeout=30_000)
        expect(card.locator(".media-video")).to_contain_text(f"{WIDTH}x{HEIGHT}", timeout=30_000)
        expect(card.locator(".media-video")).to_contain_text(re.compile("H264|H\\.264", re.I))
        expect(card.locator(".media-audio")).to_contain_text(re.compile("AAC", re.I))
        expect(card.locator(".tr-flags")).to_contain_text("P1 OK")
        expect(card.locator("tr[data-output-id='out1']")).to_contain_text("To studio")
        # The chart: uPlot drew its canvas from samples gathered in the page (some seconds' worth).
        expect(card.locator(".flow-chart .uplot canvas")).to_be_visible()
        page.wait_for_function(
            "() => Number(document.querySelector('#flow-cam1 .flow-chart').dataset.points) >= 3", timeout=30_000
        )
        assert page.evaluate("() => Math.max(...window.__mpNode.series.get('cam1').input)") > 0
        expect(page.locator("#events-body")).to_contain_text("Node connected to manager")
        shoot(page, "node")

        # Stop and start from the page: the command's answer is shown, the stream follows.
        card.locator("button[data-action='stop_flow']").click()
        expect(card.locator(".cmd-result")).to_have_text("Stop: ok")
        expect(state).to_have_text("Stopped")
        expect(card.locator("button[data-action='stop_flow']")).to_be_disabled()
        card.locator("button[data-action='start_flow']").click()
        expect(card.locator(".cmd-result")).to_have_text("Start: ok")
        expect(state).to_have_text("Running")
        expect(card.locator(".input-bitrate")).to_have_text(re.compile(r"^[\d.]+ [kM]b/s$"))

        # Add an output through the form: listed by the page and by the edge itself; then remove it.
        extra_port = free_udp_port()
        card.locator(".add-output summary").click()
        card.locator("input[name='id']").fill("extra")
        card.locator("input[name='name']").fill("Extra copy")
        card.locator("input[name='port']").fill(str(extra_port))
        card.get_by_role("button", name="Add output").click()
        expect(card.locator(".cmd-result")).to_have_text("Add output extra: ok")
        row = card.locator("tr[data-output-id='extra']")
        expect(row).to_contain_text("Extra copy")
        outputs = {o["id"]: o for o in node_fleet.edge_flow()["outputs"]}
        assert outputs["extra"]["dest_addr"] == f"127.0.0.1:{extra_port}" and outputs["extra"]["type"] == "udp"
        shoot(page, "node-output-added")
        # An output the node refuses: the error text is shown, nothing is listed.
        card.locator("input[name='id']").fill("broken")
        card.locator("input[name='name']").fill("Broken")
        card.locator("select[name='type']").select_option("json")
        card.locator("textarea[name='json']").fill('{"type": "udp", "dest_addr": "not-an-address"}')
        card.get_by_role("button", name="Add output").click()
        expect(card.locator(".cmd-result")).to_contain_text("Add output broken failed (4")
        expect(card.locator(".add-output-form .form-error")).to_contain_text("refused")
        expect(card.locator("tr[data-output-id='broken']")).to_have_count(0)
        row.get_by_role("button", name="Remove output extra").click()
        expect(page.locator("#confirm-dialog")).to_be_visible()
        expect(page.locator("#confirm-text")).to_contain_text("extra")
        page.click("#confirm-yes")
        expect(row).to_have_count(0)
        assert [o["id"] for o in node_fleet.edge_flow()["outputs"]] == ["out1"]

        # The config editor: an edit is validated (diff shown), sent and applied by the edge.
        editor = page.locator("#config-text")
        expect(editor).not_to_have_value("")
        loaded = json.loads(editor.input_value())
        assert loaded["flows"][0]["id"] == "cam1"
        edited = json.loads(json.dumps(loaded))
        edited["flows"][0]["name"] = "Camera renamed"
        editor.fill(json.dumps(edited, indent=2))
        expect(page.locator("#config-send")).to_be_disabled()
        page.click("#config-validate")
        expect(page.locator("#config-status")).to_contain_text("Valid")
        diff = page.locator("#config-diff")
        expect(diff).to_be_visible()
        expect(diff.locator(".add")).to_contain_text('"name": "Camera renamed"')
        expect(diff.locator(".del")).to_contain_text('"name": "Camera one"')
        shoot(page, "node-config-diff")
        assert config_puts == []
        page.click("#config-send")
        page.click("#confirm-yes")
        expect(page.locator("#config-status")).to_contain_text("Sent", timeout=30_000)
        assert len(config_puts) == 1
        wait_for(lambda: node_fleet.edge_flow()["name"] == "Camera renamed", timeout=10, interval=0.2)
        expect(card.locator("h3")).to_contain_text("Camera renamed")
        expect(state).to_have_text("Running")

        # Invalid JSON and a broken structure are refused in the page: nothing is sent.
        editor.fill('{"version": 1, "flows": [')
        page.click("#config-validate")
        expect(page.locator("#config-status")).to_contain_text("Invalid JSON")
        expect(page.locator("#config-send")).to_be_disabled()
        expect(diff).to_be_hidden()
        # Valid JSON the edge's model refuses (the manager's check, nothing sent).
        bogus = json.loads(json.dumps(loaded))
        bogus["flows"][0]["input"]["type"] = "carrier-pigeon"
        editor.fill(json.dumps(bogus, indent=2))
        page.click("#config-validate")
        expect(page.locator("#config-status")).to_contain_text("would refuse")
        expect(page.locator("#config-problems")).to_contain_text("flows")
        expect(page.locator("#config-send")).to_be_disabled()
        twice = json.loads(json.dumps(loaded))
        twice["flows"].append(dict(twice["flows"][0]))
        editor.fill(json.dumps(twice))
        page.click("#config-validate")
        expect(page.locator("#config-problems")).to_contain_text('"cam1" is used by another flow')
        expect(page.locator("#config-send")).to_be_disabled()
        assert len(config_puts) == 1
        assert node_fleet.edge_flow()["name"] == "Camera renamed"
        # The one refused output above is Chromium's "Failed to load resource ... 422": expected.
        refused = [p for p in session.problems if "status of 422 " in p]
        assert len(refused) == 1
        assert [p for p in session.problems if p not in refused] == []


def test_a_viewer_sees_the_node_page_without_controls(node_fleet: NodeFleet) -> None:
    manager = node_fleet.fleet.manager
    create_user(node_fleet.fleet.admin, "watcher", "viewer")
    with signed_in(manager, "watcher", PASSWORD) as session:
        page = session.page
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/config" in r.url else None)
        page.goto(f"{manager.url}/nodes/{node_fleet.node_id}")
        card = page.locator("#flow-cam1")
        expect(card.locator(".flow-head .badge").first).to_have_text("Running", timeout=30_000)
        expect(card.locator(".input-bitrate")).to_have_text(re.compile(r"^[\d.]+ [kM]b/s$"), timeout=30_000)
        expect(card.locator("tr[data-output-id='out1']")).to_be_visible()
        expect(page.locator("#events-body tr").first).to_be_visible()
        assert page.locator("main button").count() == 0
        assert page.locator(".add-output, #config-section, #config-text").count() == 0
        controls = re.compile("start|stop|restart|remove|add|send|validate", re.I)
        assert page.get_by_role("button", name=controls).count() == 0
        shoot(page, "node-viewer")

        # A relay's page: its live statistics and health, plainly; no flows.
        page.goto(f"{manager.url}/nodes/{node_fleet.relay_id}")
        expect(page.locator("#node-name")).to_have_text("relay-east")
        expect(page.locator("#node-type")).to_have_text("Relay")
        expect(page.locator("#relay-health")).to_contain_text("quic addr", timeout=30_000)
        expect(page.locator("#relay-stats table")).to_be_visible(timeout=30_000)
        expect(page.locator("#flows-section")).to_be_hidden()
        expect(page.locator("#tunnels-section")).to_be_hidden()
        assert page.locator("main button").count() == 0
        shoot(page, "node-relay")
        assert asked == []
        assert session.problems == []
