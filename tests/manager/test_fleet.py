"""Two manager instances on one real PostgreSQL (services.manager.fleet), in this process.

Each instance is what ``mp-manager serve`` builds in a fleet: its own ``Store``, ``Fleet`` and
``NodeHub`` over the one database, its app served over TLS on loopback. ``tests.helpers.test_node``
connects a node to instance A; the tests drive instance B's hub as the routes do, and check what
the node receives and what the database holds. The full processes behind HAProxy are in
tests/e2e/test_manager_fleet.py.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
import trio

from appliance.http.app import serve
from services.manager.api.ws import register_hub
from services.manager.app import build_app
from services.manager.fleet import Fleet, listen_conninfo
from services.manager.hub import (
    CONNECTED_MESSAGE,
    DISCONNECTED_MESSAGE,
    INVALID_SECRET,
    LOCKED_OUT,
    CommandFailed,
    CommandTimedOut,
    NodeHub,
    NodeNotConnected,
)
from services.manager.retention import run_retention
from services.manager.service import ManagerService, RuntimeSettings
from services.manager.settings import TlsMode, resolve_settings
from services.manager.store import EventFilter, NodeStatus, Store
from services.manager.store.fleet import NOTIFY_CHANNEL
from services.manager.store.store import RETENTION_LOCK_KEY
from services.manager.tls import ensure_certificate
from tests.helpers.postgres import PostgresCluster, require_postgres, running_postgres
from tests.helpers.test_node import Reply, TestNode, connect_node
from tests.manager.test_hub import pending_node, secret_credentials, token_credentials

pytestmark = pytest.mark.e2e

ENV = {"MEDIAPLANE_JWT_SECRET": "ab" * 32, "MEDIAPLANE_MASTER_KEY": "cd" * 32}
CONFIG = {"version": 1, "flows": [{"id": "cam1", "name": "Camera 1"}]}
STATS = {"flows": [{"id": "cam1", "state": "Running", "health": "Healthy"}], "uptime_secs": 5}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    bin_dir = require_postgres()
    with running_postgres(bin_dir) as running:
        yield running


@dataclass
class Instance:
    """One manager instance of the fleet."""

    url: str
    ssl_context: ssl.SSLContext
    store: Store
    hub: NodeHub
    fleet: Fleet
    service: ManagerService
    database: str
    """The database's name in the cluster."""


@asynccontextmanager
async def instance(tmp_path: Path, database_url: str, **fleet_kwargs: Any) -> AsyncIterator[Instance]:
    settings = resolve_settings(ENV, data_dir=tmp_path, tls_mode=TlsMode.DIRECT)
    now = dt.datetime.now(dt.UTC)
    certificate = ensure_certificate(
        settings.tls_dir, hostname="localhost", addresses=[ipaddress.ip_address("127.0.0.1")], now=now
    )
    service = ManagerService(settings, version="test", started_at=now, certificate=certificate)
    async with await Store.open(database_url) as store:
        service.attach_store(store)

        async def reapply() -> None:
            live = await service.runtime_settings()
            hub.apply_settings(
                keepalive_interval_s=live.ws_keepalive_interval_secs,
                offline_threshold_s=live.node_offline_threshold_secs,
            )

        fleet = Fleet(store, settings_changed=reapply, conninfo=listen_conninfo(store), **fleet_kwargs)
        hub = NodeHub(store, service.secret_box, fleet=fleet, reports_interval_s=0.05)
        app = build_app(service)
        register_hub(app, hub)
        async with trio.open_nursery() as inner:
            await inner.start(fleet.run)
            binds = await inner.start(
                partial(
                    serve, app, "127.0.0.1", 0, certfile=str(certificate.cert_path), keyfile=str(certificate.key_path)
                )
            )
            port = int(binds[0].rsplit(":", 1)[1])
            context = ssl.create_default_context(cafile=str(certificate.cert_path))
            yield Instance(
                f"wss://127.0.0.1:{port}/ws/node",
                context,
                store,
                hub,
                fleet,
                service,
                sa.make_url(database_url).database or "",
            )
            inner.cancel_scope.cancel()


