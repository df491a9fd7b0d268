"""Several ``mp-manager`` instances on one PostgreSQL: who holds which node, and the messages between them.

A node's WebSocket lands on one instance (the load balancer picks). Everything else any
instance needs is in the shared database already (users, sessions, login attempts, nodes,
events, settings); what is not, this module puts there:

- **Heartbeat and leases.** Every :data:`BEAT_INTERVAL_S` the instance refreshes its row in
  ``manager_instances``, pushes the lease (``expires_at``) of the ``node_connections`` rows it
  holds :data:`LEASE_S` ahead, and publishes its connected nodes' live view (status, the last
  ``stats`` and ``health``, versions) in ``fleet_live``; it reads the others' in the same
  transaction. So any instance's dashboard stream, node list and charts show every node live.
- **Commands.** A command for a node whose socket another instance holds is written to the
  ``fleet_messages`` outbox, addressed to the holder, and ``pg_notify`` wakes the holder
  (PostgreSQL delivers a NOTIFY when the transaction commits). The holder takes the row (a
  ``DELETE … RETURNING``: each message is taken once), sends the command over its socket, and
  answers the same way. The body always travels in the table, never in the NOTIFY payload
  (8,000 bytes at most), and a listener that lost its connection reads what it missed from the
  table: it polls every :data:`POLL_INTERVAL_S` as well, so a NOTIFY is only ever a shortcut.
- **Broadcasts.** Settings changed on one instance take effect on all (interop.md 7.5 "live").
- **Failover.** When an instance dies its leases lapse; any survivor's sweep deletes the lapsed
  rows (each taken once) and marks those nodes offline with the usual event, unless they have
  already reconnected to a survivor (whose claim replaced the row).

Only PostgreSQL runs this: SQLite is the one-box store and a second instance on the same file
refuses to start (``services.manager.main``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

import psycopg
import trio

from appliance import errors
from appliance.protocol import LOCKOUT_MAX_FAILURES, LOCKOUT_WINDOW_S
from services.manager.hub import (
    CommandFailed,
    CommandResult,
    CommandTimedOut,
    CommandTooLarge,
    HubError,
    InvalidCommand,
    NodeHub,
    NodeNotConnected,
)
from services.manager.store import AttemptKind, NodeStatus, Store
from services.manager.store.fleet import NOTIFY_CHANNEL, FleetMessage

__all__ = ["BEAT_INTERVAL_S", "LEASE_S", "Fleet", "RemoteNode", "listen_conninfo"]

_log = logging.getLogger("mediaplane.manager.fleet")

BEAT_INTERVAL_S: Final = 1.0
"""Heartbeat, lease refresh and live view publication period (the dashboard's 1 s period)."""
LEASE_S: Final = 10.0
"""How long a node connection row outlives its instance's last heartbeat."""
FRESH_S: Final = 5.0
"""Another instance's live view older than this is not shown (that instance is stalled or dead)."""
SWEEP_INTERVAL_S: Final = 2.0
POLL_INTERVAL_S: Final = 1.0
"""The outbox is read at least this often, NOTIFY or not."""
MESSAGE_AGE: Final = timedelta(hours=1)
"""Messages nobody took (their target died) are dropped after this."""
INSTANCE_AGE: Final = timedelta(minutes=1)
REPLY_MARGIN_S: Final = 3.0
"""A forwarded command waits the holder's command timeout plus this for the answer."""
DISCONNECT_WAIT_S: Final = 8.0
BROADCAST_LOOKBACK: Final = timedelta(seconds=60)

# Message kinds (fleet_messages.kind).
COMMAND: Final = "command"
COMMAND_RESULT: Final = "command_result"
DISCONNECT: Final = "disconnect"
DISCONNECT_RESULT: Final = "disconnect_result"
SETTINGS: Final = "settings"


@dataclass(frozen=True, slots=True)
class RemoteNode:
    """A node whose socket another instance holds, as that instance last published it."""

    instance_id: uuid.UUID
    status: NodeStatus
    stats: dict[str, object] | None
    health: dict[str, object] | None
    versions: tuple[str, int] | None


@dataclass
class _Reply:
    done: trio.Event = field(default_factory=trio.Event)
    body: dict[str, Any] | None = None


def listen_conninfo(store: Store) -> str:
    """A libpq URI for the LISTEN connection, from the store's own URL (never logged)."""
    url = store.engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def instance_name() -> str:
    """``host:pid``: what ``manager_instances.name`` shows an operator."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Fleet:
    """One instance's membership of the fleet. Make it, :meth:`attach` the hub, run :meth:`run`."""

    def __init__(
        self,
        store: Store,
        *,
        settings_changed: Callable[[], Awaitable[None]],
        conninfo: str | None = None,
        instance_id: uuid.UUID | None = None,
        beat_interval_s: float = BEAT_INTERVAL_S,
        lease_s: float = LEASE_S,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        poll_interval_s: float = POLL_INTERVAL_S,
        reply_timeout_s: float | None = None,
    ) -> None:
        """``settings_changed`` re-reads the runtime settings and applies them (a broadcast from
        another instance calls it). ``conninfo``: the LISTEN connection (None: poll only)."""
        self.instance_id = instance_id or uuid.uuid4()
        self._store = store
        self._settings_changed = settings_changed
        self._conninfo = conninfo
        self._beat_interval_s = beat_interval_s
        self._lease = timedelta(seconds=lease_s)
        self._sweep_interval_s = sweep_interval_s
        self._poll_interval_s = poll_interval_s
        self._reply_timeout_s = reply_timeout_s
        self._hub: NodeHub | None = None
        self._remote: dict[uuid.UUID, RemoteNode] = {}
        self._replies: dict[uuid.UUID, _Reply] = {}
        self._wake = trio.Event()
        self._seen_broadcasts: dict[int, float] = {}
        self._started_at = store.now()
        self._nursery: trio.Nursery | None = None
        self.forwarded = 0
        """Commands this instance sent to others and got the holder's answer to (bench, tests)."""
        self.forward_timeouts = 0
        """Commands sent to others that got no answer in time (answered 504 here)."""
        self.listener_connected = False
        self.sweeps = 0
        """Sweeps run so far (tests wait on it)."""

    def attach(self, hub: NodeHub) -> None:
        """The hub whose sockets this instance holds (set once, before :meth:`run`)."""
        self._hub = hub

    @property
    def hub(self) -> NodeHub:
        if self._hub is None:
            raise RuntimeError("Fleet.attach(hub) first")
        return self._hub

    # ------------------------------------------------------------------ views
    def remote_node(self, node_id: uuid.UUID) -> RemoteNode | None:
        """The node as another instance last published it, when another instance holds it."""
        return self._remote.get(node_id)

    @property
    def remote_node_ids(self) -> frozenset[uuid.UUID]:
        return frozenset(self._remote)

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Registers this instance, then beats, sweeps, listens and serves messages until cancelled;
        on the way out removes its rows (shielded), so its nodes lapse at once rather than in 10 s."""
        await self._store.fleet_register(self.instance_id, instance_name())
        _log.info("fleet: this instance is %s", self.instance_id)
        stop_listener = threading.Event()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._conninfo is not None:
                    token = trio.lowlevel.current_trio_token()
                    thread = threading.Thread(
                        target=self._listen, args=(token, stop_listener), name="fleet-listen", daemon=True
                    )
                    thread.start()
                await self._beat_once()
                nursery.start_soon(self._beat_loop)
                nursery.start_soon(self._inbox_loop)
                nursery.start_soon(self._sweep_loop)
                task_status.started()
        finally:
            stop_listener.set()
            with trio.CancelScope(shield=True), trio.move_on_after(3):
                try:
                    await self._store.fleet_remove(self.instance_id)
                except errors.ApplianceError as exc:
                    _log.warning("fleet: could not remove this instance's rows: %s", exc.message)

    def _listen(self, token: trio.lowlevel.TrioToken, stop: threading.Event) -> None:
        """The LISTEN connection, in its own thread (psycopg's notifies() blocks). On every
        (re)connection it wakes the inbox once: what was sent meanwhile is read from the table."""
        assert self._conninfo is not None
        backoff = 0.5
        mine = str(self.instance_id)
        while not stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}".encode())
                    self.listener_connected = True
                    backoff = 0.5
                    self._wake_from_thread(token)
                    while not stop.is_set():
                        for notice in conn.notifies(timeout=0.5):
                            if notice.payload in (mine, "*"):
                                self._wake_from_thread(token)
            except psycopg.Error as exc:
                self.listener_connected = False
                # The class name only: a connection error's text may carry the connection string.
                _log.warning("fleet: LISTEN connection lost (%s); polling until it is back", type(exc).__name__)
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            except trio.RunFinishedError:
                return
        self.listener_connected = False

    def _wake_from_thread(self, token: trio.lowlevel.TrioToken) -> None:
        trio.from_thread.run_sync(lambda: self._wake.set(), trio_token=token)

    async def _beat_loop(self) -> None:
        while True:
            await trio.sleep(self._beat_interval_s)
            await self._beat_once()

    async def _beat_once(self) -> None:
        try:
            others = await self._store.fleet_beat(
                self.instance_id, self._live_body(), lease=self._lease, fresh=timedelta(seconds=FRESH_S)
            )
        except errors.ApplianceError as exc:
            _log.warning("fleet: heartbeat failed: %s", exc.message)
            return
        remote: dict[uuid.UUID, RemoteNode] = {}
        local = self.hub.local_node_ids
        now = self.hub.wall_time()
        for instance_id, body in others:
            try:
                published = json.loads(body)
            except ValueError:
                continue
            for node_text, view in published.items():
                node_id = uuid.UUID(node_text)
                if node_id in local:
                    continue  # it moved here; that instance's view is older
                node = _remote_node(instance_id, view)
                if node is not None:
                    remote[node_id] = node
                    if node.stats is not None:
                        self.hub.history.record(node_id, node.stats, now)
        self._remote = remote

    def _live_body(self) -> str:
        hub = self.hub
        view: dict[str, object] = {}
        for node_id in hub.local_node_ids:
            status = hub.live_status(node_id)
            if status is None:
                continue
            versions = hub.live_versions(node_id)
            view[str(node_id)] = {
                "status": status.value,
                "stats": hub.latest_stats(node_id),
                "health": hub.latest_health(node_id),
                "versions": list(versions) if versions is not None else None,
            }
        return json.dumps(view, separators=(",", ":"))

    async def _sweep_loop(self) -> None:
        while True:
            await trio.sleep(self._sweep_interval_s)
            try:
                lapsed = await self._store.fleet_sweep(message_age=MESSAGE_AGE, instance_age=INSTANCE_AGE)
            except errors.ApplianceError as exc:
                _log.warning("fleet: sweep failed: %s", exc.message)
                continue
            self.sweeps += 1
            if lapsed:
                _log.warning("fleet: %d node connection(s) lapsed with their instance; marked offline", len(lapsed))

    async def _inbox_loop(self) -> None:
        while True:
            with trio.move_on_after(self._poll_interval_s):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                messages = await self._store.fleet_take(self.instance_id)
                broadcasts = await self._new_broadcasts()
            except errors.ApplianceError as exc:
                _log.warning("fleet: reading the outbox failed: %s", exc.message)
                continue
            for message in [*messages, *broadcasts]:
                self._dispatch(message)

    async def _new_broadcasts(self) -> list[FleetMessage]:
        now = time.monotonic()
        for message_id, seen_at in list(self._seen_broadcasts.items()):
            if now - seen_at > 2 * BROADCAST_LOOKBACK.total_seconds():
                del self._seen_broadcasts[message_id]
        since = max(self._started_at, self._store.now() - BROADCAST_LOOKBACK)
        found = await self._store.fleet_broadcasts(since, list(self._seen_broadcasts))
        for message in found:
            self._seen_broadcasts[message.id] = now
        return [m for m in found if m.sender != self.instance_id]

    def _dispatch(self, message: FleetMessage) -> None:
        try:
            body = json.loads(message.body)
        except ValueError:
            _log.warning("fleet: message %d (%s) is not JSON; dropped", message.id, message.kind)
            return
        assert self._nursery is not None
        if message.kind in (COMMAND_RESULT, DISCONNECT_RESULT):
            reply = self._replies.get(uuid.UUID(body["request_id"]))
            if reply is not None:  # None: the asker gave up waiting
                reply.body = body
                reply.done.set()
        elif message.kind == COMMAND:
            self._nursery.start_soon(self._serve_command, message.sender, body)
        elif message.kind == DISCONNECT:
            self._nursery.start_soon(self._serve_disconnect, message.sender, body)
        elif message.kind == SETTINGS:
            self._nursery.start_soon(self._apply_settings)
        else:
            _log.warning("fleet: message %d of unknown kind %r dropped", message.id, message.kind[:32])

    # ------------------------------------------------------------------ serving others
    async def _serve_command(self, asker: uuid.UUID, body: Mapping[str, Any]) -> None:
        answer: dict[str, Any] = {"request_id": body["request_id"]}
        try:
            result = await self.hub.send_command(
                uuid.UUID(body["node_id"]), body["action"], max_bytes=int(body["max_bytes"]), forward=False
            )
        except HubError as exc:
            answer.update(ok=False, error=type(exc).__name__, message=exc.message)
        except errors.ApplianceError as exc:
            answer.update(ok=False, error="Internal", message=exc.message)
        else:
            answer.update(ok=True, command_id=str(result.command_id), data=result.data)
        await self._send(asker, COMMAND_RESULT, answer)

    async def _serve_disconnect(self, asker: uuid.UUID, body: Mapping[str, Any]) -> None:
        node_id = uuid.UUID(body["node_id"])
        opened = await self.hub.disconnect(node_id, forward=False)
        if opened:
            await self.hub.wait_disconnected(node_id, DISCONNECT_WAIT_S - 2)
        await self._send(asker, DISCONNECT_RESULT, {"request_id": body["request_id"], "opened": opened})

    async def _apply_settings(self) -> None:
        try:
            await self._settings_changed()
        except errors.ApplianceError as exc:
            _log.warning("fleet: could not apply the changed settings: %s", exc.message)

    async def _send(self, target: uuid.UUID | None, kind: str, body: Mapping[str, Any]) -> None:
        try:
            await self._store.fleet_send(self.instance_id, target, kind, json.dumps(body, separators=(",", ":")))
        except errors.ApplianceError as exc:
            _log.warning("fleet: sending a %s failed: %s", kind, exc.message)

    # ------------------------------------------------------------------ for the hub
    async def claim(self, node_id: uuid.UUID) -> None:
        """This instance now holds the node's socket."""
        self._remote.pop(node_id, None)
        try:
            await self._store.fleet_claim(node_id, self.instance_id, lease=self._lease)
        except errors.ApplianceError as exc:
            _log.warning("fleet: recording node %s's connection failed: %s", node_id, exc.message)

    async def release(self, node_id: uuid.UUID) -> bool:
        """The socket closed. Whether this instance still held it: False when the node has
        already reconnected to another instance (then it is not offline)."""
        try:
            return await self._store.fleet_release(node_id, self.instance_id)
        except errors.ApplianceError as exc:
            _log.warning("fleet: releasing node %s's connection failed: %s", node_id, exc.message)
            return True

    async def forward_command(
        self, node_id: uuid.UUID, action: Mapping[str, object], *, max_bytes: int, command_timeout_s: float
    ) -> CommandResult:
        """Sends the command through the instance that holds the node's socket and waits for
        its answer, raising what the holder's hub raised (interop.md 6 "Commands")."""
        holder = await self._store.fleet_holder(node_id)
        if holder is None or holder == self.instance_id:
            raise NodeNotConnected("Node is not connected")
        body = {"node_id": str(node_id), "action": dict(action), "max_bytes": max_bytes}
        timeout = self._reply_timeout_s if self._reply_timeout_s is not None else command_timeout_s + REPLY_MARGIN_S
        answer = await self._ask(holder, COMMAND, body, timeout)
        if answer is None:
            self.forward_timeouts += 1
            raise CommandTimedOut("Node did not answer within the timeout")
        self.forwarded += 1
        if answer.get("ok"):
            return CommandResult(uuid.UUID(answer["command_id"]), True, answer.get("data"))
        raised: dict[str, type[errors.ApplianceError]] = {
            "NodeNotConnected": NodeNotConnected,
            "CommandTimedOut": CommandTimedOut,
            "CommandFailed": CommandFailed,
            "InvalidCommand": InvalidCommand,
            "CommandTooLarge": CommandTooLarge,
        }
        raise raised.get(str(answer.get("error")), errors.Internal)(str(answer.get("message") or "Command failed"))

    async def forward_disconnect(self, node_id: uuid.UUID) -> bool:
        """Closes the node's socket on the instance holding it; whether one was open."""
        holder = await self._store.fleet_holder(node_id)
        if holder is None or holder == self.instance_id:
            return False
        answer = await self._ask(holder, DISCONNECT, {"node_id": str(node_id)}, DISCONNECT_WAIT_S)
        self._remote.pop(node_id, None)
        return bool(answer and answer.get("opened"))

    async def record_auth_failure(self, identifier: str) -> None:
        """A node's failed ``auth`` on this instance, counted for every instance (interop.md 6
        "Lockout": a guesser spread over the instances behind a load balancer gets no more tries)."""
        try:
            await self._store.record_attempt(AttemptKind.NODE_AUTH, identifier, succeeded=False)
        except errors.ApplianceError as exc:
            _log.warning("fleet: counting a failed node auth failed: %s", exc.message)

    async def locked_out(self, identifier: str) -> bool:
        """Whether the fleet counted the lockout's number of failures for ``identifier`` within
        the last window (a sliding 60 s here; each instance also keeps interop.md 6's fixed window)."""
        try:
            failures = await self._store.count_recent_attempts(
                AttemptKind.NODE_AUTH, identifier, window=timedelta(seconds=LOCKOUT_WINDOW_S), failures_only=True
            )
        except errors.ApplianceError as exc:
            _log.warning("fleet: reading failed node auths failed: %s", exc.message)
            return False
        return failures >= LOCKOUT_MAX_FAILURES

    async def settings_changed(self) -> None:
        """Tells every other instance to re-read the settings."""
        await self._send(None, SETTINGS, {})

    async def _ask(
        self, target: uuid.UUID, kind: str, body: Mapping[str, Any], timeout_s: float
    ) -> dict[str, Any] | None:
        request_id = uuid.uuid4()
        reply = self._replies[request_id] = _Reply()
        try:
            await self._store.fleet_send(
                self.instance_id,
                target,
                kind,
                json.dumps({**body, "request_id": str(request_id)}, separators=(",", ":")),
            )
            with trio.move_on_after(timeout_s):
                await reply.done.wait()
        finally:
            del self._replies[request_id]
        return reply.body


def _remote_node(instance_id: uuid.UUID, view: object) -> RemoteNode | None:
    if not isinstance(view, dict):
        return None
    try:
        status = NodeStatus(str(view.get("status")))
    except ValueError:
        return None
    versions = view.get("versions")
    stats, health = view.get("stats"), view.get("health")
    return RemoteNode(
        instance_id=instance_id,
        status=status,
        stats=stats if isinstance(stats, dict) else None,
        health=health if isinstance(health, dict) else None,
        versions=(str(versions[0]), int(versions[1])) if isinstance(versions, list) and len(versions) == 2 else None,
    )
