"""Fleet manager capacity: how many simulated nodes one ``mp-manager`` holds over real WSS.

    python -m bench.manager [--nodes 5000] [--steps 500 1000 2000 3000 5000] [--commands 200]
                            [--workers 3] [--quick] [--json PATH] [--keep DIR]
                            [--fleet | --no-fleet] [--fleet-nodes 100] [--fleet-commands 200]

After the climb the same run measures the fleet scenario (``bench/manager_fleet.py``: two
instances on one PostgreSQL, command round trips through the instance holding the node and
through the other one, then one instance SIGKILLed and its nodes' way back to the survivor);
``--fleet`` runs only that, ``--no-fleet`` skips it, and without PostgreSQL it is skipped with a
line saying so. The rest of this docstring is the climb's.

Starts the real ``mp-manager serve`` (a fresh data dir, SQLite, ``direct`` TLS with its
self-signed certificate, a free port on 127.0.0.1, ``--log-level warning``), makes a super admin
with ``mp-manager setup`` and creates the nodes through ``POST /api/v1/nodes``. The nodes are
simulated in ``--workers`` child processes (one trio loop each, so the client side is not held to
one core); each node is a ``NodeSession`` over trio-websocket + TLS, like
``tests/helpers/test_node.py`` but lighter: it registers with its token, sends ``health`` at once
and every 15 s, ``stats`` every second (an edge-shaped body: 2 flows with input, output and
TR 101 290 counters, ~2 KiB), answers ``ping`` with ``pong`` and every command (``get_config``
with its config). The nodes' one-second phases are spread at random, as real edges' would be.

The fleet grows in steps (default 100, 250, 500, 1000, 2000, 3000, 5000; ``--nodes`` caps them): the new
nodes connect ``--connect-concurrency`` at a time per worker, and after ``--settle`` seconds the
step is measured for at least ``--measure`` seconds:

- **online**: nodes whose ``status`` is ``online`` in ``GET /api/v1/nodes`` (the manager's view);
  ``dropped``: sockets the manager closed during the run;
- **stats/s**: ``stats`` frames the nodes sent per second in the window, against one per node
  per second; **lag p99**: how late a node's one-second tick was. Send stalls only once the
  socket buffers are full, so the manager's own lag shows in **behind s**: the bytes waiting
  unread in the manager's sockets (``rx_queue`` in ``/proc/net/tcp``, the largest of 3 samples)
  divided by the bytes of stats arriving per second;
- **cmd p50/p99**: ``--commands`` round trips of ``POST /api/v1/nodes/{id}/command``
  ``{"action": {"type": "get_config"}}`` (the manager relays it, the node answers
  ``config_response``, the manager caches it and answers 200), to random connected nodes,
  ``--command-concurrency`` at a time from one ``httpx.AsyncClient``, for at most 60 s; ``fail``:
  non-200 answers, and round trips not done in those 60 s;
- **RSS MiB**: the manager's ``VmRSS``; **KiB/node** = (RSS now - RSS before any node) / nodes;
- **mgr CPU %** and **nodes CPU %** (all worker processes): CPU time over the window from
  ``/proc/<pid>/stat``, 100 % = one core.

A step is **held** when every node is connected and online, none dropped, no command failed,
the nodes sent >= 95 % of their stats, the manager is less than 1 s behind reading them and the
command p99 is under ``--p99-ceiling`` (5000 ms: half the command timeout).
The climb stops at the first step not held. The verdict line compares the highest step held with
the issue's goal: 5,000 nodes with a command p99 under 250 ms. The nodes and the manager share
this machine's CPUs: every node CPU % is taken from the manager.

The table goes to stdout (no ``|`` in it: ``python -m bench`` prints it after its own table),
progress to stderr. Every loop is bounded in count and time; all traffic stays on 127.0.0.1; the
manager and the workers are stopped on exit, an exception or Ctrl-C included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import random
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bench.tools.procfs import cpu_seconds

if TYPE_CHECKING:
    from bench.manager_fleet import FleetOptions

BIN: Final = Path(sys.executable).parent
ADMIN_USER: Final = "bench"
ADMIN_PASSWORD: Final = "Bench-Passw0rd-7c1e"
# Bench-only values, never a real deployment's: the manager refuses to start without both.
JWT_SECRET: Final = "be4c0be4c0be4c00" * 4
MASTER_KEY: Final = "5eed5eed" * 8

GOAL_NODES: Final = 5000
GOAL_P99_MS: Final = 250.0
DEFAULT_STEPS: Final = (100, 250, 500, 1000, 2000, 3000, 5000)
STATS_INTERVAL_S: Final = 1.0
HEALTH_EVERY_TICKS: Final = 15  # interop 6: health every 15 s
CONNECT_TIMEOUT_S: Final = 20.0  # TCP + TLS + WebSocket handshake of one node
AUTH_TIMEOUT_S: Final = 30.0  # auth frame sent -> register_ack (the manager writes to its DB)
STEP_CONNECT_LIMIT_S: Final = 240.0  # a step whose nodes are not all up by then is not held
MIN_STATS_SHARE: Final = 0.95
COMMAND_PHASE_LIMIT_S: Final = 60.0  # commands not started by then are left out (and counted)
MAX_BEHIND_S: Final = 1.0  # the manager may hold at most 1 s of stats unread
LAG_SAMPLES_MAX: Final = 200_000  # per worker and window: bounded memory at any node count
DROPPED: Final = "dropped"  # how a connection ended: closed under an authenticated node
CLOSED: Final = "closed by the manager"  # ... or the manager ended the session itself
# A fleet node (``add_fleet``) stops reconnecting after this many attempts in a row that did
# not authenticate: with the backoff's 60 s ceiling that is well over 10 minutes of trying.
FLEET_MAX_FAILED_ATTEMPTS: Final = 20


def raise_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: thousands of sockets on each side."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def log(text: str) -> None:
    """Progress, to stderr (the table is stdout's)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..1); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


# ---------------------------------------------------------------------------- /proc readers


def rss_bytes(pid: int) -> int:
    """VmRSS of one process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def unread_bytes(port: int) -> int:
    """Bytes waiting unread in the established sockets listening-side of ``port``: the manager's
    input backlog (``rx_queue`` of ``/proc/net/tcp``; the manager binds IPv4 127.0.0.1)."""
    total = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            parts = line.split()
            if parts[3] != "01" or int(parts[1].rsplit(":", 1)[1], 16) != port:
                continue
            total += int(parts[4].split(":")[1], 16)
    return total


# ---------------------------------------------------------------------------- the manager


def free_port() -> int:
    """A port free on 127.0.0.1 now. ``--port 0`` would need the info-level log line to learn
    the port; at ``--log-level warning`` the bench picks it (the race is harmless here)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def manager_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEDIAPLANE_")}
    env["MEDIAPLANE_JWT_SECRET"] = JWT_SECRET
    env["MEDIAPLANE_MASTER_KEY"] = MASTER_KEY
    return env


@dataclass
class Manager:
    """A running ``mp-manager serve``."""

    process: subprocess.Popen[bytes]
    data_dir: Path
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def cert_path(self) -> Path:
        return self.data_dir / "tls" / "cert.pem"

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts only the manager's own self-signed certificate."""
        return ssl.create_default_context(cafile=str(self.cert_path))


@contextlib.contextmanager
def running_manager(workdir: Path) -> Iterator[Manager]:
    """``mp-manager setup`` then ``serve`` on a fresh data dir; stopped (SIGTERM, then SIGKILL)
    on exit. Raises RuntimeError when it does not answer ``/health`` within 60 s."""
    import httpx

    data_dir = workdir / "manager-data"
    setup = subprocess.run(
        [str(BIN / "mp-manager"), "setup", "--data-dir", str(data_dir), "--username", ADMIN_USER, "--password-stdin"],
        input=ADMIN_PASSWORD + "\n",
        env=manager_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if setup.returncode != 0:
        raise RuntimeError(f"mp-manager setup failed: {setup.stdout}{setup.stderr}")
    port = free_port()
    log_path = workdir / "manager.log"
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [
                str(BIN / "mp-manager"),
                "serve",
                "--data-dir",
                str(data_dir),
                "--listen-addr",
                "127.0.0.1",
                "--port",
                str(port),
                "--tls-mode",
                "direct",
                "--log-level",
                "warning",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=manager_env(),
            start_new_session=True,  # Ctrl-C in the terminal reaches the bench, which stops it
        )
    manager = Manager(process, data_dir, port, log_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"mp-manager exited with {process.returncode}: {log_path.read_text()[-2000:]}")
            if manager.cert_path.exists():
                with contextlib.suppress(httpx.HTTPError, ssl.SSLError, OSError):
                    if httpx.get(f"{manager.url}/health", verify=manager.ssl_context(), timeout=2).status_code == 200:
                        break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"mp-manager did not answer /health in 60 s: {log_path.read_text()[-2000:]}")
        yield manager
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


# ---------------------------------------------------------------------------- the simulated nodes


def stats_body(tick: int) -> dict[str, Any]:
    """An edge's ``stats`` payload (interop 6), built with the edge's own models so its shape is
    the real one: 2 running RTP flows, 2 outputs each, counters advancing with ``tick``."""
    from appliance.models.stats import FlowState, FlowStats, Health, InputStats, OutputStats, Tr101290Stats
    from appliance.protocol import edge_stats_payload

    packets = 950 * tick
    flows = [
        FlowStats(
            flow_id=f"cam{n}",
            flow_name=f"Camera {n}",
            state=FlowState.RUNNING,
            health=Health.HEALTHY,
            uptime_secs=tick,
            input=InputStats(
                input_type="rtp",
                state="Running",
                packets_received=packets,
                bytes_received=packets * 1328,
                bitrate_bps=10_000_000,
            ),
            outputs=[
                OutputStats(
                    output_id=f"out{k}",
                    output_name=f"Output {k}",
                    output_type="rtp",
                    state="Running",
                    packets_sent=packets,
                    bytes_sent=packets * 1328,
                    bitrate_bps=10_000_000,
                )
                for k in (1, 2)
            ],
            tr101290=Tr101290Stats(ts_packets_analyzed=packets * 7, pat_count=tick * 10, pmt_count=tick * 10),
        )
        for n in (1, 2)
    ]
    payload = edge_stats_payload(flows=flows, tunnels=[], uptime_secs=tick, active_flows=2, total_flows=2)
    return dict(payload.root)


NODE_CONFIG: Final = {"version": 1, "flows": [], "tunnels": []}


@dataclass
class WorkerCounters:
    """What one worker reports; the window fields restart at each ``report(reset=True)``."""

    connected: int = 0
    connect_failed: int = 0
    dropped: int = 0
    stats_sent: int = 0
    ticks_missed: int = 0
    commands: int = 0
    lags: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    window_start: float = 0.0


@dataclass
class FleetNode:
    """One node of the fleet scenario (``bench/manager_fleet.py``) as its worker tracks it. Times
    are ``time.monotonic()``: CLOCK_MONOTONIC, one clock for every process of the machine, so the
    orchestrator can set them against the moment it killed an instance."""

    urls: list[str]
    """The managers' ``/ws/node`` URLs, tried in turn from the first."""
    node_id: str = ""
    url: str = ""
    """Where it is connected now (or was last)."""
    online: bool = False
    connects: int = 0
    """Authenticated connections so far."""
    lost_at: float | None = None
    """When its last authenticated connection ended."""
    back_at: float | None = None
    """When it last authenticated."""
    failed_attempts: int = 0
    """Attempts since the last authenticated one that did not authenticate."""
    failed_total: int = 0
    """Attempts that did not authenticate, over the node's life."""
    last_failure: str = ""
    credentials: Any = None
    """The ``NodeCredentials`` in use (the token, then the node id + secret); kept in the worker."""

    def report(self) -> dict[str, Any]:
        """What the orchestrator gets (the secret stays in the worker)."""
        return {k: v for k, v in asdict(self).items() if k != "credentials"}


class NodeWorker:
    """One worker process's nodes, all in one trio loop."""

    def __init__(self, url: str, cert_path: str | None, connect_concurrency: int) -> None:
        self.url = url
        # None: plain ws:// (a manager in behind_proxy mode, as the fleet scenario runs them).
        self.ssl_context = ssl.create_default_context(cafile=cert_path) if cert_path else None
        self.limiter_size = connect_concurrency
        self.counters = WorkerCounters()
        self.tick = 0
        self.stats_frame = ""
        self.health_frame = ""
        self.fleet_nodes: list[FleetNode] = []

    def _fail(self, reason: str) -> None:
        self.counters.connect_failed += 1
        self.counters.failures[reason] = self.counters.failures.get(reason, 0) + 1

    async def run(self, conn: multiprocessing.connection.Connection) -> None:
        """Serve the orchestrator's requests until ``stop``."""
        import trio

        self.counters.window_start = trio.current_time()
        async with trio.open_nursery() as nursery:
            self._refresh_frames()
            nursery.start_soon(self._ticker)
            limiter = trio.CapacityLimiter(self.limiter_size)
            while True:
                request = await trio.to_thread.run_sync(conn.recv, abandon_on_cancel=True)
                if request[0] == "add":
                    reply: Any = await self._add(nursery, limiter, request[1])
                elif request[0] == "add_fleet":
                    reply = await self._add_fleet(nursery, limiter, request[1])
                elif request[0] == "report":
                    reply = self._report(reset=request[1])
                elif request[0] == "fleet_report":
                    reply = [node.report() for node in self.fleet_nodes]
                else:  # "stop": cancelling the nursery closes every socket (bounded, see _node)
                    nursery.cancel_scope.cancel()
                    return
                await trio.to_thread.run_sync(conn.send, reply)

    async def _add(self, nursery: Any, limiter: Any, tokens: list[str]) -> dict[str, Any]:
        """Start one node per token; wait (bounded) until each is authenticated or failed."""
        import trio

        started = trio.current_time()
        before_ok, before_failed = self.counters.connected, self.counters.connect_failed
        ids: list[str] = []
        settled = trio.Semaphore(0)
        for token in tokens:
            nursery.start_soon(self._node, token, limiter, ids, settled)
        with trio.move_on_after(STEP_CONNECT_LIMIT_S):
            for _ in tokens:
                await settled.acquire()
        return {
            "connected": self.counters.connected - before_ok,
            "failed": self.counters.connect_failed - before_failed,
            "seconds": trio.current_time() - started,
            "node_ids": ids,
            "failures": dict(self.counters.failures),
        }

    async def _add_fleet(self, nursery: Any, limiter: Any, nodes: list[tuple[str, list[str]]]) -> dict[str, Any]:
        """Start one fleet node per (token, manager URLs); wait (bounded) until each has
        authenticated or failed its first attempt (it then keeps trying on its own)."""
        import trio

        started = trio.current_time()
        new = [FleetNode(urls=urls) for _token, urls in nodes]
        self.fleet_nodes += new
        before_failed = self.counters.connect_failed
        settled = trio.Semaphore(0)
        for node, (token, _urls) in zip(new, nodes, strict=True):
            nursery.start_soon(self._fleet_node, node, token, limiter, settled)
        with trio.move_on_after(STEP_CONNECT_LIMIT_S):
            for _ in nodes:
                await settled.acquire()
        return {
            "connected": sum(1 for node in new if node.connects),
            "failed": self.counters.connect_failed - before_failed,
            "seconds": trio.current_time() - started,
            "failures": dict(self.counters.failures),
        }

    async def _fleet_node(self, node: FleetNode, token: str, limiter: Any, settled: Any) -> None:
        """A node that reconnects like the real client (``appliance/manager_client.py``): after a
        lost connection or a failed attempt it waits the client's backoff (1, 2, 4 ... 60 s,
        +-10 %, reset by an authenticated connection) and tries the next manager URL of its list,
        with the node id + secret it was given at registration. The first attempt holds a
        connect slot (``--connect-concurrency``); reconnects do not: a fleet whose manager died
        comes back all at once, spread only by the jitter, and that is what the bench measures."""
        import trio
        from pydantic import SecretStr

        from appliance.protocol import NodeCredentials
        from appliance.protocol.policy import Backoff

        backoff = Backoff(random.Random())
        node.credentials = NodeCredentials(registration_token=SecretStr(token))
        url = node.urls[0]
        holding = True  # the connect slot of the first attempt

        def release_slot() -> None:
            nonlocal holding
            if holding:
                holding = False
                limiter.release()
                settled.release()

        def registered(event: Any) -> None:
            node.node_id = event.node_id
            node.credentials = NodeCredentials(node_id=event.node_id, node_secret=event.node_secret)

        def authenticated() -> None:
            node.online, node.url, node.back_at = True, url, time.monotonic()
            node.connects += 1
            node.failed_attempts = 0
            backoff.reset()
            release_slot()

        await limiter.acquire()
        try:
            index = 0
            while node.failed_attempts < FLEET_MAX_FAILED_ATTEMPTS:
                url = node.urls[index]
                was_authenticated, reason = await self._connection(url, node.credentials, registered, authenticated)
                if was_authenticated:
                    node.online, node.lost_at = False, time.monotonic()
                else:
                    node.failed_attempts += 1
                    node.failed_total += 1
                    node.last_failure = reason
                    if holding:  # the first attempt failed: counted as the capacity bench does
                        self._fail(reason)
                        release_slot()
                index = (index + 1) % len(node.urls)
                await trio.sleep(backoff.next_delay())
        finally:
            release_slot()

    def _refresh_frames(self) -> None:
        """One encoded ``stats`` frame per tick, shared by every node of the worker: the client
        pays only for sending it, the manager still decodes every copy."""
        from appliance.protocol import HealthMessage, HealthPayload, StatsMessage, StatsPayload, encode

        now = datetime.now(UTC)
        self.stats_frame = encode(StatsMessage(timestamp=now, payload=StatsPayload(stats_body(self.tick))))
        health = {
            "status": "ok",
            "version": "0.3.0",
            "uptime_secs": self.tick,
            "active_flows": 2,
            "total_flows": 2,
            "api_addr": "0.0.0.0:8080",
            "monitor_addr": None,
        }
        self.health_frame = encode(HealthMessage(timestamp=now, payload=HealthPayload(health)))

    async def _ticker(self) -> None:
        import trio

        while True:
            await trio.sleep(STATS_INTERVAL_S)
            self.tick += 1
            self._refresh_frames()

    async def _node(self, token: str, limiter: Any, ids: list[str], settled: Any) -> None:
        """One node: connect and register (holding a connect slot), then live until the socket
        closes or the worker stops."""
        from pydantic import SecretStr

        from appliance.protocol import NodeCredentials

        holding = True  # the connect slot, released once authenticated or failed

        def authenticated() -> None:
            nonlocal holding
            self.counters.connected += 1
            limiter.release()
            settled.release()
            holding = False

        await limiter.acquire()
        try:
            was_authenticated, reason = await self._connection(
                self.url,
                NodeCredentials(registration_token=SecretStr(token)),
                lambda registered: ids.append(registered.node_id),
                authenticated,
            )
            if reason == DROPPED:
                self.counters.dropped += 1
            elif not was_authenticated:
                self._fail(reason)
        finally:
            if holding:
                limiter.release()
                settled.release()

    async def _connection(
        self,
        url: str,
        credentials: Any,
        on_registered: Callable[[Any], None],
        on_authenticated: Callable[[], None],
    ) -> tuple[bool, str]:
        """One connection of one node: connect, ``auth`` with ``credentials`` (a
        ``NodeCredentials``), then live until the socket closes. Returns whether it authenticated
        and how it ended: ``DROPPED`` (closed under it once authenticated), ``CLOSED`` (the
        manager ended the session), else why it failed before that."""
        import trio
        from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

        from appliance.protocol import (
            MANAGER_FRAME_MAX_BYTES,
            Authenticated,
            AuthRejected,
            DeviceType,
            NodeSession,
            NodeState,
            Registered,
        )

        session = NodeSession(
            credentials=credentials,
            software_version="0.3.0",
            device_type=DeviceType.EDGE,
            wall_clock=lambda: datetime.now(UTC),
        )
        authenticated = False
        rejected = ""
        try:
            # The connect timeout is trio-websocket's (TCP + TLS + upgrade); its close on the way
            # out is bounded by disconnect_timeout, so a stopping worker never hangs on a socket.
            async with open_websocket_url(
                url,
                self.ssl_context if url.startswith("wss:") else None,
                max_message_size=MANAGER_FRAME_MAX_BYTES,
                connect_timeout=CONNECT_TIMEOUT_S,
                disconnect_timeout=2,
            ) as ws:
                with trio.fail_after(AUTH_TIMEOUT_S):
                    await ws.send_message(session.start(trio.current_time()))
                    while session.state is NodeState.AWAITING_REPLY:
                        step = session.on_frame(await ws.get_message(), trio.current_time())
                        for event in step.events:
                            if isinstance(event, Registered):
                                on_registered(event)
                            elif isinstance(event, Authenticated):
                                authenticated = True
                            elif isinstance(event, AuthRejected):
                                rejected = f"rejected: {event.message}"
                if not authenticated:
                    return False, rejected or "no auth reply"
                on_authenticated()
                await ws.send_message(self.health_frame)  # the edge sends health at once
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._stats_loop, ws)
                    await self._read_loop(ws, session)
                    nursery.cancel_scope.cancel()
                return True, CLOSED
        except (ConnectionClosed, trio.TooSlowError, OSError, HandshakeError, BaseExceptionGroup) as exc:
            # A socket closed under the read loop, the stats loop or trio-websocket's own
            # nursery comes wrapped in exception groups; anything else in them is re-raised.
            failure = link_error(exc, (ConnectionClosed, trio.TooSlowError, OSError, HandshakeError))
            if failure is None:
                raise
            if authenticated:
                return True, DROPPED
            if isinstance(failure, trio.TooSlowError):
                return False, "auth timeout"
            if isinstance(failure, ConnectionClosed):
                return False, "closed during auth"
            return False, type(failure).__name__

    async def _read_loop(self, ws: Any, session: Any) -> None:
        """Answer pings (the session builds the pong) and commands until the socket closes."""
        import trio

        from appliance.protocol import CommandReceived, GetConfig, InvalidAction, UnknownAction

        while True:
            step = session.on_frame(await ws.get_message(), trio.current_time())
            for frame in step.frames:
                await ws.send_message(frame)
            for event in step.events:
                if isinstance(event, CommandReceived):
                    self.counters.commands += 1
                    action = event.action
                    if isinstance(action, GetConfig):
                        await ws.send_message(session.config_response(NODE_CONFIG))
                    elif isinstance(action, UnknownAction | InvalidAction):
                        await ws.send_message(session.command_ack(event.command_id, success=False, error=action.error))
                    else:
                        await ws.send_message(session.command_ack(event.command_id, success=True))
            if step.close is not None:
                return

    async def _stats_loop(self, ws: Any) -> None:
        """``stats`` every second at a random phase, ``health`` every 15th tick. A late tick is
        not caught up with a burst (an edge's stats task does not either): it counts as missed."""
        import trio

        next_at = trio.current_time() + random.random() * STATS_INTERVAL_S
        ticks = 0
        while True:
            await trio.sleep_until(next_at)
            await ws.send_message(self.stats_frame)
            ticks += 1
            if ticks % HEALTH_EVERY_TICKS == 0:
                await ws.send_message(self.health_frame)
            now = trio.current_time()
            self.counters.stats_sent += 1
            if len(self.counters.lags) < LAG_SAMPLES_MAX:
                self.counters.lags.append(now - next_at)
            next_at += STATS_INTERVAL_S
            if next_at < now:
                missed = math.ceil((now - next_at) / STATS_INTERVAL_S)
                self.counters.ticks_missed += missed
                next_at += missed * STATS_INTERVAL_S

    def _report(self, *, reset: bool) -> dict[str, Any]:
        import trio

        c = self.counters
        lags = c.lags
        report = {
            "connected": c.connected - c.dropped,
            "dropped": c.dropped,
            "connect_failed": c.connect_failed,
            "stats_sent": c.stats_sent,
            "ticks_missed": c.ticks_missed,
            "commands": c.commands,
            "stats_frame_bytes": len(self.stats_frame.encode()),
            "window_s": trio.current_time() - c.window_start,
            "lag_p50_ms": percentile(lags, 0.5) * 1000,
            "lag_p99_ms": percentile(lags, 0.99) * 1000,
            "lag_max_ms": max(lags, default=math.nan) * 1000,
        }
        if reset:
            c.stats_sent = c.ticks_missed = 0
            c.lags = []
            c.window_start = trio.current_time()
        return report


