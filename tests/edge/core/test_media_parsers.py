"""ES header parsers on canned headers (taken from ffmpeg 5.1 output; expected values are
ffprobe's for the same streams), plus malformed cases."""

from __future__ import annotations

import pytest

from services.edge.core.media import audio, h264, hevc, mpeg2video
from services.edge.core.media.audio import AudioParams
from services.edge.core.media.bits import BitReader, BitsExhausted, iter_nal_units, unescape_rbsp

SPS_720P25 = bytes.fromhex("6742c01fda014016ec0440000003004000000c83c60ca8")
SPS_1080I2997 = bytes.fromhex("674d4028f403c0227ef01100000303e90000ea601f162ea0")
HEVC_SPS_1080P2997 = bytes.fromhex(
    "420101016000000300900000030000030078a003c0801107cb965654a4c2f01680800001f480003a9804"
)
M2V_1080I25 = bytes.fromhex("000001b378043833ffffe2b8") + bytes.fromhex("000001b5144200010000")


@pytest.mark.parametrize(
    ("sps", "expected"),
    [
        (SPS_720P25, ("h264", "Constrained Baseline", "3.1", 1280, 720, 25.0, False)),
        (SPS_1080I2997, ("h264", "Main", "4", 1920, 1080, 29.97, True)),
    ],
)
def test_h264_sps(sps: bytes, expected: tuple[object, ...]) -> None:
    p = h264.parse_sps(sps)
    assert p is not None
    assert (p.codec, p.profile, p.level, p.width, p.height, p.frame_rate, p.interlaced) == expected


def test_hevc_sps() -> None:
    p = hevc.parse_sps(HEVC_SPS_1080P2997)
    assert p is not None
    assert (p.codec, p.profile, p.level, p.resolution, p.frame_rate) == ("hevc", "Main", "4", "1920x1080", 29.97)


def test_mpeg2_sequence_header_and_extension() -> None:
    p = mpeg2video.find_sequence(b"\x00" * 5 + M2V_1080I25)
    assert p is not None
    assert (p.codec, p.profile, p.level, p.resolution, p.frame_rate, p.interlaced) == (
        "mpeg2video",
        "Main",
        "High",
        "1920x1080",
        25.0,
        True,
    )
    # Without the extension it is MPEG-1 video.
    p1 = mpeg2video.find_sequence(M2V_1080I25[:12])
    assert p1 is not None and p1.codec == "mpeg1video"


@pytest.mark.parametrize(
    ("finder", "header", "expected"),
    [
        (audio.find_adts, "fff14c80221ffcde02004c6176633539", AudioParams("aac", 48000, 2, "LC")),
        (audio.find_mpeg_audio, "fffda00466444444335544333333336d", AudioParams("mp2", 44100, 2)),
        (audio.find_ac3, "0b771e8b1c40ebf8403eff74fe1e1080", AudioParams("ac3", 48000, 6)),
        (audio.find_ac3, "0b7701ff3f87c0002080200002004000", AudioParams("eac3", 48000, 6)),
    ],
)
def test_audio_headers(finder: object, header: str, expected: AudioParams) -> None:
    assert callable(finder)
    assert finder(b"\x00\x01" + bytes.fromhex(header)) == expected


def test_latm_with_stream_mux_config() -> None:
    # LOAS sync, length, AudioMuxElement: useSameStreamMux 0, version 0, allStreamsSameTimeFraming 1,
    # numSubFrames 0, numProgram 0, numLayer 0, AudioSpecificConfig AOT 2 (LC), 44.1 kHz (4), mono.
    bits = "0" + "0" + "1" + "000000" + "0000" + "000" + "00010" + "0100" + "0001" + "000"
    bits += "0" * (-len(bits) % 8)
    body = int(bits, 2).to_bytes(len(bits) // 8, "big")
    frame = bytes([0x56, 0xE0 | (len(body) >> 8), len(body) & 0xFF]) + body
    assert audio.find_latm(frame) == AudioParams("aac_latm", 44100, 1, "LC")
    # useSameStreamMux = 1 carries no configuration.
    assert audio.find_latm(bytes([0x56, 0xE0, 0x02, 0x80, 0x00])) is None


@pytest.mark.parametrize("cut", [1, 4, 8, 12])
def test_truncated_headers_answer_none(cut: int) -> None:
    assert h264.parse_sps(SPS_720P25[:cut]) is None
    assert hevc.parse_sps(HEVC_SPS_1080P2997[:cut]) is None
    assert audio.find_ac3(bytes.fromhex("0b771e8b1c40ebf8")[: min(cut, 7)]) is None


def test_bits_helpers() -> None:
    r = BitReader(bytes([0b10100110, 0b01000000]))
    assert r.ue() == 0  # "1"
    assert r.ue() == 1  # "010"
    assert r.ue() == 2  # "011"
    assert r.se() == 2  # "00100" -> k=3 -> +2 (H.264 Table 9-3)
    with pytest.raises(BitsExhausted):
        r.u(8)
    assert unescape_rbsp(b"\x00\x00\x03\x01\x00\x00\x03") == b"\x00\x00\x01\x00\x00"
    units = list(iter_nal_units(b"\x00\x00\x00\x01\x67\xaa\x00\x00\x01\x68\xbb"))
    assert units == [b"\x67\xaa", b"\x68\xbb"]
