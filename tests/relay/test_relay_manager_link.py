"""The real ``mp-relay`` linked to the real ``mp-manager`` over WSS on loopback.

Registration with a token (relay.json rewritten at 0600 with ``manager.node_id`` and
``manager.node_secret``, the token gone), the relay's health and stats in the manager, relay
commands through ``POST /api/v1/nodes/{id}/command`` acting on the running relay, and
``get_config`` without secrets.
"""

from __future__ import annotations

import json
import socket
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appliance.relayproto import BindAuthorization
from services.relay.native_plane import Register, decode_ack, encode_register
from tests.helpers.edge import wait_for
from tests.helpers.manager import Manager, login, manager_fingerprint, setup_super_admin, start_manager
from tests.helpers.relay import LOOPBACK, Relay, start_relay

pytestmark = pytest.mark.e2e

API_TOKEN = "relay-api-token-" + "5" * 24
TID = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
SECRET = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


@dataclass
class Linked:
    manager: Manager
    admin: httpx.Client
    node_id: str
    token: str
    relay: Relay
    config: Path


def command(admin: httpx.Client, node_id: str, action: dict[str, Any]) -> httpx.Response:
    return admin.post(f"/api/v1/nodes/{node_id}/command", json={"action": action}, timeout=20)


@pytest.fixture
def linked(tmp_path: Path) -> Iterator[Linked]:
    assert setup_super_admin(tmp_path / "manager").returncode == 0
    manager = start_manager(tmp_path / "manager")
    admin = manager.client(timeout=20)
    relay: Relay | None = None
    try:
        assert login(admin).status_code == 200
        created = admin.post("/api/v1/nodes", json={"name": "relay-1", "device_type": "relay"})
        assert created.status_code == 201, created.text
        node_id, token = created.json()["id"], created.json()["registration_token"]
        config = tmp_path / "relay" / "relay.json"
        config.parent.mkdir()
        config.write_text(
            json.dumps(
                {
                    "api_token": API_TOKEN,
                    "require_bind_auth": True,
                    "manager": {
                        "enabled": True,
                        "url": f"wss://127.0.0.1:{manager.port}/ws/node",
                        "cert_fingerprint": manager_fingerprint(manager),
                        "registration_token": token,
                    },
                }
            )
        )
        relay = start_relay(config, *LOOPBACK)
        wait_for(lambda: admin.get(f"/api/v1/nodes/{node_id}").json()["status"] == "online", timeout=30)
        yield Linked(manager, admin, node_id, token, relay, config)
    finally:
        if relay is not None:
            relay.stop()
        admin.close()
        manager.stop()


def test_registration_rewrites_relay_json_at_0600(linked: Linked) -> None:
    assert stat.S_IMODE(linked.config.stat().st_mode) == 0o600
    written = json.loads(linked.config.read_text())
    manager = written["manager"]
    assert manager["node_id"] == linked.node_id
    assert isinstance(manager["node_secret"], str) and manager["node_secret"]
    assert "registration_token" not in manager
    assert written["api_token"] == API_TOKEN  # kept
    log = linked.relay.log()
    assert linked.token not in log and manager["node_secret"] not in log and API_TOKEN not in log

    record = linked.admin.get(f"/api/v1/nodes/{linked.node_id}").json()
    assert record["device_type"] == "relay" and record["protocol_version"] == 1

    def relay_health() -> dict[str, Any]:
        return dict(httpx.get(linked.relay.url + "/health", timeout=5).json())

    wait_for(lambda: relay_health().get("manager", {}).get("connected") is True, timeout=15)
    assert relay_health()["manager"] == {"connected": True, "disconnected_secs": 0, "reconnecting": False}
    metrics = httpx.get(linked.relay.url + "/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=5)
    assert "mediaplane_relay_manager_connected 1.0" in metrics.text


def test_commands_act_on_the_running_relay(linked: Linked) -> None:
    admin, node_id = linked.admin, linked.node_id
    auth = BindAuthorization.from_secret(SECRET, TID)
    r = command(
        admin,
        node_id,
        {
            "type": "authorize_tunnel",
            "tunnel_id": TID,
            "ingress_token": auth.ingress_token,
            "egress_token": auth.egress_token,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True
    # The relay holds the tokens now: a native register carrying the right one is acked.
    host, port = linked.relay.udp.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as edge:
        edge.settimeout(5)
        edge.bind(("127.0.0.1", 0))
        edge.sendto(encode_register(Register(uuid.UUID(TID), "ingress", auth.ingress_token)), (host, int(port)))
        ack = decode_ack(edge.recvfrom(2048)[0])
    assert ack.tunnel_id == uuid.UUID(TID) and ack.ready is False

    r = command(admin, node_id, {"type": "list_tunnels"})
    assert r.status_code == 200 and r.json()["data"] == {"tunnels": []}
    r = command(admin, node_id, {"type": "list_udp_sessions"})
    assert r.status_code == 200
    (session,) = r.json()["data"]["sessions"]
    assert session["tunnel_id"] == TID and session["status"] == "waiting_egress"
    r = command(admin, node_id, {"type": "list_edges"})
    assert r.status_code == 200 and r.json()["data"] == {"edges": []}
    r = command(admin, node_id, {"type": "revoke_tunnel", "tunnel_id": TID})
    assert r.status_code == 200 and r.json()["success"] is True
    r = command(admin, node_id, {"type": "revoke_tunnel", "tunnel_id": TID})
    assert r.status_code == 422  # nothing left to revoke: the node's text
    r = command(admin, node_id, {"type": "close_udp_session", "tunnel_id": TID})
    assert r.status_code == 200 and r.json()["success"] is True
    r = command(admin, node_id, {"type": "close_udp_session", "tunnel_id": TID})
    assert r.status_code == 422 and TID in r.text

    r = admin.get(f"/api/v1/nodes/{node_id}/config")
    assert r.status_code == 200, r.text
    config = r.json()
    assert "api_token" not in config and API_TOKEN not in r.text
    assert config["manager"]["node_id"] == node_id
    assert "node_secret" not in config["manager"] and "registration_token" not in config["manager"]