def link_error(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first of ``exc``'s leaf exceptions when every leaf is one of ``kinds``, else None
    (a group holding a ``trio.Cancelled`` or a bug must propagate)."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [link_error(inner, kinds) for inner in exc.exceptions]
        return leaves[0] if leaves and all(leaf is not None for leaf in leaves) else None
    return exc if isinstance(exc, kinds) else None


def worker_main(conn: multiprocessing.connection.Connection, url: str, cert_path: str | None, concurrency: int) -> None:
    """Entry point of a worker process (multiprocessing, spawn)."""
    import trio

    raise_nofile()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator stops the workers
    trio.run(NodeWorker(url, cert_path, concurrency).run, conn)


class Workers:
    """The worker processes and their pipes."""

    def __init__(self, count: int, url: str, cert_path: Path | None, concurrency: int) -> None:
        context = multiprocessing.get_context("spawn")  # not fork: the parent may hold threads
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.processes: list[Any] = []
        for _ in range(count):
            parent, child = context.Pipe()
            cert = str(cert_path) if cert_path is not None else None
            process = context.Process(target=worker_main, args=(child, url, cert, concurrency), daemon=True)
            process.start()
            child.close()
            self.pipes.append(parent)
            self.processes.append(process)

    async def ask_all(self, requests: list[Any], timeout_s: float) -> list[Any]:
        """Send one request to each worker and gather the replies (in parallel)."""
        import trio

        replies: list[Any] = [None] * len(self.pipes)

        async def one(index: int) -> None:
            pipe = self.pipes[index]
            pipe.send(requests[index])
            if not await trio.to_thread.run_sync(pipe.poll, timeout_s, abandon_on_cancel=True):
                raise RuntimeError(f"worker {index} did not answer {requests[index][0]} in {timeout_s:.0f} s")
            replies[index] = pipe.recv()

        async with trio.open_nursery() as nursery:
            for index in range(len(self.pipes)):
                nursery.start_soon(one, index)
        return replies

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes)

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError, ValueError):
                pipe.send(("stop",))
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


