"""``RelayService`` with its real QUIC plane: two bare aioquic edges (``FakeEdge`` of
test_quic_relay) bind a tunnel with the manager's tokens, and the REST routes, stats, events and
relay commands see it and act on it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import trio

from appliance.http.app import serve
from appliance.protocol import DeviceType, action_types_for, parse_action
from appliance.quic import QuicEndpoint, open_udp_socket
from appliance.relayproto import BindAuthorization
from services.relay.api import build_app
from services.relay.config import RelayConfigStore
from services.relay.manager_link import RelayLinkHost
from services.relay.service import RelayService
from tests.relay.test_quic_relay import SECRET, TUNNEL, FakeEdge, bind

TOKEN = "relay-api-token-" + "3" * 24
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Setup:
    service: RelayService
    client: httpx.AsyncClient
    ingress: FakeEdge
    egress: FakeEdge
    events: list[tuple[str, str, str]]


@asynccontextmanager
async def relay_with_edges(tmp_path: Path) -> AsyncIterator[Setup]:
    path = tmp_path / "relay.json"
    path.write_text(
        json.dumps(
            {
                "api_token": TOKEN,
                "require_bind_auth": True,
                "api_addr": "127.0.0.1:0",
                "quic_addr": "127.0.0.1:0",
                "udp_relay_enabled": False,
            }
        )
    )
    store = RelayConfigStore(path)
    store.load()
    service = RelayService(store, version="test")
    events: list[tuple[str, str, str]] = []
    publish = service.publish

    def recording(severity: str, category: str, message: str) -> None:
        events.append((severity, category, message))
        publish(severity, category, message)

    service.publish = recording  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        bound = await nursery.start(partial(serve, build_app(service), "127.0.0.1", 0))
        host, port = service.quic_bound.rsplit(":", 1)  # type: ignore[union-attr]
        edges = []
        for name in ("edge-in", "edge-out"):
            endpoint = QuicEndpoint(open_udp_socket(("127.0.0.1", 0)))
            await nursery.start(endpoint.run)
            edge = FakeEdge(endpoint, (host, int(port)))
            edge.send(type="hello", protocol_version=2, software_version="t")
            await edge.wait(lambda e=edge: "hello_ack" in e.types())
            edge.send(type="identify", edge_id=name)
            edges.append(edge)
        async with httpx.AsyncClient(base_url=bound[0], timeout=10) as client:
            yield Setup(service, client, edges[0], edges[1], events)
        nursery.cancel_scope.cancel()


async def test_a_quic_tunnel_through_the_service(tmp_path: Path) -> None:
    async with relay_with_edges(tmp_path) as setup:
        service, client, ingress, egress = setup.service, setup.client, setup.ingress, setup.egress
        host = RelayLinkHost(service)
        supported = action_types_for(DeviceType.RELAY)
        auth = BindAuthorization.from_secret(SECRET, TUNNEL)
        action = {
            "type": "authorize_tunnel",
            "tunnel_id": TUNNEL,
            "ingress_token": auth.ingress_token,
            "egress_token": auth.egress_token,
        }
        assert (await host.run_command(parse_action(action, supported=supported))).success is True

        await bind(ingress, "ingress", "udp", "f" * 64)  # a wrong token: refused, a critical event
        await ingress.wait(lambda: "tunnel_down" in ingress.types())
        assert any(e[0] == "critical" and e[1] == "tunnel" and "bind rejected" in e[2] for e in setup.events)
        await bind(ingress, "ingress", "udp", auth.ingress_token)
        await bind(egress, "egress", "udp", auth.egress_token)
        await egress.wait(lambda: "tunnel_ready" in egress.types())
        await ingress.wait(lambda: "tunnel_ready" in ingress.types())

        tunnels = (await client.get("/api/v1/tunnels", headers=BEARER)).json()["tunnels"]
        assert len(tunnels) == 1
        entry = tunnels[0]
        assert entry["status"] == "active" and entry["protocol"] == "udp"
        assert (entry["ingress_edge_id"], entry["egress_edge_id"]) == ("edge-in", "edge-out")
        assert entry["ingress_remote_addr"].startswith("127.0.0.1:")
        assert entry["stats"]["uptime_secs"] >= 0
        edges = (await client.get("/api/v1/edges", headers=BEARER)).json()["edges"]
        assert sorted(e["edge_id"] for e in edges) == ["edge-in", "edge-out"]
        assert ("info", "tunnel", f"tunnel {TUNNEL} ready") in setup.events
        assert sum(1 for e in setup.events if e[1] == "edge" and "connected" in e[2]) == 2

        # One datagram ingress → egress: counted without its 16-byte prefix (interop.md 13).
        import uuid

        ingress.connection.send_datagram_frame(uuid.UUID(TUNNEL).bytes + b"x" * 100)
        ingress.endpoint.transmit(ingress.connection)
        await egress.wait(lambda: len(egress.datagrams) == 1)
        stats = (await client.get("/api/v1/stats", headers=BEARER)).json()
        assert stats["connected_edges"] == 2 and stats["active_tunnels"] == 1 and stats["total_tunnels"] == 1
        assert stats["total_udp_datagrams"] == 1 and stats["total_bytes_forwarded"] == 100
        assert stats["total_bytes_ingress"] == 100 and stats["connections_total"] == 2

        r = await client.delete(f"/api/v1/tunnels/{TUNNEL}", headers=BEARER)
        assert r.status_code == 200 and r.json() == {"status": "deleted", "id": TUNNEL}
        await egress.wait(lambda: egress.types().count("tunnel_down") == 1)
        await ingress.wait(lambda: ingress.types().count("tunnel_down") == 2)
        assert service.tunnels.authorization(TUNNEL) is None
        assert (await client.get("/api/v1/tunnels", headers=BEARER)).json() == {"tunnels": []}

        outcome = await host.run_command(parse_action({"type": "disconnect_edge", "edge_id": "edge-out"}))
        assert outcome.success is True
        await egress.wait(lambda: egress.terminated)
        assert [e["edge_id"] for e in (await client.get("/api/v1/edges", headers=BEARER)).json()["edges"]] == [
            "edge-in"
        ]
        assert auth.ingress_token not in json.dumps(setup.events)
