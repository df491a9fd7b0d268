"""Media bridges between MPEG-TS and WebRTC for the edge's WebRTC worker. Sans-IO.

Plain classes, bytes and numbers in, bytes/objects out (no sockets, clocks or trio; the caller
passes arrival times). They reuse the TS cores of ``services/edge/core/mux`` and PyAV for the
audio transcode that WebRTC forces on us (browsers send and take Opus, TS carries AAC):

* :class:`TsToRtc` (WHEP serving / WHIP client, the send side): TS datagrams -> H.264 access
  units as they are (RFC 6184 packetisation is the caller's: ``core/pay``) and Opus packets
  (RFC 7587), both timed on the TS's 90 kHz clock unwrapped across its 33-bit wrap
  (ISO/IEC 13818-1 §2.4.3.7).
* :class:`RtcToTs` (WHIP serving / WHEP client, the receive side): aiortc's assembled H.264
  access units and decoded Opus frames -> AAC/H.264 TS datagrams through
  :class:`~services.edge.core.mux.from_units.UnitsToTs`.

What aiortc hands the receive side (aiortc 1.16, read from its source):

* Video: ``h264_depayload`` turns each RTP payload into Annex B with four-byte start codes
  (single NAL unit packets: ``00 00 00 01`` + the NAL; STAP-A: each aggregated NAL behind its
  own start code; FU-A: the start code and rebuilt NAL header on the first fragment only), and
  the jitter buffer joins the payloads of all packets with one RTP timestamp into one frame,
  released when a packet of the next timestamp arrives (the marker bit is not used). So one
  ``annexb`` is one access unit; the parameter sets come before an IDR only when the sender
  put them in the stream (browsers do, in a STAP-A). STAP-B/MTAP/FU-B are rejected by aiortc.
* The timestamp is the RTP timestamp mapped by aiortc's ``TimestampMapper``: 0 at the first
  frame, and already unwrapped (it adds 2^32 whenever a timestamp is lower than the previous
  one). We unwrap again (a no-op then) so that raw RTP timestamps work as well.
* Audio: aiortc's ``OpusDecoder`` (libopus through PyAV) gives ``av.AudioFrame`` s16 packed,
  stereo, 48 kHz, usually 960 samples (20 ms), ``pts`` in 1/48000 from the mapped RTP timestamp
  (RFC 7587 §4.1: the Opus RTP clock is always 48 kHz), so 0 at the first packet.
"""

from __future__ import annotations

import fractions
from dataclasses import dataclass
from typing import Any, Final, Literal

import av
import av.error

from ..core.depay.common import Frame
from ..core.depay.session import DtsDeriver  # one DTS derivation for every RTP video ingest
from ..core.mux.codec import (
    H264_NAL_AUD,
    AacConfig,
    ParameterSetInserter,
    annexb_keyframe,
    build_adts_frame,
    h264_nal_type,
    join_annexb,
    parse_adts,
    parse_asc,
    split_annexb,
)
from ..core.mux.from_flv import TIMESTAMP_BASE
from ..core.mux.from_units import UnitsToTs
from ..core.mux.ts_demux import TsDemuxer
from ..core.mux.ts_mux import MuxConfig
from ..core.mux.units import TS_WRAP, AccessUnit

OPUS_RATE: Final = 48_000  # RFC 7587 §4.1: the RTP clock rate of Opus is 48 kHz whatever the audio band
OPUS_FRAME: Final = 960  # 20 ms at 48 kHz: the ptime browsers use
OPUS_BITRATE: Final = 96_000
AAC_RATE: Final = 48_000
AAC_BITRATE: Final = 128_000
VIDEO_HZ: Final = 90_000  # RFC 6184 §5.1: the H.264 RTP clock; also the TS PTS clock
MAX_GAP_48K: Final = OPUS_RATE  # 1 s: a longer jump (or one backwards) restarts an audio timeline
BACKWARDS_TOLERANCE_90K: Final = 90  # 1 ms: the demuxer's per-frame PTS rounding at 44.1 kHz
RTP_WRAP: Final = 1 << 32

