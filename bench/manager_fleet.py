"""Fleet scenario of the manager benchmark: two ``mp-manager`` instances on one PostgreSQL.

    python -m bench.manager --fleet [--fleet-nodes 100] [--fleet-commands 200] [--quick] [--keep DIR]

Issue 22 runs several ``mp-manager serve`` on one PostgreSQL database: each instance records the
node sockets it holds in ``node_connections``, a command for a node whose socket another instance
holds goes to the holder through the ``fleet_messages`` outbox and LISTEN/NOTIFY, and the ack
comes back the same way; the nodes of an instance that dies reconnect to a survivor. This
scenario measures what that costs and how fast it heals:

1. A throwaway PostgreSQL cluster (``tests/helpers/postgres.running_postgres``: initdb + pg_ctl,
   unix socket only, fsync off; the benches already import test helpers, see ``bench/rtsp.py``),
   a fresh database, ``mp-manager setup`` for the first admin, then instances A and B
   (``serve --database-url ... --tls-mode behind_proxy`` on 127.0.0.1, free ports, data dirs of
   their own, the same ``MEDIAPLANE_JWT_SECRET`` and ``MEDIAPLANE_MASTER_KEY``).
2. ``--fleet-nodes`` nodes per instance, created through A's API, simulated by the capacity
   bench's node workers (``bench.manager.NodeWorker``, ``add_fleet``): half connect to A's
   ``/ws/node`` first, half to B's (directly; no load balancer). Each node holds the list of
   both URLs and, once a connection is lost or an attempt fails, waits the real client's backoff
   (1, 2, 4 ... 60 s, +-10 %) and tries the next URL with its node id + secret.
3. Which instance holds which node is read from ``node_connections`` itself. Then ``get_config``
   round trips (``POST /api/v1/nodes/{id}/command``) through the instance holding the node
   (**same instance**) and as many through the other one (**cross instance**: outbox, NOTIFY,
   the holder, and the ack back), shuffled together so that both rows see the same load: 20 per
   row one at a time (what the route itself costs), then ``--fleet-commands`` per row 10 at a
   time (under load), each phase at most 60 s. CPU over the loaded phase: each instance,
   PostgreSQL's process tree and the node workers.
4. B is killed with SIGKILL (no clean stop: its ``node_connections`` rows stay until their lease
   lapses) and the survivor A is polled every 0.25 s: **all back online** is the time from the
   kill until every node B held has a ``node_connections`` row naming A *and* shows ``online``
   in A's ``GET /api/v1/nodes``, both in the same poll. Beside it, the nodes' own view: when the
   last of them authenticated again (worker clocks are CLOCK_MONOTONIC, the same as the bench's).

The table (no ``|`` in it: ``python -m bench`` prints it after its own) gives the machine's
core count and load average; progress goes to stderr. Every loop is bounded in count and time;
all traffic stays on 127.0.0.1 and a unix socket; PostgreSQL, the instances and the workers are
stopped on exit, an exception or Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.manager import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    BIN,
    COMMAND_PHASE_LIMIT_S,
    STEP_CONNECT_LIMIT_S,
    Workers,
    free_port,
    log,
    manager_env,
    percentile,
    raise_nofile,
    rss_bytes,
)
from bench.tools.procfs import cpu_seconds, tree_cpu_seconds

START_LIMIT_S: Final = 60.0  # mp-manager serve to /health 200 (migrations run at start)
POLL_INTERVAL_S: Final = 0.25  # the failover poll: a finer one would mostly measure the poll
SAMPLE_FAILURES_MAX: Final = 5  # failed commands quoted in the report, for a core that misbehaves

FLEET_HEADER: Final = "  route            at a time  commands  fail  p50 ms  p99 ms  max ms"
SAME_ROW: Final = "same instance"
CROSS_ROW: Final = "cross instance"
BACK_ONLINE: Final = "all back online on the survivor in"


def postgres_available() -> bool:
    """Whether Debian's PostgreSQL binaries (initdb, pg_ctl) are installed."""
    from tests.helpers.postgres import find_pg_bin

    return find_pg_bin() is not None


