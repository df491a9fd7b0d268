"""Codec glue on real records (ffmpeg 5.1 / x264 / x265 output) and canned headers."""

from __future__ import annotations

import pytest

from services.edge.core.mux.codec import (
    H264_AUD,
    HEVC_AUD,
    AacConfig,
    AvcConfig,
    HevcConfig,
    ParameterSetInserter,
    ParameterSets,
    annexb_keyframe,
    annexb_to_length_prefixed,
    build_adts_frame,
    build_adts_header,
    build_asc,
    build_avcc,
    build_hvcc,
    extract_parameter_sets,
    iter_adts,
    join_annexb,
    length_prefixed_to_annexb,
    parse_adts,
    parse_asc,
    parse_avcc,
    parse_hvcc,
    split_annexb,
)

from .helpers import PPS, SPS, h264_au

# avcC of `ffmpeg -f lavfi -i testsrc2=size=320x240 -c:v libx264 -f mp4` (High, level 1.3,
# with the 14496-15 §5.3.3.1.2 chroma/bit-depth extension).
AVCC = bytes.fromhex("0164000dffe100196764000dacd94141fb011000000300100000030320f142996001000668ebe3cb22c0fdf8f800")
# hvcC of the same with libx265 (-x265-params info=0): VPS, SPS, PPS arrays.
HVCC = bytes.fromhex(
    "0101600000009000000000003cf000fcfdf8f800000f03a00001001840010c01ffff01600000030090000003000003"
    "003c959809a10001002a42010101600000030090000003000003003ca00a080f165959a4932bc05a02000003000200"
    "0003003210a2000100074401c172b46240"
)
# The DecoderSpecificInfo of ffmpeg's `-c:a aac` esds for 44.1 kHz mono: AAC LC, index 4, 1 channel.
ASC_LC_44K_MONO = bytes.fromhex("1208")
# An ADTS header from ffmpeg 5.1 (48 kHz stereo LC), from tests/edge/core/test_media_parsers.py.
ADTS_HEADER = bytes.fromhex("fff14c80221ffc")


def test_avcc_parse_real_record() -> None:
    cfg = parse_avcc(AVCC)
    assert cfg is not None
    assert (cfg.profile_idc, cfg.profile_compatibility, cfg.level_idc, cfg.nal_length_size) == (100, 0, 13, 4)
    assert cfg.sps == (SPS,) and cfg.pps == (PPS,)
    assert (cfg.chroma_format, cfg.bit_depth_luma, cfg.bit_depth_chroma) == (1, 8, 8)


def test_avcc_build_is_byte_exact_and_from_parameter_sets_matches_ffmpeg() -> None:
    cfg = parse_avcc(AVCC)
    assert cfg is not None
    assert build_avcc(cfg) == AVCC
    assert build_avcc(AvcConfig.from_parameter_sets([SPS], [PPS])) == AVCC


def test_avcc_baseline_has_no_extension_and_two_byte_lengths() -> None:
    sps = bytes.fromhex("6742c01fda014016ec0440000003004000000c83c60ca8")  # Constrained Baseline 3.1
    cfg = AvcConfig.from_parameter_sets([sps], [PPS], nal_length_size=2)
    record = build_avcc(cfg)
    assert record[:6] == bytes((1, 0x42, 0xC0, 0x1F, 0xFD, 0xE1))
    assert parse_avcc(record) == cfg
    assert cfg.chroma_format is None


@pytest.mark.parametrize("bad", [b"", b"\x02" + AVCC[1:], AVCC[:10], AVCC[:-6] + b"\x05"])
def test_avcc_malformed_is_none(bad: bytes) -> None:
    assert parse_avcc(bad) is None


def test_hvcc_parse_and_build_real_record() -> None:
    cfg = parse_hvcc(HVCC)
    assert cfg is not None
    assert (cfg.general_profile_idc, cfg.general_level_idc, cfg.chroma_format_idc) == (1, 60, 1)
    assert (cfg.bit_depth_luma, cfg.bit_depth_chroma, cfg.nal_length_size) == (8, 8, 4)
    assert [a.nal_unit_type for a in cfg.arrays] == [32, 33, 34]
    assert build_hvcc(cfg) == HVCC
    sets = cfg.parameter_sets
    assert len(sets.vps) == len(sets.sps) == len(sets.pps) == 1
    # Built from the VPS/SPS/PPS alone (profile/tier/level, chroma, depths from the SPS): ffmpeg's bytes.
    assert build_hvcc(HevcConfig.from_parameter_sets(sets.vps, sets.sps, sets.pps)) == HVCC


