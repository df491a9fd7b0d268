"""The real ``mp-manager serve`` takes nodes on ``/ws/node`` (the hub wired into the process).

The node is created in the manager's own store file (the REST node routes come next), then a
test node written against ``appliance.protocol`` registers over real WSS with its token, and
the manager records it online with its config cached.
"""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

import pytest
import trio
from pydantic import SecretStr

from services.manager.store import NewNode, NodeStatus, Store, sqlite_url
from tests.helpers.manager import start_manager
from tests.helpers.test_node import NodeCredentials, connect_node

pytestmark = pytest.mark.e2e


async def test_a_node_registers_with_the_running_manager(tmp_path: Path) -> None:
    data_dir = tmp_path / "manager"
    manager = await trio.to_thread.run_sync(start_manager, data_dir)
    try:
        token = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
        store = await Store.open(sqlite_url(data_dir))
        try:
            digest = hashlib.sha256(token.encode()).hexdigest()
            node_id = (await store.create_node(NewNode(name="ob-truck-3", registration_token_digest=digest))).id
            context = ssl.create_default_context(cafile=str(manager.cert_path))
            url = f"wss://127.0.0.1:{manager.port}/ws/node"
            credentials = NodeCredentials(registration_token=SecretStr(token))
            async with connect_node(url, context, credentials) as node:
                await node.wait_authenticated()
                with trio.fail_after(10):
                    while True:
                        record = await store.get_node(node_id)
                        if record.status is NodeStatus.ONLINE and (await store.get_cached_config(node_id)) is not None:
                            break
                        await trio.sleep(0.05)
            with trio.fail_after(10):
                while (await store.get_node(node_id)).status is not NodeStatus.OFFLINE:
                    await trio.sleep(0.05)
        finally:
            await store.aclose()
    finally:
        await trio.to_thread.run_sync(manager.stop)
    assert token not in manager.log()
