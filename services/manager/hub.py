"""The node hub: the trio driver of one ``ManagerSession`` per connected node socket.

Theory of operation
-------------------
Every accepted ``/ws/node`` socket is handed to :meth:`NodeHub.serve` as a :class:`NodeSocket`
(the route adapts quart's websocket to it, so this module never imports quart). ``serve`` builds
a :class:`~appliance.protocol.ManagerSession` and runs three tasks around it in one nursery:

- the reader feeds every frame to ``session.on_frame`` and applies the returned ``Step``;
- the timer sleeps until ``session.deadline()`` or the next ``ping`` (interop.md 6: every
  ``ws_keepalive_interval_secs``), then calls ``session.on_timer`` (auth timeout, command
  timeouts, the idle close after ``node_offline_threshold_secs``);
- the sender writes the queued frames in order, and closes the socket when a step says so.

The session owns every protocol rule; the hub decides what the session leaves to its driver
(docs/node-protocol.md "Driving it"): it checks credentials against the store, keeps the node's
status, events and config cache in the store, and wakes the route waiting on a command.

Frames are queued with ``send_nowait`` into a bounded channel: a node that stops reading its
socket until the queue is full is disconnected rather than allowed to block the hub.

Secrets: tokens and node secrets arrive as ``SecretStr``, are hashed or compared in constant time,
and never reach a log line, an event or an error text. Error texts come from the session (never
frame content) or from this module's constants.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Protocol, cast

import trio
from pydantic import SecretStr

from appliance import errors
from appliance.models.events import Severity
from appliance.protocol import (
    AUTH_TIMEOUT_S,
    COMMAND_TIMEOUT_S,
    KEEPALIVE_INTERVAL_S,
    MAX_ACTION_BYTES,
    MUTATING_ACTION_TYPES,
    OFFLINE_THRESHOLD_S,
    PROTOCOL_VERSION,
    AuthRequest,
    CommandAbandoned,
    CommandCompleted,
    CompatibilityWarning,
    ConfigReceived,
    CredentialKind,
    EventReceived,
    FrameDropped,
    HealthReceived,
    InvalidAction,
    Lockout,
    ManagerEvent,
    ManagerSession,
    ManagerState,
    NodeAuthenticated,
    NodeEvent,
    PongReceived,
    StatsReceived,
    Step,
    UnknownAction,
    action_types_for,
    parse_action,
)
from appliance.protocol import CommandTimedOut as CommandTimeoutEvent
from appliance.protocol import DeviceType as ProtocolDeviceType
from services.manager.history import BitrateHistory
from services.manager.reports import DEFAULT_INTERVAL_S as REPORTS_INTERVAL_S
from services.manager.reports import NodeReports
from services.manager.secrets import SecretBox, SecretUnreadable
from services.manager.store import DeviceType as StoreDeviceType
from services.manager.store import EventSeverity, JsonValue, NewEvent, NodeCredentials, NodeStatus, Store

if TYPE_CHECKING:
    from services.manager.fleet import Fleet, RemoteNode

__all__ = [
    "CONNECTED_MESSAGE",
    "DISCONNECTED_MESSAGE",
    "CommandFailed",
    "CommandResult",
    "CommandTimedOut",
    "CommandTooLarge",
    "HubError",
    "InvalidCommand",
    "NodeHub",
    "NodeNotConnected",
    "NodeSocket",
    "SocketClosed",
    "status_from_stats",
]

_log = logging.getLogger("mediaplane.manager.hub")

CONNECTION_CATEGORY: Final = "connection"
CONNECTED_MESSAGE: Final = "Node connected to manager"  # interop.md 6 "Online and offline"
DISCONNECTED_MESSAGE: Final = "Node disconnected from manager"
INVALID_TOKEN: Final = "Invalid registration token"
INVALID_SECRET: Final = "Invalid node secret"  # interop.md 6 example; also for an unknown node id
NODE_EXPIRED: Final = "Node has expired"
LOCKED_OUT: Final = "Too many failed authentication attempts; try again later"
OUTBOX_CAPACITY: Final = 256
"""Frames queued for one node before the hub gives up on it (it is not reading its socket)."""
BOOKKEEPING_TIMEOUT_S: Final = 10.0
"""How long handling one session event (store writes included) may take; it is shielded from the
connection's cancellation so that a node going away cannot cut it in half."""
CLEANUP_TIMEOUT_S: Final = 5.0
"""How long the shielded end-of-connection bookkeeping (offline status, event) may take."""
NORMAL_CLOSE: Final = 1000  # RFC 6455 §7.4.1


