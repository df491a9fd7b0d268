"""A real ``RelayService`` on loopback: the REST routes of the relay interface §4 with their auth
rules (§5, interop.md 1.2 and 13), ``/metrics``, and the native UDP plane through real sockets.

The QUIC plane is a stand-in with ``quic_relay.QuicRelay``'s interface (:class:`FakeQuic`); the
tunnel table behind it is the real ``RelayTunnels``, driven with real control messages.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from appliance.http.app import serve
from appliance.relayproto import BindAuthorization, HelloMessage, IdentifyMessage, TunnelBindMessage
from services.relay.api import build_app
from services.relay.config import RelayConfigStore
from services.relay.control import ConnectionId, RelayTunnels, TunnelDownMessage
from services.relay.native_plane import NIL_PREFIX, Register, decode_ack, encode_register
from services.relay.service import RelayService
from tests.helpers.ports import free_udp_port

TOKEN = "relay-api-token-" + "7" * 24
SECRET = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
TID = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
INGRESS_TOKEN = "be5aeadc2699dec87e429f12981a5bd977abb0afd853abcdeb1a52457b6567a6"  # interop.md 8.4 vector


# --------------------------------------------------------------------------- a QUIC stand-in
@dataclass
class Traffic:
    bytes_ingress: int = 0
    bytes_egress: int = 0
    bytes_forwarded: int = 0
    udp_datagrams: int = 0
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    datagrams_dropped: int = 0


@dataclass
class PerTunnel:
    bytes_ingress: int = 0
    bytes_egress: int = 0
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    udp_datagrams_total: int = 0


@dataclass
class FakeQuic:
    """``QuicRelay``'s interface over the real table; sends are recorded instead of sent."""

    tunnels: RelayTunnels
    on_event: Callable[[object], None]
    traffic: Traffic = field(default_factory=Traffic)
    per_tunnel: dict[str, PerTunnel] = field(default_factory=dict)
    sent: list[tuple[ConnectionId, object]] = field(default_factory=list)
    served_on: tuple[str, int] | None = None

    async def serve(self, sock: trio.socket.SocketType, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.served_on = sock.getsockname()
        task_status.started()
        await trio.sleep_forever()

    def tunnel_traffic(self, tunnel_id: str) -> PerTunnel:
        return self.per_tunnel.get(tunnel_id, PerTunnel())

    def edges(self) -> list[tuple[str, str]]:
        found = (self.tunnels.connection(cid) for cid in range(1, 100))
        return [(c.edge_id, c.remote_addr) for c in found if c is not None]

    def disconnect_edge(self, edge_id: str) -> bool:
        return False

    def close_tunnel(self, tunnel_id: str, reason: str = "tunnel closed") -> bool:
        out = self.tunnels.close_tunnel(tunnel_id, reason)
        if out is None:
            return False
        self.sent.extend(out.sends)
        for event in out.events:
            self.on_event(event)
        return True

    # -- test drivers: an edge connecting and binding, as the QUIC driver would feed the table
    def connect(self, cid: int, port: int, edge_id: str | None = None) -> None:
        conn = self.tunnels.open_connection(cid, ("127.0.0.1", port), trio.current_time())
        assert conn is not None
        conn.receive(HelloMessage(software_version="0.3.0"), trio.current_time())
        if edge_id is not None:
            conn.receive(IdentifyMessage(edge_id=edge_id), trio.current_time())

    def bind(self, cid: int, direction: str, token: str | None = None, protocol: str = "udp") -> None:
        conn = self.tunnels.connection(cid)
        assert conn is not None
        message = TunnelBindMessage.model_validate(
            {"tunnel_id": TID, "direction": direction, "protocol": protocol, "bind_token": token}
        )
        out = conn.receive(message, trio.current_time())
        self.sent.extend(out.sends)
        for event in out.events:
            self.on_event(event)


@dataclass
class Running:
    service: RelayService
    client: httpx.AsyncClient
    quic: FakeQuic
    events: list[tuple[str, str, str]]


@asynccontextmanager
async def running_relay(tmp_path: Path, **config: Any) -> AsyncIterator[Running]:
    """A RelayService with its API on 127.0.0.1, every port ephemeral unless given."""
    data = {"api_addr": "127.0.0.1:0", "quic_addr": "127.0.0.1:0", "udp_relay_addr": "127.0.0.1:0", **config}
    path = tmp_path / "relay.json"
    path.write_text(json.dumps(data))
    store = RelayConfigStore(path)
    store.load()
    quics: list[FakeQuic] = []

    def factory(tunnels: RelayTunnels, cert: bytes | None, key: bytes | None, on_event: Any) -> FakeQuic:
        assert cert is None and key is None  # no tls paths: QuicRelay makes its own certificate
        quics.append(FakeQuic(tunnels, on_event))
        return quics[-1]

    service = RelayService(store, version="9.9.9-test", quic_factory=factory)
    events: list[tuple[str, str, str]] = []
    publish = service.publish

    def recording(severity: str, category: str, message: str) -> None:
        events.append((severity, category, message))
        publish(severity, category, message)

    service.publish = recording  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        bound = await nursery.start(partial(serve, build_app(service), "127.0.0.1", 0))
        async with httpx.AsyncClient(base_url=bound[0], timeout=10) as client:
            yield Running(service, client, quics[0], events)
        nursery.cancel_scope.cancel()


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


READ_ROUTES = ("/metrics", "/api/v1/stats", "/api/v1/tunnels", "/api/v1/edges", "/api/v1/udp-sessions")
HEALTH_FIELDS = {
    "status",
    "version",
    "uptime_secs",
    "connected_edges",
    "total_tunnels",
    "active_tunnels",
    "udp_sessions_total",
    "udp_sessions_active",
}
STATS_FIELDS = {
    "uptime_secs",
    "connected_edges",
    "total_tunnels",
    "active_tunnels",
    "total_bytes_ingress",
    "total_bytes_egress",
    "total_bytes_forwarded",
    "total_bandwidth_bps",
    "total_tcp_streams",
    "active_tcp_streams",
    "total_udp_datagrams",
    "peak_tunnels",
    "peak_edges",
    "connections_total",
}


# --------------------------------------------------------------------------- auth (§5)
async def test_with_a_token_every_route_but_health_needs_it(tmp_path: Path) -> None:
    async with running_relay(tmp_path, api_token=TOKEN) as relay:
        client = relay.client
        for headers in ({}, bearer("wrong" * 8), {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}):
            r = await client.get("/health", headers=headers)
            assert r.status_code == 200 and r.json()["status"] == "ok"
            for route in READ_ROUTES:
                r = await client.get(route, headers=headers)
                assert r.status_code == 401, route
                assert r.headers["WWW-Authenticate"] == "Bearer"
                assert set(r.json()) == {"error"}
                assert TOKEN not in r.text
        for route in READ_ROUTES:
            r = await client.get(route, headers=bearer())
            assert r.status_code == 200, route
            r = await client.get(route, headers={"Authorization": f"bearer {TOKEN}"})
            assert r.status_code == 200, route  # the scheme is case-insensitive (RFC 7235)


async def test_without_a_token_reads_are_open_and_deletes_fail_closed(tmp_path: Path) -> None:
    async with running_relay(tmp_path) as relay:
        client = relay.client
        for route in READ_ROUTES:
            assert (await client.get(route)).status_code == 200, route
        relay.quic.connect(1, 40001)
        relay.quic.bind(1, "ingress")
        for headers in ({}, bearer()):
            for route in (f"/api/v1/tunnels/{TID}", f"/api/v1/udp-sessions/{TID}", "/api/v1/tunnels/not-a-uuid"):
                r = await client.delete(route, headers=headers)
                assert r.status_code == 403, route
                assert set(r.json()) == {"error"}
        assert relay.service.tunnels.tunnel(TID) is not None  # nothing deleted


async def test_delete_order_401_then_400_then_404(tmp_path: Path) -> None:
    async with running_relay(tmp_path, api_token=TOKEN) as relay:
        client = relay.client
        unknown = str(uuid.uuid4())
        for route in (f"/api/v1/tunnels/{unknown}", f"/api/v1/udp-sessions/{unknown}", "/api/v1/tunnels/nope"):
            r = await client.delete(route)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", route
            r = await client.delete(route, headers=bearer("x" * 40))
            assert r.status_code == 401, route
        for route in ("/api/v1/tunnels/not-a-uuid", "/api/v1/udp-sessions/1234"):
            r = await client.delete(route, headers=bearer())
            assert r.status_code == 400 and set(r.json()) == {"error"}, route
        for route in (f"/api/v1/tunnels/{unknown}", f"/api/v1/udp-sessions/{unknown}"):
            r = await client.delete(route, headers=bearer())
            assert r.status_code == 404 and set(r.json()) == {"error"}, route
            assert unknown in r.json()["error"]


# --------------------------------------------------------------------------- shapes (§2)
async def test_health_and_stats_have_exactly_the_interface_fields(tmp_path: Path) -> None:
    async with running_relay(tmp_path, api_token=TOKEN) as relay:
        health = (await relay.client.get("/health")).json()
        assert set(health) == HEALTH_FIELDS  # no manager configured: the object is left out
        assert health["version"] == "9.9.9-test"
        stats = (await relay.client.get("/api/v1/stats", headers=bearer())).json()
        assert set(stats) == STATS_FIELDS
        assert all(type(value) is int for value in stats.values())


async def test_health_carries_the_manager_object_when_one_is_configured(tmp_path: Path) -> None:
    # A manager nobody listens on: the link keeps reconnecting.
    manager = {"enabled": True, "url": f"wss://127.0.0.1:{free_udp_port()}/ws/node", "registration_token": "t"}
    async with running_relay(tmp_path, manager=manager) as relay:
        health = (await relay.client.get("/health")).json()
        assert set(health) == HEALTH_FIELDS | {"manager"}
        assert set(health["manager"]) == {"connected", "disconnected_secs", "reconnecting"}
        assert health["manager"]["connected"] is False and health["manager"]["reconnecting"] is True
        assert type(health["manager"]["disconnected_secs"]) is int
        metrics = (await relay.client.get("/metrics")).text
        assert "mediaplane_relay_manager_connected 0.0" in metrics


async def test_tunnels_and_edges_and_a_tunnel_delete(tmp_path: Path) -> None:
    async with running_relay(tmp_path, api_token=TOKEN) as relay:
        client, quic = relay.client, relay.quic
        quic.connect(1, 40001, edge_id="edge-a")
        quic.bind(1, "ingress")
        body = (await client.get("/api/v1/tunnels", headers=bearer())).json()
        assert set(body) == {"tunnels"} and len(body["tunnels"]) == 1
        entry = body["tunnels"][0]
        assert set(entry) == {
            "tunnel_id",
            "protocol",
            "status",
            "ingress_edge_id",
            "egress_edge_id",
            "ingress_remote_addr",
            "egress_remote_addr",
            "stats",
        }
        assert set(entry["stats"]) == {
            "bytes_ingress",
            "bytes_egress",
            "tcp_streams_total",
            "tcp_streams_active",
            "udp_datagrams_total",
            "uptime_secs",
        }
        assert entry["tunnel_id"] == TID and entry["protocol"] == "udp" and entry["status"] == "waiting_egress"
        assert entry["ingress_edge_id"] == "edge-a" and entry["egress_edge_id"] is None
        assert entry["ingress_remote_addr"] == "127.0.0.1:40001" and entry["egress_remote_addr"] is None

        quic.connect(2, 40002)
        quic.bind(2, "egress")
        quic.per_tunnel[TID] = PerTunnel(bytes_ingress=1316, bytes_egress=188, udp_datagrams_total=2)
        quic.traffic.bytes_forwarded = 1504
        entry = (await client.get("/api/v1/tunnels", headers=bearer())).json()["tunnels"][0]
        assert entry["status"] == "active" and entry["egress_edge_id"] == "127.0.0.1:40002#2"
        assert entry["stats"]["bytes_ingress"] == 1316 and entry["stats"]["udp_datagrams_total"] == 2
        assert ("info", "tunnel", f"tunnel {TID} ready") in relay.events

        edges = (await client.get("/api/v1/edges", headers=bearer())).json()
        assert edges == {
            "edges": [
                {"edge_id": "edge-a", "remote_addr": "127.0.0.1:40001"},
                {"edge_id": "127.0.0.1:40002#2", "remote_addr": "127.0.0.1:40002"},
            ]
        }
        stats = (await client.get("/api/v1/stats", headers=bearer())).json()
        assert stats["connected_edges"] == 2 and stats["total_tunnels"] == 1 and stats["active_tunnels"] == 1
        assert stats["peak_edges"] == 2 and stats["peak_tunnels"] == 1 and stats["connections_total"] == 2
        assert stats["total_bytes_forwarded"] == 1504

        auth = BindAuthorization.from_secret(SECRET, TID)
        relay.service.authorize_tunnel(TID, SecretStr(auth.ingress_token), SecretStr(auth.egress_token))
        r = await client.delete(f"/api/v1/tunnels/{TID.upper()}", headers=bearer())
        assert r.status_code == 200 and r.json() == {"status": "deleted", "id": TID}
        assert relay.service.tunnels.tunnel(TID) is None
        assert relay.service.tunnels.authorization(TID) is None  # revoked too (§3)
        downs = [(cid, m) for cid, m in quic.sent if isinstance(m, TunnelDownMessage)]
        assert sorted(cid for cid, _ in downs) == [1, 2]  # tunnel_down to every bound leg
        assert (await client.get("/api/v1/tunnels", headers=bearer())).json() == {"tunnels": []}
        r = await client.delete(f"/api/v1/tunnels/{TID}", headers=bearer())
        assert r.status_code == 404


async def test_metrics_are_parseable_and_named_as_the_interface(tmp_path: Path) -> None:
    async with running_relay(tmp_path, api_token=TOKEN) as relay:
        r = await relay.client.get("/metrics", headers=bearer())
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        samples = {s.name: s.value for family in text_string_to_metric_families(r.text) for s in family.samples}
        expected = {
            "mediaplane_relay_uptime_seconds",
            "mediaplane_relay_edges_connected",
            "mediaplane_relay_tunnels_active",
            "mediaplane_relay_tunnels_total",
            "mediaplane_relay_bytes_ingress_total",
            "mediaplane_relay_bytes_egress_total",
            "mediaplane_relay_bytes_forwarded_total",
            "mediaplane_relay_peak_tunnels",
            "mediaplane_relay_peak_edges",
            "mediaplane_relay_udp_sessions_active",
            "mediaplane_relay_udp_datagrams_forwarded_total",
            "mediaplane_relay_manager_connected",
        }
        assert expected <= set(samples)
        assert samples["mediaplane_relay_manager_connected"] == 0


# --------------------------------------------------------------------------- the native plane (interop.md 9)
def udp_socket() -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    return sock


async def recv_from(sock: trio.socket.SocketType, timeout: float = 5.0) -> tuple[bytes, tuple[str, int]]:
    with trio.fail_after(timeout):
        data, source = await sock.recvfrom(4096)
    return data, source


async def test_native_plane_latches_acks_and_forwards_over_real_sockets(tmp_path: Path) -> None:
    async with running_relay(tmp_path, api_token=TOKEN, require_bind_auth=True) as relay:
        service = relay.service
        host, port = service.udp_bound.rsplit(":", 1)  # type: ignore[union-attr]
        relay_addr = (host, int(port))
        auth = BindAuthorization.from_secret(SECRET, TID)
        # The manager's authorize_tunnel is the one source of native tokens too (interop.md 8.4).
        service.authorize_tunnel(TID, SecretStr(auth.ingress_token), SecretStr(auth.egress_token))
        assert auth.ingress_token == INGRESS_TOKEN
        tid = uuid.UUID(TID)
        with udp_socket() as a, udp_socket() as b, udp_socket() as intruder:
            for sock in (a, b, intruder):
                await sock.bind(("127.0.0.1", 0))
            b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # the 200-datagram burst below
            # An unauthorised register (wrong token, then none) gets nothing; the authorised
            # one sent after it on the same socket is the first answer to arrive.
            other = uuid.uuid4()
            await intruder.sendto(encode_register(Register(tid, "ingress", "0" * 64)), relay_addr)
            await intruder.sendto(encode_register(Register(other, "ingress", None)), relay_addr)
            await a.sendto(encode_register(Register(tid, "ingress", auth.ingress_token)), relay_addr)
            data, source = await recv_from(a)
            assert source == relay_addr  # the ack leaves from the socket the register arrived on
            assert data[:16] == NIL_PREFIX
            ack = decode_ack(data)
            assert ack.tunnel_id == tid and ack.ready is False
            assert service.plane.counters.registers_rejected["auth"] == 2
            await b.sendto(encode_register(Register(tid, "egress", auth.egress_token)), relay_addr)
            data, source = await recv_from(b)
            assert source == relay_addr and decode_ack(data).ready is True

            # Media both ways, byte for byte, in a burst the batched receive drains.
            for i in range(200):
                await a.sendto(tid.bytes + i.to_bytes(4, "big") + bytes(1312), relay_addr)
            for i in range(200):
                data, source = await recv_from(b)
                assert source == relay_addr and data == tid.bytes + i.to_bytes(4, "big") + bytes(1312)
            await b.sendto(tid.bytes + b"back", relay_addr)
            assert (await recv_from(a))[0] == tid.bytes + b"back"

            # A refused register reaches the manager's queue as a tunnel event, once.
            refused = [e for e in relay.events if e[1] == "tunnel" and "native UDP register refused" in e[2]]
            assert len(refused) == 2 and refused[0][0] == "critical"
            assert "bind authentication failed" in refused[0][2]

            sessions = (await relay.client.get("/api/v1/udp-sessions", headers=bearer())).json()["sessions"]
            assert len(sessions) == 1
            session = sessions[0]
            assert set(session) == {
                "tunnel_id",
                "transport",
                "status",
                "ingress_addr",
                "egress_addr",
                "bytes_ingress",
                "bytes_egress",
                "datagrams",
                "uptime_secs",
            }
            assert session["tunnel_id"] == TID and session["transport"] == "udp" and session["status"] == "active"
            assert session["ingress_addr"] == f"127.0.0.1:{a.getsockname()[1]}"
            assert session["bytes_ingress"] == 200 * 1316 and session["bytes_egress"] == 4
            assert session["datagrams"] == 201
            stats = (await relay.client.get("/api/v1/stats", headers=bearer())).json()
            assert stats["total_udp_datagrams"] == 201 and stats["total_bytes_forwarded"] == 200 * 1316 + 4
            health = (await relay.client.get("/health")).json()
            assert health["udp_sessions_total"] == 1 and health["udp_sessions_active"] == 1

            r = await relay.client.delete(f"/api/v1/udp-sessions/{TID}", headers=bearer())
            assert r.status_code == 200 and r.json() == {"status": "deleted", "id": TID}
            assert service.plane.session(tid) is None
            assert (await relay.client.get("/health")).json()["udp_sessions_total"] == 0


async def test_a_busy_udp_port_drops_the_capability(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        busy = squatter.getsockname()[1]
        async with running_relay(tmp_path, udp_relay_addr=f"127.0.0.1:{busy}") as relay:
            from services.relay.manager_link import RelayLinkHost

            assert relay.service.native is None and relay.service.udp_bound is None
            health = RelayLinkHost(relay.service).health_payload().root
            assert health["capabilities"] == []
            assert (await relay.client.get("/health")).status_code == 200  # QUIC and the API run on
            assert relay.quic.served_on is not None
    async with running_relay(tmp_path) as relay:
        from services.relay.manager_link import RelayLinkHost

        host = RelayLinkHost(relay.service)
        health = host.health_payload().root
        assert health["capabilities"] == ["udp-relay"]
        assert set(health) == HEALTH_FIELDS | {"quic_addr", "public_quic_addr", "public_udp_addr", "capabilities"}
        assert health["quic_addr"] == "{}:{}".format(*relay.quic.served_on)  # type: ignore[misc]
        stats = host.stats_payload().root
        assert set(stats) == STATS_FIELDS | {"udp_sessions_active"}


async def test_no_udp_relay_runs_without_the_plane(tmp_path: Path) -> None:
    async with running_relay(tmp_path, udp_relay_enabled=False) as relay:
        assert relay.service.native is None and relay.service.capabilities == []


@pytest.mark.parametrize("action", ["list_tunnels", "list_edges", "list_udp_sessions"])
async def test_list_commands_answer_the_rest_shapes(tmp_path: Path, action: str) -> None:
    from appliance.protocol import parse_action
    from services.relay.manager_link import RelayLinkHost

    async with running_relay(tmp_path) as relay:
        relay.quic.connect(1, 40001, edge_id="edge-a")
        relay.quic.bind(1, "ingress")
        outcome = await RelayLinkHost(relay.service).run_command(parse_action({"type": action}))
        assert outcome.success is True
        route = {"list_tunnels": "tunnels", "list_edges": "edges", "list_udp_sessions": "udp-sessions"}[action]
        rest = (await relay.client.get(f"/api/v1/{route}")).json()
        data = outcome.data
        assert isinstance(data, dict)
        if action == "list_tunnels":
            # uptime_secs may tick between the two reads; everything else is the same
            assert [t["tunnel_id"] for t in data["tunnels"]] == [t["tunnel_id"] for t in rest["tunnels"]]
        else:
            assert data == rest


async def test_relay_commands_act_and_refuse(tmp_path: Path) -> None:
    from appliance.protocol import DeviceType, action_types_for, parse_action
    from services.relay.manager_link import RelayLinkHost

    async with running_relay(tmp_path, api_token=TOKEN) as relay:
        host = RelayLinkHost(relay.service)
        supported = action_types_for(DeviceType.RELAY)

        async def run(action: dict[str, Any]) -> Any:
            return await host.run_command(parse_action(action, supported=supported))

        outcome = await run(
            {"type": "authorize_tunnel", "tunnel_id": TID, "ingress_token": "i" * 64, "egress_token": "e" * 64}
        )
        assert outcome.success is True
        assert relay.service.tunnels.authorization(TID) == BindAuthorization(TID, "i" * 64, "e" * 64)
        assert (await run({"type": "revoke_tunnel", "tunnel_id": TID})).success is True
        assert relay.service.tunnels.authorization(TID) is None
        outcome = await run({"type": "close_tunnel", "tunnel_id": TID})
        assert outcome.success is False and outcome.error == f"Tunnel '{TID}' not found"
        outcome = await run({"type": "close_udp_session", "tunnel_id": TID})
        assert outcome.success is False and outcome.error == f"UDP session '{TID}' not found"
        outcome = await run({"type": "disconnect_edge", "edge_id": "nobody"})
        assert outcome.success is False and "nobody" in (outcome.error or "")
        relay.quic.connect(1, 40001)
        relay.quic.bind(1, "ingress")
        assert (await run({"type": "close_tunnel", "tunnel_id": TID})).success is True
        assert relay.service.tunnels.tunnel(TID) is None
        outcome = await run({"type": "get_config"})
        assert outcome.config is not None and "api_token" not in outcome.config
        assert TOKEN not in json.dumps(outcome.config)
        # An edge action is not a relay action: refused as unknown by the client before the host.
        assert parse_action({"type": "start_flow", "flow_id": "x"}, supported=supported).error == (  # type: ignore[union-attr]
            "Unknown command: start_flow"
        )
