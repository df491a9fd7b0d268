"""MPEG-TS -> FLV tags for an RTMP push (``rtmp`` output kind). Sans-IO.

``TsToFlv`` takes TS bytes (any split) and answers FLV tags with millisecond timestamps, ready
for ``RtmpClientConnection.send_video`` / ``send_audio``:

* **H.264**: an AVC sequence header (AVCDecoderConfigurationRecord from the stream's SPS/PPS,
  sent again whenever they change) then NALU frames: length-prefixed NAL units (4-octet
  lengths, access unit delimiters dropped), composition time ``(PTS - DTS) / 90`` ms, the key
  flag on IDR access units.
* **HEVC**: the same through Enhanced RTMP v1 (FourCC ``hvc1``: SequenceStart with the
  HEVCDecoderConfigurationRecord from VPS/SPS/PPS, then CodedFrames / CodedFramesX).
* **AAC**: an AAC sequence header (AudioSpecificConfig from the first ADTS header, again when
  it changes) then raw AAC frames (ADTS headers stripped).

Timestamps count from the DTS of the first access unit sent (the first video keyframe when
the program has video: nothing goes out before it), in ms; they follow the 33-bit 90 kHz clock
across its wrap, stay monotonic per stream, and a jump of more than ``MAX_JUMP_90K`` (a source
restart) continues the timeline instead of following it. Audio and video tags come out in
timestamp order: each stream's tags wait until the other stream has caught up, at most
``MAX_INTERLEAVE_MS`` (one stream stopping never stalls the other for longer).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

from ..media.bits import iter_nal_units
from ..rtmp.flv import AudioCodec, AudioTag, FrameType, PacketKind, VideoCodec, VideoTag
from .codec import (
    H264_NAL_AUD,
    H264_NAL_PPS,
    H264_NAL_SPS,
    HEVC_NAL_AUD,
    HEVC_NAL_PPS,
    HEVC_NAL_SPS,
    HEVC_NAL_VPS,
    AacConfig,
    AvcConfig,
    HevcConfig,
    build_asc,
    build_avcc,
    build_hvcc,
    parse_adts,
)
from .ts_demux import TsDemuxer
from .units import AccessUnit, ts_delta

MAX_JUMP_90K: Final = 10 * 90_000  # a DTS step beyond +-10 s is a discontinuity, not media time
MAX_INTERLEAVE_MS: Final = 1000  # how long one stream's tags wait for the other's
MAX_EARLY_AUDIO: Final = 256  # AAC frames held while waiting for the first keyframe (~5 s)
MAX_PENDING_TAGS: Final = 4096  # hard cap on tags held for interleaving (beyond: sent out of order)


@dataclass(frozen=True, slots=True)
class FlvTag:
    """One tag to send: ``tag`` at ``timestamp`` ms (the RTMP message timestamp, i.e. DTS)."""

    timestamp: int
    tag: VideoTag | AudioTag

    @property
    def is_video(self) -> bool:
        return isinstance(self.tag, VideoTag)


@dataclass(slots=True)
class ToFlvStats:
    """What the converter did; counts since construction."""

    video_frames: int = 0
    audio_frames: int = 0
    video_sequence_headers: int = 0
    audio_sequence_headers: int = 0
    dropped_before_keyframe: int = 0  # access units before the first usable keyframe
    dropped_before_start: int = 0  # audio older than the first video keyframe
    dropped_after_gap: int = 0  # video access units between a gap() and the next keyframe
    dropped_malformed: int = 0  # unparseable ADTS, a keyframe without parameter sets...
    discontinuities: int = 0  # DTS jumps beyond MAX_JUMP_90K
    out_of_order: int = 0  # tags sent out of timestamp order (interleave cap reached)


@dataclass(slots=True)
class _Track:
    pending: deque[FlvTag] = field(default_factory=deque)
    last_ms: int | None = None  # last timestamp queued (per-stream monotonic clamp)


class TsToFlv:
    """Feed TS bytes, get FLV tags (see the module docstring). ``program_number``: as TsDemuxer."""

    def __init__(self, program_number: int | None = None) -> None:
        self.demuxer = TsDemuxer(program_number)
        self.stats = ToFlvStats()
        self.video_codec: str | None = None  # "h264" / "hevc" once a sequence header went out
        self.audio_config: AacConfig | None = None
        self._video_sets: tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]] | None = None
        self._started = False  # the first keyframe (or, without video, the first audio frame) passed
        self._wait_keyframe = False  # after a gap (``gap()``): video resumes at the next keyframe
        self._base_ext = 0  # extended 90 kHz value of timestamp 0
        self._anchor_raw = 0  # the latest DTS accepted (33-bit) ...
        self._anchor_ext = 0  # ... and its extended value
        self._tracks = {"video": _Track(), "audio": _Track()}
        self._last_out = -1
        self._early_audio: deque[AccessUnit] = deque()
        self._release_early_audio = False

    # ------------------------------------------------------------------ API

    def feed(self, data: bytes | bytearray | memoryview) -> list[FlvTag]:
        """TS bytes in, the tags that are ready out (in timestamp order, as far as interleaving allows)."""
        for unit in self.demuxer.feed(data):
            self._unit(unit)
        return self._drain(final=False)

    def flush(self) -> list[FlvTag]:
        """End of stream: every unit the demuxer still holds and every tag waiting for interleaving."""
        for unit in self.demuxer.flush():
            self._unit(unit)
        return self._drain(final=True)

    def gap(self) -> None:
        """The caller lost TS here (a full queue dropped some): video resumes at the next
        keyframe, so the server gets no pictures that reference what was lost. Audio and the
        timeline go on."""
        if self._started:
            self._wait_keyframe = True

    @property
    def has_video(self) -> bool:
        """Whether the program (as its PMT says so far) carries a video stream this converts."""
        return any(kind == "video" for kind, _ in self.demuxer.streams.values())

    # ------------------------------------------------------------------ units

    def _unit(self, unit: AccessUnit) -> None:
        if unit.kind == "video":
            self._video(unit)
        else:
            self._audio(unit)

    def _video(self, unit: AccessUnit) -> None:
        hevc = unit.codec == "hevc"
        aud, sps_t, pps_t = (
            (HEVC_NAL_AUD, HEVC_NAL_SPS, HEVC_NAL_PPS) if hevc else (H264_NAL_AUD, H264_NAL_SPS, H264_NAL_PPS)
        )
        vps: list[bytes] = []
        sps: list[bytes] = []
        pps: list[bytes] = []
        out = bytearray()
        for nal in iter_nal_units(unit.data):
            if not nal:
                continue
            t = (nal[0] >> 1) & 0x3F if hevc else nal[0] & 0x1F
            if t == aud:
                continue
            if t == sps_t:
                if nal not in sps:
                    sps.append(nal)
            elif t == pps_t:
                if nal not in pps:
                    pps.append(nal)
            elif hevc and t == HEVC_NAL_VPS and nal not in vps:
                vps.append(nal)
            out += len(nal).to_bytes(4, "big")
            out += nal
        header: VideoTag | None = None
        if sps and pps and (not hevc or vps):
            sets = (tuple(vps), tuple(sps), tuple(pps))
            if sets != self._video_sets or self.video_codec != unit.codec:
                header = self._video_header(unit.codec, sets)
                if header is None:
                    self.stats.dropped_malformed += 1
                    return
                self._video_sets = sets
                self.video_codec = unit.codec
        if not self._started:
            if not unit.keyframe:
                self.stats.dropped_before_keyframe += 1
                return
            if self._video_sets is None or self.video_codec != unit.codec:
                self.stats.dropped_malformed += 1  # a keyframe a decoder cannot start from
                return
            self._start(unit.dts)
            if header is None:  # the sets came in an earlier (dropped) access unit
                header = self._video_header(unit.codec, self._video_sets)
                assert header is not None
            self._release_early_audio = True
        elif self._video_sets is None or self.video_codec != unit.codec:
            self.stats.dropped_malformed += 1
            return
        elif self._wait_keyframe:
            if not unit.keyframe:
                self.stats.dropped_after_gap += 1
                return
            self._wait_keyframe = False
        if not out:
            return
        ms = self._timestamp(unit.dts, "video")
        if ms is None:
            return
        track = self._tracks["video"]
        if header is not None:
            self.stats.video_sequence_headers += 1
            track.pending.append(FlvTag(ms, header))
        cts = round(ts_delta(unit.pts, unit.dts) / 90)
        codec = VideoCodec.HEVC if hevc else VideoCodec.AVC
        frame_type = FrameType.KEY if unit.keyframe else FrameType.INTER
        track.pending.append(FlvTag(ms, VideoTag(codec, frame_type, PacketKind.FRAME, bytes(out), cts, hevc)))
        self.stats.video_frames += 1
        if self._release_early_audio:
            self._release_early_audio = False
            early, self._early_audio = self._early_audio, deque()
            for held in early:
                self._audio(held)

    def _video_header(
        self, codec: str, sets: tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]]
    ) -> VideoTag | None:
        vps, sps, pps = sets
        try:
            if codec == "hevc":
                record = build_hvcc(HevcConfig.from_parameter_sets(vps, sps, pps))
                return VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, record, 0, True)
            record = build_avcc(AvcConfig.from_parameter_sets(sps, pps))
        except ValueError:
            return None
        return VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, record)

    def _audio(self, unit: AccessUnit) -> None:
        frame = parse_adts(unit.data)
        if frame is None or not frame.raw:
            self.stats.dropped_malformed += 1
            return
        if not self._started:
            if self.has_video:
                # Held until the keyframe: the frames from its DTS on go out after it.
                if len(self._early_audio) == MAX_EARLY_AUDIO:
                    self._early_audio.popleft()
                    self.stats.dropped_before_keyframe += 1
                self._early_audio.append(unit)
                return
            self._start(unit.dts)
        ms = self._timestamp(unit.dts, "audio")
        if ms is None:
            return
        track = self._tracks["audio"]
        if frame.config != self.audio_config:
            try:
                asc = build_asc(frame.config)
            except ValueError:
                self.stats.dropped_malformed += 1
                return
            self.audio_config = frame.config
            self.stats.audio_sequence_headers += 1
            track.pending.append(FlvTag(ms, AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, asc)))
        track.pending.append(FlvTag(ms, AudioTag(AudioCodec.AAC, PacketKind.FRAME, frame.raw)))
        self.stats.audio_frames += 1

    # ------------------------------------------------------------------ timestamps

    def _start(self, dts: int) -> None:
        self._started = True
        self._anchor_raw = dts
        self._anchor_ext = self._base_ext = 0

    def _timestamp(self, dts: int, kind: str) -> int | None:
        """The ms timestamp of ``dts`` on the output timeline; None: too old to send (dropped)."""
        delta = ts_delta(dts, self._anchor_raw)
        track = self._tracks[kind]
        if abs(delta) > MAX_JUMP_90K:
            # A source restart or splice: continue the timeline just after what went out.
            self.stats.discontinuities += 1
            last = max((t.last_ms for t in self._tracks.values() if t.last_ms is not None), default=0)
            self._anchor_raw = dts
            self._anchor_ext = self._base_ext + (last + 1) * 90
            delta = 0
        ext = self._anchor_ext + delta
        if delta > 0:
            self._anchor_raw, self._anchor_ext = dts, ext
        ms = (ext - self._base_ext) // 90
        if ms < 0:
            self.stats.dropped_before_start += 1
            return None
        if track.last_ms is not None and ms < track.last_ms:
            ms = track.last_ms  # never backwards within a stream
        track.last_ms = ms
        return ms

    # ------------------------------------------------------------------ interleaving

    def _drain(self, *, final: bool) -> list[FlvTag]:
        out: list[FlvTag] = []
        video, audio = self._tracks["video"], self._tracks["audio"]
        vq, aq = video.pending, audio.pending
        declared = {kind for kind, _ in self.demuxer.streams.values()}
        while vq or aq:
            if vq and aq:
                q = vq if vq[0].timestamp <= aq[0].timestamp else aq
            else:
                q = vq or aq
                other = "audio" if q is vq else "video"
                # Wait for the other stream while the PMT lists it and the wait is short.
                waiting = other in declared and not final
                if waiting and q[-1].timestamp - q[0].timestamp <= MAX_INTERLEAVE_MS and len(q) < MAX_PENDING_TAGS:
                    break
            tag = q.popleft()
            if tag.timestamp < self._last_out:
                self.stats.out_of_order += 1
            else:
                self._last_out = tag.timestamp
            out.append(tag)
        return out


__all__ = ["MAX_INTERLEAVE_MS", "MAX_JUMP_90K", "FlvTag", "ToFlvStats", "TsToFlv"]