# ---------------------------------------------------------------------------- the steps


@dataclass
class StepResult:
    """One row of the table."""

    nodes: int
    online: int = 0
    connected: int = 0
    dropped: int = 0
    connect_failed: int = 0
    connect_s: float = 0.0
    stats_per_s: float = 0.0
    lag_p99_ms: float = math.nan
    backlog_kib: float = 0.0
    behind_s: float = 0.0
    cmd_p50_ms: float = math.nan
    cmd_p99_ms: float = math.nan
    cmd_max_ms: float = math.nan
    cmd_failed: int = 0
    commands: int = 0
    rss_mib: float = 0.0
    kib_per_node: float = 0.0
    manager_cpu_pct: float = 0.0
    nodes_cpu_pct: float = 0.0
    list_nodes_ms: float = 0.0
    held: bool = False
    why_not: str = ""
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class Options:
    steps: list[int]
    workers: int
    commands: int
    command_concurrency: int
    connect_concurrency: int
    settle_s: float
    measure_s: float
    p99_ceiling_ms: float
    quick: bool = False
    capacity: bool = True
    """Run the capacity climb (off with ``--fleet``)."""
    fleet: FleetOptions | None = None
    """The fleet scenario's sizes (``bench/manager_fleet.py``); None with ``--no-fleet``."""
    fleet_required: bool = False
    """``--fleet``: no PostgreSQL is an error, not a skip."""


