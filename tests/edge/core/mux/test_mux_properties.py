"""Property tests (house style: tests/edge/core/test_properties.py): mux -> demux gives the same
access units back for random sizes and timestamps, and the demuxer takes any bytes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.mux.codec import (
    annexb_to_length_prefixed,
    iter_adts,
    length_prefixed_to_annexb,
    parse_adts,
    parse_asc,
    parse_avcc,
    parse_hvcc,
)
from services.edge.core.mux.ts_demux import MAX_AUDIO_PES, MAX_VIDEO_PES, TsDemuxer
from services.edge.core.mux.ts_mux import MuxConfig, TsMuxer
from services.edge.core.mux.units import TS_MASK

from .helpers import adts, h264_au, split

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

units_strategy = st.lists(
    st.tuples(
        st.booleans(),  # video?
        st.integers(0, 6000),  # size
        st.integers(0, 3000),  # timestamp step
        st.integers(0, 9000),  # PTS - DTS (B-frame reorder delay)
        st.booleans(),  # keyframe
    ),
    min_size=1,
    max_size=25,
)


@FAST
@given(units_strategy, st.integers(0, TS_MASK), st.integers(1, 2000), st.sampled_from([0, 3_000_000]))
def test_mux_then_demux_gives_the_units_back(
    units: list[tuple[bool, int, int, int, bool]], start: int, chunk: int, rate: int
) -> None:
    mux = TsMuxer(MuxConfig(mux_rate=rate))
    sent_video: list[tuple[int, int, bytes, bool]] = []
    sent_audio: list[tuple[int, bytes]] = []
    out = bytearray()
    t = start
    for i, (is_video, size, step, delay, keyframe) in enumerate(units):
        t += step
        if is_video:
            au = h264_au(size, idr=keyframe, seed=i)
            pts = (t + delay) & TS_MASK
            out += mux.mux_video(au, t + delay, t)
            sent_video.append((pts, t & TS_MASK, au, keyframe))
        else:
            frame = adts(min(size, 8000), seed=i)
            out += mux.mux_audio(frame, t)
            sent_audio.append((t & TS_MASK, frame))
    assert len(out) % 188 == 0 and all(p[0] == 0x47 for p in split(out))
    d = TsDemuxer()
    got = []
    for k in range(0, len(out), chunk):
        got += d.feed(out[k : k + chunk])
    got += d.flush()
    assert [(u.pts, u.dts, u.data, u.keyframe) for u in got if u.kind == "video"] == sent_video
    assert [(u.pts, u.data) for u in got if u.kind == "audio"] == sent_audio
    assert d.stats.cc_errors == 0 and d.stats.malformed_pes == 0


@FAST
@given(st.lists(st.binary(max_size=700), max_size=30))
def test_demuxer_takes_any_bytes_and_stays_bounded(chunks: list[bytes]) -> None:
    d = TsDemuxer()
    for c in chunks:
        d.feed(c)
        assert len(d._rest) < 2 * 188
        assert all(len(s.buf) <= (MAX_VIDEO_PES if s.kind == "video" else MAX_AUDIO_PES) for s in d._streams.values())
    d.flush()


@FAST
@given(st.lists(st.tuples(st.integers(0, 0x1FFF), st.binary(min_size=183, max_size=183)), max_size=40))
def test_demuxer_takes_any_aligned_packets(packets: list[tuple[int, bytes]]) -> None:
    # Sync bytes in place, everything else random: the packet parser paths, not the resync.
    d = TsDemuxer()
    good = TsMuxer().tables()  # so PMT and ES PIDs are known and random payloads hit them
    d.feed(good)
    for pid, body in packets:
        pkt = bytes((0x47, body[0] & 0xE0 | (pid >> 8), pid & 0xFF)) + body[1:]
        d.feed(pkt + b"")
    d.flush()


@FAST
@given(st.binary(max_size=300), st.sampled_from([1, 2, 4]))
def test_codec_parsers_never_raise(data: bytes, size: int) -> None:
    parse_avcc(data)
    parse_hvcc(data)
    parse_asc(data)
    parse_adts(data)
    list(iter_adts(data))
    length_prefixed_to_annexb(data, size)


# NAL units as emulation prevention leaves them: no 00 00 inside, no trailing zero byte.
nal_strategy = st.binary(min_size=1, max_size=400).map(lambda b: b.replace(b"\x00", b"\x03") or b"\x01")


@FAST
@given(st.lists(nal_strategy, min_size=1, max_size=10), st.sampled_from([2, 4]))
def test_length_prefixed_annexb_round_trip(nals: list[bytes], size: int) -> None:
    lp = b"".join(len(n).to_bytes(size, "big") + n for n in nals)
    annexb = length_prefixed_to_annexb(lp, size)
    assert annexb is not None
    assert annexb_to_length_prefixed(annexb, size) == lp
