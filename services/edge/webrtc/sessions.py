"""The webrtc worker's registrations and sessions (asyncio, aiortc).

A **registration** is one flow's WebRTC input or output, held by the engine kind that runs it
(``engine/kinds/webrtc.py``) over one connection to this worker: it lives as long as that
connection, so a stopped flow or a dead engine worker ends its sessions, and a dead webrtc worker
is seen by the kinds (they report it and register again with the restarted one).

==========================  ===============================================================
``WhipServerInput``         ``webrtc`` input: one publisher at a time, offered through the
                            control process's ``POST .../whip`` (a new one replaces the old)
``WhepClientInput``         ``whep`` input: pulls from ``whep_url``, reconnecting
``WhepServerOutput``        ``webrtc`` output, ``whep_server``: up to ``max_viewers`` viewers
``WhipClientOutput``        ``webrtc`` output, ``whip_client``: publishes to ``whip_url``
``WatchOutput``             the status page's "watch": a WHEP server fed by a hidden tap
==========================  ===============================================================

Media never crosses the control process: an input's TS goes as datagrams to the engine kind's
loopback port (``media_port``); an output's TS comes from the engine kind to a loopback port this
worker binds, only while the output is ``active`` (it has a viewer, or its WHIP session runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.sdp import candidate_from_sdp

from services.edge.core.mux.codec import annexb_keyframe
from services.edge.webrtc.media import RtcToTs, TsToRtc
from services.edge.webrtc.rtc import (
    AUDIO_TIME_BASE,
    VIDEO_TIME_BASE,
    UnitTrack,
    add_public_candidates,
    make_packet,
    remote_address,
    rtc_configuration,
    tap_encoded_frames,
    video_preferences,
)

_log = logging.getLogger("mediaplane.webrtc")

RECONNECT_DELAY_S: Final = 5.0
HTTP_TIMEOUT_S: Final = 10.0
GATHER_TIMEOUT_S: Final = 10.0
FIRST_KEYFRAME_WAIT_S: Final = 10.0  # a WHIP client waits this long to learn the stream's profile
WATCH_MAX_VIEWERS: Final = 4
KEYFRAME_INTERVAL_S: Final = 2.0  # a publisher is asked for a keyframe when none came for this long
MEDIA_RCVBUF: Final = 4 * 1024 * 1024

Emit = Callable[[str, str, dict[str, Any]], None]  # severity, message, details


class OfferRefused(Exception):
    """An offer or a session request this worker refuses: ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass
class Answer:
    session_id: str
    sdp: str
    etag: str


@dataclass
class Session:
    """One peer connection and what the stats say of it."""

    session_id: str
    role: str  # publisher, viewer, whip_client, whep_client
    pc: RTCPeerConnection
    etag: str = field(default_factory=lambda: '"' + secrets.token_hex(8) + '"')
    remote_ufrag: str | None = None
    started: float = field(default_factory=time.monotonic)
    connected_at: float | None = None
    state: str = "connecting"
    peer: str | None = None
    bytes_total: int = 0
    bitrate_bps: int = 0
    tracks: list[UnitTrack] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    announced: bool = False  # a "connected" event was sent

    def summary(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "role": self.role,
            "state": self.state,
            "peer": self.peer,
            "bytes": self.bytes_total,
            "bitrate_bps": self.bitrate_bps,
            "connected_secs": int(time.monotonic() - self.connected_at) if self.connected_at else 0,
            # units a slow viewer's sender fell behind on and skipped (to the next keyframe)
            "units_dropped": sum(track.dropped for track in self.tracks),
        }

    async def measure(self, interval: float) -> None:
        """Bytes and bitrate of the session's transport (RFC 8834 RTCTransportStats)."""
        try:
            report = await self.pc.getStats()
        except Exception:  # a closing connection
            return
        total = 0
        for stats in report.values():
            if getattr(stats, "type", None) == "transport":
                total += int(getattr(stats, "bytesSent", 0)) + int(getattr(stats, "bytesReceived", 0))
        if total >= self.bytes_total:
            self.bitrate_bps = int((total - self.bytes_total) * 8 / interval)
        self.bytes_total = total
        self.peer = remote_address(self.pc) or self.peer

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for track in self.tracks:
            track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        self.state = "closed"


