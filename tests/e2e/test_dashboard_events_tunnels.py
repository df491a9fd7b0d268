"""The manager dashboard's events and tunnels pages in Chromium (issue 21), against a real fleet:
a real ``mp-manager``, a real ``mp-relay`` (``require_bind_auth: true``) and two real ``mp-edge``,
all registered with the manager over the real link (the setup of test_tunnel_pairing_e2e.py).

- Events: the "Node connected to manager" events are listed; filtering by node and severity
  narrows the list and the URL carries the filters (a reload keeps them); critical events (flows
  whose input cannot bind, created through the command route) are acknowledged from the page,
  one by its row button and the rest by "select all" + "Acknowledge selected", and the header's
  unacknowledged count follows.
- Tunnels: the pairing form pairs the two edges through the relay (the relay address prefilled
  from the relay's health), both legs reach Connected on the page, a UDP datagram sent into the
  source's local address comes out at the sink's, and Remove (confirmed) unpairs it: the row
  goes and neither edge nor the relay lists the tunnel any more.
- A viewer sees both pages, with a tunnel listed, but no acknowledgement controls, no pairing
  form and no Remove button; when the sink edge stops, its leg stays listed as the last state it
  reported, marked offline.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.browser import WAIT_MS
from tests.helpers.dashboard import (
    ADMIN_USER,
    PASSWORD,
    DashboardFleet,
    create_node,
    create_user,
    dashboard_fleet,
    edge_manager_block,
    shoot,
    signed_in,
)
from tests.helpers.edge import Edge, free_udp_port, start_edge, wait_for, wait_healthy
from tests.helpers.relay import LOOPBACK, Relay, start_relay, wait_tunnel_delivers

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

API_TOKEN = "relay-api-token-" + "5" * 24
SERVER = {"listen_addr": "127.0.0.1", "listen_port": 8080}  # the flags give the real port
VIEWER = "watcher"


@dataclass
class Fleet:
    base: DashboardFleet
    relay: Relay
    relay_id: str
    source: Edge
    source_id: str
    sink: Edge
    sink_id: str

    @property
    def admin(self) -> httpx.Client:
        return self.base.admin


def online(admin: httpx.Client, node_id: str) -> bool:
    return bool(admin.get(f"/api/v1/nodes/{node_id}").json()["status"] == "online")


def command(admin: httpx.Client, node_id: str, action: dict[str, Any]) -> httpx.Response:
    return admin.post(f"/api/v1/nodes/{node_id}/command", json={"action": action}, timeout=20)


def events(admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    answer = admin.get("/api/v1/events", params={"per_page": 200, **params})
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def unacked(admin: httpx.Client) -> int:
    return int(admin.get("/api/v1/events/count").json()["count"])


def edge_tunnel(edge: Edge, tunnel_id: str) -> int:
    return httpx.get(f"{edge.url}/api/v1/tunnels/{tunnel_id}", timeout=5).status_code


def relay_tunnel_ids(relay: Relay) -> set[str]:
    answer = httpx.get(relay.url + "/api/v1/tunnels", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=5)
    assert answer.status_code == 200, answer.text
    return {t["tunnel_id"] for t in answer.json()["tunnels"]}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path: Path = tmp_path_factory.mktemp("events-tunnels")
    with dashboard_fleet(tmp_path) as base, ExitStack() as stack:
        admin = base.admin
        # The edges start first, without waiting: their start-up overlaps the relay's.
        edges: list[tuple[Edge, str]] = []
        for name in ("edge-source", "edge-sink"):
            node_id, token = create_node(admin, name)
            edge_config = {
                "version": 1,
                "device_name": name,
                "setup_enabled": True,
                "server": SERVER,
                "manager": edge_manager_block(base.manager, token),
            }
            edge = start_edge(tmp_path / name, config=edge_config, wait=False)
            stack.callback(edge.stop)
            edges.append((edge, node_id))
        relay_id, relay_token = create_node(admin, "relay-1", "relay")
        config = tmp_path / "relay" / "relay.json"
        config.parent.mkdir()
        relay_json = {
            "api_token": API_TOKEN,
            "require_bind_auth": True,
            "manager": edge_manager_block(base.manager, relay_token),
        }
        config.write_text(json.dumps(relay_json))
        relay = start_relay(config, *LOOPBACK)
        stack.callback(relay.stop)
        for edge, _ in edges:
            wait_healthy(edge)
        (source, source_id), (sink, sink_id) = edges
        for node_id in (relay_id, source_id, sink_id):
            wait_for(lambda node_id=node_id: online(admin, node_id), timeout=30)
        create_user(admin, VIEWER, "viewer")
        yield Fleet(base, relay, relay_id, source, source_id, sink, sink_id)


def broken_flows(fleet: Fleet) -> None:
    """Three critical events: flows whose input cannot bind (192.0.2.1, TEST-NET-1, is on no
    interface) fail to start; two on the source edge, one on the sink."""
    for node_id, flow_id in ((fleet.source_id, "bad-1"), (fleet.source_id, "bad-2"), (fleet.sink_id, "bad-3")):
        flow = {
            "id": flow_id,
            "name": f"Unbindable {flow_id}",
            "enabled": True,
            "input": {"type": "udp", "bind_addr": f"192.0.2.1:{free_udp_port()}"},
            "outputs": [],
        }
        answer = command(fleet.admin, node_id, {"type": "create_flow", "flow": flow})
        assert answer.status_code in (200, 422), answer.text
    wait_for(lambda: len(events(fleet.admin, severity="critical", category="flow")) >= 3, timeout=20, interval=0.2)


def test_events_page_filters_and_acknowledges(fleet: Fleet) -> None:
    from playwright.sync_api import expect

    broken_flows(fleet)
    names = {fleet.source_id: "edge-source", fleet.sink_id: "edge-sink", fleet.relay_id: "relay-1"}
    total = len(events(fleet.admin))
    before = unacked(fleet.admin)
    assert before >= 3
    with signed_in(fleet.base.manager) as session:
        page = session.page
        page.goto(fleet.base.manager.url + "/events")
        rows = page.locator("#ev-rows tr.ev-row")
        expect(page.locator("#ev-total")).to_have_text(f"{total} events")
        connected = rows.filter(has_text="Node connected to manager")
        expect(connected).to_have_count(3)
        for name in names.values():
            expect(connected.filter(has=page.get_by_role("link", name=name, exact=True))).to_have_count(1)
        expect(page.locator("#unacked-count")).to_have_text(str(before))
        shoot(page, "events")

        # Filter by node: the URL carries it and only that node's rows stay.
        page.select_option("#f-node", fleet.source_id)
        page.wait_for_url(re.compile(rf"node_id={fleet.source_id}"))
        source_count = len(events(fleet.admin, node_id=fleet.source_id))
        expect(page.locator("#ev-total")).to_have_text(f"{source_count} events")
        node_links = rows.locator("td a[href^='/nodes/']")
        expect(node_links).to_have_count(source_count)
        assert set(node_links.all_inner_texts()) == {"edge-source"}

        # ... and by severity; a reload keeps both.
        page.select_option("#f-severity", "critical")
        page.wait_for_url(re.compile(r"severity=critical"))
        expect(rows).to_have_count(2)
        expect(rows.locator(".badge.sev-critical")).to_have_count(2)
        page.reload()
        expect(page.locator("#f-node")).to_have_value(fleet.source_id)
        expect(page.locator("#f-severity")).to_have_value("critical")
        expect(rows).to_have_count(2)
        expect(page.locator("#ev-total")).to_have_text("2 events")

        first = rows.first
        first_id = first.get_attribute("data-id")
        # One acknowledged by its row button, from the keyboard: the focus goes on to the next one.
        first.get_by_role("button", name=re.compile("^Acknowledge event")).focus()
        page.keyboard.press("Enter")
        acked = page.locator(f"#ev-rows tr[data-id='{first_id}']")
        expect(acked.locator(".ev-acked")).to_have_text(f"✓ by {ADMIN_USER}")
        expect(acked.get_by_role("button")).to_have_count(0)
        expect(rows.nth(1).get_by_role("button", name=re.compile("^Acknowledge event"))).to_be_focused()
        expect(page.locator("#unacked-count")).to_have_text(str(before - 1))

        # The rest of the critical events, every node: "select all" + "Acknowledge selected".
        page.select_option("#f-node", "")
        page.wait_for_url(re.compile(r"^(?!.*node_id=).*severity=critical"))
        open_rows = rows.filter(has=page.locator("input.ev-pick"))
        remaining = len([e for e in events(fleet.admin, severity="critical") if not e["acknowledged"]])
        assert remaining >= 2
        expect(open_rows).to_have_count(remaining)
        page.check("#ev-select-all")
        expect(page.locator("#ev-selected")).to_have_text(f"{remaining} selected")
        page.click("#ev-ack-selected")
        expect(page.locator("#ev-ack-progress")).to_have_text(
            f"Acknowledged {remaining} of {remaining}", timeout=WAIT_MS
        )
        expect(page.locator("input.ev-pick")).to_have_count(0)
        expect(rows.locator(".ev-acked")).to_have_count(rows.count())
        after = unacked(fleet.admin)
        assert after == before - 1 - remaining
        if after:
            expect(page.locator("#unacked-count")).to_have_text(str(after))
        else:
            expect(page.locator("#unacked-count")).to_be_hidden()
        critical = events(fleet.admin, severity="critical")
        assert critical and all(e["acknowledged"] and e["acknowledged_by"] == ADMIN_USER for e in critical)

        # The pager (per_page from the URL, so that a few events make several pages).
        total = len(events(fleet.admin))
        pages = -(-total // 5)
        assert pages >= 3
        page.goto(fleet.base.manager.url + "/events?per_page=5")
        expect(page.locator("#ev-page")).to_have_text(f"Page 1 of {pages}")
        expect(rows).to_have_count(5)
        expect(page.locator("#ev-prev")).to_be_disabled()
        page.click("#ev-next")
        page.wait_for_url(re.compile(r"page=2"))
        expect(page.locator("#ev-page")).to_have_text(f"Page 2 of {pages}")
        second = [str(e["id"]) for e in events(fleet.admin, page=2, per_page=5)]
        expect(rows.first).to_have_attribute("data-id", second[0])
        expect(rows).to_have_count(len(second))
        page.click("#ev-prev")
        expect(page.locator("#ev-page")).to_have_text(f"Page 1 of {pages}")
        assert "page=" not in page.url.replace("per_page=", "")
        assert session.problems == []


def test_tunnels_page_pairs_and_removes_a_tunnel(fleet: Fleet) -> None:
    from playwright.sync_api import expect

    entry, delivery = free_udp_port(), free_udp_port()
    sink_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink_socket.bind(("127.0.0.1", delivery))
    sink_socket.settimeout(0.2)
    try:
        with signed_in(fleet.base.manager) as session:
            page = session.page
            page.goto(fleet.base.manager.url + "/tunnels")
            expect(page.locator("#tn-count")).to_have_text("0 tunnels · 0 connected")
            page.fill("#p-name", "Cam 1 to studio")
            page.select_option("#p-protocol", "udp")
            page.select_option("#p-transport", "quic")
            page.select_option("#p-source", fleet.source_id)
            page.select_option("#p-relay", fleet.relay_id)
            page.fill("#p-source-addr", f"127.0.0.1:{entry}")
            page.fill("#p-sink-addr", f"127.0.0.1:{delivery}")
            # The page refuses one edge as both ends before asking the manager.
            page.select_option("#p-sink", fleet.source_id)
            page.click("#pair-submit")
            expect(page.locator("#pair-error")).to_have_text("The source and the sink must be two different edges.")
            expect(page.locator("#p-sink")).to_be_focused()
            page.select_option("#p-sink", fleet.sink_id)
            # Prefilled from the relay's health (quic_addr: the address it bound).
            expect(page.locator("#p-relay-addr")).to_have_value(fleet.relay.quic)
            page.click("#pair-submit")
            # Three commands in turn (relay, sink, source), each up to 10 s on a busy host.
            expect(page.locator("#pair-ok")).to_contain_text("Paired “Cam 1 to studio”", timeout=35_000)
            expect(page.locator("#pair-error")).to_be_hidden()
            tunnel_id = re.search(r"\(([0-9a-f-]{36})\)", page.locator("#pair-ok").inner_text())
            assert tunnel_id is not None
            row = page.locator(f"#tn-rows tr[data-id='{tunnel_id[1]}']")
            expect(row).to_have_attribute("data-connected", "true", timeout=40_000)
            expect(row.locator(".tn-leg .badge")).to_have_text(["Connected", "Connected"])
            expect(row.locator(".tn-leg .tn-node")).to_have_text(["edge-source", "edge-sink"])
            expect(row.locator(".tn-relay")).to_contain_text(fleet.relay.quic)
            expect(row.locator(".tn-relay")).to_contain_text("relay-1")
            expect(page.locator("#tn-count")).to_have_text("1 tunnel · 1 connected")

            # A datagram into the source edge comes out at the sink; the counters show it.
            payload = b"paired from the dashboard " + uuid.uuid4().bytes

            wait_tunnel_delivers(entry, sink_socket, payload)
            expect(row.locator(".tn-totals")).not_to_have_text(re.compile(r"^0 B in"))
            shoot(page, "tunnels")

            # Remove, confirmed in the dialog: the row goes, and nobody lists the tunnel.
            row.get_by_role("button", name="Remove").click()
            expect(page.locator("#remove-dialog")).to_be_visible()
            expect(page.locator("#remove-text")).to_contain_text("Cam 1 to studio")
            page.click("#remove-confirm")
            expect(row).to_have_count(0, timeout=30_000)
            expect(page.locator("#tn-count")).to_have_text("0 tunnels · 0 connected")
            assert edge_tunnel(fleet.source, tunnel_id[1]) == 404
            assert edge_tunnel(fleet.sink, tunnel_id[1]) == 404
            wait_for(lambda: tunnel_id[1] not in relay_tunnel_ids(fleet.relay), timeout=15, interval=0.2)
            # The page found the relay from the legs' relay_addr and revoked the authorisation there.
            wait_for(lambda: f"tunnel {tunnel_id[1]} authorization revoked" in fleet.relay.log(), timeout=10)
            assert session.problems == []
    finally:
        sink_socket.close()


def test_a_viewer_sees_both_pages_without_controls(fleet: Fleet) -> None:
    from playwright.sync_api import expect

    body = {
        "name": "Viewer's view",
        "protocol": "udp",
        "ingress_node_id": fleet.source_id,
        "egress_node_id": fleet.sink_id,
        "ingress_local_addr": f"127.0.0.1:{free_udp_port()}",
        "egress_local_addr": f"127.0.0.1:{free_udp_port()}",
        "relay_node_id": fleet.relay_id,
        "relay_addr": fleet.relay.quic,
    }
    answer = fleet.admin.post("/api/v1/tunnels", json=body, timeout=40)
    assert answer.status_code == 201, answer.text
    tunnel_id = answer.json()["id"]
    try:
        with signed_in(fleet.base.manager, VIEWER, PASSWORD) as session:
            page = session.page
            page.goto(fleet.base.manager.url + "/events")
            expect(page.locator("#ev-rows tr.ev-row").first).to_be_visible()
            expect(page.locator("#ev-rows tr.ev-row").filter(has_text="Node connected to manager")).to_have_count(3)
            for hidden in ("#ev-select-all", "#ev-ack-selected", "input.ev-pick", "button.ev-ack"):
                expect(page.locator(hidden)).to_have_count(0)
            page.goto(fleet.base.manager.url + "/tunnels")
            row = page.locator(f"#tn-rows tr[data-id='{tunnel_id}']")
            expect(row).to_be_visible()
            expect(row.locator(".tn-leg .tn-node")).to_have_text(["edge-source", "edge-sink"])
            for hidden in ("#pair-form", "#remove-dialog", "button.tn-remove"):
                expect(page.locator(hidden)).to_have_count(0)
            expect(page.get_by_role("button", name="Remove")).to_have_count(0)
            expect(row).to_have_attribute("data-connected", "true", timeout=40_000)

            # The sink edge goes away (this module's last test): its leg stays, marked stale with
            # the last state it reported. Its stop closes its relay connection, so the relay tells
            # the source leg its peer is gone (interop.md 8.2: tunnel_waiting) and the source leg,
            # still live, says Waiting. The page settles on both, in whichever order they land.
            fleet.sink.stop()
            expect(row.locator(".tn-leg .badge")).to_have_text(["Waiting", "last: Connected"], timeout=WAIT_MS)
            expect(row.locator(".tn-leg").nth(1).locator(".tn-node-status")).to_have_text("offline")
            expect(row.locator(".tn-leg").nth(0).locator(".tn-node-status")).to_be_hidden()
            expect(row).to_have_attribute("data-connected", "false")
            expect(page.locator("#tn-count")).to_have_text("1 tunnel · 0 connected")
            assert session.problems == []
    finally:
        for node_id in (fleet.source_id, fleet.sink_id):
            command(fleet.admin, node_id, {"type": "delete_tunnel", "tunnel_id": tunnel_id})
        command(fleet.admin, fleet.relay_id, {"type": "revoke_tunnel", "tunnel_id": tunnel_id})
