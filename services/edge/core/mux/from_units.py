"""Timed access units of a live input -> MPEG-TS datagrams: program choice and interleaving. Sans-IO.

``UnitsToTs`` is the source-independent back half of the RTSP input (and later WebRTC/HLS):
it takes :class:`AccessUnit` objects (Annex B video / ADTS audio, 90 kHz PTS/DTS already on
one clock) from up to one video and one audio stream and answers 1316-byte datagrams (7 x 188
TS packets) from :class:`TsMuxer`, like :class:`~.from_flv.FlvToTs` does for RTMP.

**Program choice.** :meth:`UnitsToTs.begin` names the streams the source sends (from an SDP,
say): they make the program. Units are held until every expected stream has produced one, or
until what is held spans ``wait`` (1 s of media), or ``MAX_PENDING`` units are held; then the
program (PAT/PMT) starts with every expected stream, so a stream that starts late (video
waiting for its first keyframe in a long GOP) joins it when it comes. Units of another codec
than announced are dropped and counted (``late_streams``). Video starts at a keyframe: video
before it is dropped (counted).

**Interleaving.** :class:`TsMuxer` wants units in DTS order across streams. Once started, units
are queued per stream and the unit with the lowest DTS is muxed whenever every stream of the
program has one queued, or when the queue spans more than ``hold`` (300 ms of media), so a
stream that stalls delays the other by at most ``hold``. A unit whose DTS is before the last
muxed DTS of its stream is dropped (``late_units``): the output clock never runs backwards.

**Sessions.** The muxer (and its continuity counters) survives a new :meth:`begin` (a
reconnect): when the new session expects the same codecs the program goes on; when they
differ a new muxer takes over at the next start, with PAT/PMT version numbers one higher and
the continuity counters carried on. A changed video codec also moves to another PID (the
template's PID plus 0x10, and back on the next change): demuxers, ffmpeg's among them, keep
the decoder of a PID whose stream_type changes. The caller keeps the timestamps of a new
session after those of the old one (:attr:`last_dts` tells where the old one ended).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Final, Literal

from .codec import VideoCodec
from .from_flv import DATAGRAM_SIZE, TS_PACKET_SIZE, WAIT_MS
from .ts_mux import (
    NULL_PACKET,
    DatagramPacker,
    MuxConfig,
    TsMuxer,
)
from .units import AccessUnit, StreamKind

WAIT: Final = WAIT_MS * 90  # 90 kHz ticks of media the program choice waits for the other stream
HOLD: Final = 27_000  # 300 ms: the most the interleaving holds one stream for the other
MAX_PENDING: Final = 512  # units held at most (before the start, or in the interleaving queues)
AudioCodec = Literal["aac"]


@dataclass(slots=True)
class UnitsToTsStats:
    """Counters of :class:`UnitsToTs`."""

    video_units: int = 0  # muxed
    audio_units: int = 0  # muxed
    datagrams: int = 0
    dropped_before_keyframe: int = 0
    late_streams: int = 0  # units of a codec the session did not announce
    late_units: int = 0  # units before the last muxed DTS of their stream
    overflow: int = 0  # units dropped because MAX_PENDING units were held
    programs: int = 0  # muxers created (a codec change on a new session makes a new one)


class UnitsToTs:
    """Access units of one live source -> TS datagrams (see the module docstring)."""

    def __init__(self, *, mux: MuxConfig | None = None, wait: int = WAIT, hold: int = HOLD) -> None:
        self.wait = wait
        self.hold = hold
        self._template = mux if mux is not None else MuxConfig()
        self.stats = UnitsToTsStats()
        self.program: tuple[VideoCodec | None, AudioCodec | None] | None = None
        self._muxer: TsMuxer | None = None
        self._packer = DatagramPacker()
        self._expected: tuple[VideoCodec | None, AudioCodec | None] = (None, None)
        self._queues: dict[StreamKind, deque[AccessUnit]] = {"video": deque(), "audio": deque()}
        self._started = False
        self._seen_keyframe = False
        self._last: dict[StreamKind, int] = {}
        self._version = 0
        self._last_video: tuple[int, VideoCodec] | None = None  # (PID, codec) of the last video stream
        self.last_dts: int | None = None  # highest DTS muxed (90 kHz, unwrapped)

    # ------------------------------------------------------------------ public API

    def begin(self, video: VideoCodec | None, audio: AudioCodec | None) -> list[bytes]:
        """A (new) session that will bring ``video``/``audio`` units: what an earlier session
        still held is muxed and answered; the program choice starts over."""
        if video is None and audio is None:
            raise ValueError("a session needs a video or an audio stream")
        out = self._drain() if self._started else []
        self._queues["video"].clear()
        self._queues["audio"].clear()
        self._expected = (video, audio)
        self._started = False
        self._seen_keyframe = False
        return self._count(out)

    def push(self, unit: AccessUnit) -> list[bytes]:
        """One access unit (video in decoding order): the datagrams completed (often none)."""
        kind: StreamKind = unit.kind
        expected = self._expected[0] if kind == "video" else self._expected[1]
        if unit.codec != expected or (self._started and not self._in_program(kind)):
            self.stats.late_streams += 1
            return []
        if kind == "video" and not self._seen_keyframe:
            if not unit.keyframe:
                self.stats.dropped_before_keyframe += 1
                return []
            self._seen_keyframe = True
        if kind in self._last and unit.dts <= self._last[kind]:
            self.stats.late_units += 1
            return []
        queue = self._queues[kind]
        if queue and unit.dts < queue[-1].dts:
            self.stats.late_units += 1
            return []
        if self._held() >= MAX_PENDING:
            self.stats.overflow += 1
            return []
        queue.append(unit)
        if not self._started:
            if not self._ready():
                return []
            self._start()
        return self._count(self._packer.push(self._interleave(final=False)))

    def flush(self) -> list[bytes]:
        """End of the source: everything held is muxed, then the last datagram padded with null packets."""
        out = self._drain()
        for tail in self._packer.flush():
            out.append(tail + NULL_PACKET * ((DATAGRAM_SIZE - len(tail)) // TS_PACKET_SIZE))
        return self._count(out)

    @property
    def started(self) -> bool:
        """True once the program of the current session is fixed."""
        return self._started

    @property
    def muxer(self) -> TsMuxer | None:
        """The muxer in use (None before the first start)."""
        return self._muxer

    # ------------------------------------------------------------------ internals

    def _count(self, out: list[bytes]) -> list[bytes]:
        self.stats.datagrams += len(out)
        return out

    def _held(self) -> int:
        return len(self._queues["video"]) + len(self._queues["audio"])

    def _in_program(self, kind: StreamKind) -> bool:
        return self.program is not None and (self.program[0] if kind == "video" else self.program[1]) is not None

    def _span(self) -> int:
        units = [u for q in self._queues.values() if q for u in (q[0], q[-1])]
        return max(u.dts for u in units) - min(u.dts for u in units) if units else 0

    def _ready(self) -> bool:
        video, audio = self._expected
        have_video = bool(self._queues["video"]) or video is None
        have_audio = bool(self._queues["audio"]) or audio is None
        return (have_video and have_audio) or self._span() >= self.wait or self._held() >= MAX_PENDING

    def _drain(self) -> list[bytes]:
        if not self._started:
            if not self._held():
                return []
            self._start()
        return self._packer.push(self._interleave(final=True))

    def _start(self) -> None:
        video, audio = program = self._expected  # the source said what it sends (an SDP, say)
        self._started = True
        if self._muxer is not None and program == self.program:
            return  # same codecs on a new session: the program goes on
        t = self._template
        video_pid = self._video_pid(video)
        config = replace(t, video_codec=video, audio_codec=audio, video_pid=video_pid)
        if video is not None:
            self._last_video = (video_pid, video)
        if self._muxer is None:
            muxer = TsMuxer(config)
        else:  # a new program on the same stream: new table version, counters go on
            self._version = (self._version + 1) & 0x1F
            muxer = TsMuxer(config, version=self._version, continuity=self._muxer.continuity)
        self._muxer = muxer
        self.program = program
        self.stats.programs += 1

    def _video_pid(self, video: VideoCodec | None) -> int:
        """The template's video PID, or another one when the video codec changed: demuxers
        (ffmpeg's among them) keep the decoder of a PID whose stream_type changes."""
        t = self._template
        if self._last_video is None or video is None:
            return self._last_video[0] if self._last_video is not None else t.video_pid
        pid, codec = self._last_video
        if codec == video:
            return pid
        taken = {pid, t.audio_pid, t.pmt_pid}
        return next(p for p in (t.video_pid, t.video_pid + 0x10, t.video_pid + 0x20) if p not in taken)

    def _interleave(self, *, final: bool) -> bytearray:
        muxer = self._muxer
        assert muxer is not None
        out = bytearray()
        video, audio = self._queues["video"], self._queues["audio"]
        both = self._in_program("video") and self._in_program("audio")
        while video or audio:
            if not final and both and not (video and audio) and self._span() <= self.hold:
                break
            queue = video if video and (not audio or video[0].dts <= audio[0].dts) else audio
            unit = queue.popleft()
            out += muxer.mux(unit)
            self._last[unit.kind] = unit.dts
            self.last_dts = unit.dts if self.last_dts is None else max(self.last_dts, unit.dts)
            if unit.kind == "video":
                self.stats.video_units += 1
            else:
                self.stats.audio_units += 1
        return out


__all__ = ["HOLD", "MAX_PENDING", "WAIT", "UnitsToTs", "UnitsToTsStats"]