_TIME_BASE_48K: Final = fractions.Fraction(1, OPUS_RATE)


def _opus_encoder() -> av.AudioCodecContext:
    """An Opus encoder: libopus when this PyAV build has it (the better one), else FFmpeg's own."""
    if "libopus" in av.codecs_available:
        return av.CodecContext.create("libopus", "w")
    return av.CodecContext.create("opus", "w")


class _Unwrapper:
    """Extends a wrapping counter (33-bit PTS, 32-bit RTP timestamp) to a monotonic int.

    Each value is placed nearest to the previous one, so it follows jumps of less than half
    the wrap in either direction. Values already unwrapped pass through unchanged.
    """

    __slots__ = ("_last", "_wrap")

    def __init__(self, wrap: int) -> None:
        self._wrap = wrap
        self._last: int | None = None

    def __call__(self, value: int) -> int:
        last = self._last
        if last is None:
            self._last = value
            return value
        half = self._wrap // 2
        delta = (value - last) % self._wrap
        if delta >= half:
            delta -= self._wrap
        self._last = last + delta
        return self._last


class _Resampler:
    """An ``av.AudioResampler`` to fixed-size stereo frames of one format and rate that survives a
    change of the input's format, layout or rate (PyAV's raises ValueError then): the old one's
    tail is flushed (padded with silence to a whole frame) and a new one takes over."""

    __slots__ = ("_format", "_frame_size", "_input", "_rate", "_resampler", "restarts")

    def __init__(self, fmt: str, rate: int, frame_size: int) -> None:
        self._format = fmt
        self._rate = rate
        self._frame_size = frame_size
        self._resampler = av.AudioResampler(format=fmt, layout="stereo", rate=rate, frame_size=frame_size)
        self._input: tuple[str, str, int] | None = None
        self.restarts = 0

    def resample(self, frame: av.AudioFrame) -> list[av.AudioFrame]:
        """The whole output frames ``frame`` completes."""
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        out: list[av.AudioFrame] = []
        if self._input is not None and key != self._input:
            out += self.flush()
            self.restarts += 1
        self._input = key
        out += self._resampler.resample(frame)
        return out

    def flush(self) -> list[av.AudioFrame]:
        """What is held, the last frame padded with silence; then a fresh resampler."""
        out = [_pad(chunk, self._frame_size) for chunk in self._resampler.resample(None)]
        self._resampler = av.AudioResampler(
            format=self._format, layout="stereo", rate=self._rate, frame_size=self._frame_size
        )
        self._input = None
        return out


def _pad(frame: av.AudioFrame, samples: int) -> av.AudioFrame:
    """``frame`` lengthened to ``samples`` samples with silence (zero bytes, for s16 and float)."""
    if frame.samples >= samples:
        return frame
    padded = av.AudioFrame(format=frame.format.name, layout=frame.layout.name, samples=samples)
    padded.sample_rate = frame.sample_rate
    per_sample = frame.format.bytes * (1 if frame.format.is_planar else len(frame.layout.channels))
    for src, dst in zip(frame.planes, padded.planes, strict=True):
        pcm = bytes(src)[: frame.samples * per_sample]
        dst.update(pcm + bytes(dst.buffer_size - len(pcm)))
    return padded


# ---------------------------------------------------------------------------------------------
# TS -> WebRTC


@dataclass(frozen=True, slots=True)
class RtcUnit:
    """One unit ready for an RTP packetiser.

    ``data``: video, one H.264 access unit in Annex B (no AUD; SPS+PPS before every IDR), for
    RFC 6184 packetisation; audio, one 20 ms Opus packet (RFC 7587). ``pts``: video in 90 kHz,
    audio in 48 kHz, both from the same TS clock and unwrapped (monotonic ints, no 33-bit wrap),
    so a sender can use them as RTP timestamps (plus its random offset) and keep lip sync.
    ``keyframe``: an IDR for video; always True for audio.
    """

    kind: Literal["video", "audio"]
    data: bytes
    pts: int
    keyframe: bool


