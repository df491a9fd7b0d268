"""The manager dashboard in Debian's Chromium (issue 21): a signed-in page, users of each role,
edges registered through the real link, and screenshots written as test artifacts.

Usage (sync tests)::

    with dashboard_fleet(tmp_path) as fleet:               # a real mp-manager, a super_admin
        with signed_in(fleet.manager, ADMIN_USER, ADMIN_PASSWORD) as session:
            page = session.page
            page.goto(fleet.manager.url + "/fleet")
            shoot(page, "fleet")                           # 1280x800 and 1920x1080 PNGs
            assert session.problems == []                  # console errors, CSP violations, page errors

Screenshots go to ``build/test-artifacts/dashboard/<name>-<w>x<h>.png`` (or
``$MEDIAPLANE_TEST_ARTIFACTS/dashboard``); the paths are printed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, need_chromium
from tests.helpers.manager import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    Manager,
    login,
    manager_fingerprint,
    setup_super_admin,
    start_manager,
)

__all__ = [
    "ADMIN_PASSWORD",
    "ADMIN_USER",
    "ARTIFACTS",
    "SIZES",
    "BrowserSession",
    "DashboardFleet",
    "create_node",
    "create_user",
    "dashboard_fleet",
    "edge_manager_block",
    "shoot",
    "signed_in",
]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("MEDIAPLANE_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts") / "dashboard"
SIZES = ((1280, 800), (1920, 1080))
"""The two screens the issue names: a laptop and a control-room monitor."""
PASSWORD = "Dash-Board-9x7q"
"""The password of every user :func:`create_user` makes."""


@dataclass
class DashboardFleet:
    manager: Manager
    admin: httpx.Client
    """An httpx client signed in as the super_admin (cookies and X-CSRF-Token set)."""


@contextlib.contextmanager
def dashboard_fleet(
    tmp_path: Path, name: str = "manager", env: dict[str, str] | None = None, login_limit: int | None = 100
) -> Iterator[DashboardFleet]:
    """A started ``mp-manager`` with its first super_admin, and a signed-in API client.

    ``login_limit`` sets ``max_login_attempts`` (default 5 per IP per minute: a test signing in
    several browsers and clients from 127.0.0.1 would meet it); None keeps the default."""
    data_dir = tmp_path / name
    done = setup_super_admin(data_dir)
    assert done.returncode == 0, done.stderr
    manager = start_manager(data_dir, env=env)
    try:
        with manager.client(timeout=20) as admin:
            assert login(admin).status_code == 200
            if login_limit is not None:
                answer = admin.put("/api/v1/settings", json={"settings": {"max_login_attempts": login_limit}})
                assert answer.status_code == 200, answer.text
            yield DashboardFleet(manager, admin)
    finally:
        manager.stop()


def create_user(admin: httpx.Client, username: str, role: str, **extra: Any) -> dict[str, Any]:
    """``POST /api/v1/users``; the new user's record (password :data:`PASSWORD`)."""
    answer = admin.post("/api/v1/users", json={"username": username, "password": PASSWORD, "role": role, **extra})
    assert answer.status_code == 201, answer.text
    user: dict[str, Any] = answer.json()
    return user


def create_node(admin: httpx.Client, name: str, device_type: str = "edge") -> tuple[str, str]:
    """``POST /api/v1/nodes``: (node id, registration token)."""
    answer = admin.post("/api/v1/nodes", json={"name": name, "device_type": device_type})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], answer.json()["registration_token"]


def edge_manager_block(manager: Manager, token: str) -> dict[str, Any]:
    """An edge config's ``manager`` section registering with ``manager`` over the real link."""
    return {
        "enabled": True,
        "url": f"wss://127.0.0.1:{manager.port}/ws/node",
        "cert_fingerprint": manager_fingerprint(manager),
        "registration_token": token,
    }


@dataclass
class BrowserSession:
    page: Any
    """A playwright ``Page`` signed in to the manager."""
    context: Any
    problems: list[str] = field(default_factory=list)
    """Console errors, CSP violations and uncaught page errors seen so far (a page must have none)."""

    def console(self, message: Any) -> None:
        if message.type == "error":
            self.problems.append(f"console error: {message.text}")


@contextlib.contextmanager
def signed_in(
    manager: Manager,
    username: str = ADMIN_USER,
    password: str = ADMIN_PASSWORD,
    *,
    size: tuple[int, int] = SIZES[0],
) -> Iterator[BrowserSession]:
    """Chromium signed in through the login page (lands on ``/fleet``)."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            # The manager's certificate is its own self-signed one: trusted for this context only.
            context = browser.new_context(ignore_https_errors=True, viewport={"width": size[0], "height": size[1]})
            context.set_default_timeout(WAIT_MS)
            page = context.new_page()
            session = BrowserSession(page, context)
            page.on("console", session.console)
            page.on("pageerror", lambda e: session.problems.append(f"page error: {e}"))
            page.goto(manager.url + "/login")
            page.fill("#username", username)
            page.fill("#password", password)
            page.click("#login-submit")
            page.wait_for_url("**/fleet")
            yield session
        finally:
            browser.close()


def shoot(page: Any, name: str) -> list[Path]:
    """Screenshots of ``page`` at both :data:`SIZES` (the viewport is restored after)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    before = page.viewport_size
    paths = []
    for width, height in SIZES:
        page.set_viewport_size({"width": width, "height": height})
        # Two animation frames: the layout of the new size is painted before the shot.
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        path = ARTIFACTS / f"{name}-{width}x{height}.png"
        page.screenshot(path=str(path))
        print(f"dashboard screenshot: {path}")
        paths.append(path)
    if before:
        page.set_viewport_size(before)
    return paths