@asynccontextmanager
async def two_instances(
    cluster: PostgresCluster, tmp_path: Path, **fleet_kwargs: Any
) -> AsyncIterator[tuple[Instance, Instance]]:
    """Instances ``a`` and ``b`` of one fleet on a fresh database of ``cluster``."""
    url = cluster.create_database("fleet")
    async with instance(tmp_path / "a", url, **fleet_kwargs) as a, instance(tmp_path / "b", url, **fleet_kwargs) as b:
        yield a, b


@asynccontextmanager
async def node_held_by_a_seen_by_b(a: Instance, b: Instance) -> AsyncIterator[tuple[uuid.UUID, TestNode]]:
    """A node registered and connected on ``a``, held there and seen live on ``b``."""
    node_id, secret = await registered_node(a)
    async with connect_node(a.url, a.ssl_context, secret_credentials(node_id, secret)) as node:
        await node.wait_authenticated()
        await eventually(lambda: holds(a.store, node_id, a.fleet))
        await eventually(lambda: _true(b.hub.is_connected(node_id)))
        yield node_id, node


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 8.0) -> None:
    with trio.fail_after(timeout_s):
        while not await check():
            await trio.sleep(0.02)


async def holds(store: Store, node_id: uuid.UUID, fleet: Fleet) -> bool:
    return await store.fleet_holder(node_id) == fleet.instance_id


async def registered_node(a: Instance) -> tuple[uuid.UUID, str]:
    token = str(uuid.uuid4())
    node_id = await pending_node(a.store, token)
    async with connect_node(a.url, a.ssl_context, token_credentials(token)) as node:
        await node.wait_authenticated()
        assert node.registered is not None
        secret = node.registered.node_secret.get_secret_value()
    # The registration socket's close is stored (written behind): its "disconnected" event.
    await eventually(lambda: _has_message(a.store, node_id, DISCONNECTED_MESSAGE))
    assert await _status_is(a.store, node_id, NodeStatus.OFFLINE)
    return node_id, secret


async def _has_message(store: Store, node_id: uuid.UUID, message: str) -> bool:
    return message in await messages_of(store, node_id)


async def _status_is(store: Store, node_id: uuid.UUID, status: NodeStatus) -> bool:
    node = await store.get_node(node_id)
    return node is not None and node.status is status


async def messages_of(store: Store, node_id: uuid.UUID) -> list[str]:
    page = await store.query_events(EventFilter(node_id=node_id), per_page=200)
    return [e.message for e in reversed(page.rows)]


