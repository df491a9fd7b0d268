"""A node's link to its manager: the trio driver around ``appliance.protocol.NodeSession``.

The edge runs it (``services/edge/manager_link.py``) and the relay will (issue 16): what is
device-specific comes through a :class:`LinkHost` (its credentials and how to persist them, its
stats and health, how it carries out a command); everything else is here once.

Theory of operation
-------------------
:meth:`ManagerClient.run` loops for the life of the process, in a task of its own, so a slow or
dead manager never delays the node's API or its engine:

1. ``host.link_settings()``; None (disabled) → state ``disabled``, wait for :meth:`reconfigure`.
2. TCP, then TLS, then the WebSocket (``connecting``), each bounded by ``connect_timeout_s``.
   TLS (interop.md 2.1): with ``cert_fingerprint`` set, the certificate is accepted when the
   SHA-256 of its DER matches, without any CA or host-name check; else with
   ``accept_self_signed_cert`` and ``MEDIAPLANE_ALLOW_INSECURE=1``, without any check; else
   the system's CAs and the host name.
3. ``auth`` (``registering`` with the token, ``authenticating`` with node id + secret). A
   ``register_ack`` is persisted by the host before anything else (interop.md 6 "Credential
   persistence"); then ``connected``: the backoff is reset, ``health`` goes at once and every
   ``health_interval_s``, ``stats`` every ``stats_interval_s``, queued events in order, and each
   ``command`` is carried out by the host, one at a time in arrival order, and answered.
4. The connection ends (closed, refused, a timeout, no WebSocket pong within
   ``liveness_timeout_s``): the state is ``waiting`` for the backoff's delay (1, 2, 4 … 60 s
   ±10 %), or less when :meth:`reconfigure` is called; then 1.

Events (interop.md 6 "Node client"): :meth:`enqueue_event` puts each event in a queue of at
most 1,000 (the oldest dropped beyond) whatever the state. While connected, a sender sends them
in order and then a WebSocket ping; only the pong, which the manager's WebSocket stack sends
after reading everything before it, takes the events off the queue. An event sent into a
connection that then dies is sent again on the next one: none is lost below the queue limit.
Giving up on a connection resets it (SO_LINGER 0), so the kernel does not also deliver the
unconfirmed events late through the old socket; a duplicate then needs the pong itself to be lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import random
import socket
import ssl
import struct
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import trio
from pydantic import SecretStr
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection, wrap_client_stream

from appliance import errors
from appliance.models.events import Event
from appliance.models.manager_link import LinkState, ManagerLinkStatus
from appliance.protocol import (
    MANAGER_FRAME_MAX_BYTES,
    AnyAction,
    Authenticated,
    AuthRejected,
    AuthTimedOut,
    CommandReceived,
    DeviceType,
    EventPayload,
    EventQueue,
    GetConfig,
    HealthPayload,
    InvalidAction,
    NodeCredentials,
    NodeSession,
    Registered,
    StatsPayload,
    Step,
    UnknownAction,
)
from appliance.protocol.policy import Backoff

__all__ = ["CommandOutcome", "LinkFailure", "LinkHost", "LinkSettings", "ManagerClient"]

_log = logging.getLogger("mediaplane.manager_link")

CONNECT_TIMEOUT_S: Final = 10.0
STATS_INTERVAL_S: Final = 1.0
HEALTH_INTERVAL_S: Final = 15.0  # interop.md 6: health right after auth, then every 15 s
LIVENESS_INTERVAL_S: Final = 5.0
LIVENESS_TIMEOUT_S: Final = 10.0
EVENT_BATCH: Final = 100
ALLOW_INSECURE_ENV: Final = "MEDIAPLANE_ALLOW_INSECURE"
BUSY_ERROR: Final = "Node is busy: too many commands waiting"


@dataclass(frozen=True)
class LinkSettings:
    """What one connection attempt needs, read from the node's config each time."""

    url: str
    credentials: NodeCredentials
    accept_self_signed_cert: bool = False
    cert_fingerprint: str | None = None


@dataclass(frozen=True)
class CommandOutcome:
    """What a command did: the ``command_ack`` fields, or (``config``) a ``config_response``."""

    success: bool
    error: str | None = None
    data: object = None
    config: dict[str, Any] | None = None