async def create_nodes(client: Any, count: int, first: int) -> list[str]:
    """``count`` nodes through ``POST /api/v1/nodes``, 16 requests at a time; their tokens."""
    import trio

    tokens: list[str] = []
    limiter = trio.CapacityLimiter(16)

    async def one(index: int) -> None:
        async with limiter:
            response = await client.post("/api/v1/nodes", json={"name": f"bench-node-{index:05d}"})
            if response.status_code != 201:
                raise RuntimeError(f"POST /api/v1/nodes: {response.status_code} {response.text[:200]}")
            tokens.append(response.json()["registration_token"])

    async with trio.open_nursery() as nursery:
        for index in range(first, first + count):
            nursery.start_soon(one, index)
    return tokens


async def command_round_trips(
    client: Any, node_ids: list[str], count: int, concurrency: int
) -> tuple[list[float], int]:
    """``count`` ``get_config`` commands to random nodes; (latencies in ms, non-200 answers)."""
    import trio

    latencies: list[float] = []
    failed = 0
    limiter = trio.CapacityLimiter(concurrency)
    rng = random.Random(count)

    async def one(node_id: str) -> None:
        nonlocal failed
        async with limiter:
            started = time.perf_counter()
            try:
                response = await client.post(
                    f"/api/v1/nodes/{node_id}/command", json={"action": {"type": "get_config"}}
                )
                ok = response.status_code == 200
            except Exception:  # a timeout or a reset is a failed round trip, not a crashed bench
                ok = False
            latencies.append((time.perf_counter() - started) * 1000)
            failed += not ok

    # Bounded in time: a manager that answers in 10 s (the command timeout) would otherwise hold
    # the step for count / concurrency x 10 s. A round trip cut off counts as failed.
    async with trio.open_nursery() as nursery:
        nursery.cancel_scope.deadline = trio.current_time() + COMMAND_PHASE_LIMIT_S
        for _ in range(count):
            nursery.start_soon(one, rng.choice(node_ids))
    return latencies, failed + count - len(latencies)