@dataclass
class FleetOptions:
    """The fleet scenario's sizes; ``quick`` for the smoke test."""

    nodes_per_instance: int = 100
    workers: int = 2
    commands: int = 200
    """Round trips per loaded row (same instance, cross instance)."""
    command_concurrency: int = 10
    sequential_commands: int = 20
    """Round trips per row one at a time, before the loaded rows: the route's own latency."""
    connect_concurrency: int = 25
    settle_s: float = 5.0
    failover_limit_s: float = 90.0
    log_level: str = "warning"
    quick: bool = False

    @classmethod
    def quick_options(cls) -> FleetOptions:
        """10 nodes per instance and 20 commands per row: ~30 s, the smoke test's mode."""
        return cls(
            nodes_per_instance=10,
            workers=1,
            commands=20,
            command_concurrency=4,
            sequential_commands=5,
            connect_concurrency=10,
            settle_s=2.0,
            failover_limit_s=30.0,
            quick=True,
        )


@dataclass
class Instance:
    """One running ``mp-manager serve`` of the fleet."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    instance_id: str = ""
    """Its id in ``node_connections``, learnt from the nodes that connected to it."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/node"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM (the manager stops within 5 s), then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass
class RouteResult:
    """One row of the table: command round trips through one kind of route."""

    route: str
    concurrency: int
    commands: int = 0
    failed: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    failures: list[str] = field(default_factory=list)
    """A few failed requests as ``instance POST path -> status body`` (the core's answer)."""


@dataclass
class FailoverResult:
    """The SIGKILL of one instance and its nodes' way back to the survivor."""

    victim: str = ""
    nodes: int = 0
    all_back_s: float | None = None
    """Kill -> every victim node held by the survivor and online in its GET /api/v1/nodes."""
    rows_back_s: float | None = None
    """Kill -> every victim node's node_connections row names the survivor."""
    online_back_s: float | None = None
    """Kill -> every victim node online in the survivor's GET /api/v1/nodes (may be early:
    the survivor may still show the dead instance's last view of its nodes)."""
    nodes_view_s: float | None = None
    """Kill -> the last victim node authenticated again (the nodes' own clocks)."""
    nodes_first_s: float | None = None
    """Kill -> the first victim node authenticated again."""
    nodes_p50_s: float | None = None
    """Kill -> half the victim nodes authenticated again."""
    failed_attempts: int = 0
    """The victim nodes' connection attempts after the kill that did not authenticate."""
    failure_reasons: list[str] = field(default_factory=list)
    not_back: int = 0
    not_held: int = 0
    not_online: int = 0
    polls: int = 0
    most_not_online: int = 0
    """The most victim nodes not ``online`` in one poll of the survivor's GET /api/v1/nodes: 0
    when its view never showed them away (it serves the dead instance's last view for a while)."""
    survivor_online_after: int = 0


@dataclass
class FleetResult:
    options: FleetOptions
    cpus: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    postgres: str = ""
    connected: int = 0
    connect_s: float = 0.0
    held_by: dict[str, int] = field(default_factory=dict)
    routes: list[RouteResult] = field(default_factory=list)
    """Same and cross instance one at a time, then same and cross under load."""
    failover: FailoverResult = field(default_factory=FailoverResult)
    rss_mib: dict[str, float] = field(default_factory=dict)
    cpu_pct: dict[str, float] = field(default_factory=dict)
    """CPU over the loaded command rows, 100 % = one core: each instance, PostgreSQL (all its
    processes) and the node workers; the bench's own process is the rest of the machine."""
    seconds: float = 0.0


# ---------------------------------------------------------------------------- processes


def setup_admin(database_url: str, data_dir: Path) -> None:
    """``mp-manager setup`` on the shared database (it also creates the schema)."""
    result = subprocess.run(
        [
            str(BIN / "mp-manager"),
            "setup",
            "--data-dir",
            str(data_dir),
            "--database-url",
            database_url,
            "--username",
            ADMIN_USER,
            "--password-stdin",
        ],
        input=ADMIN_PASSWORD + "\n",
        env=manager_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"mp-manager setup failed ({result.returncode}): {result.stdout}{result.stderr}")


