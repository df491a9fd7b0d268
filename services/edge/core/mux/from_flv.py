"""FLV tags (as RTMP carries them) -> MPEG-TS datagrams. Sans-IO.

``FlvToTs`` is fed the video and audio tags of one publisher with their RTMP timestamps (ms)
and answers 1316-byte datagrams (7 x 188-byte TS packets) from :class:`TsMuxer`:

* H.264 (AVCDecoderConfigurationRecord + length-prefixed NAL units) and HEVC (Enhanced RTMP
  ``hvc1``, HEVCDecoderConfigurationRecord) become Annex B, with an AUD on every access unit and
  the parameter sets of the last sequence header in front of every IDR/IRAP
  (:class:`ParameterSetInserter`); AAC (AudioSpecificConfig + raw frames) becomes ADTS.
* PTS = (timestamp + composition time) x 90, DTS = timestamp x 90, both shifted by
  ``TIMESTAMP_BASE`` (1 s) so the PCR (DTS - 700 ms) of the first unit is not negative.

**Program choice.** The program (video codec, audio codec) is fixed by the first sequence
headers: the converter waits until it has both a video and an AAC sequence header, or until
the media timestamps of what it holds span ``wait_ms`` (1000 ms), or until it holds
``MAX_PENDING`` tags, and then starts with what it knows (video only, audio only). What it
held meanwhile is muxed at once, in arrival order. A sequence header of a stream that is not
in the program (audio arriving after the decision) is ignored and counted
(``late_streams``); a new sequence header of a stream in the program replaces its
configuration (parameter sets, AAC config). Video before the first keyframe is dropped (a
decoder cannot start there). Codecs TS cannot carry here (AV1, VP9, MP3, ...) are dropped
and counted (``unsupported``). ``FlvToTs.flush()`` answers the last datagram, padded to 1316 bytes with
null packets (a raw-TS output may hold a short one back until more TS comes).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

from ..rtmp.flv import AudioCodec, AudioTag, PacketKind, VideoCodec, VideoTag
from .codec import (
    AacConfig,
    ParameterSetInserter,
    build_adts_frame,
    length_prefixed_to_annexb,
    parse_asc,
    parse_avcc,
    parse_hvcc,
)
from .codec import VideoCodec as MuxVideoCodec
from .ts_mux import NULL_PACKET, DatagramPacker, MuxConfig, TsMuxer

WAIT_MS: Final = 1000  # how long (media time) the program choice waits for the other stream
MAX_PENDING: Final = 512  # tags held while waiting (about 1 s of 25 fps video + 48 kHz AAC is ~72)
TS_PACKET_SIZE: Final = 188
DATAGRAM_SIZE: Final = 7 * TS_PACKET_SIZE
TIMESTAMP_BASE: Final = 90_000  # 1 s in 90 kHz ticks: keeps PCR = DTS - 700 ms positive at the start
_VIDEO_CODECS: Final[dict[VideoCodec, MuxVideoCodec]] = {VideoCodec.AVC: "h264", VideoCodec.HEVC: "hevc"}


@dataclass(slots=True)
class FlvToTsStats:
    video_units: int = 0
    audio_units: int = 0
    datagrams: int = 0
    dropped_before_keyframe: int = 0  # video frames before the first keyframe
    unsupported: int = 0  # tags of a codec TS does not carry here
    late_streams: int = 0  # sequence headers of a stream the program was fixed without
    bad_frames: int = 0  # truncated NAL framing, frames before their sequence header, ADTS refusals
    sequence_headers: int = 0


_Pending = tuple[bool, int, VideoTag | AudioTag]  # (is_video, timestamp ms, tag)


class FlvToTs:
    """One publisher's FLV tags -> 1316-byte TS datagrams (see the module docstring)."""

    def __init__(self, *, wait_ms: int = WAIT_MS, mux: MuxConfig | None = None) -> None:
        self.wait_ms = wait_ms
        self._mux_template = mux if mux is not None else MuxConfig()
        self.stats = FlvToTsStats()
        self.program: tuple[MuxVideoCodec | None, Literal["aac"] | None] | None = None  # fixed at the start
        self._muxer: TsMuxer | None = None
        self._packer = DatagramPacker()
        self._video_codec: MuxVideoCodec | None = None
        self._nal_length_size = 4
        self._inserter: ParameterSetInserter | None = None
        self._aac: AacConfig | None = None
        self._pending: deque[_Pending] = deque()
        self._seen_keyframe = False

    # ------------------------------------------------------------------ public API

    def push_video(self, timestamp: int, tag: VideoTag) -> list[bytes]:
        """One video tag at ``timestamp`` ms: the datagrams it completes (often none)."""
        return self._push(True, timestamp, tag)

    def push_audio(self, timestamp: int, tag: AudioTag) -> list[bytes]:
        """One audio tag at ``timestamp`` ms: the datagrams it completes (often none)."""
        return self._push(False, timestamp, tag)

    def flush(self) -> list[bytes]:
        """At the end of a publication: start with what is known, and the last short datagram."""
        out = self._start() if self._muxer is None and self._known() else []
        for tail in self._packer.flush():  # padded with null packets: every datagram is 1316 bytes
            out.append(tail + NULL_PACKET * ((DATAGRAM_SIZE - len(tail)) // TS_PACKET_SIZE))
        self.stats.datagrams += len(out)
        return out

    @property
    def started(self) -> bool:
        return self._muxer is not None

    # ------------------------------------------------------------------ internals

    def _known(self) -> bool:
        return self._video_codec is not None or self._aac is not None

    def _push(self, is_video: bool, timestamp: int, tag: VideoTag | AudioTag) -> list[bytes]:
        if self._muxer is not None:
            out = self._packer.push(self._one(is_video, timestamp, tag))
            self.stats.datagrams += len(out)
            return out
        self._note_header(is_video, tag)
        self._pending.append((is_video, timestamp, tag))
        span = timestamp - self._pending[0][1]
        both = self._video_codec is not None and self._aac is not None
        if both or (self._known() and (span >= self.wait_ms or len(self._pending) >= MAX_PENDING)):
            out = self._start()
            self.stats.datagrams += len(out)
            return out
        if len(self._pending) >= MAX_PENDING:  # nothing usable yet: keep the newest only
            self._pending.popleft()
            self.stats.unsupported += 1
        return []

    def _note_header(self, is_video: bool, tag: VideoTag | AudioTag) -> None:
        """Before the start: remember which codecs the sequence headers announce."""
        if tag.packet is not PacketKind.SEQUENCE_HEADER:
            return
        if is_video and isinstance(tag, VideoTag) and tag.codec in _VIDEO_CODECS and self._video_codec is None:
            if self._video_config(tag):
                self._video_codec = _VIDEO_CODECS[tag.codec]
        elif not is_video and isinstance(tag, AudioTag) and tag.codec is AudioCodec.AAC and self._aac is None:
            self._aac = parse_asc(tag.payload)

    def _start(self) -> list[bytes]:
        t = self._mux_template
        audio: Literal["aac"] | None = "aac" if self._aac is not None else None
        self.program = (self._video_codec, audio)
        self._muxer = TsMuxer(
            MuxConfig(
                video_codec=self._video_codec,
                audio_codec=audio,
                program_number=t.program_number,
                transport_stream_id=t.transport_stream_id,
                pmt_pid=t.pmt_pid,
                video_pid=t.video_pid,
                audio_pid=t.audio_pid,
                pcr_pid=t.pcr_pid,
                psi_interval=t.psi_interval,
                pcr_interval=t.pcr_interval,
                pcr_offset=t.pcr_offset,
                mux_rate=t.mux_rate,
                max_clock_jump=t.max_clock_jump,
            )
        )
        packets = bytearray(self._muxer.tables())
        while self._pending:
            is_video, timestamp, tag = self._pending.popleft()
            packets += self._one(is_video, timestamp, tag)
        return self._packer.push(packets)

    def _video_config(self, tag: VideoTag) -> bool:
        """Take a video sequence header: the NAL length size and parameter sets."""
        codec = _VIDEO_CODECS[tag.codec]
        config = parse_avcc(tag.payload) if codec == "h264" else parse_hvcc(tag.payload)
        if config is None:
            self.stats.bad_frames += 1
            return False
        self._nal_length_size = config.nal_length_size
        if self._inserter is None:
            self._inserter = ParameterSetInserter(codec, config.parameter_sets)
        else:
            self._inserter.update(config.parameter_sets)
        return True

    def _one(self, is_video: bool, timestamp: int, tag: VideoTag | AudioTag) -> bytes | bytearray:
        if is_video:
            assert isinstance(tag, VideoTag)
            return self._video(timestamp, tag)
        assert isinstance(tag, AudioTag)
        return self._audio(timestamp, tag)

    def _video(self, timestamp: int, tag: VideoTag) -> bytes | bytearray:
        muxer = self._muxer
        assert muxer is not None
        codec = _VIDEO_CODECS.get(tag.codec)
        if codec is None:
            self.stats.unsupported += 1
            return b""
        if self._video_codec is None or muxer.config.video_codec is None:
            if tag.packet is PacketKind.SEQUENCE_HEADER:
                self.stats.late_streams += 1
            else:
                self.stats.unsupported += 1
            return b""
        if codec != self._video_codec:
            self.stats.unsupported += 1  # a codec change within a publication: not followed
            return b""
        if tag.packet is PacketKind.SEQUENCE_HEADER:
            if self._video_config(tag):
                self.stats.sequence_headers += 1
            return b""
        if tag.packet is not PacketKind.FRAME or not tag.payload:
            return b""
        if not self._seen_keyframe:
            if not tag.is_keyframe:
                self.stats.dropped_before_keyframe += 1
                return b""
            self._seen_keyframe = True
        annexb = length_prefixed_to_annexb(tag.payload, self._nal_length_size)
        if annexb is None or self._inserter is None:
            self.stats.bad_frames += 1
            return b""
        dts = timestamp * 90 + TIMESTAMP_BASE
        pts = dts + tag.composition_time * 90
        self.stats.video_units += 1
        return muxer.mux_video(self._inserter.process(annexb), pts, dts)

    def _audio(self, timestamp: int, tag: AudioTag) -> bytes | bytearray:
        muxer = self._muxer
        assert muxer is not None
        if tag.codec is not AudioCodec.AAC:
            self.stats.unsupported += 1
            return b""
        if muxer.config.audio_codec is None:
            if tag.packet is PacketKind.SEQUENCE_HEADER:
                self.stats.late_streams += 1
            return b""
        if tag.packet is PacketKind.SEQUENCE_HEADER:
            config = parse_asc(tag.payload)
            if config is None:
                self.stats.bad_frames += 1
            else:
                self.stats.sequence_headers += 1
                self._aac = config
            return b""
        if self._aac is None or not tag.payload:
            self.stats.bad_frames += 1
            return b""
        try:
            frame = build_adts_frame(self._aac, tag.payload)
        except ValueError:
            self.stats.bad_frames += 1
            return b""
        self.stats.audio_units += 1
        return muxer.mux_audio(frame, timestamp * 90 + TIMESTAMP_BASE)


__all__ = ["MAX_PENDING", "TIMESTAMP_BASE", "WAIT_MS", "FlvToTs", "FlvToTsStats"]
