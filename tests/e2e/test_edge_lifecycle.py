"""Flow lifecycle defects an attack campaign found, end to end on a real mp-edge.

Each test is a regression guard for one finding (edge interface §3, docs/edge.md
"Flow states and health" and "Engine and worker model"):

1. ``PUT /api/v1/config`` that leaves a running flow out must stop it in the engine.
2. Two configured flows may not claim the same input address (409 naming the owner),
   on every route that changes the set of flows.
3. A client that disconnects during a create or restart leaves no flow in ``Starting``.
4. The 1,024-flow and 64-output limits hold on every mutation, so the edge never writes a
   ``config.json`` it then refuses to boot on.

The engine's running set is checked from outside: an input the engine holds cannot be
bound by the test (``udp_port_bound``).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import (
    Edge,
    free_udp_port,
    running_edge,
    start_edge,
    udp_port_bound,
    wait_for,
)
from tests.helpers.media import UdpSink, rtp_stream, send_datagrams
from tests.helpers.ports import free_port_block

pytestmark = pytest.mark.e2e

SETTLE_S = 10.0  # how long a flow may take to leave Starting once its client is gone


def rtp_flow(flow_id: str, bind_addr: str, *out_ports: int, enabled: bool = True, **input_extra: Any) -> dict[str, Any]:
    """An ``rtp`` input on ``bind_addr`` (``ip:port``) with one ``udp`` output per port."""
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "enabled": enabled,
        "input": {"type": "rtp", "bind_addr": bind_addr, **input_extra},
        "outputs": [
            {"type": "udp", "id": f"o{i}", "name": f"out {i}", "dest_addr": f"127.0.0.1:{port}"}
            for i, port in enumerate(out_ports)
        ],
    }


def loopback(port: int) -> str:
    return f"127.0.0.1:{port}"


def distinct_free_udp_ports(count: int) -> list[int]:
    """``count`` different ports that were free on 127.0.0.1 a moment ago."""
    ports: list[int] = []
    for _ in range(count * 20):
        port = free_udp_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == count:
            return ports
    raise AssertionError(f"found only {len(ports)} distinct free UDP ports of {count}")


def flow_states(api: httpx.Client) -> dict[str, str]:
    r = api.get("/api/v1/stats")
    assert r.status_code == 200, r.text
    return {f["flow_id"]: f["state"] for f in r.json()["data"]["flows"]}


def state_of(api: httpx.Client, flow_id: str) -> str:
    r = api.get(f"/api/v1/stats/{flow_id}")
    assert r.status_code == 200, r.text
    return str(r.json()["data"]["state"])


def configured(api: httpx.Client) -> list[dict[str, Any]]:
    r = api.get("/api/v1/config")
    assert r.status_code == 200, r.text
    return list(r.json()["data"]["flows"])


def arrivals_within(sink: UdpSink, since: int, seconds: float) -> int:
    """Datagrams that reached ``sink`` after its first ``since``, waiting at most ``seconds``.

    Returns as soon as one arrives: absence can only be shown by waiting out the window.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(sink.datagrams) == since:
        time.sleep(0.02)
    return len(sink.datagrams) - since


def assert_released(port: int, what: str, within: float = 3.0) -> None:
    """The input ``127.0.0.1:port`` is let go within ``within`` s (a stop answers before the socket closes)."""
    deadline = time.monotonic() + within
    while udp_port_bound(port):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: its input 127.0.0.1:{port} is still bound after {within}s")
        time.sleep(0.02)


def assert_clash(r: httpx.Response, owner: str) -> None:
    """409, and the error names the flow that already has the address."""
    assert r.status_code == 409, f"expected 409 naming '{owner}', got {r.status_code}: {r.text}"
    error = r.json()["error"]
    assert f"'{owner}'" in error, f"the 409 does not name the owning flow '{owner}': {error!r}"


# =========================================================================== 1. PUT/reload that drops a running flow


