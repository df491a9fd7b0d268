"""``POST /api/v1/tunnels`` against a real ``mp-manager serve`` with the test nodes of
``tests/helpers/test_node.py`` (two edges and a relay) registered over WSS.

The steps and their order (``authorize_tunnel`` to the relay with the 8.4 tokens, then
``create_tunnel`` to the sink edge, then to the source edge), the tunnels each edge is sent
(directions, addresses, secrets), direct mode, the body rules (2.6), roles, node access, 404,
the wrong device type, a node not connected, and the rollback when a step fails. No secret in
an answer, an event or the manager's log.
"""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio
from pydantic import SecretStr

from appliance.protocol import CommandReceived, DeviceType, NodeCredentials, wire_action
from appliance.relayproto import compute_bind_token
from tests.helpers.manager import Manager, login, start_manager
from tests.helpers.test_node import Reply, TestNode, connect_node
from tests.manager.test_auth import prepared_data_dir
from tests.manager.test_nodes_live import client_as, wait_status

pytestmark = pytest.mark.e2e

OPERATOR = ("the-operator", "Operator-Pw0rd-7")
VIEWER = ("the-viewer", "Viewer-Pw0rd-7")
PUBLIC_KEYS = {"id", "name", "protocol", "mode", "transport", "ingress_node_id", "egress_node_id", "relay_node_id"}
SECRETS_SEEN: list[str] = []
"""Every key, secret, PSK and token the nodes were sent; none may reach the manager's log."""
HEX64 = set("0123456789abcdef")


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    started = start_manager(
        prepared_data_dir(tmp_path_factory.mktemp("tunnel-pairing")), extra_args=["--log-level", "debug"]
    )
    try:
        with started.client() as root:
            assert login(root).status_code == 200
            for (username, password), role in ((OPERATOR, "operator"), (VIEWER, "viewer")):
                body = {"username": username, "password": password, "role": role}
                assert root.post("/api/v1/users", json=body).status_code == 201
        yield started
    finally:
        started.stop()


@dataclass
class Fleet:
    source_id: str
    source: TestNode
    sink_id: str
    sink: TestNode
    relay_id: str
    relay: TestNode
    order: list[tuple[str, str]]
    """(node label, action type) in the order the nodes received them, get_config left out."""


def _record_order(order: list[tuple[str, str]], label: str, node: TestNode) -> None:
    answer = node._answer

    async def recording(command: CommandReceived) -> None:
        if command.action.type != "get_config":
            order.append((label, command.action.type))
        await answer(command)

    setattr(node, "_answer", recording)  # noqa: B010 (a method of this instance only)


@asynccontextmanager
async def live(manager: Manager, root: httpx.AsyncClient, name: str, kind: str) -> AsyncIterator[tuple[str, TestNode]]:
    r = await root.post("/api/v1/nodes", json={"name": name, "device_type": kind})
    assert r.status_code == 201, r.text
    node_id, token = r.json()["id"], r.json()["registration_token"]
    context = ssl.create_default_context(cafile=str(manager.cert_path))
    credentials = NodeCredentials(registration_token=SecretStr(token))
    url = f"wss://127.0.0.1:{manager.port}/ws/node"
    async with connect_node(url, context, credentials, device_type=DeviceType(kind)) as node:
        await node.wait_authenticated()
        await wait_status(root, node_id, "online")
        yield node_id, node


@asynccontextmanager
async def fleet(manager: Manager, root: httpx.AsyncClient) -> AsyncIterator[Fleet]:
    async with AsyncExitStack() as stack:
        source_id, source = await stack.enter_async_context(live(manager, root, "edge-a", "edge"))
        sink_id, sink = await stack.enter_async_context(live(manager, root, "edge-b", "edge"))
        relay_id, relay = await stack.enter_async_context(live(manager, root, "relay-1", "relay"))
        order: list[tuple[str, str]] = []
        for label, node in (("source", source), ("sink", sink), ("relay", relay)):
            _record_order(order, label, node)
        yield Fleet(source_id, source, sink_id, sink, relay_id, relay, order)