def _session_id() -> str:
    return secrets.token_urlsafe(12)


def _parse_offer(sdp: str) -> RTCSessionDescription:
    if not sdp.startswith("v=0") or "\nm=" not in sdp:
        raise OfferRefused(400, "the body is not an SDP offer")
    return RTCSessionDescription(sdp=sdp, type="offer")


def _ice_ufrag(sdp: str) -> str | None:
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None


async def _local_description(pc: RTCPeerConnection, public_ip: str | None) -> str:
    """aiortc gathers every candidate in ``setLocalDescription`` (no trickle): the SDP is whole."""
    description = pc.localDescription
    assert description is not None
    return add_public_candidates(description.sdp, public_ip)


# --------------------------------------------------------------------------- registrations
class Registration:
    """One flow's WebRTC input or output (see the module docstring)."""

    kind_label = "webrtc"

    def __init__(self, flow_id: str, config: dict[str, Any], emit: Emit, changed: Callable[[], None]) -> None:
        self.flow_id = flow_id
        self.config = config
        self.sessions: dict[str, Session] = {}
        self._emit = emit
        self._changed = changed
        self.closed = False
        self.tasks: list[asyncio.Task[Any]] = []

    # ------------------------------------------------------------------ reported
    def state(self) -> str:
        return "connected" if any(s.state == "connected" for s in self.sessions.values()) else "waiting"

    @property
    def active(self) -> bool:
        """Whether the engine should send this output its TS now."""
        return False

    def status(self) -> dict[str, Any]:
        return {
            "op": "status",
            "state": self.state(),
            "active": self.active,
            "sessions": [s.summary() for s in self.sessions.values()],
        }

    async def measure(self, interval: float) -> None:
        for session in list(self.sessions.values()):
            await session.measure(interval)

    # ------------------------------------------------------------------ sessions
    def _watch(self, session: Session) -> None:
        """Follow ``session``'s connection state: events, stats, the end of a failed session."""

        @session.pc.on("connectionstatechange")
        async def _on_state() -> None:
            state = session.pc.connectionState
            if state == "connected" and session.state != "connected":
                session.state = "connected"
                session.connected_at = time.monotonic()
                session.peer = remote_address(session.pc)
                session.announced = True
                self._emit("info", f"WebRTC {session.role} connected", self._details(session))
            elif state in ("failed", "closed") and session.state not in ("failed", "closed"):
                failed = state == "failed"
                session.state = state
                if failed:
                    self._emit("warning", f"WebRTC {session.role} session failed", self._details(session))
                elif session.announced:
                    self._emit("info", f"WebRTC {session.role} disconnected", self._details(session))
                await self._ended(session)
            self._changed()

    def _details(self, session: Session) -> dict[str, Any]:
        details: dict[str, Any] = {"session_id": session.session_id, "role": session.role}
        if session.peer:
            details["peer"] = session.peer
        return details

    async def _ended(self, session: Session) -> None:
        """A session ended by itself (failed, or closed by the peer)."""
        if self.sessions.get(session.session_id) is session:
            del self.sessions[session.session_id]
            await session.close()

    async def delete(self, session_id: str) -> None:
        """``DELETE .../{session_id}``: end it (the peer sees the connection close)."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise OfferRefused(404, "session not found")
        if session.announced:
            self._emit("info", f"WebRTC {session.role} disconnected", self._details(session))
        await session.close()
        self._changed()

    async def patch(self, session_id: str, if_match: str | None, body: str) -> int:
        """RFC 9725 §4.3.1 trickle ICE: the fragment's candidates are added (204). An ICE restart
        (new ufrag) is not supported: 422, as §4.3.2 asks of a server that does only one of the
        two. ``If-Match`` must name the session's ETag (or ``*``): else 412."""
        session = self.sessions.get(session_id)
        if session is None:
            raise OfferRefused(404, "session not found")
        if if_match is None:
            raise OfferRefused(428, "If-Match is required")
        if if_match.strip() not in ("*", session.etag):
            raise OfferRefused(412, "the ETag does not match the session")
        mid: str | None = None
        candidates: list[tuple[str | None, str]] = []
        for raw in body.splitlines():
            line = raw.strip()
            if line.startswith("a=ice-ufrag:") and line.split(":", 1)[1] != session.remote_ufrag:
                raise OfferRefused(422, "ICE restart is not supported; start a new session")
            if line.startswith("a=mid:"):
                mid = line.split(":", 1)[1]
            elif line.startswith("a=candidate:"):
                candidates.append((mid, line[len("a=") :]))
        for candidate_mid, text in candidates:
            try:
                candidate = candidate_from_sdp(text.split(":", 1)[1])
            except (AssertionError, ValueError, IndexError):
                raise OfferRefused(400, "a candidate line is malformed") from None
            candidate.sdpMid = candidate_mid
            if candidate_mid is None:
                candidate.sdpMLineIndex = 0
            await session.pc.addIceCandidate(candidate)
        return 204

    async def offer(self, sdp: str) -> Answer:
        raise OfferRefused(404, "this flow takes no offers")

    async def close(self) -> None:
        self.closed = True
        for task in self.tasks:
            task.cancel()
        for session in list(self.sessions.values()):
            await session.close()
        self.sessions.clear()


