"""``/api/v1/users`` against a real ``mp-manager serve``: roles, super_admin rules, policy (interop.md 7.1, 13)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.manager import (
    ADMIN_PASSWORD,
    JWT_SECRET,
    MANAGER_BIN,
    MASTER_KEY,
    Manager,
    login,
    manager_env,
    run_manager_cli,
    start_manager,
)
from tests.manager.test_auth import prepared_data_dir

pytestmark = pytest.mark.e2e

PASSWORDS = {role: f"{role.title().replace('_', '')}-Pw0rd-{role[:3]}" for role in ("viewer", "operator", "admin")}
RECORD_KEYS = {
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
    "created_at",
    "updated_at",
}
BODIES: list[str] = []
"""Every response body of this module's clients, searched for secrets at the end."""


def _record(response: httpx.Response) -> None:
    response.read()
    BODIES.append(response.text)


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    started = start_manager(prepared_data_dir(tmp_path_factory.mktemp("users")))
    try:
        with client_of(started) as root:
            login(root)
            for role, password in PASSWORDS.items():
                r = root.post("/api/v1/users", json={"username": f"the-{role}", "password": password, "role": role})
                assert r.status_code == 201, r.text
        yield started
    finally:
        started.stop()


def client_of(manager: Manager) -> httpx.Client:
    return manager.client(event_hooks={"response": [_record]})


@pytest.fixture
def root(manager: Manager) -> Iterator[httpx.Client]:
    with client_of(manager) as c:
        assert login(c).status_code == 200
        yield c


@contextlib.contextmanager
def as_role(manager: Manager, role: str) -> Iterator[httpx.Client]:
    """A client logged in as the module's user of ``role``."""
    with client_of(manager) as c:
        if role == "super_admin":
            assert login(c).status_code == 200
        else:
            assert login(c, f"the-{role}", PASSWORDS[role]).status_code == 200
        yield c


def user_id(root: httpx.Client, username: str) -> str:
    return next(u["id"] for u in root.get("/api/v1/users").json() if u["username"] == username)


def test_create_get_list_update_delete(root: httpx.Client) -> None:
    node = "3f0c7e0a-6f1e-4c2a-9a57-1d2b3c4d5e6f"
    r = root.post(
        "/api/v1/users",
        json={
            "username": "temp.user_1",
            "password": "Temp-passw0rd",
            "role": "operator",
            "display_name": "Temp",
            "email": "t@example.com",
            "allowed_node_ids": [node],
            "is_temporary": True,
            "expires_at": "2099-01-01T00:00:00Z",
        },
    )
    assert r.status_code == 201
    created = r.json()
    assert set(created) == RECORD_KEYS
    assert created["allowed_node_ids"] == [node]
    assert created["expires_at"] == "2099-01-01T00:00:00.000Z"
    assert created["is_active"] is True and created["last_login_at"] is None
    listed = root.get("/api/v1/users").json()
    assert isinstance(listed, list) and created in listed
    assert root.get(f"/api/v1/users/{created['id']}").json() == created
    r = root.put(f"/api/v1/users/{created['id']}", json={"display_name": None, "is_active": False})
    assert r.status_code == 200
    assert r.json()["display_name"] is None and r.json()["is_active"] is False and r.json()["email"] == "t@example.com"
    assert root.delete(f"/api/v1/users/{created['id']}").status_code == 204
    assert root.get(f"/api/v1/users/{created['id']}").status_code == 404
    assert root.delete(f"/api/v1/users/{created['id']}").status_code == 404
    assert root.get("/api/v1/users/not-a-uuid").status_code == 404