async def run_steps(manager: Manager, workers: Workers, opts: Options) -> tuple[list[StepResult], int]:
    """Grow the fleet step by step and measure each; the rows and the manager's idle RSS."""
    import httpx
    import trio

    rows: list[StepResult] = []
    node_ids: list[str] = []
    created = 0
    async with httpx.AsyncClient(base_url=manager.url, verify=manager.ssl_context(), timeout=30) as client:
        login = await client.post("/api/v1/auth/login", json={"username": ADMIN_USER, "password": ADMIN_PASSWORD})
        login.raise_for_status()
        client.headers["X-CSRF-Token"] = login.json()["csrf_token"]
        await trio.sleep(1)
        idle_rss = rss_bytes(manager.process.pid)
        log(f"manager idle: RSS {idle_rss / 2**20:.1f} MiB")
        for target in opts.steps:
            row = StepResult(nodes=target)
            rows.append(row)
            started = time.monotonic()
            tokens = await create_nodes(client, target - created, created)
            created = target
            log(f"step {target}: {len(tokens)} nodes created in {time.monotonic() - started:.1f} s; connecting")
            shares: list[list[str]] = [tokens[i :: opts.workers] for i in range(opts.workers)]
            replies = await workers.ask_all([("add", share) for share in shares], STEP_CONNECT_LIMIT_S + 30)
            row.connect_s = max(r["seconds"] for r in replies)
            for reply in replies:
                node_ids += reply["node_ids"]
                for reason, n in reply["failures"].items():  # cumulative per worker: the sum is the run's
                    row.failures[reason] = row.failures.get(reason, 0) + n
            log(
                f"step {target}: +{sum(r['connected'] for r in replies)} connected,"
                f" {sum(r['failed'] for r in replies)} failed in {row.connect_s:.1f} s; settling {opts.settle_s:.0f} s"
            )
            await trio.sleep(opts.settle_s)
            await workers.ask_all([("report", True)] * opts.workers, 30)
            mgr_cpu0, nodes_cpu0, t0 = cpu_seconds(manager.process.pid), workers.cpu_seconds(), time.monotonic()
            backlogs = [unread_bytes(manager.port)]
            latencies, row.cmd_failed = (
                await command_round_trips(client, node_ids, opts.commands, opts.command_concurrency)
                if node_ids
                else ([], 0)
            )
            row.commands = len(latencies)
            backlogs.append(unread_bytes(manager.port))
            rest = opts.measure_s - (time.monotonic() - t0)
            if rest > 0:
                await trio.sleep(rest)
            backlogs.append(unread_bytes(manager.port))
            elapsed = time.monotonic() - t0
            row.manager_cpu_pct = (cpu_seconds(manager.process.pid) - mgr_cpu0) / elapsed * 100
            row.nodes_cpu_pct = (workers.cpu_seconds() - nodes_cpu0) / elapsed * 100
            reports = await workers.ask_all([("report", False)] * opts.workers, 30)
            rss = rss_bytes(manager.process.pid)
            listed = time.monotonic()
            response = await client.get("/api/v1/nodes")
            row.list_nodes_ms = (time.monotonic() - listed) * 1000
            response.raise_for_status()
            row.online = sum(1 for node in response.json() if node["status"] == "online")
            row.connected = sum(r["connected"] for r in reports)
            row.dropped = sum(r["dropped"] for r in reports)
            row.connect_failed = sum(r["connect_failed"] for r in reports)
            window = max(r["window_s"] for r in reports)
            row.stats_per_s = sum(r["stats_sent"] for r in reports) / window
            row.lag_p99_ms = max(
                (r["lag_p99_ms"] for r in reports if not math.isnan(r["lag_p99_ms"])), default=math.nan
            )
            row.backlog_kib = max(backlogs) / 1024
            # Unread input in seconds of stats: how far behind the manager's reading is.
            arriving = target * max(r["stats_frame_bytes"] for r in reports) / STATS_INTERVAL_S
            row.behind_s = max(backlogs) / arriving
            row.cmd_p50_ms = percentile(latencies, 0.5)
            row.cmd_p99_ms = percentile(latencies, 0.99)
            row.cmd_max_ms = max(latencies, default=math.nan)
            row.rss_mib = rss / 2**20
            row.kib_per_node = (rss - idle_rss) / 1024 / target
            row.held, row.why_not = judge(row, opts)
            log(
                f"step {target}: online {row.online}, dropped {row.dropped}, stats {row.stats_per_s:.0f}/s"
                f" (lag p99 {row.lag_p99_ms:.0f} ms), backlog {row.backlog_kib:.0f} KiB ({row.behind_s:.1f} s),"
                f" cmd p50/p99 {row.cmd_p50_ms:.0f}/{row.cmd_p99_ms:.0f} ms ({row.cmd_failed} failed),"
                f" RSS {row.rss_mib:.0f} MiB, manager CPU {row.manager_cpu_pct:.0f} %,"
                f" nodes CPU {row.nodes_cpu_pct:.0f} %,"
                f" GET /nodes {row.list_nodes_ms:.0f} ms -> {'held' if row.held else 'NOT held: ' + row.why_not}"
            )
            if not row.held:
                break
    return rows, idle_rss


