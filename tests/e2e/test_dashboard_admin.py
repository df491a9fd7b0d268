"""The dashboard's admin pages (issue 21): users and settings, in Debian's Chromium against a real
``mp-manager``.

- A super_admin creates an operator through the form (a weak password is refused with the rule
  shown, and nothing is created; a taken username shows the server's 409), changes its role,
  limits and disables it, and deletes another user, each change checked through the API.
- Settings: a changed ``stats_broadcast_interval_ms`` is saved (read back through the API); an
  out-of-range value is refused by the page (Save stays disabled) and by the server (400, sent
  from the page with ``MP.api``). The TLS card shows the self-signed certificate and its
  fingerprint, and Export downloads the JSON export.
- A plain ``admin`` is not offered ``super_admin`` and sees super_admin rows read-only.
- A ``viewer`` gets the 403 page on /users and /settings, and its own browser's PUT /settings and
  POST /users are answered 403.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.dashboard import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    PASSWORD,
    BrowserSession,
    DashboardFleet,
    create_node,
    create_user,
    dashboard_fleet,
    shoot,
    signed_in,
)
from tests.helpers.manager import manager_fingerprint

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

NEW_PASSWORD = "Studio-Op-42x"


@dataclass
class World:
    fleet: DashboardFleet
    node_ids: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with dashboard_fleet(tmp_path_factory.mktemp("admin")) as fleet:
        node_ids = {name: create_node(fleet.admin, name)[0] for name in ("studio-a", "studio-b")}
        create_user(fleet.admin, "boss", "admin")
        create_user(fleet.admin, "peeker", "viewer")
        create_user(fleet.admin, "leaver", "viewer", display_name="Soon gone")
        yield World(fleet, node_ids)


def users_by_name(world: World) -> dict[str, dict[str, Any]]:
    answer = world.fleet.admin.get("/api/v1/users")
    assert answer.status_code == 200, answer.text
    return {user["username"]: user for user in answer.json()}


def page_api(page: Any, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """``MP.api`` from the page: the signed-in browser's own cookie and CSRF token."""
    result: dict[str, Any] = page.evaluate(
        "async ([m, p, b]) => { const a = await MP.api(m, p, b === null ? undefined : b); "
        "return {status: a.status, data: a.data, error: a.error}; }",
        [method, path, body],
    )
    return result


def unexpected(session: BrowserSession, since: int, *statuses: int) -> list[str]:
    """The problems logged from ``since`` on (the fleet page signing in lands on is another
    part's), without Chromium's console lines for the answers a test provokes on purpose
    ("Failed to load resource: the server responded with a status of 409")."""
    expected = tuple(f"Failed to load resource: the server responded with a status of {s} " for s in statuses)
    return [problem for problem in session.problems[since:] if not any(text in problem for text in expected)]