@pytest.mark.parametrize("how", ["put", "reload"])
def test_a_config_change_that_drops_a_running_flow_stops_it_in_the_engine(tmp_path: Path, how: str) -> None:
    port_in, port_out = distinct_free_udp_ports(2)
    flow = rtp_flow("flowA", loopback(port_in), port_out)
    with running_edge(tmp_path) as edge, edge.client() as api, UdpSink(port_out) as sink:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
        send_datagrams(("127.0.0.1", port_in), list(rtp_stream(20)), pps=2000)
        wait_for(lambda: len(sink.datagrams) >= 20, timeout=5)

        if how == "put":
            cfg = api.get("/api/v1/config").json()["data"]
            cfg["flows"] = [f for f in cfg["flows"] if f["id"] != "flowA"]
            r = api.put("/api/v1/config", json=cfg)
        else:
            path = edge.config_dir / "config.json"
            on_disk = json.loads(path.read_text())
            on_disk["flows"] = [f for f in on_disk["flows"] if f["id"] != "flowA"]
            path.write_text(json.dumps(on_disk))
            r = api.post("/api/v1/config/reload")
        assert r.status_code == 200, r.text
        assert [f["id"] for f in r.json()["data"]["flows"]] == []

        # The flow is gone from the API: its packets must not reach the output any more.
        before = len(sink.datagrams)
        send_datagrams(("127.0.0.1", port_in), list(rtp_stream(20, first_seq=20)), pps=2000)
        leaked = arrivals_within(sink, before, 1.0)
        assert leaked == 0, f"{leaked} datagrams of the removed flow 'flowA' still reached its output"
        assert_released(port_in, "the removed flow 'flowA'")
        assert "flowA" not in flow_states(api)
        assert api.get("/api/v1/flows/flowA").status_code == 404

        # The same id can be created again, and it forwards.
        r = api.post("/api/v1/flows", json=flow)
        assert r.status_code == 200, f"re-creating 'flowA': {r.status_code} {r.text}"
        assert state_of(api, "flowA") == "Running"
        before = len(sink.datagrams)
        send_datagrams(("127.0.0.1", port_in), list(rtp_stream(20, first_seq=40)), pps=2000)
        wait_for(lambda: len(sink.datagrams) - before >= 20, timeout=5)


# =========================================================================== 2. input address clashes


@pytest.fixture(scope="module")
def clash_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("clash")) as edge:
        yield edge


@pytest.fixture
def api(clash_edge: Edge) -> Iterator[httpx.Client]:
    """A client of the shared clash edge; every flow is deleted after the test."""
    with clash_edge.client() as client:
        yield client
        for flow in configured(client):
            client.delete(f"/api/v1/flows/{flow['id']}")


def create(api: httpx.Client, flow: dict[str, Any]) -> None:
    r = api.post("/api/v1/flows", json=flow)
    assert r.status_code == 200, r.text


def assert_refused_and_unchanged(
    api: httpx.Client, r: httpx.Response, owner: str, before: list[dict[str, Any]]
) -> None:
    assert_clash(r, owner)
    assert configured(api) == before, "a refused change must leave the configuration as it was"
    assert state_of(api, owner) in ("Running", "Idle")


def test_post_on_the_same_unicast_address_is_refused(api: httpx.Client) -> None:
    port = free_udp_port()
    create(api, rtp_flow("ownerU", loopback(port)))
    before = configured(api)
    r = api.post("/api/v1/flows", json=rtp_flow("otherU", loopback(port)))
    assert_refused_and_unchanged(api, r, "ownerU", before)
    assert api.get("/api/v1/flows/otherU").status_code == 404
    assert state_of(api, "ownerU") == "Running"


@pytest.mark.parametrize(("owner_host", "new_host"), [("127.0.0.1", "0.0.0.0"), ("0.0.0.0", "127.0.0.1")])
def test_the_wildcard_address_overlaps_every_address(api: httpx.Client, owner_host: str, new_host: str) -> None:
    port = free_udp_port()
    create(api, rtp_flow("ownerW", f"{owner_host}:{port}"))
    before = configured(api)
    r = api.post("/api/v1/flows", json=rtp_flow("otherW", f"{new_host}:{port}"))
    assert_refused_and_unchanged(api, r, "ownerW", before)