def judge(row: StepResult, opts: Options) -> tuple[bool, str]:
    """Whether the step held, and if not, why (the climb stops there)."""
    problems = []
    if row.connected < row.nodes or row.online < row.nodes:
        problems.append(f"{row.connected} connected, {row.online} online of {row.nodes}")
    if row.dropped:
        problems.append(f"{row.dropped} dropped")
    if row.cmd_failed:
        problems.append(f"{row.cmd_failed} commands failed")
    if row.stats_per_s < MIN_STATS_SHARE * row.nodes / STATS_INTERVAL_S:
        problems.append(f"stats {row.stats_per_s:.0f}/s < {MIN_STATS_SHARE:.0%} of {row.nodes}/s")
    if row.behind_s > MAX_BEHIND_S:
        problems.append(f"manager {row.behind_s:.1f} s behind reading stats")
    if not row.cmd_p99_ms < opts.p99_ceiling_ms:
        problems.append(f"cmd p99 {row.cmd_p99_ms:.0f} ms >= {opts.p99_ceiling_ms:.0f} ms")
    return not problems, "; ".join(problems)


# ---------------------------------------------------------------------------- output

HEADER: Final = (
    "  nodes  online  dropped  stats/s  lag p99 ms  behind s  cmd p50 ms  cmd p99 ms  fail"
    "  RSS MiB  KiB/node  mgr CPU %  nodes CPU %  held"
)


