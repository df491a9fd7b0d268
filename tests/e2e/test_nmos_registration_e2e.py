"""A real mp-edge registers with a Registration API (the test registry of tests/helpers, which
validates every POST against the AMWA schema): node first, then everything in order, heartbeats,
a flow added through the REST API reaches the registry, and a garbage-collected node registers
again."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers.edge import free_udp_port, start_edge
from tests.helpers.nmos_registry import NmosRegistry, run_registry

pytestmark = pytest.mark.e2e


def rtp_flow(flow_id: str) -> dict[str, object]:
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "enabled": True,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [{"type": "rtp", "id": "out", "name": "Out", "dest_addr": f"127.0.0.1:{free_udp_port()}"}],
    }


async def test_the_edge_registers_heartbeats_follows_changes_and_reregisters(tmp_path: Path) -> None:
    registry = NmosRegistry()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_registry, registry)
        config = {
            "version": 1,
            "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
            "nmos": {"registry_url": registry.url, "label": "edge under test"},
            "flows": [rtp_flow("cam1")],
        }
        edge = await trio.to_thread.run_sync(functools.partial(start_edge, tmp_path / "edge", config=config))
        try:
            await registry.wait_for(lambda: len(registry.of_type("sender")) == 1, timeout=30)
            assert not registry.rejected
            kinds = [entry[1] for entry in registry.log if entry[0] == "POST" and entry[1].startswith("resource")]
            assert kinds[:2] == ["resource node", "resource device"]
            node = next(iter(registry.of_type("node").values()))
            assert node["label"] == "edge under test"
            assert node["api"]["endpoints"][0]["port"] == edge.port
            await registry.wait_for(lambda: registry.heartbeats >= 2, timeout=20)

            # A flow added through the REST API reaches the registry.
            async with httpx.AsyncClient(base_url=edge.url, timeout=10) as client:
                answer = await client.post("/api/v1/flows", json=rtp_flow("cam2"))
                assert answer.status_code == 200, answer.text
            await registry.wait_for(lambda: len(registry.of_type("receiver")) == 2, timeout=20)
            assert not registry.rejected
            await registry.wait_for(lambda: registry.log[-1][1] == "health", timeout=20)  # settled

            # Garbage-collected: the next heartbeat's 404 brings everything back.
            registry.forget()
            await registry.wait_for(lambda: len(registry.of_type("receiver")) == 2, timeout=20)
            assert not registry.rejected
        finally:
            await trio.to_thread.run_sync(edge.stop)
            nursery.cancel_scope.cancel()