@pytest.mark.parametrize("which", ["new_leg_on_owner_main", "new_main_on_owner_leg"])
def test_a_2022_7_leg_clashes_with_a_main_bind(api: httpx.Client, which: str) -> None:
    main, leg, other = distinct_free_udp_ports(3)
    create(api, rtp_flow("ownerR", loopback(main), redundancy={"bind_addr": loopback(leg)}))
    before = configured(api)
    if which == "new_leg_on_owner_main":
        clashing = rtp_flow("otherR", loopback(other), redundancy={"bind_addr": loopback(main)})
    else:
        clashing = rtp_flow("otherR", loopback(leg))
    assert_refused_and_unchanged(api, api.post("/api/v1/flows", json=clashing), "ownerR", before)


@pytest.mark.parametrize("offset", [2, 4])
def test_fec_ports_are_occupied(api: httpx.Client, offset: int) -> None:
    base = free_port_block(range(5))
    create(api, rtp_flow("ownerF", loopback(base), fec_decode={"columns": 5, "rows": 5}))
    before = configured(api)
    r = api.post("/api/v1/flows", json=rtp_flow("otherF", loopback(base + offset)))
    assert_refused_and_unchanged(api, r, "ownerF", before)


def test_a_new_flows_fec_ports_clash_with_a_main_bind(api: httpx.Client) -> None:
    base = free_port_block(range(5))
    create(api, rtp_flow("ownerG", loopback(base + 2)))
    before = configured(api)
    r = api.post("/api/v1/flows", json=rtp_flow("otherG", loopback(base), fec_decode={"columns": 5, "rows": 5}))
    assert_refused_and_unchanged(api, r, "ownerG", before)


def test_a_disabled_flows_address_counts(api: httpx.Client) -> None:
    port = free_udp_port()
    create(api, rtp_flow("ownerD", loopback(port), enabled=False))
    before = configured(api)
    r = api.post("/api/v1/flows", json=rtp_flow("otherD", loopback(port)))
    assert_refused_and_unchanged(api, r, "ownerD", before)
    assert state_of(api, "ownerD") == "Idle"


def test_put_flow_onto_another_flows_address_is_refused(api: httpx.Client) -> None:
    owner_port, other_port = distinct_free_udp_ports(2)
    create(api, rtp_flow("ownerP", loopback(owner_port)))
    create(api, rtp_flow("otherP", loopback(other_port)))
    before = configured(api)
    r = api.put("/api/v1/flows/otherP", json=rtp_flow("otherP", loopback(owner_port)))
    assert_refused_and_unchanged(api, r, "ownerP", before)
    assert state_of(api, "otherP") == "Running"
    assert udp_port_bound(other_port), "the refused PUT must leave 'otherP' running on its own address"


def test_put_config_with_two_flows_on_one_address_is_refused(api: httpx.Client) -> None:
    keep_port, port = distinct_free_udp_ports(2)
    create(api, rtp_flow("keepC", loopback(keep_port)))
    before = configured(api)
    cfg = api.get("/api/v1/config").json()["data"]
    cfg["flows"] = [*cfg["flows"], rtp_flow("ownerC", loopback(port)), rtp_flow("otherC", loopback(port))]
    r = api.put("/api/v1/config", json=cfg)
    assert_clash(r, "ownerC")
    assert configured(api) == before
    assert state_of(api, "keepC") == "Running" and udp_port_bound(keep_port)
    assert_released(port, "a flow of the refused config")


def test_reload_of_a_config_with_two_flows_on_one_address_is_refused(clash_edge: Edge, api: httpx.Client) -> None:
    keep_port, port = distinct_free_udp_ports(2)
    create(api, rtp_flow("keepL", loopback(keep_port)))
    before = configured(api)
    path = clash_edge.config_dir / "config.json"
    on_disk = json.loads(path.read_text())
    on_disk["flows"] += [rtp_flow("ownerL", loopback(port)), rtp_flow("otherL", loopback(port))]
    path.write_text(json.dumps(on_disk))
    r = api.post("/api/v1/config/reload")
    assert_clash(r, "ownerL")
    assert configured(api) == before
    assert state_of(api, "keepL") == "Running" and udp_port_bound(keep_port)
    assert_released(port, "a flow of the refused config")