def relay_body(f: Fleet, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "Cam 1 to studio",
        "protocol": "udp",
        "ingress_node_id": f.source_id,
        "egress_node_id": f.sink_id,
        "ingress_local_addr": "127.0.0.1:5000",
        "egress_local_addr": "10.0.0.9:6000",
        "relay_node_id": f.relay_id,
        "relay_addr": "relay.example:4433",
    }
    body.update(changes)
    return {key: value for key, value in body.items() if value is not None}


def sent(node: TestNode, action_type: str) -> list[dict[str, Any]]:
    return [dict(wire_action(c.action)) for c in node.commands if c.action.type == action_type]


def remember_secrets(*tunnels: dict[str, Any]) -> None:
    for tunnel in tunnels:
        for key in ("tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk", "ingress_token", "egress_token"):
            if key in tunnel:
                SECRETS_SEEN.append(str(tunnel[key]))


def assert_no_secret(text: str) -> None:
    for secret in SECRETS_SEEN:
        assert secret not in text


# --------------------------------------------------------------------------- success
async def test_relay_mode_authorises_the_relay_then_creates_sink_then_source(manager: Manager) -> None:
    async with client_as(manager) as root, client_as(manager, *OPERATOR) as operator, fleet(manager, root) as f:
        r = await operator.post("/api/v1/tunnels", json=relay_body(f))
        assert r.status_code == 201, r.text
        answer = r.json()
        assert set(answer) == PUBLIC_KEYS
        tunnel_id = answer["id"]
        assert uuid.UUID(tunnel_id).version == 4
        assert answer == {
            "id": tunnel_id,
            "name": "Cam 1 to studio",
            "protocol": "udp",
            "mode": "relay",
            "transport": "quic",
            "ingress_node_id": f.source_id,
            "egress_node_id": f.sink_id,
            "relay_node_id": f.relay_id,
        }
        assert f.order == [("relay", "authorize_tunnel"), ("sink", "create_tunnel"), ("source", "create_tunnel")]

        [sink_tunnel] = [a["tunnel"] for a in sent(f.sink, "create_tunnel")]
        [source_tunnel] = [a["tunnel"] for a in sent(f.source, "create_tunnel")]
        [authorize] = sent(f.relay, "authorize_tunnel")
        remember_secrets(sink_tunnel, source_tunnel, authorize)
        common = {
            "id": tunnel_id,
            "name": "Cam 1 to studio",
            "enabled": True,
            "protocol": "udp",
            "mode": "relay",
            "transport": "quic",
            "relay_addr": "relay.example:4433",
        }
        key, bind_secret = sink_tunnel["tunnel_encryption_key"], sink_tunnel["tunnel_bind_secret"]
        for secret in (key, bind_secret):
            assert len(secret) == 64 and set(secret) <= HEX64
        assert key != bind_secret
        assert sink_tunnel == {
            **common,
            "direction": "ingress",
            "local_addr": "10.0.0.9:6000",
            "tunnel_encryption_key": key,
            "tunnel_bind_secret": bind_secret,
        }
        assert source_tunnel == {**sink_tunnel, "direction": "egress", "local_addr": "127.0.0.1:5000"}
        assert authorize == {
            "type": "authorize_tunnel",
            "tunnel_id": tunnel_id,
            "ingress_token": compute_bind_token(bind_secret, tunnel_id, "ingress"),
            "egress_token": compute_bind_token(bind_secret, tunnel_id, "egress"),
        }
        assert_no_secret(r.text)

        # The event: info, category tunnel, the node ids, no secret.
        events = (await root.get("/api/v1/events", params={"category": "tunnel"})).json()
        paired = [e for e in events if e["message"] == "Tunnel paired" and e["details"]["tunnel_id"] == tunnel_id]
        assert len(paired) == 1
        assert paired[0]["severity"] == "info" and paired[0]["node_id"] == f.source_id
        assert paired[0]["details"] == {
            "tunnel_id": tunnel_id,
            "ingress_node_id": f.source_id,
            "egress_node_id": f.sink_id,
            "relay_node_id": f.relay_id,
        }
        assert_no_secret(json.dumps(events))

        # A second pairing gets fresh ids and secrets.
        r = await operator.post("/api/v1/tunnels", json=relay_body(f, transport="udp", relay_addr="relay.example:4434"))
        assert r.status_code == 201, r.text
        assert r.json()["id"] != tunnel_id and r.json()["transport"] == "udp"
        newest = sent(f.sink, "create_tunnel")[-1]["tunnel"]
        remember_secrets(newest, sent(f.relay, "authorize_tunnel")[-1])
        assert newest["transport"] == "udp" and newest["tunnel_encryption_key"] != key
        assert newest["tunnel_bind_secret"] != bind_secret


