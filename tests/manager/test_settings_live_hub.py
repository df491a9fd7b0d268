"""``node_offline_threshold_secs`` changed through ``PUT /api/v1/settings`` reaches the node hub
at once (interop.md 7.5: every setting takes effect live): a silent node goes offline after the
new 5 s, not the default 30."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.helpers.manager import Manager, start_manager
from tests.manager.test_auth import prepared_data_dir
from tests.manager.test_nodes_live import client_as, live_node, wait_status

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    started = start_manager(prepared_data_dir(tmp_path_factory.mktemp("settings-hub")))
    try:
        yield started
    finally:
        started.stop()


async def test_the_offline_threshold_applies_live(manager: Manager) -> None:
    async with client_as(manager) as root:
        r = await root.put("/api/v1/settings", json={"settings": {"node_offline_threshold_secs": 5}})
        assert r.status_code == 200 and r.json()["node_offline_threshold_secs"] == 5
        async with live_node(manager, root) as (node_id, node):
            node.silent = True  # no stats, no pongs: only the threshold can take it offline
            started = time.monotonic()
            await wait_status(root, node_id, "offline", timeout_s=20)
            took = time.monotonic() - started
        assert 4.0 <= took < 15.0, took