@dataclass(slots=True)
class TsToRtcStats:
    """Counters of :class:`TsToRtc`."""

    video_units: int = 0  # H.264 units answered
    audio_packets: int = 0  # Opus packets answered
    aac_units: int = 0  # AAC frames taken from the TS
    dropped_units: int = 0  # non-H.264 video (HEVC), undecodable audio
    before_keyframe: int = 0  # H.264 units before the first IDR with parameter sets (undecodable)
    audio_restarts: int = 0  # audio timelines started (the first one included)


class TsToRtc:
    """MPEG-TS datagrams in, WebRTC-ready H.264 access units and Opus packets out.

    Video is passed through (WebRTC needs no re-encode for H.264): AUDs are removed (in RTP the
    timestamp and the marker bit delimit access units, RFC 6184 §5.1; core/pay drops them too) and
    the last SPS/PPS are put in front of every IDR that lacks them, so a receiver that joins or
    loses packets can start at any IDR. Units keep the TS's decode order; a source with B-frames
    gives non-monotonic PTS, which browsers cope with badly: WebRTC sources should be baseline/main
    without B-frames. Video before the first decodable IDR is dropped (``stats.before_keyframe``).
    HEVC video is dropped and counted: this bridge offers H.264 only.

    Audio (unless ``video_only``): AAC is decoded, resampled to 48 kHz stereo and encoded to
    20 ms Opus packets. Their pts stay on the video clock: a timeline starts at
    round(pts90 * 48000 / 90000) of the AAC frame that starts it and then counts samples; an
    AAC PTS that jumps more than 1 s or goes backwards restarts it (after flushing the
    encoder), so Opus timestamps follow the TS through discontinuities.
    """

    def __init__(self, *, video_only: bool = False) -> None:
        self.video_only = video_only
        self.stats = TsToRtcStats()
        self._demux = TsDemuxer()
        self._unwrap = _Unwrapper(TS_WRAP)  # one unwrapper: both streams share the TS clock
        self._inserter = ParameterSetInserter("h264", add_aud=False)
        self._seen_idr = False
        self._video_codec: Literal["h264", "hevc"] | None = None
        self._has_audio = False
        self._decoder: av.AudioCodecContext | None = None
        self._encoder: av.AudioCodecContext | None = None
        self._resampler: _Resampler | None = None
        self._next_samples = 0  # 48 kHz pts of the next sample into the encoder
        self._next_aac90: int | None = None  # unwrapped 90 kHz PTS where the next AAC frame should start

    @property
    def video_codec(self) -> Literal["h264", "hevc"] | None:
        """The codec of the TS's video stream, once a unit of it was seen."""
        return self._video_codec

    @property
    def has_audio(self) -> bool:
        """True once an AAC unit was seen (whether or not ``video_only`` drops it)."""
        return self._has_audio

    @property
    def demuxer(self) -> TsDemuxer:
        """The demuxer, for its ``stats``."""
        return self._demux

    def feed(self, datagram: bytes | bytearray | memoryview) -> list[RtcUnit]:
        """TS bytes (normally whole 188-byte packets, any number): the units they complete."""
        return self._units(self._demux.feed(datagram))

    def flush(self) -> list[RtcUnit]:
        """End of stream: the units the demuxer and the Opus encoder still held."""
        out = self._units(self._demux.flush())
        out += self._end_audio()
        return out

    def _units(self, units: list[AccessUnit]) -> list[RtcUnit]:
        out: list[RtcUnit] = []
        for unit in units:
            pts = self._unwrap(unit.pts)
            if unit.kind == "video":
                self._video_codec = "hevc" if unit.codec == "hevc" else "h264"
                video = self._video(unit, pts)
                if video is not None:
                    out.append(video)
            else:
                self._has_audio = True
                if not self.video_only:
                    out += self._audio(unit, pts)
        return out

    # ------------------------------------------------------------------ video

    def _video(self, unit: AccessUnit, pts: int) -> RtcUnit | None:
        if unit.codec != "h264":
            self.stats.dropped_units += 1
            return None
        nals = [nal for nal in split_annexb(unit.data) if nal and h264_nal_type(nal) != H264_NAL_AUD]
        if not nals:
            self.stats.dropped_units += 1
            return None
        data = self._inserter.process(join_annexb(nals))
        keyframe = annexb_keyframe("h264", data) is True
        if not self._seen_idr:
            if not keyframe or self._inserter.parameter_sets is None:
                self.stats.before_keyframe += 1
                return None
            self._seen_idr = True
        self.stats.video_units += 1
        return RtcUnit("video", data, pts, keyframe)

    # ------------------------------------------------------------------ audio

    def _audio(self, unit: AccessUnit, pts90: int) -> list[RtcUnit]:
        frame = parse_adts(unit.data)
        if frame is None:
            self.stats.dropped_units += 1
            return []
        self.stats.aac_units += 1
        out: list[RtcUnit] = []
        expected = self._next_aac90
        if (
            expected is None
            or pts90 - expected > VIDEO_HZ
            or pts90 < expected - BACKWARDS_TOLERANCE_90K
            or self._encoder is None
        ):
            out += self._end_audio()
            self._start_audio(pts90)
        self._next_aac90 = pts90 + frame.samples * VIDEO_HZ // frame.config.sample_rate
        assert self._decoder is not None and self._resampler is not None and self._encoder is not None
        try:
            decoded = self._decoder.decode(av.Packet(unit.data))
        except av.error.FFmpegError:
            self.stats.dropped_units += 1
            return out
        for pcm in decoded:
            for chunk in self._resampler.resample(pcm):
                out += self._encode(chunk)
        return out

    def _start_audio(self, pts90: int) -> None:
        """A new Opus timeline at this AAC frame's PTS (fresh decoder, resampler and encoder)."""
        self.stats.audio_restarts += 1
        self._decoder = av.CodecContext.create("aac", "r")  # reads the ADTS header of each packet
        self._resampler = _Resampler("s16", OPUS_RATE, OPUS_FRAME)
        encoder = _opus_encoder()
        encoder.sample_rate = OPUS_RATE
        encoder.layout = "stereo"
        encoder.format = "s16"
        encoder.bit_rate = OPUS_BITRATE
        encoder.time_base = _TIME_BASE_48K
        self._encoder = encoder
        self._next_samples = round(pts90 * OPUS_RATE / VIDEO_HZ)

    def _encode(self, pcm: av.AudioFrame | None) -> list[RtcUnit]:
        """Encode 960 samples (None flushes). The packet pts is the encoder's: ffmpeg subtracts
        the encoder's lookahead (312 samples for libopus), which is exactly where a WebRTC
        receiver (no pre-skip in RTP, RFC 7587 §4.2) plays the packet's first output sample."""
        encoder = self._encoder
        assert encoder is not None
        if pcm is not None:
            pcm.pts = self._next_samples
            pcm.time_base = _TIME_BASE_48K
            self._next_samples += pcm.samples
        out: list[RtcUnit] = []
        for packet in encoder.encode(pcm):
            if packet.pts is None:
                continue
            self.stats.audio_packets += 1
            out.append(RtcUnit("audio", bytes(packet), int(packet.pts), True))
        return out

    def _end_audio(self) -> list[RtcUnit]:
        """Flush the current timeline: the resampler's tail (padded to 960 samples) and the encoder."""
        if self._encoder is None or self._resampler is None:
            return []
        out: list[RtcUnit] = []
        for chunk in self._resampler.flush():
            out += self._encode(chunk)
        out += self._encode(None)
        self._encoder = None
        self._decoder = None
        self._resampler = None
        self._next_aac90 = None
        return out