async def test_direct_mode_creates_the_listener_then_the_dialler(manager: Manager) -> None:
    async with client_as(manager) as root, fleet(manager, root) as f:
        body = relay_body(
            f,
            mode="direct",
            protocol="tcp",
            relay_node_id=None,
            relay_addr=None,
            direct_listen_addr="0.0.0.0:7000",
            peer_addr="studio.example:7000",
        )
        body = {k: v for k, v in body.items() if k not in ("relay_node_id", "relay_addr")}
        r = await root.post("/api/v1/tunnels", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["mode"] == "direct" and r.json()["relay_node_id"] is None
        assert f.order == [("sink", "create_tunnel"), ("source", "create_tunnel")]
        [sink_tunnel] = [a["tunnel"] for a in sent(f.sink, "create_tunnel")]
        [source_tunnel] = [a["tunnel"] for a in sent(f.source, "create_tunnel")]
        remember_secrets(sink_tunnel, source_tunnel)
        psk, key = sink_tunnel["tunnel_psk"], sink_tunnel["tunnel_encryption_key"]
        assert len(psk) == 64 and psk != key
        assert sink_tunnel["direction"] == "ingress" and sink_tunnel["direct_listen_addr"] == "0.0.0.0:7000"
        assert source_tunnel["direction"] == "egress" and source_tunnel["peer_addr"] == "studio.example:7000"
        assert source_tunnel["tunnel_psk"] == psk and source_tunnel["tunnel_encryption_key"] == key
        for tunnel in (sink_tunnel, source_tunnel):
            assert "relay_addr" not in tunnel and "tunnel_bind_secret" not in tunnel
        assert "peer_addr" not in sink_tunnel and "direct_listen_addr" not in source_tunnel
        assert_no_secret(r.text)


# --------------------------------------------------------------------------- rollback
async def test_a_failed_source_edge_rolls_back_the_sink_and_the_relay(manager: Manager) -> None:
    async with client_as(manager) as root, client_as(manager, *OPERATOR) as operator, fleet(manager, root) as f:
        f.source.replies["create_tunnel"] = Reply(success=False, error="tunnel worker refused the tunnel")
        r = await operator.post("/api/v1/tunnels", json=relay_body(f))
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error == f"source edge {f.source_id}: create_tunnel failed: tunnel worker refused the tunnel"
        [sink_tunnel] = [a["tunnel"] for a in sent(f.sink, "create_tunnel")]
        remember_secrets(sink_tunnel, *sent(f.relay, "authorize_tunnel"))
        tunnel_id = sink_tunnel["id"]
        assert f.order == [
            ("relay", "authorize_tunnel"),
            ("sink", "create_tunnel"),
            ("source", "create_tunnel"),
            ("sink", "delete_tunnel"),
            ("relay", "revoke_tunnel"),
        ]
        assert sent(f.sink, "delete_tunnel") == [{"type": "delete_tunnel", "tunnel_id": tunnel_id}]
        assert sent(f.relay, "revoke_tunnel") == [{"type": "revoke_tunnel", "tunnel_id": tunnel_id}]
        assert sent(f.source, "delete_tunnel") == []  # its create failed: nothing to undo there
        assert_no_secret(r.text)
        events = (await root.get("/api/v1/events", params={"category": "tunnel"})).json()
        assert not [e for e in events if (e.get("details") or {}).get("tunnel_id") == tunnel_id]


async def test_a_failed_sink_edge_revokes_the_relay_and_a_failed_relay_stops_at_once(manager: Manager) -> None:
    async with client_as(manager) as root, fleet(manager, root) as f:
        f.sink.replies["create_tunnel"] = Reply(success=False, error="tunnel 'x' already exists")
        r = await root.post("/api/v1/tunnels", json=relay_body(f))
        assert r.status_code == 422 and r.json()["error"].startswith(f"sink edge {f.sink_id}: create_tunnel failed")
        assert f.order == [("relay", "authorize_tunnel"), ("sink", "create_tunnel"), ("relay", "revoke_tunnel")]
        remember_secrets(*sent(f.relay, "authorize_tunnel"), *[a["tunnel"] for a in sent(f.sink, "create_tunnel")])

        f.order.clear()
        f.relay.replies["authorize_tunnel"] = Reply(success=False, error="not allowed")
        r = await root.post("/api/v1/tunnels", json=relay_body(f))
        assert r.status_code == 422
        assert r.json() == {"error": f"relay {f.relay_id}: authorize_tunnel failed: not allowed"}
        assert f.order == [("relay", "authorize_tunnel")]
        remember_secrets(*sent(f.relay, "authorize_tunnel"))


async def test_a_step_that_times_out_is_504_and_undone_too(manager: Manager) -> None:
    """The source never acks its create_tunnel: 504 after the hub's 10 s; it may have applied
    it, so it gets delete_tunnel as well as the sink, and the relay revoke_tunnel."""
    async with client_as(manager) as root, fleet(manager, root) as f:
        f.source.replies["create_tunnel"] = None
        r = await root.post("/api/v1/tunnels", json=relay_body(f))
        assert r.status_code == 504, r.text
        assert r.json() == {
            "error": f"source edge {f.source_id}: create_tunnel failed: Node did not answer within the timeout"
        }
        [sink_tunnel] = [a["tunnel"] for a in sent(f.sink, "create_tunnel")]
        remember_secrets(sink_tunnel, *sent(f.relay, "authorize_tunnel"))
        assert f.order == [
            ("relay", "authorize_tunnel"),
            ("sink", "create_tunnel"),
            ("source", "create_tunnel"),
            ("source", "delete_tunnel"),
            ("sink", "delete_tunnel"),
            ("relay", "revoke_tunnel"),
        ]
        assert sent(f.source, "delete_tunnel") == [{"type": "delete_tunnel", "tunnel_id": sink_tunnel["id"]}]


async def test_a_client_that_goes_away_mid_pairing_leaves_nothing_behind(manager: Manager) -> None:
    """The source holds its ack; the client gives up after 2 s and closes the connection, which
    cancels the route: the steps done and the one in flight are undone all the same."""
    async with client_as(manager) as root, fleet(manager, root) as f:
        f.source.replies["create_tunnel"] = None
        with pytest.raises(httpx.TimeoutException):
            await root.post("/api/v1/tunnels", json=relay_body(f), timeout=2)
        expected = [
            ("relay", "authorize_tunnel"),
            ("sink", "create_tunnel"),
            ("source", "create_tunnel"),
            ("source", "delete_tunnel"),
            ("sink", "delete_tunnel"),
            ("relay", "revoke_tunnel"),
        ]
        with trio.fail_after(5):  # well before the hub's 10 s timeout would have ended the step
            while len(f.order) < len(expected):
                await trio.sleep(0.05)
        assert f.order == expected
        remember_secrets(*sent(f.relay, "authorize_tunnel"), *[a["tunnel"] for a in sent(f.sink, "create_tunnel")])


async def test_a_node_not_connected_is_502_before_anything_is_sent(manager: Manager) -> None:
    async with client_as(manager) as root, fleet(manager, root) as f:
        r = await root.post("/api/v1/nodes", json={"name": "never-connected"})
        offline = r.json()["id"]
        r = await root.post("/api/v1/tunnels", json=relay_body(f, egress_node_id=offline))
        assert r.status_code == 502, r.text
        assert r.json() == {"error": f"sink edge {offline}: Node is not connected"}
        assert f.order == []


# --------------------------------------------------------------------------- refusals
async def test_body_rules(manager: Manager) -> None:
    async with client_as(manager) as root, fleet(manager, root) as f:
        secret_looking = "Sup3r-Secret-Looking-Value"
        cases: list[dict[str, Any]] = [
            relay_body(f, extra=1),  # unknown key
            relay_body(f, protocol="sctp"),
            relay_body(f, protocol="tcp", transport="udp"),  # transport udp only with protocol udp
            relay_body(f, mode="direct", transport="udp", relay_node_id=None, relay_addr=None),
            {k: v for k, v in relay_body(f).items() if k != "relay_node_id"},  # relay mode needs the relay
            {k: v for k, v in relay_body(f).items() if k != "relay_addr"},
            relay_body(f, peer_addr="10.0.0.1:7000"),  # a direct-mode field in relay mode
            relay_body(f, mode="direct", direct_listen_addr="0.0.0.0:7000", peer_addr="h:7000"),  # relay fields
            relay_body(f, egress_node_id=f.source_id),  # the same edge twice
            relay_body(f, ingress_local_addr=secret_looking),
            relay_body(f, relay_addr="relay.example:0"),
            relay_body(f, name=""),
            relay_body(f, name=secret_looking * 20),
            relay_body(f, ingress_node_id="not-a-uuid"),
            {k: v for k, v in relay_body(f).items() if k != "name"},
        ]
        for body in cases:
            r = await root.post("/api/v1/tunnels", json=body)
            assert r.status_code == 400, (body, r.text)
            assert secret_looking not in r.text
        r = await root.post("/api/v1/tunnels", content=b"[1]", headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        assert f.order == []


async def test_unknown_nodes_and_wrong_device_types(manager: Manager) -> None:
    async with client_as(manager) as root, fleet(manager, root) as f:
        unknown = str(uuid.uuid4())
        for field in ("ingress_node_id", "egress_node_id", "relay_node_id"):
            r = await root.post("/api/v1/tunnels", json=relay_body(f, **{field: unknown}))
            assert r.status_code == 404, r.text
            assert unknown not in r.text
        r = await root.post("/api/v1/tunnels", json=relay_body(f, egress_node_id=f.relay_id))
        assert r.status_code == 400 and r.json() == {"error": "the sink edge node must be of device type edge"}
        r = await root.post("/api/v1/tunnels", json=relay_body(f, relay_node_id=f.sink_id))
        assert r.status_code == 400 and r.json() == {"error": "the relay node must be of device type relay"}
        assert f.order == []


async def test_roles_csrf_and_node_access(manager: Manager) -> None:
    async with client_as(manager) as root, fleet(manager, root) as f:
        body = relay_body(f)
        context = ssl.create_default_context(cafile=str(manager.cert_path))
        async with httpx.AsyncClient(base_url=manager.url, verify=context, timeout=20) as anonymous:
            assert (await anonymous.post("/api/v1/tunnels", json=body)).status_code == 401
        async with client_as(manager, *VIEWER) as viewer:
            assert (await viewer.post("/api/v1/tunnels", json=body)).status_code == 403
        async with client_as(manager, *OPERATOR) as operator:
            del operator.headers["X-CSRF-Token"]
            assert (await operator.post("/api/v1/tunnels", json=body)).status_code == 403

        # An operator limited to the two edges may not name the relay, nor an unknown or
        # malformed node (403 before the body is validated or a node looked up).
        limited = ("the-limited", "Limited-Pw0rd-7")
        user = {
            "username": limited[0],
            "password": limited[1],
            "role": "operator",
            "allowed_node_ids": [f.source_id, f.sink_id],
        }
        r = await root.post("/api/v1/users", json=user)
        assert r.status_code == 201, r.text
        async with client_as(manager, *limited) as operator:
            for changes in (
                {},
                {"relay_node_id": str(uuid.uuid4())},
                {"relay_node_id": "not-a-uuid"},
                {"egress_node_id": str(uuid.uuid4()), "extra": 1},
            ):
                r = await operator.post("/api/v1/tunnels", json=relay_body(f, **changes))
                assert r.status_code == 403 and r.json() == {"error": "no access to this node"}, r.text
            # Direct mode names only the two edges: allowed.
            direct = {k: v for k, v in body.items() if k not in ("relay_node_id", "relay_addr")}
            direct.update(mode="direct", direct_listen_addr="0.0.0.0:7000", peer_addr="127.0.0.1:7000")
            r = await operator.post("/api/v1/tunnels", json=direct)
            assert r.status_code == 201, r.text
            remember_secrets(*[a["tunnel"] for a in sent(f.sink, "create_tunnel")])
        assert f.order == [("sink", "create_tunnel"), ("source", "create_tunnel")]


def test_zz_no_secret_in_the_log(manager: Manager) -> None:
    assert len(SECRETS_SEEN) >= 10
    log = manager.log()
    assert "POST /api/v1/tunnels" in log
    assert "paired" in log and "rolled back" in log
    assert_no_secret(log)