class LinkHost(Protocol):
    """What the node running the link provides."""

    device_type: DeviceType
    software_version: str

    def link_settings(self) -> LinkSettings | None:
        """The current settings; None when the link is disabled."""

    async def persist_credentials(self, node_id: str, node_secret: SecretStr) -> None:
        """Keep the credentials of a ``register_ack`` (and drop the token) before anything else."""

    def stats_payload(self) -> StatsPayload:
        """This second's ``stats``."""

    def health_payload(self) -> HealthPayload:
        """The ``health`` to send now."""

    async def run_command(self, action: AnyAction) -> CommandOutcome:
        """Carry out one command (never raises for the node's own errors: they are the ack's text)."""

    def link_event(self, event: Event) -> None:
        """An event of the link itself (category ``manager``), onto the node's event bus."""


async def command_outcome(run: Awaitable[CommandOutcome]) -> CommandOutcome:
    """``run``'s outcome, an :class:`~appliance.errors.ApplianceError` turned into a failed one
    whose text is the error's (the REST error texts, interop.md 6): what every host's
    ``run_command`` does around its actions."""
    try:
        return await run
    except errors.ApplianceError as exc:
        return CommandOutcome(success=False, error=exc.message)


class LinkFailure(Exception):
    """Why a connection attempt failed or a connection ended; ``message`` never holds a secret."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def fingerprint_of(der: bytes) -> str:
    """``AA:BB:…``: the SHA-256 of a DER certificate as colon-separated upper-case hex pairs."""
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


def _normalise_fingerprint(text: str) -> str:
    return text.replace(":", "").strip().lower()


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ManagerClient:
    """One node's link to its manager. ``await run()`` in a nursery; read :meth:`status`."""

    def __init__(
        self,
        host: LinkHost,
        *,
        allow_insecure: bool = False,
        rng: random.Random | None = None,
        wall_clock: Callable[[], datetime] = _utc_now,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        stats_interval_s: float = STATS_INTERVAL_S,
        health_interval_s: float = HEALTH_INTERVAL_S,
        liveness_interval_s: float = LIVENESS_INTERVAL_S,
        liveness_timeout_s: float = LIVENESS_TIMEOUT_S,
        event_capacity: int = 1000,
    ) -> None:
        self._host = host
        self._allow_insecure = allow_insecure
        self._backoff = Backoff(rng or random.Random())
        self._wall_clock = wall_clock
        self._connect_timeout_s = connect_timeout_s
        self._stats_interval_s = stats_interval_s
        self._health_interval_s = health_interval_s
        self._liveness_interval_s = liveness_interval_s
        self._liveness_timeout_s = liveness_timeout_s
        self._events: EventQueue[tuple[int, EventPayload]] = EventQueue(event_capacity)
        self._event_seq = 0
        self._events_ready = trio.Event()
        self._wake = trio.Event()
        self._connection_scope: trio.CancelScope | None = None
        self._state = LinkState.DISABLED
        self._connected_since: datetime | None = None
        self._last_error: str | None = None
        self._last_error_at: datetime | None = None
        self._next_attempt_at: float | None = None
        self._settings: LinkSettings | None = None
        self.events_dropped = 0
        self.connected = trio.Event()
        """Set while connected (replaced by a fresh one when the connection ends)."""

    # ------------------------------------------------------------------ views
    def status(self) -> ManagerLinkStatus:
        """The link now (``GET /api/v1/manager``)."""
        settings = self._host.link_settings()
        credentials = settings.credentials if settings is not None else None
        next_in = None
        if self._state is LinkState.WAITING and self._next_attempt_at is not None:
            next_in = round(max(0.0, self._next_attempt_at - trio.current_time()), 1)
        return ManagerLinkStatus(
            enabled=settings is not None,
            state=self._state,
            manager_url=settings.url if settings is not None else None,
            node_id=credentials.node_id if credentials is not None else None,
            registered=credentials is not None and credentials.uses_node_secret,
            has_registration_token=credentials is not None and credentials.registration_token is not None,
            connected_since=self._connected_since if self._state is LinkState.CONNECTED else None,
            last_error=self._last_error,
            last_error_at=self._last_error_at,
            next_attempt_in_secs=next_in,
            events_queued=len(self._events),
            events_dropped=self.events_dropped,
        )

    # ------------------------------------------------------------------ inputs
    def enqueue_event(self, event: Event | EventPayload) -> None:
        """Queue an event for the manager (an ``EventBus`` listener). Never blocks, never raises."""
        payload = event if isinstance(event, EventPayload) else EventPayload.from_event(event)
        self._event_seq += 1
        if not self._events.put((self._event_seq, payload)):
            self.events_dropped += 1
        self._events_ready.set()

    def reconfigure(self) -> None:
        """The link's settings changed: drop the current connection (if any) and start again now."""
        if self._connection_scope is not None:
            self._connection_scope.cancel()
        self._backoff.reset()
        self._wake.set()

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Connect, serve, reconnect, for as long as the task runs."""
        while True:
            self._wake = trio.Event()
            settings = self._host.link_settings()
            if settings is None:
                self._set_state(LinkState.DISABLED)
                await self._wake.wait()
                continue
            ended_by_reconfigure = False
            reason: str | None = None  # stays None when cancelled from outside: the node is stopping
            try:
                with trio.CancelScope() as scope:
                    self._connection_scope = scope
                    await self._connect_once(settings)
                ended_by_reconfigure = scope.cancelled_caught
                if ended_by_reconfigure:
                    reason = "the link settings changed"
            except (LinkFailure, BaseExceptionGroup) as exc:
                failure = _link_failure(exc)
                if failure is None:
                    raise
                self._failed(failure.message)
                reason = failure.message
            finally:
                self._connection_scope = None
                if self._state is LinkState.CONNECTED:
                    self._lost(reason)
            if ended_by_reconfigure:
                continue
            delay = self._backoff.next_delay()
            self._next_attempt_at = trio.current_time() + delay
            self._set_state(LinkState.WAITING)
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._next_attempt_at = None

    def _set_state(self, state: LinkState) -> None:
        self._state = state

    def _failed(self, message: str) -> None:
        self._last_error = message
        self._last_error_at = self._wall_clock()
        _log.warning("manager link: %s", message)

    def _lost(self, reason: str | None) -> None:
        self.connected = trio.Event()
        self._connected_since = None
        self._set_state(LinkState.WAITING)
        if reason is not None:  # None: the node is stopping, nothing was lost
            self._host.link_event(_manager_event("warning", f"connection to the manager lost: {reason}"))

    # ------------------------------------------------------------------ one connection
    async def _connect_once(self, settings: LinkSettings) -> None:
        self._set_state(LinkState.CONNECTING)
        self._settings = settings
        if not settings.credentials.uses_node_secret and settings.credentials.registration_token is None:
            raise LinkFailure("no registration token and no node id + secret: give the node a registration token")
        target = urllib.parse.urlsplit(settings.url)
        if target.scheme != "wss" or not target.hostname:
            raise LinkFailure("the manager URL must be wss://host[:port]/path")
        host, port = target.hostname, target.port or 443
        resource = target.path or "/"
        if target.query:
            resource += "?" + target.query
        stream = await self._open_tls(host, port, settings)
        try:
            async with trio.open_nursery() as nursery:
                try:
                    with trio.fail_after(self._connect_timeout_s):
                        ws = await wrap_client_stream(
                            nursery,
                            stream,
                            _host_header(host, port),
                            resource,
                            max_message_size=MANAGER_FRAME_MAX_BYTES,
                        )
                except trio.TooSlowError:
                    raise LinkFailure("the manager did not complete the WebSocket handshake in time") from None
                except HandshakeError as exc:
                    raise LinkFailure(f"the manager refused the WebSocket: {type(exc).__name__}") from None
                try:
                    await self._serve(ws, settings)
                except BaseException as exc:
                    if _link_failure(exc) is not None:
                        _reset_on_close(stream)
                    raise
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await ws.aclose()
                nursery.cancel_scope.cancel()
        except ConnectionClosed as exc:
            reason = exc.reason
            shown = f"{reason.code}{_reason_text(reason.reason)}" if reason is not None else "no reason"
            raise LinkFailure(f"the manager closed the connection ({shown})") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise LinkFailure("the connection to the manager broke") from None

    async def _open_tls(self, host: str, port: int, settings: LinkSettings) -> trio.SSLStream[trio.SocketStream]:
        try:
            with trio.fail_after(self._connect_timeout_s):
                tcp = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            raise LinkFailure(f"cannot reach the manager at {host}:{port} (timed out)") from None
        except OSError as exc:
            raise LinkFailure(f"cannot reach the manager at {host}:{port}: {_os_reason(exc)}") from None
        context = self._ssl_context(settings)
        stream = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
        try:
            with trio.fail_after(self._connect_timeout_s):
                await stream.do_handshake()
        except trio.TooSlowError:
            await trio.aclose_forcefully(stream)
            raise LinkFailure("the TLS handshake with the manager timed out") from None
        except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
            await trio.aclose_forcefully(stream)
            cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
            detail = getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or type(cause).__name__
            raise LinkFailure(f"TLS with the manager failed: {detail}") from None
        if settings.cert_fingerprint is not None:
            der = stream.getpeercert(binary_form=True)
            expected = _normalise_fingerprint(settings.cert_fingerprint)
            actual = hashlib.sha256(der or b"").hexdigest()
            if not hmac.compare_digest(expected, actual):
                await trio.aclose_forcefully(stream)
                raise LinkFailure("the manager's certificate does not match cert_fingerprint")
        return stream

    def _ssl_context(self, settings: LinkSettings) -> ssl.SSLContext:
        if settings.cert_fingerprint is not None or (settings.accept_self_signed_cert and self._allow_insecure):
            # interop.md 2.1: a pinned fingerprint is checked after the handshake instead of any
            # CA check; a self-signed certificate is accepted only with MEDIAPLANE_ALLOW_INSECURE=1.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            return context
        return ssl.create_default_context()

    async def _serve(self, ws: WebSocketConnection, settings: LinkSettings) -> None:
        session = NodeSession(
            credentials=settings.credentials,
            software_version=self._host.software_version,
            device_type=self._host.device_type,
            wall_clock=self._wall_clock,
        )
        registering = not settings.credentials.uses_node_secret
        self._set_state(LinkState.REGISTERING if registering else LinkState.AUTHENTICATING)
        await ws.send_message(session.start(trio.current_time()))
        await self._authenticate(ws, session)
        self._backoff.reset()
        self._connected_since = self._wall_clock()
        self._set_state(LinkState.CONNECTED)
        self.connected.set()
        self._host.link_event(_manager_event("info", "connected to the manager"))
        _log.info("manager link: connected to %s", settings.url)
        commands_in, commands_out = trio.open_memory_channel[CommandReceived](64)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, ws, session, commands_in)
            nursery.start_soon(self._run_commands, ws, session, commands_out)
            nursery.start_soon(self._send_periodic, ws, session)
            nursery.start_soon(self._send_events, ws, session)
            nursery.start_soon(self._check_liveness, ws)

    async def _authenticate(self, ws: WebSocketConnection, session: NodeSession) -> None:
        while True:
            deadline = session.deadline()
            with trio.move_on_at(deadline if deadline is not None else trio.current_time()) as scope:
                frame = await ws.get_message()
            step = (
                session.on_timer(trio.current_time())
                if scope.cancelled_caught
                else session.on_frame(frame, trio.current_time())
            )
            for out in step.frames:
                await ws.send_message(out)
            for event in step.events:
                if isinstance(event, Registered):
                    await self._host.persist_credentials(event.node_id, event.node_secret)
                    self._host.link_event(
                        _manager_event("info", f"registered with the manager as node {event.node_id}")
                    )
                elif isinstance(event, AuthRejected):
                    self._host.link_event(_manager_event("critical", f"manager authentication failed: {event.message}"))
                    raise LinkFailure(f"the manager refused authentication: {event.message}")
                elif isinstance(event, AuthTimedOut):
                    raise LinkFailure("the manager did not answer auth within 10 s")
                elif isinstance(event, Authenticated):
                    return
            if step.close is not None:
                raise LinkFailure(f"the manager's reply was not an auth reply ({step.close.reason})")

    async def _read(
        self, ws: WebSocketConnection, session: NodeSession, commands: trio.MemorySendChannel[CommandReceived]
    ) -> None:
        while True:
            frame = await ws.get_message()
            step: Step[Any] = session.on_frame(frame, trio.current_time())
            for out in step.frames:  # pong
                await ws.send_message(out)
            for event in step.events:
                if isinstance(event, CommandReceived):
                    try:
                        commands.send_nowait(event)
                    except trio.WouldBlock:
                        await ws.send_message(
                            session.command_ack(
                                event.command_id, success=False, error="Node is busy: too many commands"
                            )
                        )
                elif isinstance(event, AuthRejected):
                    self._host.link_event(_manager_event("critical", f"manager authentication failed: {event.message}"))
                    raise LinkFailure(f"the manager refused authentication: {event.message}")
            if step.close is not None:
                raise LinkFailure(f"the link closed: {step.close.reason}")

    async def _run_commands(
        self, ws: WebSocketConnection, session: NodeSession, commands: trio.MemoryReceiveChannel[CommandReceived]
    ) -> None:
        async for command in commands:
            frame = await self._answer(session, command)
            await ws.send_message(frame)

    async def _answer(self, session: NodeSession, command: CommandReceived) -> str:
        action = command.action
        if isinstance(action, UnknownAction | InvalidAction):
            return session.command_ack(command.command_id, success=False, error=action.error)
        try:
            outcome = await self._host.run_command(action)
        except Exception:  # a bug in a handler must cost one command, not the link
            _log.exception("manager command %s failed unexpectedly", action.type)
            outcome = CommandOutcome(success=False, error="Internal error")
        if isinstance(action, GetConfig) and outcome.config is not None:
            return session.config_response(outcome.config)
        if outcome.success:
            return session.command_ack(command.command_id, success=True, data=outcome.data)
        return session.command_ack(command.command_id, success=False, error=outcome.error or "Command failed")

    async def _send_periodic(self, ws: WebSocketConnection, session: NodeSession) -> None:
        await ws.send_message(session.health(self._host.health_payload()))
        next_health = trio.current_time() + self._health_interval_s
        next_stats = trio.current_time() + self._stats_interval_s
        while True:
            await trio.sleep_until(min(next_health, next_stats))
            now = trio.current_time()
            if now >= next_stats:
                next_stats = max(next_stats + self._stats_interval_s, now)  # no burst after a stall
                await ws.send_message(session.stats(self._host.stats_payload()))
            if now >= next_health:
                next_health = max(next_health + self._health_interval_s, now)
                await ws.send_message(session.health(self._host.health_payload()))

    async def _send_events(self, ws: WebSocketConnection, session: NodeSession) -> None:
        while True:
            if not len(self._events):
                self._events_ready = trio.Event()
                await self._events_ready.wait()
            batch = list(self._events)[:EVENT_BATCH]
            for _, payload in batch:
                await ws.send_message(session.event(payload))
            await self._confirmed(ws)
            last = batch[-1][0]
            while (head := self._events.peek()) is not None and head[0] <= last:
                self._events.pop()

    async def _check_liveness(self, ws: WebSocketConnection) -> None:
        while True:
            await trio.sleep(self._liveness_interval_s)
            await self._confirmed(ws)

    async def _confirmed(self, ws: WebSocketConnection) -> None:
        """A WebSocket ping and its pong: everything sent before it reached the manager's stack."""
        try:
            with trio.fail_after(self._liveness_timeout_s):
                await ws.ping(uuid.uuid4().bytes)
        except trio.TooSlowError:
            raise LinkFailure(f"no answer from the manager for {self._liveness_timeout_s:g} s") from None


