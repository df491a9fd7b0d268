"""Hypothesis: arbitrary payloads and packets never raise (beyond the documented ValueErrors of
the constructors) and never grow the pending buffers past their bounds."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.depay import (
    MAX_UNIT_BYTES,
    AacHbrDepacketizer,
    H264Depacketizer,
    HevcDepacketizer,
    LatmDepacketizer,
    MediaSession,
    TrackSpec,
)
from services.edge.core.depay.audio import MAX_LATM_BYTES
from services.edge.core.depay.rtcp import parse_rtcp
from services.edge.core.mux.codec import AacConfig
from services.edge.core.mux.from_units import MAX_PENDING

from .rtpgen import hbr_fmtp, latm_fmtp

AAC = AacConfig(2, 48000, 2)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

packet = st.tuples(
    st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF), st.booleans(), st.binary(min_size=0, max_size=300)
)
# mostly-consecutive sequence numbers and few timestamps, so units actually form
near = st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans(), st.binary(max_size=200))


def structured(first: bytes) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=120).map(lambda b: first + b)


payload_for = {
    "h264": st.one_of(st.binary(max_size=200), *(structured(bytes([t])) for t in (0x65, 0x78, 0x7C, 0x5C, 0x19))),
    "hevc": st.one_of(st.binary(max_size=200), *(structured(bytes([t << 1, 1])) for t in (19, 1, 48, 49, 50))),
    "hbr": st.binary(max_size=200),
    "latm": st.binary(max_size=200),
}


def make(kind: str) -> H264Depacketizer | HevcDepacketizer | AacHbrDepacketizer | LatmDepacketizer:
    if kind == "h264":
        return H264Depacketizer({"sprop-parameter-sets": "Z0IAKeKQFAe2AtwEBAaQeJEV,aM48gA=="})
    if kind == "hevc":
        return HevcDepacketizer({})
    if kind == "hbr":
        return AacHbrDepacketizer(hbr_fmtp(AAC), 48000, 2)
    return LatmDepacketizer(latm_fmtp(AAC), 48000, 2)


def check_bounds(d: object) -> None:
    if isinstance(d, H264Depacketizer | HevcDepacketizer):
        assert d._size <= MAX_UNIT_BYTES + 0xFFFF
        assert len(d._carry) <= 32
    if isinstance(d, LatmDepacketizer):
        assert len(d._buf) <= MAX_LATM_BYTES + 0xFFFF


def feed(kind: str, steps: list[tuple[int, int, bool, bytes]], *, relative: bool) -> None:
    d = make(kind)
    seq, ts = 0, 0
    for a, b, marker, data in steps:
        if relative:
            seq, ts = (seq + a) & 0xFFFF, ts + b * 3000
        else:
            seq, ts = a, b
        for frame in d.push(seq, ts, marker, data):
            assert isinstance(frame.data, bytes) and 0 <= frame.timestamp <= 0xFFFFFFFF
        check_bounds(d)
    d.flush()


@FAST
@given(st.lists(packet, max_size=40))
def test_h264_any_packets(steps: list[tuple[int, int, bool, bytes]]) -> None:
    feed("h264", steps, relative=False)


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans(), payload_for["h264"]), max_size=40))
def test_h264_structured(steps: list[tuple[int, int, bool, bytes]]) -> None:
    feed("h264", steps, relative=True)


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans(), payload_for["hevc"]), max_size=40))
def test_hevc_structured(steps: list[tuple[int, int, bool, bytes]]) -> None:
    feed("hevc", steps, relative=True)


@FAST
@given(st.lists(near, max_size=40))
def test_aac_hbr_any_payloads(steps: list[tuple[int, int, bool, bytes]]) -> None:
    feed("hbr", steps, relative=True)


@FAST
@given(st.lists(near, max_size=40))
def test_latm_any_payloads(steps: list[tuple[int, int, bool, bytes]]) -> None:
    feed("latm", steps, relative=True)


@FAST
@given(st.binary(max_size=400))
def test_parse_rtcp_never_raises(data: bytes) -> None:
    parse_rtcp(data)


def rtp(seq: int, ts: int, marker: bool, payload: bytes, pt: int) -> bytes:
    return struct.pack("!BBHII", 0x80, (0x80 if marker else 0) | pt, seq, ts, 0x1234) + payload


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from([0, 1, 2]), st.binary(max_size=200), st.just(False)),
            st.tuples(
                st.sampled_from([0, 1]),
                st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans(), st.binary(max_size=150)).map(
                    lambda t: rtp(t[0], t[1] * 3000, t[2], t[3], 96)
                ),
                st.just(False),
            ),
            st.tuples(st.sampled_from([0, 1]), st.binary(max_size=100), st.just(True)),
        ),
        max_size=60,
    )
)
def test_media_session_any_packets(items: list[tuple[int, bytes, bool]]) -> None:
    session = MediaSession(our_ssrc=1, cname="fuzz")
    tracks = [
        TrackSpec(0, "video", "H264", 90000, None, {"sprop-parameter-sets": "garbage"}),
        TrackSpec(1, "audio", "mpeg4-generic", 48000, 2, hbr_fmtp(AAC)),
    ]
    assert session.begin(tracks, 0.0) == [0, 1]
    t = 0.0
    for track, data, is_rtcp in items:
        t += 0.01
        if is_rtcp:
            session.on_rtcp(track, data, t)
        else:
            for d in session.on_rtp(track, data, t):
                assert len(d) == 1316
        assert session.units._held() <= MAX_PENDING
    session.receiver_reports(t)
    assert all(len(d) == 1316 for d in session.flush())
