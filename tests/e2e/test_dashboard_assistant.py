"""The dashboard's assistant page (issue 21, interop.md 7.6), in Debian's Chromium against a real
``mp-manager`` whose OpenAI base URL points at a local fake provider, and a real ``mp-edge``
registered through the link with one flow.

Before a key is stored the page shows the manager's "No openai API key configured" error; the
key is added on the page (and never shown back). A proposal (``update_flow`` renaming the flow
and adding an output) is shown as a diff of the node's flow config and reaches the edge only on
Apply (checked on the edge's own REST API); a second proposal (``create_flow``) is discarded and
the edge is unchanged. The Ask box shows the provider's reply text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.helpers.dashboard import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    DashboardFleet,
    create_node,
    dashboard_fleet,
    edge_manager_block,
    shoot,
    signed_in,
)
from tests.helpers.edge import Edge, free_udp_port, start_edge, wait_for
from tests.helpers.fake_ai import FakeAi
from tests.helpers.manager import manager_env

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

API_KEY = "sk-fake-" + "9" * 24
CONNECTED = {"online", "degraded", "error"}  # an input with no source yet makes the node `error`


@dataclass
class World:
    fleet: DashboardFleet
    fake: FakeAi
    edge: Edge
    edge_id: str
    flow: dict[str, Any]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp_path = tmp_path_factory.mktemp("assistant")
    with FakeAi("openai") as fake:
        env = manager_env(MEDIAPLANE_OPENAI_BASE_URL=fake.base_url)
        with dashboard_fleet(tmp_path, env=env) as fleet:
            edge_id, token = create_node(fleet.admin, "studio-edge")
            flow = {
                "id": "cam1",
                "name": "Camera one",
                "enabled": True,
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
                "outputs": [{"id": "out1", "name": "Out", "type": "udp", "dest_addr": "127.0.0.1:9"}],
            }
            config = {
                "version": 1,
                "device_name": "studio-edge",
                "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
                "manager": edge_manager_block(fleet.manager, token),
                "flows": [flow],
            }
            edge = start_edge(tmp_path / "edge", config=config)
            try:
                wait_for(lambda: fleet.admin.get(f"/api/v1/nodes/{edge_id}").json()["status"] in CONNECTED, timeout=30)
                yield World(fleet, fake, edge, edge_id, flow)
            finally:
                edge.stop()


def edge_flow(edge: Edge, flow_id: str) -> dict[str, Any] | None:
    answer = httpx.get(f"{edge.url}/api/v1/flows/{flow_id}", timeout=5)
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()["data"]
    return data


def edge_flow_ids(edge: Edge) -> list[str]:
    answer = httpx.get(f"{edge.url}/api/v1/flows", timeout=5)
    assert answer.status_code == 200, answer.text
    return [flow["id"] for flow in answer.json()["data"]["flows"]]


def test_the_assistant_proposes_and_applies_only_on_apply(world: World) -> None:
    from playwright.sync_api import expect

    manager, fake, edge = world.fleet.manager, world.fake, world.edge
    with signed_in(manager, ADMIN_USER, ADMIN_PASSWORD) as session:
        page = session.page
        landed = len(session.problems)  # what the fleet page (another page) logged is not this test's
        page.goto(manager.url + "/assistant")
        expect(page.locator(f"#gen-node option[value='{world.edge_id}']")).to_have_count(1)
        expect(page.locator("#gen-node")).to_have_value(world.edge_id)
        expect(page.locator("#gen-provider")).to_have_value("openai")
        expect(page.locator("#keys-body tr[data-provider='openai']")).to_have_attribute("data-configured", "false")

        # No key yet: the manager's error, plainly.
        page.fill("#gen-prompt", "Rename cam1 and add an output to 127.0.0.1:9002")
        page.click("#gen-submit")
        expect(page.locator("#gen-error")).to_have_text("No openai API key configured. Add one under AI Keys.")
        assert fake.requests == []
        expect(page.locator("#proposal")).to_be_hidden()

        # The key, added on the page: shown as configured, never shown back.
        page.select_option("#key-provider", "openai")
        page.fill("#key-value", API_KEY)
        page.click("#key-save")
        expect(page.locator("#keys-body tr[data-provider='openai']")).to_have_attribute("data-configured", "true")
        expect(page.locator("#keys-body tr[data-provider='openai']")).to_contain_text("configured")
        expect(page.locator("#key-value")).to_have_value("")
        assert API_KEY not in page.content()

        # Proposal 1: update_flow (a new name, a second output), built on the flow as the edge
        # holds it (the provider is shown the node's config). Shown as a diff, not applied.
        updated = edge_flow(edge, "cam1")
        assert updated is not None
        updated["name"] = "Camera one (main)"
        updated["outputs"].append({"id": "out2", "name": "Backup", "type": "udp", "dest_addr": "127.0.0.1:9002"})
        fake.reply_text = json.dumps(
            {"action": "update_flow", "flow": updated, "message": "Renamed cam1 and added a backup output."}
        )
        page.click("#gen-submit")
        expect(page.locator("#proposal-message")).to_have_text("Renamed cam1 and added a backup output.")
        assert fake.requests[-1].headers["authorization"] == f"Bearer {API_KEY}"
        assert fake.requests[-1].body["messages"][-1]["content"].startswith("Rename cam1")
        diff = page.locator("#proposal-diff")
        expect(diff.locator(".add", has_text='"name": "Camera one (main)"')).to_have_count(1)
        expect(diff.locator(".del", has_text='"name": "Camera one"')).to_have_count(1)
        expect(diff.locator(".add", has_text='"dest_addr": "127.0.0.1:9002"')).to_have_count(1)
        expect(diff.locator(".del")).to_have_count(1)  # only the old name: no noise from key order or nulls
        folded = diff.locator(".ctx").count()
        assert diff.locator(".gap").count() >= 1  # unchanged runs folded ...
        page.check("#diff-whole")  # ... or the whole config
        expect(diff.locator(".gap")).to_have_count(0)
        assert diff.locator(".ctx").count() > folded
        expect(diff.locator(".del")).to_have_count(1)
        page.uncheck("#diff-whole")
        expect(diff.locator(".ctx")).to_have_count(folded)
        expect(page.locator("#proposal-steps")).to_contain_text("Replace the config of flow cam1 (Camera one)")
        expect(page.locator("#proposal-state")).to_have_text("Not applied")
        flow = edge_flow(edge, "cam1")
        assert flow is not None and flow["name"] == "Camera one"  # nothing applied yet
        shoot(page, "assistant")

        page.click("#proposal-apply")
        expect(page.locator("#proposal-state")).to_have_text("Applied")
        expect(page.locator("#apply-results")).to_contain_text("update_flow: done")
        flow = edge_flow(edge, "cam1")
        assert flow is not None
        assert flow["name"] == "Camera one (main)"
        assert [output["id"] for output in flow["outputs"]] == ["out1", "out2"]
        expect(page.locator("#proposal-apply")).to_be_hidden()

        # Proposal 2: create_flow, discarded: the edge is unchanged.
        new_flow = {
            "id": "cam2",
            "name": "Camera two",
            "enabled": False,
            "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
            "outputs": [],
        }
        fake.reply_text = (
            "```json\n"
            + json.dumps({"action": "create_flow", "flow": new_flow, "message": "A second camera."})
            + "\n```"
        )
        page.fill("#gen-prompt", "Add a second camera on UDP")
        page.click("#gen-submit")
        expect(page.locator("#proposal-message")).to_have_text("A second camera.")
        expect(diff.locator(".add", has_text='"id": "cam2"')).to_have_count(1)
        expect(diff.locator(".del")).to_have_count(0)
        page.click("#proposal-discard")
        expect(page.locator("#proposal-state")).to_have_text("Discarded")
        expect(page.locator("#apply-results")).to_contain_text("nothing was sent")
        assert edge_flow_ids(edge) == ["cam1"]
        assert edge_flow(edge, "cam2") is None

        # An info answer is only a message; a bad action is not offered for Apply.
        fake.reply_text = "Your flows look fine."
        page.click("#gen-submit")
        expect(page.locator("#proposal-message")).to_have_text("Your flows look fine.")
        expect(page.locator("#proposal-state")).to_have_text("Info")
        expect(page.locator("#proposal-apply")).to_be_hidden()

        # Ask: the reply text, as text.
        fake.reply_text = "One edge, studio-edge: <b>online</b>."
        page.fill("#ask-query", "How is the fleet?")
        page.click("#ask-submit")
        expect(page.locator("#ask-answer")).to_have_text("One edge, studio-edge: <b>online</b>.")
        assert fake.requests[-1].body["messages"][-1]["content"] == "How is the fleet?"
        assert edge_flow_ids(edge) == ["cam1"]
        # the 400 of "no key" is logged by Chromium as a failed resource: expected
        assert [p for p in session.problems[landed:] if "status of 400 " not in p] == []
