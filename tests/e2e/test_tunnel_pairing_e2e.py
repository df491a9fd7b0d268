"""The manager pairs two edges through a relay, end to end (issue 16): a real ``mp-manager``,
a real ``mp-relay`` (``require_bind_auth: true``) and two real ``mp-edge``, all registered with
the manager over WSS on loopback.

``POST /api/v1/tunnels`` authorises the tunnel on the relay and creates it on both edges; the
edges reach ``Connected``, a UDP datagram sent to the source edge's ``ingress_local_addr``
arrives on the sink's ``egress_local_addr``, and the relay lists the tunnel ``active``. Then
fail-closed: a tunnel created on the two edges directly, which the relay was never told
about, is refused by the relay (``Failed``, "bind authentication failed"). Last, unpairing
through the command route as docs/manager.md describes it.
"""

from __future__ import annotations

import json
import socket
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
from tests.helpers.relay import LOOPBACK, Relay, start_relay, wait_tunnel_delivers

pytestmark = pytest.mark.e2e

API_TOKEN = "relay-api-token-" + "7" * 24
SERVER = {"listen_addr": "127.0.0.1", "listen_port": 8080}  # the flags give the real port


@dataclass
class Fleet:
    manager: Manager
    admin: httpx.Client
    relay: Relay
    relay_id: str
    source: Edge
    source_id: str
    sink: Edge
    sink_id: str


def manager_block(manager: Manager, token: str) -> dict[str, Any]:
    return {
        "enabled": True,
        "url": f"wss://127.0.0.1:{manager.port}/ws/node",
        "cert_fingerprint": manager_fingerprint(manager),
        "registration_token": token,
    }


def new_node(admin: httpx.Client, name: str, device_type: str) -> tuple[str, str]:
    r = admin.post("/api/v1/nodes", json={"name": name, "device_type": device_type})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["registration_token"]


def online(admin: httpx.Client, node_id: str) -> bool:
    return bool(admin.get(f"/api/v1/nodes/{node_id}").json()["status"] == "online")


def command(admin: httpx.Client, node_id: str, action: dict[str, Any]) -> httpx.Response:
    return admin.post(f"/api/v1/nodes/{node_id}/command", json={"action": action}, timeout=20)


def tunnel_state(edge: Edge, tunnel_id: str) -> str:
    answer = httpx.get(f"{edge.url}/api/v1/tunnels/{tunnel_id}", timeout=5)
    return str(answer.json().get("state")) if answer.status_code == 200 else f"HTTP {answer.status_code}"


def wait_state(edge: Edge, tunnel_id: str, state: str, timeout: float = 40.0) -> None:
    wait_for(lambda: tunnel_state(edge, tunnel_id) == state, timeout=timeout, interval=0.1)


def relay_tunnels(relay: Relay) -> list[dict[str, Any]]:
    answer = httpx.get(relay.url + "/api/v1/tunnels", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=5)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["tunnels"])


def edge_events(edge: Edge) -> str:
    return json.dumps(httpx.get(f"{edge.url}/api/v1/events", timeout=5).json())


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    assert setup_super_admin(tmp_path / "manager").returncode == 0
    with ExitStack() as stack:
        manager = start_manager(tmp_path / "manager")
        stack.callback(manager.stop)
        admin = stack.enter_context(manager.client(timeout=30))
        assert login(admin).status_code == 200

        relay_id, relay_token = new_node(admin, "relay-1", "relay")
        config = tmp_path / "relay" / "relay.json"
        config.parent.mkdir()
        relay_json = {"api_token": API_TOKEN, "require_bind_auth": True, "manager": manager_block(manager, relay_token)}
        config.write_text(json.dumps(relay_json))
        relay = start_relay(config, *LOOPBACK)
        stack.callback(relay.stop)

        edges: list[tuple[Edge, str]] = []
        for name in ("edge-source", "edge-sink"):
            node_id, token = new_node(admin, name, "edge")
            edge_config = {
                "version": 1,
                "device_name": name,
                "setup_enabled": True,
                "server": SERVER,
                "manager": manager_block(manager, token),
            }
            edge = start_edge(tmp_path / name, config=edge_config, wait=False)  # both boot side by side
            stack.callback(edge.stop)
            edges.append((edge, node_id))
        for edge, _ in edges:
            wait_healthy(edge)
        (source, source_id), (sink, sink_id) = edges
        for node_id in (relay_id, source_id, sink_id):
            wait_for(lambda node_id=node_id: online(admin, node_id), timeout=30)
        yield Fleet(manager, admin, relay, relay_id, source, source_id, sink, sink_id)


