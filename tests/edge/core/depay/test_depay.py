"""The depacketisers on crafted payloads: each RFC structure, loss, configuration errors."""

from __future__ import annotations

import base64

import pytest

from services.edge.core.depay import (
    MAX_UNIT_BYTES,
    AacHbrDepacketizer,
    H264Depacketizer,
    HevcDepacketizer,
    LatmDepacketizer,
    make_depacketizer,
)
from services.edge.core.depay.audio import parse_stream_mux_config
from services.edge.core.mux import AccessUnit, parse_adts
from services.edge.core.mux.codec import AacConfig, split_annexb
from services.edge.core.mux.from_units import UnitsToTs
from tests.edge.core.mux.helpers import PPS, SPS

from .rtpgen import hbr_fmtp, hbr_payload, latm_element, latm_fmtp, stream_mux_config

IDR = bytes([0x65]) + bytes(range(1, 200))
SLICE = bytes([0x41]) + bytes(range(1, 50))
SPROP = {
    "packetization-mode": "1",
    "sprop-parameter-sets": f"{base64.b64encode(SPS).decode()},{base64.b64encode(PPS).decode()}",
}
AAC = AacConfig(2, 48000, 2)


def stap_a(*nals: bytes) -> bytes:
    return bytes([0x78]) + b"".join(len(n).to_bytes(2, "big") + n for n in nals)


def fu_a(nal: bytes, size: int) -> list[bytes]:
    body = nal[1:]
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return [
        bytes([(nal[0] & 0xE0) | 28, (0x80 if i == 0 else 0) | (0x40 if i == len(chunks) - 1 else 0) | (nal[0] & 0x1F)])
        + c
        for i, c in enumerate(chunks)
    ]


def types(data: bytes) -> list[int]:
    return [n[0] & 0x1F for n in split_annexb(data)]


def test_h264_sprop_sets_go_in_front_of_each_idr_after_an_aud() -> None:
    d = H264Depacketizer(SPROP)
    frames = d.push(1, 3000, True, IDR)
    frames += d.push(2, 6000, True, SLICE)
    assert [types(f.data) for f in frames] == [[9, 7, 8, 5], [9, 1]]
    assert [f.keyframe for f in frames] == [True, False] and [f.timestamp for f in frames] == [3000, 6000]


def test_h264_stap_a_and_fu_a_with_timestamp_change_as_boundary() -> None:
    d = H264Depacketizer({"packetization-mode": "1"})  # no sprop: in-band sets
    out = d.push(10, 0, False, stap_a(SPS, PPS))
    for i, p in enumerate(fu_a(IDR, 60)):
        out += d.push(11 + i, 0, False, p)  # no marker: the next timestamp ends it
    assert out == []
    out = d.push(15, 3600, False, SLICE)
    assert len(out) == 1 and types(out[0].data) == [9, 7, 8, 5] and split_annexb(out[0].data)[3] == IDR
    assert d.flush()[0].timestamp == 3600
    assert d.stats.units == 2 and d.stats.lost_units == 0


@pytest.mark.parametrize("sprop", ["", "!!!!", "Zm9vYmFy,,", "Z0IAKeKQFAe2AtwEBAaQeJEV", "not base64 at all"])
def test_h264_broken_sprop_falls_back_to_in_band_sets(sprop: str) -> None:
    d = H264Depacketizer({"sprop-parameter-sets": sprop})
    assert d.push(1, 0, True, IDR) == []  # an IDR without parameter sets cannot start a decoder
    assert d.stats.before_keyframe == 1
    out = d.push(2, 3000, True, stap_a(SPS, PPS, IDR))
    out += d.push(3, 6000, True, IDR)
    assert [types(f.data) for f in out] == [[9, 7, 8, 5], [9, 7, 8, 5]]


def test_h264_lost_fragment_drops_only_its_unit() -> None:
    d = H264Depacketizer(SPROP)
    assert len(d.push(1, 0, True, IDR)) == 1
    parts = fu_a(SLICE, 10)
    out = []
    for i, p in enumerate(parts):
        if i != 2:
            out += d.push(2 + i, 3000, i == len(parts) - 1, p)
    assert out == [] and d.stats.lost_units == 1
    assert len(d.push(2 + len(parts), 6000, True, SLICE)) == 1
    # a fragment without its start, then one without its end
    assert d.push(100, 9000, True, parts[1]) == [] and d.stats.lost_units == 2
    d.push(101, 12000, False, parts[0])
    assert d.push(102, 15000, True, SLICE) == [] or d.stats.lost_units == 3
    assert d.stats.lost_units == 3


