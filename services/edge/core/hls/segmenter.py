"""Cuts an MPEG-TS into HLS media segments (RFC 8216 §3.2, §6.2.1). Sans-IO.

``HlsSegmenter.feed`` takes raw TS (whole 188-byte packets, in batches of any size) and answers
the segments it completed. The rules (docs/hls.md, "Segmenting"):

* The program is the first one of the PAT. Its *anchor* is the first H.264 or HEVC video stream
  of the PMT; a program without one is anchored on its first audio stream (audio-only).
* A segment begins at a *cut point*: the start of a video PES whose first coded slice is an IDR
  (H.264) or IRAP (HEVC) picture, or any audio PES start for an audio-only program. The NAL
  types are read from the PES payload itself, which may span packets: the packets from the PES
  start on are held until the first slice is seen (``random_access_indicator`` is not trusted
  either way: encoders set it on non-IDR I pictures and some never set it).
* A cut is made at the first cut point whose PTS is at least ``target_duration_secs`` after the
  segment's own (33-bit wrap-aware, ISO/IEC 13818-1 §2.4.3.7), so segments are as long as the
  target rounded up to the GOP. The duration of a segment is the PTS of the next segment's
  first cut point minus its own.
* Every segment starts with a PAT and a PMT (RFC 8216 §3.2: "Each Media Segment MUST contain
  ... the PAT and the PMT"), written here with the segmenter's own continuity counters (the
  source's PAT/PMT packets are not passed on; a PMT change is written in place), then the cut
  point, so each segment decodes alone. Null packets are left out.
* Other elementary streams are split by time, not by arrival: after a cut at PTS X, a PES of
  another stream of the program that starts with a PTS before X still goes to the segment that
  ended (so do the packets continuing a PES begun before the cut); that segment is answered
  once each of those streams has begun a PES at or after X (or the anchor is ``_TAIL_MAX_TICKS``
  past X). ADTS AAC (stream_type 0x0F) goes further: each PES is assembled whole, and one that
  spans X is split at the first ADTS frame at or after X into two PES (the second with that
  frame's PTS), so each segment's audio starts within one AAC frame of its keyframe; AAC
  packets get the segmenter's own continuity counters. Muxers send audio well behind or ahead
  of video and pack many frames per PES (FFmpeg: ~16 frames, 0.34 s): cut in arrival order,
  segments would start with up to 0.35 s of audio without video (or the reverse), a hole that
  players joining there must seek over (hls.js: ``bufferSeekOverHole``). Other audio codecs
  (AC-3, MPEG audio) are placed whole PES by whole PES by their start PTS.
* The first segment leaves out the other streams' PES from before its keyframe.
* Bounds: a segment that reaches ``max_segment_bytes`` or ``max_segment_secs`` (the larger of
  3 x target and 10 s) without a cut point is *dropped*, not cut anyway (every segment must start
  with a keyframe for a player to join on it): it is counted, and the next segment carries the
  discontinuity flag. A stream whose keyframes are further apart than that produces no segment.
* A PTS that goes backwards or jumps by more than the bound is a timestamp discontinuity: the
  segment ends there (its duration from its last PES time plus one frame) and the next segment
  carries the discontinuity flag (RFC 8216 §4.3.2.3). ``gap()`` (the caller lost input) drops
  the segment being built and flags the next one the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from services.edge.core.mux.codec import VideoCodec, annexb_keyframe, iter_adts
from services.edge.core.mux.ts_mux import pat_section, pes_header, section_packets
from services.edge.core.mux.units import ts_delta
from services.edge.core.ts.packet import (
    NULL_PID,
    PAT_PID,
    PTS_HZ,
    PTS_WRAP,
    SYNC_BYTE,
    TS_PACKET_SIZE,
    packet_pid,
    payload_offset,
    pes_payload_start,
    pes_pts,
)
from services.edge.core.ts.psi import SectionAssembler, parse_pat, parse_pmt, section_crc_ok

DEFAULT_MAX_SEGMENT_BYTES: Final = 64 * 1024 * 1024
MIN_MAX_SEGMENT_SECS: Final = 10.0
# A PES start is decided after this much of its payload without a coded slice (not a keyframe).
_MAX_PROBE_BYTES: Final = 256 * 1024
# ... and after this much held TS (all PIDs) in any case.
_MAX_HELD_BYTES: Final = 2 * 1024 * 1024

_STREAM_TYPE_ADTS: Final = 0x0F
_MAX_AAC_PES_PACKETS: Final = 2048  # an AAC PES longer than this (~370 kB) is placed as it is
# A segment that ended waits at most this long (anchor PTS past its end) for the other streams.
_TAIL_MAX_TICKS: Final = PTS_HZ

# ISO/IEC 13818-1 Table 2-34 stream_type (and ETSI TS 101 154 / ATSC A/52 for the 0x81/0x87 audio).
_VIDEO_TYPES: Final[dict[int, VideoCodec]] = {0x1B: "h264", 0x24: "hevc"}
_AUDIO_TYPES: Final = frozenset({0x03, 0x04, 0x0F, 0x11, 0x81, 0x87})
_DESC_AC3: Final = 0x6A
_DESC_EAC3: Final = 0x7A


@dataclass(frozen=True, slots=True)
class Segment:
    """One finished media segment."""

    data: bytes
    """Whole TS packets: PAT, PMT, then the cut point's PES onwards."""
    duration: float
    """Seconds, from the PTS of its first cut point to that of the next segment's."""
    sequence: int
    """The segmenter's running number (0, 1, ...), gapless over the segments it answers."""
    discontinuity: bool
    """True when something before it was lost (a dropped segment, a gap, a timestamp jump)."""

    @property
    def packets(self) -> int:
        """The number of 188-byte TS packets in ``data``."""
        return len(self.data) // TS_PACKET_SIZE


