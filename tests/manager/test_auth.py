"""Login, sessions, CSRF, logout and revocation against a real ``mp-manager serve`` (interop.md 7.1, 13)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import trio

from services.manager.store import Store, sqlite_url
from tests.helpers.manager import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    JWT_SECRET,
    Manager,
    login,
    manager_env,
    running_manager,
    setup_super_admin,
    start_manager,
)

pytestmark = pytest.mark.e2e

LOGIN_USER_KEYS = {
    "id",
    "username",
    "display_name",
    "email",
    "role",
    "is_temporary",
    "expires_at",
    "allowed_node_ids",
    "is_active",
    "last_login_at",
}


def put_settings(data_dir: Path, values: dict[str, Any]) -> None:
    """Writes settings (interop.md 7.5) straight into the store, as PUT /settings will."""

    async def write() -> None:
        async with await Store.open(sqlite_url(data_dir)) as store:
            await store.put_settings(values)

    trio.run(write)


def prepared_data_dir(root: Path, *, max_login_attempts: int = 100) -> Path:
    """A data dir with the first super_admin and a login limit high enough for one module's logins."""
    data_dir = root / "manager"
    done = setup_super_admin(data_dir)
    assert done.returncode == 0, done.stderr
    put_settings(data_dir, {"max_login_attempts": max_login_attempts})
    return data_dir


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    data_dir = prepared_data_dir(tmp_path_factory.mktemp("auth"))
    started = start_manager(data_dir)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def client(manager: Manager) -> Iterator[httpx.Client]:
    with manager.client() as c:
        yield c


def set_cookie_headers(response: httpx.Response) -> dict[str, str]:
    return {header.split("=", 1)[0]: header for header in response.headers.get_list("set-cookie")}


# --- login -------------------------------------------------------------------------------


def test_login_success_body_and_cookies(client: httpx.Client) -> None:
    r = login(client)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"success", "csrf_token", "user"}
    assert body["success"] is True
    assert len(body["csrf_token"]) == 32 and int(body["csrf_token"], 16) >= 0
    assert set(body["user"]) == LOGIN_USER_KEYS
    assert body["user"]["username"] == ADMIN_USER
    assert body["user"]["role"] == "super_admin"
    assert body["user"]["last_login_at"].endswith("Z")
    cookies = set_cookie_headers(r)
    token = client.cookies["session"]
    assert cookies["session"] == f"session={token}; HttpOnly; Secure; SameSite=Lax; Path=/; Max-Age=86400"
    assert cookies["csrf_token"] == f"csrf_token={body['csrf_token']}; Secure; SameSite=Lax; Path=/; Max-Age=86400"


def test_the_session_jwt_has_the_claims_of_7_1(client: httpx.Client) -> None:
    r = login(client)
    token = client.cookies["session"]
    claims = jwt.decode(token, JWT_SECRET, algorithms=["HS256"], issuer="mediaplane-manager")
    assert set(claims) == {"sub", "role", "jti", "iat", "exp", "iss"}
    assert claims["sub"] == r.json()["user"]["id"]
    assert claims["role"] == "super_admin"
    assert claims["exp"] - claims["iat"] == 24 * 3600
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


@pytest.mark.parametrize(
    ("username", "password"),
    [(ADMIN_USER, "Wrong-passw0rd"), ("nobody", ADMIN_PASSWORD), ("nobody", "Wrong-passw0rd")],
)
def test_wrong_credentials_are_401_with_the_error_body(client: httpx.Client, username: str, password: str) -> None:
    r = login(client, username, password)
    assert r.status_code == 401
    assert r.json() == {"success": False, "csrf_token": None, "user": None, "error": "Invalid credentials"}
    assert "set-cookie" not in r.headers


@pytest.mark.parametrize(("username", "password"), [("u" * 65, "Aa1aaaaa"), (ADMIN_USER, "Aa1" + "a" * 126)])
def test_over_long_credentials_are_400_invalid_credentials(client: httpx.Client, username: str, password: str) -> None:
    r = login(client, username, password)
    assert r.status_code == 400
    assert r.json() == {"success": False, "csrf_token": None, "user": None, "error": "Invalid credentials"}


@pytest.mark.parametrize(
    "body", [{"username": "root"}, {"username": "root", "password": 5}, {"username": "a", "password": "b", "x": 1}]
)
def test_a_malformed_login_body_is_400_in_the_login_shape(client: httpx.Client, body: dict[str, Any]) -> None:
    r = client.post("/api/v1/auth/login", json=body)
    assert r.status_code == 400
    answer = r.json()
    assert answer["success"] is False and answer["csrf_token"] is None and answer["user"] is None
    assert "root" not in answer["error"]