# --------------------------------------------------------------------------- errors the routes map
class HubError(errors.ApplianceError):
    """Base of the hub's command errors. ``message`` never holds a secret or frame content."""


class NodeNotConnected(HubError):
    """The node has no authenticated socket, or it closed before answering (HTTP 502)."""


class CommandTimedOut(HubError):
    """No answer within the command timeout, 10 s by default (HTTP 504)."""


class CommandFailed(HubError):
    """The node answered ``success:false``; ``message`` is the node's error text (HTTP 422)."""


class InvalidCommand(errors.InvalidInput):
    """No ``type``, an unknown action, one the node's device type does not run, or invalid
    arguments (HTTP 400, through ``InvalidInput``)."""


class CommandTooLarge(errors.PayloadTooLarge):
    """The action is over 50 KiB serialized (HTTP 413, through ``PayloadTooLarge``)."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    """A command the node completed successfully (``POST /nodes/{id}/command``'s 200 body)."""

    command_id: uuid.UUID
    success: bool
    data: object
    """``command_ack.data``; for ``get_config`` the config as received."""


class SocketClosed(Exception):
    """Raised by a :class:`NodeSocket` when the peer has gone."""


class NodeSocket(Protocol):
    """What the hub needs of an accepted WebSocket (the route adapts quart's ``websocket``)."""

    async def receive(self) -> str | bytes:
        """The next message; raises :class:`SocketClosed` (or is cancelled) when the peer is gone."""
        ...

    async def send(self, frame: str) -> None:
        """Send one text frame; raises :class:`SocketClosed` when the peer is gone."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close the socket with ``code`` and ``reason``."""
        ...


# --------------------------------------------------------------------------- per-connection state
@dataclass(frozen=True, slots=True)
class _Shutdown:
    code: int
    reason: str


_Outgoing = str | _Shutdown


@dataclass(slots=True)
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    outcome: ManagerEvent | None = None


@dataclass(slots=True)
class _Connection:
    session: ManagerSession
    socket: NodeSocket
    outbox: trio.MemorySendChannel[_Outgoing]
    inbox: trio.MemoryReceiveChannel[_Outgoing]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    wake: trio.Event = field(default_factory=trio.Event)
    node_id: uuid.UUID | None = None
    device_type: ProtocolDeviceType = ProtocolDeviceType.EDGE
    next_ping: float = math.inf
    waiters: dict[uuid.UUID, _Waiter] = field(default_factory=dict)
    status: NodeStatus = NodeStatus.ONLINE
    last_seen_written: float = -math.inf
    stats: dict[str, object] | None = None
    health: dict[str, object] | None = None
    versions: tuple[str, int] | None = None  # software, protocol: from auth
    cached_config: str | None = None  # what this connection last wrote to the config cache
    finished: trio.Event = field(default_factory=trio.Event)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def status_from_stats(stats: Mapping[str, object]) -> NodeStatus:
    """interop.md 6 "Online and offline": ``error`` if any flow is Critical, ``degraded`` if any
    is Warning or Error, else ``online``. A payload without ``flows`` (a relay) is ``online``."""
    flows = stats.get("flows")
    healths = {flow.get("health") for flow in flows if isinstance(flow, dict)} if isinstance(flows, list) else set()
    if "Critical" in healths:
        return NodeStatus.ERROR
    if healths & {"Warning", "Error"}:
        return NodeStatus.DEGRADED
    return NodeStatus.ONLINE


def _token_digest(token: SecretStr) -> str:
    # interop.md 7.7: only the SHA-256 hex digest of a registration token is stored.
    return hashlib.sha256(token.get_secret_value().encode("utf-8")).hexdigest()


def _parse_node_id(text: str | None) -> uuid.UUID | None:
    if text is None:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


class NodeHub:
    """The live node sockets, by node id, and the commands sent over them.

    One per manager process. :meth:`serve` runs one socket to its end; :meth:`send_command`,
    :meth:`disconnect` and the read-only views are for the routes and the dashboard stream.
    Every time parameter defaults to interop.md 6's value; tests shorten them.
    """

    def __init__(
        self,
        store: Store,
        secret_box: SecretBox,
        *,
        keepalive_interval_s: float = KEEPALIVE_INTERVAL_S,
        offline_threshold_s: float | None = OFFLINE_THRESHOLD_S,
        auth_timeout_s: float = AUTH_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        last_seen_write_interval_s: float = 5.0,
        reports_interval_s: float = REPORTS_INTERVAL_S,
        lockout: Lockout | None = None,
        protocol_version: int = PROTOCOL_VERSION,
        wall_clock: Callable[[], datetime] = _utc_now,
        fleet: Fleet | None = None,
    ) -> None:
        """``keepalive_interval_s``: ``ws_keepalive_interval_secs``; ``offline_threshold_s``:
        ``node_offline_threshold_secs`` (None: never idle-close). ``last_seen_write_interval_s``
        bounds how often ``stats`` alone writes ``last_seen_at`` (a status change, and every
        ``health``, always write). ``reports_interval_s``: how long runtime fields and events
        wait to be written together (:class:`NodeReports`; :meth:`run` writes them).
        ``lockout`` is kept in memory (a restart forgets it). ``fleet``: the other instances on
        the same PostgreSQL (commands for their nodes go through them; their nodes show live)."""
        self._store = store
        self._box = secret_box
        self._keepalive_interval_s = keepalive_interval_s
        self._offline_threshold_s = offline_threshold_s
        self._auth_timeout_s = auth_timeout_s
        self._command_timeout_s = command_timeout_s
        self._last_seen_write_interval_s = last_seen_write_interval_s
        self._lockout = lockout if lockout is not None else Lockout()
        self._protocol_version = protocol_version
        self._wall_clock = wall_clock
        self._connections: dict[uuid.UUID, _Connection] = {}
        self.reports = NodeReports(store, interval_s=reports_interval_s, wall_clock=wall_clock)
        """Status, last seen, health and events, written behind the read loops."""
        self._handlers: dict[type, Callable[[_Connection, ManagerEvent], Awaitable[None]]] = {
            AuthRequest: self._on_auth_request,
            NodeAuthenticated: self._on_authenticated,
            CompatibilityWarning: self._on_compatibility_warning,
            StatsReceived: self._on_stats,
            HealthReceived: self._on_health,
            EventReceived: self._on_event,
            CommandCompleted: self._on_command_answer,
            CommandTimeoutEvent: self._on_command_answer,
            CommandAbandoned: self._on_command_answer,
            ConfigReceived: self._on_config,
            PongReceived: self._on_pong,
            FrameDropped: self._on_frame_dropped,
        }
        self.frames_dropped = 0
        """Frames the sessions dropped (malformed, oversized, unexpected), all sockets together."""
        self.fleet = fleet
        if fleet is not None:
            fleet.attach(self)
        self.history = BitrateHistory()
        """The last minutes of every flow's bit rates (the dashboard's charts start from it)."""

    # ------------------------------------------------------------------ views
    # A node is "connected" when this instance holds its socket or, in a fleet, another
    # instance published it live within the last seconds (services.manager.fleet).
    @property
    def local_node_ids(self) -> frozenset[uuid.UUID]:
        """The nodes whose authenticated socket this instance holds."""
        return frozenset(self._connections)

    @property
    def connected_node_ids(self) -> frozenset[uuid.UUID]:
        """The nodes with an authenticated socket now, on this instance or another of the fleet."""
        local = frozenset(self._connections)
        return local | self.fleet.remote_node_ids if self.fleet is not None else local

    def is_connected(self, node_id: uuid.UUID) -> bool:
        """Whether the node has an authenticated socket now (here or on another instance)."""
        return node_id in self._connections or self._remote(node_id) is not None

    def _remote(self, node_id: uuid.UUID) -> RemoteNode | None:
        return self.fleet.remote_node(node_id) if self.fleet is not None else None

    def latest_stats(self, node_id: uuid.UUID) -> dict[str, object] | None:
        """The last ``stats`` payload of a connected node, as received (for the dashboard)."""
        conn = self._connections.get(node_id)
        if conn is not None:
            return conn.stats
        remote = self._remote(node_id)
        return remote.stats if remote is not None else None

    def latest_health(self, node_id: uuid.UUID) -> dict[str, object] | None:
        """The last ``health`` payload of a connected node, as received."""
        conn = self._connections.get(node_id)
        if conn is not None:
            return conn.health
        remote = self._remote(node_id)
        return remote.health if remote is not None else None

    def live_versions(self, node_id: uuid.UUID) -> tuple[str, int] | None:
        """The software and protocol versions a connected node sent in its ``auth``."""
        conn = self._connections.get(node_id)
        if conn is not None:
            return conn.versions
        remote = self._remote(node_id)
        return remote.versions if remote is not None else None

    def live_status(self, node_id: uuid.UUID) -> NodeStatus | None:
        """The status of a connected node by the stats rule; None when not connected."""
        conn = self._connections.get(node_id)
        if conn is not None:
            return conn.status
        remote = self._remote(node_id)
        return remote.status if remote is not None else None

    def wall_time(self) -> float:
        """Now, in Unix seconds, from the hub's wall clock."""
        return self._wall_clock().timestamp()

    async def run(self) -> None:
        """Writes what nodes report (:attr:`reports`) until cancelled. Start it once, beside serving."""
        await self.reports.run()

    async def settings_changed(self, *, keepalive_interval_s: float, offline_threshold_s: float) -> None:
        """``PUT /settings`` changed them here: applied, and in a fleet told to every instance."""
        self.apply_settings(keepalive_interval_s=keepalive_interval_s, offline_threshold_s=offline_threshold_s)
        if self.fleet is not None:
            await self.fleet.settings_changed()

    # ------------------------------------------------------------------ one socket
    async def serve(self, socket: NodeSocket) -> None:
        """Run one accepted node socket until it closes, the session closes it, or
        :meth:`disconnect` does. Never raises for anything the node does; the offline bookkeeping
        runs even when the caller cancels (the route's task is cancelled on a client close)."""
        outbox, inbox = trio.open_memory_channel[_Outgoing](OUTBOX_CAPACITY)
        session = ManagerSession(
            now=trio.current_time(),
            wall_clock=self._wall_clock,
            protocol_version=self._protocol_version,
            auth_timeout_s=self._auth_timeout_s,
            command_timeout_s=self._command_timeout_s,
            offline_threshold_s=self._offline_threshold_s,
        )
        conn = _Connection(session=session, socket=socket, outbox=outbox, inbox=inbox)
        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send_loop, conn)
                    nursery.start_soon(self._timer_loop, conn)
                    nursery.start_soon(self._read_loop, conn)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S):
                await self._finish(conn)

    async def _read_loop(self, conn: _Connection) -> None:
        try:
            while conn.session.state is not ManagerState.CLOSED:
                frame = await conn.socket.receive()
                await self._apply(conn, conn.session.on_frame(frame, trio.current_time()))
                conn.wake.set()  # the idle deadline moved
        except SocketClosed:
            conn.scope.cancel()

    async def _timer_loop(self, conn: _Connection) -> None:
        while True:
            wake = conn.wake = trio.Event()
            deadline = conn.session.deadline()
            at = min(deadline if deadline is not None else math.inf, conn.next_ping)
            with trio.move_on_at(at):
                await wake.wait()
                continue
            now = trio.current_time()
            if conn.session.state is ManagerState.AUTHENTICATED and now >= conn.next_ping:
                self._queue(conn, conn.session.ping())
                conn.next_ping = now + self._keepalive_interval_s
            await self._apply(conn, conn.session.on_timer(now))

    async def _send_loop(self, conn: _Connection) -> None:
        try:
            async for item in conn.inbox:
                if isinstance(item, _Shutdown):
                    await conn.socket.close(item.code, item.reason)
                    break
                await conn.socket.send(item)
        except SocketClosed:
            pass
        conn.scope.cancel()

    def _queue(self, conn: _Connection, item: _Outgoing) -> None:
        try:
            conn.outbox.send_nowait(item)
        except trio.WouldBlock:
            _log.warning("node %s is not reading its socket: disconnecting it", conn.node_id)
            conn.scope.cancel()

    async def _apply(self, conn: _Connection, step: Step[ManagerEvent]) -> None:
        # docs/node-protocol.md: send the frames first, then close if asked, then act on the events.
        for frame in step.frames:
            self._queue(conn, frame)
        if step.close is not None:
            self._queue(conn, _Shutdown(step.close.code, step.close.reason))
        for event in step.events:
            # Shielded: a node that goes away mid-way (quart then cancels the route) must not cut
            # the bookkeeping in half, e.g. "connected" lost while "disconnected" is written.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + BOOKKEEPING_TIMEOUT_S) as scope:
                await self._handlers[type(event)](conn, event)
            if scope.cancelled_caught:
                _log.error(
                    "handling %s for node %s took over %g s", type(event).__name__, conn.node_id, BOOKKEEPING_TIMEOUT_S
                )

    async def _finish(self, conn: _Connection) -> None:
        try:
            await self._apply(conn, conn.session.close())  # waiting commands -> CommandAbandoned (502)
            node_id = conn.node_id
            if node_id is None or self._connections.get(node_id) is not conn:
                return  # never authenticated
            try:
                _log.info("node %s disconnected", node_id)
                if self.fleet is not None and not await self.fleet.release(node_id):
                    # It reconnected to another instance of the fleet before this socket ended:
                    # it is not offline.
                    return
                self.reports.update_runtime(node_id, status=NodeStatus.OFFLINE)
                self._record(node_id, Severity.CRITICAL, CONNECTION_CATEGORY, DISCONNECTED_MESSAGE)
            finally:
                del self._connections[node_id]  # only now: a newer socket waits for this bookkeeping
        finally:
            conn.finished.set()

    # ------------------------------------------------------------------ authentication
    async def _on_auth_request(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, AuthRequest)
        now = trio.current_time()
        if self._lockout.is_locked(event.identifier, now) or (
            self.fleet is not None and await self.fleet.locked_out(event.identifier)
        ):
            # interop.md 6 "Lockout": every attempt during the window is refused.
            await self._apply(conn, conn.session.reject(LOCKED_OUT))
            return
        if event.credential is CredentialKind.REGISTRATION_TOKEN:
            step, failed = await self._register(conn, event)
        else:
            step, failed = await self._login(conn, event)
        if failed:
            self._lockout.record_failure(event.identifier, trio.current_time())
            if self.fleet is not None:
                await self.fleet.record_auth_failure(event.identifier)
        await self._apply(conn, step)

    async def _register(self, conn: _Connection, event: AuthRequest) -> tuple[Step[ManagerEvent], bool]:
        node_secret = str(uuid.uuid4())  # interop.md 6: a fresh UUIDv4
        ciphertext = self._box.encrypt(node_secret)
        # Single use, pending and unexpired only: one conditional UPDATE in the store.
        record = await self._store.consume_registration_token(_token_digest(event.secret), ciphertext)
        if record is None:
            _log.warning("registration refused: unknown, used or expired token")  # no token prefix logged
            return conn.session.reject(INVALID_TOKEN), True
        conn.device_type = ProtocolDeviceType(record.device_type.value)
        _log.info("node %s registered", record.id)
        return conn.session.accept(str(record.id), SecretStr(node_secret)), False

    async def _login(self, conn: _Connection, event: AuthRequest) -> tuple[Step[ManagerEvent], bool]:
        node_id = _parse_node_id(event.node_id)
        credentials = await self._store.get_node_credentials(node_id) if node_id is not None else None
        if node_id is None or credentials is None or not self._secret_matches(event.secret, credentials):
            _log.warning("login refused for node %s", event.identifier)
            return conn.session.reject(INVALID_SECRET), True
        expires_at = credentials.expires_at
        if expires_at is not None and expires_at <= self._wall_clock():
            return conn.session.reject(NODE_EXPIRED), True
        record = await self._store.get_node(node_id)
        if record is not None and record.device_type is StoreDeviceType.RELAY:
            conn.device_type = ProtocolDeviceType.RELAY
        assert event.node_id is not None
        return conn.session.accept(event.node_id), False

    def _secret_matches(self, presented: SecretStr, credentials: NodeCredentials) -> bool:
        # interop.md 6 rotate_secret: until the ack arrives, the old and the new secret both work.
        stored = (credentials.secret_ciphertext, credentials.pending_secret_ciphertext)
        given = presented.get_secret_value().encode("utf-8")
        matched = False
        for ciphertext in stored:
            if ciphertext is None:
                continue
            try:
                expected = self._box.decrypt(ciphertext).encode("utf-8")
            except SecretUnreadable as exc:
                _log.error("a stored node secret cannot be read: %s", exc.message)
                continue
            matched |= hmac.compare_digest(given, expected)  # constant time; no early exit
        return matched

    async def _on_authenticated(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, NodeAuthenticated)
        node_id = uuid.UUID(event.node_id)
        previous = self._connections.get(node_id)
        if previous is not None:
            # A newer socket of the same node wins; the old one's offline bookkeeping goes first.
            previous.scope.cancel()
            with trio.move_on_after(CLEANUP_TIMEOUT_S):
                await previous.finished.wait()
        conn.node_id = node_id
        conn.versions = (event.software_version, event.protocol_version)
        self._connections[node_id] = conn
        conn.next_ping = trio.current_time() + self._keepalive_interval_s
        conn.wake.set()
        _log.info(
            "node %s connected (software %s, protocol %d)", node_id, event.software_version, event.protocol_version
        )
        self.reports.update_runtime(
            node_id,
            status=NodeStatus.ONLINE,
            last_seen_at=self._wall_clock(),
            software_version=event.software_version,
            protocol_version=event.protocol_version,
        )
        conn.last_seen_written = trio.current_time()
        self._record(node_id, Severity.INFO, CONNECTION_CATEGORY, CONNECTED_MESSAGE)
        self._request_config(conn)
        if self.fleet is not None:
            await self.fleet.claim(node_id)

    async def _on_compatibility_warning(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, CompatibilityWarning) and conn.node_id is not None
        self._store_event(conn.node_id, event.event)

    # ------------------------------------------------------------------ what the node reports
    async def _on_stats(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, StatsReceived) and conn.node_id is not None
        conn.stats = event.stats.root
        self.history.record(conn.node_id, event.stats.root, self.wall_time())
        status = status_from_stats(event.stats.root)
        now = trio.current_time()
        if status is not conn.status or now - conn.last_seen_written >= self._last_seen_write_interval_s:
            conn.status = status
            conn.last_seen_written = now
            self.reports.update_runtime(conn.node_id, status=status, last_seen_at=self._wall_clock())

    async def _on_health(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, HealthReceived) and conn.node_id is not None
        conn.health = event.health.root
        conn.last_seen_written = trio.current_time()
        health = cast(JsonValue, dict(event.health.root))  # JSON as received
        self.reports.update_runtime(
            conn.node_id, status=conn.status, last_seen_at=self._wall_clock(), last_health=health
        )

    async def _on_event(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, EventReceived) and conn.node_id is not None
        self._store_event(conn.node_id, event.event)  # already bounded by normalise_event

    async def _on_pong(self, conn: _Connection, event: ManagerEvent) -> None:
        pass  # it counted as "something arrived" in the session

    async def _on_frame_dropped(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, FrameDropped)
        self.frames_dropped += 1
        # interop.md 6 "Limits": dropped and logged, the connection stays up. reason is safe.
        _log.warning("frame from node %s dropped (%s): %s", conn.node_id, event.kind.value, event.reason)

    async def _on_config(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, ConfigReceived) and conn.node_id is not None
        # interop.md 13: cached and served as received (re-serialised compactly, key order kept).
        text = json.dumps(event.config.root, separators=(",", ":"), ensure_ascii=False)
        if text != conn.cached_config:  # a repeated get_config of the same config writes nothing
            await self._store.cache_node_config(conn.node_id, text)
            conn.cached_config = text
        if event.command_id is not None:
            self._wake_waiter(conn, event.command_id, event)

    async def _on_command_answer(self, conn: _Connection, event: ManagerEvent) -> None:
        assert isinstance(event, CommandCompleted | CommandTimeoutEvent | CommandAbandoned)
        # The caller is woken last: once it has its answer, what the command changed here (the
        # dropped config cache, the finished rotation) is in the store, so a GET .../config right
        # after a 200 never serves the config from before the change.
        try:
            if not isinstance(event, CommandCompleted) or not event.success or conn.node_id is None:
                return
            if event.action_type == "rotate_secret":
                await self._store.finish_secret_rotation(conn.node_id)
            if event.action_type in MUTATING_ACTION_TYPES:
                # interop.md 6 "Config cache": drop it and ask again after a successful change.
                await self._store.cache_node_config(conn.node_id, None)
                conn.cached_config = None
                if conn.session.state is ManagerState.AUTHENTICATED:
                    self._request_config(conn)
        finally:
            self._wake_waiter(conn, event.command_id, event)

    def _wake_waiter(self, conn: _Connection, command_id: uuid.UUID, event: ManagerEvent) -> None:
        waiter = conn.waiters.get(command_id)
        if waiter is not None:
            waiter.outcome = event
            waiter.done.set()

    def _request_config(self, conn: _Connection) -> None:
        self._queue(conn, conn.session.get_config(uuid.uuid4(), now=trio.current_time()))
        conn.wake.set()

    def _record(self, node_id: uuid.UUID, severity: Severity, category: str, message: str) -> None:
        self._store_event(node_id, NodeEvent(severity=severity, category=category, message=message))

    def _store_event(self, node_id: uuid.UUID, event: NodeEvent) -> None:
        details = cast(JsonValue, dict(event.details)) if event.details is not None else None
        self.reports.add_event(
            NewEvent(
                node_id=node_id,
                severity=EventSeverity.from_wire(event.severity.value),
                category=event.category,
                message=event.message,
                details=details,
                flow_id=event.flow_id,
            )
        )

    # ------------------------------------------------------------------ for the routes
    def apply_settings(self, *, keepalive_interval_s: float, offline_threshold_s: float) -> None:
        """``ws_keepalive_interval_secs`` and ``node_offline_threshold_secs`` changed (interop.md
        7.5, live): the next ping of every node and every new connection use them."""
        self._keepalive_interval_s = keepalive_interval_s
        self._offline_threshold_s = offline_threshold_s

    async def send_command(
        self,
        node_id: uuid.UUID,
        action: Mapping[str, object],
        *,
        max_bytes: int = MAX_ACTION_BYTES,
        forward: bool = True,
    ) -> CommandResult:
        """Send ``action`` to the node and wait for its answer (interop.md 6 "Commands").

        ``max_bytes`` bounds the serialized action: 50 KiB for ``POST /nodes/{id}/command``;
        ``PUT /nodes/{id}/config`` passes a larger bound (its config may be 100 KiB).

        Returns on success (for ``get_config``, ``data`` is the config). Raises
        :class:`InvalidCommand` (400), :class:`CommandTooLarge` (413), :class:`NodeNotConnected`
        (502: no socket, or it closed while waiting), :class:`CommandTimedOut` (504) or
        :class:`CommandFailed` (422, the node's text). After a successful mutating command the
        cached config is dropped and ``get_config`` re-sent.

        In a fleet, a node whose socket another instance holds gets the command through that
        instance (``forward``; the holder itself passes False, so a command never bounces).
        """
        try:
            size = len(json.dumps(dict(action), separators=(",", ":")).encode("utf-8"))
        except (TypeError, ValueError) as exc:
            raise InvalidCommand("action must be a JSON object") from exc
        if size > max_bytes:
            raise CommandTooLarge(f"Command action exceeds {max_bytes // 1024} KiB")
        conn = self._connections.get(node_id)
        if conn is None and forward and self.fleet is not None:
            return await self.fleet.forward_command(
                node_id, action, max_bytes=max_bytes, command_timeout_s=self._command_timeout_s
            )
        if conn is None or conn.session.state is not ManagerState.AUTHENTICATED:
            raise NodeNotConnected("Node is not connected")
        try:
            parsed = parse_action(dict(action), supported=action_types_for(conn.device_type))
        except ValueError as exc:
            raise InvalidCommand(str(exc)) from exc  # a safe text: it names no value
        if isinstance(parsed, UnknownAction | InvalidAction):
            raise InvalidCommand(parsed.error)
        command_id = uuid.uuid4()
        waiter = conn.waiters[command_id] = _Waiter()
        try:
            self._queue(conn, conn.session.send_command(parsed, command_id, now=trio.current_time()))
            conn.wake.set()  # a new, possibly earlier, deadline
            # The session times the command out; this bound only guards against a hub bug.
            with trio.move_on_after(self._command_timeout_s + 5):
                await waiter.done.wait()
        finally:
            del conn.waiters[command_id]
        outcome = waiter.outcome
        if isinstance(outcome, ConfigReceived):
            return CommandResult(command_id, True, outcome.config.root)
        if isinstance(outcome, CommandCompleted):
            if outcome.success:
                return CommandResult(command_id, True, outcome.data)
            raise CommandFailed(outcome.error or "Command failed")
        if isinstance(outcome, CommandAbandoned):
            raise NodeNotConnected("Node disconnected before answering")
        raise CommandTimedOut("Node did not answer within the timeout")

    async def disconnect(self, node_id: uuid.UUID, *, forward: bool = True) -> bool:
        """Close the node's socket (e.g. a new registration token was issued, interop.md 7.2).

        Waiting commands fail with :class:`NodeNotConnected`; the node goes offline as for any
        close. Returns whether a socket was open. Does not wait for the close to finish, except
        in a fleet when another instance holds the socket: then it returns once it has closed.
        """
        conn = self._connections.get(node_id)
        if conn is None:
            if forward and self.fleet is not None:
                return await self.fleet.forward_disconnect(node_id)
            return False
        await self._apply(conn, conn.session.close())
        self._queue(conn, _Shutdown(NORMAL_CLOSE, "Disconnected by the manager"))
        return True

    async def wait_disconnected(self, node_id: uuid.UUID, timeout_s: float) -> bool:
        """Wait until the node's socket, if any, has finished (offline recorded); whether it did."""
        conn = self._connections.get(node_id)
        if conn is None:
            return True
        with trio.move_on_after(timeout_s):
            await conn.finished.wait()
            return True
        return False
