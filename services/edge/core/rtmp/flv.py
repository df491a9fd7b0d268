"""FLV audio/video tag bodies as carried in RTMP messages 8 and 9, sans-IO.

Covers the legacy FLV tag headers (Adobe "Video File Format Specification" v10.1, Annex E.4.2.1
AUDIODATA/AACAUDIODATA and E.4.3.1 VIDEODATA/AVCVIDEOPACKET) and Enhanced RTMP v1 (veovera
enhanced-rtmp, "ExVideoTagHeader": IsExHeader bit, FourCC, VideoPacketType) for HEVC ('hvc1'),
AV1 ('av01') and VP9 ('vp09'). Payloads stay as the bytes the tag carries (AVCC/HVCC length-
prefixed NAL units, decoder configuration records, raw AAC); conversions to Annex B belong to
the mux package. Also reads the FLV file container (header, tags, PreviousTagSize) for tests and
tools that hold a whole file in memory.

Parsers raise :class:`FlvError` (a ProtocolError) on truncated or inconsistent bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Final

from .errors import FlvError


class VideoCodec(StrEnum):
    """The video codec of a tag: legacy CodecID (E.4.3.1) or Enhanced RTMP FourCC."""

    SORENSON_H263 = "h263"  # CodecID 2
    SCREEN = "screen"  # 3
    VP6 = "vp6"  # 4
    VP6_ALPHA = "vp6a"  # 5
    SCREEN2 = "screen2"  # 6
    AVC = "avc"  # 7
    HEVC = "hevc"  # E-RTMP 'hvc1' (and the non-standard legacy CodecID 12)
    AV1 = "av1"  # E-RTMP 'av01'
    VP9 = "vp9"  # E-RTMP 'vp09'


class AudioCodec(StrEnum):
    """SoundFormat (E.4.2.1)."""

    LINEAR_PCM = "pcm"  # 0 (platform endian)
    ADPCM = "adpcm"  # 1
    MP3 = "mp3"  # 2
    LINEAR_PCM_LE = "pcm_le"  # 3
    NELLYMOSER_16K = "nellymoser16k"  # 4
    NELLYMOSER_8K = "nellymoser8k"  # 5
    NELLYMOSER = "nellymoser"  # 6
    G711_ALAW = "alaw"  # 7
    G711_MULAW = "mulaw"  # 8
    AAC = "aac"  # 10
    SPEEX = "speex"  # 11
    MP3_8K = "mp3_8k"  # 14
    DEVICE_SPECIFIC = "device"  # 15


class FrameType(IntEnum):
    """VIDEODATA FrameType (E.4.3.1); E-RTMP keeps the values."""

    KEY = 1
    INTER = 2
    DISPOSABLE_INTER = 3  # H.263 only
    GENERATED_KEY = 4
    COMMAND = 5  # video info/command frame


class PacketKind(StrEnum):
    """What a tag carries, across AVCPacketType, AACPacketType and E-RTMP PacketType."""

    SEQUENCE_HEADER = "sequence_header"  # decoder configuration (AVCDecoderConfigurationRecord, HVCC, ASC ...)
    FRAME = "frame"  # coded frames (NALUs, raw AAC, or the whole body for codecs without packet types)
    END_OF_SEQUENCE = "end_of_sequence"
    METADATA = "metadata"  # E-RTMP PacketType.Metadata (AMF-encoded, e.g. colorInfo)
    COMMAND = "command"  # FrameType 5: one VideoCommand octet, no media


class ExVideoPacketType(IntEnum):
    """Enhanced RTMP v1 VideoPacketType."""

    SEQUENCE_START = 0
    CODED_FRAMES = 1
    SEQUENCE_END = 2
    CODED_FRAMES_X = 3  # CodedFrames with composition time 0 (omitted)
    METADATA = 4
    MPEG2TS_SEQUENCE_START = 5


_LEGACY_VIDEO_CODECS: Final = {
    2: VideoCodec.SORENSON_H263,
    3: VideoCodec.SCREEN,
    4: VideoCodec.VP6,
    5: VideoCodec.VP6_ALPHA,
    6: VideoCodec.SCREEN2,
    7: VideoCodec.AVC,
    12: VideoCodec.HEVC,
}
_LEGACY_VIDEO_CODEC_IDS: Final = {codec: cid for cid, codec in _LEGACY_VIDEO_CODECS.items()}
FOURCC_CODECS: Final = {b"hvc1": VideoCodec.HEVC, b"av01": VideoCodec.AV1, b"vp09": VideoCodec.VP9}
CODEC_FOURCCS: Final = {codec: fourcc for fourcc, codec in FOURCC_CODECS.items()}
_AUDIO_CODECS: Final = {
    0: AudioCodec.LINEAR_PCM,
    1: AudioCodec.ADPCM,
    2: AudioCodec.MP3,
    3: AudioCodec.LINEAR_PCM_LE,
    4: AudioCodec.NELLYMOSER_16K,
    5: AudioCodec.NELLYMOSER_8K,
    6: AudioCodec.NELLYMOSER,
    7: AudioCodec.G711_ALAW,
    8: AudioCodec.G711_MULAW,
    10: AudioCodec.AAC,
    11: AudioCodec.SPEEX,
    14: AudioCodec.MP3_8K,
    15: AudioCodec.DEVICE_SPECIFIC,
}
_AUDIO_CODEC_IDS: Final = {codec: sid for sid, codec in _AUDIO_CODECS.items()}
_AVC_PACKET_KINDS: Final = (PacketKind.SEQUENCE_HEADER, PacketKind.FRAME, PacketKind.END_OF_SEQUENCE)


@dataclass(frozen=True, slots=True)
class VideoTag:
    """A parsed video tag body.

    ``composition_time`` is the signed CTS offset in ms (PTS = DTS + composition_time), 0 where the
    format carries none. ``enhanced`` tells whether the body used the E-RTMP ExVideoTagHeader.
    For ``PacketKind.COMMAND`` the payload is the single VideoCommand octet.
    """

    codec: VideoCodec
    frame_type: FrameType
    packet: PacketKind
    payload: bytes
    composition_time: int = 0
    enhanced: bool = False

    @property
    def is_keyframe(self) -> bool:
        return self.frame_type in (FrameType.KEY, FrameType.GENERATED_KEY)


@dataclass(frozen=True, slots=True)
class AudioTag:
    """A parsed audio tag body. ``packet`` is SEQUENCE_HEADER only for the AAC AudioSpecificConfig."""

    codec: AudioCodec
    packet: PacketKind
    payload: bytes
    sound_rate: int = 3  # 0: 5.5 kHz, 1: 11 kHz, 2: 22 kHz, 3: 44 kHz (AAC: always 3)
    sound_size_16bit: bool = True
    stereo: bool = True


def _si24(raw: bytes) -> int:
    value = int.from_bytes(raw, "big")
    return value - (1 << 24) if value & 0x800000 else value


def _frame_type(value: int) -> FrameType:
    try:
        return FrameType(value)
    except ValueError:
        raise FlvError(f"reserved video frame type {value}") from None


def parse_video_tag(body: bytes | bytearray | memoryview) -> VideoTag:
    """Parse a video message body (RTMP message type 9). Raises FlvError."""
    data = bytes(body)
    if not data:
        raise FlvError("empty video tag")
    first = data[0]
    if first & 0x80:  # E-RTMP: IsExHeader
        return _parse_ex_video(data)
    frame_type = _frame_type(first >> 4)
    codec = _LEGACY_VIDEO_CODECS.get(first & 0x0F)
    if codec is None:
        raise FlvError(f"unknown video codec id {first & 0x0F}")
    if frame_type is FrameType.COMMAND:
        return VideoTag(codec, frame_type, PacketKind.COMMAND, data[1:2])
    if codec in (VideoCodec.AVC, VideoCodec.HEVC):  # E.4.3.1 AVCVIDEOPACKET
        if len(data) < 5:
            raise FlvError("AVC video tag shorter than its 5-octet header")
        if data[1] > 2:
            raise FlvError(f"reserved AVCPacketType {data[1]}")
        return VideoTag(codec, frame_type, _AVC_PACKET_KINDS[data[1]], data[5:], _si24(data[2:5]))
    return VideoTag(codec, frame_type, PacketKind.FRAME, data[1:])


def _parse_ex_video(data: bytes) -> VideoTag:
    """Enhanced RTMP v1 ExVideoTagHeader: [1 IsExHeader][3 FrameType][4 PacketType][FourCC]..."""
    frame_type = _frame_type((data[0] >> 4) & 0x07)
    try:
        packet_type = ExVideoPacketType(data[0] & 0x0F)
    except ValueError:
        raise FlvError(f"unsupported E-RTMP video packet type {data[0] & 0x0F}") from None
    if len(data) < 5:
        raise FlvError("E-RTMP video tag shorter than its FourCC")
    codec = FOURCC_CODECS.get(data[1:5])
    if codec is None:
        raise FlvError(f"unsupported E-RTMP FourCC {data[1:5]!r}")
    body = data[5:]
    if frame_type is FrameType.COMMAND and packet_type is not ExVideoPacketType.METADATA:
        return VideoTag(codec, frame_type, PacketKind.COMMAND, body[:1], enhanced=True)
    if packet_type in (ExVideoPacketType.SEQUENCE_START, ExVideoPacketType.MPEG2TS_SEQUENCE_START):
        return VideoTag(codec, frame_type, PacketKind.SEQUENCE_HEADER, body, enhanced=True)
    if packet_type is ExVideoPacketType.SEQUENCE_END:
        return VideoTag(codec, frame_type, PacketKind.END_OF_SEQUENCE, body, enhanced=True)
    if packet_type is ExVideoPacketType.METADATA:
        return VideoTag(codec, frame_type, PacketKind.METADATA, body, enhanced=True)
    if packet_type is ExVideoPacketType.CODED_FRAMES and codec is VideoCodec.HEVC:
        if len(body) < 3:  # only hvc1 (and avc1) CodedFrames carry the SI24 composition time
            raise FlvError("E-RTMP HEVC CodedFrames shorter than its composition time")
        return VideoTag(codec, frame_type, PacketKind.FRAME, body[3:], _si24(body[:3]), enhanced=True)
    return VideoTag(codec, frame_type, PacketKind.FRAME, body, enhanced=True)


def build_video_tag(tag: VideoTag) -> bytes:
    """Serialise a video tag body: legacy header for AVC and the older codecs, E-RTMP for HEVC/AV1/VP9.

    ``tag.enhanced`` is not consulted: HEVC read from the non-standard legacy CodecID 12 is
    written back as E-RTMP 'hvc1' (CodedFramesX when the composition time is 0).
    """
    cts = (tag.composition_time & 0xFFFFFF).to_bytes(3, "big")
    if tag.codec in CODEC_FOURCCS:
        fourcc = CODEC_FOURCCS[tag.codec]
        if tag.packet is PacketKind.COMMAND:
            packet_type, body = ExVideoPacketType.CODED_FRAMES, tag.payload[:1]
        elif tag.packet is PacketKind.SEQUENCE_HEADER:
            packet_type, body = ExVideoPacketType.SEQUENCE_START, tag.payload
        elif tag.packet is PacketKind.END_OF_SEQUENCE:
            packet_type, body = ExVideoPacketType.SEQUENCE_END, tag.payload
        elif tag.packet is PacketKind.METADATA:
            packet_type, body = ExVideoPacketType.METADATA, tag.payload
        elif tag.codec is VideoCodec.HEVC and tag.composition_time != 0:
            packet_type, body = ExVideoPacketType.CODED_FRAMES, cts + tag.payload
        else:  # CodedFramesX: composition time 0 implied (HEVC); the only frame form for AV1/VP9
            hevc = tag.codec is VideoCodec.HEVC
            packet_type = ExVideoPacketType.CODED_FRAMES_X if hevc else ExVideoPacketType.CODED_FRAMES
            body = tag.payload
        return bytes([0x80 | (tag.frame_type << 4) | packet_type]) + fourcc + body
    first = bytes([(tag.frame_type << 4) | _LEGACY_VIDEO_CODEC_IDS[tag.codec]])
    if tag.packet is PacketKind.COMMAND:
        return first + tag.payload[:1]
    if tag.codec is VideoCodec.AVC:
        if tag.packet not in _AVC_PACKET_KINDS:
            raise ValueError(f"AVC has no {tag.packet.value} packet")
        return first + bytes([_AVC_PACKET_KINDS.index(tag.packet)]) + cts + tag.payload
    return first + tag.payload


def parse_audio_tag(body: bytes | bytearray | memoryview) -> AudioTag:
    """Parse an audio message body (RTMP message type 8). Raises FlvError."""
    data = bytes(body)
    if not data:
        raise FlvError("empty audio tag")
    first = data[0]
    codec = _AUDIO_CODECS.get(first >> 4)
    if codec is None:
        raise FlvError(f"unsupported sound format {first >> 4}")
    rate, size16, stereo = (first >> 2) & 0x03, bool(first & 0x02), bool(first & 0x01)
    if codec is AudioCodec.AAC:  # E.4.2.2 AACAUDIODATA
        if len(data) < 2:
            raise FlvError("AAC audio tag without its AACPacketType")
        if data[1] > 1:
            raise FlvError(f"reserved AACPacketType {data[1]}")
        kind = PacketKind.SEQUENCE_HEADER if data[1] == 0 else PacketKind.FRAME
        return AudioTag(codec, kind, data[2:], rate, size16, stereo)
    return AudioTag(codec, PacketKind.FRAME, data[1:], rate, size16, stereo)


def build_audio_tag(tag: AudioTag) -> bytes:
    """Serialise an audio tag body (AAC: SoundRate 3, 16-bit, stereo flags as E.4.2.1 requires)."""
    first = (_AUDIO_CODEC_IDS[tag.codec] << 4) | ((tag.sound_rate & 3) << 2)
    first |= (0x02 if tag.sound_size_16bit else 0) | (0x01 if tag.stereo else 0)
    if tag.codec is AudioCodec.AAC:
        first = 0xAF
        aac_type = 0 if tag.packet is PacketKind.SEQUENCE_HEADER else 1
        return bytes([first, aac_type]) + tag.payload
    return bytes([first]) + tag.payload


# ---------------------------------------------------------------------------- FLV file container

TAG_AUDIO: Final = 8
TAG_VIDEO: Final = 9
TAG_SCRIPT: Final = 18


@dataclass(frozen=True, slots=True)
class FlvFileTag:
    """One tag of an FLV file (E.4.1): type (8 audio, 9 video, 18 script data), timestamp in ms, body."""

    tag_type: int
    timestamp: int
    body: bytes


def iter_flv_file(data: bytes | bytearray | memoryview, max_tags: int = 1_000_000) -> Iterator[FlvFileTag]:
    """Walk an in-memory FLV file (E.2 header, E.3 body). Raises FlvError when malformed.

    A truncated last tag ends the walk (a recording cut short) rather than raising.
    """
    raw = bytes(data)
    if len(raw) < 9 or raw[:3] != b"FLV":
        raise FlvError("not an FLV file")
    pos = int.from_bytes(raw[5:9], "big")  # DataOffset
    if pos < 9 or pos > len(raw):
        raise FlvError("FLV DataOffset out of range")
    pos += 4  # PreviousTagSize0
    for _ in range(max_tags):
        if pos + 11 > len(raw):
            return
        tag_type = raw[pos] & 0x1F  # E.4.1: reserved(2) Filter(1) TagType(5)
        size = int.from_bytes(raw[pos + 1 : pos + 4], "big")
        timestamp = int.from_bytes(raw[pos + 4 : pos + 7], "big") | (raw[pos + 7] << 24)
        end = pos + 11 + size
        if end > len(raw):
            return
        yield FlvFileTag(tag_type, timestamp, raw[pos + 11 : end])
        pos = end + 4  # PreviousTagSize
    raise FlvError("FLV file has more tags than the cap")