@pytest.mark.parametrize("bad", [b"", HVCC[:22], HVCC[:40], b"\x00" + HVCC[1:]])
def test_hvcc_malformed_is_none(bad: bytes) -> None:
    assert parse_hvcc(bad) is None


def test_length_prefixed_and_annexb_round_trip() -> None:
    nals = [b"\x09\xf0", SPS, PPS, b"\x65" + b"\x11" * 300]
    annexb = join_annexb(nals)
    assert annexb.startswith(b"\x00\x00\x00\x01\x09\xf0\x00\x00\x00\x01\x67")
    for size in (1, 2, 4):
        if size == 1:
            with pytest.raises(ValueError):
                annexb_to_length_prefixed(annexb, size)
            continue
        lp = annexb_to_length_prefixed(annexb, size)
        assert lp[:size] == (2).to_bytes(size, "big")
        assert length_prefixed_to_annexb(lp, size) == annexb
    assert split_annexb(annexb) == nals
    # Truncated or zero-length units are refused.
    assert length_prefixed_to_annexb(b"\x00\x00\x00\x05ab", 4) is None
    assert length_prefixed_to_annexb(b"\x00\x00\x00\x00", 4) is None
    assert length_prefixed_to_annexb(b"\x01", 3) is None


def test_keyframe_detection_reads_the_first_slice() -> None:
    assert annexb_keyframe("h264", h264_au(50, idr=True)) is True
    assert annexb_keyframe("h264", h264_au(50, idr=False)) is False
    assert annexb_keyframe("h264", join_annexb([SPS, PPS])) is None
    # HEVC: IDR_W_RADL (19), CRA (21) are IRAP; TRAIL_R (1) is not.
    assert annexb_keyframe("hevc", join_annexb([HEVC_AUD, bytes((19 << 1, 1)) + b"\x80"])) is True
    assert annexb_keyframe("hevc", join_annexb([bytes((21 << 1, 1)) + b"\x80"])) is True
    assert annexb_keyframe("hevc", join_annexb([bytes((1 << 1, 1)) + b"\x80"])) is False


def test_extract_parameter_sets() -> None:
    sets = extract_parameter_sets("h264", h264_au(10, idr=True) + join_annexb([SPS]))
    assert sets == ParameterSets((), (SPS,), (PPS,))
    hvcc = parse_hvcc(HVCC)
    assert hvcc is not None
    stream = join_annexb([*hvcc.parameter_sets.nals(), bytes((19 << 1, 1)) + b"\x80"])
    assert extract_parameter_sets("hevc", stream) == hvcc.parameter_sets


def test_inserter_adds_sets_before_idr_and_an_aud() -> None:
    ins = ParameterSetInserter("h264", ParameterSets((), (SPS,), (PPS,)))
    idr_without = join_annexb([b"\x65" + b"\x22" * 20])
    assert split_annexb(ins.process(idr_without)) == [H264_AUD, SPS, PPS, b"\x65" + b"\x22" * 20]
    assert ins.inserted == 1
    # An AUD already there stays first; a P picture only gets the AUD.
    p_pic = join_annexb([H264_AUD, b"\x41" + b"\x33" * 20])
    assert ins.process(p_pic) == p_pic
    assert split_annexb(ins.process(join_annexb([b"\x41\x01"]))) == [H264_AUD, b"\x41\x01"]
    # An IDR that carries its sets is left alone, and its sets are remembered.
    full = h264_au(30, idr=True)
    assert ins.process(full) == full
    assert ins.inserted == 1
    # Without add_aud and without sets nothing changes.
    plain = ParameterSetInserter("h264", add_aud=False)
    assert plain.process(idr_without) == idr_without


