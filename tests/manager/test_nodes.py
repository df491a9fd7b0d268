"""``/api/v1/nodes`` and ``/api/v1/device-types`` against a real ``mp-manager serve``, no node
connected: CRUD, validation, roles, ``allowed_node_ids`` and the check order (interop.md 7.1, 7.2, 13).

The routes that reach a live node are in ``test_nodes_live.py``.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from appliance.protocol import DeviceType, action_types_for
from tests.helpers.manager import Manager, login, start_manager
from tests.manager.test_auth import prepared_data_dir

pytestmark = pytest.mark.e2e

PASSWORDS = {role: f"{role.title()}-Pw0rd-{role[:3]}" for role in ("viewer", "operator", "admin")}
NODE_KEYS = {
    "id",
    "name",
    "description",
    "device_type",
    "status",
    "last_seen_at",
    "last_health",
    "software_version",
    "protocol_version",
    "metadata",
    "expires_at",
    "created_at",
    "updated_at",
}
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
TOKENS: list[str] = []
"""Every registration token this module was given; none may reach the log."""


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    # Debug: one access line per request, so the leak check covers those too.
    started = start_manager(prepared_data_dir(tmp_path_factory.mktemp("nodes")), extra_args=["--log-level", "debug"])
    try:
        with started.client() as root:
            assert login(root).status_code == 200
            for role, password in PASSWORDS.items():
                r = root.post("/api/v1/users", json={"username": f"the-{role}", "password": password, "role": role})
                assert r.status_code == 201, r.text
        yield started
    finally:
        started.stop()


@contextlib.contextmanager
def as_user(manager: Manager, username: str = "root", password: str | None = None) -> Iterator[httpx.Client]:
    with manager.client() as c:
        r = login(c) if username == "root" else login(c, username, password or "")
        assert r.status_code == 200, r.text
        yield c


@contextlib.contextmanager
def as_role(manager: Manager, role: str) -> Iterator[httpx.Client]:
    with as_user(manager, *(("root", None) if role == "super_admin" else (f"the-{role}", PASSWORDS[role]))) as c:
        yield c


@pytest.fixture
def root(manager: Manager) -> Iterator[httpx.Client]:
    with as_user(manager) as c:
        yield c


def create(client: httpx.Client, **body: object) -> dict[str, object]:
    r = client.post("/api/v1/nodes", json={"name": "node", **body})
    assert r.status_code == 201, r.text
    created: dict[str, object] = r.json()
    TOKENS.append(str(created["registration_token"]))
    return created


def test_create_get_list_update_delete(root: httpx.Client) -> None:
    r = root.post(
        "/api/v1/nodes",
        json={
            "name": "ob-truck-3",
            "description": "Truck 3",
            "device_type": "edge",
            "expires_at": "2099-01-01T00:00:00Z",
        },
    )
    assert r.status_code == 201
    assert r.headers["cache-control"] == "no-store"
    created = r.json()
    TOKENS.append(created["registration_token"])
    assert set(created) == NODE_KEYS | {"registration_token"}
    assert UUID4.match(created["registration_token"]) and UUID4.match(created["id"])
    assert created["status"] == "pending" and created["device_type"] == "edge"
    assert created["expires_at"] == "2099-01-01T00:00:00.000Z"
    assert created["last_seen_at"] is None and created["software_version"] is None
    node = {k: v for k, v in created.items() if k != "registration_token"}
    assert root.get(f"/api/v1/nodes/{node['id']}").json() == node
    listed = root.get("/api/v1/nodes").json()
    assert isinstance(listed, list) and node in listed
    assert node in root.get("/api/v1/nodes?device_type=edge").json()
    assert node not in root.get("/api/v1/nodes?device_type=relay").json()
    assert root.get("/api/v1/nodes?device_type=toaster").status_code == 400

    r = root.put(f"/api/v1/nodes/{node['id']}", json={"description": None, "metadata": {"site": "north"}})
    assert r.status_code == 200
    updated = r.json()
    assert updated["description"] is None and updated["metadata"] == {"site": "north"}
    assert updated["name"] == "ob-truck-3" and updated["expires_at"] == node["expires_at"]
    assert set(updated) == NODE_KEYS

    assert root.delete(f"/api/v1/nodes/{node['id']}").status_code == 204
    assert root.get(f"/api/v1/nodes/{node['id']}").status_code == 404
    assert root.delete(f"/api/v1/nodes/{node['id']}").status_code == 404
    assert root.get("/api/v1/nodes/not-a-uuid").json() == {"error": "node not found"}


def test_relay_node_and_defaults(root: httpx.Client) -> None:
    relay = create(root, name="relay-eu", device_type="relay")
    assert relay["device_type"] == "relay" and relay["description"] is None and relay["expires_at"] is None
    edge = create(root, name="edge-default")
    assert edge["device_type"] == "edge"
    relays = root.get("/api/v1/nodes", params={"device_type": "relay"}).json()
    assert relay["id"] in {n["id"] for n in relays} and edge["id"] not in {n["id"] for n in relays}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": ""},
        {"name": "x" * 129},
        {"name": 7},
        {"name": "n", "description": "d" * 513},
        {"name": "n", "device_type": "toaster"},
        {"name": "n", "expires_at": "2001-01-01T00:00:00Z"},
        {"name": "n", "expires_at": "yesterday-ish-secret-value"},
        {"name": "n", "registration_token": "7c9e6679-7425-40de-944b-e07fc1f90ae7"},
    ],
)
def test_create_validation(root: httpx.Client, body: dict[str, object]) -> None:
    r = root.post("/api/v1/nodes", json=body)
    assert r.status_code == 400, r.text
    assert "yesterday-ish-secret-value" not in r.text and "7c9e6679" not in r.text


def test_update_validation(root: httpx.Client) -> None:
    node = create(root)
    path = f"/api/v1/nodes/{node['id']}"
    for body in ({"name": None}, {"name": ""}, {"device_type": "relay"}, {"status": "online"}, {"bogus": 1}):
        assert root.put(path, json=body).status_code == 400, body
    assert root.put(path, json={"expires_at": "2001-01-01T00:00:00Z"}).status_code == 400
    assert root.put(path, json={"name": "renamed"}).json()["name"] == "renamed"
    # 400 before 404 (interop.md 13).
    missing = f"/api/v1/nodes/{uuid.uuid4()}"
    assert root.put(missing, json={"bogus": 1}).status_code == 400
    assert root.put(missing, json={"name": "x"}).status_code == 404


def test_new_token_for_an_offline_node(root: httpx.Client) -> None:
    node = create(root)
    r = root.post(f"/api/v1/nodes/{node['id']}/token")
    assert r.status_code == 200 and set(r.json()) == {"registration_token"}
    token = r.json()["registration_token"]
    TOKENS.append(token)
    assert UUID4.match(token) and token != node["registration_token"]
    assert root.get(f"/api/v1/nodes/{node['id']}").json()["status"] == "pending"
    assert root.post(f"/api/v1/nodes/{uuid.uuid4()}/token").status_code == 404


def test_device_types(manager: Manager) -> None:
    with as_role(manager, "viewer") as viewer:
        r = viewer.get("/api/v1/device-types")
    assert r.status_code == 200
    kinds = r.json()
    assert [k["id"] for k in kinds] == ["edge", "relay"]
    for kind in kinds:
        assert set(kind) == {"id", "name", "capabilities"} and kind["name"]
        assert kind["capabilities"] == sorted(action_types_for(DeviceType(kind["id"])))
    assert "start_flow" in kinds[0]["capabilities"] and "authorize_tunnel" in kinds[1]["capabilities"]


def test_authentication_and_csrf(manager: Manager, root: httpx.Client) -> None:
    node = create(root)
    with manager.client() as anonymous:
        assert anonymous.get("/api/v1/nodes").status_code == 401
        assert anonymous.get("/api/v1/device-types").status_code == 401
        assert anonymous.post(f"/api/v1/nodes/{node['id']}/command", json={"action": {}}).status_code == 401
    with as_role(manager, "operator") as operator:
        del operator.headers["X-CSRF-Token"]
        big = {"action": {"type": "update_config", "config": {"x": "y" * 60_000}}}
        assert operator.post(f"/api/v1/nodes/{node['id']}/command", json=big).status_code == 403
        assert operator.post("/api/v1/nodes", json={"name": "n"}).status_code == 403


ROUTES = [
    ("GET", "/api/v1/nodes", None),
    ("GET", "/api/v1/device-types", None),
    ("GET", "/api/v1/nodes/{id}", None),
    ("POST", "/api/v1/nodes", {"name": "matrix"}),
    ("PUT", "/api/v1/nodes/{id}", {"description": "d"}),
    ("POST", "/api/v1/nodes/{id}/token", None),
    ("GET", "/api/v1/nodes/{id}/config", None),
    ("PUT", "/api/v1/nodes/{id}/config", {"version": 1, "flows": []}),
    ("POST", "/api/v1/nodes/{id}/command", {"action": {"type": "get_config"}}),
    ("DELETE", "/api/v1/nodes/{id}", None),
]
ALLOWED = {
    "viewer": {"GET /api/v1/nodes", "GET /api/v1/device-types", "GET /api/v1/nodes/{id}"},
    "operator": {
        "GET /api/v1/nodes",
        "GET /api/v1/device-types",
        "GET /api/v1/nodes/{id}",
        "GET /api/v1/nodes/{id}/config",
        "PUT /api/v1/nodes/{id}/config",
        "POST /api/v1/nodes/{id}/command",
    },
}


@pytest.mark.parametrize("role", ["viewer", "operator", "admin", "super_admin"])
def test_role_matrix(manager: Manager, root: httpx.Client, role: str) -> None:
    """Each role gets 403 exactly where interop.md 7.1 says; elsewhere the route runs (a node
    that is not connected answers 502 for config and commands)."""
    allowed = ALLOWED.get(role)
    with as_role(manager, role) as client:
        for method, template, body in ROUTES:
            node = create(root, name=f"matrix-{role}")
            r = client.request(method, template.replace("{id}", str(node["id"])), json=body)
            key = f"{method} {template}"
            if allowed is not None and key not in allowed:
                assert r.status_code == 403, (role, key, r.text)
                continue
            expected = {"GET": 200, "POST": 200, "PUT": 200, "DELETE": 204}[method]
            if key == "POST /api/v1/nodes":
                expected = 201
                TOKENS.append(r.json()["registration_token"])
            elif key == "POST /api/v1/nodes/{id}/token":
                TOKENS.append(r.json()["registration_token"])
            elif "config" in key or "command" in key:
                expected = 502
            assert r.status_code == expected, (role, key, r.text)


def test_allowed_node_ids_limit_what_a_user_sees(manager: Manager, root: httpx.Client) -> None:
    seen, hidden = create(root, name="seen"), create(root, name="hidden")
    for username, role in (("limited-viewer", "viewer"), ("limited-operator", "operator")):
        r = root.post(
            "/api/v1/users",
            json={"username": username, "password": "Limited-Pw0rd", "role": role, "allowed_node_ids": [seen["id"]]},
        )
        assert r.status_code == 201, r.text
    with as_user(manager, "limited-viewer", "Limited-Pw0rd") as viewer:
        assert [n["id"] for n in viewer.get("/api/v1/nodes").json()] == [seen["id"]]
        assert viewer.get(f"/api/v1/nodes/{seen['id']}").status_code == 200
        assert viewer.get(f"/api/v1/nodes/{hidden['id']}").status_code == 403
        # 403 before 404: an unknown id does not tell whether it exists.
        assert viewer.get(f"/api/v1/nodes/{uuid.uuid4()}").status_code == 403
        assert viewer.get("/api/v1/nodes/not-a-uuid").status_code == 403
    with as_user(manager, "limited-operator", "Limited-Pw0rd") as operator:
        huge = {"action": {"type": "update_config", "config": {"x": "y" * 60_000}}}
        assert operator.post(f"/api/v1/nodes/{hidden['id']}/command", json=huge).status_code == 403
        assert operator.get(f"/api/v1/nodes/{hidden['id']}/config").status_code == 403
        assert operator.put(f"/api/v1/nodes/{hidden['id']}/config", json={}).status_code == 403
        assert operator.post(f"/api/v1/nodes/{seen['id']}/command", json=huge).status_code == 413
    # null: every node.
    with as_role(manager, "viewer") as everyone:
        ids = {n["id"] for n in everyone.get("/api/v1/nodes").json()}
        assert {seen["id"], hidden["id"]} <= ids


def test_command_check_order(manager: Manager, root: httpx.Client) -> None:
    edge, relay = create(root, name="order-edge"), create(root, name="order-relay", device_type="relay")
    missing = str(uuid.uuid4())
    huge = {"type": "update_config", "config": {"x": "y" * (50 * 1024)}}
    with as_role(manager, "operator") as operator:

        def command(node_id: object, body: object) -> httpx.Response:
            return operator.post(f"/api/v1/nodes/{node_id}/command", json=body)

        r = command(missing, {"action": huge, "other": "ignored"})
        assert r.status_code == 413 and r.json() == {"error": "Command action exceeds 50 KiB"}
        for body in ({}, {"action": None}, {"action": "start_flow"}, {"action": {"flow_id": "cam1"}}):
            assert command(missing, body).status_code == 400, body
        r = command(missing, {"action": {"type": "toaster-secret-type"}})
        assert r.status_code == 400 and "toaster-secret-type" not in r.text
        assert command(missing, {"action": {"type": "start_flow"}}).status_code == 400  # no flow_id
        assert command(missing, {"action": {"type": "start_flow", "flow_id": "cam1"}}).status_code == 404
        assert command(edge["id"], {"action": {"type": "list_tunnels"}}).status_code == 400
        assert command(relay["id"], {"action": {"type": "start_flow", "flow_id": "cam1"}}).status_code == 400
        r = command(edge["id"], {"action": {"type": "start_flow", "flow_id": "cam1"}, "ignored": [1]})
        assert r.status_code == 502 and r.json() == {"error": "Node is not connected"}
        assert command(relay["id"], {"action": {"type": "list_tunnels"}}).status_code == 502


def test_config_check_order(manager: Manager, root: httpx.Client) -> None:
    node = create(root, name="config-order")
    missing = str(uuid.uuid4())
    with as_role(manager, "operator") as operator:
        big = {"flows": [], "pad": "x" * (100 * 1024)}
        assert operator.put(f"/api/v1/nodes/{missing}/config", json=big).status_code == 413
        assert operator.put(f"/api/v1/nodes/{missing}/config", json=[1, 2]).status_code == 400
        assert (
            operator.put(
                f"/api/v1/nodes/{missing}/config", content=b"{", headers={"Content-Type": "application/json"}
            ).status_code
            == 400
        )
        assert operator.put(f"/api/v1/nodes/{missing}/config", json={"flows": []}).status_code == 404
        assert operator.get(f"/api/v1/nodes/{missing}/config").status_code == 404
        r = operator.get(f"/api/v1/nodes/{node['id']}/config")
        assert r.status_code == 502 and r.json() == {"error": "Node is not connected"}
        assert operator.put(f"/api/v1/nodes/{node['id']}/config", json={"flows": []}).status_code == 502


def test_zz_no_registration_token_in_the_log(manager: Manager, root: httpx.Client) -> None:
    assert len(TOKENS) > 10
    log = manager.log()
    assert "/api/v1/nodes" in log  # the access log is there
    for token in TOKENS:
        assert token not in log
    for node in root.get("/api/v1/nodes").json():
        assert "registration_token" not in node and "secret" not in str(node)