def start_instance(name: str, database_url: str, workdir: Path, log_level: str) -> Instance:
    """``mp-manager serve`` in fleet mode (PostgreSQL URL), plain HTTP (behind_proxy) on a free
    port; does not wait (both instances start side by side, see :func:`wait_healthy`)."""
    data_dir = workdir / f"instance-{name}"
    port = free_port()
    log_path = workdir / f"instance-{name}.log"
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [
                str(BIN / "mp-manager"),
                "serve",
                "--data-dir",
                str(data_dir),
                "--database-url",
                database_url,
                "--listen-addr",
                "127.0.0.1",
                "--port",
                str(port),
                "--tls-mode",
                "behind_proxy",
                "--log-level",
                log_level,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=manager_env(),
            start_new_session=True,  # Ctrl-C in the terminal reaches the bench, which stops it
        )
    return Instance(name, process, port, log_path)


def wait_healthy(instances: list[Instance], limit_s: float = START_LIMIT_S) -> None:
    """Until each answers ``/health`` 200; RuntimeError with its log when one exits or is late."""
    import httpx

    deadline = time.monotonic() + limit_s
    waiting = list(instances)
    while waiting and time.monotonic() < deadline:
        for instance in list(waiting):
            if instance.process.poll() is not None:
                raise RuntimeError(
                    f"instance {instance.name} exited with {instance.process.returncode}: {instance.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{instance.url}/health", timeout=2).status_code == 200:
                    waiting.remove(instance)
        time.sleep(0.1)
    if waiting:
        raise RuntimeError(
            f"instance {waiting[0].name} did not answer /health in {limit_s:.0f} s: {waiting[0].log_tail()}"
        )


@contextlib.contextmanager
def running_fleet(workdir: Path, log_level: str) -> Iterator[tuple[Any, str, list[Instance]]]:
    """PostgreSQL, a fresh database, the first admin and instances A and B; all stopped on exit.
    Yields (the cluster, the database's SQLAlchemy URL, [A, B])."""
    from tests.helpers.postgres import running_postgres

    with running_postgres() as cluster:
        database_url = cluster.create_database("bench_fleet")
        log(f"fleet: PostgreSQL up ({cluster.bin_dir.parent.name}), database ready; mp-manager setup")
        setup_admin(database_url, workdir / "setup")
        instances: list[Instance] = []
        try:
            for name in ("A", "B"):
                instances.append(start_instance(name, database_url, workdir, log_level))
            wait_healthy(instances)
            yield cluster, database_url, instances
        finally:
            for instance in instances:
                instance.stop()


# ---------------------------------------------------------------------------- the database's view


def connections(conninfo: str) -> dict[str, tuple[str, bool]]:
    """``node_connections``: node id -> (instance id, lease still live)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute("SELECT node_id, instance_id, expires_at > now() FROM node_connections").fetchall()
    return {str(node): (str(instance), bool(live)) for node, instance, live in rows}


# ---------------------------------------------------------------------------- the measurements


async def login(client: Any) -> None:
    """A session cookie and the CSRF header, as the capacity bench does."""
    response = await client.post("/api/v1/auth/login", json={"username": ADMIN_USER, "password": ADMIN_PASSWORD})
    response.raise_for_status()
    client.headers["X-CSRF-Token"] = response.json()["csrf_token"]


async def create_tokens(client: Any, count: int) -> list[str]:
    """``count`` nodes through one instance's API; their registration tokens."""
    from bench.manager import create_nodes

    return await create_nodes(client, count, 0)


async def command_rows(
    clients: dict[str, Any], holders: dict[str, str], count: int, concurrency: int
) -> tuple[RouteResult, RouteResult]:
    """``count`` same-instance and as many cross-instance round trips, shuffled together and
    ``concurrency`` at a time, so both rows see the same load; ``holders`` maps node id -> the
    name of the instance holding its socket. The (same, cross) rows."""
    import trio

    same, cross = RouteResult(SAME_ROW, concurrency), RouteResult(CROSS_ROW, concurrency)
    rng = random.Random(count * 1000 + concurrency)
    node_ids = sorted(holders)
    others = {"A": "B", "B": "A"}
    jobs: list[tuple[RouteResult, str, str]] = []
    for _ in range(count):
        node = rng.choice(node_ids)
        jobs.append((same, holders[node], node))
        node = rng.choice(node_ids)
        jobs.append((cross, others[holders[node]], node))
    rng.shuffle(jobs)
    latencies: dict[str, list[float]] = {SAME_ROW: [], CROSS_ROW: []}
    limiter = trio.CapacityLimiter(concurrency)

    async def one(row: RouteResult, via: str, node: str) -> None:
        async with limiter:
            path = f"/api/v1/nodes/{node}/command"
            started = time.perf_counter()
            try:
                response = await clients[via].post(path, json={"action": {"type": "get_config"}})
                ok, answer = response.status_code == 200, f"{response.status_code} {response.text[:300]}"
            except Exception as exc:  # a timeout or a reset is a failed round trip, not a crashed bench
                ok, answer = False, f"{type(exc).__name__}: {exc}"
            latencies[row.route].append((time.perf_counter() - started) * 1000)
            if not ok:
                row.failed += 1
                if len(row.failures) < SAMPLE_FAILURES_MAX:
                    row.failures.append(f"{via} POST {path} -> {answer}")

    # Bounded in time like the capacity bench: a round trip cut off counts as failed.
    async with trio.open_nursery() as nursery:
        nursery.cancel_scope.deadline = trio.current_time() + COMMAND_PHASE_LIMIT_S
        for job in jobs:
            nursery.start_soon(one, *job)
    for row in (same, cross):
        values = latencies[row.route]
        row.commands = len(values)
        row.failed += count - len(values)
        row.p50_ms, row.p99_ms = percentile(values, 0.5), percentile(values, 0.99)
        row.max_ms = max(values, default=float("nan"))
    return same, cross