def test_h264_interleaved_structures_are_unsupported() -> None:
    d = H264Depacketizer(SPROP)
    for t in (25, 26, 27, 29):
        d.push(t, 0, False, bytes([0x60 | t, 0, 0, 0]))
    assert d.stats.unsupported_packets == 4
    d.push(40, 0, False, bytes([0x80 | 1]))  # forbidden_zero_bit
    d.push(41, 0, False, bytes([0x78, 0, 200, 1]))  # STAP-A overrunning its packet
    assert d.stats.bad_packets == 2
    with pytest.raises(ValueError, match="packetization-mode 2"):
        H264Depacketizer({"packetization-mode": "2"})


def test_oversized_unit_is_dropped_and_memory_stays_bounded() -> None:
    d = H264Depacketizer(SPROP)
    start, *_ = fu_a(bytes([0x65]) + b"\x01" * 100, 50)
    d.push(0, 0, False, start)
    chunk = bytes([0x7C, 0x05]) + b"\x01" * 60_000
    for i in range(1, 160):  # 9.6 MB of middle fragments of one picture
        d.push(i, 0, False, chunk)
        assert d._size <= MAX_UNIT_BYTES + 70_000
    assert d.push(160, 0, True, bytes([0x7C, 0x45, 1])) == []
    assert d.stats.lost_units == 1


def hevc_nal(t: int, body: bytes = b"\x11\x22\x33") -> bytes:
    return bytes([t << 1, 1]) + body


def test_hevc_ap_fu_and_refusals() -> None:
    vps, sps, pps = hevc_nal(32), hevc_nal(33), hevc_nal(34)
    d = HevcDepacketizer({})
    ap = bytes([48 << 1, 1]) + b"".join(len(n).to_bytes(2, "big") + n for n in (vps, sps, pps))
    irap = hevc_nal(19, bytes(range(1, 100)))
    d.push(1, 0, False, ap)
    fu = [bytes([49 << 1, 1, 0x80 | 19]) + irap[2:50], bytes([49 << 1, 1, 0x40 | 19]) + irap[50:]]
    d.push(2, 0, False, fu[0])
    frames = d.push(3, 0, True, fu[1])
    assert len(frames) == 1 and frames[0].keyframe
    nals = split_annexb(frames[0].data)
    assert [(n[0] >> 1) & 0x3F for n in nals] == [35, 32, 33, 34, 19] and nals[-1] == irap
    d.push(4, 3000, True, bytes([50 << 1, 1, 0, 0]))
    assert d.stats.unsupported_packets == 1
    with pytest.raises(ValueError, match="sprop-max-don-diff=2"):
        HevcDepacketizer({"sprop-max-don-diff": "2"})


def test_aac_hbr_several_units_per_packet_and_a_fragmented_one() -> None:
    d = AacHbrDepacketizer(hbr_fmtp(AAC), 48000, 2)
    frames = d.push(1, 1000, True, hbr_payload([b"\x01" * 10, b"\x02" * 20, b"\x03" * 30]))
    assert [f.timestamp for f in frames] == [1000, 2024, 3048]
    assert [parse_adts(f.data).raw for f in frames] == [b"\x01" * 10, b"\x02" * 20, b"\x03" * 30]  # type: ignore[union-attr]
    big = bytes(range(256)) * 4
    header = (16).to_bytes(2, "big") + (len(big) << 3).to_bytes(2, "big")
    assert d.push(2, 4072, False, header + big[:400]) == []
    assert d.push(3, 4072, False, header + big[400:800]) == []
    out = d.push(4, 4072, True, header + big[800:])
    assert len(out) == 1 and parse_adts(out[0].data).raw == big  # type: ignore[union-attr]
    # the same with its middle fragment lost: dropped, counted
    d.push(5, 5096, False, header + big[:400])
    assert d.push(7, 5096, True, header + big[800:]) == [] and d.stats.lost_units == 1


def test_aac_lbr_and_clock_scaling() -> None:
    fmtp = {**hbr_fmtp(AAC), "mode": "AAC-lbr", "sizelength": "6", "indexlength": "2", "indexdeltalength": "2"}
    d = AacHbrDepacketizer(fmtp, 90000, 2)  # an odd clock: 1024 samples at 48 kHz = 1920 ticks
    payload = (16).to_bytes(2, "big") + bytes([5 << 2, 7 << 2]) + b"\x01" * 5 + b"\x02" * 7
    assert [(len(f.data), f.timestamp) for f in d.push(1, 0, True, payload)] == [(12, 0), (14, 1920)]