def test_parameter_sets_between_the_slices_of_one_picture_are_moved_before_them() -> None:
    """GStreamer's rtph264pay ``config-interval=-1`` repeats SPS/PPS before each slice of a
    two-slice IDR; H.264 §7.4.1.2.3 lets them come only before the first slice (FFmpeg
    split such a unit into two pictures with one DTS: "non monotonically increasing dts")."""
    sei, idr_a, idr_b = b"\x06\x05\x01\x00\x80", b"\x65\x88\x10", b"\x65\x88\x20"
    unit = join_annexb([H264_AUD, SPS, PPS, sei, SPS, PPS, idr_a, SPS, PPS, idr_b])
    ins = ParameterSetInserter("h264")
    # (the repeat before the first slice is allowed and stays; the one between the slices goes)
    assert split_annexb(ins.process(unit)) == [H264_AUD, SPS, PPS, sei, SPS, PPS, idr_a, idr_b]
    other_pps = b"\x68\xce\x3c\x81"  # a second PPS is kept, in front of the slices
    unit = join_annexb([H264_AUD, SPS, PPS, idr_a, other_pps, idr_b])
    assert split_annexb(ins.process(unit)) == [H264_AUD, SPS, PPS, other_pps, idr_a, idr_b]
    # HEVC: a prefix SEI (39) after a slice moves too; a suffix SEI (40) stays where it is.
    slice_, prefix_sei, suffix_sei = bytes((19 << 1, 1)) + b"\x80", bytes((39 << 1, 1, 5)), bytes((40 << 1, 1, 5))
    out = split_annexb(ParameterSetInserter("hevc").process(join_annexb([HEVC_AUD, slice_, prefix_sei, suffix_sei])))
    assert out == [HEVC_AUD, prefix_sei, slice_, suffix_sei]


def test_inserter_learns_hevc_sets_from_the_stream() -> None:
    hvcc = parse_hvcc(HVCC)
    assert hvcc is not None
    ins = ParameterSetInserter("hevc")
    irap = bytes((19 << 1, 1)) + b"\x80\x44"
    ins.process(join_annexb([*hvcc.parameter_sets.nals(), irap]))
    out = split_annexb(ins.process(join_annexb([irap])))
    assert out == [HEVC_AUD, *hvcc.parameter_sets.nals(), irap]


def test_asc_parse_build() -> None:
    cfg = parse_asc(ASC_LC_44K_MONO + bytes.fromhex("56e500"))
    assert cfg == AacConfig(2, 44100, 1)
    assert build_asc(cfg) == ASC_LC_44K_MONO
    assert build_asc(AacConfig(2, 48000, 2)) == bytes.fromhex("1190")
    # Explicit HE-AAC (AOT 5): core 24 kHz, extension 48 kHz, then the core object type.
    he = parse_asc(build_asc(AacConfig(2, 24000, 2, sbr=True, extension_sample_rate=48000)))
    assert he == AacConfig(2, 24000, 2, True, False, 48000)
    # An explicit rate (index 15) and an escaped object type survive a round trip.
    odd = AacConfig(2, 50000, 2)
    assert parse_asc(build_asc(odd)) == odd
    assert parse_asc(b"") is None and parse_asc(b"\x10") is None


def test_adts_header_bytes_and_parse() -> None:
    header = build_adts_header(AacConfig(2, 48000, 2), 0x110 - 7)
    assert header == ADTS_HEADER[:3] + bytes((0x80, 0x22, 0x1F, 0xFC))
    frame = build_adts_frame(AacConfig(2, 48000, 2), b"\xaa" * 100)
    parsed = parse_adts(frame)
    assert parsed is not None
    assert parsed.config == AacConfig(2, 48000, 2)
    assert parsed.raw == b"\xaa" * 100 and parsed.frame_length == 107 and parsed.samples == 1024
    assert build_asc(parsed.config) == bytes.fromhex("1190")


def test_adts_with_crc_and_garbage_between_frames() -> None:
    cfg = AacConfig(2, 44100, 1)
    f1 = build_adts_frame(cfg, b"\x01" * 20)
    # protection_absent = 0: two CRC bytes follow the header and are not part of the raw frame.
    raw = b"\x02" * 20
    length = 9 + len(raw)
    with_crc = bytearray(build_adts_header(cfg, len(raw) + 2))
    with_crc[1] &= 0xFE
    assert (((with_crc[3] & 3) << 11) | (with_crc[4] << 3) | (with_crc[5] >> 5)) == length
    f2 = bytes(with_crc) + b"\xbe\xef" + raw
    frames = list(iter_adts(b"\x00\x12" + f1 + b"\xff\x00garbage" + f2))
    assert [f.raw for _, f in frames] == [b"\x01" * 20, raw]
    assert parse_adts(f1[:-1]) is None


@pytest.mark.parametrize(
    "cfg",
    [AacConfig(5, 48000, 2), AacConfig(2, 50000, 2), AacConfig(2, 48000, 9)],
)
def test_adts_refuses_what_it_cannot_carry(cfg: AacConfig) -> None:
    with pytest.raises(ValueError):
        build_adts_header(cfg, 10)
    with pytest.raises(ValueError):
        build_adts_header(AacConfig(2, 48000, 2), 9000)
