"""FLV tag bodies: legacy AVC/AAC (FLV spec E.4.2, E.4.3) and Enhanced RTMP v1 ExVideoTagHeader."""

from __future__ import annotations

import pytest

from services.edge.core.rtmp.errors import FlvError
from services.edge.core.rtmp.flv import (
    AudioCodec,
    AudioTag,
    FrameType,
    PacketKind,
    VideoCodec,
    VideoTag,
    build_audio_tag,
    build_video_tag,
    iter_flv_file,
    parse_audio_tag,
    parse_video_tag,
)

AVCC = bytes.fromhex("0164000dffe1001967640010acd9")
HVCC = bytes.fromhex("01016000000090000000000078f000fcfdf8f800000f03")

VIDEO_VECTORS = [
    # AVC sequence header: FrameType 1, CodecID 7, AVCPacketType 0, CTS 0
    (b"\x17\x00\x00\x00\x00" + AVCC, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, AVCC)),
    # AVC inter NALU with a negative composition time (-40 ms, SI24)
    (
        b"\x27\x01\xff\xff\xd8" + b"\x00\x00\x00\x01\x41",
        VideoTag(VideoCodec.AVC, FrameType.INTER, PacketKind.FRAME, b"\x00\x00\x00\x01\x41", -40),
    ),
    (b"\x17\x02\x00\x00\x00", VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.END_OF_SEQUENCE, b"")),
    # E-RTMP: IsExHeader | FrameType 1 | SequenceStart, 'hvc1', HEVCDecoderConfigurationRecord
    (b"\x90hvc1" + HVCC, VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, HVCC, enhanced=True)),
    # CodedFrames: SI24 composition time then the frame
    (
        b"\x91hvc1\x00\x00\x50" + b"\x00\x00\x00\x02\x26\x01",
        VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.FRAME, b"\x00\x00\x00\x02\x26\x01", 80, enhanced=True),
    ),
    # CodedFramesX: composition time 0 implied
    (
        b"\xa3hvc1" + b"\x00\x00\x00\x02\x02\x01",
        VideoTag(VideoCodec.HEVC, FrameType.INTER, PacketKind.FRAME, b"\x00\x00\x00\x02\x02\x01", enhanced=True),
    ),
    (b"\x92hvc1", VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.END_OF_SEQUENCE, b"", enhanced=True)),
    (b"\x90av01\x81", VideoTag(VideoCodec.AV1, FrameType.KEY, PacketKind.SEQUENCE_HEADER, b"\x81", enhanced=True)),
    (b"\xa1vp09\x01\x02", VideoTag(VideoCodec.VP9, FrameType.INTER, PacketKind.FRAME, b"\x01\x02", enhanced=True)),
    (b"\x52\x00", VideoTag(VideoCodec.SORENSON_H263, FrameType.COMMAND, PacketKind.COMMAND, b"\x00")),
]


@pytest.mark.parametrize(("body", "tag"), VIDEO_VECTORS)
def test_video_vectors_parse_and_build(body: bytes, tag: VideoTag) -> None:
    assert parse_video_tag(body) == tag
    assert build_video_tag(tag) == body


def test_hevc_metadata_packet_is_recognised() -> None:
    tag = parse_video_tag(b"\x94hvc1" + b"\x02\x00\x09colorInfo")
    assert (tag.codec, tag.packet, tag.enhanced) == (VideoCodec.HEVC, PacketKind.METADATA, True)
    assert build_video_tag(tag) == b"\x94hvc1" + b"\x02\x00\x09colorInfo"


def test_keyframe_flag() -> None:
    assert parse_video_tag(b"\x17\x01\x00\x00\x00").is_keyframe
    assert not parse_video_tag(b"\x27\x01\x00\x00\x00").is_keyframe


AUDIO_VECTORS = [
    (b"\xaf\x00\x12\x10", AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, b"\x12\x10")),
    (b"\xaf\x01\x21\x00", AudioTag(AudioCodec.AAC, PacketKind.FRAME, b"\x21\x00")),
    (b"\x2e\xff\xfb", AudioTag(AudioCodec.MP3, PacketKind.FRAME, b"\xff\xfb", 3, True, False)),
]


@pytest.mark.parametrize(("body", "tag"), AUDIO_VECTORS)
def test_audio_vectors_parse_and_build(body: bytes, tag: AudioTag) -> None:
    assert parse_audio_tag(body) == tag
    assert build_audio_tag(tag) == body


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x17\x01\x00",
        b"\x17\x05\x00\x00\x00",
        b"\x1f\x00",
        b"\x07\x00",
        b"\x90hvc",
        b"\x90abcd",
        b"\x99hvc1",
        b"\x91hvc1\x00",
    ],
)
def test_malformed_video_raises(body: bytes) -> None:
    with pytest.raises(FlvError):
        parse_video_tag(body)


@pytest.mark.parametrize("body", [b"", b"\xaf", b"\xaf\x02", b"\x9f\x00"])
def test_malformed_audio_raises(body: bytes) -> None:
    with pytest.raises(FlvError):
        parse_audio_tag(body)


def test_flv_file_walk() -> None:
    header = b"FLV\x01\x05\x00\x00\x00\x09" + bytes(4)
    tag = (
        b"\x09"
        + (5).to_bytes(3, "big")
        + (0x01000020).to_bytes(4, "big")[1:]
        + b"\x01"
        + bytes(3)
        + b"\x17\x02\x00\x00\x00"
        + (16).to_bytes(4, "big")
    )
    tags = list(iter_flv_file(header + tag + tag[:6]))  # a cut last tag ends the walk
    assert len(tags) == 1
    assert (tags[0].tag_type, tags[0].timestamp, tags[0].body) == (9, 0x01000020, b"\x17\x02\x00\x00\x00")
    with pytest.raises(FlvError):
        list(iter_flv_file(b"FLX\x01"))


def test_legacy_codec_id_12_hevc_is_read_and_written_as_enhanced_rtmp() -> None:
    tag = parse_video_tag(b"\x1c\x01\x00\x00\x28abc")  # CodecID 12: the pre-E-RTMP HEVC extension
    assert tag == VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.FRAME, b"abc", 40)
    assert build_video_tag(tag) == b"\x91hvc1\x00\x00\x28abc"
