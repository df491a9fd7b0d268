"""The real ``mp-edge`` linked to the real ``mp-manager`` over WSS on loopback (issue 14).

Registration with a token, credential persistence, status, stats and health, every edge
command through ``POST /api/v1/nodes/{id}/command`` and ``PUT .../config`` acting on the running
edge, events of the edge arriving in the manager, and reconnection after a manager restart
with the events of the outage delivered in order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, free_udp_port, start_edge, wait_for, wait_healthy
from tests.helpers.manager import Manager, login, manager_fingerprint, setup_super_admin, start_manager


@dataclass
class Linked:
    manager: Manager
    admin: httpx.Client
    node_id: str
    edge: Edge
    config_dir: Path


def edge_config(
    manager: Manager, token: str, *, flows: list[dict[str, Any]] | None = None, host: str = "127.0.0.1"
) -> dict[str, Any]:
    """A first-boot edge config pointing at ``manager`` (its certificate pinned) with ``token``."""
    return {
        "version": 1,
        "device_name": "ob-truck-3",
        "setup_enabled": True,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
        "manager": {
            "enabled": True,
            "url": f"wss://{host}:{manager.port}/ws/node",
            "cert_fingerprint": manager_fingerprint(manager),
            "registration_token": token,
        },
        "flows": flows or [],
    }


def rtp_flow(flow_id: str, enabled: bool = False) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "enabled": enabled,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [{"type": "rtp", "id": "out-a", "name": "A", "dest_addr": f"127.0.0.1:{free_udp_port()}"}],
    }


def node_status(admin: httpx.Client, node_id: str) -> str:
    return str(admin.get(f"/api/v1/nodes/{node_id}").json()["status"])


def command(admin: httpx.Client, node_id: str, action: dict[str, Any]) -> httpx.Response:
    return admin.post(f"/api/v1/nodes/{node_id}/command", json={"action": action}, timeout=20)


def manager_events(admin: httpx.Client, node_id: str) -> list[dict[str, Any]]:
    rows = admin.get("/api/v1/events", params={"node_id": node_id, "per_page": 200}).json()
    return list(reversed(rows))  # oldest first


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Linked]:
    assert setup_super_admin(tmp_path / "manager").returncode == 0
    manager = start_manager(tmp_path / "manager")
    admin = manager.client(timeout=20)
    state: Linked | None = None
    try:
        assert login(admin).status_code == 200
        created = admin.post("/api/v1/nodes", json={"name": "ob-truck-3"})
        assert created.status_code == 201, created.text
        node_id, token = created.json()["id"], created.json()["registration_token"]
        config_dir = tmp_path / "edge"
        edge = start_edge(config_dir, config=edge_config(manager, token, flows=[rtp_flow("cam1"), rtp_flow("cam2")]))
        state = Linked(manager, admin, node_id, edge, config_dir)
        wait_for(lambda: node_status(admin, node_id) == "online", timeout=30)
        yield state
    finally:
        if state is not None:
            state.edge.stop()  # the one running now: a test may have restarted it
        admin.close()
        manager.stop()


def test_registration_persists_credentials_and_the_link_reports_its_state(linked: Linked) -> None:
    config = json.loads((linked.config_dir / "config.json").read_text())
    assert config["manager"]["node_id"] == linked.node_id
    assert config["setup_enabled"] is False
    assert "registration_token" not in config["manager"] and "node_secret" not in config["manager"]
    secrets_text = (linked.config_dir / "secrets.json").read_text()
    assert secrets_text.startswith("v1:")  # encrypted at rest; the secret is in there, not in config.json

    with linked.edge.client() as client:
        status = client.get("/api/v1/manager").json()["data"]
    assert status["state"] == "connected" and status["node_id"] == linked.node_id
    assert status["registered"] is True and status["has_registration_token"] is False
    assert status["connected_since"] is not None

    record = linked.admin.get(f"/api/v1/nodes/{linked.node_id}").json()
    assert record["software_version"] and record["protocol_version"] == 1
    # health reached the manager (last_health) and stats keep the node online
    wait_for(lambda: linked.admin.get(f"/api/v1/nodes/{linked.node_id}").json().get("status") == "online")


def test_every_command_acts_on_the_running_edge(linked: Linked) -> None:
    admin, node_id = linked.admin, linked.node_id
    r = command(admin, node_id, {"type": "get_config"})
    assert r.status_code == 200, r.text
    config = r.json()["data"]
    assert [f["id"] for f in config["flows"]] == ["cam1", "cam2"]
    assert "node_secret" not in json.dumps(config) and "registration_token" not in json.dumps(config)

    assert command(admin, node_id, {"type": "start_flow", "flow_id": "cam1"}).status_code == 200
    with linked.edge.client() as client:
        wait_for(lambda: client.get("/api/v1/stats/cam1").json()["data"]["state"] == "Running")
    again = command(admin, node_id, {"type": "start_flow", "flow_id": "cam1"})
    assert again.status_code == 422 and "already" in again.json()["error"]
    assert command(admin, node_id, {"type": "restart_flow", "flow_id": "cam1"}).status_code == 200
    assert command(admin, node_id, {"type": "stop_flow", "flow_id": "cam1"}).status_code == 200
    missing = command(admin, node_id, {"type": "stop_flow", "flow_id": "nope"})
    assert missing.status_code == 422 and missing.json()["error"] == "flow 'nope' not found"

    new_flow = rtp_flow("cam3", enabled=True)
    assert command(admin, node_id, {"type": "create_flow", "flow": new_flow}).status_code == 200
    bad = command(admin, node_id, {"type": "create_flow", "flow": {"id": "x"}})
    assert bad.status_code == 422 and bad.json()["error"].startswith("Validation failed:")
    output = {"type": "udp", "id": "out-b", "name": "B", "dest_addr": f"127.0.0.1:{free_udp_port()}"}
    assert command(admin, node_id, {"type": "add_output", "flow_id": "cam3", "output": output}).status_code == 200
    r = command(admin, node_id, {"type": "remove_output", "flow_id": "cam3", "output_id": "out-b"})
    assert r.status_code == 200
    changed = {**new_flow, "name": "Renamed"}
    assert command(admin, node_id, {"type": "update_flow", "flow_id": "cam3", "flow": changed}).status_code == 200
    with linked.edge.client() as client:
        assert client.get("/api/v1/flows/cam3").json()["data"]["name"] == "Renamed"
    assert command(admin, node_id, {"type": "delete_flow", "flow_id": "cam3"}).status_code == 200

    tunnel = command(admin, node_id, {"type": "delete_tunnel", "tunnel_id": "t1"})
    assert tunnel.status_code == 422 and tunnel.json()["error"] == "tunnel 't1' not found"

    # PUT config: update_config, diffed: cam2 removed, cam1 kept untouched.
    current = admin.get(f"/api/v1/nodes/{node_id}/config").json()
    current["flows"] = [f for f in current["flows"] if f["id"] == "cam1"]
    r = admin.put(f"/api/v1/nodes/{node_id}/config", json=current, timeout=20)
    assert r.status_code == 200, r.text
    with linked.edge.client() as client:
        assert [f["id"] for f in client.get("/api/v1/flows").json()["data"]["flows"]] == ["cam1"]
    # The link stays up with its credentials (update_config kept the stored node secret).
    assert command(admin, node_id, {"type": "get_config"}).status_code == 200


def test_events_arrive_in_the_manager_and_queue_through_a_manager_restart(linked: Linked, tmp_path: Path) -> None:
    admin, node_id = linked.admin, linked.node_id
    assert command(admin, node_id, {"type": "start_flow", "flow_id": "cam1"}).status_code == 200
    wait_for(lambda: any(e["message"] == "flow started" for e in manager_events(admin, node_id)), timeout=15)

    assert linked.manager.stop() == 0
    with linked.edge.client() as client:
        wait_for(lambda: client.get("/api/v1/manager").json()["data"]["state"] != "connected", timeout=30)
        # Events while the manager is away: queued, in order.
        for flow_id in ("cam1", "cam2", "cam1"):
            path = "stop" if client.get(f"/api/v1/stats/{flow_id}").json()["data"]["state"] == "Running" else "start"
            assert client.post(f"/api/v1/flows/{flow_id}/{path}").status_code == 200
        queued = client.get("/api/v1/manager").json()["data"]["events_queued"]
        assert queued >= 3
        local = [e["message"] for e in client.get("/api/v1/events").json()["data"]["events"]][-3:]

    restarted = start_manager(linked.manager.data_dir, port=linked.manager.port)
    try:
        with restarted.client(timeout=20) as admin2:
            assert login(admin2).status_code == 200
            wait_for(lambda: node_status(admin2, node_id) == "online", timeout=70)
            wait_for(
                lambda: (
                    [e["message"] for e in manager_events(admin2, node_id) if e["category"] == "flow"][-3:] == local
                ),
                timeout=15,
            )
            with linked.edge.client() as client:
                wait_for(lambda: client.get("/api/v1/manager").json()["data"]["events_queued"] == 0)
    finally:
        restarted.stop()


def test_rotate_secret_is_persisted_before_the_ack_and_used_after_a_restart(linked: Linked) -> None:
    admin, node_id = linked.admin, linked.node_id
    before = (linked.config_dir / "secrets.json").read_bytes()
    new_secret = "5a1d0c9e-rotated-" + "7" * 16
    r = command(admin, node_id, {"type": "rotate_secret", "new_secret": new_secret})
    assert r.status_code == 200, r.text
    assert (linked.config_dir / "secrets.json").read_bytes() != before
    assert new_secret.encode() not in (linked.config_dir / "secrets.json").read_bytes()  # encrypted at rest

    port = linked.edge.port
    assert linked.edge.stop() == 0
    wait_for(lambda: node_status(admin, node_id) == "offline", timeout=15)
    linked.edge = start_edge(linked.config_dir, port=port)
    wait_for(lambda: node_status(admin, node_id) == "online", timeout=30)
    with linked.edge.client() as client:
        assert client.get("/api/v1/manager").json()["data"]["state"] == "connected"


def _edge_with_manager_block(config_dir: Path, manager: Manager, block: dict[str, Any], **kwargs: Any) -> Edge:
    config = {
        "version": 1,
        "setup_enabled": False,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
        "manager": {"enabled": True, "url": f"wss://127.0.0.1:{manager.port}/ws/node", **block},
        "flows": [],
    }
    return start_edge(config_dir, config=config, **kwargs)


def _link(edge: Edge) -> dict[str, Any]:
    with edge.client() as client:
        return dict(client.get("/api/v1/manager").json()["data"])


def test_a_refused_certificate_or_secret_is_reported_and_retried(tmp_path: Path) -> None:
    assert setup_super_admin(tmp_path / "manager").returncode == 0
    manager = start_manager(tmp_path / "manager")
    try:
        with ExitStack() as stack:
            # The three edges (each its own config dir) boot side by side, then each is checked.
            # A pinned fingerprint that is not the manager's: refused before anything is sent.
            wrong_pin = ":".join(["AB"] * 32)
            pinned = _edge_with_manager_block(
                tmp_path / "edge-pin", manager, {"cert_fingerprint": wrong_pin, "registration_token": "t"}, wait=False
            )
            stack.callback(pinned.stop)
            # accept_self_signed_cert without MEDIAPLANE_ALLOW_INSECURE=1: the CA check stays on.
            unverified = _edge_with_manager_block(
                tmp_path / "edge-ca", manager, {"accept_self_signed_cert": True, "registration_token": "t"}, wait=False
            )
            stack.callback(unverified.stop)
            # With it, TLS passes and a wrong node secret is refused by the manager: a critical
            # manager event on the edge, and the reason in the link's state.
            block = {"accept_self_signed_cert": True, "node_id": str(uuid.uuid4()), "node_secret": "wrong-secret"}
            refused = _edge_with_manager_block(
                tmp_path / "edge-secret", manager, block, extra_env={"MEDIAPLANE_ALLOW_INSECURE": "1"}, wait=False
            )
            stack.callback(refused.stop)
            for edge in (pinned, unverified, refused):
                wait_healthy(edge)

            wait_for(lambda: _link(pinned)["last_error"] is not None, timeout=20)
            status = _link(pinned)
            assert status["state"] in ("waiting", "connecting")
            assert "does not match cert_fingerprint" in status["last_error"]

            wait_for(lambda: _link(unverified)["last_error"] is not None, timeout=20)
            assert "TLS with the manager failed" in _link(unverified)["last_error"]

            wait_for(lambda: "refused authentication" in (_link(refused)["last_error"] or ""), timeout=20)
            with refused.client() as client:
                events = client.get("/api/v1/events").json()["data"]["events"]
            assert any(e["category"] == "manager" and e["severity"] == "critical" for e in events)
            assert "wrong-secret" not in refused.log()
    finally:
        manager.stop()


def test_a_flow_failing_to_start_reaches_the_manager_as_a_critical_event(linked: Linked) -> None:
    import socket

    admin, node_id = linked.admin, linked.node_id
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", 0))  # the new flow's input address, already taken
        port = squatter.getsockname()[1]
        flow = {**rtp_flow("cam9"), "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{port}"}}
        assert command(admin, node_id, {"type": "create_flow", "flow": flow}).status_code == 200
        failed = command(admin, node_id, {"type": "start_flow", "flow_id": "cam9"})
        assert failed.status_code == 422 and "failed to start" in failed.json()["error"]

    def critical_for_cam9() -> list[dict[str, Any]]:
        return [e for e in manager_events(admin, node_id) if e["flow_id"] == "cam9" and e["severity"] == "critical"]

    wait_for(lambda: critical_for_cam9() != [], timeout=15)
    assert critical_for_cam9()[0]["category"] == "flow"
