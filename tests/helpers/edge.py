"""Run a real ``mp-edge`` for tests: a temp config dir, a free loopback port, a log file.

Usage (sync, from any test)::

    with running_edge(tmp_path) as edge:
        r = httpx.get(edge.url + "/health")

``auth_clients`` writes ``server.auth`` into config.json before start (the edge
moves it into the encrypted secrets.json on start, as in the field).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# Re-exported: most tests take them from here.
from tests.helpers.ports import free_port as free_port
from tests.helpers.ports import free_udp_port as free_udp_port

EDGE_BIN = Path(sys.executable).with_name("mp-edge")
JWT_SECRET = "0123456789abcdef" * 4
ADMIN = ("admin-client", "admin-secret-0123456789")
MONITOR = ("monitor-client", "monitor-secret-0123456789")


@dataclass
class Edge:
    config_dir: Path
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, role: str | None = None, timeout: float = 10.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(role)}"} if role else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def token(self, role: str | None) -> str:
        if role is None:
            return ""
        if role not in self.tokens:
            client_id, secret = ADMIN if role == "admin" else MONITOR
            r = httpx.post(
                self.url + "/oauth/token",
                json={"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret},
                timeout=10,
            )
            r.raise_for_status()
            self.tokens[role] = r.json()["access_token"]
        return self.tokens[role]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return int(self.process.returncode)


def write_config(config_dir: Path, config: dict[str, Any]) -> None:
    config_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_dir / "config.json"
    path.write_text(json.dumps(config))
    path.chmod(0o600)


def auth_section(public_metrics: bool = True, lifetime: int = 3600) -> dict[str, Any]:
    return {
        "enabled": True,
        "jwt_secret": JWT_SECRET,
        "token_lifetime_secs": lifetime,
        "public_metrics": public_metrics,
        "clients": [
            {"client_id": ADMIN[0], "client_secret": ADMIN[1], "role": "admin"},
            {"client_id": MONITOR[0], "client_secret": MONITOR[1], "role": "monitor"},
        ],
    }


def start_edge(
    config_dir: Path,
    *,
    port: int | None = None,
    config: dict[str, Any] | None = None,
    machine_id: Path | None = None,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    wait: bool = True,
) -> Edge:
    """Start ``mp-edge`` (optionally writing ``config`` first) and wait for /health."""
    if config is not None:
        write_config(config_dir, config)
    port = port or free_port()
    log_path = config_dir.parent / f"{config_dir.name}-edge-{port}.log"
    env = {**os.environ, **(extra_env or {})}
    log = log_path.open("ab")
    process = subprocess.Popen(
        [
            str(EDGE_BIN),
            "--config-dir",
            str(config_dir),
            "--listen-addr",
            "127.0.0.1",
            "--listen-port",
            str(port),
            *(extra_args or []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    log.close()
    edge = Edge(config_dir, port, process, log_path)
    if wait:
        wait_healthy(edge)
    return edge


def wait_healthy(edge: Edge, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if edge.process.poll() is not None:
            raise RuntimeError(f"mp-edge exited with {edge.process.returncode}:\n{edge.log()}")
        try:
            if httpx.get(edge.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    edge.stop()
    raise RuntimeError(f"mp-edge did not answer /health in {timeout}s:\n{edge.log()}")


@contextlib.contextmanager
def running_edge(tmp_path: Path, **kwargs: Any) -> Iterator[Edge]:
    """A started edge in ``tmp_path/edge``; stopped (and its workers reaped) on exit."""
    edge = start_edge(tmp_path / "edge", **kwargs)
    try:
        yield edge
    finally:
        edge.stop()


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


def udp_port_bound(port: int, host: str = "127.0.0.1") -> bool:
    """Whether some socket holds UDP ``host:port``: a bind without SO_REUSEADDR fails with EADDRINUSE.

    The edge's input sockets set SO_REUSEADDR; this probe does not, so it cannot share
    the port with them: this is how a test sees from outside which inputs the engine holds.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def flow_stats(edge: Edge, flow_id: str) -> dict[str, Any]:
    """``GET /api/v1/stats/{flow_id}``'s data."""
    with edge.client() as api:
        data: dict[str, Any] = api.get(f"/api/v1/stats/{flow_id}").json()["data"]
        return data


def edge_events(edge: Edge) -> list[dict[str, Any]]:
    """The newest 500 events of ``GET /api/v1/events``."""
    with edge.client() as api:
        data: list[dict[str, Any]] = api.get("/api/v1/events", params={"limit": 500}).json()["data"]["events"]
        return data


def create_flow(edge: Edge, flow: dict[str, Any]) -> None:
    """``POST /api/v1/flows``, asserting a 200."""
    with edge.client() as api:
        answer = api.post("/api/v1/flows", json=flow)
        assert answer.status_code == 200, answer.text