def render(rows: list[StepResult], idle_rss: int, opts: Options) -> str:
    """The table and the verdict line; no ``|`` (see the module docstring)."""
    lines = [
        f"mp-manager capacity: 1 manager process (SQLite), simulated nodes in {opts.workers} worker"
        f" process(es) on the same {os.cpu_count()} CPUs; idle RSS {idle_rss / 2**20:.1f} MiB;"
        f" {opts.commands} get_config commands per step, {opts.command_concurrency} at a time",
        HEADER,
    ]
    for r in rows:
        lines.append(
            f"  {r.nodes:5d}  {r.online:6d}  {r.dropped:7d}  {r.stats_per_s:7.0f}  {r.lag_p99_ms:10.0f}"
            f"  {r.behind_s:8.1f}  {r.cmd_p50_ms:10.1f}  {r.cmd_p99_ms:10.1f}  {r.cmd_failed:4d}"
            f"  {r.rss_mib:7.1f}  {r.kib_per_node:8.1f}  {r.manager_cpu_pct:9.0f}  {r.nodes_cpu_pct:11.0f}"
            f"  {'yes' if r.held else 'NO'}"
        )
    for r in rows:
        if not r.held:
            lines.append(f"  step {r.nodes} not held: {r.why_not}")
    lines.append(verdict(rows))
    return "\n".join(lines)


def verdict(rows: list[StepResult]) -> str:
    """The issue's goal against the highest step held, with the figures either way."""
    held = [r for r in rows if r.held]
    best = held[-1] if held else None
    if best is None:
        figures = "no step held"
    else:
        figures = (
            f"held {best.nodes} nodes (all online), command p50 {best.cmd_p50_ms:.0f} ms, p99 {best.cmd_p99_ms:.0f} ms,"
            f" {best.kib_per_node:.1f} KiB RSS per node, manager CPU {best.manager_cpu_pct:.0f} %"
        )
    met = best is not None and best.nodes >= GOAL_NODES and best.cmd_p99_ms < GOAL_P99_MS
    goal = f"goal {GOAL_NODES} nodes with command p99 < {GOAL_P99_MS:.0f} ms"
    return f"verdict: {goal}: {'met' if met else 'NOT met'}: {figures}"


