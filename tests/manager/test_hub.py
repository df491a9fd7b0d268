"""The node hub over real WSS on loopback, with a real store (interop.md 6, 7.2).

Each test serves ``build_app(service)`` + ``register_hub`` with hypercorn on 127.0.0.1 port 0
over TLS (a certificate generated for 127.0.0.1), and drives ``tests.helpers.test_node``
against it. Time parameters are shortened through the hub's constructor; every wait is bounded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from pydantic import SecretStr

from appliance.http.app import serve
from appliance.protocol import NODE_FRAME_MAX_BYTES, EventPayload, NodeCredentials
from services.manager.api.ws import register_hub
from services.manager.app import build_app
from services.manager.hub import (
    CONNECTED_MESSAGE,
    DISCONNECTED_MESSAGE,
    CommandFailed,
    CommandTimedOut,
    CommandTooLarge,
    InvalidCommand,
    NodeHub,
    NodeNotConnected,
)
from services.manager.service import ManagerService
from services.manager.settings import TlsMode, resolve_settings
from services.manager.store import EventFilter, EventRecord, NewNode, NodeStatus, Store, sqlite_url
from services.manager.tls import ensure_certificate
from tests.helpers.test_node import Reply, TestNode, connect_node

pytestmark = pytest.mark.e2e

ENV = {"MEDIAPLANE_JWT_SECRET": "ab" * 32, "MEDIAPLANE_MASTER_KEY": "cd" * 32}
CONFIG = {"version": 1, "flows": [{"id": "cam1", "name": "Camera 1"}]}


@dataclass
class Env:
    url: str
    ssl_context: ssl.SSLContext
    store: Store
    hub: NodeHub


@asynccontextmanager
async def running_hub(tmp_path: Path, **hub_kwargs: Any) -> AsyncIterator[Env]:
    """The manager app with the hub, served over TLS on loopback, and its store."""
    settings = resolve_settings(ENV, data_dir=tmp_path, tls_mode=TlsMode.DIRECT)
    now = dt.datetime.now(dt.UTC)
    certificate = ensure_certificate(
        settings.tls_dir, hostname="localhost", addresses=[ipaddress.ip_address("127.0.0.1")], now=now
    )
    service = ManagerService(settings, version="test", started_at=now, certificate=certificate)
    async with await Store.open(sqlite_url(tmp_path)) as store:
        hub = NodeHub(store, service.secret_box, **hub_kwargs)
        app = build_app(service)
        register_hub(app, hub)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(
                    serve,
                    app,
                    "127.0.0.1",
                    0,
                    certfile=str(certificate.cert_path),
                    keyfile=str(certificate.key_path),
                )
            )
            port = int(binds[0].rsplit(":", 1)[1])
            context = ssl.create_default_context(cafile=str(certificate.cert_path))
            yield Env(f"wss://127.0.0.1:{port}/ws/node", context, store, hub)
            nursery.cancel_scope.cancel()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Re-check ``check`` until it holds; fail the test after ``timeout_s``."""
    with trio.fail_after(timeout_s):
        while not await check():
            await trio.sleep(0.02)


async def pending_node(store: Store, token: str, **kwargs: Any) -> uuid.UUID:
    digest = hashlib.sha256(token.encode()).hexdigest()
    return (await store.create_node(NewNode(name="n1", registration_token_digest=digest, **kwargs))).id


def token_credentials(token: str) -> NodeCredentials:
    return NodeCredentials(registration_token=SecretStr(token))


def secret_credentials(node_id: uuid.UUID | str, secret: str) -> NodeCredentials:
    return NodeCredentials(node_id=str(node_id), node_secret=SecretStr(secret))


async def events_of(store: Store, node_id: uuid.UUID) -> list[EventRecord]:
    return list(reversed((await store.query_events(EventFilter(node_id=node_id), per_page=200)).rows))


async def disconnect_recorded(store: Store, node_id: uuid.UUID, count: int = 1) -> None:
    """Until ``count`` disconnect events are stored (the status is written just before them)."""

    async def recorded() -> bool:
        return sum(e.message == DISCONNECTED_MESSAGE for e in await events_of(store, node_id)) >= count

    await eventually(recorded)


