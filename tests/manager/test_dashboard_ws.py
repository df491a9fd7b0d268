"""``/ws/dashboard`` on a real ``mp-manager serve`` with a test node on ``/ws/node``.

The session is checked before the upgrade (401 without one, with a bad Bearer, or with a revoked
one); the first update carries the node online with its stats; updates keep to
``stats_broadcast_interval_ms``; a browser that stops reading does not delay another; a viewer
sees only its ``allowed_node_ids``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from pydantic import SecretStr
from trio_websocket import ConnectionRejected, WebSocketConnection, open_websocket_url

from appliance.protocol import NodeCredentials
from services.manager.store import NewNode, Store, sqlite_url
from tests.helpers.manager import Manager, login, setup_super_admin, start_manager
from tests.helpers.test_node import TestNode, connect_node

pytestmark = pytest.mark.e2e

EDGE_STATS: dict[str, object] = {
    "flows": [{"id": "cam1", "health": "Healthy"}],
    "tunnels": [],
    "uptime_secs": 321,
    "active_flows": 1,
    "total_flows": 1,
}


@dataclass
class Setup:
    manager: Manager
    store: Store
    context: ssl.SSLContext
    session: str
    """The super_admin's session JWT (the ``session`` cookie's value)."""

    def url(self, path: str) -> str:
        return f"wss://127.0.0.1:{self.manager.port}{path}"

    async def add_node(self, name: str) -> tuple[uuid.UUID, str]:
        token = str(uuid.uuid4())
        digest = hashlib.sha256(token.encode()).hexdigest()
        record = await self.store.create_node(NewNode(name=name, registration_token_digest=digest))
        return record.id, token

    @asynccontextmanager
    async def node(self, token: str) -> AsyncIterator[TestNode]:
        credentials = NodeCredentials(registration_token=SecretStr(token))
        async with connect_node(self.url("/ws/node"), self.context, credentials) as node:
            await node.wait_authenticated()
            yield node

    @asynccontextmanager
    async def browser(
        self, *, cookie: str | None = None, bearer: str | None = None
    ) -> AsyncIterator[WebSocketConnection]:
        headers = []
        if cookie is not None:
            headers.append((b"Cookie", f"session={cookie}".encode()))
        if bearer is not None:
            headers.append((b"Authorization", f"Bearer {bearer}".encode()))
        async with open_websocket_url(
            self.url("/ws/dashboard"),
            self.context,
            extra_headers=headers,
            max_message_size=16 * 1024 * 1024,
            connect_timeout=5,
            disconnect_timeout=2,
        ) as ws:
            yield ws


@asynccontextmanager
async def running(tmp_path: Path, interval_ms: int) -> AsyncIterator[Setup]:
    data_dir = tmp_path / "manager"
    done = await trio.to_thread.run_sync(setup_super_admin, data_dir)
    assert done.returncode == 0, done.stderr
    store = await Store.open(sqlite_url(data_dir))
    try:
        await store.put_settings({"stats_broadcast_interval_ms": interval_ms})
        manager = await trio.to_thread.run_sync(start_manager, data_dir)
        try:
            session = await trio.to_thread.run_sync(_login, manager)
            context = ssl.create_default_context(cafile=str(manager.cert_path))
            yield Setup(manager, store, context, session)
        finally:
            await trio.to_thread.run_sync(manager.stop)
    finally:
        await store.aclose()


def _login(manager: Manager, username: str | None = None, password: str | None = None) -> str:
    with manager.client() as client:
        response = login(client) if username is None else login(client, username, password or "")
        assert response.status_code == 200, response.text
        session = client.cookies.get("session")
        assert session
        return session


async def _updates(ws: WebSocketConnection, count: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    with trio.fail_after(timeout_s):
        while len(got) < count:
            got.append(json.loads(await ws.get_message()))
    return got


async def _wait_for(ws: WebSocketConnection, predicate: Any, timeout_s: float = 10) -> dict[str, Any]:
    with trio.fail_after(timeout_s):
        while True:
            message: dict[str, Any] = json.loads(await ws.get_message())
            if predicate(message):
                return message


def _stamp(message: dict[str, Any]) -> float:
    return datetime.fromisoformat(message["timestamp"].replace("Z", "+00:00")).timestamp()


async def _rejected(setup: Setup, **kwargs: str) -> int:
    with pytest.raises(ConnectionRejected) as caught:
        async with setup.browser(**kwargs):
            pass
    assert caught.value.body is not None and b"error" in caught.value.body
    return caught.value.status_code


async def test_the_session_is_checked_before_the_upgrade(tmp_path: Path) -> None:
    async with running(tmp_path, 1000) as setup:
        assert await _rejected(setup) == 401
        assert await _rejected(setup, bearer="not-a-jwt") == 401
        assert await _rejected(setup, cookie="not-a-jwt") == 401
        # A revoked session (logout) is refused even though its JWT still verifies.
        revoked = await trio.to_thread.run_sync(_login, setup.manager)

        def logout() -> None:
            with setup.manager.client() as client:
                headers = {"Authorization": f"Bearer {revoked}", "X-CSRF-Token": "bearer-client"}
                answer = client.post("/api/v1/auth/logout", headers=headers)
                assert answer.status_code == 200, answer.text

        await trio.to_thread.run_sync(logout)
        assert await _rejected(setup, cookie=revoked) == 401
        assert await _rejected(setup, bearer=revoked) == 401
        # The live session works as a cookie and as a Bearer header.
        for kwargs in ({"cookie": setup.session}, {"bearer": setup.session}):
            async with setup.browser(**kwargs) as ws:
                (message,) = await _updates(ws, 1)
                assert message["type"] == "dashboard_update"


async def test_the_node_online_with_its_stats_paced_by_the_setting(tmp_path: Path) -> None:
    async with running(tmp_path, 200) as setup:
        node_id, token = await setup.add_node("ob-truck-3")
        async with setup.node(token) as node:
            await node.send_health({"status": "ok", "version": "0.3.0", "uptime_secs": 320})
            await node.send_stats(EDGE_STATS)
            async with setup.browser(cookie=setup.session) as ws:
                await ws.send_message('{"type":"ignored"}')  # push-only: client frames are dropped
                first = await _wait_for(
                    ws, lambda m: m["payload"]["nodes"] and m["payload"]["nodes"][0]["stats"] is not None
                )
                shown = first["payload"]["nodes"][0]
                assert shown["node_id"] == str(node_id)
                assert shown["name"] == "ob-truck-3"
                assert shown["device_type"] == "edge"
                assert shown["status"] == "online"
                assert shown["stats"] == EDGE_STATS
                assert shown["health"]["uptime_secs"] == 320
                assert shown["software_version"] == "0.3.0"
                assert shown["protocol_version"] == 1
                assert shown["uptime_secs"] == 321
                assert first["payload"]["online_count"] == 1
                for _ in range(20):
                    await ws.send_message("still ignored")
                paced = await _updates(ws, 8)
        stamps = [_stamp(m) for m in [first, *paced]]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert min(gaps) >= 0.199, gaps  # at most one per 200 ms (timestamps have ms precision)
        assert max(gaps) < 1.5, gaps
        # The node goes away: the next updates show it offline, without stats.
        async with setup.browser(bearer=setup.session) as ws:
            gone = await _wait_for(ws, lambda m: m["payload"]["nodes"][0]["status"] == "offline")
            assert gone["payload"]["nodes"][0]["stats"] is None
            assert gone["payload"]["online_count"] == 0


async def test_a_browser_that_stops_reading_does_not_delay_another(tmp_path: Path) -> None:
    async with running(tmp_path, 100) as setup:
        _, token = await setup.add_node("big-stats")
        async with setup.node(token) as node:
            # ~400 KB per update: a browser that stops reading fills its TCP buffers within a second.
            await node.send_stats({**EDGE_STATS, "padding": "x" * 400_000})
            async with setup.browser(cookie=setup.session) as slow, setup.browser(cookie=setup.session) as fast:
                await _updates(slow, 1)  # then it stops reading
                start = trio.current_time()
                got = await _updates(fast, 30, timeout_s=10)
                elapsed = trio.current_time() - start
                stamps = [_stamp(m) for m in got]
                gaps = [b - a for a, b in itertools.pairwise(stamps)]
                assert elapsed < 8, elapsed  # 30 at 100 ms: about 3 s (slack for a loaded machine)
                assert max(gaps) < 1.5, gaps  # a stalled producer would stop it for good
                # The slow one is still connected, and still gets updates once it reads again.
                assert len(await _updates(slow, 3)) == 3


@pytest.mark.parametrize("role", ["viewer", "operator"])
async def test_a_user_below_admin_sees_only_its_allowed_nodes(tmp_path: Path, role: str) -> None:
    # One node-access rule everywhere (services/manager/auth.py visible_node_ids), as the node
    # and event routes apply it: an operator with a list is limited like a viewer.
    async with running(tmp_path, 200) as setup:
        allowed, _ = await setup.add_node("allowed")
        await setup.add_node("hidden")

        def create_viewer() -> None:
            with setup.manager.client() as client:
                login(client)
                answer = client.post(
                    "/api/v1/users",
                    json={
                        "username": "watcher",
                        "password": "Watcher-Passw0rd",
                        "role": role,
                        "allowed_node_ids": [str(allowed)],
                    },
                )
                assert answer.status_code in (200, 201), answer.text

        await trio.to_thread.run_sync(create_viewer)
        viewer = await trio.to_thread.run_sync(_login, setup.manager, "watcher", "Watcher-Passw0rd")
        async with setup.browser(cookie=viewer) as ws:
            (message,) = await _updates(ws, 1)
        assert [n["name"] for n in message["payload"]["nodes"]] == ["allowed"]
        async with setup.browser(cookie=setup.session) as ws:
            (message,) = await _updates(ws, 1)
        assert sorted(n["name"] for n in message["payload"]["nodes"]) == ["allowed", "hidden"]