# --------------------------------------------------------------------------- not clashes


def test_two_flows_on_one_multicast_group_and_port_are_allowed(api: httpx.Client) -> None:
    port = free_udp_port()
    group = f"239.255.{port % 250}.{port // 250 % 250 + 1}"
    for flow_id in ("mcast1", "mcast2"):
        r = api.post("/api/v1/flows", json=rtp_flow(flow_id, f"{group}:{port}", interface_addr="127.0.0.1"))
        assert r.status_code == 200, r.text
        assert state_of(api, flow_id) == "Running"


def test_replacing_a_flow_on_its_own_address_is_not_a_clash(api: httpx.Client) -> None:
    port, out = distinct_free_udp_ports(2)
    create(api, rtp_flow("self1", loopback(port)))
    r = api.put("/api/v1/flows/self1", json=rtp_flow("self1", loopback(port), out))
    assert r.status_code == 200, r.text
    assert state_of(api, "self1") == "Running" and udp_port_bound(port)


def test_a_whole_config_is_checked_against_itself_not_the_one_it_replaces(api: httpx.Client) -> None:
    port_a, port_b = distinct_free_udp_ports(2)
    create(api, rtp_flow("swapA", loopback(port_a)))
    create(api, rtp_flow("swapB", loopback(port_b)))
    cfg = api.get("/api/v1/config").json()["data"]
    r = api.put("/api/v1/config", json=cfg)  # the echoed GET body: every flow on its own address
    assert r.status_code == 200, r.text
    by_id = {f["id"]: f for f in cfg["flows"]}
    by_id["swapA"]["input"]["bind_addr"], by_id["swapB"]["input"]["bind_addr"] = loopback(port_b), loopback(port_a)
    r = api.put("/api/v1/config", json=cfg)  # the two flows swap addresses
    assert r.status_code == 200, r.text
    assert state_of(api, "swapA") == "Running" and state_of(api, "swapB") == "Running"
    assert api.post("/api/v1/config/reload").status_code == 200  # the file as written: no clash either


# =========================================================================== 3. clients that disconnect mid-request


ABORT_TIMEOUTS_S = (0.001, 0.003, 0.005, 0.01, 0.02, 0.05)


def settled_states(api: httpx.Client, ids: set[str]) -> dict[str, str]:
    """The states of the flows of ``ids`` once none is between states and two reads 0.5 s apart agree.

    A handler whose client has gone may still be finishing its work: waiting for two equal
    reads keeps a late one from changing a flow under the checks that follow.
    """
    deadline = time.monotonic() + SETTLE_S
    previous: dict[str, str] | None = None
    while True:
        states = {i: s for i, s in flow_states(api).items() if i in ids}
        stuck = {i: s for i, s in states.items() if s not in ("Running", "Error")}
        if not stuck and states == previous:
            return states
        if time.monotonic() > deadline:
            break
        previous = None if stuck else states
        time.sleep(0.1 if stuck else 0.5)
    assert not stuck, f"{len(stuck)} flows not Running/Error {SETTLE_S}s after their client left: {stuck}"
    raise AssertionError(f"the flow states were still changing after {SETTLE_S}s: {previous} then {states}")


def assert_settled_and_controllable(api: httpx.Client, ports: dict[str, int]) -> None:
    """No flow of ``ports`` is left Starting; each can be stopped and started; the engine agrees."""
    states = settled_states(api, set(ports))
    assert states, "no aborted request got far enough to create a flow: the test proved nothing"
    for flow_id, state in states.items():
        r = api.post(f"/api/v1/flows/{flow_id}/stop")
        expected = 200 if state == "Running" else 409
        assert r.status_code == expected, f"stop of {flow_id} ({state}): {r.status_code} {r.text}"
        assert_released(ports[flow_id], f"{flow_id}, stopped")
        r = api.post(f"/api/v1/flows/{flow_id}/start")
        assert r.status_code == 200, f"start of {flow_id}: {r.status_code} {r.text}"
        assert state_of(api, flow_id) == "Running" and udp_port_bound(ports[flow_id])
    final = flow_states(api)
    for flow_id in sorted(set(ports) - set(final)):
        assert_released(ports[flow_id], f"{flow_id}, not configured")


