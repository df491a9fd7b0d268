"""The RTP video packetiser against the edge's own depacketisers (and the RFC framing rules).

ffmpeg-decoded end to end through ``tests/edge/core/depay`` (its RTP is made here too)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.edge.core.depay import H264Depacketizer, HevcDepacketizer
from services.edge.core.mux.codec import H264_AUD, HEVC_AUD, join_annexb, split_annexb
from services.edge.core.pay import RtpVideoPacketizer, video_payloads
from services.edge.core.rtp import parse_rtp
from tests.edge.core.mux.helpers import PPS, SPS

IDR = b"\x65\x88" + bytes(range(256)) * 12  # 3,074 bytes: three FU-A at the default MTU
SEI = b"\x06\x05\x01\x80"
VPS, HSPS, HPPS = b"\x40\x01\x0c\x01", b"\x42\x01\x01\x01", b"\x44\x01\xc0\x73"
IRAP = bytes((19 << 1, 1)) + bytes(range(256)) * 10


def test_h264_sets_aggregated_big_nal_fragmented_aud_dropped() -> None:
    payloads = video_payloads("h264", join_annexb([H264_AUD, SPS, PPS, SEI, IDR]))
    stap, sei, *fus = payloads
    assert stap[0] & 0x1F == 24 and stap[0] & 0x60 == max(SPS[0], PPS[0]) & 0x60  # RFC 6184 §5.7.1
    assert stap[1:] == len(SPS).to_bytes(2, "big") + SPS + len(PPS).to_bytes(2, "big") + PPS
    assert sei == SEI
    assert [p[0] for p in fus] == [(IDR[0] & 0xE0) | 28] * len(fus)  # FU indicator: F, NRI, 28
    assert [p[1] & 0xC0 for p in fus] == [0x80, *[0] * (len(fus) - 2), 0x40]  # S ... E
    assert all(p[1] & 0x1F == 5 for p in fus) and all(len(p) <= 1200 for p in payloads)
    assert IDR[:1] + b"".join(p[2:] for p in fus) == IDR


def test_hevc_ap_and_fu_headers() -> None:
    ap, *fus = video_payloads("hevc", join_annexb([HEVC_AUD, VPS, HSPS, HPPS, IRAP]), mtu=1000)
    assert (ap[0] >> 1) & 0x3F == 48 and ap[1] == 1  # RFC 7798 §4.4.2, TID 1
    assert all((p[0] >> 1) & 0x3F == 49 and p[2] & 0x3F == 19 for p in fus)  # FU header type
    assert [p[2] & 0xC0 for p in fus] == [0x80, *[0] * (len(fus) - 2), 0x40]
    assert all(len(p) <= 1000 for p in fus) and IRAP[:2] + b"".join(p[3:] for p in fus) == IRAP


def test_packets_carry_sequence_timestamp_and_the_marker_on_the_last() -> None:
    pay = RtpVideoPacketizer("h264", payload_type=96, ssrc=0x1234, first_sequence=65534)
    first = pay.packets(join_annexb([SPS, PPS, IDR]), 90_000)
    second = pay.packets(join_annexb([b"\x41\x9a\x01"]), 93_600)
    headers = [parse_rtp(p) for p in first + second]
    assert all(h is not None for h in headers)
    assert [h.sequence for h in headers if h] == [65534, 65535, 0, 1, 2]
    assert [h.marker for h in headers if h] == [False, False, False, True, True]
    assert [h.timestamp for h in headers if h] == [90_000] * 4 + [93_600]
    assert {(h.payload_type, h.ssrc) for h in headers if h} == {(96, 0x1234)}


def test_an_mtu_with_no_room_for_a_fragment_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        video_payloads("h264", join_annexb([IDR]), mtu=2)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=4000), min_size=1, max_size=6),
    st.integers(min_value=64, max_value=1500),
)
def test_h264_round_trip_through_the_depacketiser(bodies: list[bytes], mtu: int) -> None:
    """Any slices survive packetise -> depacketise unchanged (after the depacketiser's AUD)."""
    slices = [bytes((0x65,)) + body.replace(b"\x00\x00", b"\x00\x03") for body in bodies]  # no start codes
    slices = [s for s in slices if not s.endswith(b"\x00")]
    if not slices:
        return
    pay = RtpVideoPacketizer("h264", payload_type=96, ssrc=1, mtu=mtu)
    depay = H264Depacketizer({"sprop-parameter-sets": ""})
    frames = []
    for packet in pay.packets(join_annexb([SPS, PPS, *slices]), 3000):
        header = parse_rtp(packet)
        assert header is not None and len(packet) - 12 <= mtu
        frames += depay.push(header.sequence, header.timestamp, header.marker, packet[header.payload_offset :])
    assert len(frames) == 1 and frames[0].keyframe
    assert split_annexb(frames[0].data) == [H264_AUD, SPS, PPS, *slices]


def test_hevc_round_trip_through_the_depacketiser() -> None:
    pay = RtpVideoPacketizer("hevc", payload_type=96, ssrc=1, mtu=700)
    depay = HevcDepacketizer({})
    frames = []
    for packet in pay.packets(join_annexb([VPS, HSPS, HPPS, IRAP]), 0):
        header = parse_rtp(packet)
        assert header is not None
        frames += depay.push(header.sequence, header.timestamp, header.marker, packet[header.payload_offset :])
    assert len(frames) == 1 and split_annexb(frames[0].data) == [HEVC_AUD, VPS, HSPS, HPPS, IRAP]