def _link_failure(exc: BaseException) -> LinkFailure | None:
    """The failure a connection ended with, out of the exception groups of its task nurseries.

    None when something else is in there (a bug, or a cancellation from outside): that propagates.
    """
    if isinstance(exc, LinkFailure):
        return exc
    if isinstance(exc, ConnectionClosed):
        reason = exc.reason
        shown = f"{reason.code}{_reason_text(reason.reason)}" if reason is not None else "no reason"
        return LinkFailure(f"the manager closed the connection ({shown})")
    if isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError | OSError):
        return LinkFailure("the connection to the manager broke")
    if isinstance(exc, BaseExceptionGroup):
        found = [_link_failure(inner) for inner in exc.exceptions]
        if all(failure is not None for failure in found):
            return found[0]
    return None


def _reset_on_close(stream: trio.SSLStream[trio.SocketStream]) -> None:
    """Make the coming close a TCP reset (SO_LINGER 0), discarding what the kernel still holds.

    The link gave up on this connection (no pong, a broken path). A plain close would leave the
    kernel retransmitting the unconfirmed events; once the path heals they would reach the
    manager's still-open old socket and be stored, and then again over the new connection. A
    reset drops them here; the new connection sends them once (measured: the blocked-path test
    saw a duplicate without this).
    """
    with contextlib.suppress(OSError, AttributeError):
        stream.transport_stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _os_reason(exc: OSError) -> str:
    """The OS's words for a failed connect. trio reports "all attempts to connect failed" with
    the attempts' errors in an exception group as the cause; the first one's ``strerror`` says
    why ("Connection refused", "No route to host")."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        if isinstance(cause, BaseExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]
        else:
            cause = cause.__cause__
    return type(exc).__name__


def _manager_event(severity: str, message: str) -> Event:
    from appliance.models.events import EventCategory, critical, info, warning

    make: dict[str, Callable[..., Event]] = {"info": info, "warning": warning, "critical": critical}
    return make[severity](EventCategory.MANAGER, message)


def _host_header(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 443 else f"{shown}:{port}"


def _reason_text(reason: str | None) -> str:
    return f": {reason}" if reason else ""