class _Ingest:
    """The receive side of one session: H.264 access units untouched and Opus decoded to AAC,
    muxed to TS (``media.RtcToTs``) and sent to the engine kind's port."""

    def __init__(self, send: Callable[[bytes], None], video_only: bool) -> None:
        self._send = send
        self.video_only = video_only
        self._mux: RtcToTs | None = None
        self._last_keyframe = time.monotonic()

    def attach(self, session: Session) -> None:
        """Take the receivers of ``session`` (after ``setRemoteDescription`` or ``addTransceiver``,
        before it connects)."""
        receivers = {t.kind: t.receiver for t in session.pc.getTransceivers() if t.direction != "inactive"}
        has_audio = "audio" in receivers and not self.video_only
        self._mux = mux = RtcToTs(video="video" in receivers, audio=has_audio)
        if "video" in receivers:

            def on_frame(data: bytes, timestamp: int) -> None:
                now = time.monotonic()
                if annexb_keyframe("h264", data):
                    self._last_keyframe = now
                for datagram in mux.on_video(data, timestamp, now):
                    self._send(datagram)

            tap_encoded_frames(receivers["video"], on_frame)
            session.tasks.append(asyncio.ensure_future(self._ask_keyframes(receivers["video"])))
        if has_audio:
            session.tasks.append(asyncio.ensure_future(self._audio(receivers["audio"], mux)))

    async def _ask_keyframes(self, receiver: Any) -> None:
        """A WebRTC sender sends a keyframe at the start and when asked; a TS receiver that joins
        the flow later (an SRT caller, a decoder switched over) needs one soon. Ask for one
        (PLI, RFC 4585 §6.3.1) whenever none came for ``KEYFRAME_INTERVAL_S``."""
        while True:
            await asyncio.sleep(KEYFRAME_INTERVAL_S / 2)
            if time.monotonic() - self._last_keyframe < KEYFRAME_INTERVAL_S:
                continue
            # The media SSRC: not a retransmission (RFC 4588) one, which carries the sender's
            # bandwidth-probing padding at the start; the one heard last.
            rtx = getattr(receiver, "_RTCRtpReceiver__rtx_ssrc", {})
            sources = [s for s in receiver.getSynchronizationSources() if s.source not in rtx]
            if sources:
                newest = max(sources, key=lambda s: s.timestamp)
                with contextlib.suppress(Exception):  # a closing transport
                    await receiver._send_rtcp_pli(newest.source)

    async def _audio(self, receiver: Any, mux: RtcToTs) -> None:
        # An offerer's receiver gets its track with the answer (aiortc sets it in
        # setRemoteDescription): wait for it.
        while receiver.track is None:
            await asyncio.sleep(0.05)
        track = receiver.track
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            try:
                datagrams = mux.on_audio(frame, time.monotonic())
            except Exception:  # one bad frame must not end the session's audio
                _log.exception("audio frame dropped")
                continue
            for datagram in datagrams:
                self._send(datagram)


