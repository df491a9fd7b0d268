"""Several ``mp-manager`` instances on one PostgreSQL behind a real HAProxy, with real edges (issue 22).

Usage (sync, like ``tests/helpers/manager.py``; the caller checks ``require_postgres()`` and
``require_haproxy()`` first)::

    with running_manager_fleet(tmp_path) as fleet:            # PostgreSQL, 2 managers, HAProxy
        (truck,) = fleet.add_edges([("ob-truck-3", [rtp_flow("cam1")])])   # through HAProxy
        holder = fleet.wait_holder(truck.node_id)              # the instance holding its socket
        other = fleet.other(holder)
        with contextlib.closing(fleet.admin(other)) as admin:  # signed in, direct to it
            admin.post(f"/api/v1/nodes/{truck.node_id}/command", json={"action": ...})

What runs, each its own process on 127.0.0.1:

- a throwaway PostgreSQL cluster (``tests/helpers/postgres.py``; a unix socket only) and a
  fresh database, its first super_admin made by ``mp-manager setup --database-url``;
- two ``mp-manager serve --tls-mode behind_proxy --database-url …`` (plain HTTP, port 0, each
  with its own ``--data-dir``, the same ``MEDIAPLANE_JWT_SECRET`` and ``MEDIAPLANE_MASTER_KEY``);
- HAProxy (``haproxy -f CFG -db``) in front of both: ``mode http``, ``balance leastconn``,
  health checks on ``GET /health``, ``option forwardfor``, ``timeout tunnel 1h`` for the
  WebSockets, ``retries`` + ``option redispatch``. It listens twice: plain HTTP (what a TLS
  terminator further out would reach) and TLS with a certificate of its own, because the edge
  speaks only ``wss://`` to a manager (``appliance/manager_client.py``): the edges pin that
  certificate's fingerprint, exactly as they pin a manager's own in ``direct`` mode.

``leastconn`` rather than ``roundrobin``: a node's socket lives for hours, so the count of open
connections is what should be even, and it makes placement deterministic here: of two edges
started together on an empty fleet, each lands on its own instance.

Which instance holds a node is read where the fleet itself records it: ``node_connections``
(the row of a live lease) joined to the instance, ``manager_instances.name`` being ``host:pid``
(the pid of our ``Popen``). Every wait polls with a deadline; :meth:`ManagerFleet.diagnostics`
gathers every process's log for a failing test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.certs import self_signed
from tests.helpers.edge import Edge, free_port, free_udp_port, start_edge, wait_healthy
from tests.helpers.manager import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    Manager,
    login,
    setup_super_admin,
    start_manager,
    wait_listening,
)
from tests.helpers.postgres import PostgresCluster, running_postgres

HAPROXY_BIN = Path("/usr/sbin/haproxy")
LIVE = frozenset({"online", "degraded", "error"})
"""A connected node's statuses: ``error`` and ``degraded`` say how its flows are (a flow with no
input is Critical), not that the link is down (interop.md 6 "Online and offline")."""
BACKEND = "managers"
"""The HAProxy backend's name; its servers are ``m0``, ``m1`` … in instance order."""
_INSTANCE_LOG = re.compile(r"fleet: this instance is ([0-9a-f-]{36})")

T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned); AssertionError naming
    ``what`` and the last value after ``timeout`` seconds. Exceptions from ``predicate`` count as
    "not yet" (a process restarting refuses connections for a moment) and the last is reported."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except (httpx.HTTPError, psycopg.Error, OSError, KeyError, ValueError) as exc:
            value, last = None, exc
        else:
            last = value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")
        time.sleep(interval)


# --- HAProxy -------------------------------------------------------------------------------


def require_haproxy() -> Path:
    """The HAProxy binary; skips when missing, but fails in CI, where a skip is a silent pass."""
    if not HAPROXY_BIN.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"HAProxy is missing in CI (no {HAPROXY_BIN}; tools/ensure-debs.sh)")
        pytest.skip(f"HAProxy is not installed (no {HAPROXY_BIN})")
    return HAPROXY_BIN


