"""The node routes with a node connected: a real ``mp-manager serve`` and the test node of
``tests/helpers/test_node.py`` registering over WSS with the token ``POST /api/v1/nodes`` gave.

Commands round trip (200, 422 with the node's text, 504 from a silent node after the hub's
10 s, 502 once it is gone), the config cache (GET verbatim, PUT as ``update_config``), a new
token kicking the node, DELETE closing its socket, and no token in the log.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from pydantic import SecretStr

from appliance.protocol import DeviceType, NodeCredentials, wire_action
from tests.helpers.manager import ADMIN_PASSWORD, ADMIN_USER, Manager, login, start_manager
from tests.helpers.test_node import Reply, TestNode, connect_node
from tests.manager.test_auth import prepared_data_dir

pytestmark = pytest.mark.e2e

TOKENS: list[str] = []
OPERATOR = ("the-operator", "Operator-Pw0rd-7")


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    started = start_manager(
        prepared_data_dir(tmp_path_factory.mktemp("nodes-live")), extra_args=["--log-level", "debug"]
    )
    try:
        with started.client() as root:
            assert login(root).status_code == 200
            body = {"username": OPERATOR[0], "password": OPERATOR[1], "role": "operator"}
            assert root.post("/api/v1/users", json=body).status_code == 201
        yield started
    finally:
        started.stop()


@asynccontextmanager
async def client_as(
    manager: Manager, username: str = ADMIN_USER, password: str = ADMIN_PASSWORD
) -> AsyncIterator[httpx.AsyncClient]:
    context = ssl.create_default_context(cafile=str(manager.cert_path))
    async with httpx.AsyncClient(base_url=manager.url, verify=context, timeout=20) as client:
        r = await client.post("/api/v1/auth/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
        yield client


@asynccontextmanager
async def live_node(manager: Manager, root: httpx.AsyncClient, **create: Any) -> AsyncIterator[tuple[str, TestNode]]:
    """A node created through the REST API, registered and online."""
    r = await root.post("/api/v1/nodes", json={"name": "live", **create})
    assert r.status_code == 201, r.text
    node_id, token = r.json()["id"], r.json()["registration_token"]
    TOKENS.append(token)
    context = ssl.create_default_context(cafile=str(manager.cert_path))
    credentials = NodeCredentials(registration_token=SecretStr(token))
    kind = DeviceType(create.get("device_type", "edge"))
    url = f"wss://127.0.0.1:{manager.port}/ws/node"
    async with connect_node(url, context, credentials, device_type=kind) as node:
        await node.wait_authenticated()
        assert node.registered is not None and node.registered.node_id == node_id
        await wait_status(root, node_id, "online")
        yield node_id, node


async def wait_status(client: httpx.AsyncClient, node_id: str, status: str, timeout_s: float = 10) -> dict[str, Any]:
    with trio.fail_after(timeout_s):
        while True:
            record: dict[str, Any] = (await client.get(f"/api/v1/nodes/{node_id}")).json()
            if record["status"] == status:
                return record
            await trio.sleep(0.05)


async def test_commands_and_config_round_trip(manager: Manager) -> None:
    async with client_as(manager) as root, client_as(manager, *OPERATOR) as operator:
        async with live_node(manager, root) as (node_id, node):
            record = await wait_status(root, node_id, "online")
            assert record["software_version"] == "0.3.0" and record["protocol_version"] == 1

            # GET config: the cache, as the node sent it (key order and all).
            node.config = {"version": 1, "flows": [], "zeta": 1, "alpha": {"b": 2, "a": 1}}
            r = await operator.post(f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "get_config"}})
            assert r.status_code == 200, r.text
            assert r.json()["success"] is True and r.json()["data"] == node.config
            r = await operator.get(f"/api/v1/nodes/{node_id}/config")
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert r.text == json.dumps(node.config, separators=(",", ":"))

            # A command: relayed verbatim (only ``action`` read), acked.
            r = await operator.post(
                f"/api/v1/nodes/{node_id}/command",
                json={"action": {"type": "start_flow", "flow_id": "cam1"}, "note": "ignored"},
            )
            assert r.status_code == 200, r.text
            assert set(r.json()) == {"command_id", "success"} and r.json()["success"] is True
            sent = [c for c in node.commands if c.action.type == "start_flow"]
            assert len(sent) == 1 and str(sent[0].command_id) == r.json()["command_id"]
            assert wire_action(sent[0].action) == {"type": "start_flow", "flow_id": "cam1"}

            # data from the ack is passed through.
            node.replies["stop_flow"] = Reply(data={"stopped": ["cam1"]})
            r = await operator.post(
                f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "stop_flow", "flow_id": "cam1"}}
            )
            assert r.json()["data"] == {"stopped": ["cam1"]}

            # 422: the node's error text.
            node.replies["restart_flow"] = Reply(success=False, error="Flow 'cam1' is not running")
            r = await operator.post(
                f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "restart_flow", "flow_id": "cam1"}}
            )
            assert r.status_code == 422 and r.json() == {"error": "Flow 'cam1' is not running"}

            # PUT config: sent as update_config, verbatim; the cache is refreshed after it.
            new_config = {"version": 1, "flows": [{"id": "cam2", "name": "Cam 2"}], "z": [1, 2.5, None]}
            before = len(node.commands)
            node.config = new_config
            r = await operator.put(f"/api/v1/nodes/{node_id}/config", json=new_config)
            assert r.status_code == 200, r.text
            assert r.json() == new_config
            updates = [c for c in node.commands[before:] if c.action.type == "update_config"]
            assert len(updates) == 1 and wire_action(updates[0].action)["config"] == new_config
            with trio.fail_after(5):
                while (await operator.get(f"/api/v1/nodes/{node_id}/config")).json() != new_config:
                    await trio.sleep(0.05)

            # A config the node refuses: 422.
            node.replies["update_config"] = Reply(success=False, error="flows[0].id: Field required")
            r = await operator.put(f"/api/v1/nodes/{node_id}/config", json={"flows": [{}]})
            assert r.status_code == 422 and r.json() == {"error": "flows[0].id: Field required"}

        # The node is gone: 502 for commands and config.
        await wait_status(root, node_id, "offline")
        r = await operator.post(f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "get_config"}})
        assert r.status_code == 502
        assert (await operator.get(f"/api/v1/nodes/{node_id}/config")).status_code == 502
        assert (await operator.put(f"/api/v1/nodes/{node_id}/config", json={})).status_code == 502


async def test_a_silent_node_times_out_with_504(manager: Manager) -> None:
    async with client_as(manager, *OPERATOR) as operator, client_as(manager) as root:
        async with live_node(manager, root) as (node_id, node):
            node.replies["start_flow"] = None  # never answers this one
            started = trio.current_time()
            r = await operator.post(
                f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "start_flow", "flow_id": "cam1"}}
            )
            elapsed = trio.current_time() - started
            assert r.status_code == 504, r.text
            assert r.json() == {"error": "Node did not answer within the timeout"}
            assert 9.5 <= elapsed < 15
            # The connection is still up and answering.
            r = await operator.post(f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "get_config"}})
            assert r.status_code == 200


async def test_config_get_waits_for_the_cache(manager: Manager) -> None:
    """After a mutating command the cache is dropped; GET polls it until the node answers."""
    async with client_as(manager, *OPERATOR) as operator, client_as(manager) as root:
        async with live_node(manager, root) as (node_id, node):
            node.replies["get_config"] = None  # stops answering get_config: no fresh cache
            r = await operator.post(
                f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "delete_flow", "flow_id": "cam1"}}
            )
            assert r.status_code == 200
            started = trio.current_time()
            r = await operator.get(f"/api/v1/nodes/{node_id}/config")
            assert r.status_code == 502 and r.json() == {"error": "Node has not reported its config"}
            assert 2.8 <= trio.current_time() - started < 6


async def test_new_token_kicks_the_node_and_voids_its_secret(manager: Manager) -> None:
    async with client_as(manager) as root:
        async with live_node(manager, root) as (node_id, node):
            assert node.registered is not None
            old = NodeCredentials(node_id=node_id, node_secret=node.registered.node_secret)
            r = await root.post(f"/api/v1/nodes/{node_id}/token")
            assert r.status_code == 200 and set(r.json()) == {"registration_token"}
            token = r.json()["registration_token"]
            TOKENS.append(token)
            await node.wait_closed()
        assert (await root.get(f"/api/v1/nodes/{node_id}")).json()["status"] == "pending"
        context = ssl.create_default_context(cafile=str(manager.cert_path))
        url = f"wss://127.0.0.1:{manager.port}/ws/node"
        async with connect_node(url, context, old) as stale:
            await stale.wait_closed()
            assert stale.rejected == "Invalid node secret"
        async with connect_node(url, context, NodeCredentials(registration_token=SecretStr(token))) as fresh:
            await fresh.wait_authenticated()
            assert fresh.registered is not None and fresh.registered.node_id == node_id
            await wait_status(root, node_id, "online")


async def test_delete_closes_the_live_socket(manager: Manager) -> None:
    async with client_as(manager) as root:
        async with live_node(manager, root) as (node_id, node):
            r = await root.delete(f"/api/v1/nodes/{node_id}")
            assert r.status_code == 204
            await node.wait_closed()
        assert (await root.get(f"/api/v1/nodes/{node_id}")).status_code == 404
        assert node_id not in {n["id"] for n in (await root.get("/api/v1/nodes")).json()}


async def test_relay_commands(manager: Manager) -> None:
    async with client_as(manager, *OPERATOR) as operator, client_as(manager) as root:
        async with live_node(manager, root, device_type="relay") as (node_id, node):
            node.replies["list_tunnels"] = Reply(data={"tunnels": []})
            r = await operator.post(f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "list_tunnels"}})
            assert r.status_code == 200 and r.json()["data"] == {"tunnels": []}
            r = await operator.post(
                f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "start_flow", "flow_id": "cam1"}}
            )
            assert r.status_code == 400


def test_zz_no_registration_token_in_the_log(manager: Manager) -> None:
    assert len(TOKENS) >= 6
    log = manager.log()
    assert "POST /api/v1/nodes" in log
    for token in TOKENS:
        assert token not in log