class _MediaOut:
    """A UDP socket towards the engine kind's loopback port."""

    def __init__(self, media_port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.dest = ("127.0.0.1", media_port)
        self.dropped = 0

    def send(self, datagram: bytes) -> None:
        try:
            self.sock.sendto(datagram, self.dest)
        except (BlockingIOError, ConnectionRefusedError):
            self.dropped += 1

    def close(self) -> None:
        self.sock.close()


class WhipServerInput(Registration):
    """``webrtc`` input: the WHIP endpoint of a flow (RFC 9725). One publisher at a time; a new
    offer replaces the current publisher (a restarted encoder need not wait for the old session
    to time out), with an event."""

    def __init__(self, flow_id: str, config: dict[str, Any], media_port: int, emit: Emit, changed: Callable[[], None]):
        super().__init__(flow_id, config, emit, changed)
        self._out = _MediaOut(media_port)

    async def offer(self, sdp: str) -> Answer:
        description = _parse_offer(sdp)
        pc = RTCPeerConnection(rtc_configuration(self.config.get("stun_server")))
        session = Session(_session_id(), "publisher", pc, remote_ufrag=_ice_ufrag(sdp))
        try:
            await pc.setRemoteDescription(description)
            video_only = bool(self.config.get("video_only"))
            for transceiver in pc.getTransceivers():
                # video_only: the audio m-line is answered inactive, so nothing decodes it.
                transceiver.direction = "inactive" if video_only and transceiver.kind == "audio" else "recvonly"
            _Ingest(self._out.send, video_only).attach(session)
            await pc.setLocalDescription(await pc.createAnswer())
            answer = await _local_description(pc, self.config.get("public_ip"))
        except OfferRefused:
            await session.close()
            raise
        except Exception as exc:
            await session.close()
            _log.info("WHIP offer refused: %s", type(exc).__name__)
            raise OfferRefused(400, "the offer could not be answered (H.264 video is required)") from None
        for old in list(self.sessions.values()):
            self._emit("info", "WebRTC publisher replaced by a new one", self._details(old))
            self.sessions.pop(old.session_id, None)
            await old.close()
        self.sessions[session.session_id] = session
        self._watch(session)
        self._changed()
        return Answer(session.session_id, answer, session.etag)

    async def close(self) -> None:
        await super().close()
        self._out.close()


class _Fanout(asyncio.DatagramProtocol):
    """TS from the engine kind (a loopback UDP port bound here) -> units -> every session's tracks."""

    def __init__(self, video_only: bool) -> None:
        self.media = TsToRtc(video_only=video_only)
        self.video_tracks: list[UnitTrack] = []
        self.audio_tracks: list[UnitTrack] = []
        self.profile_idc: int | None = None
        self.keyframe_seen = asyncio.Event()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a selector datagram transport

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        if addr[0] != "127.0.0.1":
            return
        for unit in self.media.feed(data):
            if unit.kind == "video":
                if unit.keyframe:
                    self._note_profile(unit.data)
                if not self.video_tracks:
                    continue
                packet = make_packet(unit.data, unit.pts, VIDEO_TIME_BASE)
                for track in self.video_tracks:
                    track.push(packet, unit.keyframe)
            elif self.audio_tracks:
                packet = make_packet(unit.data, unit.pts, AUDIO_TIME_BASE)
                for track in self.audio_tracks:
                    track.push(packet, True)

    def _note_profile(self, annexb: bytes) -> None:
        # ITU-T H.264 §7.3.2.1.1: profile_idc is the SPS's first byte after the NAL header.
        index = annexb.find(b"\x00\x00\x01\x67")
        if index >= 0 and index + 4 < len(annexb):
            self.profile_idc = annexb[index + 4]
        self.keyframe_seen.set()

    def add(self, session: Session, video: UnitTrack | None, audio: UnitTrack | None) -> None:
        for track, tracks in ((video, self.video_tracks), (audio, self.audio_tracks)):
            if track is not None:
                tracks.append(track)
                session.tracks.append(track)

    def remove(self, session: Session) -> None:
        for track in session.tracks:
            for tracks in (self.video_tracks, self.audio_tracks):
                if track in tracks:
                    tracks.remove(track)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_fanout(video_only: bool) -> tuple[_Fanout, int]:
    """Bind the loopback port an output's TS comes to; the fanout and its port."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MEDIA_RCVBUF)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    _transport, fanout = await loop.create_datagram_endpoint(lambda: _Fanout(video_only), sock=sock)
    return fanout, port


def _sender_tracks(pc: RTCPeerConnection, fanout: _Fanout, session: Session, video_only: bool) -> None:
    """Send-only transceivers fed by ``fanout``, H.264 in the stream's profile first."""
    video = UnitTrack("video")
    transceiver = pc.addTransceiver(video, direction="sendonly")
    transceiver.setCodecPreferences(video_preferences(fanout.profile_idc))
    audio = None
    if not video_only:
        audio = UnitTrack("audio")
        pc.addTransceiver(audio, direction="sendonly")
    fanout.add(session, video, audio)


class WhepServerOutput(Registration):
    """``webrtc`` output in ``whep_server`` mode: viewers through ``POST .../whep`` (RFC 9725's
    protocol, as WHEP drafts use it), at most ``max_viewers`` (503 beyond)."""

    max_viewers_default: int | None = None

    def __init__(self, flow_id: str, config: dict[str, Any], fanout: _Fanout, emit: Emit, changed: Callable[[], None]):
        super().__init__(flow_id, config, emit, changed)
        self.fanout = fanout
        self.max_viewers: int | None = config.get("max_viewers") or self.max_viewers_default

    def state(self) -> str:
        return "active" if self.sessions else "waiting"

    @property
    def active(self) -> bool:
        return bool(self.sessions)

    async def offer(self, sdp: str) -> Answer:
        description = _parse_offer(sdp)
        if self.max_viewers is not None and len(self.sessions) >= self.max_viewers:
            raise OfferRefused(503, f"viewer limit reached ({self.max_viewers})", {"Retry-After": "10"})
        video_only = bool(self.config.get("video_only"))
        pc = RTCPeerConnection(rtc_configuration(self.config.get("stun_server")))
        session = Session(_session_id(), "viewer", pc, remote_ufrag=_ice_ufrag(sdp))
        try:
            _sender_tracks(pc, self.fanout, session, video_only or "m=audio" not in sdp)
            await pc.setRemoteDescription(description)
            await pc.setLocalDescription(await pc.createAnswer())
            answer = await _local_description(pc, self.config.get("public_ip"))
        except OfferRefused:
            self.fanout.remove(session)
            await session.close()
            raise
        except Exception as exc:
            self.fanout.remove(session)
            await session.close()
            _log.info("WHEP offer refused: %s", type(exc).__name__)
            raise OfferRefused(400, "the offer could not be answered (H.264 video is required)") from None
        self.sessions[session.session_id] = session
        self._watch(session)
        self._changed()
        return Answer(session.session_id, answer, session.etag)

    async def _ended(self, session: Session) -> None:
        self.fanout.remove(session)
        await super()._ended(session)

    async def delete(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            self.fanout.remove(session)
        await super().delete(session_id)

    async def close(self) -> None:
        await super().close()
        self.fanout.close()


class WatchOutput(WhepServerOutput):
    """The status page's "watch" button: a WHEP server on a hidden tap of the flow's TS, a few
    viewers at most. ``on_idle`` runs when its last viewer leaves (the control removes the tap)."""

    max_viewers_default = WATCH_MAX_VIEWERS
    media_port = 0  # the loopback port its tap sends to (set by the worker)

    def __init__(
        self, flow_id: str, fanout: _Fanout, emit: Emit, changed: Callable[[], None], on_idle: Callable[[], None]
    ):
        super().__init__(flow_id, {}, fanout, emit, changed)
        self.on_idle = on_idle

    async def _ended(self, session: Session) -> None:
        await super()._ended(session)
        if not self.sessions:
            self.on_idle()

    async def delete(self, session_id: str) -> None:
        await super().delete(session_id)
        if not self.sessions:
            self.on_idle()


class _ClientLoop(Registration):
    """A registration that dials out (WHIP client output, WHEP client input): one session at a
    time, re-dialled ``RECONNECT_DELAY_S`` after it fails or ends; DELETE sent when it stops."""

    role = "client"
    url_field = ""

    def __init__(self, flow_id: str, config: dict[str, Any], emit: Emit, changed: Callable[[], None]):
        super().__init__(flow_id, config, emit, changed)
        self._state = "connecting"
        self._ended_event = asyncio.Event()
        self._location: str | None = None
        self._failures = 0

    def start(self) -> None:
        self.tasks.append(asyncio.ensure_future(self._run()))

    def state(self) -> str:
        return self._state

    async def _ended(self, session: Session) -> None:
        await super()._ended(session)
        self._ended_event.set()

    async def _run(self) -> None:
        url = str(self.config[self.url_field])
        while not self.closed:
            self._ended_event.clear()
            try:
                await self._dial(url)
                self._failures = 0
                await self._ended_event.wait()
            except OfferRefused as exc:
                self._fail(str(exc))
            except (TimeoutError, httpx.HTTPError, OSError) as exc:
                self._fail(f"{self.url_field} unreachable ({type(exc).__name__})")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.exception("WebRTC %s failed", self.role)
                self._fail(f"session failed ({type(exc).__name__})")
            await self._hang_up()
            if self.closed:
                return
            self._state = "reconnecting"
            self._changed()
            await asyncio.sleep(RECONNECT_DELAY_S)

    def _fail(self, reason: str) -> None:
        self._failures += 1
        if self._failures == 1:  # one warning per outage, not one per attempt
            self._emit("warning", f"WebRTC {self.role} session failed: {reason}", {"role": self.role})

    async def _dial(self, url: str) -> None:
        raise NotImplementedError

    async def _exchange(self, url: str, pc: RTCPeerConnection, session: Session) -> None:
        """POST our offer (all candidates in it), take the answer (RFC 9725 §4.2)."""
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription
        assert offer is not None
        headers = {"Content-Type": "application/sdp"}
        if self.config.get("bearer_token"):
            headers["Authorization"] = f"Bearer {self.config['bearer_token']}"
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, follow_redirects=True) as client:
            response = await client.post(url, content=offer.sdp.encode(), headers=headers)
        if response.status_code != 201:
            raise OfferRefused(response.status_code, f"{self.url_field} answered HTTP {response.status_code}")
        location = response.headers.get("location")
        self._location = str(httpx.URL(url).join(location)) if location else None
        await pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        self.sessions[session.session_id] = session
        self._watch(session)
        self._state = "connecting"
        self._changed()

    def _forget(self, session: Session) -> None:
        """Drop what refers to ``session`` beside ``sessions`` (a fanout's tracks)."""

    async def _hang_up(self) -> None:
        for session in list(self.sessions.values()):
            self.sessions.pop(session.session_id, None)
            self._forget(session)
            await session.close()
        location, self._location = self._location, None
        if location is None:
            return
        headers = {}
        if self.config.get("bearer_token"):
            headers["Authorization"] = f"Bearer {self.config['bearer_token']}"
        with contextlib.suppress(httpx.HTTPError, OSError, asyncio.TimeoutError):
            async with httpx.AsyncClient(timeout=2.0) as client:
                await client.delete(location, headers=headers)

    def _watch(self, session: Session) -> None:
        super()._watch(session)

        @session.pc.on("connectionstatechange")
        async def _on_state() -> None:
            if session.pc.connectionState == "connected":
                self._state = "connected"
            elif session.pc.connectionState in ("failed", "closed"):
                self._state = "reconnecting"
            self._changed()

    async def close(self) -> None:
        self.closed = True
        await self._hang_up()
        await super().close()


class WhipClientOutput(_ClientLoop):
    """``webrtc`` output in ``whip_client`` mode: publishes the flow to ``whip_url``."""

    role = "whip_client"
    url_field = "whip_url"

    def __init__(self, flow_id: str, config: dict[str, Any], fanout: _Fanout, emit: Emit, changed: Callable[[], None]):
        super().__init__(flow_id, config, emit, changed)
        self.fanout = fanout

    @property
    def active(self) -> bool:
        return not self.closed

    async def _dial(self, url: str) -> None:
        # Offer the stream's own H.264 profile first: wait (bounded) for a keyframe to learn it.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.fanout.keyframe_seen.wait(), FIRST_KEYFRAME_WAIT_S)
        pc = RTCPeerConnection(rtc_configuration(self.config.get("stun_server")))
        session = Session(_session_id(), self.role, pc)
        try:
            _sender_tracks(pc, self.fanout, session, bool(self.config.get("video_only")))
            await self._exchange(url, pc, session)
        except BaseException:
            self.fanout.remove(session)
            await session.close()
            raise

    async def _ended(self, session: Session) -> None:
        self.fanout.remove(session)
        await super()._ended(session)

    def _forget(self, session: Session) -> None:
        self.fanout.remove(session)

    async def close(self) -> None:
        await super().close()
        self.fanout.close()


class WhepClientInput(_ClientLoop):
    """``whep`` input: pulls a stream from ``whep_url`` (recvonly), muxed into the flow's TS."""

    role = "whep_client"
    url_field = "whep_url"

    def __init__(self, flow_id: str, config: dict[str, Any], media_port: int, emit: Emit, changed: Callable[[], None]):
        super().__init__(flow_id, config, emit, changed)
        self._out = _MediaOut(media_port)

    async def _dial(self, url: str) -> None:
        video_only = bool(self.config.get("video_only"))
        pc = RTCPeerConnection(rtc_configuration(self.config.get("stun_server")))
        session = Session(_session_id(), self.role, pc)
        try:
            transceiver = pc.addTransceiver("video", direction="recvonly")
            transceiver.setCodecPreferences(video_preferences(None))
            if not video_only:
                pc.addTransceiver("audio", direction="recvonly")
            _Ingest(self._out.send, video_only).attach(session)
            await self._exchange(url, pc, session)
        except BaseException:
            await session.close()
            raise

    async def close(self) -> None:
        await super().close()
        self._out.close()


Factory = Callable[..., Awaitable[Registration]]


async def create_registration(
    message: dict[str, Any], emit: Emit, changed: Callable[[], None]
) -> tuple[Registration, dict[str, Any]]:
    """The registration a kind's ``register`` message asks for, and the reply's extra fields."""
    role = message.get("role")
    flow_id = str(message.get("flow_id"))
    config = message.get("config")
    if not isinstance(config, dict):
        raise OfferRefused(400, "register without a config")
    kind = config.get("type")
    if role == "input" and kind == "webrtc":
        return WhipServerInput(flow_id, config, int(message["media_port"]), emit, changed), {}
    if role == "input" and kind == "whep":
        client = WhepClientInput(flow_id, config, int(message["media_port"]), emit, changed)
        client.start()
        return client, {}
    if role == "output" and kind == "webrtc":
        fanout, port = await open_fanout(bool(config.get("video_only")))
        if config.get("mode") == "whep_server":
            return WhepServerOutput(flow_id, config, fanout, emit, changed), {"media_port": port}
        output = WhipClientOutput(flow_id, config, fanout, emit, changed)
        output.start()
        return output, {"media_port": port}
    raise OfferRefused(400, f"nothing registers as {role} {kind!r}")


__all__ = [
    "Answer",
    "OfferRefused",
    "Registration",
    "Session",
    "WatchOutput",
    "WhepClientInput",
    "WhepServerOutput",
    "WhipClientOutput",
    "WhipServerInput",
    "create_registration",
    "open_fanout",
]
