"""The wizard's page you can trust (issue 15 item 3), in Debian's headless chromium.

1. Not under systemd, started with ``--listen-addr/--listen-port`` that differ from config.json:
   the page shows what is in force beside what is saved, refuses a URL without a host or port
   (the node's message), asks for the fingerprint when "self-signed" is ticked (and says where
   ``MEDIAPLANE_ALLOW_INSECURE`` would be set, which the page cannot do), saves the pin, and
   after the save gives the exact command that restarts this process.
2. Under systemd (``INVOCATION_ID`` and ``NOTIFY_SOCKET`` set, the test standing in for systemd):
   "Restart now" restarts mp-edge: it exits 75, the test starts it again as the unit's
   ``Restart=on-failure`` would, and the page sees it come back.

Launch options and the CI rule are those of ``test_setup_browser.py`` (never a download).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_setup_browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, _need_chromium
from tests.helpers.edge import Edge, free_port, running_edge, start_edge

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

NOT_SYSTEMD = {"INVOCATION_ID": "", "NOTIFY_SOCKET": "", "MEDIAPLANE_ALLOW_INSECURE": ""}
URL = "wss://manager.example:8443/ws/node"
FINGERPRINT = ":".join(["c3"] * 32)


def _config(addr: str, port: int) -> dict[str, Any]:
    return {
        "version": 1,
        "setup_enabled": True,
        "server": {"listen_addr": addr, "listen_port": port},
        "manager": None,
        "flows": [],
    }


def test_the_page_shows_what_is_in_force_and_what_happens_next(tmp_path: Path) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    with running_edge(tmp_path, config=_config("0.0.0.0", 8080), extra_env=NOT_SYSTEMD) as edge:
        config_path = edge.config_dir / "config.json"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 900, "height": 1200})
                page.set_default_timeout(WAIT_MS)
                script_errors: list[str] = []
                page.on("pageerror", lambda e: script_errors.append(str(e)))
                response = page.goto(edge.url + "/setup", timeout=WAIT_MS)
                assert response is not None and response.status == 200

                # In force (the command line's 127.0.0.1:PORT) beside saved (config.json's 0.0.0.0:8080).
                expect(page.locator("#inforce")).to_be_visible()
                expect(page.locator("#now-listen")).to_have_text(f"http://127.0.0.1:{edge.port}")
                expect(page.locator("#now-from")).to_contain_text("--listen-addr/--listen-port")
                expect(page.locator("#saved-listen")).to_have_text("0.0.0.0:8080")
                expect(page.locator("#listen-override")).to_be_visible()
                expect(page.locator("#listen_addr")).to_have_value("0.0.0.0")  # the form edits what is saved
                expect(page.locator("#listen_addr_now")).to_have_text("(in force now: 127.0.0.1)")
                expect(page.locator("#listen_port_now")).to_have_text(f"(in force now: {edge.port})")
                page.screenshot(path=str(tmp_path / "setup-in-force.png"), full_page=True)

                # A manager URL without a host: the node refuses it, without quoting it; nothing saved.
                before = config_path.read_bytes()
                result = page.locator("#result")
                for bad in ("wss://", "wss://:0/x"):
                    page.fill("#manager_url", bad)
                    page.click("#save")
                    expect(result).to_have_class("err")
                    expect(result).to_contain_text(
                        "Validation failed: manager.url: a manager URL is wss://HOST[:PORT]/PATH"
                    )
                    expect(result).to_contain_text("1-65535")
                    expect(page.locator("#next")).to_be_hidden()
                assert config_path.read_bytes() == before

                # Self-signed: the page asks for the fingerprint, and is honest about the alternative.
                page.fill("#manager_url", URL)
                expect(page.locator("#pin")).to_be_hidden()
                page.get_by_label("Accept a self-signed manager certificate").check()
                expect(page.locator("#pin")).to_be_visible()
                note = page.locator("#insecure-note")
                expect(note).to_contain_text("MEDIAPLANE_ALLOW_INSECURE=1, which this page cannot set")
                expect(note).to_contain_text("systemctl edit mp-edge")
                page.click("#save")
                expect(result).to_have_class("err")
                expect(result).to_contain_text("needs its fingerprint")
                assert config_path.read_bytes() == before

                page.fill("#cert_fingerprint", "sha256 Fingerprint=" + FINGERPRINT)
                page.fill("#registration_token", "tok-0123456789")
                page.click("#save")
                expect(result).to_have_class("ok")
                expect(result).to_have_text("Configuration saved. Restart mp-edge to apply the new settings.")
                saved = json.loads(config_path.read_text())
                assert saved["manager"]["cert_fingerprint"] == FINGERPRINT.upper()
                assert saved["manager"]["accept_self_signed_cert"] is True

                # What happens next, and the exact command (this process was not started by systemd).
                steps = page.locator("#next")
                expect(steps).to_be_visible()
                expect(page.locator("#restart-now")).to_be_hidden()
                manual = page.locator("#restart-manual")
                expect(manual).to_be_visible()
                expect(manual).to_contain_text("not started by systemd")
                expect(manual).to_contain_text(f"--listen-port {edge.port}")
                expect(manual).to_contain_text(str(edge.config_dir))
                expect(page.locator("#next-listen")).to_contain_text(f"now 127.0.0.1:{edge.port}")
                expect(page.locator("#next-tls")).to_contain_text("fingerprint you entered")
                page.screenshot(path=str(tmp_path / "setup-next-manual.png"), full_page=True)

                # Reloaded: the saved pin is shown and the box stays ticked.
                page.goto(edge.url + "/setup", timeout=WAIT_MS)
                expect(page.locator("#cert_fingerprint")).to_have_value(FINGERPRINT.upper())
                expect(page.locator("#accept_self_signed_cert")).to_be_checked()
                assert script_errors == []
            finally:
                browser.close()


def test_restart_now_under_systemd(tmp_path: Path) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    notify_path = tmp_path / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    env = {"INVOCATION_ID": "0123456789abcdef0123456789abcdef", "NOTIFY_SOCKET": str(notify_path)}
    port = free_port()
    config_dir = tmp_path / "edge"
    url = f"wss://127.0.0.1:{free_port()}/ws/node"  # nothing listens there: the link just retries
    edge = start_edge(config_dir, port=port, config=_config("127.0.0.1", port), extra_env=env)
    started: list[Edge] = [edge]
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 900, "height": 1200})
                page.set_default_timeout(WAIT_MS)
                script_errors: list[str] = []
                page.on("pageerror", lambda e: script_errors.append(str(e)))
                page.goto(edge.url + "/setup", timeout=WAIT_MS)
                expect(page.locator("#now-listen")).to_have_text(f"http://127.0.0.1:{port}")
                expect(page.locator("#now-from")).to_have_text("(from config.json)")
                expect(page.locator("#saved-listen-line")).to_be_hidden()
                expect(page.locator("#listen-override")).to_be_hidden()

                page.fill("#manager_url", url)
                page.fill("#registration_token", "tok-0123456789")
                page.click("#save")
                expect(page.locator("#result")).to_have_class("ok")
                expect(page.locator("#restart-manual")).to_be_hidden()
                button = page.get_by_role("button", name="Restart now")
                expect(button).to_be_visible()
                expect(page.locator("#restart-systemd")).to_contain_text("systemctl restart mp-edge")
                expect(page.locator("#next-listen")).to_have_text(
                    f"After the restart the API listens on 127.0.0.1:{port}."
                )
                page.screenshot(path=str(tmp_path / "setup-next-systemd.png"), full_page=True)

                button.click()
                state = page.locator("#restart-state")
                expect(state).to_contain_text("Restarting mp-edge")
                assert edge.process.wait(30) == 75  # stopped cleanly, for Restart=on-failure
                # The test is systemd here: start it again, as the unit would after RestartSec.
                edge = start_edge(config_dir, port=port, extra_env=env)
                started.append(edge)
                expect(state).to_have_text("mp-edge restarted: the saved settings are in force.", timeout=60_000)
                status = httpx.get(edge.url + "/setup/status", timeout=10).json()
                assert status["manager_url"] == url
                page.screenshot(path=str(tmp_path / "setup-restarted.png"), full_page=True)
                assert script_errors == []
            finally:
                browser.close()
    finally:
        for each in started:
            each.stop()
        notify.close()