def run(opts: Options, workdir: Path) -> dict[str, Any]:
    """The whole benchmark (the capacity climb, then the fleet scenario); returns the tables'
    text and every figure (for ``--json``). ``failed`` is true when the fleet scenario broke
    after the climb ran (the climb's table is still worth printing)."""
    import trio

    raise_nofile()  # before the manager starts: it inherits the limit
    started = time.monotonic()
    rows: list[StepResult] = []
    idle_rss = 0
    texts: list[str] = []
    if opts.capacity:
        log(f"bench.manager: steps {opts.steps}, {opts.workers} workers, load average {os.getloadavg()}")
        with running_manager(workdir) as manager:
            log(f"manager pid {manager.process.pid} on {manager.url}")
            workers = Workers(
                opts.workers, f"wss://127.0.0.1:{manager.port}/ws/node", manager.cert_path, opts.connect_concurrency
            )
            try:
                rows, idle_rss = trio.run(run_steps, manager, workers, opts)
            finally:
                workers.stop()
            if manager.process.poll() is not None:
                raise RuntimeError(f"mp-manager exited with {manager.process.returncode} during the run")
        texts.append(render(rows, idle_rss, opts))
    fleet, failed = run_fleet_part(opts, workdir / "fleet")
    if fleet is not None:
        texts.append(fleet.pop("text"))
    return {
        "text": "\n".join(texts),
        "verdict": verdict(rows) if opts.capacity else "",
        "failed": failed,
        "seconds": round(time.monotonic() - started, 1),
        "load_average_end": os.getloadavg(),
        "idle_rss_mib": idle_rss / 2**20,
        "options": asdict(opts),
        "steps": [asdict(r) for r in rows],
        "fleet": fleet,
    }


def run_fleet_part(opts: Options, workdir: Path) -> tuple[dict[str, Any] | None, bool]:
    """The fleet scenario when asked for: (its figures with ``text``, or None; whether it broke).
    Without PostgreSQL it is skipped with a line saying so, unless ``--fleet`` asked for it
    alone; after the climb, a breakage is reported in the text (the traceback on stderr) so
    that the climb's table still prints."""
    if opts.fleet is None:
        return None, False
    from bench.manager_fleet import postgres_available, run_fleet

    if not postgres_available():
        if opts.fleet_required:
            raise RuntimeError("the fleet scenario needs PostgreSQL (initdb under /usr/lib/postgresql/<ver>/bin)")
        return {"text": "mp-manager fleet: skipped: PostgreSQL is not installed (tools/ensure-debs.sh)"}, False
    if not opts.capacity:
        return run_fleet(opts.fleet, workdir), False
    try:
        return run_fleet(opts.fleet, workdir), False
    except Exception as exc:  # the capacity table above must still print
        import traceback

        traceback.print_exc(file=sys.stderr)
        return {"text": f"mp-manager fleet: failed: {type(exc).__name__}: {str(exc)[:300]} (see stderr)"}, True


def options_from(args: argparse.Namespace) -> Options:
    """The steps and timings of a full or a ``--quick`` run, with the fleet scenario's."""
    opts = _capacity_options(args)
    opts.capacity = not args.fleet
    opts.fleet_required = args.fleet
    if not args.no_fleet:
        from bench.manager_fleet import FleetOptions

        fleet = FleetOptions.quick_options() if args.quick else FleetOptions()
        if args.fleet_nodes is not None:
            fleet.nodes_per_instance = args.fleet_nodes
        if args.fleet_commands is not None:
            fleet.commands = args.fleet_commands
        if args.fleet_workers is not None:
            fleet.workers = args.fleet_workers
        fleet.log_level = args.fleet_log_level
        opts.fleet = fleet
    return opts


def _capacity_options(args: argparse.Namespace) -> Options:
    """The climb's steps and timings."""
    if args.quick:
        steps = [min(20, args.nodes)]
        return Options(steps, 1, min(args.commands, 5), 2, 10, 1.0, 2.0, args.p99_ceiling, quick=True)
    steps = sorted(
        {s for s in args.steps if s <= args.nodes} | ({args.nodes} if args.nodes < max(args.steps) else set())
    )
    return Options(
        steps,
        args.workers,
        args.commands,
        args.command_concurrency,
        args.connect_concurrency,
        args.settle,
        args.measure,
        args.p99_ceiling,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.manager", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=GOAL_NODES, help="the largest step (caps --steps)")
    parser.add_argument("--steps", type=int, nargs="+", default=list(DEFAULT_STEPS), help="fleet sizes to measure")
    parser.add_argument("--workers", type=int, default=3, help="node worker processes")
    parser.add_argument("--commands", type=int, default=200, help="command round trips per step")
    parser.add_argument("--command-concurrency", type=int, default=10)
    parser.add_argument("--connect-concurrency", type=int, default=50, help="connects in flight per worker")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between the last connect and measuring")
    parser.add_argument("--measure", type=float, default=15.0, help="shortest measuring window per step, seconds")
    parser.add_argument("--p99-ceiling", type=float, default=5000.0, help="ms; a higher command p99 ends the climb")
    parser.add_argument(
        "--quick", action="store_true", help="20 nodes, 5 commands; fleet: 10 nodes per instance (the smoke tests)"
    )
    fleet = parser.add_mutually_exclusive_group()
    fleet.add_argument("--fleet", action="store_true", help="only the fleet scenario (2 instances on PostgreSQL)")
    fleet.add_argument("--no-fleet", action="store_true", help="skip the fleet scenario")
    parser.add_argument("--fleet-nodes", type=int, default=None, help="fleet: nodes per instance (100; quick 10)")
    parser.add_argument("--fleet-commands", type=int, default=None, help="fleet: round trips per row (200; quick 20)")
    parser.add_argument("--fleet-workers", type=int, default=None, help="fleet: node worker processes (2; quick 1)")
    parser.add_argument(
        "--fleet-log-level", default="warning", choices=("debug", "info", "warning", "error"), help="fleet instances"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--keep", type=Path, default=None, help="keep the manager's data dir and log here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = options_from(args)
    with tempfile.TemporaryDirectory(prefix="mp-bench-manager-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(opts, workdir)
    print(result["text"], flush=True)
    print(f"run took {result['seconds']:.0f} s; load average at the end {result['load_average_end']}")
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in result.items() if k != "text"}, indent=2, default=str))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
