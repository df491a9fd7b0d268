"""The ``rtsp`` input kind: pull a camera's stream over RTSP 1.0 (RFC 2326; interop.md 2.3).

A thin trio driver around two sans-IO cores: ``core.rtsp.RtspClient`` (the RTSP dialogue:
OPTIONS, DESCRIBE, SETUP per track, PLAY, keep-alives, Basic/Digest auth, ``$`` framing) and
``core.depay.MediaSession`` (RTP depacketising, RTCP, lip sync, and the TS muxer). The driver
owns the TCP (or TLS, ``rtsps://``) connection, the UDP sockets of ``transport: udp``, and the
timers; the flow gets 1316-byte MPEG-TS datagrams as from any raw-TS input.

One session at a time, retried forever ``reconnect_delay_secs`` after it ends:

* the dialogue up to PLAY must finish within ``timeout_secs`` of the TCP connect;
* a playing session with no RTP for ``timeout_secs`` is over ("no media for N s");
* a keep-alive (GET_PARAMETER, or OPTIONS) goes out every half session timeout (RFC 2326
  §12.37: the server may drop a session that is silent for its ``timeout``), and an RTCP
  receiver report per track every ``RTCP_INTERVAL_S`` (RFC 3550 §6.2 allows 5 s);
* on a flow stop the session is closed with TEARDOWN (best effort, ``TEARDOWN_GRACE_S``).

The TS muxer lives across sessions, so a reconnect continues the same transport stream
(continuity counters, timestamps) rather than restarting it.

``state``: ``connecting`` (first attempt), ``connected`` (playing, no media for 2 s),
``receiving``, ``reconnecting``, ``auth_failed`` (the camera refused the credentials: still
retried, a camera's account may be fixed without touching the flow). Events (category
``rtsp``, interop.md 11): connected (info); disconnected and reconnecting, or a failed
attempt, once per outage (warning). The camera's credentials (``username``/``password``, or
``user:pass@`` in the URL) never appear in an event, log line or state text.
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final
from urllib.parse import urlsplit

import trio

from appliance import __version__
from appliance.models.config import RtspInput
from appliance.models.events import Event, EventCategory, info, warning
from appliance.models.stats import RtspStats
from appliance.netio import BatchReceiver
from services.edge.core.depay import MediaSession, TrackSpec
from services.edge.core.rtsp import (
    Described,
    Failed,
    InterleavedData,
    Playing,
    RtspClient,
    RtspProtocolError,
    Track,
    TrackReady,
)
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.kinds.dial import DialError, dial
from services.edge.engine.udp import FlowStartError

_log = logging.getLogger("mediaplane.engine")

DEFAULT_PORTS: Final = {"rtsp": 554, "rtsps": 322}  # RFC 2326 §3.2; rtsps: IANA port 322
RECEIVE_SIZE: Final = 65536
RTCP_INTERVAL_S: Final = 5.0
TEARDOWN_GRACE_S: Final = 1.0
RECEIVING_WINDOW_S: Final = 2.0  # media within this: ``receiving``, else ``connected``
UDP_PORT_ATTEMPTS: Final = 64  # tries at an even/odd RTP/RTCP port pair (RFC 3550 §11)
UDP_RCVBUF: Final = 4 * 1024 * 1024  # ~4 s of a 8 Mbit/s camera: a busy worker loses nothing
UDP_BATCH: Final = 64  # datagrams per recvmmsg
_CODEC_LABELS: Final = {"h264": "H.264", "hevc": "H.265", "aac": "AAC"}


class RtspSessionError(Exception):
    """A session could not start or ended; ``str()`` is a user-facing text without secrets."""

    def __init__(self, reason: str, *, auth: bool = False) -> None:
        super().__init__(reason)
        self.auth = auth


@dataclass(frozen=True, slots=True)
class RtspTarget:
    """Where the camera is: from ``rtsp_url`` (user info left out)."""

    scheme: str
    host: str
    port: int
    display: str  # ``rtsp(s)://host:port/path`` for events (no user info, no query)

    @property
    def tls(self) -> bool:
        return self.scheme == "rtsps"

    @property
    def peer(self) -> str:
        """``host:port`` (IPv6 in brackets), the input's ``peer_addr``."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_target(url: str) -> RtspTarget:
    """The server of an ``rtsp://`` / ``rtsps://`` URL; ValueError when it has none."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("rtsp_url must be rtsp:// or rtsps://")
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        raise ValueError("rtsp_url has an invalid port") from None
    if not host:
        raise ValueError("rtsp_url has no host")
    shown = f"[{host}]" if ":" in host else host
    return RtspTarget(scheme, host, port, f"{scheme}://{shown}:{port}{parts.path}")


@dataclass(slots=True)
class _TrackRoute:
    """One SETUP track: how its RTP and RTCP arrive and where RTCP reports go."""

    index: int
    interleaved: tuple[int, int] | None = None
    rtp_socket: socket.socket | None = None  # non-blocking, drained with recvmmsg
    rtcp_socket: socket.socket | None = None
    server_rtcp: tuple[str, int] | None = None
    sources: frozenset[str] = frozenset()  # where its UDP media may come from


@dataclass(slots=True)
class _Session:
    """The state of one RTSP session (one TCP connection)."""

    client: RtspClient
    stream: trio.abc.Stream
    server_ip: str
    local_ip: str
    lock: trio.StrictFIFOLock = field(default_factory=trio.StrictFIFOLock)
    tracks: dict[int, Track] = field(default_factory=dict)  # chosen, by index
    routes: dict[int, _TrackRoute] = field(default_factory=dict)
    channels: dict[int, tuple[int, bool]] = field(default_factory=dict)  # $ channel -> (track, is_rtcp)
    playing: bool = False
    codecs: str = ""


class RtspInputDriver:
    """An ``rtsp`` input: one RTSP session to the camera at a time, reconnected forever."""

    def __init__(self, config: RtspInput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.target: RtspTarget | None = None
        self.media = MediaSession(our_ssrc=secrets.randbits(32) or 1, cname=f"mediaplane-{flow.flow_id}")
        self._state = "connecting"
        self._playing = False  # the current session is past PLAY
        self._played = False  # the session that just ended delivered media
        self._warned = False  # a warning went out since media last flowed (one per outage)
        self._announce: _Session | None = None  # a playing session whose first RTP is awaited
        self._last_media = float("-inf")  # trio clock of the last RTP packet
        self.connections = 0
        self.last_error: str | None = None
        parts = urlsplit(config.rtsp_url)
        self._secrets = [s for s in (config.password, parts.password) if s]
        self._secrets += [f"{parts.username}:{parts.password}"] if parts.username and parts.password else []
        self._scope = trio.CancelScope()

    # ------------------------------------------------------------------ the flow's side

    def open(self) -> None:
        """Check the URL (nothing to bind: the camera is dialled in ``serve``)."""
        try:
            self.target = parse_target(self.config.rtsp_url)
        except ValueError as exc:
            raise FlowStartError(f"rtsp input: {exc}") from None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ready at once (after ``open``); then connect, play, and reconnect after every end."""
        with self._scope:
            task_status.started()
            await self._run()

    def state(self, now_monotonic: float) -> str:
        if self._playing:
            if self._announce is not None:
                return "connected"  # PLAY answered, no RTP yet: not "receiving" before a packet came
            return "receiving" if trio.current_time() - self._last_media < RECEIVING_WINDOW_S else "connected"
        return self._state

    def extra_counters(self) -> dict[str, Any]:
        stats = self.media.stats
        return {
            "packets_lost": stats.rtp_lost,
            "peer_addr": self.target.peer if self.target is not None else None,
            "rtsp_stats": RtspStats(
                transport=self.config.transport,
                video_codec=stats.video_codec,
                audio_codec=stats.audio_codec,
                rtp_packets=stats.rtp_packets,
                rtp_lost=stats.rtp_lost,
                units_dropped=stats.units_dropped,
                connections=self.connections,
                last_error=self.last_error,
            ),
        }

    def close(self) -> None:
        self._scope.cancel()

    # ------------------------------------------------------------------ texts

    def redact(self, text: str) -> str:
        """``text`` with every credential replaced (a camera or library may echo them)."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _event(self, make: Callable[..., Event], message: str) -> None:
        self.flow.publish(make(EventCategory.RTSP, self.redact(f"RTSP input: {message}"), flow_id=self.flow.flow_id))

    # ------------------------------------------------------------------ the session loop

    async def _run(self) -> None:
        assert self.target is not None
        delay = self.config.reconnect_delay_secs
        while True:
            self._played = False
            self._announce = None
            auth = False
            try:
                await self._session()
                reason = "the server closed the connection"
            except RtspSessionError as exc:
                reason, auth = str(exc), exc.auth
            finally:
                self._playing = False
                if self._deliver(self.media.flush()):
                    self._end_batch()  # the tail reaches the outputs now, not a reconnect later
            reason = self.redact(reason)
            self.last_error = reason
            if self._played:
                self._event(warning, f"disconnected from {self.target.display} ({reason}); reconnecting in {delay} s")
                self._warned = True
            elif not self._warned:  # one warning per outage; the retries are logged at debug
                self._event(warning, f"connection to {self.target.display} failed ({reason}); retrying every {delay} s")
                self._warned = True
            else:
                _log.debug("flow %s rtsp input: %s", self.flow.flow_id, reason)
            self._state = "auth_failed" if auth else "reconnecting"
            await trio.sleep(delay)

    async def _open(self) -> tuple[trio.abc.Stream, str, str]:
        """TCP (and TLS for rtsps) to the camera: ``(stream, server ip, local ip)``."""
        target = self.target
        assert target is not None
        try:
            stream, tcp = await dial(target.host, target.port, tls=target.tls)
        except DialError as exc:
            raise RtspSessionError(str(exc)) from None
        return stream, tcp.socket.getpeername()[0], tcp.socket.getsockname()[0]

    async def _session(self) -> None:
        """One session: connect, DESCRIBE/SETUP/PLAY within ``timeout_secs``, then receive until
        it breaks (RtspSessionError) or the server closes (return)."""
        timeout = self.config.timeout_secs
        with trio.move_on_after(timeout) as connect_scope:
            stream, server_ip, local_ip = await self._open()
        if connect_scope.cancelled_caught:
            raise RtspSessionError(f"no connection within {timeout} s")
        client = RtspClient(
            self.config.rtsp_url,
            username=self.config.username,
            password=self.config.password,
            transport=self.config.transport,
            user_agent=f"Mediaplane/{__version__}",
            cnonce=lambda: secrets.token_hex(8),
        )
        session = _Session(client, stream, server_ip, local_ip)
        failures: list[RtspSessionError] = []
        try:
            async with trio.open_nursery() as nursery:

                async def guarded(run: Callable[[], Awaitable[None]]) -> None:
                    try:
                        await run()
                    except RtspSessionError as exc:
                        failures.append(exc)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(guarded, partial(self._dialogue, session, nursery))
                nursery.start_soon(guarded, partial(self._handshake_deadline, session, timeout))
        finally:
            self._playing = False
            await self._teardown(session)  # best effort: frees the camera's session at once
            for route in session.routes.values():
                for sock in (route.rtp_socket, route.rtcp_socket):
                    if sock is not None:
                        sock.close()
            await trio.aclose_forcefully(stream)
        if failures:
            raise failures[0]

    async def _handshake_deadline(self, session: _Session, timeout: int) -> None:
        """PLAY within ``timeout`` of the connect; after it, RTP at least every ``timeout``."""
        await trio.sleep(timeout)
        if not session.playing:
            raise RtspSessionError(f"the camera did not start playing within {timeout} s")
        while True:
            due = self._last_media + timeout
            if trio.current_time() >= due:
                raise RtspSessionError(f"no media for {timeout} s")
            await trio.sleep_until(due)

    async def _teardown(self, session: _Session) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(TEARDOWN_GRACE_S):
            session.client.teardown()
            try:
                await self._write(session)
            except RtspSessionError:
                pass

    async def _write(self, session: _Session) -> None:
        # Taken before the lock, in call order; the FIFO lock keeps that order on the wire
        # (and the common case, nothing to send after a read of RTP, costs no lock round).
        data = session.client.data_to_send()
        if not data:
            return
        async with session.lock:
            try:
                await session.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise RtspSessionError(f"send failed: {exc.__cause__ or exc}") from None

    async def _dialogue(self, session: _Session, nursery: trio.Nursery) -> None:
        """Read the RTSP connection: replies drive the client; ``$`` frames carry RTP/RTCP."""
        client = session.client
        client.start()
        await self._write(session)
        while True:
            try:
                data = await session.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise RtspSessionError(f"receive failed: {exc.__cause__ or exc}") from None
            if not data:
                return  # the server closed the connection
            try:
                events = client.receive_data(bytes(data))
            except RtspProtocolError as exc:
                raise RtspSessionError(f"protocol error: {exc}") from None
            arrival = time.monotonic()
            delivered = False
            for event in events:
                if isinstance(event, InterleavedData):
                    delivered |= self._on_interleaved(session, event)
                elif isinstance(event, Described):
                    await self._on_described(session, event, arrival)
                elif isinstance(event, TrackReady):
                    self._on_track_ready(session, event)
                elif isinstance(event, Playing):
                    self._on_playing(session, event, nursery)
                elif isinstance(event, Failed):
                    raise RtspSessionError(event.reason, auth=event.auth)
            if delivered:
                self._end_batch()
            await self._write(session)

    # ------------------------------------------------------------------ dialogue steps

    async def _on_described(self, session: _Session, event: Described, arrival: float) -> None:
        specs = [TrackSpec(t.index, t.media, t.encoding, t.clock_rate, t.channels, t.fmtp) for t in event.tracks]
        try:
            chosen = self.media.begin(specs, arrival)
        except ValueError as exc:
            raise RtspSessionError(str(exc)) from None
        by_index = {t.index: t for t in event.tracks}
        tracks = [by_index[i] for i in chosen]
        session.tracks = {t.index: t for t in tracks}
        session.routes = {t.index: _TrackRoute(t.index) for t in tracks}
        ports: list[tuple[int, int]] | None = None
        if self.config.transport == "udp":
            ports = [self._bind_pair(session, session.routes[t.index]) for t in tracks]
        session.client.setup(tracks, ports)

    def _bind_pair(self, session: _Session, route: _TrackRoute) -> tuple[int, int]:
        """An even RTP port and the odd one above it (RFC 3550 §11), on the TCP connection's
        local address (the camera sends to the interface it is reached through)."""
        family = socket.AF_INET6 if ":" in session.local_ip else socket.AF_INET
        for _ in range(UDP_PORT_ATTEMPTS):
            rtp = socket.socket(family, socket.SOCK_DGRAM)
            rtcp = socket.socket(family, socket.SOCK_DGRAM)
            try:
                rtp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RCVBUF)
                rtp.bind((session.local_ip, 0))
                port = rtp.getsockname()[1]
                if port % 2:
                    raise OSError("odd port")
                rtcp.bind((session.local_ip, port + 1))
            except OSError:
                rtp.close()
                rtcp.close()
                continue
            rtp.setblocking(False)
            rtcp.setblocking(False)
            route.rtp_socket, route.rtcp_socket = rtp, rtcp
            return port, port + 1
        raise RtspSessionError("no free UDP port pair for RTP/RTCP")

    def _on_track_ready(self, session: _Session, event: TrackReady) -> None:
        route = session.routes.get(event.track.index)
        if route is None:
            return
        if event.interleaved is not None:
            route.interleaved = event.interleaved
            session.channels[event.interleaved[0]] = (route.index, False)
            session.channels[event.interleaved[1]] = (route.index, True)
        if event.server_ports is not None:
            route.server_rtcp = (event.source or session.server_ip, event.server_ports[1])
        # RFC 2326 §12.39: ``source`` names the sender when it is not the RTSP server itself.
        route.sources = frozenset({session.server_ip, event.source or session.server_ip})

    def _on_playing(self, session: _Session, event: Playing, nursery: trio.Nursery) -> None:
        for index, track in session.tracks.items():
            seq, rtptime = event.rtp_info.get(track.control_url, (None, None))
            self.media.set_rtp_info(index, seq, rtptime)
        session.playing = True
        self._playing = True
        self._last_media = trio.current_time()
        self.connections += 1
        labels = [_CODEC_LABELS.get(c or "", c) for c in (self.media.stats.video_codec, self.media.stats.audio_codec)]
        session.codecs = " + ".join(label for label in labels if label)
        self._announce = session  # "connected" goes out with the first RTP: a camera that
        # answers PLAY and sends nothing stays one outage, not a connect/disconnect pair per try
        nursery.start_soon(self._keepalive, session, event.session_timeout)
        nursery.start_soon(self._reports, session)
        for route in session.routes.values():
            for sock, is_rtcp in ((route.rtp_socket, False), (route.rtcp_socket, True)):
                if sock is not None:
                    nursery.start_soon(self._receive_udp, route, sock, is_rtcp)

    def _announce_connected(self, session: _Session) -> None:
        self._announce = None
        self._played = True
        self._warned = False
        assert self.target is not None
        via = "TCP (interleaved)" if self.config.transport == "tcp" else "UDP"
        self._event(info, f"connected to {self.target.display} ({session.codecs or 'no media'} over {via})")

    # ------------------------------------------------------------------ media

    def _on_interleaved(self, session: _Session, event: InterleavedData) -> bool:
        where = session.channels.get(event.channel)
        if where is None:
            return False  # a channel not set up (some servers send on others): ignored
        index, is_rtcp = where
        return self._on_media(index, is_rtcp, event.data, time.monotonic())

    def _on_media(self, index: int, is_rtcp: bool, data: bytes | memoryview, arrival: float) -> bool:
        """One RTP or RTCP packet of track ``index`` (``arrival`` on the flow's monotonic clock)."""
        try:
            if is_rtcp:
                self.media.on_rtcp(index, data, arrival)
                return False
            self._last_media = trio.current_time()
            if self._announce is not None:
                self._announce_connected(self._announce)
            return self._deliver(self.media.on_rtp(index, data, arrival))
        except Exception as exc:  # the flow boundary: count and report, keep the session
            self.flow.internal_error("rtsp input", exc)
            return False

    def _deliver(self, datagrams: list[bytes]) -> bool:
        if not datagrams:
            return False
        flow = self.flow
        arrival = time.monotonic()
        try:
            for datagram in datagrams:
                flow.on_ts(0, memoryview(datagram), arrival)
        except Exception as exc:
            flow.internal_error("rtsp input", exc)
        return True

    def _end_batch(self) -> None:
        try:
            self.flow.end_batch()
        except Exception as exc:
            self.flow.internal_error("rtsp input", exc)

    async def _receive_udp(self, route: _TrackRoute, sock: socket.socket, is_rtcp: bool) -> None:
        """``transport: udp``: RTP or RTCP of one track, from the camera's addresses only; every
        datagram waiting is taken per wakeup (recvmmsg), then the flow ends one batch."""
        receiver = BatchReceiver(sock, batch=UDP_BATCH, timestamps=True, clock_offset=self.flow.realtime_offset)
        while True:
            await trio.lowlevel.wait_readable(sock)
            delivered = False
            while True:
                try:
                    count = receiver.recv_batch()
                except OSError as exc:
                    raise RtspSessionError(f"UDP receive failed: {exc.strerror or exc}") from None
                if count == 0:
                    break
                for view, arrival, source in zip(receiver.views, receiver.arrivals, receiver.sources, strict=False):
                    if source[0] in route.sources:  # not the camera: a stray or spoofed datagram
                        delivered |= self._on_media(route.index, is_rtcp, bytes(view), arrival)
                if count < UDP_BATCH:
                    break
                await trio.lowlevel.checkpoint()  # a full batch: let the other flows run
            if delivered:
                self._end_batch()

    async def _keepalive(self, session: _Session, timeout: float) -> None:
        interval = max(1.0, timeout / 2)
        while True:
            await trio.sleep(interval)
            session.client.keepalive()
            await self._write(session)

    async def _reports(self, session: _Session) -> None:
        """RTCP receiver reports (RFC 3550 §6.4.2): a camera may end a session without them."""
        while True:
            await trio.sleep(RTCP_INTERVAL_S)
            reports = self.media.receiver_reports(time.monotonic())
            for index, report in reports.items():
                route = session.routes.get(index)
                if route is None:
                    continue
                if route.interleaved is not None:
                    session.client.send_interleaved(route.interleaved[1], report)
                elif route.rtcp_socket is not None and route.server_rtcp is not None:
                    try:
                        route.rtcp_socket.sendto(report, route.server_rtcp)  # non-blocking
                    except OSError:
                        pass  # a report is advisory; the session goes on
            await self._write(session)


__all__ = ["DEFAULT_PORTS", "RtspInputDriver", "RtspSessionError", "RtspTarget", "parse_target"]
