"""Roles in the dashboard (issue 21): a viewer sees the pages read-only, and every action it
cannot take is refused by the server too.

A real ``mp-manager`` and a real ``mp-edge`` registered through the link. A ``viewer`` limited to
that edge signs in in Chromium: every page it may open shows its data and no control that
changes anything (no start/stop, editor, acknowledge, pairing or admin form); the admin pages
answer the 403 page; a second node it was not given appears nowhere. Then, from the viewer's
own page (its cookie and CSRF token, as a forged button would send them), each action of the
operator and admin roles goes to the API and is answered 403.
"""

from __future__ import annotations

import re
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
from tests.helpers.edge import Edge, free_udp_port, start_edge, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

ACTION_WORDS = re.compile(
    r"\b(start|stop|restart|add|remove|delete|ack|acknowledge|pair|save|send|create|upload|edit|validate|"
    r"disable|enable|reset|token)\b",
    re.IGNORECASE,
)


CONNECTED = {"online", "degraded", "error"}  # an input with no source yet makes the node `error`


@dataclass
class World:
    fleet: DashboardFleet
    edge: Edge
    edge_id: str
    hidden_id: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp_path = tmp_path_factory.mktemp("roles")
    with dashboard_fleet(tmp_path) as fleet:
        edge_id, token = create_node(fleet.admin, "studio-edge")
        hidden_id, _ = create_node(fleet.admin, "secret-edge")
        config = {
            "version": 1,
            "device_name": "studio-edge",
            "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
            "manager": edge_manager_block(fleet.manager, token),
            "flows": [
                {
                    "id": "cam1",
                    "name": "Camera one",
                    "enabled": True,
                    "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
                    "outputs": [{"id": "out1", "name": "Out", "type": "udp", "dest_addr": "127.0.0.1:9"}],
                }
            ],
        }
        edge = start_edge(tmp_path / "edge", config=config)
        try:
            wait_for(lambda: fleet.admin.get(f"/api/v1/nodes/{edge_id}").json()["status"] in CONNECTED, timeout=30)
            create_user(fleet.admin, "watcher", "viewer", allowed_node_ids=[edge_id])
            create_user(fleet.admin, "oper", "operator")
            yield World(fleet, edge, edge_id, hidden_id)
        finally:
            edge.stop()


def action_controls(page: Any) -> list[str]:
    """The visible, enabled buttons and submit inputs whose label names an action that changes
    state ("Apply" is left out: the events page applies its filters with it)."""
    labels: list[str] = page.evaluate(
        """() => [...document.querySelectorAll('main button, main input[type=submit], main [role=button]')]
            .filter(b => !b.disabled && b.offsetParent !== null)
            .map(b => (b.textContent || b.value || b.getAttribute('aria-label') || '').trim())"""
    )
    return [label for label in labels if ACTION_WORDS.search(label)]


def test_a_viewer_sees_read_only_pages(world: World) -> None:
    manager = world.fleet.manager
    with signed_in(manager, "watcher", PASSWORD) as session:
        page = session.page
        page.wait_for_selector(f"a[href='/nodes/{world.edge_id}']")
        assert page.locator(f"a[href='/nodes/{world.hidden_id}']").count() == 0  # not its node
        assert action_controls(page) == []
        # Each page once its data is in (the events list; the live stream; the node's flow).
        loaded = {
            "/events": "text=Node connected to manager",
            "/tunnels": "#live-indicator[data-state='live']",
            f"/nodes/{world.edge_id}": "text=Camera one",
        }
        for path, ready in loaded.items():
            page.goto(manager.url + path)
            page.locator(ready).first.wait_for()
            if path.startswith("/nodes/"):
                assert page.locator("textarea:visible").count() == 0  # no config editor
            assert action_controls(page) == [], path
        shoot(page, "viewer-node")
        for path in ("/users", "/settings", "/assistant"):
            answer = page.goto(manager.url + path)
            assert answer is not None and answer.status == 403, path
            assert page.get_by_role("heading", name="Not allowed").is_visible()
        # A node it was not given: the page opens, the API behind it refuses.
        page.goto(manager.url + f"/nodes/{world.hidden_id}")
        assert page.evaluate(f"async () => (await MP.api('GET', '/api/v1/nodes/{world.hidden_id}')).status") == 403
        assert session.problems == [] or all("403" in p for p in session.problems), session.problems


