"""RTMP(S) listeners of one worker process, shared by the flows routed on them (interop.md 2.3).

One listener per distinct ``(host, port, tls)``: the first ``rtmp`` input that needs it binds
it (synchronously, in the driver's ``open``: a busy address is that flow's FlowStartError),
later ones add their :class:`Route`, the last one to leave closes it. The accept loop and the
connections run in a trio *system task* of the listener, so a listener outlives the flow that
opened it.

Per connection: bytes go into a sans-IO :class:`RtmpServerConnection`; a ``publish`` is routed
to the route whose ``(app, stream_key)`` matches (the key compared with
``hmac.compare_digest``; a route without a key takes any key of its app). Up to
``max_publishers`` publishers may hold a route: the oldest feeds the flow, the others stand by
and the oldest standby takes over when the active one leaves (its converter restarts from the
sequence headers it sent, from the next keyframe). A publisher over the limit, a wrong key or
an unknown app gets an onStatus error (clean reject) and the connection is closed.

Bounds: ``MAX_CONNECTIONS`` per listener (more are closed at once), ``IDLE_TIMEOUT_S`` without
a byte (before or after publishing) closes a connection, ``SEND_TIMEOUT_S`` on every write,
``TLS_HANDSHAKE_TIMEOUT_S``, 64 KiB reads; the RTMP core bounds its own buffers.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import trio

from appliance.models.events import Event, EventCategory, critical, info, warning
from services.edge.core.mux.from_flv import FlvToTs
from services.edge.core.rtmp import (
    AudioData,
    AudioTag,
    PacketKind,
    ProtocolError,
    PublishRequested,
    RtmpServerConnection,
    StreamEnded,
    VideoData,
    VideoTag,
)
from services.edge.core.rtmp import Event as RtmpEvent
from services.edge.engine.udp import FlowStartError

from . import tls as rtmp_tls

if TYPE_CHECKING:  # kinds/ imports this module: no import cycle at run time
    from services.edge.engine.kinds.base import FlowPort

_log = logging.getLogger("mediaplane.engine")
MAX_CONNECTIONS: Final = 64
IDLE_TIMEOUT_S: Final = 10.0
SEND_TIMEOUT_S: Final = 10.0
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
RECEIVE_SIZE: Final = 65536
ACCEPT_RETRY_S: Final = 0.5
UNROUTED_EVENT_EVERY_S: Final = 10.0  # warnings of connections that never named an app: rate-limited
_NETWORK_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError)


def _peer_text(stream: trio.SocketStream) -> str:
    try:
        addr = stream.socket.getpeername()
    except OSError:
        return "?"
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Publisher:
    """One accepted publication: its peer, its connection's cancel scope, its converter."""

    def __init__(self, peer: str, scope: trio.CancelScope) -> None:
        self.peer = peer
        self.scope = scope
        self.converter: FlvToTs | None = None
        self.video_header: VideoTag | None = None
        self.audio_header: AudioTag | None = None
        self.since = time.monotonic()