# ---------------------------------------------------------------------------------------------
# WebRTC -> TS


@dataclass(slots=True)
class RtcToTsStats:
    """Counters of :class:`RtcToTs` (the muxing side's are in ``units.stats``)."""

    video_in: int = 0
    audio_frames_in: int = 0
    video_units: int = 0  # pushed to the muxer
    audio_units: int = 0  # AAC frames pushed to the muxer
    dropped_video: int = 0  # frames without a slice (empty, parameter sets only) or of a track not announced
    dropped_audio: int = 0  # frames that go backwards in time, or of a track not announced
    silence_samples: int = 0  # 48 kHz samples of silence filled into gaps (lost packets, DTX)
    audio_restarts: int = 0  # AAC timelines started (the first one included)
    reanchors: int = 0  # a track's timestamps went back over 1 s: anchored again on its arrival time
    reordered: bool = False  # the sender uses B-frames: decoding times are derived (a 4-picture delay)


class _Anchor:
    """A track's timestamps on the session's 90 kHz TS clock.

    ``TIMESTAMP_BASE + (first arrival of the track - session start) * 90000 + (timestamp since
    the track's first frame)``: each track starts where its first frame arrived relative to the
    session start, then follows its own media clock (no drift correction between the two: the
    RTP clocks of one sender come from one capture clock).
    """

    __slots__ = ("first_ts", "offset90")

    def __init__(self, first_ts: int, offset90: int) -> None:
        self.first_ts = first_ts
        self.offset90 = offset90


