"""``GET /api/v1/export``, ``POST /api/v1/import`` and ``mp-manager export`` (interop.md 1.3, 7.5, 13)."""

from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pydantic import SecretStr

from services.manager.secrets import SecretBox
from services.manager.store import AiProvider, NewNode, Store, sqlite_url
from tests.helpers.manager import ADMIN_PASSWORD, MASTER_KEY, Manager, login, run_manager_cli, start_manager
from tests.manager.test_auth import prepared_data_dir
from tests.manager.test_nodes import NODE_KEYS

pytestmark = pytest.mark.e2e

PASSWORD = "Export-passw0rd"
TOKEN = "0d9f5c1e-7b7a-4f43-9a7e-2c1d3e4f5a6b"
NODE_SECRET = "node-secret-3c9e8a1f7b2d4e6f"
AI_KEY = "sk-test-ai-key-4b1c9d"
SECRETS_TEXT: list[str] = []
"""Every ciphertext, digest and hash stored: none may appear in an export."""


def seed(data_dir: Path) -> None:
    """A node with a token digest and a secret, an AI key, all written as the hub and AI routes would."""
    box = SecretBox(SecretStr(MASTER_KEY))

    async def write() -> None:
        async with await Store.open(sqlite_url(data_dir)) as store:
            digest = hashlib.sha256(TOKEN.encode()).hexdigest()
            await store.create_node(NewNode(name="ob-truck-1", registration_token_digest=digest))
            await store.create_node(
                NewNode(name="relay-1", registration_token_digest=hashlib.sha256(b"other").hexdigest())
            )
            secret_ciphertext = box.encrypt(NODE_SECRET)
            assert await store.consume_registration_token(digest, secret_ciphertext) is not None
            root = await store.get_user_by_username("root")
            assert root is not None
            key_ciphertext = box.encrypt(AI_KEY)
            await store.put_ai_key(root.id, AiProvider.OPENAI, key_ciphertext, model_preference="gpt-4.1")
            SECRETS_TEXT.extend([digest, secret_ciphertext, key_ciphertext, root.password_hash])

    trio.run(write)


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    data_dir = prepared_data_dir(tmp_path_factory.mktemp("export"))
    seed(data_dir)
    started = start_manager(data_dir)
    try:
        with started.client() as root:
            login(root)
            for role in ("viewer", "operator", "admin"):
                body = {"username": f"the-{role}", "password": PASSWORD, "role": role}
                assert root.post("/api/v1/users", json=body).status_code == 201
            assert root.put("/api/v1/settings", json={"settings": {"events_retention_days": 12}}).status_code == 200
        yield started
    finally:
        started.stop()


@pytest.fixture
def root(manager: Manager) -> Iterator[httpx.Client]:
    with manager.client() as c:
        assert login(c).status_code == 200
        yield c


def assert_no_secret(text: str) -> None:
    lowered = text.lower()
    for needle in (*[s for s in SECRETS_TEXT if s], TOKEN, NODE_SECRET, AI_KEY, ADMIN_PASSWORD, PASSWORD):
        assert needle.lower() not in lowered
    words = ("argon2", "password", "hash", "secret", "digest", "token", "ciphertext", "api_key", '"session"', "jti")
    for word in words:
        assert word not in lowered, word


def test_export_has_users_nodes_and_settings_and_no_secret(root: httpx.Client) -> None:
    r = root.get("/api/v1/export")
    assert r.status_code == 200
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-disposition"].startswith('attachment; filename="mediaplane-manager-export-')
    body = r.json()
    assert set(body) == {"version", "exported_at", "users", "nodes", "settings"}
    assert body["version"] == 1 and body["exported_at"].endswith("Z")
    assert {u["username"] for u in body["users"]} == {"root", "the-viewer", "the-operator", "the-admin"}
    assert body["users"] == root.get("/api/v1/users").json()
    assert {n["name"] for n in body["nodes"]} == {"ob-truck-1", "relay-1"}
    assert body["nodes"] == root.get("/api/v1/nodes").json()  # one node record, as the routes answer it
    assert set(body["nodes"][0]) == NODE_KEYS
    assert body["settings"]["events_retention_days"] == 12 and len(body["settings"]) == 6
    assert_no_secret(r.text)


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("operator", 403), ("admin", 200)])
def test_export_and_import_need_admin(manager: Manager, role: str, status: int) -> None:
    with manager.client() as c:
        assert login(c, f"the-{role}", PASSWORD).status_code == 200
        assert c.get("/api/v1/export").status_code == status
        r = c.post("/api/v1/import", json={"version": 1})
        assert r.status_code == (501 if status == 200 else 403)
    with manager.client() as anonymous:
        assert anonymous.get("/api/v1/export").status_code == 401
        assert anonymous.post("/api/v1/import", json={}, headers={"X-CSRF-Token": "x"}).status_code == 401


def test_import_is_not_implemented(root: httpx.Client) -> None:
    r = root.post("/api/v1/import", json=root.get("/api/v1/export").json())
    assert r.status_code == 501 and r.json() == {"error": "import not implemented"}
    # Without the CSRF header: 403 comes first.
    csrf = root.headers.pop("X-CSRF-Token")
    assert root.post("/api/v1/import", json={}).status_code == 403
    root.headers["X-CSRF-Token"] = csrf


def without_stamp(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "exported_at"}


def test_the_cli_writes_the_same_json(manager: Manager, root: httpx.Client, tmp_path: Path) -> None:
    output = tmp_path / "out" / "export.json"
    output.parent.mkdir()
    done = run_manager_cli(["export", "--output", str(output), "--data-dir", str(manager.data_dir)])
    assert done.returncode == 0, done.stderr
    assert "4 user(s), 2 node(s)" in done.stdout
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    written = json.loads(output.read_text())
    assert without_stamp(written) == without_stamp(root.get("/api/v1/export").json())
    assert written["exported_at"].endswith("Z")
    assert_no_secret(output.read_text())
    # Atomic replacement of an existing file, and no temp file left.
    output.write_text("old")
    output.chmod(0o644)
    assert run_manager_cli(["export", "--output", str(output), "--data-dir", str(manager.data_dir)]).returncode == 0
    assert json.loads(output.read_text())["version"] == 1
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    assert [p.name for p in output.parent.iterdir()] == ["export.json"]


def test_the_cli_fails_cleanly(tmp_path: Path) -> None:
    missing = run_manager_cli(["export", "--output", str(tmp_path / "x.json"), "--data-dir", str(tmp_path / "no")])
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    no_option = run_manager_cli(["export", "--data-dir", str(tmp_path)])
    assert no_option.returncode == 2
