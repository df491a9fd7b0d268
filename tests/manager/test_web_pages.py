"""The dashboard's page routes over real HTTPS (issue 21): who sees which page, the redirect to
the sign-in page, the files under ``/assets`` and ``/vendor``, and the rules every page and script
keeps (strict CSP: nothing inline; every script parses; every file is in the wheel)."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.manager.web.pages import CSP, PAGES, VENDORED
from tests.helpers.dashboard import PASSWORD, DashboardFleet, create_user, dashboard_fleet
from tests.helpers.manager import login

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "services" / "manager" / "web"
ALL_PAGES = [f"/{page.name}" for page in PAGES]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardFleet]:
    with dashboard_fleet(tmp_path_factory.mktemp("web")) as fleet:
        for name, role in (("viewer1", "viewer"), ("operator1", "operator"), ("admin1", "admin")):
            create_user(fleet.admin, name, role)
        yield fleet


@contextlib.contextmanager
def client_as(fleet: DashboardFleet, username: str) -> Iterator[httpx.Client]:
    with fleet.manager.client(follow_redirects=False) as client:
        assert login(client, username, PASSWORD).status_code == 200
        yield client


def test_pages_need_a_session_and_go_to_sign_in(fleet: DashboardFleet) -> None:
    with fleet.manager.client(follow_redirects=False) as anonymous:
        for path in [*ALL_PAGES, f"/nodes/{uuid.uuid4()}"]:
            r = anonymous.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"] == "/login?next=" + path
        r = anonymous.get("/events?severity=critical&page=2")
        assert r.headers["location"] == "/login?next=/events%3Fseverity%3Dcritical%26page%3D2"
        assert anonymous.get("/").headers["location"] == "/fleet"
        page = anonymous.get("/login")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["cache-control"] == "no-store"
        assert 'id="login-form"' in page.text


def test_a_bearer_token_is_not_a_page_session(fleet: DashboardFleet) -> None:
    token = fleet.admin.cookies["session"]
    with fleet.manager.client(follow_redirects=False, headers={"Authorization": f"Bearer {token}"}) as bearer:
        assert bearer.get("/api/v1/nodes").status_code == 200  # the API takes it
        assert bearer.get("/fleet").status_code == 303  # a page wants the browser's cookie


@pytest.mark.parametrize(
    ("username", "allowed"),
    [
        ("viewer1", {"/fleet", "/events", "/tunnels"}),
        ("operator1", {"/fleet", "/events", "/tunnels", "/assistant"}),
        ("admin1", set(ALL_PAGES)),
    ],
)
def test_each_role_sees_its_pages_and_gets_403_for_the_others(
    fleet: DashboardFleet, username: str, allowed: set[str]
) -> None:
    with client_as(fleet, username) as client:
        for path in ALL_PAGES:
            r = client.get(path)
            if path in allowed:
                assert r.status_code == 200, path
                assert f'data-role="{client_role(username)}"' in r.text
            else:
                assert r.status_code == 403, path
                assert "Not allowed" in r.text
            # The navigation offers exactly the pages this role may open.
            for other in ALL_PAGES:
                assert (f'href="{other}"' in r.text) == (other in allowed), (path, other)
        node = client.get(f"/nodes/{uuid.uuid4()}")
        assert node.status_code == 200  # the page; its script asks the API, which says 404
        assert client.get("/nodes/not-a-node").status_code == 404


def client_role(username: str) -> str:
    return username.removesuffix("1")


def test_a_signed_out_session_no_longer_opens_pages(fleet: DashboardFleet) -> None:
    with client_as(fleet, "viewer1") as client:
        assert client.get("/fleet").status_code == 200
        client.headers["X-CSRF-Token"] = client.cookies["csrf_token"]
        assert client.post("/api/v1/auth/logout").status_code == 200
        assert client.get("/fleet").status_code == 303


def test_the_login_rate_limit_says_how_long_to_wait(tmp_path: Path) -> None:
    with dashboard_fleet(tmp_path, login_limit=None) as fleet, fleet.manager.client() as client:
        # The fixture's own sign-in was the first of the five attempts a minute.
        answers = [client.post("/api/v1/auth/login", json={"username": "nobody", "password": "x"}) for _ in range(5)]
        assert [a.status_code for a in answers] == [401] * 4 + [429]
        assert answers[-1].headers["retry-after"] == "60"
        assert "retry-after" not in answers[0].headers


def test_assets_and_vendored_files(fleet: DashboardFleet) -> None:
    manifest = json.loads((ROOT / "tools" / "npm-assets.json").read_text())
    with fleet.manager.client() as client:
        css = client.get("/assets/app.css")
        assert css.status_code == 200
        assert css.headers["content-type"] == "text/css; charset=utf-8"
        script = client.get("/assets/pages/login.js")
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        for name in VENDORED:
            package, _, file = name.partition("/")
            r = client.get(f"/vendor/{name}")
            assert r.status_code == 200, name
            assert hashlib.sha256(r.content).hexdigest() == manifest[package]["files"][file]
        # Only the named files: not the rest of build/vendor, nothing outside static/.
        for path in (
            "/vendor/hls.js/dist/hls.min.js",
            "/vendor/../npm-assets.json",
            "/assets/../pages.py",
            "/assets/%2e%2e/pages.py",
            "/assets/nope.js",
            "/assets/../templates/base.html",
        ):
            assert client.get(path).status_code == 404, path


def test_templates_and_scripts_keep_the_csp() -> None:
    """``script-src 'self'; style-src 'self'``: no inline script, handler or style attribute."""
    for template in sorted((WEB / "templates").glob("*.html")):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), template.name
        assert not re.search(r"\son[a-z]+\s*=", text), template.name
        assert not re.search(r"\sstyle\s*=", text), template.name
        assert "<style" not in text, template.name
        for source in re.findall(r'(?:src|href)="(/assets/[^"]+)"', text):
            assert (WEB / "static" / source.removeprefix("/assets/")).is_file(), (template.name, source)
    for script in sorted((WEB / "static").rglob("*.js")):
        assert ".innerHTML" not in script.read_text(), f"{script.name}: build DOM with MP.el/textContent"


def test_every_script_parses() -> None:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed (it comes with npm, which make vendor installs)")
    for script in sorted((WEB / "static").rglob("*.js")):
        done = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{script.relative_to(ROOT)}: {done.stderr}"


def test_every_web_file_is_in_the_wheel() -> None:
    """pyproject's package-data for services.manager.web covers every template and static file."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "services.manager.web"
    ]
    for path in sorted(p for p in WEB.rglob("*") if p.is_file() and p.suffix in {".html", ".css", ".js"}):
        relative = path.relative_to(WEB).as_posix()
        assert any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns), relative