FORBIDDEN_TO_VIEWERS: list[tuple[str, str, Any]] = [
    ("POST", "/api/v1/nodes/{edge}/command", {"action": {"type": "stop_flow", "flow_id": "cam1"}}),
    ("POST", "/api/v1/nodes/{edge}/command", {"action": {"type": "add_output", "flow_id": "cam1", "output": {}}}),
    ("GET", "/api/v1/nodes/{edge}/config", None),
    ("PUT", "/api/v1/nodes/{edge}/config", {"version": 1, "flows": []}),
    ("POST", "/api/v1/events/1/ack", None),
    ("POST", "/api/v1/tunnels", {"name": "t"}),
    ("POST", "/api/v1/ai/keys", {"provider": "openai", "api_key": "k"}),
    ("POST", "/api/v1/ai/generate-config", {"prompt": "p"}),
]
FORBIDDEN_TO_OPERATORS: list[tuple[str, str, Any]] = [
    ("POST", "/api/v1/nodes", {"name": "n"}),
    ("DELETE", "/api/v1/nodes/{edge}", None),
    ("POST", "/api/v1/nodes/{edge}/token", None),
    ("GET", "/api/v1/users", None),
    ("POST", "/api/v1/users", {"username": "x", "password": "Abcdefg1", "role": "viewer"}),
    ("GET", "/api/v1/settings", None),
    ("PUT", "/api/v1/settings", {"settings": {"events_retention_days": 2}}),
    ("POST", "/api/v1/settings/tls/upload", {"cert_pem": "", "key_pem": ""}),
    ("GET", "/api/v1/export", None),
]


@pytest.mark.parametrize(
    ("username", "refused"),
    [("watcher", FORBIDDEN_TO_VIEWERS + FORBIDDEN_TO_OPERATORS), ("oper", FORBIDDEN_TO_OPERATORS)],
)
def test_the_server_refuses_what_the_role_does_not_allow(
    world: World, username: str, refused: list[tuple[str, str, Any]]
) -> None:
    manager = world.fleet.manager
    with signed_in(manager, username, PASSWORD) as session:
        for method, path, body in refused:
            url = path.format(edge=world.edge_id)
            status = session.page.evaluate(
                "async ([m, u, b]) => (await MP.api(m, u, b === null ? undefined : b)).status", [method, url, body]
            )
            assert status == 403, (username, method, url)
    # Nothing changed on the edge: its flow still runs with its one output.
    flow = httpx.get(f"{world.edge.url}/api/v1/flows/cam1", timeout=10).json()["data"]
    assert [output["id"] for output in flow["outputs"]] == ["out1"]
    assert world.fleet.admin.get(f"/api/v1/nodes/{world.edge_id}").json()["status"] in CONNECTED


def test_a_viewer_changes_nothing_through_the_stream(world: World, tmp_path: Path) -> None:
    """Client frames on /ws/dashboard are ignored (interop.md 6): the socket is push-only."""
    with signed_in(world.fleet.manager, "watcher", PASSWORD) as session:
        got = session.page.evaluate(
            """() => new Promise((resolve) => {
                const ws = new WebSocket(`wss://${location.host}/ws/dashboard`);
                let frames = 0;
                const forged = {type: "command", payload: {action: {type: "stop_flow", flow_id: "cam1"}}};
                ws.onopen = () => ws.send(JSON.stringify(forged));
                ws.onmessage = () => { frames += 1; if (frames === 2) { ws.close(); resolve(frames); } };
                setTimeout(() => resolve(frames), 8000);
            })"""
        )
        assert got == 2
    assert httpx.get(f"{world.edge.url}/api/v1/flows/cam1", timeout=10).json()["data"]["outputs"]