def test_the_manager_pairs_two_edges_through_a_relay_that_refuses_unpaired_tunnels(fleet: Fleet) -> None:
    entry, delivery = free_udp_port(), free_udp_port()
    sink_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink_socket.bind(("127.0.0.1", delivery))
    sink_socket.settimeout(0.2)
    try:
        body = {
            "name": "Cam 1 to studio",
            "protocol": "udp",
            "mode": "relay",
            "ingress_node_id": fleet.source_id,
            "egress_node_id": fleet.sink_id,
            "ingress_local_addr": f"127.0.0.1:{entry}",
            "egress_local_addr": f"127.0.0.1:{delivery}",
            "relay_node_id": fleet.relay_id,
            "relay_addr": fleet.relay.quic,
        }
        r = fleet.admin.post("/api/v1/tunnels", json=body)
        assert r.status_code == 201, r.text
        tunnel_id = r.json()["id"]
        assert r.json()["relay_node_id"] == fleet.relay_id and r.json()["transport"] == "quic"

        wait_state(fleet.sink, tunnel_id, "Connected")
        wait_state(fleet.source, tunnel_id, "Connected")
        source_summary = httpx.get(f"{fleet.source.url}/api/v1/tunnels/{tunnel_id}", timeout=5).json()
        sink_summary = httpx.get(f"{fleet.sink.url}/api/v1/tunnels/{tunnel_id}", timeout=5).json()
        assert source_summary["direction"] == "egress" and source_summary["local_addr"] == f"127.0.0.1:{entry}"
        assert sink_summary["direction"] == "ingress" and sink_summary["local_addr"] == f"127.0.0.1:{delivery}"

        # A datagram into the source edge comes out at the sink's egress_local_addr.
        payload = b"paired by the manager " + uuid.uuid4().bytes

        wait_tunnel_delivers(entry, sink_socket, payload)

        listed = {t["tunnel_id"]: t for t in relay_tunnels(fleet.relay)}
        assert listed[tunnel_id]["status"] == "active"
        assert listed[tunnel_id]["ingress_edge_id"] is not None and listed[tunnel_id]["egress_edge_id"] is not None

        # The manager recorded the pairing, without a secret.
        events = fleet.admin.get("/api/v1/events", params={"category": "tunnel", "per_page": 200}).json()
        paired = [e for e in events if e["message"] == "Tunnel paired"]
        assert len(paired) == 1 and paired[0]["details"]["tunnel_id"] == tunnel_id
        secrets_text = json.dumps(paired) + r.text
        assert "tunnel_encryption_key" not in secrets_text and "tunnel_bind_secret" not in secrets_text

        # Fail-closed: a tunnel the relay was never told about (created on the edges directly).
        rogue_id = str(uuid.uuid4())
        rogue_entry, rogue_delivery = free_udp_port(), free_udp_port()
        through = {
            "id": rogue_id,
            "name": "unpaired",
            "protocol": "udp",
            "mode": "relay",
            "relay_addr": fleet.relay.quic,
            "tunnel_encryption_key": "5a" * 32,
            "tunnel_bind_secret": "c3" * 32,
        }
        for edge, direction, local in (
            (fleet.sink, "ingress", rogue_delivery),
            (fleet.source, "egress", rogue_entry),
        ):
            r = httpx.post(
                f"{edge.url}/api/v1/tunnels",
                json={**through, "direction": direction, "local_addr": f"127.0.0.1:{local}"},
                timeout=10,
            )
            assert r.status_code == 201, r.text
        wait_state(fleet.sink, rogue_id, "Failed")
        wait_state(fleet.source, rogue_id, "Failed")
        for edge in (fleet.sink, fleet.source):
            wait_for(lambda edge=edge: "bind authentication failed" in edge_events(edge), timeout=10)
        assert rogue_id not in {t["tunnel_id"] for t in relay_tunnels(fleet.relay)}
        # The paired tunnel is untouched.
        assert tunnel_state(fleet.source, tunnel_id) == "Connected"

        # Unpairing through the command route (docs/manager.md "Pairing a tunnel").
        for node_id in (fleet.source_id, fleet.sink_id):
            r = command(fleet.admin, node_id, {"type": "delete_tunnel", "tunnel_id": tunnel_id})
            assert r.status_code == 200, r.text
        r = command(fleet.admin, fleet.relay_id, {"type": "revoke_tunnel", "tunnel_id": tunnel_id})
        assert r.status_code == 200, r.text
        wait_for(lambda: tunnel_id not in {t["tunnel_id"] for t in relay_tunnels(fleet.relay)}, timeout=15)
        assert tunnel_state(fleet.source, tunnel_id) == "HTTP 404"
        assert tunnel_state(fleet.sink, tunnel_id) == "HTTP 404"
    finally:
        sink_socket.close()