def postmaster_pid(cluster: Any) -> int:
    """The PostgreSQL server's pid (first line of ``postmaster.pid``); its backends are its children."""
    return int((cluster.data_dir / "postmaster.pid").read_text().split()[0])


async def failover(
    conninfo: str,
    survivor: Instance,
    victim: Instance,
    client: Any,
    victim_nodes: set[str],
    workers: Workers,
    opts: FleetOptions,
) -> FailoverResult:
    """SIGKILL ``victim``, then poll the survivor until every node it held is back there."""
    import trio

    result = FailoverResult(victim=victim.name, nodes=len(victim_nodes))
    reports = await workers.ask_all([("fleet_report",)] * len(workers.pipes), 30)
    before = {node["node_id"]: node["failed_total"] for worker in reports for node in worker}
    killed_at = time.monotonic()
    os.kill(victim.process.pid, signal.SIGKILL)
    log(f"fleet: instance {victim.name} (pid {victim.process.pid}) SIGKILLed holding {len(victim_nodes)} nodes")
    deadline = killed_at + opts.failover_limit_s
    not_held: set[str] = set(victim_nodes)
    not_online: set[str] = set(victim_nodes)
    while time.monotonic() < deadline:
        rows = await trio.to_thread.run_sync(connections, conninfo)
        response = await client.get("/api/v1/nodes")
        now = time.monotonic() - killed_at
        not_held = {n for n in victim_nodes if rows.get(n, ("", False)) != (survivor.instance_id, True)}
        if response.status_code == 200:
            online = {str(node["id"]) for node in response.json() if node.get("status") == "online"}
            not_online = victim_nodes - online
        else:
            not_online = set(victim_nodes)
        result.polls += 1
        result.most_not_online = max(result.most_not_online, len(not_online))
        if not not_held and result.rows_back_s is None:
            result.rows_back_s = now
        if not not_online and result.online_back_s is None:
            result.online_back_s = now
        if not not_held and not not_online:
            result.all_back_s = now
            break
        await trio.sleep(POLL_INTERVAL_S)
    result.not_held, result.not_online = len(not_held), len(not_online)
    reports = await workers.ask_all([("fleet_report",)] * len(workers.pipes), 30)
    nodes = [node for worker in reports for node in worker if node["node_id"] in victim_nodes]
    back = [
        node["back_at"] - killed_at
        for node in nodes
        if node["online"] and node["back_at"] is not None and node["back_at"] > killed_at
    ]
    result.not_back = len(victim_nodes) - len(back)
    result.nodes_view_s = max(back) if back and not result.not_back else None
    if back:
        result.nodes_first_s, result.nodes_p50_s = min(back), percentile(back, 0.5)
    result.failed_attempts = sum(node["failed_total"] - before.get(node["node_id"], 0) for node in nodes)
    result.failure_reasons = sorted({node["last_failure"] for node in nodes if node["last_failure"]})
    response = await client.get("/api/v1/nodes")
    if response.status_code == 200:
        result.survivor_online_after = sum(1 for node in response.json() if node.get("status") == "online")
    return result


