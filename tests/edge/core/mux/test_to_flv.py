"""TsToFlv: MPEG-TS -> FLV tags for the rtmp output. Canned TS from TsMuxer, real TS from ffmpeg
(whose FLV rewrite must decode cleanly), hypothesis for feed splits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.edge.core.mux import MuxConfig, TsMuxer
from services.edge.core.mux.codec import parse_asc, parse_avcc, parse_hvcc
from services.edge.core.mux.to_flv import FlvTag, TsToFlv
from services.edge.core.mux.units import TS_WRAP
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
    parse_video_tag,
)
from tests.edge.core.mux.helpers import PPS, SPS, adts, h264_au

FRAME = 3600  # 25 fps in 90 kHz ticks
AAC_FRAME = 1920  # 1024 samples at 48 kHz


def canned(frames: int, *, start: int = 900_000, gop: int = 10, first_key: int = 0, audio: bool = True) -> bytes:
    """H.264 (+ AAC) through TsMuxer: ``frames`` pictures, IDR every ``gop`` from ``first_key``,
    B-frame style PTS = DTS + 2 frames; AAC frames interleaved by DTS."""
    mux = TsMuxer(MuxConfig(audio_codec="aac" if audio else None))
    out = bytearray()
    audio_next = start
    for i in range(frames):
        dts = start + i * FRAME
        while audio and audio_next <= dts:
            out += mux.mux_audio(adts(200, seed=audio_next), audio_next)
            audio_next += AAC_FRAME
        idr = i >= first_key and (i - first_key) % gop == 0
        out += mux.mux_video(h264_au(500, idr=idr, seed=i), dts + 2 * FRAME, dts, keyframe=idr)
    return bytes(out)


def convert(ts: bytes, step: int = 1316) -> tuple[TsToFlv, list[FlvTag]]:
    conv = TsToFlv()
    tags: list[FlvTag] = []
    for i in range(0, len(ts), step):
        tags += conv.feed(ts[i : i + step])
    tags += conv.flush()
    return conv, tags


def videos(tags: list[FlvTag]) -> list[tuple[int, VideoTag]]:
    return [(t.timestamp, t.tag) for t in tags if isinstance(t.tag, VideoTag)]


def audios(tags: list[FlvTag]) -> list[tuple[int, AudioTag]]:
    return [(t.timestamp, t.tag) for t in tags if isinstance(t.tag, AudioTag)]


def flv_file(tags: list[FlvTag]) -> bytes:
    """An FLV file (header, tags, PreviousTagSize) as FFmpeg's RTMP listener would record them."""
    out = bytearray(b"FLV\x01\x05\x00\x00\x00\x09\x00\x00\x00\x00")
    for t in tags:
        body = build_video_tag(t.tag) if isinstance(t.tag, VideoTag) else build_audio_tag(t.tag)
        ts = t.timestamp
        header = bytes([9 if isinstance(t.tag, VideoTag) else 8]) + len(body).to_bytes(3, "big")
        header += (ts & 0xFFFFFF).to_bytes(3, "big") + bytes([(ts >> 24) & 0xFF]) + b"\x00\x00\x00"
        out += header + body + (len(header) + len(body)).to_bytes(4, "big")
    return bytes(out)