def test_a_super_admin_manages_users(world: World) -> None:
    from playwright.sync_api import expect

    with signed_in(world.fleet.manager, ADMIN_USER, ADMIN_PASSWORD) as session:
        page = session.page
        landed = len(session.problems)
        page.goto(world.fleet.manager.url + "/users")
        expect(page.locator(f"tr[data-user='{ADMIN_USER}']")).to_contain_text("super_admin")
        assert page.locator("#new-role option[value='super_admin']").count() == 1

        # A weak password: refused on the page with the rule named, nothing sent.
        page.fill("#new-username", "op1")
        page.fill("#new-password", "weakpass")
        expect(page.locator("#new-password-rules li[data-met='false']")).to_have_count(2)
        page.click("#create-submit")
        expect(page.locator("#create-error")).to_contain_text("an upper-case letter")
        expect(page.locator("#create-error")).to_contain_text("a digit")
        assert "op1" not in users_by_name(world)

        # A good one: an operator limited to studio-a.
        page.fill("#new-password", NEW_PASSWORD)
        expect(page.locator("#new-password-rules li[data-met='false']")).to_have_count(0)
        page.select_option("#new-role", "operator")
        page.fill("#new-display", "Operator One")
        page.fill("#new-email", "op1@example.test")
        page.check("input[name='new-scope'][value='some']")
        page.select_option("#new-nodes", [world.node_ids["studio-a"]])
        page.click("#create-submit")
        row = page.locator("tr[data-user='op1']")
        expect(row).to_contain_text("operator")
        expect(row).to_contain_text("studio-a")
        expect(page.locator("#create-error")).to_be_hidden()
        created = users_by_name(world)["op1"]
        assert created["role"] == "operator"
        assert created["display_name"] == "Operator One"
        assert created["allowed_node_ids"] == [world.node_ids["studio-a"]]
        assert created["is_active"] is True

        # A temporary account, with its expiry.
        page.fill("#new-username", "guest1")
        page.fill("#new-password", NEW_PASSWORD)
        page.select_option("#new-role", "viewer")
        page.check("#new-temporary")
        page.fill("#new-expires", "2031-01-02T10:30")
        page.click("#create-submit")
        expect(page.locator("tr[data-user='guest1']")).to_contain_text("Temporary, until")
        guest = users_by_name(world)["guest1"]
        assert guest["is_temporary"] is True and guest["expires_at"].startswith("2031-01-0")

        # The same username again: the server's 409 is shown in the form.
        page.fill("#new-username", "op1")
        page.fill("#new-password", NEW_PASSWORD)
        page.click("#create-submit")
        expect(page.locator("#create-error")).to_contain_text("taken")

        # Edit: the role, then disabled (and all nodes).
        row.get_by_role("button", name="Edit op1").click()
        dialog = page.locator("#edit-dialog")
        expect(dialog).to_be_visible()
        page.select_option("#edit-role", "viewer")
        page.click("#edit-save")
        expect(dialog).to_be_hidden()
        expect(row).to_contain_text("viewer")
        assert users_by_name(world)["op1"]["role"] == "viewer"

        row.get_by_role("button", name="Edit op1").click()
        page.uncheck("#edit-active")
        page.check("input[name='edit-scope'][value='all']")
        page.fill("#edit-password", "nodigits")
        page.click("#edit-save")
        expect(page.locator("#edit-error")).to_contain_text("a digit")  # a bad reset is refused too
        page.fill("#edit-password", "")
        page.click("#edit-save")
        expect(dialog).to_be_hidden()
        expect(row).to_contain_text("Disabled")
        expect(row).to_contain_text("All nodes")
        changed = users_by_name(world)["op1"]
        assert changed["is_active"] is False
        assert changed["allowed_node_ids"] is None

        # Delete, confirmed in a dialog.
        page.locator("tr[data-user='leaver']").get_by_role("button", name="Delete leaver").click()
        expect(page.locator("#delete-dialog")).to_contain_text("leaver")
        page.click("#delete-confirm")
        expect(page.locator("tr[data-user='leaver']")).to_have_count(0)
        assert "leaver" not in users_by_name(world)

        page.click("#create-form button[type='reset']")
        page.evaluate("() => window.scrollTo(0, 0)")
        shoot(page, "users")
        row.get_by_role("button", name="Edit op1").click()
        shoot(page, "users-edit")
        page.click("#edit-cancel")
        assert unexpected(session, landed, 409) == []