class Route:
    """One flow's ``(app, stream_key)`` on a listener and its publishers (``[0]`` is active)."""

    def __init__(self, flow: FlowPort, app: str, stream_key: str | None, max_publishers: int) -> None:
        self.flow = flow
        self.app = app
        self._key = stream_key.encode() if stream_key is not None else None
        self.max_publishers = max_publishers
        self.publishers: list[Publisher] = []
        self.datagrams = 0

    @property
    def keyed(self) -> bool:
        return self._key is not None

    @property
    def active(self) -> Publisher | None:
        return self.publishers[0] if self.publishers else None

    def matches(self, app: str, key: str) -> bool:
        return app == self.app and (self._key is None or hmac.compare_digest(self._key, key.encode()))

    def attach(self, publisher: Publisher) -> bool:
        if len(self.publishers) >= self.max_publishers:
            return False
        self.publishers.append(publisher)
        if len(self.publishers) == 1:
            publisher.converter = FlvToTs()
        return True

    def detach(self, publisher: Publisher) -> None:
        if publisher not in self.publishers:
            return
        was_active = self.publishers[0] is publisher
        if was_active:
            self.flush(publisher)  # the last short datagram: the end of the last PES
        self.publishers.remove(publisher)
        publisher.converter = None
        if was_active and self.publishers:
            self._promote(self.publishers[0])

    def _promote(self, publisher: Publisher) -> None:
        """A standby takes over: a fresh converter primed with its sequence headers."""
        converter = publisher.converter = FlvToTs()
        if publisher.video_header is not None:
            converter.push_video(0, publisher.video_header)
        if publisher.audio_header is not None:
            converter.push_audio(0, publisher.audio_header)
        self.event(info(EventCategory.RTMP, f"RTMP standby publisher {publisher.peer} takes over", peer=publisher.peer))

    def media(self, publisher: Publisher, event: VideoData | AudioData) -> None:
        tag = event.tag
        if tag.packet is PacketKind.SEQUENCE_HEADER:
            if isinstance(tag, VideoTag):
                publisher.video_header = tag
            else:
                publisher.audio_header = tag
        converter = publisher.converter
        if converter is None:  # a standby: only its sequence headers are kept
            return
        if isinstance(event, VideoData):
            out = converter.push_video(event.timestamp, event.tag)
        else:
            out = converter.push_audio(event.timestamp, event.tag)
        if out:
            self._deliver(out)

    def flush(self, publisher: Publisher) -> None:
        if publisher.converter is not None:
            out = publisher.converter.flush()
            if out:
                self._deliver(out)
                self.end_batch()

    def _deliver(self, datagrams: list[bytes]) -> None:
        flow = self.flow
        arrival = time.monotonic()
        try:
            for datagram in datagrams:
                flow.on_ts(0, memoryview(datagram), arrival)
            self.datagrams += len(datagrams)
        except Exception as exc:  # the flow boundary: count and report, keep the connection
            flow.internal_error("rtmp input", exc)

    def end_batch(self) -> None:
        try:
            self.flow.end_batch()
        except Exception as exc:
            self.flow.internal_error("rtmp input", exc)

    def event(self, event: Event) -> None:
        self.flow.publish(event.model_copy(update={"flow_id": self.flow.flow_id}))

    def close(self) -> None:
        """The flow leaves: every publisher's connection is closed."""
        for publisher in self.publishers:
            publisher.scope.cancel()
        self.publishers.clear()


