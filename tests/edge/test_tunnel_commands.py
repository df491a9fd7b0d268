"""The manager's tunnel actions on the edge (interop.md 6): ``create_tunnel``, ``delete_tunnel``,
``update_config`` ("tunnels likewise") and the ``stats`` payload's ``tunnels``, through the
edge's ``EdgeLinkHost`` on an in-process edge whose tunnel worker runs the fake runner."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from appliance.manager_client import CommandOutcome
from appliance.models.stats import TunnelState
from appliance.protocol import CreateTunnel, DeleteTunnel, UpdateConfig
from services.edge.manager_link import EdgeLinkHost
from services.edge.service import EdgeService
from tests.edge.tunnel_edge import KEY, relay_tunnel, running_service, runs, until


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[EdgeService]:
    async with running_service(tmp_path) as service:
        yield service


async def test_create_and_delete_tunnel_commands(edge: EdgeService, tmp_path: Path) -> None:
    host = EdgeLinkHost(edge)
    body = relay_tunnel()
    tunnel_id = str(body["id"])
    assert await host.run_command(CreateTunnel(tunnel=body)) == CommandOutcome(success=True)
    assert [t.id for t in edge.tunnels()] == [tunnel_id]
    await until(lambda: runs(tmp_path, tunnel_id) == 1, "the tunnel to start")
    assert edge.store.read().tunnels[0].tunnel_encryption_key is not None  # persisted with its secret

    # The REST error texts (interop.md 6).
    again = await host.run_command(CreateTunnel(tunnel=body))
    assert again == CommandOutcome(success=False, error=f"tunnel '{tunnel_id}' already exists")
    bad = await host.run_command(CreateTunnel(tunnel={**relay_tunnel(), "tunnel_encryption_key": "x" + KEY[1:]}))
    assert not bad.success and bad.error is not None and bad.error.startswith("Validation failed:")
    assert "x" + KEY[1:] not in bad.error

    # The stats payload carries the tunnel summaries (interop.md 6 table), never a secret.
    payload = host.stats_payload().model_dump(mode="json")
    assert [t["id"] for t in payload["tunnels"]] == [tunnel_id]
    summary = payload["tunnels"][0]
    assert summary["relay_addr"] == "relay.example:4433" and summary["state"] in ("Connecting", "Connected")
    assert KEY not in json.dumps(payload)

    assert await host.run_command(DeleteTunnel(tunnel_id=tunnel_id)) == CommandOutcome(success=True)
    assert edge.tunnels() == [] and edge.store.read().tunnels == []
    assert edge.tunnel_supervisor.state(tunnel_id) is TunnelState.STOPPED
    missing = await host.run_command(DeleteTunnel(tunnel_id=tunnel_id))
    assert missing == CommandOutcome(success=False, error=f"tunnel '{tunnel_id}' not found")


async def test_update_config_adds_removes_restarts_and_leaves_tunnels_alone(edge: EdgeService, tmp_path: Path) -> None:
    host = EdgeLinkHost(edge)
    kept, changed, removed = relay_tunnel("kept"), relay_tunnel("changed"), relay_tunnel("removed")
    for body in (kept, changed, removed):
        assert (await host.run_command(CreateTunnel(tunnel=body))).success
    ids = {name: str(body["id"]) for name, body in (("kept", kept), ("changed", changed), ("removed", removed))}
    await until(lambda: all(runs(tmp_path, i) == 1 for i in ids.values()), "three tunnels to start")

    # As the manager sends it: the config it was shown (secrets stripped), edited.
    config = copy.deepcopy(edge.public_config())
    assert "tunnel_encryption_key" not in json.dumps(config)
    added = relay_tunnel("added")
    config["tunnels"] = [
        t if t["id"] != ids["changed"] else {**t, "local_addr": "127.0.0.1:7100"}
        for t in config["tunnels"]
        if t["id"] != ids["removed"]
    ] + [added]
    outcome = await host.run_command(UpdateConfig(config=config))
    assert outcome == CommandOutcome(success=True), outcome

    assert [t.name for t in edge.tunnels()] == ["kept", "changed", "added"]
    await until(lambda: runs(tmp_path, str(added["id"])) == 1, "the added tunnel to start")
    await until(lambda: runs(tmp_path, ids["changed"]) == 2, "the changed tunnel to restart")
    assert edge.tunnel(ids["changed"]).local_addr == "127.0.0.1:7100"
    assert runs(tmp_path, ids["kept"]) == 1  # untouched
    assert edge.tunnel_supervisor.state(ids["removed"]) is TunnelState.STOPPED
    # Secrets the manager never saw were kept (interop.md 2.7) and reached the restarted runner.
    assert (tmp_path / "fake" / f"{ids['changed']}.secret").read_text() == KEY

    def tunnel_events() -> list[str]:
        return [e.message for e in edge.events.since(0, 1000) if e.category == "tunnel"]

    await until(lambda: tunnel_events().count("tunnel 'added' started") == 1, "the worker's events")
    events = tunnel_events()
    assert events.count("tunnel 'changed' stopped") == 1 and events.count("tunnel 'removed' stopped") == 1
    assert "tunnel 'kept' stopped" not in events