def haproxy_config(
    servers: list[tuple[str, int]],
    *,
    http_port: int,
    tls_port: int,
    pem_path: Path,
    stats_socket: Path,
    host: str = "127.0.0.1",
) -> str:
    """The HAProxy configuration of the fleet e2e; docs/manager.md shows the same, for production.

    ``servers`` are ``(host, port)`` of each ``mp-manager serve --tls-mode behind_proxy``.
    """
    lines = [
        "global",
        # -db keeps HAProxy in the foreground; its log goes to stdout (our log file).
        "    log stdout format raw local0 info",
        f"    stats socket {stats_socket} mode 600 level admin",
        "    maxconn 4096",  # two descriptors per connection: within a default 20,000 FD limit
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option forwardfor",  # X-Forwarded-For: the login rate limit counts the real client
        "    option redispatch",  # a retry may go to the other instance
        "    retries 3",
        "    timeout connect 2s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout http-request 10s",
        "    timeout tunnel 1h",  # once upgraded, a WebSocket (node or dashboard) stays up
        "    timeout client-fin 5s",
        "",
        "frontend manager",
        f"    bind {host}:{http_port}",
        f"    bind {host}:{tls_port} ssl crt {pem_path}",
        # Only the address HAProxy saw counts: a client's own X-Forwarded-For is dropped.
        "    http-request del-header X-Forwarded-For",
        "    http-request set-header X-Forwarded-Proto https if { ssl_fc }",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    balance leastconn",
        "    option httpchk",
        "    http-check send meth GET uri /health ver HTTP/1.1 hdr Host manager",
        "    http-check expect status 200",
        # A dead instance is out after 2 failed checks 1 s apart; new sockets go to the others.
        "    default-server inter 1s fall 2 rise 2",
    ]
    lines += [f"    server m{index} {addr}:{port} check" for index, (addr, port) in enumerate(servers)]
    return "\n".join(lines) + "\n"


@dataclass
class HaProxy:
    process: subprocess.Popen[bytes]
    config_path: Path
    log_path: Path
    stats_socket: Path
    cert_path: Path
    http_port: int
    tls_port: int

    @property
    def url(self) -> str:
        """Plain HTTP, as a TLS terminator in front of HAProxy would reach it."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def node_url(self) -> str:
        """Where an edge connects: HAProxy's TLS listener, ``/ws/node``."""
        return f"wss://127.0.0.1:{self.tls_port}/ws/node"

    @property
    def fingerprint(self) -> str:
        """``AA:BB:…`` of HAProxy's certificate, for an edge's ``cert_fingerprint``."""
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding

        from appliance.manager_client import fingerprint_of

        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        return fingerprint_of(cert.public_bytes(Encoding.DER))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def admin_command(self, command: str) -> str:
        """One command on HAProxy's stats socket (``show servers state``, ``show stat``)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def server_states(self) -> dict[str, str]:
        """``{"m0": "UP", "m1": "DOWN", …}`` from ``show stat`` (its ``status`` column)."""
        rows = self.admin_command("show stat").splitlines()
        if not rows or not rows[0].startswith("# "):
            return {}
        header = rows[0][2:].split(",")
        states = {}
        for row in rows[1:]:
            values = dict(zip(header, row.split(","), strict=False))
            if values.get("pxname") == BACKEND and values.get("svname", "").startswith("m"):
                states[values["svname"]] = values.get("status", "")
        return states

    def stop(self, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # -db: SIGTERM stops at once
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return int(self.process.returncode)


def start_haproxy(directory: Path, servers: list[tuple[str, int]], timeout: float = 20.0) -> HaProxy:
    """Write a config and a certificate under ``directory``, start HAProxy and wait until its
    health checks see every server UP (so the first node's placement is not a race)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = self_signed(directory, ip="127.0.0.1")
    pem_path = directory / "haproxy.pem"  # HAProxy wants the certificate and its key in one file
    pem_path.write_bytes(cert_path.read_bytes() + key_path.read_bytes())
    pem_path.chmod(0o600)
    stats_socket = directory / "haproxy.sock"
    http_port, tls_port = free_port(), free_port()
    config_path = directory / "haproxy.cfg"
    config_path.write_text(
        haproxy_config(servers, http_port=http_port, tls_port=tls_port, pem_path=pem_path, stats_socket=stats_socket)
    )
    check = subprocess.run(
        [str(HAPROXY_BIN), "-c", "-f", str(config_path)], capture_output=True, text=True, timeout=20, check=False
    )
    if check.returncode != 0:
        raise RuntimeError(f"haproxy -c refused {config_path}:\n{check.stdout}{check.stderr}")
    log_path = directory / "haproxy.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(HAPROXY_BIN), "-f", str(config_path), "-db"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    proxy = HaProxy(process, config_path, log_path, stats_socket, cert_path, http_port, tls_port)
    try:

        def all_up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited with {process.returncode}:\n{proxy.log()}")
            states = proxy.server_states()
            return len(states) == len(servers) and all(state == "UP" for state in states.values())

        wait_until(all_up, timeout, "HAProxy sees every manager UP")
        wait_until(lambda: httpx.get(proxy.url + "/health", timeout=2).status_code == 200, timeout, "/health via LB")
    except BaseException:
        proxy.stop()
        raise
    return proxy


# --- the fleet -----------------------------------------------------------------------------


def rtp_flow(flow_id: str, *, enabled: bool = False) -> dict[str, Any]:
    """An RTP flow on free loopback ports: it runs without any input arriving."""
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "enabled": enabled,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [{"type": "rtp", "id": "out-a", "name": "A", "dest_addr": f"127.0.0.1:{free_udp_port()}"}],
    }


