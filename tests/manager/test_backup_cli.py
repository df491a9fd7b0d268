"""``mp-manager backup`` / ``restore`` end to end: the real manager, a real node over WSS, both backends.

A node registers with the first manager and stays connected while the backup is taken
(online). The backup is restored into an empty data directory (or an empty PostgreSQL
database), a second manager starts there, and the node reconnects with the secret it
got at registration; the session cookie issued before the backup still works.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pydantic import SecretStr

from appliance.protocol import EventPayload, NodeCredentials
from tests.helpers.manager import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    Manager,
    manager_env,
    run_manager_cli,
    setup_super_admin,
    start_manager,
)
from tests.helpers.postgres import PostgresCluster, require_postgres, running_postgres
from tests.helpers.test_node import connect_node

from .test_nodes_live import wait_status


@pytest.fixture(scope="module")
def postgres_cluster() -> Iterator[PostgresCluster]:
    with running_postgres(require_postgres()) as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def databases(request: pytest.FixtureRequest) -> tuple[list[str], list[str]]:
    """The ``--database-url`` arguments of the source and of the target manager."""
    if request.param == "sqlite":
        return [], []
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return (
        ["--database-url", cluster.create_database("source")],
        ["--database-url", cluster.create_database("target")],
    )


def _context(manager: Manager) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(manager.cert_path))


async def _wait_events(client: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    with trio.fail_after(10):
        while True:
            response = await client.get("/api/v1/events")
            if len(response.json()) >= count:
                return list(response.json())
            await trio.sleep(0.05)


async def test_a_node_reconnects_to_the_restored_manager_with_its_old_secret(
    tmp_path: Path, databases: tuple[list[str], list[str]]
) -> None:
    source_db, target_db = databases
    source_dir, target_dir = tmp_path / "source", tmp_path / "target"
    assert setup_super_admin(source_dir, extra_args=source_db).returncode == 0
    source = start_manager(source_dir, extra_args=source_db)
    backup_file = tmp_path / "manager.backup"
    try:
        async with httpx.AsyncClient(base_url=source.url, verify=_context(source), timeout=20) as root:
            r = await root.post("/api/v1/auth/login", json={"username": ADMIN_USER, "password": ADMIN_PASSWORD})
            assert r.status_code == 200, r.text
            session_cookies = dict(root.cookies)
            csrf = r.json()["csrf_token"]
            root.headers["X-CSRF-Token"] = csrf
            r = await root.post("/api/v1/nodes", json={"name": "cam-north"})
            assert r.status_code == 201, r.text
            node_id, token = r.json()["id"], r.json()["registration_token"]
            assert (
                await root.put("/api/v1/settings", json={"settings": {"events_retention_days": 12}})
            ).status_code == 200
            r = await root.post("/api/v1/ai/keys", json={"provider": "anthropic", "api_key": "sk-ant-backup-test"})
            assert r.status_code in (200, 201), r.text

            url = f"wss://127.0.0.1:{source.port}/ws/node"
            credentials = NodeCredentials(registration_token=SecretStr(token))
            async with connect_node(url, _context(source), credentials) as node:
                await node.wait_authenticated()
                assert node.registered is not None
                node_secret = node.registered.node_secret
                await wait_status(root, node_id, "online")
                await node.send_event(EventPayload(severity="warning", category="flow", message="input lost"))
                await _wait_events(root, 1)

                # Online: the node stays connected and the manager serves during the backup.
                done = await trio.to_thread.run_sync(
                    lambda: run_manager_cli(
                        ["backup", "--output", str(backup_file), "--data-dir", str(source_dir), *source_db]
                    )
                )
                assert done.returncode == 0, done.stderr
                assert "backed up" in done.stdout
                assert (await root.get("/health")).status_code == 200
                assert not node.closed.is_set()
    finally:
        assert source.stop() == 0
    assert backup_file.stat().st_mode & 0o777 == 0o600

    restored = run_manager_cli(["restore", str(backup_file), "--data-dir", str(target_dir), *target_db])
    assert restored.returncode == 0, restored.stderr
    assert "1 users" in restored.stdout and "1 nodes" in restored.stdout
    assert (target_dir / "tls" / "key.pem").read_bytes() == (source_dir / "tls" / "key.pem").read_bytes()
    # A second restore finds data and changes nothing.
    again = run_manager_cli(["restore", str(backup_file), "--data-dir", str(target_dir), *target_db])
    assert again.returncode == 1 and "already holds data" in again.stderr

    target = start_manager(target_dir, extra_args=target_db)
    try:
        async with httpx.AsyncClient(
            base_url=target.url, verify=_context(target), timeout=20, cookies=session_cookies
        ) as root:
            root.headers["X-CSRF-Token"] = csrf
            # The session from before the backup (same MEDIAPLANE_JWT_SECRET) is still valid.
            r = await root.get("/api/v1/users")
            assert r.status_code == 200 and [u["username"] for u in r.json()] == [ADMIN_USER]
            record = (await root.get(f"/api/v1/nodes/{node_id}")).json()
            assert record["name"] == "cam-north" and record["status"] == "offline"
            events = await _wait_events(root, 1)
            assert any(e["message"] == "input lost" for e in events)
            assert (await root.get("/api/v1/settings")).json()["events_retention_days"] == 12
            keys = (await root.get("/api/v1/ai/keys")).json()
            assert [k["provider"] for k in keys] == ["anthropic"]

            url = f"wss://127.0.0.1:{target.port}/ws/node"
            credentials = NodeCredentials(node_id=node_id, node_secret=node_secret)
            async with connect_node(url, _context(target), credentials) as node:
                await node.wait_authenticated()
                assert node.rejected is None
                await wait_status(root, node_id, "online")
    finally:
        assert target.stop() == 0


def test_backup_and_restore_refuse_clearly(tmp_path: Path) -> None:
    source_dir = tmp_path / "source"
    assert setup_super_admin(source_dir).returncode == 0
    backup_file = tmp_path / "b"

    # The master key is required, named and never echoed.
    missing = run_manager_cli(
        ["backup", "--output", str(backup_file), "--data-dir", str(source_dir)],
        env=manager_env(MEDIAPLANE_MASTER_KEY=None),
    )
    assert missing.returncode == 2 and "MEDIAPLANE_MASTER_KEY is not set" in missing.stderr
    assert not backup_file.exists()
    nothing = run_manager_cli(["backup", "--output", str(backup_file), "--data-dir", str(tmp_path / "none")])
    assert nothing.returncode == 1 and "does not exist" in nothing.stderr

    assert run_manager_cli(["backup", "--output", str(backup_file), "--data-dir", str(source_dir)]).returncode == 0
    other_key = "1234abcd" * 8
    wrong = run_manager_cli(
        ["restore", str(backup_file), "--data-dir", str(tmp_path / "t1")],
        env=manager_env(MEDIAPLANE_MASTER_KEY=other_key),
    )
    assert wrong.returncode == 1 and "MEDIAPLANE_MASTER_KEY is not the key it was made with" in wrong.stderr
    assert other_key not in wrong.stderr + wrong.stdout
    assert not (tmp_path / "t1" / "manager.db").exists()

    not_a_file = run_manager_cli(["restore", str(tmp_path / "absent"), "--data-dir", str(tmp_path / "t2")])
    assert not_a_file.returncode == 2 and "is not a file" in not_a_file.stderr
    # Restoring onto the source itself: it holds data.
    onto_source = run_manager_cli(["restore", str(backup_file), "--data-dir", str(source_dir)])
    assert onto_source.returncode == 1 and "already holds data" in onto_source.stderr