async def test_two_instances_route_commands_views_settings_and_disconnects(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    # The outbox is polled every 60 s here: only NOTIFY can carry a command in time.
    async with two_instances(cluster, tmp_path, poll_interval_s=60) as (a, b):
        node_id, secret = await registered_node(a)
        async with connect_node(a.url, a.ssl_context, secret_credentials(node_id, secret)) as node:
            node.config = dict(CONFIG)
            await node.wait_authenticated()
            await eventually(lambda: holds(a.store, node_id, a.fleet))
            await node.send_stats(STATS)

            # B sees A's node live (what its dashboard stream and routes read).
            async def b_sees_it() -> bool:
                return b.hub.is_connected(node_id) and b.hub.latest_stats(node_id) == STATS

            await eventually(b_sees_it)
            assert b.hub.live_status(node_id) is NodeStatus.ONLINE
            assert b.hub.live_versions(node_id) == ("0.3.0", 1)
            assert node_id in b.hub.connected_node_ids and node_id not in b.hub.local_node_ids

            # A command sent on B reaches the node on A; its answer comes back to B.
            started = time.perf_counter()
            result = await b.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})
            round_trip = time.perf_counter() - started
            assert result.success and "start_flow" in received(node)
            assert round_trip < 5, round_trip  # NOTIFY both ways (no poll within the minute)
            assert b.fleet.forwarded == 1

            # get_config's answer (the config, in the table) comes back whole.
            got = await b.hub.send_command(node_id, {"type": "get_config"})
            assert got.data == CONFIG

            # The node's refusal is B's CommandFailed (422), with the node's text.
            node.replies["stop_flow"] = Reply(success=False, error="Flow 'cam1' is not running")
            with pytest.raises(CommandFailed, match="is not running"):
                await b.hub.send_command(node_id, {"type": "stop_flow", "flow_id": "cam1"})

            # A payload far over NOTIFY's 8,000 bytes travels in the table.
            big = {"type": "create_flow", "flow": {"id": "big", "name": "x" * 30_000}}
            assert (await b.hub.send_command(node_id, big)).success
            assert "create_flow" in received(node)

            # Settings changed on B take effect on A's hub (interop.md 7.5: live).
            await b.service.update_settings({"ws_keepalive_interval_secs": 7})
            await b.hub.settings_changed(keepalive_interval_s=7, offline_threshold_s=30)

            async def a_applied() -> bool:
                return a.hub._keepalive_interval_s == 7

            await eventually(a_applied)

            # A disconnect asked on B closes the socket on A; the node goes offline once.
            assert await b.hub.disconnect(node_id)
            await node.wait_closed()
        await eventually(lambda: _status_is(a.store, node_id, NodeStatus.OFFLINE))
        assert await a.store.fleet_holder(node_id) is None
        with pytest.raises(NodeNotConnected):
            await b.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})


async def test_a_forward_without_an_answer_in_time_is_counted_as_a_timeout(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    # B waits 1 s for the holder's answer; the node on A never answers restart_flow.
    async with two_instances(cluster, tmp_path, reply_timeout_s=1.0) as (a, b):
        async with node_held_by_a_seen_by_b(a, b) as (node_id, node):
            node.replies["restart_flow"] = None
            with pytest.raises(CommandTimedOut):
                await b.hub.send_command(node_id, {"type": "restart_flow", "flow_id": "cam1"})
            assert (b.fleet.forwarded, b.fleet.forward_timeouts) == (0, 1)
            assert (await b.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})).success
            assert (b.fleet.forwarded, b.fleet.forward_timeouts) == (1, 1)