def test_no_record_carries_a_password_or_its_hash(root: httpx.Client) -> None:
    text = root.get("/api/v1/users").text
    assert "argon2" not in text and "password" not in text


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("operator", 403), ("admin", 200), ("super_admin", 200)])
def test_users_routes_need_admin(manager: Manager, role: str, status: int) -> None:
    with as_role(manager, role) as c:
        assert c.get("/api/v1/users").status_code == status
        target = user_id(c, "the-viewer") if status == 200 else "3f0c7e0a-6f1e-4c2a-9a57-1d2b3c4d5e6f"
        assert c.get(f"/api/v1/users/{target}").status_code in ((403,) if status == 403 else (200,))
        body = {"username": f"made-by-{role}", "password": "Made-passw0rd", "role": "viewer"}
        assert c.post("/api/v1/users", json=body).status_code == (403 if status == 403 else 201)
        assert c.put(f"/api/v1/users/{target}", json={"display_name": role}).status_code == status
        if status == 403:
            assert c.delete(f"/api/v1/users/{target}").status_code == 403


def test_an_admin_cannot_make_touch_or_delete_a_super_admin(manager: Manager, root: httpx.Client) -> None:
    root_id = user_id(root, "root")
    viewer_id = user_id(root, "the-viewer")
    with as_role(manager, "admin") as admin:
        body = {"username": "wannabe", "password": "Wannabe-passw0rd", "role": "super_admin"}
        assert admin.post("/api/v1/users", json=body).status_code == 403
        # 403 comes before 400: the body is not even valid.
        assert admin.post("/api/v1/users", json={"role": "super_admin", "x": 1}).status_code == 403
        assert admin.put(f"/api/v1/users/{viewer_id}", json={"role": "super_admin"}).status_code == 403
        assert admin.put(f"/api/v1/users/{root_id}", json={"display_name": "x"}).status_code == 403
        assert admin.put(f"/api/v1/users/{root_id}", json={"bogus": 1}).status_code == 403
        assert admin.delete(f"/api/v1/users/{root_id}").status_code == 403
        assert admin.put(f"/api/v1/users/{viewer_id}", json={"role": "admin"}).status_code == 200
        assert admin.put(f"/api/v1/users/{viewer_id}", json={"role": "viewer"}).status_code == 200
    r = root.post(
        "/api/v1/users", json={"username": "second-root", "password": "Second-passw0rd", "role": "super_admin"}
    )
    assert r.status_code == 201
    assert root.delete(f"/api/v1/users/{r.json()['id']}").status_code == 204


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"username": "bad name!", "password": "Good-passw0rd", "role": "viewer"}, "username"),
        ({"username": "u" * 65, "password": "Good-passw0rd", "role": "viewer"}, "username"),
        ({"username": "okname", "password": "Sh0rt", "role": "viewer"}, "8-128 characters"),
        ({"username": "okname", "password": "alllowercase1", "role": "viewer"}, "upper-case"),
        ({"username": "okname", "password": "NoDigitsHere", "role": "viewer"}, "digit"),
        ({"username": "okname", "password": "Good-passw0rd", "role": "root"}, "role"),
        ({"username": "okname", "password": "Good-passw0rd", "role": "viewer", "colour": "x"}, "colour: unknown key"),
        ({"username": "okname", "password": "Good-passw0rd"}, "role"),
    ],
)
def test_policy_errors_are_400_naming_the_field_not_the_value(
    root: httpx.Client, body: dict[str, str], words: str
) -> None:
    r = root.post("/api/v1/users", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert words in error
    for value in body.values():
        if value not in ("viewer", "x"):
            assert value not in error


def test_put_refuses_nulls_unknown_keys_and_weak_passwords(root: httpx.Client) -> None:
    target = user_id(root, "the-operator")
    for body in ({"username": None}, {"is_active": None}, {"nope": 1}, {"password": "weakpassword"}):
        r = root.put(f"/api/v1/users/{target}", json=body)
        assert r.status_code == 400, body


def test_a_duplicate_username_is_409(root: httpx.Client) -> None:
    r = root.post("/api/v1/users", json={"username": "the-viewer", "password": "Other-passw0rd", "role": "viewer"})
    assert r.status_code == 409
    target = user_id(root, "the-operator")
    assert root.put(f"/api/v1/users/{target}", json={"username": "the-viewer"}).status_code == 409


def test_deactivation_and_a_new_password_end_the_users_sessions(manager: Manager, root: httpx.Client) -> None:
    r = root.post("/api/v1/users", json={"username": "short-lived", "password": "Short-passw0rd", "role": "viewer"})
    uid = r.json()["id"]
    with client_of(manager) as c:
        assert login(c, "short-lived", "Short-passw0rd").status_code == 200
        assert c.get("/api/v1/users").status_code == 403  # authenticated, a viewer
        assert root.put(f"/api/v1/users/{uid}", json={"password": "Newer-passw0rd"}).status_code == 200
        assert c.get("/api/v1/users").status_code == 401
        assert login(c, "short-lived", "Short-passw0rd").status_code == 401
        assert login(c, "short-lived", "Newer-passw0rd").status_code == 200
        assert root.put(f"/api/v1/users/{uid}", json={"is_active": False}).status_code == 200
        assert c.get("/api/v1/users").status_code == 401
        assert login(c, "short-lived", "Newer-passw0rd").status_code == 401


def test_an_expired_temporary_account_cannot_log_in(root: httpx.Client, manager: Manager) -> None:
    body = {
        "username": "expired",
        "password": "Expired-passw0rd",
        "role": "viewer",
        "expires_at": "2001-01-01T00:00:00Z",
    }
    assert root.post("/api/v1/users", json=body).status_code == 201
    with client_of(manager) as c:
        assert login(c, "expired", "Expired-passw0rd").status_code == 401


def test_reset_password_cli_revokes_the_sessions_of_a_running_manager(manager: Manager) -> None:
    with as_role(manager, "operator") as c:
        assert c.get("/api/v1/users").status_code == 403
        done = run_manager_cli(
            ["reset-password", "--data-dir", str(manager.data_dir), "--username", "the-operator", "--password-stdin"],
        )
        # No stdin given: an empty line is a policy error, nothing changes.
        assert done.returncode == 2
        assert c.get("/api/v1/users").status_code == 403
    with as_role(manager, "viewer") as other:
        done = subprocess.run(
            [
                str(MANAGER_BIN),
                "reset-password",
                "--data-dir",
                str(manager.data_dir),
                "--username",
                "the-viewer",
                "--password-stdin",
            ],
            input="Viewer-Reset-99\r\n",
            env=manager_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("password changed; ") and "0 session" not in done.stdout
        assert other.get("/api/v1/auth/logout").status_code == 405
        assert other.post("/api/v1/auth/logout").status_code == 401
    PASSWORDS["viewer"] = "Viewer-Reset-99"
    with as_role(manager, "viewer") as again:
        assert again.get("/api/v1/users").status_code == 403


def test_zz_no_password_or_secret_in_the_log_or_any_response(manager: Manager) -> None:
    """Runs last in this module (name order is file order here); searches everything seen."""
    secrets = [
        ADMIN_PASSWORD,
        JWT_SECRET,
        MASTER_KEY,
        *PASSWORDS.values(),
        "Viewer-Pw0rd-vie",
        "Operator-Pw0rd-ope",
        "Temp-passw0rd",
        "Short-passw0rd",
        "Newer-passw0rd",
        "Sh0rt",
        "alllowercase1",
        "weakpassword",
    ]
    assert BODIES, "the module's requests were recorded"
    log = manager.log()
    for secret in secrets:
        assert secret not in log
        for body in BODIES:
            assert secret not in body
    assert "argon2id" not in log and "argon2id" not in "".join(BODIES)


def test_a_session_jwt_is_never_logged(manager: Manager) -> None:
    with client_of(manager) as c:
        login(c)
        token = c.cookies["session"]
        c.get("/api/v1/users")
    assert token not in manager.log()
