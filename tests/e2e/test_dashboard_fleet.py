"""The fleet overview page (issue 21) against a real ``mp-manager`` and a real ``mp-edge``.

An admin signs in in Chromium and sees a node created through the API as ``pending``; an edge
then registers over the real link with that node's token (one udp flow fed with valid TS), and
the same page, never reloaded, shows the row ``online`` with its flow counts and bitrate from
``/ws/dashboard``. Search, the status and device-type filters and the sort buttons narrow and
order the rows; ``/`` focuses the search. The admin adds a node through the form (the one-time
token is shown and copied) and deletes it. A viewer sees the same rows and no add or delete
control.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers.dashboard import (
    PASSWORD,
    create_node,
    create_user,
    dashboard_fleet,
    edge_manager_block,
    shoot,
    signed_in,
)
from tests.helpers.edge import Edge, free_port, free_udp_port, start_edge
from tests.helpers.manager import Manager
from tests.helpers.media import TsSource, UdpSink, send_datagrams

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
FEED_PPS = 200.0
FEED_LIMIT_S = 120  # the feeder stops by itself after this, whatever happens to the test


def feed(port: int, stop: threading.Event) -> Iterator[bytes]:
    """Valid TS datagrams (PAT, PMT, video) until ``stop`` is set or FEED_LIMIT_S of them."""
    source = TsSource()
    for _ in range(int(FEED_PPS * FEED_LIMIT_S)):
        if stop.is_set():
            return
        yield source.datagram()


def edge_config(manager: Manager, token: str, port: int, in_port: int, out_port: int) -> dict[str, Any]:
    return {
        "version": 1,
        "device_name": "studio-edge",
        "server": {"listen_addr": "127.0.0.1", "listen_port": port},
        "manager": edge_manager_block(manager, token),
        "flows": [
            {
                "id": "cam1",
                "name": "Camera one",
                "enabled": True,
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{in_port}"},
                "outputs": [{"id": "out1", "name": "Out", "type": "udp", "dest_addr": f"127.0.0.1:{out_port}"}],
            }
        ],
    }


def test_the_fleet_page_follows_a_registering_edge_live(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("fleet")
    with dashboard_fleet(tmp_path) as fleet:
        manager = fleet.manager
        edge_id, token = create_node(fleet.admin, "studio-edge")
        relay_id, _ = create_node(fleet.admin, "spare-relay", "relay")
        edge: Edge | None = None
        stop_feed = threading.Event()
        in_port, out_port, edge_port = free_udp_port(), free_udp_port(), free_port()
        sender = threading.Thread(
            target=send_datagrams, args=(("127.0.0.1", in_port), feed(in_port, stop_feed), FEED_PPS), daemon=True
        )
        try:
            with signed_in(manager) as session, UdpSink(out_port):
                page = session.page
                session.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=manager.url)
                edge_row = page.locator(f"#fleet-body tr[data-node-id='{edge_id}']")
                relay_row = page.locator(f"#fleet-body tr[data-node-id='{relay_id}']")
                expect_text(edge_row.locator(".badge"), "pending")
                expect_text(relay_row.locator(".badge"), "pending")
                expect_text(page.locator("#sum-pending"), "2")
                assert edge_row.locator("a.node-link").get_attribute("href") == f"/nodes/{edge_id}"
                page.evaluate("() => { window.__notReloaded = true; }")

                # The edge registers with the token and runs its flow: the row goes online live.
                sender.start()
                edge = start_edge(
                    tmp_path / "edge", port=edge_port, config=edge_config(manager, token, edge_port, in_port, out_port)
                )
                expect_text(edge_row.locator(".badge"), "online", timeout=40_000)
                expect_text(edge_row.locator("td.flows"), re.compile(r"1/1\s*1 ok"))
                expect_text(edge_row.locator("td.num").nth(1), re.compile(r"[kM]b/s"))
                expect_text(page.locator("#sum-online"), "1")
                expect_text(page.locator("#sum-healthy"), "1")
                expect_text(page.locator("#sum-flows-running"), "1/1")
                expect_text(edge_row.locator("td.mono"), re.compile(r"^\d+\.\d+"))  # the software version
                assert page.evaluate("() => window.__notReloaded === true"), "the page was reloaded"
                assert page.evaluate("() => window.__mpFleetUpdates.length") > 0

                # Search (with the / shortcut), filters and sorting narrow and order the rows.
                page.locator("main h1").click()
                page.keyboard.press("/")
                assert page.evaluate("() => document.activeElement.id") == "fleet-search"
                page.keyboard.type("studio")
                expect_rows(page, [edge_id])
                page.fill("#fleet-search", edge_id[:8])
                expect_rows(page, [edge_id])
                page.fill("#fleet-search", "no-such-node")
                expect_rows(page, [])
                expect_text(page.locator("#fleet-body td.empty"), "No node matches the filters.")
                page.fill("#fleet-search", "")
                page.select_option("#fleet-type", "relay")
                expect_rows(page, [relay_id])
                page.select_option("#fleet-type", "")
                page.select_option("#fleet-status", "online")
                expect_rows(page, [edge_id])
                page.click("#fleet-clear")
                expect_rows(page, [relay_id, edge_id])  # by name: spare-relay, studio-edge
                name_header = page.locator("#fleet-table th[data-key='name']")
                assert name_header.get_attribute("aria-sort") == "ascending"
                name_header.locator("button").focus()
                page.keyboard.press("Enter")
                assert name_header.get_attribute("aria-sort") == "descending"
                expect_rows(page, [edge_id, relay_id])
                page.locator("#sum-nodes button.state-pending").click()  # the summary filters too
                expect_rows(page, [relay_id])
                page.locator("#sum-nodes button.state-pending").click()
                expect_rows(page, [edge_id, relay_id])

                # An admin adds a node: the one-time token is shown, and copied.
                page.click("#add-node-open")
                page.fill("#add-name", "new-edge")
                page.click("#add-submit")
                token_box = page.locator("#add-token")
                token_box.wait_for()
                new_token = token_box.input_value()
                assert UUID.match(new_token), new_token
                page.click("#add-copy")
                expect_text(page.locator("#toasts"), re.compile("Token copied"))
                assert page.evaluate("() => navigator.clipboard.readText()") == new_token
                shoot(page, "fleet-add-node")
                page.click("#add-close")
                new_row = page.locator("#fleet-body tr", has_text="new-edge")
                expect_text(new_row.locator(".badge"), "pending")
                new_id = new_row.get_attribute("data-node-id")
                assert new_id and fleet.admin.get(f"/api/v1/nodes/{new_id}").json()["status"] == "pending"
                shoot(page, "fleet")

                # ... and deletes it (confirmed in a dialog).
                new_row.get_by_role("button", name="Delete").click()
                expect_text(page.locator("#delete-name"), "new-edge")
                page.click("#delete-confirm")
                page.locator(f"#fleet-body tr[data-node-id='{new_id}']").wait_for(state="detached")
                assert fleet.admin.get(f"/api/v1/nodes/{new_id}").status_code == 404
                assert session.problems == []

            # A viewer sees the rows, live, and no add or delete control.
            create_user(fleet.admin, "watcher", "viewer")
            with signed_in(manager, "watcher", PASSWORD) as session:
                page = session.page
                # Connected: online, or degraded while a loaded host makes the flow's health waver.
                connected = re.compile(r"online|degraded")
                expect_text(page.locator(f"#fleet-body tr[data-node-id='{edge_id}'] .badge"), connected)
                expect_rows(page, [relay_id, edge_id])
                assert page.locator("#add-node-open").count() == 0
                assert page.locator("#add-dialog, #delete-dialog").count() == 0
                assert page.locator("#fleet-body button").count() == 0
                assert page.get_by_role("button", name=re.compile("add|delete|token", re.I)).count() == 0
                shoot(page, "fleet-viewer")
                assert session.problems == []
        finally:
            stop_feed.set()
            if edge is not None:
                edge.stop()
            if sender.is_alive():
                sender.join(5)


def expect_text(locator: Any, text: str | re.Pattern[str], timeout: float | None = None) -> None:
    from playwright.sync_api import expect

    expect(locator).to_have_text(text, timeout=timeout)


def expect_rows(page: Any, ids: list[str]) -> None:
    """The table shows exactly these node ids, in this order (waits for the page to catch up)."""
    page.wait_for_function(
        """(ids) => JSON.stringify([...document.querySelectorAll('#fleet-body tr[data-node-id]')]
            .map(tr => tr.dataset.nodeId)) === JSON.stringify(ids)""",
        arg=ids,
    )
