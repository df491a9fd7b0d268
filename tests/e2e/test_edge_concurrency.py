"""Concurrent API clients against one real mp-edge: the API, the engine and the disk must agree.

Many clients mutate a small set of overlapping flow ids at once (create, delete, update,
whole-config PUT, start, stop, restart, hot outputs) while others abort their requests
mid-way. Mutations are serialised by the service; what this checks is that no
interleaving or cancellation leaves the edge inconsistent (edge interface §3):

- no 5xx (each id has its own loopback port, so no start can legitimately fail);
- no flow left in ``Starting`` once the load stops;
- ``GET /api/v1/config``, ``GET /api/v1/stats`` and ``config.json`` list the same flows;
- a flow is ``Running`` exactly when the engine holds its input port, seen from outside
  by trying to bind that port (``udp_port_bound``).

The summary of requests by status is printed (``pytest -rP`` or ``-s`` shows it).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers.edge import Edge, free_udp_port, running_edge, udp_port_bound

pytestmark = pytest.mark.e2e

FLOW_IDS = tuple(f"cc{i}" for i in range(8))
CLIENTS = 24
LOAD_S = 12.0
MAX_REQUESTS_PER_CLIENT = 2_000
SETTLE_S = 10.0
REQUEST_TIMEOUT_S = 20.0
ABORT_TIMEOUTS_S = (0.001, 0.003, 0.01, 0.03)
EXPECTED_STATUSES = frozenset({200, 404, 409})  # 409: exists / already running / not running


def flow_body(flow_id: str, port: int, name: str = "") -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": name or f"Flow {flow_id}",
        "enabled": True,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{port}"},
        "outputs": [{"type": "udp", "id": "o0", "name": "main", "dest_addr": f"127.0.0.1:{port + 1}"}],
    }


class Load:
    """The shared plan (a fixed port per id) and the tallies of every client."""

    def __init__(self, edge: Edge, ports: dict[str, int]) -> None:
        self.edge = edge
        self.ports = ports
        self.by_status: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()
        self.server_errors: list[str] = []
        self.unexpected: list[str] = []

    def record(self, op: str, r: httpx.Response) -> None:
        self.by_status[str(r.status_code)] += 1
        self.by_op[f"{op}:{r.status_code}"] += 1
        if r.status_code >= 500:
            self.server_errors.append(f"{op} -> {r.status_code} {r.text[:200]}")
        elif r.status_code not in EXPECTED_STATUSES:
            self.unexpected.append(f"{op} -> {r.status_code} {r.text[:200]}")

    def record_abort(self, op: str) -> None:
        self.by_status["aborted"] += 1
        self.by_op[f"{op}:aborted"] += 1

    # ------------------------------------------------------------------ one request each

    def request_for(self, op: str, flow_id: str, rng: random.Random) -> tuple[str, str, dict[str, Any] | None]:
        """``(method, path, json body)`` of a single-request operation."""
        port = self.ports[flow_id]
        if op == "create":
            return "POST", "/api/v1/flows", flow_body(flow_id, port)
        if op == "update":
            return "PUT", f"/api/v1/flows/{flow_id}", flow_body(flow_id, port, name=f"Renamed {rng.randrange(1000)}")
        if op == "delete":
            return "DELETE", f"/api/v1/flows/{flow_id}", None
        if op in ("start", "stop", "restart"):
            return "POST", f"/api/v1/flows/{flow_id}/{op}", None
        if op == "add_output":
            extra = {"type": "rtp", "id": "extra", "name": "extra", "dest_addr": f"127.0.0.1:{port + 2}"}
            return "POST", f"/api/v1/flows/{flow_id}/outputs", extra
        if op == "remove_output":
            return "DELETE", f"/api/v1/flows/{flow_id}/outputs/extra", None
        raise AssertionError(op)

    async def put_config(self, client: httpx.AsyncClient, flow_id: str) -> None:
        """GET the config, add ``flow_id`` if absent or remove it if present, PUT it back."""
        r = await client.get("/api/v1/config")
        self.record("get_config", r)
        if r.status_code != 200:
            return
        cfg = r.json()["data"]
        flows = [f for f in cfg["flows"] if f["id"] != flow_id]
        if len(flows) == len(cfg["flows"]):
            flows.append(flow_body(flow_id, self.ports[flow_id]))
        self.record("put_config", await client.put("/api/v1/config", json={**cfg, "flows": flows}))

    async def aborted_http(self, flow_id: str, rng: random.Random) -> None:
        """A request whose client gives up after a few milliseconds."""
        op = rng.choice(["create", "restart", "start", "stop", "delete", "update"])
        method, path, body = self.request_for(op, flow_id, rng)
        timeout = rng.choice(ABORT_TIMEOUTS_S)
        try:
            async with httpx.AsyncClient(base_url=self.edge.url, timeout=timeout) as client:
                r = await client.request(method, path, json=body)
        except httpx.TimeoutException:
            self.record_abort(f"abort_{op}")
        else:
            self.record(f"abort_{op}", r)

    async def hung_up_socket(self, flow_id: str, rng: random.Random) -> None:
        """A whole request on a raw socket, closed before (or just as) the answer comes."""
        op = rng.choice(["create", "restart", "start", "stop", "delete"])
        method, path, body = self.request_for(op, flow_id, rng)
        payload = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(payload)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        stream = await trio.open_tcp_stream("127.0.0.1", self.edge.port)
        try:
            await stream.send_all(head.encode() + b"\r\n" + payload)
            with trio.move_on_after(rng.choice((0.0, 0.002, 0.01, 0.03))):
                await stream.receive_some(1)
        finally:
            await stream.aclose()
        self.record_abort(f"hangup_{op}")

    # ------------------------------------------------------------------ a client

    async def client(self, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        ops = [
            *["create"] * 3,
            *["delete"] * 2,
            "update",
            "put_config",
            *["start", "stop", "restart"] * 2,
            "add_output",
            "remove_output",
            *["aborted_http"] * 2,
            "hung_up_socket",
        ]
        async with httpx.AsyncClient(base_url=self.edge.url, timeout=REQUEST_TIMEOUT_S) as client:
            for _ in range(MAX_REQUESTS_PER_CLIENT):
                if trio.current_time() >= deadline:
                    return
                op, flow_id = rng.choice(ops), rng.choice(FLOW_IDS)
                if op == "put_config":
                    await self.put_config(client, flow_id)
                elif op == "aborted_http":
                    await self.aborted_http(flow_id, rng)
                elif op == "hung_up_socket":
                    await self.hung_up_socket(flow_id, rng)
                else:
                    method, path, body = self.request_for(op, flow_id, rng)
                    self.record(op, await client.request(method, path, json=body))

    def summary(self, elapsed: float) -> str:
        total = sum(self.by_status.values())
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_status.items()))
        ops = ", ".join(f"{k}={v}" for k, v in sorted(self.by_op.items()))
        return f"concurrency: {total} requests by {CLIENTS} clients in {elapsed:.1f}s; {statuses}\n  by op: {ops}"


def distinct_port_pairs(count: int) -> list[int]:
    """``count`` ports P, each with P+1 and P+2 (its outputs' destinations) unused by the others."""
    ports: list[int] = []
    for _ in range(count * 50):
        port = free_udp_port()
        if port + 2 <= 65535 and all(abs(port - other) > 2 for other in ports):
            ports.append(port)
        if len(ports) == count:
            return ports
    raise AssertionError(f"found only {len(ports)} usable ports of {count}")


async def flow_states(client: httpx.AsyncClient) -> dict[str, str]:
    r = await client.get("/api/v1/stats")
    assert r.status_code == 200, r.text
    return {f["flow_id"]: f["state"] for f in r.json()["data"]["flows"]}


def engine_disagreements(states: dict[str, str], ports: dict[str, int]) -> list[str]:
    """Flows whose API state and input binding disagree, seen by binding each port from here."""
    wrong = []
    for flow_id, port in ports.items():
        state = states.get(flow_id, "not configured")
        bound = udp_port_bound(port)
        if (state == "Running") != bound:
            wrong.append(f"{flow_id} is {state} but its input 127.0.0.1:{port} is {'' if bound else 'not '}bound")
    return wrong


async def check_the_port_probe(edge: Edge, port: int) -> None:
    """What the agreement check relies on: a running input is seen bound, a deleted one free."""
    async with httpx.AsyncClient(base_url=edge.url, timeout=REQUEST_TIMEOUT_S) as client:
        assert not udp_port_bound(port)
        assert (await client.post("/api/v1/flows", json=flow_body("probe", port))).status_code == 200
        assert udp_port_bound(port), "the probe does not see a running flow's input"
        assert (await client.delete("/api/v1/flows/probe")).status_code == 200
        with trio.move_on_after(3):
            while udp_port_bound(port):
                await trio.sleep(0.02)
        assert not udp_port_bound(port), "the probe still sees a deleted flow's input"


async def test_concurrent_mutations_leave_api_engine_and_disk_in_agreement(tmp_path: Path) -> None:
    *flow_ports, probe_port = distinct_port_pairs(len(FLOW_IDS) + 1)
    ports = dict(zip(FLOW_IDS, flow_ports, strict=True))
    with running_edge(tmp_path) as edge:
        await check_the_port_probe(edge, probe_port)
        load = Load(edge, ports)
        started = trio.current_time()
        deadline = started + LOAD_S
        with trio.fail_after(LOAD_S + REQUEST_TIMEOUT_S + 5):
            async with trio.open_nursery() as nursery:
                for seed in range(CLIENTS):
                    nursery.start_soon(load.client, seed, deadline)
        print(load.summary(trio.current_time() - started))
        assert sum(load.by_status.values()) > CLIENTS * 5, "the load barely ran"
        assert load.by_status["200"] > 0 and load.by_status["aborted"] > 0

        async with httpx.AsyncClient(base_url=edge.url, timeout=REQUEST_TIMEOUT_S) as client:
            # Settle: every flow leaves Starting, the engine lets go of what it stopped, and
            # two reads 0.5 s apart agree (a handler whose client left may still be finishing).
            settle_deadline = trio.current_time() + SETTLE_S
            previous: dict[str, str] | None = None
            while True:
                states = await flow_states(client)
                starting = sorted(i for i, s in states.items() if s == "Starting")
                wrong = engine_disagreements(states, ports)
                calm = not starting and not wrong
                if (calm and states == previous) or trio.current_time() > settle_deadline:
                    break
                previous = states if calm else None
                await trio.sleep(0.5 if calm else 0.1)

            r = await client.get("/api/v1/config")
            assert r.status_code == 200, r.text
            api_ids = [f["id"] for f in r.json()["data"]["flows"]]
            stats_ids = list(states)
            disk_ids = [f["id"] for f in json.loads((edge.config_dir / "config.json").read_text())["flows"]]
            later = await flow_states(client)

        # Every finding at once: one run of a load test should tell the whole story.
        problems: list[str] = []
        if load.server_errors:
            first_per_op = {e.split(" -> ")[0]: e for e in reversed(load.server_errors)}
            examples = "; ".join(first_per_op[op] for op in sorted(first_per_op))
            problems.append(f"{len(load.server_errors)} 5xx answers, e.g.: {examples}")
        if load.unexpected:
            problems.append("unexpected statuses: " + "; ".join(sorted(set(load.unexpected))[:8]))
        if starting:
            problems.append(f"flows still Starting {SETTLE_S}s after the load stopped: {starting}")
        if not api_ids == stats_ids == disk_ids:
            problems.append(f"flow lists differ: config {api_ids} / stats {stats_ids} / config.json {disk_ids}")
        if not set(api_ids) <= set(FLOW_IDS):
            problems.append(f"unknown flows configured: {sorted(set(api_ids) - set(FLOW_IDS))}")
        if wrong:
            problems.append("the engine's running set disagrees with the API: " + "; ".join(wrong))
        if later != states:
            problems.append(f"the states moved after the load had settled: {states} then {later}")
        assert not problems, "\n".join(problems)
        assert edge.process.poll() is None, "mp-edge died under the load"
