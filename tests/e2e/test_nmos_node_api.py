"""IS-04 v1.3 Node API of a real ``mp-edge`` (interop.md 5): routes with and without the slash,
bodies valid against the AMWA schemas, CORS, OPTIONS, NMOS error bodies, public under auth, and
a flow added through the REST API showing up with a new version."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.edge.nmos import ids
from services.edge.nmos.node_api import host_addresses, primary_address
from services.edge.nmos.schemas import IS04, problems
from tests.helpers.edge import Edge, auth_section, free_udp_port, running_edge, wait_for

NODE = uuid.UUID("5a1d3c4e-2b6f-4a8e-9c7d-1e2f3a4b5c6d")
BASE = "/x-nmos/node/v1.3"
COLLECTIONS = {
    "sources": "source.json",
    "flows": "flow.json",
    "devices": "device.json",
    "senders": "sender.json",
    "receivers": "receiver.json",
}


def _config() -> dict[str, Any]:
    return {
        "node_id": str(NODE),
        "device_name": "NMOS test edge",
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section()},
        "flows": [
            {
                "id": "cam1",
                "name": "Camera 1",
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
                "outputs": [
                    {"id": "o-rtp", "name": "RTP out", "type": "rtp", "dest_addr": f"127.0.0.1:{free_udp_port()}"},
                    {"id": "o-udp", "name": "UDP out", "type": "udp", "dest_addr": f"127.0.0.1:{free_udp_port()}"},
                ],
            },
            {
                "id": "cam2",
                "name": "Camera 2",
                "enabled": False,
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
                "outputs": [
                    {
                        "id": "o-srt",
                        "name": "SRT out",
                        "type": "srt",
                        "mode": "caller",
                        "local_addr": "0.0.0.0:0",
                        "remote_addr": f"127.0.0.1:{free_udp_port()}",
                    }
                ],
            },
        ],
    }


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    tmp: Path = tmp_path_factory.mktemp("nmos")
    with running_edge(tmp, config=_config()) as running:
        # Settled first: cam1's two senders turn active (and take a new version) once the flow
        # runs, which CI once saw happen between the listing and the GET it was compared with.
        with running.client() as client:

            def cam1_running() -> bool:
                senders = client.get(f"{BASE}/senders/").json()
                return sum(bool(s["subscription"]["active"]) for s in senders) == 2

            wait_for(cam1_running, timeout=15)
        yield running


@pytest.fixture
def anon(edge: Edge) -> Iterator[httpx.Client]:
    with edge.client() as client:  # no token: the NMOS routes are public
        yield client


def _assert_cors(response: httpx.Response) -> None:
    assert response.headers["access-control-allow-origin"] == "*"
    assert "GET" in response.headers["access-control-allow-methods"]
    assert "content-type" in response.headers["access-control-allow-headers"].lower()


def _both(client: httpx.Client, path: str) -> Any:
    """GET with and without the trailing slash: both 200 (no redirect), same body, CORS."""
    bodies = []
    for variant in (path.rstrip("/"), path.rstrip("/") + "/"):
        r = client.get(variant, follow_redirects=False)
        assert r.status_code == 200, (variant, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json")
        _assert_cors(r)
        bodies.append(r.json())
    return bodies[1]


def _assert_nmos_error(response: httpx.Response, code: int) -> None:
    assert response.status_code == code, response.text
    _assert_cors(response)
    body = response.json()
    assert problems(IS04, "error.json", body) == []
    assert body["code"] == code


def test_the_api_is_protected_but_nmos_is_public(edge: Edge, anon: httpx.Client) -> None:
    assert anon.get("/api/v1/flows").status_code == 401
    assert anon.get(f"{BASE}/self").status_code == 200


def test_base_paths(anon: httpx.Client) -> None:
    assert _both(anon, "/x-nmos/") == ["node/", "connection/"]
    assert _both(anon, "/x-nmos/node/") == ["v1.3/"]
    assert _both(anon, f"{BASE}/") == ["self/", "sources/", "flows/", "devices/", "senders/", "receivers/"]


def test_every_route_and_body(anon: httpx.Client) -> None:
    node = _both(anon, f"{BASE}/self/")
    assert problems(IS04, "node.json", node) == []
    assert node["id"] == str(NODE)
    assert node["label"] == "NMOS test edge"
    assert node["description"].startswith("mediaplane-edge v")
    assert node["href"] == str(anon.base_url).rstrip("/") + "/"
    assert node["api"]["endpoints"][0]["port"] == anon.base_url.port
    names = {iface["name"] for iface in node["interfaces"]}
    found: dict[str, list[dict[str, Any]]] = {}
    for kind, schema in COLLECTIONS.items():
        listed = _both(anon, f"{BASE}/{kind}/")
        assert problems(IS04, f"{kind}.json", listed) == []
        found[kind] = listed
        for body in listed:
            assert problems(IS04, schema, body) == [], (kind, body)
            assert _both(anon, f"{BASE}/{kind}/{body['id']}/") == body
            assert set(body.get("interface_bindings", [])) <= names
    assert len(found["sources"]) == len(found["flows"]) == len(found["receivers"]) == 2
    assert len(found["senders"]) == 3
    (device,) = found["devices"]
    assert device["node_id"] == node["id"]
    assert sorted(device["senders"]) == sorted(s["id"] for s in found["senders"])
    assert sorted(device["receivers"]) == sorted(r["id"] for r in found["receivers"])
    senders = {s["id"]: s for s in found["senders"]}
    rtp = senders[ids.sender_id(NODE, "cam1", "o-rtp")]
    assert rtp["manifest_href"].endswith(f"/x-nmos/connection/v1.1/single/senders/{rtp['id']}/transportfile")
    assert senders[ids.sender_id(NODE, "cam1", "o-udp")]["manifest_href"] is None
    receivers = {r["id"]: r for r in found["receivers"]}
    assert receivers[ids.receiver_id(NODE, "cam2")]["subscription"]["active"] is False
    assert senders[ids.sender_id(NODE, "cam2", "o-srt")]["subscription"]["active"] is False
    # The running flow's receiver and its outputs' senders turn active (once the outputs run).
    for path in (
        f"{BASE}/receivers/{ids.receiver_id(NODE, 'cam1')}",
        f"{BASE}/senders/{ids.sender_id(NODE, 'cam1', 'o-rtp')}",
        f"{BASE}/senders/{ids.sender_id(NODE, 'cam1', 'o-udp')}",
    ):
        wait_for(lambda path=path: anon.get(path).json()["subscription"]["active"], timeout=20)


def test_options_and_cors(anon: httpx.Client) -> None:
    for path in ("/x-nmos/", f"{BASE}", f"{BASE}/self/", f"{BASE}/senders", f"{BASE}/senders/"):
        r = anon.options(path, headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "GET"})
        assert r.status_code == 200, path
        _assert_cors(r)


def test_errors_have_the_nmos_body(anon: httpx.Client) -> None:
    for path in (
        f"{BASE}/senders/{uuid.uuid4()}",
        f"{BASE}/senders/{uuid.uuid4()}/",
        f"{BASE}/flows/not-a-uuid",
        f"{BASE}/nothing",
        f"{BASE}/self/more",
        "/x-nmos/node/v1.2/",
        "/x-nmos/query/v1.3/",
    ):
        _assert_nmos_error(anon.get(path), 404)
    _assert_nmos_error(anon.post(f"{BASE}/self", json={}), 405)
    # receiver target: deprecated in v1.3, the RAML's 501 (after the 404 of an unknown id).
    _assert_nmos_error(anon.put(f"{BASE}/receivers/{uuid.uuid4()}/target", json={}), 404)
    known = ids.receiver_id(NODE, "cam1")
    _assert_nmos_error(anon.put(f"{BASE}/receivers/{known}/target", json={}), 501)
    _assert_nmos_error(anon.put(f"{BASE}/receivers/{known}/target/", json={}), 501)


def test_a_flow_added_through_the_api_appears_with_a_new_version(edge: Edge, anon: httpx.Client) -> None:
    device_before = anon.get(f"{BASE}/devices/").json()[0]
    node_before = anon.get(f"{BASE}/self").json()
    flow = {
        "id": "cam3",
        "name": "Camera 3",
        "enabled": False,
        "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [{"id": "o-1", "name": "Out", "type": "udp", "dest_addr": f"127.0.0.1:{free_udp_port()}"}],
    }
    with edge.client("admin") as admin:
        assert admin.post("/api/v1/flows", json=flow).status_code in (200, 201)
    sender_id = ids.sender_id(NODE, "cam3", "o-1")
    sender = anon.get(f"{BASE}/senders/{sender_id}").json()
    assert problems(IS04, "sender.json", sender) == []
    device_after = anon.get(f"{BASE}/devices/").json()[0]
    assert len(device_after["senders"]) == len(device_before["senders"]) + 1
    assert sender_id in device_after["senders"]
    assert ids.receiver_id(NODE, "cam3") in device_after["receivers"]

    def tai(version: str) -> tuple[int, int]:
        seconds, nanos = version.split(":")
        return int(seconds), int(nanos)

    assert tai(device_after["version"]) > tai(device_before["version"])
    assert tai(sender["version"]) > tai(device_before["version"])
    # The node did not change, nor did the device on a second look.
    assert anon.get(f"{BASE}/self").json()["version"] == node_before["version"]
    assert anon.get(f"{BASE}/devices/").json()[0]["version"] == device_after["version"]


def test_listening_on_every_address_advertises_a_stable_host(tmp_path: Path) -> None:
    config = {"node_id": str(NODE), "server": {}}
    with running_edge(tmp_path, config=config, extra_args=["--listen-addr", "0.0.0.0"]) as wild:
        with wild.client() as client:
            first = client.get(f"{BASE}/self").json()
            assert problems(IS04, "node.json", first) == []
            endpoint = first["api"]["endpoints"][0]
            assert endpoint["port"] == wild.port
            assert endpoint["host"] in {primary_address(4), "127.0.0.1"}
            assert first["href"] == f"http://{endpoint['host']}:{wild.port}/"
            # Every address of the host is an endpoint, so a client finds the one it used.
            hosts = [e["host"] for e in first["api"]["endpoints"]]
            assert set(host_addresses(4)) <= set(hosts)
            assert len(hosts) == len(set(hosts))
            assert {e["port"] for e in first["api"]["endpoints"]} == {wild.port}
            assert client.get(f"{BASE}/self/").json()["version"] == first["version"]