@dataclass
class FleetEdge:
    name: str
    node_id: str
    edge: Edge

    def client(self) -> httpx.Client:
        """The edge's own REST API (its auth is off in these configs)."""
        return self.edge.client()

    def link(self) -> dict[str, Any]:
        """``GET /api/v1/manager`` on the edge: the link's state as the edge sees it."""
        with self.client() as client:
            return dict(client.get("/api/v1/manager").json()["data"])

    def flow_state(self, flow_id: str) -> str:
        with self.client() as client:
            return str(client.get(f"/api/v1/stats/{flow_id}").json()["data"]["state"])


@dataclass
class ManagerFleet:
    tmp_path: Path
    cluster: PostgresCluster
    database_url: str
    database: str
    managers: list[Manager]
    lb: HaProxy | None = None
    edges: list[FleetEdge] = field(default_factory=list)
    _ids: dict[int, uuid.UUID] = field(default_factory=dict)

    # ---- the database, as the instances record it
    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.cluster.conninfo(self.database), autocommit=True) as conn:
            return list(conn.execute(sql.encode(), params).fetchall())

    def instance_id(self, manager: Manager, timeout: float = 15.0) -> uuid.UUID:
        """The fleet instance id of ``manager``: its ``manager_instances`` row (``name`` is
        ``host:pid``), else its ``fleet: this instance is …`` log line."""
        key = manager.process.pid
        if key not in self._ids:

            def lookup() -> uuid.UUID | None:
                for row_id, name in self.query("SELECT id, name FROM manager_instances"):
                    if str(name).rsplit(":", 1)[-1] == str(key):
                        return uuid.UUID(str(row_id))
                found = _INSTANCE_LOG.search(manager.run_log())
                return uuid.UUID(found.group(1)) if found else None

            self._ids[key] = wait_until(lookup, timeout, f"the instance id of mp-manager pid {key}")
        return self._ids[key]

    def holder(self, node_id: str) -> Manager | None:
        """The instance whose live lease in ``node_connections`` holds ``node_id``, or None."""
        rows = self.query(
            "SELECT instance_id FROM node_connections WHERE node_id = %s AND expires_at > now()", uuid.UUID(node_id)
        )
        if not rows:
            return None
        holding = uuid.UUID(str(rows[0][0]))
        for manager in self.managers:
            if self.instance_id(manager) == holding:
                return manager
        return None

    def wait_holder(self, node_id: str, timeout: float = 30.0, *, not_: Manager | None = None) -> Manager:
        """The instance holding ``node_id`` once there is one (other than ``not_``)."""

        def found() -> Manager | None:
            manager = self.holder(node_id)
            return manager if manager is not None and manager is not not_ else None

        return wait_until(found, timeout, f"an instance holding node {node_id}")

    def other(self, manager: Manager) -> Manager:
        """The other instance of a two-instance fleet."""
        (rest,) = [m for m in self.managers if m is not manager]
        return rest

    def index(self, manager: Manager) -> int:
        return self.managers.index(manager)

    # ---- clients
    def admin(self, manager: Manager, timeout: float = 20.0) -> httpx.Client:
        """A client signed in as the super_admin, direct to ``manager`` (not through HAProxy);
        already open, so close it (``contextlib.closing``) rather than enter it."""
        client = manager.client(timeout=timeout)
        answer = login(client)
        if answer.status_code != 200:
            client.close()
            raise AssertionError(f"login on m{self.index(manager)}: {answer.status_code} {answer.text}")
        return client

    # ---- edges
    def add_edges(self, specs: list[tuple[str, list[dict[str, Any]]]], *, timeout: float = 40.0) -> list[FleetEdge]:
        """For each ``(name, flows)``: create the node (on the first live instance) and start an
        edge registering through HAProxy's TLS listener; then wait until an instance holds each
        and each reads as live. The edges start together (an edge takes seconds to start);
        ``leastconn`` still spreads them, since HAProxy counts a connection from its dispatch."""
        if self.lb is None:
            raise RuntimeError("the fleet runs without a load balancer")
        manager = next(m for m in self.managers if m.process.poll() is None)
        added = []
        with contextlib.closing(self.admin(manager)) as admin:
            for name, flows in specs:
                created = admin.post("/api/v1/nodes", json={"name": name})
                assert created.status_code == 201, created.text
                node_id, token = created.json()["id"], created.json()["registration_token"]
                config = {
                    "version": 1,
                    "device_name": name,
                    "setup_enabled": True,
                    "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
                    "manager": {
                        "enabled": True,
                        "url": self.lb.node_url,
                        "cert_fingerprint": self.lb.fingerprint,
                        "registration_token": token,
                    },
                    "flows": flows,
                }
                edge = start_edge(self.tmp_path / f"edge-{name}", config=config, wait=False)
                added.append(FleetEdge(name, node_id, edge))
                self.edges.append(added[-1])
            for fleet_edge in added:
                wait_healthy(fleet_edge.edge)
            for fleet_edge in added:
                self.wait_holder(fleet_edge.node_id, timeout)
                wait_until(partial(_is_live, admin, fleet_edge.node_id), timeout, f"{fleet_edge.name} live")
        return added

    # ---- diagnostics
    def diagnostics(self, tail: int = 12_000) -> str:
        """Every process's log (the last ``tail`` characters of each) and the fleet tables."""
        parts = []
        for index, manager in enumerate(self.managers):
            state = "running" if manager.process.poll() is None else f"exited {manager.process.returncode}"
            parts.append(f"===== m{index} ({state}, pid {manager.process.pid}) {manager.log_path}\n")
            parts.append(manager.log()[-tail:])
        for fleet_edge in self.edges:
            parts.append(f"===== edge {fleet_edge.name} (node {fleet_edge.node_id}) {fleet_edge.edge.log_path}\n")
            parts.append(fleet_edge.edge.log()[-tail:])
        if self.lb is not None:
            parts.append(f"===== haproxy {self.lb.log_path}\n{self.lb.log()[-tail:]}")
        parts.append(f"===== postgresql {self.cluster.log_path}\n{self.cluster.log()[-tail:]}")
        with contextlib.suppress(psycopg.Error):
            for table in ("manager_instances", "node_connections"):
                parts.append(f"===== {table}\n")
                parts.extend(f"{row}\n" for row in self.query(f"SELECT * FROM {table}"))
        return "".join(parts)