async def measure(cluster: Any, database_url: str, instances: list[Instance], opts: FleetOptions) -> FleetResult:
    """Nodes on both instances, the two command rows, then the failover."""
    import httpx
    import trio
    from sqlalchemy.engine import make_url

    a, b = instances
    result = FleetResult(options=opts, cpus=os.cpu_count() or 0, load_before=os.getloadavg())
    conninfo = cluster.conninfo(make_url(database_url).database)
    workers = Workers(opts.workers, "", None, opts.connect_concurrency)
    try:
        async with (
            httpx.AsyncClient(base_url=a.url, timeout=30) as client_a,
            httpx.AsyncClient(base_url=b.url, timeout=30) as client_b,
        ):
            clients = {"A": client_a, "B": client_b}
            for client in clients.values():
                await login(client)
            total = 2 * opts.nodes_per_instance
            started = time.monotonic()
            tokens = await create_tokens(client_a, total)
            log(f"fleet: {total} nodes created through A in {time.monotonic() - started:.1f} s; connecting")
            # Even tokens start on A, odd ones on B; each worker gets some of both.
            plans = [
                (token, [a.ws_url, b.ws_url] if i % 2 == 0 else [b.ws_url, a.ws_url]) for i, token in enumerate(tokens)
            ]
            shares = [plans[i :: opts.workers] for i in range(opts.workers)]
            replies = await workers.ask_all([("add_fleet", share) for share in shares], STEP_CONNECT_LIMIT_S + 30)
            result.connected = sum(r["connected"] for r in replies)
            result.connect_s = max(r["seconds"] for r in replies)
            log(
                f"fleet: {result.connected} of {total} connected in {result.connect_s:.1f} s;"
                f" settling {opts.settle_s:.0f} s"
            )
            if result.connected < total:
                failures = {k: v for r in replies for k, v in r["failures"].items()}
                raise RuntimeError(f"only {result.connected} of {total} nodes connected: {failures}")
            await trio.sleep(opts.settle_s)

            # Which instance holds which node: the nodes say which URL they are on, the table
            # says which instance id holds them; together they name each instance's id.
            reports = await workers.ask_all([("fleet_report",)] * opts.workers, 30)
            on_url = {node["node_id"]: node["url"] for worker in reports for node in worker if node["online"]}
            rows = await trio.to_thread.run_sync(connections, conninfo)
            for instance in instances:
                ids = {rows[n][0] for n, url in on_url.items() if url == instance.ws_url and n in rows}
                if len(ids) != 1:
                    raise RuntimeError(f"node_connections: nodes on {instance.name} held by {ids or 'nobody'}")
                instance.instance_id = ids.pop()
            by_id = {instance.instance_id: instance.name for instance in instances}
            holders = {n: by_id[row[0]] for n, row in rows.items() if row[1] and row[0] in by_id}
            result.held_by = {name: sum(1 for h in holders.values() if h == name) for name in ("A", "B")}
            log(f"fleet: node_connections: {result.held_by} of {len(on_url)} online nodes")
            if len(holders) < total:
                raise RuntimeError(f"node_connections holds {len(holders)} of {total} nodes live: {rows}")

            result.routes += await command_rows(clients, holders, opts.sequential_commands, 1)
            postgres_pid = postmaster_pid(cluster)

            def cpu_now() -> dict[str, float]:
                return {i.name: cpu_seconds(i.process.pid) for i in instances} | {
                    "PostgreSQL": tree_cpu_seconds(postgres_pid),
                    "nodes": workers.cpu_seconds(),
                }

            cpu0, t0 = cpu_now(), time.monotonic()
            result.routes += await command_rows(clients, holders, opts.commands, opts.command_concurrency)
            cpu1, elapsed = cpu_now(), time.monotonic() - t0
            result.cpu_pct = {name: (cpu1[name] - cpu0[name]) / elapsed * 100 for name in cpu0}
            result.rss_mib = {i.name: rss_bytes(i.process.pid) / 2**20 for i in instances}
            for row in result.routes:
                log(
                    f"fleet: {row.route}, {row.concurrency} at a time: {row.commands} commands, {row.failed} failed,"
                    f" p50 {row.p50_ms:.1f} ms, p99 {row.p99_ms:.1f} ms"
                    + (f"; e.g. {row.failures[0]}" if row.failures else "")
                )

            victim_nodes = {n for n, h in holders.items() if h == b.name}
            result.failover = await failover(conninfo, a, b, client_a, victim_nodes, workers, opts)
            f = result.failover
            log(
                f"fleet: failover: all back {f.all_back_s} s (rows {f.rows_back_s} s, GET online {f.online_back_s} s,"
                f" nodes' view {f.nodes_view_s} s); not held {f.not_held}, not online {f.not_online},"
                f" not back {f.not_back}"
            )
    finally:
        workers.stop()
    result.load_after = os.getloadavg()
    return result