def test_a_client_that_gives_up_during_create_leaves_no_flow_starting(tmp_path: Path) -> None:
    ids = [f"dc{i}" for i in range(30)]
    ports = dict(zip(ids, distinct_free_udp_ports(len(ids)), strict=True))
    aborted = 0
    with running_edge(tmp_path) as edge:
        for n, flow_id in enumerate(ids):
            timeout = ABORT_TIMEOUTS_S[n % len(ABORT_TIMEOUTS_S)]
            try:
                with httpx.Client(base_url=edge.url, timeout=timeout) as client:
                    client.post("/api/v1/flows", json=rtp_flow(flow_id, loopback(ports[flow_id])))
            except httpx.TimeoutException:
                aborted += 1
        assert aborted > 0, "no request was aborted: the client timeouts are too long"
        with edge.client() as api:
            assert_settled_and_controllable(api, ports)


def test_a_client_that_gives_up_during_restart_leaves_no_flow_starting(tmp_path: Path) -> None:
    ids = [f"dr{i}" for i in range(10)]
    *in_ports, out_port = distinct_free_udp_ports(len(ids) + 1)
    ports = dict(zip(ids, in_ports, strict=True))
    aborted = 0
    with running_edge(tmp_path) as edge, edge.client() as api:
        for flow_id in ids:  # 32 outputs each: a restart takes long enough to be cut in the middle
            create(api, rtp_flow(flow_id, loopback(ports[flow_id]), *[out_port] * 32))
        durations = []
        for _ in range(3):
            begun = time.monotonic()
            assert api.post(f"/api/v1/flows/{ids[0]}/restart").status_code == 200
            durations.append(time.monotonic() - begun)
        restart_s = sorted(durations)[1]
        for n in range(60):  # give up at 10 % .. 100 % of a restart's time
            timeout = restart_s * (0.1 + 0.9 * (n % 10) / 9)
            try:
                with httpx.Client(base_url=edge.url, timeout=timeout) as client:
                    client.post(f"/api/v1/flows/{ids[n % len(ids)]}/restart")
            except httpx.TimeoutException:
                aborted += 1
        assert aborted > 0, "no request was aborted: the client timeouts are too long"
        assert_settled_and_controllable(api, ports)


