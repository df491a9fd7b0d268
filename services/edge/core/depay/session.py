"""``MediaSession``: the whole sans-IO media side of one RTSP input. RTP/RTCP in, TS datagrams out.

The RTSP driver (trio, sockets, timers) does the DESCRIBE/SETUP/PLAY dialogue and hands every
received RTP and RTCP packet to this class with its arrival time; it gets back 1316-byte TS
datagrams (7 x 188) for the flow, and the compound receiver reports to send to the camera.

**Tracks.** :meth:`MediaSession.begin` gets the SDP's media descriptions (:class:`TrackSpec`)
and chooses the first usable video track (H.264, H.265) and the first usable audio track (AAC
as ``mpeg4-generic`` or ``MP4A-LATM``); the driver sets up only those. Other tracks, and tracks
of a handled codec with unusable parameters, are ignored and counted (``ignored_tracks``).

**Packets.** Each RTP packet is parsed (:func:`~..rtp.parse_rtp`), fed to the RTCP
:class:`~.rtcp.ReceptionStats`, and put in order: behind a sequence gap up to
``REORDER_PACKETS`` packets are held waiting for the missing one (reordering is repaired,
``rtp_reordered``); past that the missing packets are given up (``rtp_lost``; one that arrives
later is dropped as too late), duplicates are dropped (``rtp_duplicates``), and a jump of
``MAX_DROPOUT`` or more resynchronises. In order, packets go to the track's depacketiser, whose
frames become :class:`~..mux.units.AccessUnit` objects for
:class:`~..mux.from_units.UnitsToTs` (program choice, DTS-ordered interleaving, the muxer).

**Timing.** RTP timestamps are unwrapped (32 bits) and scaled to 90 kHz. Each track's clock is
anchored at its first packet: its 90 kHz time is the arrival time since :meth:`begin` plus a
base (``TIMESTAMP_BASE``, 1 s, at the first session, so that the first PCR = DTS - 700 ms is not
negative; on a reconnect, just after the last timestamp the previous session muxed, so the
output clock neither jumps back nor stalls). Once both tracks have had an RTCP sender report
(RFC 3550 §6.4.1), the audio track is re-anchored on the video track through the SRs' NTP
<-> RTP mappings (lip sync; audio frames that the correction puts before the last one muxed are
dropped, counted in ``units.stats.late_units``); a change under 5 ms is ignored. A new SSRC on a track (the camera
restarted its stream) re-anchors that track after the last unit it gave, and so does an RTP
timestamp step of more than ``MAX_TIMESTAMP_JUMP`` (10 s) either way under the same SSRC.

**DTS.** RTP timestamps are presentation times. With B-frames (a picture with a PTS below an
earlier one) the decoding time is derived over a window of ``DTS_WINDOW`` pictures: the i-th
DTS is the i-th smallest PTS minus a reorder delay learned from the first window (at least two
picture intervals once reordering is seen; raised later if a picture would decode after its
presentation, which can cost that one picture), kept strictly increasing. Without B-frames DTS
= PTS. The window delays video by ``DTS_WINDOW`` pictures.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Final, Literal

from ..mux.codec import VideoCodec
from ..mux.from_flv import TIMESTAMP_BASE
from ..mux.from_units import UnitsToTs
from ..mux.ts_mux import MuxConfig
from ..mux.units import AccessUnit, Codec
from ..rtp import parse_rtp, seq_delta
from .common import Depacketizer, Frame
from .factory import make_depacketizer
from .rtcp import MAX_DROPOUT, ReceptionStats, SenderReport, build_receiver_report, parse_rtcp

DTS_WINDOW: Final = 4  # pictures held to derive DTS with B-frames
REORDER_PACKETS: Final = 8  # packets held behind a sequence gap, waiting for the missing one
RECONNECT_GAP: Final = 9_000  # 100 ms between the last unit of a session and the next session
SYNC_THRESHOLD: Final = 450  # 5 ms: a smaller lip sync correction is not applied
MAX_TIMESTAMP_JUMP: Final = 10  # seconds: an RTP timestamp step larger than this restarts the track clock
_MAX_CARRY_FRAMES: Final = 64


@dataclass(frozen=True, slots=True)
class TrackSpec:
    """One SDP media description (``m=`` with its ``a=rtpmap`` and ``a=fmtp``).

    ``index`` is the driver's own number for the track (its position in the SDP, say);
    ``media`` "video"/"audio"; ``encoding`` the rtpmap encoding name (case-insensitive);
    ``clock_rate`` the RTP clock; ``channels`` the rtpmap channel count when given.
    """

    index: int
    media: str
    encoding: str
    clock_rate: int
    channels: int | None
    fmtp: dict[str, str]


@dataclass(slots=True)
class SessionStats:
    """Counters of one :class:`MediaSession` (over all its RTSP sessions)."""

    rtp_packets: int = 0
    rtp_bytes: int = 0
    rtp_lost: int = 0  # packets missing in the sequence numbers (gaps)
    rtp_reordered: int = 0  # packets arriving after a later one (dropped)
    rtp_duplicates: int = 0
    units_video: int = 0  # access units out of the depacketisers
    units_audio: int = 0
    units_dropped: int = 0  # access units lost with a packet (or too large)
    bad_packets: int = 0  # not RTP, unparseable or unsupported payloads, unknown tracks
    video_codec: str | None = None
    audio_codec: str | None = None
    datagrams: int = 0
    ignored_tracks: int = 0
    rtcp_packets: int = 0
    sender_reports: int = 0
    ssrc_changes: int = 0
    clock_jumps: int = 0  # RTP timestamp jumps past MAX_TIMESTAMP_JUMP (the track clock restarted)
    sessions: int = 0


class DtsDeriver:
    """Decoding times for pictures given in decoding order with presentation times.

    The one DTS derivation of every RTP video ingest: the RTSP input's sessions and the WebRTC
    ingest (``services/edge/webrtc/media.py``) both use it."""

    __slots__ = ("_delay", "_heap", "_held", "_last", "_started")

    def __init__(self) -> None:
        self._held: deque[tuple[int, Frame]] = deque()
        self._heap: list[int] = []
        self._delay = 0
        self._last: int | None = None
        self._started = False

    def push(self, pts: int, frame: Frame) -> list[tuple[Frame, int, int]]:
        self._held.append((pts, frame))
        heapq.heappush(self._heap, pts)
        out = []
        while len(self._held) > DTS_WINDOW:
            out.append(self._pop())
        return out

    def flush(self) -> list[tuple[Frame, int, int]]:
        out = [self._pop() for _ in range(len(self._held))]
        self._started = False
        return out

    def _pop(self) -> tuple[Frame, int, int]:
        if not self._started:  # the reorder delay the first window needs
            order = [p for p, _ in self._held]
            ranked = sorted(order)
            self._delay = max(0, *(s - p for s, p in zip(ranked, order, strict=True)))
            if self._delay:  # B-frames: room for two pictures of reordering (-bf 2), more if seen
                steps = [b - a for a, b in itertools.pairwise(ranked) if b > a]
                self._delay = max(self._delay, 2 * min(steps, default=0))
            self._started = True
        pts, frame = self._held.popleft()
        dts = heapq.heappop(self._heap) - self._delay
        if dts > pts:  # more reordering than learned so far
            self._delay += dts - pts
            dts = pts
        if self._last is not None and dts <= self._last:
            dts = min(self._last + 1, pts)
        self._last = dts
        return frame, pts, dts


@dataclass(slots=True)
class _Track:
    spec: TrackSpec
    depay: Depacketizer
    kind: Literal["video", "audio"]
    codec: Codec
    reception: ReceptionStats
    ssrc: int | None = None
    highest_seq: int | None = None  # the last sequence number delivered to the depacketiser
    held: dict[int, tuple[int, bool, bytes, float]] = field(default_factory=dict)  # reorder buffer
    skipped: deque[int] = field(default_factory=lambda: deque(maxlen=64))  # given up as lost
    first_ext: int = 0
    last_ext: int | None = None  # extended RTP timestamp of the last packet delivered
    frame_ext: int | None = None  # ... of the last frame timed
    offset90: int | None = None  # 90 kHz time of first_ext
    last_pts: int | None = None
    sr: SenderReport | None = None
    seen_lost: int = 0
    seen_bad: int = 0
    dts: DtsDeriver = field(default_factory=DtsDeriver)

    def unwrap(self, ts: int, near: int | None = None) -> int:
        """The extended RTP timestamp nearest ``near`` (default: the last packet's), 32-bit wrap."""
        ref = self.last_ext if near is None else near
        if ref is None:
            return ts & 0xFFFFFFFF
        step = ((ts - ref + 0x80000000) & 0xFFFFFFFF) - 0x80000000
        return ref + step

    def to90(self, ext: int) -> int:
        assert self.offset90 is not None
        return self.offset90 + (ext - self.first_ext) * 90_000 // self.spec.clock_rate


class MediaSession:
    """One RTSP input's media: RTP/RTCP packets -> TS datagrams (see the module docstring)."""

    def __init__(self, *, our_ssrc: int, cname: str, mux: MuxConfig | None = None) -> None:
        self.our_ssrc = our_ssrc & 0xFFFFFFFF
        self.cname = cname
        self.stats = SessionStats()
        self._units = UnitsToTs(mux=mux)
        self._tracks: dict[int, _Track] = {}
        self._outbox: list[bytes] = []
        self._start = 0.0
        self._base = TIMESTAMP_BASE
        self._max_pts: int | None = None

    # ------------------------------------------------------------------ public API

    def begin(self, tracks: list[TrackSpec], arrival: float) -> list[int]:
        """A new RTSP session (first connect or reconnect): choose the tracks; answer their indexes.

        Raises ValueError, naming what the SDP offered, when no track is usable.
        """
        chosen: dict[str, _Track] = {}
        found: list[str] = []
        for spec in tracks:
            label = f"{spec.media} {spec.encoding}/{spec.clock_rate}"
            kind = spec.media.lower()
            if kind not in ("video", "audio") or kind in chosen:
                self.stats.ignored_tracks += 1
                found.append(label)
                continue
            try:
                if spec.clock_rate <= 0:
                    raise ValueError(f"RTP clock rate {spec.clock_rate} is not usable")
                depay = make_depacketizer(spec.encoding, spec.clock_rate, spec.channels, spec.fmtp)
            except ValueError as e:
                depay = None
                label += f" ({e})"
            found.append(label)
            if depay is None or depay.media != kind:
                self.stats.ignored_tracks += 1
                continue
            codec: Codec = "aac" if depay.codec == "aac" else ("hevc" if depay.codec == "hevc" else "h264")
            chosen[kind] = _Track(
                spec, depay, "video" if kind == "video" else "audio", codec, ReceptionStats(spec.clock_rate)
            )
        if not chosen:
            raise ValueError(f"no H.264/H.265/AAC track in the camera's SDP (found: {', '.join(found) or 'none'})")
        self._end_tracks()
        if self._max_pts is not None:
            self._base = self._max_pts + RECONNECT_GAP
        self._start = arrival
        self._tracks = {t.spec.index: t for t in chosen.values()}
        video = chosen.get("video")
        audio = chosen.get("audio")
        video_codec: VideoCodec | None = None
        if video is not None:
            video_codec = "hevc" if video.codec == "hevc" else "h264"
        self._outbox += self._units.begin(video_codec, "aac" if audio is not None else None)
        self.stats.video_codec = video.codec if video is not None else None
        self.stats.audio_codec = audio.codec if audio is not None else None
        self.stats.sessions += 1
        return [t.spec.index for t in self._tracks.values()]

    def set_rtp_info(self, track_index: int, seq: int | None, rtptime: int | None) -> None:
        """PLAY's RTP-Info (RFC 2326 §12.33) for a track: the first sequence number to expect.

        Optional: the timing does not depend on it (the first packet anchors the track).
        """
        track = self._tracks.get(track_index)
        if track is not None and seq is not None and track.highest_seq is None:
            track.highest_seq = (seq - 1) & 0xFFFF

    def on_rtp(self, track_index: int, data: bytes | memoryview, arrival: float) -> list[bytes]:
        """One RTP packet (header included): the TS datagrams it completes (often none)."""
        out, self._outbox = self._outbox, []
        track = self._tracks.get(track_index)
        header = parse_rtp(data)
        self.stats.rtp_packets += 1
        self.stats.rtp_bytes += len(data)
        if track is None or header is None:
            self.stats.bad_packets += 1
            return self._count(out)
        seq = header.sequence
        if track.ssrc != header.ssrc:
            if track.ssrc is not None:  # the camera restarted its stream: new clock, new sequence
                self.stats.ssrc_changes += 1
                self._restart_track(track)
            track.ssrc = header.ssrc
        track.reception.on_rtp(seq, header.timestamp, arrival, header.ssrc)
        if track.highest_seq is None:
            track.highest_seq = (seq - 1) & 0xFFFF
        d = seq_delta(seq, track.highest_seq)
        if d <= 0 or seq in track.held:
            if seq in track.skipped:
                self.stats.rtp_reordered += 1  # too late: its unit is already gone
            else:
                self.stats.rtp_duplicates += 1
            return self._count(out)
        if d >= MAX_DROPOUT:  # a jump (RFC 3550 §A.1): what is held came before it, then resync
            out += self._release(track, force=True)
            track.highest_seq = (seq - 1) & 0xFFFF
        elif d == 1 and track.held:
            self.stats.rtp_reordered += 1  # the packet a later one was waiting for
        payload = bytes(memoryview(data)[header.payload_offset : header.payload_end])
        track.held[seq] = (header.timestamp, header.marker, payload, arrival)
        out += self._release(track)
        return self._count(out)

    def _release(self, track: _Track, *, force: bool = False) -> list[bytes]:
        """Deliver the held packets that are next in sequence; past ``REORDER_PACKETS`` held (or
        with ``force``) the missing ones are given up as lost."""
        out: list[bytes] = []
        held = track.held
        while held:
            assert track.highest_seq is not None
            nxt = (track.highest_seq + 1) & 0xFFFF
            packet = held.pop(nxt, None)
            if packet is not None:
                track.highest_seq = nxt
                out += self._deliver(track, nxt, *packet)
                continue
            if not force and len(held) <= REORDER_PACKETS:
                break
            base = track.highest_seq
            lowest = min(held, key=lambda s: seq_delta(s, base))
            missing = seq_delta(lowest, base) - 1
            self.stats.rtp_lost += missing
            track.skipped.extend((base + 1 + i) & 0xFFFF for i in range(min(missing, 64)))
            track.highest_seq = (lowest - 1) & 0xFFFF
        return out

    def _deliver(
        self, track: _Track, seq: int, timestamp: int, marker: bool, payload: bytes, arrival: float
    ) -> list[bytes]:
        """One packet, in sequence order, to the track's depacketiser."""
        ext = track.unwrap(timestamp)
        track.last_ext = ext
        if track.offset90 is None:
            self._anchor(track, ext, arrival)
        frames = track.depay.push(seq, timestamp, marker, payload)
        self._note_depay(track)
        out: list[bytes] = []
        for frame in frames:
            out += self._frame(track, frame)
        return out

    def on_rtcp(self, track_index: int, data: bytes | memoryview, arrival: float) -> None:
        """An RTCP compound packet from the server: sender reports feed the lip sync."""
        track = self._tracks.get(track_index)
        self.stats.rtcp_packets += 1
        if track is None:
            return
        for packet in parse_rtcp(data):
            if isinstance(packet, SenderReport) and (track.ssrc is None or packet.ssrc == track.ssrc):
                self.stats.sender_reports += 1
                track.reception.on_sr(packet, arrival)
                track.sr = packet
                self._sync()

    def receiver_reports(self, now: float) -> dict[int, bytes]:
        """Per chosen track: a compound RR + SDES CNAME (RFC 3550 §6.1) for the server."""
        out: dict[int, bytes] = {}
        for index, track in self._tracks.items():
            blocks = [track.reception] if track.reception.ssrc is not None else []
            out[index] = build_receiver_report(self.our_ssrc, self.cname, blocks, now)
        return out

    def flush(self) -> list[bytes]:
        """End of a session: the pending units, then the last datagram padded with null packets."""
        self._end_tracks()
        out, self._outbox = self._outbox, []
        out += self._units.flush()
        return self._count(out)

    @property
    def units(self) -> UnitsToTs:
        """The program/interleaving stage (its stats, its muxer)."""
        return self._units

    # ------------------------------------------------------------------ internals

    def _count(self, out: list[bytes]) -> list[bytes]:
        self.stats.datagrams += len(out)
        return out

    def _note_depay(self, track: _Track) -> None:
        st = track.depay.stats
        self.stats.units_dropped += st.lost_units - track.seen_lost
        bad = st.bad_packets + st.unsupported_packets
        self.stats.bad_packets += bad - track.seen_bad
        track.seen_lost, track.seen_bad = st.lost_units, bad

    def _end_tracks(self) -> None:
        """Finish the current tracks: their pending frames and held pictures go to the muxer."""
        for track in self._tracks.values():
            self._outbox += self._release(track, force=True)
            for frame in track.depay.flush():
                self._outbox += self._frame(track, frame)
            self._note_depay(track)
            if track.kind == "video":
                for frame, pts, dts in track.dts.flush():
                    self._outbox += self._unit(track, frame, pts, dts)

    def _restart_track(self, track: _Track) -> None:
        """A new SSRC: the track's clock starts over after its last unit."""
        self._outbox += self._release(track, force=True)
        for frame in track.depay.flush():
            self._outbox += self._frame(track, frame)
        if track.kind == "video":
            for frame, pts, dts in track.dts.flush():
                self._outbox += self._unit(track, frame, pts, dts)
        track.highest_seq = None
        track.last_ext = track.frame_ext = None
        track.offset90 = None
        track.sr = None
        track.reception = ReceptionStats(track.spec.clock_rate)

    def _anchor(self, track: _Track, ext: int, arrival: float) -> None:
        track.first_ext = ext
        if track.last_pts is not None:  # re-anchored after an SSRC change
            track.offset90 = track.last_pts + RECONNECT_GAP
            return
        track.offset90 = self._base + max(0, round((arrival - self._start) * 90_000))
        self._sync()

    def _sync(self) -> None:
        """Lip sync (RFC 3550 §6.4.1): align the audio track on the video track through the SRs."""
        tracks = [t for t in self._tracks.values() if t.offset90 is not None and t.sr is not None]
        if len(tracks) != 2:
            return
        # the audio moves onto the video's clock: shifting audio drops or skips a few frames at
        # worst, shifting video would cost reference pictures
        ref, other = sorted(tracks, key=lambda t: t.kind != "video")
        assert ref.sr is not None and other.sr is not None
        other_ext = other.unwrap(other.sr.rtp_timestamp)
        ref_ext = ref.unwrap(ref.sr.rtp_timestamp)
        # the reference track's RTP time at the other's SR wallclock, then its 90 kHz time
        ref_at = ref_ext + (other.sr.ntp_seconds - ref.sr.ntp_seconds) * ref.spec.clock_rate
        assert ref.offset90 is not None
        ref90 = ref.offset90 + (ref_at - ref.first_ext) * 90_000 / ref.spec.clock_rate
        offset = round(ref90 - (other_ext - other.first_ext) * 90_000 / other.spec.clock_rate)
        if other.offset90 is None or abs(offset - other.offset90) >= SYNC_THRESHOLD:
            other.offset90 = offset

    def _frame(self, track: _Track, frame: Frame) -> list[bytes]:
        if track.offset90 is None:
            return []
        out: list[bytes] = []
        ext = track.unwrap(frame.timestamp, track.frame_ext)
        if track.frame_ext is not None and abs(ext - track.frame_ext) > MAX_TIMESTAMP_JUMP * track.spec.clock_rate:
            # the RTP clock jumped (a camera restarting its stream under the same SSRC): the
            # track starts over after its last unit instead of jumping (or stalling) the output
            self.stats.clock_jumps += 1
            if track.kind == "video":
                for f, p, d in track.dts.flush():
                    out += self._unit(track, f, p, d)
            track.first_ext = ext
            track.offset90 = (track.last_pts if track.last_pts is not None else self._base) + RECONNECT_GAP
        track.frame_ext = ext
        pts = track.to90(ext)
        if track.kind == "audio":
            self.stats.units_audio += 1
            return out + self._unit(track, frame, pts, pts)
        self.stats.units_video += 1
        for f, p, d in track.dts.push(pts, frame):
            out += self._unit(track, f, p, d)
        return out

    def _unit(self, track: _Track, frame: Frame, pts: int, dts: int) -> list[bytes]:
        track.last_pts = pts if track.last_pts is None else max(track.last_pts, pts)
        self._max_pts = pts if self._max_pts is None else max(self._max_pts, pts)
        unit = AccessUnit(track.kind, track.codec, 0, pts, dts, frame.keyframe, frame.data)
        return self._units.push(unit)


__all__ = ["DTS_WINDOW", "DtsDeriver", "MediaSession", "SessionStats", "TrackSpec"]