def test_settings_tls_and_export(world: World) -> None:
    from playwright.sync_api import expect

    manager = world.fleet.manager
    with signed_in(manager, ADMIN_USER, ADMIN_PASSWORD) as session:
        page = session.page
        landed = len(session.problems)
        page.goto(manager.url + "/settings")
        field = page.locator("#set-stats_broadcast_interval_ms")
        expect(field).to_have_value("1000")
        expect(page.locator("#settings-fields")).to_contain_text("100\u201360000")

        field.fill("2500")
        page.click("#settings-save")
        expect(page.locator("#settings-ok")).to_contain_text("dashboard update interval")
        saved = world.fleet.admin.get("/api/v1/settings").json()
        assert saved["stats_broadcast_interval_ms"] == 2500

        # Out of range: the page refuses (Save disabled, the range named) ...
        field.fill("50")
        expect(page.locator("#set-stats_broadcast_interval_ms-problem")).to_contain_text("100\u201360000")
        expect(page.locator("#settings-save")).to_be_disabled()
        page.locator("#settings-form").evaluate("form => form.requestSubmit()")
        expect(page.locator("#settings-error")).to_contain_text("out of range")
        # ... and so does the server, when sent anyway from this page.
        answer = page_api(page, "PUT", "/api/v1/settings", {"settings": {"stats_broadcast_interval_ms": 50}})
        assert answer["status"] == 400, answer
        assert world.fleet.admin.get("/api/v1/settings").json()["stats_broadcast_interval_ms"] == 2500
        page.click("#settings-revert")
        expect(field).to_have_value("2500")

        # TLS: the manager's own self-signed certificate.
        expect(page.locator("#tls-self-signed")).to_have_attribute("data-value", "true")
        expect(page.locator("#tls-fingerprint")).to_have_text(manager_fingerprint(manager).upper())
        page.fill("#tls-cert", "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
        page.fill("#tls-key", "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
        page.click("#tls-upload")
        expect(page.locator("#tls-upload-error")).to_contain_text("Not uploaded")
        upload_error = page.locator("#tls-upload-error").text_content()
        page.fill("#tls-cert", "")
        page.fill("#tls-key", "")

        with page.expect_download() as info:
            page.click("#export-button")
        exported = json.loads(Path(info.value.path()).read_text())
        assert exported["version"] == 1
        assert exported["settings"]["stats_broadcast_interval_ms"] == 2500
        assert ADMIN_USER in json.dumps(exported["users"])

        shoot(page, "settings")
        assert unexpected(session, landed, 400) == []
        assert upload_error  # the server's 400 text, shown as it came


def test_a_plain_admin_is_not_offered_super_admin(world: World) -> None:
    from playwright.sync_api import expect

    with signed_in(world.fleet.manager, "boss", PASSWORD) as session:
        page = session.page
        landed = len(session.problems)
        page.goto(world.fleet.manager.url + "/users")
        super_row = page.locator(f"tr[data-user='{ADMIN_USER}']")
        expect(super_row).to_contain_text("read-only")
        assert super_row.get_by_role("button").count() == 0
        options = page.locator("#new-role option").evaluate_all("os => os.map(o => o.value)")
        assert options == ["viewer", "operator", "admin"]
        edit_options = page.locator("#edit-role option").evaluate_all("os => os.map(o => o.value)")
        assert "super_admin" not in edit_options
        # The server refuses anyway.
        body = {"username": "sneaky", "password": NEW_PASSWORD, "role": "super_admin"}
        assert page_api(page, "POST", "/api/v1/users", body)["status"] == 403
        shoot(page, "users-admin")
        assert unexpected(session, landed, 403) == []


def test_a_viewer_gets_403_on_the_admin_pages_and_routes(world: World) -> None:
    from playwright.sync_api import expect

    manager = world.fleet.manager
    with signed_in(manager, "peeker", PASSWORD) as session:
        page = session.page
        landed = len(session.problems)
        assert page.locator("nav a[href='/users'], nav a[href='/settings']").count() == 0
        for path in ("/users", "/settings"):
            answer = page.goto(manager.url + path)
            assert answer is not None and answer.status == 403, path
            expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
            assert page.locator("#create-form, #settings-form").count() == 0
        refused = page_api(page, "PUT", "/api/v1/settings", {"settings": {"max_login_attempts": 99}})
        assert refused["status"] == 403, refused
        body = {"username": "intruder", "password": NEW_PASSWORD, "role": "viewer"}
        refused = page_api(page, "POST", "/api/v1/users", body)
        assert refused["status"] == 403, refused
        assert "intruder" not in users_by_name(world)
        assert world.fleet.admin.get("/api/v1/settings").json()["max_login_attempts"] == 100
        assert unexpected(session, landed, 403) == []