class RtcToTs:
    """aiortc's received media (H.264 access units, decoded Opus frames) in, TS datagrams out.

    ``video``/``audio`` name the tracks the session negotiated: they make the TS program
    (H.264 and/or AAC), announced once to :class:`UnitsToTs`, which also waits for the first
    keyframe and interleaves by DTS. Video goes in as it came (an AUD added, SPS/PPS repeated
    before IDRs that lack them, for ISO/IEC 13818-1 §2.14); DTS = PTS because WebRTC senders
    use no B-frames (browsers encode constrained baseline or main without reordering), so
    decode order is presentation order. Audio is re-encoded to AAC-LC 48 kHz stereo
    (~128 kbit/s) in ADTS; gaps up to 1 s are filled with silence so the AAC timeline stays
    continuous, longer ones (or a clock going back) restart it at the new timestamp.

    Timing: see :class:`_Anchor`; ``arrival`` is the caller's monotonic clock (seconds).
    """

    def __init__(self, *, video: bool = True, audio: bool = True, mux: MuxConfig | None = None) -> None:
        if not video and not audio:
            raise ValueError("a session needs a video or an audio track")
        self.video = video
        self.audio = audio
        self.stats = RtcToTsStats()
        self.units = UnitsToTs(mux=mux)
        self._pending = self.units.begin("h264" if video else None, "aac" if audio else None)
        self._session_start: float | None = None
        self._video_anchor: _Anchor | None = None
        self._audio_anchor: _Anchor | None = None
        self._video_unwrap = _Unwrapper(RTP_WRAP)
        self._last_video_ts: int | None = None
        self._last_video_pts: int | None = None
        # Made when a picture presents before the one sent ahead of it (B-frames): WebRTC senders
        # normally use none, and DTS = PTS then costs no delay.
        self._dts: DtsDeriver | None = None
        self._audio_unwrap = _Unwrapper(RTP_WRAP)
        self._inserter = ParameterSetInserter("h264")
        self._encoder: av.AudioCodecContext | None = None
        self._resampler: _Resampler | None = None
        self._aac: AacConfig | None = None
        self._next48: int | None = None  # 48 kHz timestamp (since the track's first frame) of the next input sample
        self._samples = 0  # 48 kHz pts (track-relative) of the next sample into the AAC encoder

    def _anchor(self, first_ts: int, arrival: float) -> _Anchor:
        if self._session_start is None:
            self._session_start = arrival
        offset = round((arrival - self._session_start) * VIDEO_HZ)
        return _Anchor(first_ts, TIMESTAMP_BASE + max(offset, 0))

    def _out(self, datagrams: list[bytes]) -> list[bytes]:
        if self._pending:
            datagrams = self._pending + datagrams
            self._pending = []
        return datagrams

    # ------------------------------------------------------------------ video

    def on_video(self, annexb: bytes, rtp_timestamp: int, arrival: float) -> list[bytes]:
        """One H.264 access unit (Annex B, RFC 6184 depayloaded by aiortc) with its 90 kHz RTP
        timestamp (aiortc's, 0 at the first frame; wraps at 2^32) and arrival time: TS datagrams."""
        self.stats.video_in += 1
        if not self.video:
            self.stats.dropped_video += 1
            return []
        ts = self._video_unwrap(rtp_timestamp)
        if ts == self._last_video_ts:
            # RFC 6184 §5.1: one timestamp is one access unit. A second frame on it is what a
            # receiver reassembled after losing part of the picture: the picture already went out
            # (damaged, and a PLI follows); a second unit on one DTS would break the TS.
            self.stats.dropped_video += 1
            return []
        data = self._inserter.process(bytes(annexb))
        keyframe = annexb_keyframe("h264", data)
        if keyframe is None:
            self.stats.dropped_video += 1
            return []
        anchor = self._video_anchor
        last = self._last_video_ts
        if anchor is not None and last is not None and ts < last - VIDEO_HZ:
            anchor = None  # the clock went back over 1 s (a new sender stream): anchor again on arrival
            self.stats.reanchors += 1
        if anchor is None:
            anchor = self._video_anchor = self._anchor(ts, arrival)
        self._last_video_ts = ts
        pts = anchor.offset90 + ts - anchor.first_ts
        if self._dts is None and self._last_video_pts is not None and pts < self._last_video_pts:
            self._dts = DtsDeriver()
            self.stats.reordered = True
        self._last_video_pts = pts
        self.stats.video_units += 1
        if self._dts is None:
            return self._out(self.units.push(AccessUnit("video", "h264", 0, pts, pts, keyframe, data)))
        out: list[bytes] = []
        for frame, frame_pts, dts in self._dts.push(pts, Frame(data, 0, keyframe)):
            out += self.units.push(AccessUnit("video", "h264", 0, frame_pts, dts, frame.keyframe, frame.data))
        return self._out(out)

    # ------------------------------------------------------------------ audio

    def on_audio(self, frame: av.AudioFrame, arrival: float) -> list[bytes]:
        """One decoded Opus frame from aiortc (48 kHz, pts in 1/48000 from the RTP timestamp,
        RFC 7587 §4.1) and its arrival time: TS datagrams."""
        self.stats.audio_frames_in += 1
        if not self.audio:
            self.stats.dropped_audio += 1
            return []
        rate = frame.sample_rate or OPUS_RATE
        anchor = self._audio_anchor
        if frame.pts is None:  # not from aiortc: take it as continuing the track
            ts48 = (anchor.first_ts if anchor else 0) + (self._next48 or 0)
        else:
            time_base = frame.time_base or _TIME_BASE_48K  # aiortc: 1/48000 (RFC 7587 §4.1)
            ts48 = self._audio_unwrap(round(frame.pts * time_base * OPUS_RATE))
        expected = self._next48
        if anchor is not None and expected is not None and ts48 - anchor.first_ts < expected - MAX_GAP_48K:
            anchor = None  # the clock went back a long way (a new sender stream): anchor again on arrival
            expected = None
            self.stats.reanchors += 1
        if anchor is None:
            anchor = self._audio_anchor = self._anchor(ts48, arrival)
        rel = ts48 - anchor.first_ts
        out: list[bytes] = []
        if expected is not None and rel < expected - OPUS_FRAME // 2:
            self.stats.dropped_audio += 1  # overlaps what was encoded already
            return []
        if expected is not None and rel - expected > MAX_GAP_48K:
            expected = None  # a long gap: a new AAC timeline at the new timestamp
        if expected is None or self._encoder is None:
            out += self._end_audio()
            self._start_audio(rel)
        elif rel > expected + OPUS_FRAME // 2:
            gap = rel - expected
            self.stats.silence_samples += gap
            out += self._encode_pcm(_silence(gap * rate // OPUS_RATE, frame.layout.name, frame.format.name, rate))
        out += self._encode_pcm(frame)
        self._next48 = rel + frame.samples * OPUS_RATE // rate
        return self._out(out)

    def _start_audio(self, rel48: int) -> None:
        self.stats.audio_restarts += 1
        encoder = av.CodecContext.create("aac", "w")
        encoder.sample_rate = AAC_RATE
        encoder.layout = "stereo"
        encoder.format = "fltp"
        encoder.bit_rate = AAC_BITRATE
        encoder.time_base = _TIME_BASE_48K
        encoder.open()
        config = parse_asc(encoder.extradata or b"")
        if config is None:
            raise RuntimeError("the AAC encoder gave no AudioSpecificConfig")
        self._aac = config
        self._encoder = encoder
        self._resampler = _Resampler("fltp", AAC_RATE, encoder.frame_size or 1024)
        self._samples = rel48  # 48 kHz pts (track-relative) of the next sample into the encoder

    def _encode_pcm(self, frame: av.AudioFrame | None) -> list[bytes]:
        """Resample and encode (None flushes both); each AAC packet becomes an ADTS unit."""
        resampler, encoder = self._resampler, self._encoder
        assert resampler is not None and encoder is not None
        chunks: list[av.AudioFrame | None] = []
        if frame is None:
            chunks += resampler.flush()
            chunks.append(None)
        else:
            chunks += resampler.resample(frame)
        out: list[bytes] = []
        for chunk in chunks:
            if chunk is not None:
                chunk.pts = self._samples
                chunk.time_base = _TIME_BASE_48K
                self._samples += chunk.samples
            for packet in encoder.encode(chunk):
                out += self._push_aac(packet)
        return out

    def _push_aac(self, packet: av.Packet[Any]) -> list[bytes]:
        anchor, config = self._audio_anchor, self._aac
        assert anchor is not None and config is not None
        if packet.pts is None:
            return []
        pts = anchor.offset90 + round(int(packet.pts) * VIDEO_HZ / AAC_RATE)
        self.stats.audio_units += 1
        unit = AccessUnit("audio", "aac", 0, pts, pts, True, build_adts_frame(config, bytes(packet)))
        return self.units.push(unit)

    def _end_audio(self) -> list[bytes]:
        if self._encoder is None:
            return []
        out = self._encode_pcm(None)
        self._encoder = None
        self._resampler = None
        return out

    def flush(self) -> list[bytes]:
        """End of the session: the AAC encoder's tail, then everything UnitsToTs held."""
        out = self._end_audio()
        self._next48 = None
        if self._dts is not None:
            for frame, frame_pts, dts in self._dts.flush():
                out += self.units.push(AccessUnit("video", "h264", 0, frame_pts, dts, frame.keyframe, frame.data))
        out += self.units.flush()
        return self._out(out)


def _silence(samples: int, layout: str, fmt: str, rate: int) -> av.AudioFrame:
    """``samples`` of silence in the given layout/format (zero bytes are silence for s16/flt)."""
    frame = av.AudioFrame(format=fmt, layout=layout, samples=samples)
    frame.sample_rate = rate
    for plane in frame.planes:
        plane.update(bytes(plane.buffer_size))
    return frame


__all__ = ["RtcToTs", "RtcToTsStats", "RtcUnit", "TsToRtc", "TsToRtcStats"]