def test_h264_aac_sequence_headers_then_frames() -> None:
    conv, tags = convert(canned(50))
    video, audio = videos(tags), audios(tags)
    ts0, head = video[0]
    assert ts0 == 0 and head.packet is PacketKind.SEQUENCE_HEADER and head.codec is VideoCodec.AVC
    record = parse_avcc(head.payload)
    assert record is not None and record.sps == (SPS,) and record.pps == (PPS,)
    frames = [(ts, tag) for ts, tag in video if tag.packet is PacketKind.FRAME]
    assert len(frames) == 50 and frames[0][1].frame_type is FrameType.KEY
    assert [tag.is_keyframe for _, tag in frames] == [i % 10 == 0 for i in range(50)]
    assert [ts for ts, _ in frames] == [i * 40 for i in range(50)]
    assert {tag.composition_time for _, tag in frames} == {80}
    # Length-prefixed NAL units, access unit delimiters gone, SPS/PPS kept in band on IDRs.
    first = frames[0][1].payload
    assert first[:4] == len(SPS).to_bytes(4, "big") and first[4 : 4 + len(SPS)] == SPS
    assert b"\x09\xf0" not in frames[1][1].payload[:6]
    assert audio[0][1].packet is PacketKind.SEQUENCE_HEADER and audio[0][1].codec is AudioCodec.AAC
    asc = parse_asc(audio[0][1].payload)
    assert asc is not None and (asc.object_type, asc.sample_rate, asc.channel_config) == (2, 48000, 2)
    raw = [(ts, tag) for ts, tag in audio if tag.packet is PacketKind.FRAME]
    assert raw[0][1].payload == adts(200, seed=900_000)[7:]  # the ADTS header stripped
    assert [ts for ts, _ in raw] == [i * AAC_FRAME // 90 for i in range(len(raw))]
    assert conv.stats.video_sequence_headers == conv.stats.audio_sequence_headers == 1
    # Interleaved: the whole output is in timestamp order.
    stamps = [t.timestamp for t in tags]
    assert stamps == sorted(stamps) and conv.stats.out_of_order == 0


def test_waits_for_the_first_keyframe() -> None:
    conv, tags = convert(canned(30, first_key=7, gop=100))
    video = videos(tags)
    assert video[0][1].packet is PacketKind.SEQUENCE_HEADER and video[1][1].is_keyframe
    assert len(video) == 1 + 23 and conv.stats.dropped_before_keyframe >= 7
    # Audio before the keyframe is not sent either; timestamps start at the keyframe.
    assert 0 <= audios(tags)[0][0] < AAC_FRAME / 90 and tags[0].timestamp == 0


def test_nothing_without_a_keyframe() -> None:
    _, tags = convert(canned(20, first_key=100))
    assert tags == []


def test_sequence_header_resent_when_the_sps_changes() -> None:
    mux = TsMuxer(MuxConfig(audio_codec=None))
    other_sps = SPS[:-1] + bytes([SPS[-1] ^ 0x10])
    ts = bytearray()
    for i in range(20):
        au = h264_au(300, idr=i % 5 == 0, seed=i)
        if i >= 10 and i % 5 == 0:
            au = au.replace(SPS, other_sps)
        ts += mux.mux_video(au, 10_000 + i * FRAME, keyframe=i % 5 == 0)
    _, tags = convert(bytes(ts))
    headers = [(ts_, tag) for ts_, tag in videos(tags) if tag.packet is PacketKind.SEQUENCE_HEADER]
    assert [ts_ for ts_, _ in headers] == [0, 400]
    records = [parse_avcc(tag.payload) for _, tag in headers]
    assert [r.sps for r in records if r is not None] == [(SPS,), (other_sps,)]


def test_timestamps_follow_the_33_bit_wrap() -> None:
    start = TS_WRAP - 25 * FRAME  # wraps one second in
    conv, tags = convert(canned(75, start=start))
    frames = [(ts, tag) for ts, tag in videos(tags) if tag.packet is PacketKind.FRAME]
    assert [ts for ts, _ in frames] == [i * 40 for i in range(75)]
    raw = [ts for ts, tag in audios(tags) if tag.packet is PacketKind.FRAME]
    assert raw == sorted(raw) and raw[-1] >= 2900 and conv.stats.discontinuities == 0


def test_a_jump_continues_the_timeline() -> None:
    ts = canned(20, audio=False) + canned(20, start=50 * 90_000, audio=False)[376:]  # a restart, tables kept
    conv, tags = convert(ts)
    stamps = [t.timestamp for t in tags if isinstance(t.tag, VideoTag) and t.tag.packet is PacketKind.FRAME]
    assert conv.stats.discontinuities >= 1
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] < 2000  # not 49 s


def test_audio_only() -> None:
    mux = TsMuxer(MuxConfig(video_codec=None))
    ts = b"".join(bytes(mux.mux_audio(adts(100, seed=i), 5000 + i * AAC_FRAME)) for i in range(50))
    _, tags = convert(ts)
    audio = audios(tags)
    assert audio[0][1].packet is PacketKind.SEQUENCE_HEADER and len(audio) == 51
    assert [ts_ for ts_, _ in audio[1:]] == [i * AAC_FRAME // 90 for i in range(50)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=40))
def test_any_feed_split_gives_the_same_tags(sizes: list[int]) -> None:
    ts = canned(30)
    _, whole = convert(ts, step=len(ts))
    conv = TsToFlv()
    tags: list[FlvTag] = []
    pos = 0
    k = 0
    while pos < len(ts):
        n = sizes[k % len(sizes)]
        tags += conv.feed(ts[pos : pos + n])
        pos += n
        k += 1
    tags += conv.flush()
    assert tags == whole


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4000), st.integers(min_value=0, max_value=20_000))
def test_garbage_and_cuts_never_raise(noise: bytes, cut: int) -> None:
    ts = canned(12)
    conv = TsToFlv()
    tags = conv.feed(ts[:cut]) + conv.feed(noise) + conv.feed(ts[cut:]) + conv.flush()
    for kind in ("video", "audio"):
        stamps = [t.timestamp for t in tags if (kind == "video") == isinstance(t.tag, VideoTag)]
        assert stamps == sorted(stamps) and all(s >= 0 for s in stamps)