# ---------------------------------------------------------------------------- output


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def render(result: FleetResult) -> str:
    """The fleet table: the route rows and the failover line; no ``|`` (see the module docstring)."""
    opts = result.options
    load = " ".join(f"{x:.2f}" for x in result.load_before)
    load_after = " ".join(f"{x:.2f}" for x in result.load_after)
    lines = [
        f"mp-manager fleet: 2 instances on one PostgreSQL {result.postgres} (behind_proxy, 127.0.0.1),"
        f" {opts.nodes_per_instance} simulated nodes connected to each ({opts.workers} worker process(es));"
        f" get_config round trips, same and cross instance shuffled together;"
        f" {result.cpus} CPUs, load average {load} (1/5/15 min) at the start, {load_after} at the end",
        FLEET_HEADER,
    ]
    for row in result.routes:
        lines.append(
            f"  {row.route:<15}  {row.concurrency:9d}  {row.commands:8d}  {row.failed:4d}  {row.p50_ms:6.1f}"
            f"  {row.p99_ms:6.1f}  {row.max_ms:6.1f}"
        )
    cpu = ", ".join(f"{name} {pct:.0f} %" for name, pct in result.cpu_pct.items())
    rss = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in result.rss_mib.items())
    lines.append(f"  CPU during the loaded rows (100 % = one core): {cpu}; instances' RSS {rss}")
    f = result.failover
    if f.all_back_s is not None:
        lines.append(
            f"failover: instance {f.victim} SIGKILLed holding {f.nodes} nodes: {BACK_ONLINE} {f.all_back_s:.1f} s"
            f" (its node_connections rows and GET /api/v1/nodes; rows alone {_seconds(f.rows_back_s)});"
            f" the nodes' own view: authenticated again on the survivor first {_seconds(f.nodes_first_s)},"
            f" half {_seconds(f.nodes_p50_s)}, last {_seconds(f.nodes_view_s)} after the kill"
            f" (client backoff 1 s +-10 %, then the other URL), {f.failed_attempts} attempts failed"
            + (f" ({'; '.join(f.failure_reasons)[:200]})" if f.failure_reasons else "")
            + f"; survivor lists {f.survivor_online_after} online, and listed at most {f.most_not_online}"
            f" of the {f.nodes} not online in {f.polls} polls"
        )
    else:
        lines.append(
            f"failover: instance {f.victim} SIGKILLed holding {f.nodes} nodes: NOT all back online within"
            f" {opts.failover_limit_s:.0f} s: {f.not_held} not held by the survivor in node_connections,"
            f" {f.not_online} not online in its GET /api/v1/nodes, {f.not_back} not authenticated again"
        )
    for row in result.routes:
        for failure in row.failures:
            lines.append(f"  {row.route} ({row.concurrency} at a time) failed: {failure}")
    return "\n".join(lines)


def run_fleet(opts: FleetOptions, workdir: Path) -> dict[str, Any]:
    """The whole scenario; the table text and every figure (for ``--json``)."""
    import trio

    raise_nofile()  # before the instances start: they inherit the limit
    started = time.monotonic()
    log(f"bench.manager fleet: {opts.nodes_per_instance} nodes per instance, load average {os.getloadavg()}")
    workdir.mkdir(parents=True, exist_ok=True)
    with running_fleet(workdir, opts.log_level) as (cluster, database_url, instances):
        log("fleet: " + ", ".join(f"{i.name} pid {i.process.pid} on {i.url}" for i in instances))
        result = trio.run(measure, cluster, database_url, instances, opts)
        result.postgres = cluster.bin_dir.parent.name
        if instances[0].process.poll() is not None:
            raise RuntimeError(
                f"the survivor A exited with {instances[0].process.returncode}: {instances[0].log_tail()}"
            )
    result.seconds = round(time.monotonic() - started, 1)
    return {"text": render(result), **asdict(result)}
