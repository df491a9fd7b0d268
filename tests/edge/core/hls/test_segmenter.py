"""``HlsSegmenter`` against real ffmpeg TS and crafted streams (docs/hls.md, "Segmenting")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.hls import HlsSegmenter, Segment
from services.edge.core.mux import MuxConfig, TsMuxer
from tests.edge.core.hls.conftest import FFMPEG
from tests.edge.core.mux.helpers import adts, h264_au
from tests.helpers.hls_check import check_segment, pts_seconds

TS = 188


def segment_all(data: bytes, target: float, batch: int = 1316, **kwargs: float) -> tuple[HlsSegmenter, list[Segment]]:
    segmenter = HlsSegmenter(target, **kwargs)  # type: ignore[arg-type]
    out: list[Segment] = []
    for i in range(0, len(data), batch):
        out += segmenter.feed(data[i : i + batch])
    return segmenter, out


def decode_errors(path: Path) -> str:
    done = subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-i", str(path), "-f", "null", "-"], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.decode()


# ---------------------------------------------------------------------- real ffmpeg TS


def test_h264_segments_are_one_gop_and_each_decodes_alone(h264_ts: bytes, tmp_path: Path) -> None:
    segmenter, segments = segment_all(h264_ts, 1.0)
    assert [s.sequence for s in segments] == list(range(5))  # 6 s: the last one stays open
    assert [s.duration for s in segments] == [1.0] * 5
    assert not any(s.discontinuity for s in segments)
    infos = [check_segment(s.data) for s in segments]
    for a, b, seg in zip(infos, infos[1:], segments, strict=False):
        assert a.first_pts is not None and b.first_pts is not None
        assert pts_seconds(b.first_pts, a.first_pts) == seg.duration
    for seg in segments:
        path = tmp_path / f"seg_{seg.sequence}.ts"
        path.write_bytes(seg.data)
        assert decode_errors(path) == ""
    assert segmenter.stats.segments_dropped == 0 and segmenter.stats.bad_packets == 0
    # Only the source's PAT/PMT and null packets are left out: every media packet is kept.
    assert segmenter.stats.packets_before_start <= 2


def test_target_rounds_up_to_the_gop(h264_ts: bytes) -> None:
    _, two = segment_all(h264_ts, 2.0)
    assert [s.duration for s in two] == [2.0, 2.0]
    _, half = segment_all(h264_ts, 0.5)
    assert [s.duration for s in half] == [1.0] * 5  # no keyframe in between: a GOP is the least
    _, odd = segment_all(h264_ts, 1.5)
    assert [s.duration for s in odd] == [2.0, 2.0]


@pytest.mark.parametrize("batch", [1, 7, 188, 1316, 65536])
def test_batches_of_any_size_give_the_same_segments(h264_ts: bytes, batch: int) -> None:
    _, reference = segment_all(h264_ts, 1.0)
    _, got = segment_all(h264_ts, 1.0, batch=batch)
    assert got == reference


def _set_rai(data: bytes, on: bool) -> bytes:
    """Clear (or set, where an adaptation field exists) random_access_indicator everywhere."""
    out = bytearray(data)
    for off in range(0, len(out), TS):
        if out[off + 3] & 0x20 and out[off + 4] > 0:
            if on:
                out[off + 5] |= 0x40
            else:
                out[off + 5] &= ~0x40 & 0xFF
    return bytes(out)


def test_keyframes_are_found_from_the_nal_types_not_the_rai_flag(h264_ts: bytes) -> None:
    _, reference = segment_all(h264_ts, 1.0)
    for on in (False, True):
        _, got = segment_all(_set_rai(h264_ts, on), 1.0)
        assert [(s.duration, s.sequence) for s in got] == [(s.duration, s.sequence) for s in reference]


def test_hevc_cuts_at_irap_pictures(hevc_ts: bytes, tmp_path: Path) -> None:
    _, segments = segment_all(hevc_ts, 1.0)
    assert len(segments) == 3 and all(s.duration == 1.0 for s in segments)
    for seg in segments:
        assert check_segment(seg.data).keyframe
    path = tmp_path / "s.ts"
    path.write_bytes(segments[1].data)
    assert decode_errors(path) == ""


def test_audio_only_cuts_at_audio_pes_starts(audio_ts: bytes, tmp_path: Path) -> None:
    _, segments = segment_all(audio_ts, 1.0)
    assert len(segments) >= 3
    for seg in segments:
        assert 1.0 <= seg.duration < 1.5  # ffmpeg puts several AAC frames (~0.25 s) in one PES
        check_segment(seg.data, audio_only=True)
    path = tmp_path / "a.ts"
    path.write_bytes(segments[1].data)
    assert decode_errors(path) == ""


def test_tables_have_their_own_continuity(h264_ts: bytes) -> None:
    _, segments = segment_all(h264_ts, 1.0)
    seen: list[int] = []
    for seg in segments:
        assert seg.data[0:4][1:3] == b"\x40\x00"  # PUSI, PID 0
        seen.append(seg.data[3] & 0x0F)
    assert seen == list(range(len(segments)))  # one PAT packet per segment, CC 0, 1, 2...


# ---------------------------------------------------------------------- crafted streams


def crafted(
    gops: int, *, gop_frames: int = 25, first_pts: int = 900_000, sei: int = 0, jump_at: int | None = None
) -> bytes:
    """H.264 (+ AAC) at 25 fps from ``TsMuxer``: an IDR every ``gop_frames`` frames; ``sei`` bytes of
    SEI in front of each IDR slice (so that the first slice lies packets after the PES start)."""
    mux = TsMuxer(MuxConfig(max_clock_jump=1 << 40))
    out = bytearray(mux.tables())
    pts = first_pts
    for frame in range(gops * gop_frames):
        if jump_at is not None and frame == jump_at:
            pts = (pts - 10 * 90_000) % (1 << 33)  # a timestamp jump back by 10 s
        idr = frame % gop_frames == 0
        au = h264_au(300, idr=idr, seed=frame)
        if idr and sei:
            au = au.replace(
                b"\x00\x00\x00\x01\x65", b"\x00\x00\x00\x01\x06" + b"\x05" * sei + b"\x80\x00\x00\x00\x01\x65"
            )
        out += mux.mux_video(au, pts % (1 << 33), keyframe=idr)
        if frame % 2 == 0:
            out += mux.mux_audio(adts(100, frame), pts % (1 << 33))
        pts += 3600
    return bytes(out)


def test_a_pes_start_spanning_packets_is_held_until_decided() -> None:
    data = crafted(4, sei=1500)  # the IDR slice starts ~8 packets after the PES start
    _, segments = segment_all(data, 1.0, batch=188)
    assert [s.duration for s in segments] == [1.0, 1.0, 1.0]
    for seg in segments:
        assert check_segment(seg.data).keyframe


def test_the_33_bit_pts_wrap_is_crossed() -> None:
    data = crafted(5, first_pts=(1 << 33) - int(1.5 * 90_000))
    _, segments = segment_all(data, 1.0)
    assert [s.duration for s in segments] == [1.0] * 4


def test_a_pts_jump_ends_the_segment_and_flags_a_discontinuity() -> None:
    data = crafted(5, jump_at=50)  # at the third IDR
    segmenter, segments = segment_all(data, 1.0)
    assert [s.discontinuity for s in segments] == [False, False, True, False]
    assert segments[1].duration == pytest.approx(1.0)  # last PES time + one frame
    assert segmenter.stats.timestamp_discontinuities == 1


def test_a_gop_longer_than_the_bound_is_dropped_and_counted() -> None:
    # max(3 x 1 s, 10 s) = 10 s; a 12 s GOP never makes a segment.
    data = crafted(3, gop_frames=300)
    segmenter, segments = segment_all(data, 1.0)
    assert segments == []
    assert segmenter.stats.segments_dropped >= 2 and segmenter.stats.packets_dropped > 0
    # a shorter bound, given explicitly
    segmenter, segments = segment_all(crafted(3, gop_frames=100), 1.0, max_segment_secs=3.0)
    assert segments == [] and segmenter.stats.segments_dropped >= 2


def test_the_byte_bound_drops_a_segment() -> None:
    segmenter, segments = segment_all(crafted(4), 1.0, max_segment_bytes=10_000)
    assert segments == [] and segmenter.stats.segments_dropped >= 3


def test_a_gap_drops_the_open_segment_and_flags_the_next() -> None:
    data = crafted(5)
    segmenter = HlsSegmenter(1.0)
    cut = len(data) // 2 // TS * TS
    first = segmenter.feed(data[:cut])
    segmenter.gap()
    second = segmenter.feed(data[cut:])
    assert [s.discontinuity for s in first] == [False, False]
    assert second[0].discontinuity and not any(s.discontinuity for s in second[1:])
    assert [s.sequence for s in first + second] == list(range(len(first) + len(second)))
    assert segmenter.stats.segments_dropped == 1


def test_nothing_before_the_first_pmt_and_keyframe() -> None:
    data = crafted(3)
    # Start in the middle of the first GOP: no segment starts before the next IDR.
    start = len(data) // 6 // TS * TS
    segmenter, segments = segment_all(data[start:], 1.0)
    assert segments and segments[0].duration == 1.0
    assert segmenter.stats.packets_before_start > 0


# ---------------------------------------------------------------------- fuzz


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=0, max_size=3000), max_size=20))
def test_arbitrary_bytes_never_crash(chunks: list[bytes]) -> None:
    segmenter = HlsSegmenter(0.5, max_segment_bytes=64 * 1024)
    for chunk in chunks:
        for seg in segmenter.feed(chunk):
            assert len(seg.data) % TS == 0 and seg.duration > 0
    assert segmenter.buffered_bytes <= 2 * 64 * 1024 + 2 * 1024 * 1024 + TS


_BASE = crafted(3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_BASE) - 1), st.integers(0, 255)), max_size=40), st.integers(1, 4000))
def test_damaged_ts_never_crashes_and_stays_bounded(flips: list[tuple[int, int]], batch: int) -> None:
    data = bytearray(_BASE)
    for pos, value in flips:
        data[pos] = value
    segmenter = HlsSegmenter(0.5, max_segment_bytes=64 * 1024)
    for i in range(0, len(data), batch):
        for seg in segmenter.feed(bytes(data[i : i + batch])):
            assert len(seg.data) % TS == 0 and seg.duration > 0
            assert seg.data[0] == 0x47
        assert segmenter.buffered_bytes <= 2 * 64 * 1024 + 2 * 1024 * 1024 + TS


def test_audio_starts_with_each_keyframe_and_the_segments_join_cleanly(h264_ts: bytes, tmp_path: Path) -> None:
    # FFmpeg packs several AAC frames per PES; the one spanning a cut is split at an ADTS frame.
    _, segments = segment_all(h264_ts, 1.0)
    for seg in segments:
        starts = check_segment(seg.data).starts
        # within one AAC frame: 1024 samples at lavfi sine's 44.1 kHz = 23.2 ms
        assert starts and all(abs(offset) <= 1024 / 44_100 + 1e-4 for offset in starts.values()), starts
    joined = tmp_path / "all.ts"
    joined.write_bytes(b"".join(s.data for s in segments))
    assert decode_errors(joined) == ""