class RtmpListener:
    """One bound TCP socket speaking RTMP or RTMPS, and the routes of the flows on it."""

    def __init__(self, host: str, port: int, tls: bool) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.key = (host, port, tls)
        self.routes: list[Route] = []
        self.connections = 0
        self._sock: trio.socket.SocketType | None = None
        self._scope = trio.CancelScope()
        self._ssl: ssl.SSLContext | None = None
        self._unrouted_event_at = -UNROUTED_EVENT_EVERY_S
        self.closed = False

    def open(self) -> None:
        """Bind and listen now (FlowStartError with a user-facing text when it cannot)."""
        if self.tls:
            self._ssl = rtmp_tls.server_context()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(MAX_CONNECTIONS)
        except OSError as exc:
            sock.close()
            what = "RTMPS" if self.tls else "RTMP"
            raise FlowStartError(f"cannot listen for {what} on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        self._sock = trio.socket.from_stdlib_socket(sock)
        trio.lowlevel.spawn_system_task(self._run, name=f"rtmp listener {self.host}:{self.port}")

    def close(self) -> None:
        self.closed = True
        self._scope.cancel()
        if self._sock is not None:
            self._sock.close()  # now, so a flow restarted at once can bind the address again

    # ------------------------------------------------------------------ the system task

    async def _run(self) -> None:
        assert self._sock is not None
        listener = trio.SocketListener(self._sock)
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    while True:
                        try:
                            stream = await listener.accept()
                        except trio.ClosedResourceError:
                            return
                        except OSError as exc:  # EMFILE, ENOBUFS...: say so, breathe, go on
                            self._broadcast(critical, f"RTMP listener {self.host}:{self.port}: accept failed: {exc}")
                            await trio.sleep(ACCEPT_RETRY_S)
                            continue
                        if self.connections >= MAX_CONNECTIONS:
                            await trio.aclose_forcefully(stream)
                            continue
                        self.connections += 1
                        nursery.start_soon(self._connection, stream)
        except Exception as exc:  # a system task must not raise: the worker would end
            _log.exception("RTMP listener %s:%d failed", self.host, self.port)
            self._broadcast(critical, f"RTMP listener {self.host}:{self.port} failed: {exc}")
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()

    def _broadcast(self, make: Callable[..., Event], message: str) -> None:
        for route in self.routes:
            route.event(make(EventCategory.RTMP, message))

    def _routes_of_app(self, app: str | None) -> list[Route]:
        return [r for r in self.routes if r.app == app]

    def warn(self, app: str | None, message: str, peer: str) -> None:
        """A publisher error: on the flows of the app, else (rate-limited) on every flow here."""
        routes = self._routes_of_app(app)
        if not routes:
            now = time.monotonic()
            if now - self._unrouted_event_at < UNROUTED_EVENT_EVERY_S:
                _log.debug("rtmp %s: %s", peer, message)
                return
            self._unrouted_event_at = now
            routes = self.routes
        for route in routes:
            route.event(warning(EventCategory.RTMP, message, peer=peer))

    async def _connection(self, tcp: trio.SocketStream) -> None:
        session = _Session(self, _peer_text(tcp))
        stream: trio.abc.Stream = tcp
        try:
            with session.scope:
                try:
                    if self._ssl is not None:
                        stream = trio.SSLStream(tcp, self._ssl, server_side=True)
                        with _within(TLS_HANDSHAKE_TIMEOUT_S, "no TLS handshake in {:g} s; closed"):
                            await stream.do_handshake()
                    await session.run(stream)
                except ProtocolError as exc:
                    session.warn(f"protocol error: {exc}")
                except _Stalled as exc:
                    session.warn(str(exc))
                except _NETWORK_ERRORS as exc:
                    if session.publishing:
                        session.warn(f"connection lost ({exc})")
        finally:
            self.connections -= 1
            session.leave()
            await trio.aclose_forcefully(stream)

    def route_of(self, conn: RtmpServerConnection, request: PublishRequested, peer: str) -> Route | None:
        """The route of a publish request, or None after a clean reject (and a warning)."""
        for route in self.routes:
            if route.matches(request.app, request.stream_key):
                return route
        routes = self._routes_of_app(request.app)
        if routes:
            conn.reject_publish("unknown stream key", request.stream_id)
            for route in routes:
                route.event(
                    warning(
                        EventCategory.RTMP,
                        f"RTMP publisher {peer} refused: wrong stream key for app '{request.app}'",
                        peer=peer,
                    )
                )
        else:
            conn.reject_publish("unknown application", request.stream_id)
            _log.info("rtmp %s: publish to unknown app %r refused", peer, request.app)
        return None

    def refuse(self, conn: RtmpServerConnection, route: Route, request: PublishRequested, peer: str) -> None:
        conn.reject_publish(
            f"max_publishers ({route.max_publishers}) reached",
            request.stream_id,
            code="NetStream.Publish.BadConnection",
        )
        route.event(
            warning(
                EventCategory.RTMP,
                f"RTMP publisher {peer} refused: max_publishers ({route.max_publishers}) reached",
                peer=peer,
            )
        )


class _Stalled(Exception):
    """A connection that stopped: no data, no TLS handshake, or not reading (the warning text)."""


@contextlib.contextmanager
def _within(seconds: float, text: str) -> Iterator[None]:
    """``trio.fail_after(seconds)``, raising :class:`_Stalled` with ``text`` (``{}``: the seconds)
    so that each timeout is reported as what it was."""
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError:
        raise _Stalled(text.format(seconds)) from None


class _Session:
    """One connection: its sans-IO RTMP end, and the publication it holds (route + publisher)."""

    def __init__(self, listener: RtmpListener, peer: str) -> None:
        self.listener = listener
        self.peer = peer
        self.conn = RtmpServerConnection()
        self.scope = trio.CancelScope()
        self.route: Route | None = None
        self.publisher: Publisher | None = None

    @property
    def publishing(self) -> bool:
        return self.publisher is not None

    async def run(self, stream: trio.abc.Stream) -> None:
        """Read, answer, feed: until the peer closes, is rejected, or breaks a bound."""
        conn = self.conn
        while not conn.closed:
            with _within(IDLE_TIMEOUT_S, "no data for {:g} s; closed"):
                data = await stream.receive_some(RECEIVE_SIZE)
            for event in conn.receive_data(data):
                self._on_event(event)
            route = self.route
            if route is not None and route.active is self.publisher:
                route.end_batch()
            out = conn.data_to_send()
            if out:
                with _within(SEND_TIMEOUT_S, "not reading (a write waited {:g} s); closed"):
                    await stream.send_all(out)
            if not data:
                break
        if self.publishing:
            self.warn("disconnected without ending its stream")

    def _on_event(self, event: RtmpEvent) -> None:
        route, publisher = self.route, self.publisher
        if isinstance(event, (VideoData, AudioData)):
            if route is not None and publisher is not None:
                route.media(publisher, event)
        elif isinstance(event, PublishRequested):
            self._on_publish(event)
        elif isinstance(event, StreamEnded) and route is not None and publisher is not None:
            self.leave()
            route.event(info(EventCategory.RTMP, f"RTMP publisher {self.peer} ended", peer=self.peer))

    def _on_publish(self, request: PublishRequested) -> None:
        conn, peer = self.conn, self.peer
        if self.publisher is not None:
            conn.reject_publish("one publication per connection", request.stream_id)
            return
        route = self.listener.route_of(conn, request, peer)
        if route is None:
            return
        publisher = Publisher(peer, self.scope)
        if not route.attach(publisher):
            self.listener.refuse(conn, route, request, peer)
            return
        conn.accept_publish(request.stream_id)
        self.route, self.publisher = route, publisher
        role = "active" if route.active is publisher else "standby"
        key = "accepted" if route.keyed else "any"
        route.event(info(EventCategory.RTMP, f"RTMP publisher {peer} connected ({role}, stream key {key})", peer=peer))

    def warn(self, what: str) -> None:
        """A publisher error: on this publication's flow, else on the flows of the app."""
        message = f"RTMP publisher {self.peer}: {what}"
        if self.route is not None:
            self.route.event(warning(EventCategory.RTMP, message, peer=self.peer))
        else:
            self.listener.warn(self.conn.app, message, self.peer)

    def leave(self) -> None:
        if self.route is not None and self.publisher is not None:
            self.route.detach(self.publisher)
        self.route, self.publisher = None, None


# ---------------------------------------------------------------------------- the registry

_LISTENERS: dict[tuple[str, int, bool], RtmpListener] = {}


def join(host: str, port: int, tls: bool, route: Route) -> RtmpListener:
    """The listener on ``(host, port, tls)`` with ``route`` added; binds it when it is the first."""
    listener = _LISTENERS.get((host, port, tls))
    if listener is None or listener.closed:
        listener = RtmpListener(host, port, tls)
        listener.open()
        _LISTENERS[listener.key] = listener
    listener.routes.append(route)
    return listener


def leave(listener: RtmpListener, route: Route) -> None:
    """Remove ``route`` (closing its publishers); the last route to leave closes the listener."""
    if route in listener.routes:
        listener.routes.remove(route)
    route.close()
    if not listener.routes and not listener.closed:
        listener.close()
        if _LISTENERS.get(listener.key) is listener:
            del _LISTENERS[listener.key]


def listeners() -> dict[tuple[str, int, bool], RtmpListener]:
    """The open listeners of this process (tests, diagnostics)."""
    return dict(_LISTENERS)