# ------------------------------------------------------------------ real TS from ffmpeg

FFMPEG = shutil.which("ffmpeg")
needs_ffmpeg = pytest.mark.skipif(FFMPEG is None, reason="ffmpeg not installed")


def ffmpeg_ts(path: Path, video: list[str], seconds: int = 3) -> bytes:
    assert FFMPEG is not None
    cmd = [FFMPEG, "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25"]
    cmd += ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", *video, "-g", "25", "-bf", "2"]
    cmd += ["-c:a", "aac", "-t", str(seconds), "-f", "mpegts", str(path)]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    return path.read_bytes()


def decode_errors(path: Path) -> str:
    assert FFMPEG is not None
    done = subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-i", str(path), "-f", "null", "-"], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.decode()


def duration(path: Path) -> float:
    probe = shutil.which("ffprobe")
    assert probe is not None
    done = subprocess.run(
        [probe, "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return float(done.stdout)


@needs_ffmpeg
def test_ffmpeg_h264_aac_ts_becomes_a_clean_flv(tmp_path: Path) -> None:
    ts = ffmpeg_ts(tmp_path / "in.ts", ["-c:v", "libx264"])
    conv, tags = convert(ts)
    frames = [(ts_, tag) for ts_, tag in videos(tags) if tag.packet is PacketKind.FRAME]
    assert len(frames) == 75 and frames[0][1].is_keyframe
    assert any(tag.composition_time > 0 for _, tag in frames)  # x264 B-frames
    assert conv.stats.out_of_order == 0
    out = tmp_path / "out.flv"
    out.write_bytes(flv_file(tags))
    parsed = [parse_video_tag(t.body) for t in iter_flv_file(out.read_bytes()) if t.tag_type == 9]
    assert parsed[0].packet is PacketKind.SEQUENCE_HEADER
    assert decode_errors(out) == ""
    assert abs(duration(out) - 3.0) < 0.2


@needs_ffmpeg
def test_ffmpeg_hevc_ts_becomes_enhanced_rtmp_tags(tmp_path: Path) -> None:
    ts = ffmpeg_ts(tmp_path / "in.ts", ["-c:v", "libx265", "-x265-params", "log-level=error"], seconds=2)
    _, tags = convert(ts)
    video = videos(tags)
    head = video[0][1]
    assert head.codec is VideoCodec.HEVC and head.packet is PacketKind.SEQUENCE_HEADER and head.enhanced
    record = parse_hvcc(head.payload)
    assert record is not None and record.parameter_sets.complete and record.parameter_sets.vps
    frames = [tag for _, tag in video if tag.packet is PacketKind.FRAME]
    assert len(frames) == 50 and frames[0].is_keyframe and all(f.enhanced for f in frames)
    body = build_video_tag(frames[1])
    assert body[0] & 0x80 and body[1:5] == b"hvc1"  # ExVideoTagHeader, FourCC
    assert parse_video_tag(body) == frames[1] or parse_video_tag(body).payload == frames[1].payload


def test_after_a_gap_video_resumes_at_the_next_keyframe() -> None:
    ts = canned(40, gop=10)
    cut = len(ts) // 3 // 188 * 188
    conv = TsToFlv()
    tags = conv.feed(ts[:cut])
    conv.gap()
    tags += conv.feed(ts[cut + 188 * 20 :]) + conv.flush()  # 20 packets lost, then the rest
    frames = [(ts_, tag) for ts_, tag in videos(tags) if tag.packet is PacketKind.FRAME]
    assert frames[0][1].is_keyframe
    # The first frame after the gap is a keyframe, and nothing between was sent.
    stamps = [ts_ for ts_, _ in frames]
    jump = next(i for i in range(1, len(stamps)) if stamps[i] - stamps[i - 1] > 40)
    assert frames[jump][1].is_keyframe and conv.stats.dropped_after_gap > 0
    assert stamps == sorted(stamps)
    audio = [ts_ for ts_, tag in audios(tags) if tag.packet is PacketKind.FRAME]
    assert audio == sorted(audio) and audio[-1] > 1400  # audio and the timeline went on


def test_a_gap_before_the_start_changes_nothing() -> None:
    ts = canned(20)
    conv = TsToFlv()
    conv.gap()
    assert conv.feed(ts) + conv.flush() == convert(ts)[1]