async def status_of(store: Store, node_id: uuid.UUID) -> NodeStatus | None:
    node = await store.get_node(node_id)
    return node.status if node is not None else None


async def registered(env: Env, token: str | None = None) -> tuple[uuid.UUID, str]:
    """Register a fresh node and disconnect it; its id and secret."""
    token = token or str(uuid.uuid4())
    node_id = await pending_node(env.store, token)
    async with connect_node(env.url, env.ssl_context, token_credentials(token)) as node:
        await node.wait_authenticated()
        assert node.registered is not None
        secret = node.registered.node_secret.get_secret_value()
    await disconnect_recorded(env.store, node_id)
    return node_id, secret


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


@asynccontextmanager
async def online_node(env: Env, **node_kwargs: Any) -> AsyncIterator[tuple[uuid.UUID, TestNode]]:
    """A registered node, logged in with its id and secret, whose config is cached."""
    node_id, secret = await registered(env)
    async with connect_node(env.url, env.ssl_context, secret_credentials(node_id, secret), **node_kwargs) as node:
        node.config = dict(CONFIG)
        await node.wait_authenticated()
        await eventually(lambda: _is(cached_config(env.store, node_id), CONFIG))
        yield node_id, node


async def cached_config(store: Store, node_id: uuid.UUID) -> object:
    cached = await store.get_cached_config(node_id)
    return json.loads(cached.config_json) if cached is not None else None


# --------------------------------------------------------------------------- authentication