@pytest.mark.parametrize(
    ("fmtp", "error"),
    [
        ({"mode": "AAC-hbr"}, "no fmtp config"),
        ({"mode": "AAC-hbr", "config": "zz"}, "not hexadecimal"),
        ({"mode": "AAC-hbr", "config": "00"}, "not a valid AudioSpecificConfig"),
        ({"mode": "CELP-cbr", "config": "1190"}, "mode 'CELP-cbr'"),
        ({"config": "1190"}, "mode None"),
    ],
)
def test_aac_hbr_unusable_configs(fmtp: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        make_depacketizer("mpeg4-generic", 48000, 2, fmtp)


def test_latm_elements_fragmented_and_escaped_lengths() -> None:
    d = LatmDepacketizer(latm_fmtp(AAC), 48000, 2)
    frame = bytes(range(256)) * 2  # 512 bytes: PayloadLengthInfo 0xFF 0xFF 0x02
    element = latm_element(frame)
    assert element[:3] == b"\xff\xff\x02"
    assert d.push(1, 500, False, element[:100]) == []
    out = d.push(2, 500, True, element[100:])
    assert len(out) == 1 and parse_adts(out[0].data).raw == frame  # type: ignore[union-attr]
    two = d.push(3, 1524, True, latm_element(b"\x01" * 9) + latm_element(b"\x02" * 9))
    assert [f.timestamp for f in two] == [1524, 2548]
    d.push(4, 3000, False, element[:100])
    assert d.push(6, 3000, True, element[200:]) == [] and d.stats.lost_units == 1


def test_latm_config_parsing_and_refusals() -> None:
    config, subframes, other = parse_stream_mux_config(stream_mux_config(AAC))
    assert (config, subframes, other) == (AAC, 1, 0)
    with pytest.raises(ValueError, match="cpresent=1"):
        LatmDepacketizer({"config": stream_mux_config(AAC).hex()}, 48000, 2)
    with pytest.raises(ValueError, match="cpresent=1"):
        make_depacketizer("MP4A-LATM", 48000, 2, {"cpresent": "1"})
    with pytest.raises(ValueError, match="audioMuxVersion 1"):
        LatmDepacketizer({"cpresent": "0", "config": "c0"}, 48000, 2)
    with pytest.raises(ValueError, match="no fmtp config"):
        LatmDepacketizer({"cpresent": "0"}, 48000, 2)
    # GStreamer's rtpmp4apay stops right after the AudioSpecificConfig (48 kHz stereo AAC LC):
    # taken like FFmpeg takes it, as frameLengthType 0 without other data.
    assert parse_stream_mux_config(bytes.fromhex("40002320")) == (AacConfig(2, 48000, 2), 1, 0)
    with pytest.raises(ValueError, match="truncated"):
        parse_stream_mux_config(bytes.fromhex("4000"))  # cut inside the AudioSpecificConfig


def test_make_depacketizer_answers_none_for_other_codecs() -> None:
    assert make_depacketizer("PCMU", 8000, 1, {}) is None
    assert make_depacketizer("VP8", 90000, None, {}) is None
    assert isinstance(make_depacketizer("h264", 90000, None, {}), H264Depacketizer)
    assert isinstance(make_depacketizer("H265", 90000, None, {}), HevcDepacketizer)


def unit(kind: str, t: int, key: bool = True) -> AccessUnit:
    data = (
        b"\x00\x00\x00\x01\x09\xf0\x00\x00\x00\x01\x65\x88" if kind == "video" else b"\xff\xf1\x4c\x80\x01\x3f\xfc\x00"
    )
    return AccessUnit(kind, "h264" if kind == "video" else "aac", 0, t, t, key, data)  # type: ignore[arg-type]


def test_units_to_ts_waits_then_starts_the_announced_program() -> None:
    conv = UnitsToTs()
    conv.begin("h264", "aac")
    out: list[bytes] = []
    for i in range(60):  # audio only for 1 s: the program starts, with the announced video in it
        out += conv.push(unit("audio", 90_000 + i * 1920))
    assert conv.started and conv.program == ("h264", "aac")
    out += conv.push(unit("video", 200_000))  # the video joins at its first keyframe
    out += conv.push(AccessUnit("video", "hevc", 0, 210_000, 210_000, True, b""))  # not announced
    assert conv.stats.late_streams == 1
    out += conv.flush()
    assert conv.stats.video_units == 1 and conv.stats.audio_units == 60
    assert out and all(len(d) == 1316 for d in out)


def test_units_to_ts_starts_video_on_a_keyframe_and_interleaves_by_dts() -> None:
    conv = UnitsToTs()
    conv.begin("h264", "aac")
    conv.push(unit("video", 90_000, key=False))
    assert conv.stats.dropped_before_keyframe == 1
    conv.push(unit("video", 93_600))
    conv.push(unit("audio", 90_000))
    assert conv.started
    conv.push(unit("audio", 91_920))
    assert conv.push(unit("audio", 91_000)) == [] and conv.stats.late_units == 1


def test_parameter_sets_sent_alone_join_the_next_picture_after_its_aud() -> None:
    d = H264Depacketizer({"packetization-mode": "1"})
    aud = b"\x09\xf0"
    assert d.push(1, 0, True, stap_a(aud, SPS, PPS)) == []  # a unit of its own, marker set
    frames = d.push(2, 0, False, aud) + d.push(3, 0, True, IDR)
    assert len(frames) == 1 and types(frames[0].data) == [9, 7, 8, 5]
