"""First boot through the setup wizard, end to end: a person links a fresh edge to a manager.

The real ``mp-manager`` (its own self-signed certificate) and a fresh real ``mp-edge``
(``setup_enabled: true``, no manager) on loopback. In Debian's headless chromium the person
fills the wizard (manager URL, the registration token the manager gave, "accept a self-signed
certificate", device name) and saves; the page says what happens next. The edge is restarted
as the page says; it registers over WSS (``MEDIAPLANE_ALLOW_INSECURE=1`` lets it accept the
self-signed certificate), the manager shows it online, and ``/setup`` now shows that the node
is managed: its node id, the manager URL, the link connected. ``mp manager status`` and the
edge's ``manager`` events say the same.

Chromium is Debian's and is never downloaded (launch options and the CI rule of
``test_setup_browser.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.helpers import Mp
from tests.e2e.test_setup_browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, _need_chromium
from tests.helpers.edge import Edge, auth_section, running_edge, start_edge, wait_for
from tests.helpers.manager import login, setup_super_admin, start_manager

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

INSECURE = {"MEDIAPLANE_ALLOW_INSECURE": "1"}  # accept_self_signed_cert is honoured only with it
SAVED = "Configuration saved. Restart mp-edge to apply the new settings."


def _fresh_config() -> dict[str, Any]:
    return {
        "version": 1,
        "setup_enabled": True,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
        "manager": None,
        "flows": [],
    }


def _managed(edge: Edge) -> dict[str, Any]:
    r = httpx.get(edge.url + "/setup/managed", timeout=10)  # public, like every setup route
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _link(edge: Edge) -> dict[str, Any]:
    with edge.client() as client:
        data: dict[str, Any] = client.get("/api/v1/manager").json()["data"]
    return data


def _mp_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIAPLANE_", "MP_", "XDG_CONFIG"))}
    return env | {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1"}


def test_first_boot_through_the_wizard_registers_with_the_manager(tmp_path: Path) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    assert setup_super_admin(tmp_path / "manager").returncode == 0
    manager = start_manager(tmp_path / "manager")
    admin = manager.client(timeout=20)
    config_dir = tmp_path / "edge"
    edge: Edge | None = None
    try:
        assert login(admin).status_code == 200
        created = admin.post("/api/v1/nodes", json={"name": "ob-truck-9"})
        assert created.status_code == 201, created.text
        node_id, token = created.json()["id"], created.json()["registration_token"]
        manager_url = f"wss://127.0.0.1:{manager.port}/ws/node"

        edge = start_edge(config_dir, config=_fresh_config(), extra_env=INSECURE)
        port = edge.port
        assert _managed(edge) == {"managed": False, "manager_url": None, "node_id": None, "state": "disabled"}

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 900, "height": 1100})
                page.set_default_timeout(WAIT_MS)
                script_errors: list[str] = []
                page.on("pageerror", lambda e: script_errors.append(str(e)))

                # 1. The fresh node's wizard: fill it in as the person would, and save.
                response = page.goto(edge.url + "/setup", timeout=WAIT_MS)
                assert response is not None and response.status == 200
                expect(page.locator("#setup")).to_be_visible(timeout=WAIT_MS)
                expect(page.locator("#next")).to_be_hidden(timeout=WAIT_MS)
                page.get_by_label("Manager URL").fill(manager_url)
                page.get_by_label("Registration token").fill(token)
                page.get_by_label("Accept a self-signed manager certificate").check()
                page.get_by_label("Device name").fill("ob-truck-9")
                page.get_by_role("button", name="Save settings").click()

                # 2. Saved, and the page says what happens next.
                result = page.locator("#result")
                expect(result).to_have_class("ok", timeout=WAIT_MS)
                expect(result).to_have_text(SAVED, timeout=WAIT_MS)
                steps = page.locator("#next")
                expect(steps).to_be_visible(timeout=WAIT_MS)
                expect(steps).to_contain_text("systemctl restart mp-edge", timeout=WAIT_MS)
                expect(page.locator("#next-url")).to_have_text(manager_url, timeout=WAIT_MS)
                expect(steps).to_contain_text("registration token you entered", timeout=WAIT_MS)
                expect(steps).to_contain_text("online", timeout=WAIT_MS)
                expect(page.locator("#registration_token")).to_have_value("", timeout=WAIT_MS)
                assert token not in page.content()  # the token is never shown back
                page.screenshot(path=str(tmp_path / "wizard-saved.png"), full_page=True)

                # Saved, not applied: the link stays off until the restart (interop.md 3).
                assert _link(edge)["state"] == "disabled"
                saved = json.loads((config_dir / "config.json").read_text())
                assert saved["manager"]["url"] == manager_url and saved["manager"]["accept_self_signed_cert"] is True

                # 3. Restart the edge as the page says: same config dir, same port.
                assert edge.stop() == 0
                edge = start_edge(config_dir, port=port, extra_env=INSECURE)
                wait_for(
                    lambda: admin.get(f"/api/v1/nodes/{node_id}").json().get("status") == "online",
                    timeout=40,
                )
                link = wait_for(lambda: (d := _link(edge)).get("state") == "connected" and d, timeout=20)
                assert link["node_id"] == node_id and link["registered"] is True
                assert link["manager_url"] == manager_url and link["connected_since"] is not None
                assert _managed(edge) == {
                    "managed": True,
                    "manager_url": manager_url,
                    "node_id": node_id,
                    "state": "connected",
                }
                saved = json.loads((config_dir / "config.json").read_text())
                assert saved["setup_enabled"] is False and saved["manager"]["node_id"] == node_id
                assert "registration_token" not in saved["manager"]

                # 4. The wizard's page now shows that the node is managed.
                response = page.goto(edge.url + "/setup", timeout=WAIT_MS)
                assert response is not None and response.status == 200
                expect(page.locator("h1")).to_have_text("Setup is disabled", timeout=WAIT_MS)
                expect(page.locator("form")).to_have_count(0, timeout=WAIT_MS)
                expect(page.locator("#summary")).to_contain_text("This node is managed", timeout=WAIT_MS)
                expect(page.locator("#node-id")).to_have_text(node_id, timeout=WAIT_MS)
                expect(page.locator("#manager-url")).to_have_text(manager_url, timeout=WAIT_MS)
                expect(page.locator("#state")).to_have_text("connected", timeout=WAIT_MS)
                page.screenshot(path=str(tmp_path / "wizard-managed.png"), full_page=True)
                assert script_errors == []
            finally:
                browser.close()

        # The link's own events: registered, then connected (interop.md 11 category `manager`).
        with edge.client() as client:
            events = client.get("/api/v1/events").json()["data"]["events"]
        messages = [e["message"] for e in events if e["category"] == "manager"]
        assert f"registered with the manager as node {node_id}" in messages
        assert "connected to the manager" in messages

        # `mp manager status` tells the same story.
        mp = Mp(edge.url, _mp_env(tmp_path / "home"))
        assert mp.data("manager", "status", "-o", "json")["node_id"] == node_id
        table = mp.ok("manager", "status", "-o", "table").stdout
        assert table.startswith("state:         connected\n")
        assert f"node id:       {node_id}\n" in table and "connected:     since " in table
    finally:
        if edge is not None:
            edge.stop()
        admin.close()
        manager.stop()


def test_setup_disabled_page_reads_the_link_without_a_token(tmp_path: Path) -> None:
    """With auth on, the "Setup is disabled" page still reads /setup/managed (public, no secret)."""
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    config = {
        "version": 1,
        "setup_enabled": False,  # turned off by an administrator, never registered
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section()},
        "manager": {"enabled": False, "url": "wss://manager.example:8443/ws/node"},
    }
    with running_edge(tmp_path, config=config) as edge:
        assert httpx.get(edge.url + "/api/v1/manager", timeout=10).status_code == 401
        assert _managed(edge) == {"managed": False, "manager_url": None, "node_id": None, "state": "disabled"}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.set_default_timeout(WAIT_MS)
                script_errors: list[str] = []
                page.on("pageerror", lambda e: script_errors.append(str(e)))
                response = page.goto(edge.url + "/setup", timeout=WAIT_MS)
                assert response is not None and response.status == 200
                expect(page.locator("h1")).to_have_text("Setup is disabled", timeout=WAIT_MS)
                expect(page.locator("#summary")).to_contain_text("not registered with a manager", timeout=WAIT_MS)
                expect(page.locator("#link")).to_be_hidden(timeout=WAIT_MS)
                assert script_errors == []
            finally:
                browser.close()