def raw_request(method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(payload)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    return head.encode() + b"\r\n" + payload


def send_and_hang_up(edge: Edge, request: bytes, wait_s: float, reset: bool) -> None:
    """Send a whole request, wait at most ``wait_s`` for the answer, then close (RST if ``reset``)."""
    with socket.create_connection(("127.0.0.1", edge.port), timeout=5) as sock:
        sock.sendall(request)
        if wait_s > 0:
            sock.settimeout(wait_s)
            try:
                sock.recv(1)
            except TimeoutError:
                pass  # the point: the client gives up before the answer
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_socket_closed_right_after_the_request_leaves_no_flow_starting(tmp_path: Path) -> None:
    created = [f"sc{i}" for i in range(24)]
    restarted = [f"sr{i}" for i in range(6)]
    ports = dict(zip(created + restarted, distinct_free_udp_ports(len(created) + len(restarted)), strict=True))
    with running_edge(tmp_path) as edge, edge.client() as api:
        for flow_id in restarted:
            create(api, rtp_flow(flow_id, loopback(ports[flow_id])))
        waits = (0.0, 0.0, 0.001, 0.003, 0.01, 0.03)
        for n, flow_id in enumerate(created):
            request = raw_request("POST", "/api/v1/flows", rtp_flow(flow_id, loopback(ports[flow_id])))
            send_and_hang_up(edge, request, waits[n % len(waits)], reset=n % 2 == 1)
            target = restarted[n % len(restarted)]
            request = raw_request("POST", f"/api/v1/flows/{target}/restart")
            send_and_hang_up(edge, request, waits[n % len(waits)], reset=n % 3 == 0)
        assert_settled_and_controllable(api, ports)


# =========================================================================== 4. limits on every mutation


def many_disabled_flows(count: int, first_port: int = 20000) -> list[dict[str, Any]]:
    return [rtp_flow(f"lim{i}", loopback(first_port + i), enabled=False) for i in range(count)]


def test_the_65th_output_is_refused(tmp_path: Path) -> None:
    port = free_udp_port()
    outputs = [free_udp_port() for _ in range(65)]
    with running_edge(tmp_path) as edge, edge.client() as api:
        r = api.post("/api/v1/flows", json=rtp_flow("wide65", loopback(port), *outputs))
        assert r.status_code == 400, f"a flow with 65 outputs: {r.status_code} {r.text}"
        create(api, rtp_flow("wide", loopback(port), *outputs[:64]))
        assert state_of(api, "wide") == "Running"
        extra = {"type": "udp", "id": "o64", "name": "one too many", "dest_addr": loopback(outputs[64])}
        r = api.post("/api/v1/flows/wide/outputs", json=extra)
        assert r.status_code == 400, f"the 65th output via POST .../outputs: {r.status_code} {r.text}"
        assert len(api.get("/api/v1/flows/wide").json()["data"]["outputs"]) == 64
        on_disk = {f["id"]: f for f in json.loads((edge.config_dir / "config.json").read_text())["flows"]}
        assert len(on_disk["wide"]["outputs"]) == 64
        assert state_of(api, "wide") == "Running"
        r = api.put("/api/v1/flows/wide", json=rtp_flow("wide", loopback(port), *outputs))
        assert r.status_code == 400, f"PUT with 65 outputs: {r.status_code} {r.text}"


def fill_to_the_flow_limit(api: httpx.Client) -> dict[str, Any]:
    cfg = api.get("/api/v1/config").json()["data"]
    cfg["flows"] = many_disabled_flows(1024)
    r = api.put("/api/v1/config", json=cfg)
    assert r.status_code == 200, r.text[:500]
    return cfg


def test_the_1025th_flow_is_refused(tmp_path: Path) -> None:
    with running_edge(tmp_path) as edge, edge.client(timeout=30) as api:
        cfg = fill_to_the_flow_limit(api)
        r = api.put("/api/v1/config", json={**cfg, "flows": many_disabled_flows(1025)})
        assert r.status_code == 400, f"PUT /config with 1025 flows: {r.status_code} {r.text[:300]}"
        r = api.post("/api/v1/flows", json=rtp_flow("one-too-many", loopback(21024), enabled=False))
        assert r.status_code == 400, f"POST of the 1025th flow: {r.status_code} {r.text[:300]}"
        assert len(configured(api)) == 1024
        assert len(json.loads((edge.config_dir / "config.json").read_text())["flows"]) == 1024
        # Replacing one of the 1,024 is not an addition.
        r = api.put("/api/v1/flows/lim0", json=rtp_flow("lim0", loopback(21025), enabled=False))
        assert r.status_code == 200, r.text


def test_an_edge_boots_on_the_config_it_wrote_at_the_flow_limit(tmp_path: Path) -> None:
    config_dir = tmp_path / "edge"
    with running_edge(tmp_path) as edge, edge.client(timeout=30) as api:
        fill_to_the_flow_limit(api)
        api.post("/api/v1/flows", json=rtp_flow("one-too-many", loopback(21024), enabled=False))  # refused or not
    # The edge has stopped; a new one must boot on the same directory (it used to exit 2).
    again = start_edge(config_dir, wait=False)
    try:
        wait_for(lambda: again.process.poll() is not None or answers_health(again), timeout=60)
        assert again.process.poll() is None, (
            f"mp-edge refused to boot on its own config.json (exit {again.process.returncode}):\n{again.log()[-2000:]}"
        )
        assert httpx.get(again.url + "/health", timeout=5).json()["total_flows"] == 1024
    finally:
        again.stop()


def answers_health(edge: Edge) -> bool:
    try:
        return httpx.get(edge.url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