def _is_live(admin: httpx.Client, node_id: str) -> bool:
    return admin.get(f"/api/v1/nodes/{node_id}").json()["status"] in LIVE


def manager_args(database_url: str) -> list[str]:
    """``serve`` flags of every fleet instance."""
    return ["--tls-mode", "behind_proxy", "--database-url", database_url]


@contextlib.contextmanager
def running_manager_fleet(
    tmp_path: Path, count: int = 2, *, login_limit: int = 100, with_lb: bool = True
) -> Iterator[ManagerFleet]:
    """PostgreSQL, ``count`` managers on one fresh database (a super_admin made), and HAProxy.

    ``login_limit`` sets ``max_login_attempts``: the limit is per client IP across the whole
    fleet (login attempts are shared rows), and every test client here is 127.0.0.1.
    """
    with running_postgres() as cluster:
        url = cluster.create_database("fleet")
        database = url.split("@/", 1)[1].split("?", 1)[0]  # postgresql+psycopg://user@/NAME?host=…
        first = tmp_path / "m0"
        done = setup_super_admin(first, extra_args=["--database-url", url])
        assert done.returncode == 0, done.stdout + done.stderr
        managers: list[Manager] = []
        fleet = ManagerFleet(tmp_path, cluster, url, database, managers)
        try:
            # Started together (each takes seconds to import and migrate), then waited for.
            for index in range(count):
                managers.append(start_manager(tmp_path / f"m{index}", extra_args=manager_args(url), wait=False))
            for manager in managers:
                wait_listening(manager)
            with contextlib.closing(fleet.admin(managers[0])) as admin:
                answer = admin.put("/api/v1/settings", json={"settings": {"max_login_attempts": login_limit}})
                assert answer.status_code == 200, answer.text
            for manager in managers:
                fleet.instance_id(manager)
            if with_lb:
                fleet.lb = start_haproxy(tmp_path / "haproxy", [("127.0.0.1", m.port) for m in managers])
            yield fleet
        finally:
            _stop_all(fleet)