async def test_registration_is_single_use_and_brings_the_node_online(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env:
        token = str(uuid.uuid4())
        node_id = await pending_node(env.store, token)
        async with connect_node(env.url, env.ssl_context, token_credentials(token)) as node:
            node.config = dict(CONFIG)
            await node.wait_authenticated()
            assert node.registered is not None and node.registered.node_id == str(node_id)
            uuid.UUID(node.registered.node_secret.get_secret_value())  # a UUIDv4
            await eventually(lambda: _is(cached_config(env.store, node_id), CONFIG))

            async def runtime_written() -> bool:  # by the hub's report writer, within its interval
                record = await env.store.get_node(node_id)
                assert record is not None
                return (record.status, record.software_version, record.protocol_version) == (
                    NodeStatus.ONLINE,
                    "0.3.0",
                    1,
                )

            await eventually(runtime_written)
            assert env.hub.is_connected(node_id)

            async with connect_node(env.url, env.ssl_context, token_credentials(token)) as second:
                await second.wait_closed()
                assert second.rejected == "Invalid registration token"
                assert second.close_code == 1008
                assert second.registered is None
        await disconnect_recorded(env.store, node_id)
        assert await status_of(env.store, node_id) == NodeStatus.OFFLINE
        rows = [(e.severity.value, e.category, e.message) for e in await events_of(env.store, node_id)]
        assert rows == [("info", "connection", CONNECTED_MESSAGE), ("critical", "connection", DISCONNECTED_MESSAGE)]
        assert not env.hub.is_connected(node_id)


async def test_expired_node_cannot_register(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env:
        token = str(uuid.uuid4())
        past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        await pending_node(env.store, token, expires_at=past)
        async with connect_node(env.url, env.ssl_context, token_credentials(token)) as node:
            await node.wait_closed()
            assert node.rejected == "Invalid registration token"


async def test_login_with_node_id_and_secret(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env:
        node_id, secret = await registered(env)
        async with connect_node(env.url, env.ssl_context, secret_credentials(node_id, secret)) as node:
            await node.wait_authenticated()
            assert node.registered is None  # auth_ok, not register_ack
            await eventually(lambda: _is(status_of(env.store, node_id), NodeStatus.ONLINE))


async def test_wrong_secret_gets_auth_error_and_a_close(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with running_hub(tmp_path) as env:
        node_id, secret = await registered(env)
        wrong = "wrong-" + secret
        async with connect_node(env.url, env.ssl_context, secret_credentials(node_id, wrong)) as node:
            await node.wait_closed()
            assert node.rejected == "Invalid node secret"
            assert node.close_code == 1008
        assert await status_of(env.store, node_id) == NodeStatus.OFFLINE
        assert secret not in caplog.text and wrong not in caplog.text


async def test_lockout_after_five_failures_refuses_even_the_right_secret(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env:
        node_id, secret = await registered(env)
        for _ in range(5):
            async with connect_node(env.url, env.ssl_context, secret_credentials(node_id, "nope")) as node:
                await node.wait_closed()
                assert node.rejected == "Invalid node secret"
        async with connect_node(env.url, env.ssl_context, secret_credentials(node_id, secret)) as node:
            await node.wait_closed()
            assert node.rejected is not None and node.rejected.startswith("Too many failed")


async def test_no_auth_within_the_timeout_is_closed(tmp_path: Path) -> None:
    async with running_hub(tmp_path, auth_timeout_s=0.3) as env:
        async with connect_node(env.url, env.ssl_context, token_credentials("t"), send_auth=False) as node:
            await node.wait_closed()
            assert node.close_code == 1008


async def test_protocol_version_mismatch_is_a_compatibility_warning(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env:
        node_id, secret = await registered(env)
        credentials = secret_credentials(node_id, secret)
        async with connect_node(env.url, env.ssl_context, credentials, protocol_version=2) as node:
            await node.wait_authenticated()

            async def warned() -> bool:
                return any(e.category == "compatibility" for e in await events_of(env.store, node_id))

            await eventually(warned)
            (event,) = [e for e in await events_of(env.store, node_id) if e.category == "compatibility"]
            assert event.severity.value == "warning"


# --------------------------------------------------------------------------- what the node reports


async def test_stats_set_the_status_by_flow_health(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        for healths, expected in [
            (["Healthy", "Warning"], NodeStatus.DEGRADED),
            (["Error"], NodeStatus.DEGRADED),
            (["Warning", "Critical"], NodeStatus.ERROR),
            (["Healthy"], NodeStatus.ONLINE),
        ]:
            stats: dict[str, object] = {"flows": [{"flow_id": f"f{i}", "health": h} for i, h in enumerate(healths)]}
            await node.send_stats(stats)
            await eventually(lambda: _is(status_of(env.store, node_id), expected))  # noqa: B023
            assert env.hub.latest_stats(node_id) == stats
            assert env.hub.live_status(node_id) is expected


async def test_health_is_stored_as_last_health(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        health: dict[str, object] = {"status": "ok", "version": "0.3.0", "uptime_secs": 5}
        await node.send_health(health)

        async def stored() -> bool:
            record = await env.store.get_node(node_id)
            return record is not None and record.last_health == health

        await eventually(stored)


async def test_node_events_are_stored_bounded(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        await node.send_event(EventPayload(severity="bogus", category="c" * 300, message="m" * 12_000, flow_id="cam1"))

        async def stored() -> bool:
            return len(await events_of(env.store, node_id)) == 4  # 2 from registering, 1 connect, this

        await eventually(stored)
        event = (await events_of(env.store, node_id))[-1]
        assert (event.severity.value, len(event.category), len(event.message)) == ("info", 256, 10_000)
        assert event.flow_id == "cam1"


async def test_oversized_frame_is_dropped_and_the_connection_kept(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        filler = "x" * NODE_FRAME_MAX_BYTES
        await node.send_raw(
            json.dumps({"type": "stats", "timestamp": "2026-11-21T15:04:05.123Z", "payload": {"f": filler}})
        )
        result = await env.hub.send_command(node_id, {"type": "get_config"})  # the same socket answers
        assert result.data == CONFIG
        assert env.hub.frames_dropped == 1
        assert not node.closed.is_set()


async def test_pings_are_sent_at_the_keepalive_interval(tmp_path: Path) -> None:
    async with running_hub(tmp_path, keepalive_interval_s=0.1) as env, online_node(env) as (node_id, node):
        with trio.fail_after(5):
            while node.pings < 3:
                await node.changed.wait()
        assert env.hub.is_connected(node_id)


async def test_a_silent_node_goes_offline_after_the_threshold(tmp_path: Path) -> None:
    async with (
        running_hub(tmp_path, keepalive_interval_s=0.1, offline_threshold_s=0.6) as env,
        online_node(env) as (node_id, node),
    ):
        node.silent = True
        await node.wait_closed()
        assert node.close_code == 1001
        await disconnect_recorded(env.store, node_id, count=2)  # the registration's, then this one
        assert await status_of(env.store, node_id) == NodeStatus.OFFLINE


async def test_disconnect_closes_the_socket(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        assert await env.hub.disconnect(node_id)
        await node.wait_closed()
        assert await env.hub.wait_disconnected(node_id, 5)
        assert await status_of(env.store, node_id) == NodeStatus.OFFLINE
        assert not await env.hub.disconnect(node_id)


# --------------------------------------------------------------------------- commands


async def test_command_round_trip_success_and_failure(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        result = await env.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})
        assert result.success and result.data is None
        received = node.commands[-1]
        assert received.command_id == result.command_id and received.action.type == "start_flow"

        node.replies["stop_flow"] = Reply(success=False, error="Flow 'cam1' is not running")
        with pytest.raises(CommandFailed) as failed:
            await env.hub.send_command(node_id, {"type": "stop_flow", "flow_id": "cam1"})
        assert failed.value.message == "Flow 'cam1' is not running"


async def test_get_config_command_returns_the_config(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, _node):
        result = await env.hub.send_command(node_id, {"type": "get_config"})
        assert result.data == CONFIG


async def test_unanswered_command_times_out(tmp_path: Path) -> None:
    async with running_hub(tmp_path, command_timeout_s=0.3) as env, online_node(env) as (node_id, node):
        node.replies["restart_flow"] = None
        with trio.fail_after(5), pytest.raises(CommandTimedOut):
            await env.hub.send_command(node_id, {"type": "restart_flow", "flow_id": "cam1"})
        assert env.hub.is_connected(node_id)  # a timeout does not drop the node


async def test_command_to_a_node_not_connected(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env:
        with pytest.raises(NodeNotConnected):
            await env.hub.send_command(uuid.uuid4(), {"type": "get_config"})
        node_id, _ = await registered(env)
        with pytest.raises(NodeNotConnected):
            await env.hub.send_command(node_id, {"type": "get_config"})


async def test_command_abandoned_when_the_node_goes(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        node.replies["start_flow"] = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.ws.aclose)
            with trio.fail_after(5), pytest.raises(NodeNotConnected):
                await env.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})


async def test_invalid_and_oversized_actions_are_refused_before_sending(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        before = len(node.commands)
        for action in ({"flow_id": "x"}, {"type": "reboot"}, {"type": "list_tunnels"}, {"type": "start_flow"}):
            with pytest.raises(InvalidCommand):
                await env.hub.send_command(node_id, action)
        with pytest.raises(CommandTooLarge):
            await env.hub.send_command(node_id, {"type": "update_config", "config": {"x": "y" * 60_000}})
        assert len(node.commands) == before


async def test_the_cache_is_dropped_before_the_mutating_command_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI once: POST .../command answered 200, the GET .../config right after it still served the
    # old config (the caller was woken before the drop had reached the store). The real store,
    # its write held back 0.3 s, as a loaded host's thread pool does.
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        node.replies["get_config"] = None
        write = env.store.cache_node_config

        async def slow_write(node: uuid.UUID, config_json: str | None) -> None:
            await trio.sleep(0.3)
            await write(node, config_json)

        monkeypatch.setattr(env.store, "cache_node_config", slow_write)
        await env.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})
        assert await cached_config(env.store, node_id) is None


async def test_mutating_command_drops_the_cache_and_refetches(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as env, online_node(env) as (node_id, node):
        node.replies["get_config"] = None  # hold the answer: the dropped cache is observable
        await env.hub.send_command(node_id, {"type": "start_flow", "flow_id": "cam1"})
        await eventually(lambda: _is(cached_config(env.store, node_id), None))
        commands = await node.wait_commands(3)  # get_config on connect, start_flow, get_config
        assert [c.action.type for c in commands[-2:]] == ["start_flow", "get_config"]

        del node.replies["get_config"]
        node.config = {"version": 1, "flows": []}
        await env.hub.send_command(node_id, {"type": "stop_flow", "flow_id": "cam1"})
        await eventually(lambda: _is(cached_config(env.store, node_id), {"version": 1, "flows": []}))
