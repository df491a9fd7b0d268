"""A scriptable node for the manager's hub tests: ``NodeSession`` over trio-websocket and TLS.

Usage (in a trio test)::

    async with connect_node(url, ssl_context, NodeCredentials(registration_token=SecretStr(t))) as node:
        await node.wait_authenticated()
        node.replies["start_flow"] = Reply(success=False, error="Flow 'cam1' is already running")
        await node.send_stats({...})

The node answers ``ping`` (``pong``, from the session), ``get_config`` (with ``node.config``) and
every other command with ``node.replies.get(type, Reply())``; a reply of ``None`` means "do not
answer". ``node.silent = True`` stops every answer, pongs included. The file name starts with
``test_`` as the brief asked; it holds no tests (pytest collects nothing from it).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from appliance.protocol import (
    MANAGER_FRAME_MAX_BYTES,
    PROTOCOL_VERSION,
    Authenticated,
    AuthRejected,
    CommandReceived,
    DeviceType,
    EventPayload,
    GetConfig,
    InvalidAction,
    NodeCredentials,
    NodeSession,
    NodeSessionEvent,
    NodeState,
    Registered,
    Step,
    UnknownAction,
)

__all__ = ["Reply", "TestNode", "connect_node"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Reply:
    """How the node answers one command type."""

    success: bool = True
    error: str | None = None
    data: object = None


@dataclass
class TestNode:
    """One connection of the test node. Read its fields; call its ``send_*`` methods."""

    __test__ = False  # not a pytest test class

    ws: WebSocketConnection
    session: NodeSession
    config: dict[str, object] = field(default_factory=lambda: {"version": 1, "flows": []})
    replies: dict[str, Reply | None] = field(default_factory=dict)
    silent: bool = False
    registered: Registered | None = None
    rejected: str | None = None
    commands: list[CommandReceived] = field(default_factory=list)
    pings: int = 0
    authenticated: trio.Event = field(default_factory=trio.Event)
    closed: trio.Event = field(default_factory=trio.Event)
    close_code: int | None = None
    changed: trio.Event = field(default_factory=trio.Event)
    """Set (and replaced) whenever a frame arrives: wait on it to re-check a condition."""

    async def wait_authenticated(self, timeout_s: float = 15.0) -> None:
        """Until ``register_ack`` / ``auth_ok``; fails the test after ``timeout_s`` (15 s: a
        registration is a store write, and a CI host at full load once took over 5 s)."""
        with trio.fail_after(timeout_s):
            await self.authenticated.wait()

    async def wait_closed(self, timeout_s: float = 5.0) -> None:
        """Until the manager closed the socket; fails the test after ``timeout_s``."""
        with trio.fail_after(timeout_s):
            await self.closed.wait()

    async def wait_commands(self, count: int, timeout_s: float = 5.0) -> list[CommandReceived]:
        """Until at least ``count`` commands arrived."""
        with trio.fail_after(timeout_s):
            while len(self.commands) < count:
                await self.changed.wait()
        return self.commands

    async def send_stats(self, payload: dict[str, object]) -> None:
        await self.send_raw(self.session.stats(payload))

    async def send_health(self, payload: dict[str, object]) -> None:
        await self.send_raw(self.session.health(payload))

    async def send_event(self, event: EventPayload) -> None:
        await self.send_raw(self.session.event(event))

    async def send_raw(self, frame: str) -> None:
        """Any text frame, even one the session would refuse to build (an oversized one)."""
        await self.ws.send_message(frame)

    async def _run(self) -> None:
        try:
            while True:
                frame = await self.ws.get_message()
                await self._apply(self.session.on_frame(frame, trio.current_time()))
                self.changed.set()
                self.changed = trio.Event()
        except ConnectionClosed as exc:
            self.close_code = exc.reason.code if exc.reason is not None else None
        finally:
            if self.session.state is not NodeState.CLOSED:
                self.session.close()
            self.closed.set()
            self.changed.set()

    async def _apply(self, step: Step[NodeSessionEvent]) -> None:
        for frame in step.frames:
            if frame.startswith('{"type":"pong"'):
                self.pings += 1
                if self.silent:
                    continue
            await self.ws.send_message(frame)
        for event in step.events:
            await self._on_event(event)

    async def _on_event(self, event: NodeSessionEvent) -> None:
        if isinstance(event, Registered):
            self.registered = event
        elif isinstance(event, Authenticated):
            self.authenticated.set()
        elif isinstance(event, AuthRejected):
            self.rejected = event.message
        elif isinstance(event, CommandReceived):
            self.commands.append(event)
            if not self.silent:
                await self._answer(event)

    async def _answer(self, command: CommandReceived) -> None:
        action = command.action
        if isinstance(action, UnknownAction | InvalidAction):
            frame = self.session.command_ack(command.command_id, success=False, error=action.error)
        elif isinstance(action, GetConfig):
            if self.replies.get("get_config", Reply()) is None:
                return
            frame = self.session.config_response(self.config)
        else:
            reply = self.replies.get(action.type, Reply())
            if reply is None:
                return
            frame = self.session.command_ack(
                command.command_id, success=reply.success, error=reply.error, data=reply.data
            )
        await self.ws.send_message(frame)


@asynccontextmanager
async def connect_node(
    url: str,
    ssl_context: ssl.SSLContext,
    credentials: NodeCredentials,
    *,
    device_type: DeviceType = DeviceType.EDGE,
    software_version: str = "0.3.0",
    protocol_version: int = PROTOCOL_VERSION,
    send_auth: bool = True,
) -> AsyncIterator[TestNode]:
    """Open ``url`` (``wss://…/ws/node``), send ``auth`` (unless ``send_auth`` is False) and run
    the node in the background until the block ends or the manager closes the socket."""
    session = NodeSession(
        credentials=credentials,
        software_version=software_version,
        device_type=device_type,
        wall_clock=_utc_now,
        protocol_version=protocol_version,
    )
    async with open_websocket_url(
        url, ssl_context, max_message_size=MANAGER_FRAME_MAX_BYTES, connect_timeout=5, disconnect_timeout=2
    ) as ws:
        node = TestNode(ws, session)
        if send_auth:
            await ws.send_message(session.start(trio.current_time()))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node._run)
            yield node
            nursery.cancel_scope.cancel()