def _stop_all(fleet: ManagerFleet) -> None:
    """SIGTERM to every process at once, then wait for each (each takes up to seconds to stop)."""
    processes: list[Manager | Edge | HaProxy] = [e.edge for e in fleet.edges]
    processes += [fleet.lb] if fleet.lb is not None else []
    processes += fleet.managers
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGTERM)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.process.wait(15)
        process.stop()  # kills what did not stop


# --- the dashboard stream ------------------------------------------------------------------


def dashboard_update(
    manager: Manager | HaProxy,
    session: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 15.0,
) -> dict[str, Any]:
    """The first ``dashboard_update`` on ``manager``'s ``/ws/dashboard`` (plain ``ws://``,
    ``behind_proxy``; or HAProxy's plain listener) for which ``predicate`` holds; the
    ``session`` cookie authenticates.
    AssertionError with the last message seen after ``timeout`` seconds."""
    seen: list[dict[str, Any]] = []
    port = manager.http_port if isinstance(manager, HaProxy) else manager.port

    async def read() -> dict[str, Any]:
        async with open_websocket_url(
            f"ws://127.0.0.1:{port}/ws/dashboard",
            extra_headers=[(b"Cookie", f"session={session}".encode())],
            max_message_size=16 * 1024 * 1024,
            connect_timeout=5,
            disconnect_timeout=2,
        ) as ws:
            while True:
                message: dict[str, Any] = json.loads(await ws.get_message())
                seen[:] = [message]
                if message.get("type") == "dashboard_update" and predicate(message):
                    return message

    async def bounded() -> dict[str, Any] | None:
        with trio.move_on_after(timeout):
            return await read()
        return None

    found = trio.run(bounded)
    if found is None:
        raise AssertionError(f"no matching dashboard_update within {timeout}s; last: {seen[-1] if seen else None}")
    return found


def node_in(update: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    """The entry of ``node_id`` in a ``dashboard_update``, or None."""
    for node in update["payload"]["nodes"]:
        if node["node_id"] == node_id:
            return dict(node)
    return None


def session_of(manager: Manager, username: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> tuple[str, str]:
    """A new session on ``manager``: (the ``session`` cookie's JWT, the CSRF token)."""
    with manager.client() as client:
        answer = login(client, username, password)
        assert answer.status_code == 200, answer.text
        session = client.cookies.get("session")
        assert session
        return session, str(answer.json()["csrf_token"])