@dataclass(slots=True)
class SegmenterStats:
    """What the segmenter threw away, for the driver's counters."""

    packets_in: int = 0
    bad_packets: int = 0  # wrong sync byte
    packets_before_start: int = 0  # before the first cut point (no PMT or keyframe yet)
    segments_dropped: int = 0  # too long or too big without a cut point, or cut by ``gap()``
    packets_dropped: int = 0  # the packets of the dropped segments
    timestamp_discontinuities: int = 0


class _Tail:
    """A segment that ended at a cut but still takes the other streams' PES from before the cut."""

    __slots__ = ("boundary", "data", "discard", "discontinuity", "duration", "routes", "sequence")

    def __init__(
        self,
        data: bytearray,
        duration: float,
        sequence: int,
        discontinuity: bool,
        boundary: int,
        *,
        discard: bool = False,
    ) -> None:
        self.discard = discard  # before the first segment: what would go here is left out
        self.data = data
        self.duration = duration
        self.sequence = sequence
        self.discontinuity = discontinuity
        self.boundary = boundary  # the PTS of the cut
        self.routes: dict[int, bool] = {}  # PID -> its packets still go here; gone once it switched


class _AacTrack:
    """An ADTS AAC stream (stream_type 0x0F): its PES is assembled whole so that one that spans
    a cut can be split at an ADTS frame boundary; its continuity counter is the segmenter's."""

    __slots__ = ("cc", "packets", "pts")

    def __init__(self) -> None:
        self.packets: list[bytes] = []  # the PES being assembled, as received
        self.pts: int | None = None
        self.cc = 0


class _Probe:
    """A PES start on the anchor PID whose cut-point status is not decided yet."""

    __slots__ = ("codec", "es", "header", "held", "held_bytes", "pts")

    def __init__(self, codec: VideoCodec | None) -> None:
        self.codec = codec
        self.header = bytearray()  # the PES bytes seen so far (header, then the start of the ES)
        self.es = 0  # offset of the ES in ``header`` once known, else 0
        self.pts: int | None = None
        self.held: list[bytes] = []  # every packet (all PIDs) since the PES start
        self.held_bytes = 0