# --- sessions: cookie, Bearer, CSRF ------------------------------------------------------


def test_cookie_and_bearer_both_authenticate(manager: Manager, client: httpx.Client) -> None:
    login(client)
    assert client.get("/api/v1/users").status_code == 200
    token = client.cookies["session"]
    with manager.client() as bearer:
        assert bearer.get("/api/v1/users").status_code == 401
        r = bearer.get("/api/v1/users", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200


def test_no_or_a_bad_token_is_401(manager: Manager) -> None:
    forged = jwt.encode({"sub": "x", "role": "super_admin", "jti": "y", "iat": 0, "exp": 2**40}, "k" * 64)
    with manager.client() as c:
        for headers in ({}, {"Authorization": f"Bearer {forged}"}, {"Authorization": "Basic cm9vdDp4"}):
            r = c.get("/api/v1/users", headers=headers)
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert set(r.json()) == {"error"}


def test_an_expired_jwt_is_401(manager: Manager, client: httpx.Client) -> None:
    login(client)
    claims = jwt.decode(client.cookies["session"], JWT_SECRET, algorithms=["HS256"], issuer="mediaplane-manager")
    claims["exp"] = claims["iat"] - 1
    stale = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    with manager.client() as c:
        assert c.get("/api/v1/users", headers={"Authorization": f"Bearer {stale}"}).status_code == 401


def test_the_cookie_is_checked_before_the_bearer_token(manager: Manager, client: httpx.Client) -> None:
    login(client)
    good = client.cookies["session"]
    with manager.client() as c:
        c.cookies.set("session", "not-a-jwt")
        assert c.get("/api/v1/users", headers={"Authorization": f"Bearer {good}"}).status_code == 401


def test_csrf_is_needed_on_state_changing_requests(manager: Manager, client: httpx.Client) -> None:
    login(client)
    body = {"username": "csrf-user", "password": "Csrf-passw0rd", "role": "viewer"}
    missing = client.post("/api/v1/users", json=body, headers={"X-CSRF-Token": ""})
    assert missing.status_code == 403
    wrong = client.post("/api/v1/users", json=body, headers={"X-CSRF-Token": "0" * 32})
    assert wrong.status_code == 403
    assert client.get("/api/v1/users", headers={"X-CSRF-Token": ""}).status_code == 200  # GET needs none
    # A Bearer client without the cookie: any non-empty header is enough.
    token = client.cookies["session"]
    with manager.client() as c:
        auth = {"Authorization": f"Bearer {token}"}
        assert c.post("/api/v1/users", json=body, headers=auth).status_code == 403
        r = c.post("/api/v1/users", json=body, headers={**auth, "X-CSRF-Token": "anything"})
        assert r.status_code == 201


def test_check_order_401_then_403_csrf_then_403_role_then_413_then_400(manager: Manager, client: httpx.Client) -> None:
    huge = b'{"a":"' + b"x" * (1024 * 1024 + 10) + b'"}'
    headers = {"Content-Type": "application/json"}
    with manager.client() as anonymous:
        assert anonymous.post("/api/v1/users", content=huge, headers=headers).status_code == 401
    login(client)
    assert client.post("/api/v1/users", content=huge, headers={**headers, "X-CSRF-Token": ""}).status_code == 403
    assert client.post("/api/v1/users", content=huge, headers=headers).status_code == 413
    assert client.post("/api/v1/users", content=b"[", headers=headers).status_code == 400
    r = client.put(f"/api/v1/users/{'0' * 8}-0000-4000-8000-{'0' * 12}", json={"display_name": "x"})
    assert r.status_code == 404
    assert client.put(f"/api/v1/users/{'0' * 8}-0000-4000-8000-{'0' * 12}", json={"x": 1}).status_code == 400


# --- logout and revocation ---------------------------------------------------------------


def test_logout_revokes_and_expires_both_cookies(manager: Manager, client: httpx.Client) -> None:
    login(client)
    token = client.cookies["session"]
    r = client.post("/api/v1/auth/logout")
    assert r.status_code == 200
    assert r.json() == {"success": True}
    cookies = set_cookie_headers(r)
    assert cookies["session"] == "session=; HttpOnly; Secure; SameSite=Lax; Path=/; Max-Age=0"
    assert cookies["csrf_token"] == "csrf_token=; Secure; SameSite=Lax; Path=/; Max-Age=0"
    with manager.client() as c:
        r = c.get("/api/v1/users", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401


def test_logout_needs_a_session_and_csrf(manager: Manager, client: httpx.Client) -> None:
    with manager.client() as anonymous:
        assert anonymous.post("/api/v1/auth/logout").status_code == 401
    login(client)
    assert client.post("/api/v1/auth/logout", headers={"X-CSRF-Token": ""}).status_code == 403


def test_a_revocation_survives_a_restart_and_a_live_session_too(tmp_path: Path) -> None:
    data_dir = prepared_data_dir(tmp_path)
    first = start_manager(data_dir)
    try:
        with first.client() as c:
            login(c)
            revoked = c.cookies["session"]
            assert c.post("/api/v1/auth/logout").status_code == 200
            login(c)
            live = c.cookies["session"]
    finally:
        assert first.stop() == 0
    second = start_manager(data_dir)
    try:
        with second.client() as c:
            assert c.get("/api/v1/users", headers={"Authorization": f"Bearer {revoked}"}).status_code == 401
            assert c.get("/api/v1/users", headers={"Authorization": f"Bearer {live}"}).status_code == 200
    finally:
        second.stop()


# --- rate limit ----------------------------------------------------------------------------


def test_the_sixth_attempt_in_60s_is_429_successes_included(tmp_path: Path) -> None:
    data_dir = prepared_data_dir(tmp_path, max_login_attempts=5)
    with running_manager(tmp_path, name=data_dir.name) as manager, manager.client() as c:
        assert login(c).status_code == 200
        for _ in range(4):
            assert login(c, password="Wrong-passw0rd").status_code == 401
        r = login(c)
        assert r.status_code == 429
        assert r.json() == {
            "success": False,
            "csrf_token": None,
            "user": None,
            "error": "Too many login attempts; try again later",
        }


def test_the_limit_is_live_and_read_from_the_store(tmp_path: Path) -> None:
    data_dir = prepared_data_dir(tmp_path, max_login_attempts=2)
    with running_manager(tmp_path, name=data_dir.name) as manager, manager.client() as c:
        assert login(c).status_code == 200
        assert login(c).status_code == 200
        assert login(c).status_code == 429
        put_settings(data_dir, {"max_login_attempts": 3})
        assert login(c).status_code == 200


def test_behind_proxy_limits_per_forwarded_ip_and_drops_secure(tmp_path: Path) -> None:
    data_dir = prepared_data_dir(tmp_path, max_login_attempts=1)
    env = manager_env(MEDIAPLANE_TLS_MODE="behind_proxy")
    with running_manager(tmp_path, name=data_dir.name, env=env) as manager, manager.client() as c:
        first = c.post(
            "/api/v1/auth/login",
            json={"username": ADMIN_USER, "password": ADMIN_PASSWORD},
            headers={"X-Forwarded-For": "198.51.100.7"},
        )
        assert first.status_code == 200
        assert "Secure" not in " ".join(first.headers.get_list("set-cookie"))
        assert set_cookie_headers(first)["session"].endswith("; HttpOnly; SameSite=Lax; Path=/; Max-Age=86400")
        again = {"username": ADMIN_USER, "password": ADMIN_PASSWORD}
        assert c.post("/api/v1/auth/login", json=again, headers={"X-Forwarded-For": "198.51.100.7"}).status_code == 429
        other = c.post("/api/v1/auth/login", json=again, headers={"X-Forwarded-For": "10.0.0.1, 198.51.100.8"})
        assert other.status_code == 200
        # HAProxy's ``option forwardfor`` appends a second header *line* after the client's own:
        # the limit follows the proxy's line (198.51.100.7, now limited), not a forged first one.
        forged = [("X-Forwarded-For", "203.0.113.9"), ("X-Forwarded-For", "198.51.100.7")]
        assert c.post("/api/v1/auth/login", json=again, headers=forged).status_code == 429


def test_session_lifetime_hours_sets_exp_and_max_age(tmp_path: Path) -> None:
    data_dir = prepared_data_dir(tmp_path)
    put_settings(data_dir, {"session_lifetime_hours": 2})
    with running_manager(tmp_path, name=data_dir.name) as manager, manager.client() as c:
        r = login(c)
        assert set_cookie_headers(r)["session"].endswith("Max-Age=7200")
        claims = jwt.decode(c.cookies["session"], JWT_SECRET, algorithms=["HS256"], issuer="mediaplane-manager")
        assert claims["exp"] - claims["iat"] == 7200
        assert dt.datetime.fromtimestamp(claims["exp"], dt.UTC) > dt.datetime.now(dt.UTC)