async def test_a_node_moving_to_another_instance_is_not_marked_offline_by_the_old_one(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with two_instances(cluster, tmp_path) as (a, b):
        node_id, secret = await registered_node(a)
        credentials = secret_credentials(node_id, secret)
        async with connect_node(a.url, a.ssl_context, credentials) as old:
            await old.wait_authenticated()
            await eventually(lambda: holds(a.store, node_id, a.fleet))
            # The node reconnects to B while A still has the old socket (a half-open path).
            async with connect_node(b.url, b.ssl_context, credentials) as new:
                await new.wait_authenticated()
                await eventually(lambda: holds(b.store, node_id, b.fleet))
                await old.ws.aclose()
                await old.wait_closed()

                # A's close bookkeeping leaves it online: B holds it now.
                async def a_let_go() -> bool:
                    return node_id not in a.hub.local_node_ids

                await eventually(a_let_go)
                # Status and events are written behind (services/manager/reports.py): B's
                # "online" first, then whatever A still has waiting, so an "offline" from A's
                # close would land last and show (CI read the registration's "offline" here
                # before either batch was written).
                await b.hub.reports.flush()
                await a.hub.reports.flush()
                assert await _status_is(a.store, node_id, NodeStatus.ONLINE)
                messages = await messages_of(a.store, node_id)
                assert messages[-2:] == [CONNECTED_MESSAGE, CONNECTED_MESSAGE], messages
                assert await holds(a.store, node_id, b.fleet)
                # Commands on A now go to B.
                assert (await a.hub.send_command(node_id, {"type": "restart_flow", "flow_id": "cam1"})).success
                assert "restart_flow" in received(new)


async def test_a_dead_instances_nodes_lapse_offline_exactly_once(cluster: PostgresCluster, tmp_path: Path) -> None:
    async with two_instances(cluster, tmp_path, lease_s=1.0, sweep_interval_s=0.2) as (a, b):
        node_id, _ = await registered_node(a)
        # A dead instance's row: a holder that never beats again (SIGKILL leaves exactly this).
        dead = uuid.uuid4()
        await a.store.update_node_runtime(node_id, status=NodeStatus.ONLINE)
        await a.store.fleet_claim(node_id, dead, lease=dt.timedelta(seconds=1))
        assert b.hub.is_connected(node_id) is False  # nobody published it live

        async def lapsed() -> bool:
            return await _status_is(a.store, node_id, NodeStatus.OFFLINE)

        await eventually(lapsed, 5)
        # Both instances sweep every 0.2 s: after two more sweeps each, a doubled event would show.
        swept = (a.fleet.sweeps, b.fleet.sweeps)

        async def both_swept_twice_more() -> bool:
            return a.fleet.sweeps >= swept[0] + 2 and b.fleet.sweeps >= swept[1] + 2

        await eventually(both_swept_twice_more)
        messages = await messages_of(a.store, node_id)
        assert messages.count(DISCONNECTED_MESSAGE) == 2  # the registration's close, then the lapse
        assert messages.count(CONNECTED_MESSAGE) == 1


async def test_messages_sent_while_the_listener_is_cut_off_still_arrive(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with two_instances(cluster, tmp_path) as (a, b):
        async with node_held_by_a_seen_by_b(a, b) as (node_id, node):
            # Cut every LISTEN connection (as a PostgreSQL restart or a proxy timeout would).
            with psycopg.connect(cluster.conninfo(a.database), autocommit=True) as admin:
                cut = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE %s",
                    (f"LISTEN {NOTIFY_CHANNEL}%",),
                ).fetchone()
            assert cut is not None and cut[0] >= 2
            # The command is in the table; A's poll (or its listener, reconnected) takes it.
            result = await b.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})
            assert result.success and "start_flow" in received(node)

            async def listening_again() -> bool:
                return a.fleet.listener_connected and b.fleet.listener_connected

            await eventually(listening_again, 15)


def received(node: TestNode) -> list[str]:
    """The action types the node received (a successful change is followed by a get_config)."""
    return [command.action.type for command in node.commands]


async def _true(value: bool) -> bool:
    return value


async def test_a_node_locked_out_on_one_instance_is_locked_out_on_the_other(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with two_instances(cluster, tmp_path) as (a, b):
        node_id, secret = await registered_node(a)
        for _ in range(5):  # interop.md 6: 5 failures within 60 s lock the node id
            async with connect_node(a.url, a.ssl_context, secret_credentials(node_id, "wrong")) as guess:
                await guess.wait_closed()
                assert guess.rejected == INVALID_SECRET
        # The real secret, on the other instance, within the window: refused all the same.
        async with connect_node(b.url, b.ssl_context, secret_credentials(node_id, secret)) as real:
            await real.wait_closed()
            assert real.rejected == LOCKED_OUT


async def test_retention_runs_on_one_instance_at_a_time(cluster: PostgresCluster) -> None:
    url = cluster.create_database("fleet")
    async with await Store.open(url) as first, await Store.open(url) as second:
        lock_key = RETENTION_LOCK_KEY
        # Another instance holds the job's advisory lock (its run is in progress).
        database = sa.make_url(url).database or ""
        with psycopg.connect(cluster.conninfo(database), autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (lock_key,))
            assert await first.retention_pass(dt.timedelta(days=30), dt.timedelta(days=1)) is None
            assert await second.retention_pass(dt.timedelta(days=30), dt.timedelta(days=1)) is None
            holder.execute("SELECT pg_advisory_unlock(%s)", (lock_key,))
        assert await first.retention_pass(dt.timedelta(days=30), dt.timedelta(days=1)) == (0, 0, 0)

        async def defaults() -> RuntimeSettings:
            return RuntimeSettings.from_stored({})

        assert await run_retention(second, defaults) is not None