class HlsSegmenter:
    """Raw TS in, ``Segment`` objects out (see the module docstring for the rules)."""

    def __init__(
        self,
        target_duration_secs: float,
        *,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
        max_segment_secs: float | None = None,
    ) -> None:
        if target_duration_secs <= 0:
            raise ValueError("target_duration_secs must be positive")
        self.target_duration_secs = target_duration_secs
        self._target_ticks = round(target_duration_secs * PTS_HZ)
        limit = (
            max_segment_secs if max_segment_secs is not None else max(3 * target_duration_secs, MIN_MAX_SEGMENT_SECS)
        )
        self._limit_ticks = round(limit * PTS_HZ)
        self._max_bytes = max_segment_bytes
        self.stats = SegmenterStats()
        self._partial = bytearray()  # the tail of a batch that was not a whole packet
        # Program tables.
        self._pat = SectionAssembler()
        self._pmt = SectionAssembler()
        self._program: int | None = None
        self._tsid = 1
        self._pmt_pid: int | None = None
        self._pmt_section: bytes | None = None
        self._anchor_pid: int | None = None
        self._anchor_codec: VideoCodec | None = None
        self._pat_cc = 0
        self._pmt_cc = 0
        # The segment being built.
        self._current = bytearray()
        self._start_pts: int | None = None  # None: no segment open (waiting for a cut point)
        self._last_pts: int | None = None  # latest anchor PES PTS inside the segment
        self._frame_ticks = 0  # latest positive anchor PTS step (a frame's duration)
        self._probe: _Probe | None = None
        self._sequence = 0
        self._tail: _Tail | None = None
        self._ready: list[Segment] = []  # answered by the next ``feed`` (after a ``gap``)
        self._others: frozenset[int] = frozenset()  # the program's PIDs other than the anchor
        self._aac: dict[int, _AacTrack] = {}  # those of them that are ADTS AAC
        self._discontinuity = False

    # ------------------------------------------------------------------ public

    @property
    def started(self) -> bool:
        """True once a first cut point was found (a segment is being built)."""
        return self._start_pts is not None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held: the open segment, the one that ended, a pending PES start, a partial packet."""
        held = self._probe.held_bytes if self._probe else 0
        tail = len(self._tail.data) if self._tail else 0
        return len(self._current) + held + tail + len(self._partial)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Segment]:
        """Take TS bytes; answer the segments they completed (oldest first)."""
        out = self._ready  # one list, so that segments come out in order from every path
        buf = bytes(self._partial) + bytes(data) if self._partial else bytes(data)
        self._partial.clear()
        n = len(buf)
        off = 0
        while off + TS_PACKET_SIZE <= n:
            if buf[off] != SYNC_BYTE:
                # ISO/IEC 13818-1 §2.4.3.3: resynchronise on the next sync byte.
                self.stats.bad_packets += 1
                nxt = buf.find(b"\x47", off + 1)
                if nxt < 0:
                    off = n
                    break
                off = nxt
                continue
            self.stats.packets_in += 1
            self._packet(buf[off : off + TS_PACKET_SIZE], out)
            off += TS_PACKET_SIZE
        if off < n:
            self._partial += buf[off:n]
        self._ready = []
        return out

    def gap(self) -> None:
        """The caller lost input here: drop the segment being built (counted); the next segment,
        from the next cut point, carries the discontinuity flag."""
        self._partial.clear()
        self._flush_tail(self._ready)
        for track in self._aac.values():  # a PES cut by the gap is not finished across it
            track.packets, track.pts = [], None
        if self._probe is not None:
            self._drop_segment(extra=len(self._probe.held))
            self._probe = None
        elif self._start_pts is not None:
            self._drop_segment()

    # ------------------------------------------------------------------ packets

    def _packet(self, pkt: bytes, out: list[Segment]) -> None:
        pid = packet_pid(pkt, 0)
        if pid == NULL_PID:
            return
        pusi = bool(pkt[1] & 0x40)
        if pid == PAT_PID:
            self._on_psi(pkt, pusi, self._pat, self._on_pat)
            return
        if pid == self._pmt_pid:
            self._on_psi(pkt, pusi, self._pmt, self._on_pmt)
            return
        if pid == self._anchor_pid and pusi:
            if self._probe is not None:
                self._decide(out, force=True)  # a new PES before the old one was decided
            self._probe = _Probe(self._anchor_codec)
            self._probe.held.append(pkt)
            self._probe.held_bytes += TS_PACKET_SIZE
            self._probe_bytes(pkt)
            self._decide(out)
            return
        if self._probe is not None:
            self._probe.held.append(pkt)
            self._probe.held_bytes += TS_PACKET_SIZE
            if pid == self._anchor_pid:
                self._probe_bytes(pkt)
            self._decide(out)
            return
        self._append(pkt)

    def _append(self, pkt: bytes) -> None:
        tail = self._tail
        pid = packet_pid(pkt, 0)
        track = self._aac.get(pid)
        if track is not None:
            self._aac_packet(pid, track, pkt)
            return
        if tail is not None:
            route = tail.routes.get(pid)
            if route is not None:
                if pkt[1] & 0x40:  # a PES start: before the cut (still the old segment) or not
                    start = payload_offset(pkt, 0)
                    pts = pes_pts(pkt, start, TS_PACKET_SIZE) if start is not None else None
                    route = pts is not None and ts_delta(pts, tail.boundary) < 0
                    if not route:
                        del tail.routes[pid]
                if route:
                    tail.data += pkt
                    if len(tail.data) >= self._max_bytes:
                        self._flush_tail(self._ready)
                    return
                if not tail.routes:
                    self._flush_tail(self._ready)
        if self._start_pts is None:
            self.stats.packets_before_start += 1
            return
        self._current += pkt
        if len(self._current) >= self._max_bytes:
            self._drop_segment()

    # ------------------------------------------------------------------ AAC, split at cuts

    def _aac_packet(self, pid: int, track: _AacTrack, pkt: bytes) -> None:
        if pkt[1] & 0x40:
            self._place(pid, track)  # the previous PES is complete
            start = payload_offset(pkt, 0)
            track.pts = pes_pts(pkt, start, TS_PACKET_SIZE) if start is not None else None
            track.packets = [pkt]
            tail = self._tail
            if tail is not None and pid in tail.routes and not self._before(track.pts, tail.boundary):
                del tail.routes[pid]  # this stream has reached the cut
                if not tail.routes:
                    self._flush_tail(self._ready)
        elif track.packets:
            track.packets.append(pkt)
            if len(track.packets) >= _MAX_AAC_PES_PACKETS:
                self._place(pid, track)
        else:
            self.stats.packets_before_start += 1  # the rest of a PES whose start was not seen

    @staticmethod
    def _before(pts: int | None, boundary: int) -> bool:
        return pts is not None and ts_delta(pts, boundary) < 0

    def _place(self, pid: int, track: _AacTrack) -> None:
        """Put the assembled PES where its time belongs, split at the cut when it spans one."""
        packets, pts = track.packets, track.pts
        track.packets, track.pts = [], None
        if not packets:
            return
        tail = self._tail
        if tail is None or pid not in tail.routes or pts is None or not self._before(pts, tail.boundary):
            self._put(track, self._current if self._start_pts is not None else None, packets)
            return
        pes = bytearray()
        for pkt in packets:
            start = payload_offset(pkt, 0)
            if start is not None:
                pes += pkt[start:]
        es = pes_payload_start(pes, 0, len(pes))
        split: tuple[int, int] | None = None  # (offset in the ES, PTS) of the first frame at or after the cut
        if es is not None:
            samples = 0
            for offset, frame in iter_adts(memoryview(pes)[es:]):
                frame_pts = (pts + samples * PTS_HZ // frame.config.sample_rate) % PTS_WRAP
                if not self._before(frame_pts, tail.boundary):
                    split = (offset, frame_pts)
                    break
                samples += frame.samples
        target = None if tail.discard else tail.data
        if es is None or split is None:
            self._put(track, target, packets)  # all of it before the cut
            return
        offset, split_pts = split
        payload = bytes(pes[es:])
        stream_id = pes[3]
        if offset:
            self._put_pes(track, pid, target, stream_id, payload[:offset], pts)
        self._put_pes(
            track, pid, self._current if self._start_pts is not None else None, stream_id, payload[offset:], split_pts
        )

    def _put(self, track: _AacTrack, target: bytearray | None, packets: list[bytes]) -> None:
        if target is None:
            self.stats.packets_before_start += len(packets)
            return
        for pkt in packets:
            if pkt[3] & 0x10:  # a payload: the next counter (§2.4.3.3)
                target += pkt[:3] + bytes(((pkt[3] & 0xF0) | track.cc,)) + pkt[4:]
                track.cc = (track.cc + 1) & 0x0F
            else:
                target += pkt[:3] + bytes(((pkt[3] & 0xF0) | ((track.cc - 1) & 0x0F),)) + pkt[4:]

    def _put_pes(
        self, track: _AacTrack, pid: int, target: bytearray | None, stream_id: int, payload: bytes, pts: int
    ) -> None:
        if target is None:
            return
        try:
            pes = pes_header(stream_id, len(payload), pts, None, bounded=True) + payload
        except ValueError:
            return
        first = True
        while pes:
            room = 184
            chunk, pes = pes[:room], pes[room:]
            header = bytes((SYNC_BYTE, (0x40 if first else 0) | (pid >> 8), pid & 0xFF))
            if len(chunk) < room:  # the last packet: stuffing in an adaptation field (§2.4.3.5)
                stuffing = room - len(chunk) - 1
                field = bytes((stuffing,)) + (b"\x00" + b"\xff" * (stuffing - 1) if stuffing else b"")
                target += header + bytes((0x30 | track.cc,)) + field + chunk
            else:
                target += header + bytes((0x10 | track.cc,)) + chunk
            track.cc = (track.cc + 1) & 0x0F
            first = False

    def _on_psi(self, pkt: bytes, pusi: bool, assembler: SectionAssembler, handler: Callable[[bytes], None]) -> None:
        start = payload_offset(pkt, 0)
        if start is None:
            return
        for section in assembler.feed(pkt[start:], pusi):
            if section_crc_ok(section):  # ISO/IEC 13818-1 Annex A: a section failing its CRC is discarded
                handler(section)

    def _on_pat(self, section: bytes) -> None:
        programs = parse_pat(section)
        if not programs:
            return
        for number, pid in programs:
            if number != 0:  # program 0 is the network PID (§2.4.4.3)
                if (number, pid) != (self._program, self._pmt_pid):
                    # Another program: nothing open belongs to it; wait for its PMT.
                    self._probe = None
                    self._drop_segment()
                    self._program, self._pmt_pid = number, pid
                    self._pmt = SectionAssembler()
                    self._pmt_section = None
                    self._anchor_pid, self._anchor_codec = None, None
                self._tsid = (section[3] << 8) | section[4]
                return

    def _on_pmt(self, section: bytes) -> None:
        pmt = parse_pmt(section)
        if pmt is None or pmt.program_number != self._program or section == self._pmt_section:
            return
        self._pmt_section = section
        anchor: tuple[int, VideoCodec | None] | None = None
        for es in pmt.streams:
            if es.stream_type in _VIDEO_TYPES:
                anchor = (es.pid, _VIDEO_TYPES[es.stream_type])
                break
        if anchor is None:
            for es in pmt.streams:
                private_audio = es.stream_type == 0x06 and (
                    _DESC_AC3 in es.descriptor_tags or _DESC_EAC3 in es.descriptor_tags
                )
                if es.stream_type in _AUDIO_TYPES or private_audio:
                    anchor = (es.pid, None)
                    break
        new_pid, new_codec = anchor if anchor is not None else (None, None)
        self._others = frozenset(es.pid for es in pmt.streams if es.pid != new_pid)
        self._aac = {
            es.pid: self._aac.get(es.pid) or _AacTrack()
            for es in pmt.streams
            if es.pid != new_pid and es.stream_type == _STREAM_TYPE_ADTS
        }
        if (new_pid, new_codec) != (self._anchor_pid, self._anchor_codec):
            # A new anchor: what is open cannot be ended at a cut point of the old one.
            self._probe = None
            if self._start_pts is not None:
                self._drop_segment()
            self._anchor_pid, self._anchor_codec = new_pid, new_codec
        elif self._start_pts is not None:
            self._current += self._tables()  # the new PMT, in place (same anchor)

    def _tables(self) -> bytes:
        assert self._program is not None and self._pmt_pid is not None and self._pmt_section is not None
        pat, self._pat_cc = section_packets(
            PAT_PID, pat_section(self._tsid, self._program, self._pmt_pid), self._pat_cc
        )
        pmt, self._pmt_cc = section_packets(self._pmt_pid, self._pmt_section, self._pmt_cc)
        return pat + pmt

    # ------------------------------------------------------------------ cut points

    def _probe_bytes(self, pkt: bytes) -> None:
        probe = self._probe
        assert probe is not None
        start = payload_offset(pkt, 0)
        if start is None or len(probe.header) >= _MAX_PROBE_BYTES:
            return
        probe.header += pkt[start:]
        if probe.pts is None and not probe.es:
            es = pes_payload_start(probe.header, 0, len(probe.header))
            if es is not None:
                probe.es = es
                probe.pts = pes_pts(probe.header, 0, len(probe.header))

    def _decide(self, out: list[Segment], *, force: bool = False) -> None:
        """Settle the pending PES start: a cut point or not (``force``: with what is known)."""
        probe = self._probe
        assert probe is not None
        keyframe: bool | None
        if not probe.es:
            keyframe = None  # the PES header is not complete yet
        elif probe.codec is None:
            keyframe = True  # audio-only: every audio PES start with a PTS
        else:
            keyframe = annexb_keyframe(probe.codec, memoryview(probe.header)[probe.es :])
        if keyframe is None:
            if not force and probe.held_bytes < _MAX_HELD_BYTES and len(probe.header) < _MAX_PROBE_BYTES:
                return  # wait for more of this PES
            keyframe = False
        self._probe = None
        pts = probe.pts
        if pts is not None and self._tail is not None and ts_delta(pts, self._tail.boundary) > _TAIL_MAX_TICKS:
            self._flush_tail(out)
        if pts is not None and self._start_pts is not None:
            self._check_timeline(pts, keyframe, out)
        if keyframe and pts is not None and self._is_cut(pts):
            self._cut(pts, out)
        elif pts is not None and self._start_pts is not None:
            if self._last_pts is None or ts_delta(pts, self._last_pts) > 0:
                self._last_pts = pts  # the latest presentation time (B pictures come out of order)
        for pkt in probe.held:
            self._append(pkt)

    def _check_timeline(self, pts: int, keyframe: bool, out: list[Segment]) -> None:
        """End the segment at a timestamp discontinuity or drop it when it is too long."""
        assert self._start_pts is not None
        elapsed = ts_delta(pts, self._start_pts)
        if self._last_pts is not None:
            step = ts_delta(pts, self._last_pts)
            if 0 < step <= PTS_HZ:
                self._frame_ticks = step
        # Leading pictures (HEVC RASL, §8.1) may be a little earlier than the segment's start.
        jumped = elapsed < -PTS_HZ or elapsed > self._limit_ticks + PTS_HZ
        if jumped and keyframe:
            # RFC 8216 §4.3.2.3: a new timestamp sequence. End here with what was seen.
            self.stats.timestamp_discontinuities += 1
            last = self._last_pts if self._last_pts is not None else self._start_pts
            ticks = ts_delta(last, self._start_pts) + self._frame_ticks
            self._flush_tail(out)
            self._emit(max(ticks, 1) / PTS_HZ, out)
            self._discontinuity = True
            self._start_pts = None
        elif elapsed > self._limit_ticks or jumped:
            self._drop_segment()

    def _is_cut(self, pts: int) -> bool:
        if self._start_pts is None:
            return self._pmt_section is not None
        return ts_delta(pts, self._start_pts) >= self._target_ticks

    def _cut(self, pts: int, out: list[Segment]) -> None:
        self._flush_tail(out)
        if self._start_pts is not None:
            duration = ts_delta(pts, self._start_pts) / PTS_HZ
            tail = _Tail(self._current, duration, self._sequence, self._discontinuity, pts)
            tail.routes = dict.fromkeys(self._others, True)
            self._sequence += 1
            self._discontinuity = False
            self._tail = tail
            if not tail.routes:
                self._flush_tail(out)
        elif not self._tail:
            # The first segment: the other streams' PES from before the cut are left out.
            self._tail = _Tail(bytearray(), 0.0, -1, False, pts, discard=True)
            self._tail.routes = dict.fromkeys(self._others, True)
        self._start_pts = pts
        self._last_pts = pts
        self._current = bytearray(self._tables())

    def _emit(self, duration: float, out: list[Segment]) -> None:
        out.append(Segment(bytes(self._current), duration, self._sequence, self._discontinuity))
        self._sequence += 1
        self._discontinuity = False
        self._current = bytearray()

    def _flush_tail(self, out: list[Segment]) -> None:
        tail = self._tail
        if tail is not None:
            self._tail = None
            for pid, track in self._aac.items():
                if pid in tail.routes and track.packets and self._before(track.pts, tail.boundary):
                    self._place(pid, track)  # before anything later goes to the next segment
            if not tail.discard:
                out.append(Segment(bytes(tail.data), tail.duration, tail.sequence, tail.discontinuity))

    def _drop_segment(self, extra: int = 0) -> None:
        if self._start_pts is not None:
            self.stats.segments_dropped += 1
            self.stats.packets_dropped += len(self._current) // TS_PACKET_SIZE + extra
            self._discontinuity = True
        self._current = bytearray()
        self._start_pts = None
        self._last_pts = None


__all__ = ["HlsSegmenter", "Segment", "SegmenterStats"]
