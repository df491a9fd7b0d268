"""TsToRtc / RtcToTs against real ffmpeg-made streams, checked with PyAV and ffmpeg decoders."""

from __future__ import annotations

import contextlib
import dataclasses
import fractions
import itertools
import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import av
import av.logging
import pytest

from services.edge.core.mux.codec import H264_NAL_AUD, H264_NAL_PPS, H264_NAL_SPS, h264_nal_type, split_annexb
from services.edge.core.mux.from_flv import TIMESTAMP_BASE
from services.edge.core.mux.ts_demux import TsDemuxer
from services.edge.core.mux.ts_mux import MuxConfig, TsMuxer, chunk_datagrams
from services.edge.core.mux.units import TS_MASK, TS_WRAP
from services.edge.webrtc.media import RtcToTs, RtcUnit, TsToRtc

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")

SECONDS = 3
FPS = 30


def _ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args], check=True, timeout=60, capture_output=True)


def _make_ts(path: Path, video: list[str]) -> Path:
    _ffmpeg(
        "-f", "lavfi", "-i", f"testsrc2=size=640x360:rate={FPS}",
        "-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000",
        "-t", str(SECONDS), *video, "-c:a", "aac", "-f", "mpegts", str(path),
    )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def high_ts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """H.264 High with B-frames (2) and a 1 s GOP, AAC 48 kHz mono."""
    path = tmp_path_factory.mktemp("media") / "high.ts"
    return _make_ts(path, ["-c:v", "libx264", "-profile:v", "high", "-bf", "2", "-g", "30"])


@pytest.fixture(scope="module")
def baseline_ts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """H.264 constrained baseline (no B-frames), as WebRTC senders make it."""
    path = tmp_path_factory.mktemp("media") / "baseline.ts"
    return _make_ts(path, ["-c:v", "libx264", "-profile:v", "baseline", "-g", "30"])


def _run(bridge: TsToRtc, data: bytes) -> list[RtcUnit]:
    out: list[RtcUnit] = []
    for i in range(0, len(data), 1316):
        out += bridge.feed(data[i : i + 1316])
    return out + bridge.flush()


@contextlib.contextmanager
def _no_decoder_errors() -> Iterator[None]:
    """Fails when FFmpeg logs a warning or an error inside (PyAV keeps its logging off by default)."""
    previous = av.logging.get_level()
    av.logging.set_level(av.logging.WARNING)
    try:
        with av.logging.Capture() as logs:
            yield
    finally:
        av.logging.set_level(previous)
    assert [msg for level, _, msg in logs if level <= av.logging.WARNING] == []


def _decode_video(units: list[RtcUnit]) -> int:
    """Frames PyAV's H.264 decoder makes of the units, with no decoder error or warning."""
    decoder = av.CodecContext.create("h264", "r")
    frames = 0
    with _no_decoder_errors():
        for unit in units:
            packet = av.Packet(unit.data)
            packet.pts = unit.pts
            frames += len(decoder.decode(packet))
        frames += len(decoder.decode(None))
    return frames


def _decode_opus(units: list[RtcUnit]) -> int:
    """Samples libopus decodes from the packets (like a browser, no pre-skip), with no error."""
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate = 48_000
    decoder.layout = "stereo"
    samples = 0
    with _no_decoder_errors():
        for unit in units:
            for frame in decoder.decode(av.Packet(unit.data)):
                samples += frame.samples
    return samples


@pytest.mark.parametrize("fixture", ["high_ts", "baseline_ts"])
def test_ts_to_rtc_video_and_opus(fixture: str, request: pytest.FixtureRequest) -> None:
    data = request.getfixturevalue(fixture).read_bytes()
    bridge = TsToRtc()
    out = _run(bridge, data)
    video = [u for u in out if u.kind == "video"]
    audio = [u for u in out if u.kind == "audio"]
    assert bridge.video_codec == "h264" and bridge.has_audio
    assert len(video) == SECONDS * FPS == bridge.stats.video_units
    assert bridge.stats.dropped_units == 0
    keyframes = 0
    for unit in video:
        types = [h264_nal_type(nal) for nal in split_annexb(unit.data)]
        assert H264_NAL_AUD not in types
        if unit.keyframe:
            keyframes += 1
            assert types[:2] == [H264_NAL_SPS, H264_NAL_PPS]
            assert types[-1] == 5
    assert keyframes == SECONDS * FPS // 30
    assert video[0].keyframe
    # Opus: 20 ms packets, ~150 for 3 s, on the video clock (48 kHz).
    assert 145 <= len(audio) <= 160 and bridge.stats.audio_packets == len(audio)
    assert all(u.keyframe for u in audio)
    steps = {b.pts - a.pts for a, b in itertools.pairwise(audio)}
    assert steps == {960}
    assert abs(audio[0].pts * 90_000 / 48_000 - min(u.pts for u in video)) < 9_000  # within 100 ms
    assert _decode_video(video) == SECONDS * FPS
    assert _decode_opus(audio) == 960 * len(audio)


def test_ts_to_rtc_video_only_and_timing(high_ts: Path) -> None:
    data = high_ts.read_bytes()
    bridge = TsToRtc(video_only=True)
    out = _run(bridge, data)
    assert {u.kind for u in out} == {"video"} and len(out) == SECONDS * FPS
    assert bridge.has_audio and bridge.stats.audio_packets == 0


def test_ts_to_rtc_unwraps_the_33_bit_clock(baseline_ts: Path) -> None:
    """The same stream remuxed so that its clock wraps 1.5 s in: pts keep growing."""
    demux = TsDemuxer()
    units = demux.feed(baseline_ts.read_bytes()) + demux.flush()
    first = min(u.dts for u in units)
    shift = TS_WRAP - 135_000 - first
    muxer = TsMuxer(MuxConfig())
    ts = bytearray()
    for unit in sorted(units, key=lambda u: u.dts):
        moved = dataclasses.replace(unit, pts=(unit.pts + shift) & TS_MASK, dts=(unit.dts + shift) & TS_MASK)
        ts += muxer.mux(moved)
    bridge = TsToRtc()
    out = _run(bridge, b"".join(chunk_datagrams(ts)))
    video = [u for u in out if u.kind == "video"]
    audio = [u for u in out if u.kind == "audio"]
    assert len(video) == SECONDS * FPS
    assert [u.pts for u in video] == sorted(u.pts for u in video)  # no B-frames: PTS in decode order
    assert video[0].pts < TS_WRAP < video[-1].pts
    assert bridge.stats.audio_restarts == 1
    assert audio[-1].pts * 90_000 // 48_000 > TS_WRAP
    assert {b.pts - a.pts for a, b in itertools.pairwise(audio)} == {960}


def test_ts_to_rtc_restarts_the_opus_timeline_on_a_jump(baseline_ts: Path) -> None:
    """A 10 s PTS jump half-way (a discontinuity): Opus pts jump with it, from a new encoder."""
    demux = TsDemuxer()
    units = sorted(demux.feed(baseline_ts.read_bytes()) + demux.flush(), key=lambda u: u.dts)
    middle = units[0].dts + 135_000
    muxer = TsMuxer(MuxConfig())
    ts = bytearray()
    for unit in units:
        if unit.dts >= middle:
            unit = dataclasses.replace(unit, pts=unit.pts + 900_000, dts=unit.dts + 900_000)
        ts += muxer.mux(unit)
    bridge = TsToRtc()
    out = _run(bridge, b"".join(chunk_datagrams(ts)))
    audio = [u for u in out if u.kind == "audio"]
    assert bridge.stats.audio_restarts == 2 and bridge.stats.video_units == SECONDS * FPS
    steps = [b.pts - a.pts for a, b in itertools.pairwise(audio)]
    jumps = [d for d in steps if d != 960]
    assert len(jumps) == 1 and abs(jumps[0] - 480_000) < 3 * 960
    assert _decode_opus(audio) == 960 * len(audio)


def test_ts_to_rtc_drops_hevc(tmp_path: Path) -> None:
    probe = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True, timeout=30)
    assert "libx265" in probe.stdout  # Debian's ffmpeg has it; an audio-only TS would do otherwise
    path = _make_ts(tmp_path / "hevc.ts", ["-c:v", "libx265", "-x265-params", "log-level=error", "-g", "30"])
    bridge = TsToRtc()
    out = _run(bridge, path.read_bytes())
    assert bridge.video_codec == "hevc"
    assert bridge.stats.dropped_units == SECONDS * FPS and bridge.stats.video_units == 0
    assert {u.kind for u in out} == {"audio"} and len(out) >= 145


# ---------------------------------------------------------------------------------------------
# RtcToTs


def _opus_frames(seconds: float) -> list[av.AudioFrame]:
    """A 440 Hz sine through libopus and back, as aiortc's OpusDecoder gives it (s16 stereo 48 kHz,
    pts in 1/48000 from 0)."""
    tb = fractions.Fraction(1, 48_000)
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate = 48_000
    encoder.layout = "stereo"
    encoder.format = "s16"
    encoder.bit_rate = 96_000
    encoder.time_base = tb
    decoder = av.CodecContext.create("libopus", "r")
    decoder.format = "s16"
    decoder.layout = "stereo"
    decoder.sample_rate = 48_000
    frames: list[av.AudioFrame] = []
    origin: int | None = None
    for i in range(round(seconds * 50)):
        pcm = bytearray()
        for n in range(960):
            v = int(8000 * math.sin(2 * math.pi * 440 * (i * 960 + n) / 48_000))
            pcm += v.to_bytes(2, "little", signed=True) * 2
        frame = av.AudioFrame(format="s16", layout="stereo", samples=960)
        frame.sample_rate = 48_000
        frame.planes[0].update(bytes(pcm) + bytes(frame.planes[0].buffer_size - len(pcm)))
        frame.pts = i * 960
        frame.time_base = tb
        for packet in encoder.encode(frame):
            origin = packet.pts if origin is None else origin
            packet.pts -= origin  # aiortc's TimestampMapper: 0 at the first packet
            packet.time_base = tb
            frames += decoder.decode(packet)
    return frames


def _video_units(ts: Path) -> list[tuple[bytes, int]]:
    """(Annex B without AUD, as browsers send it; 90 kHz timestamp from 0) per access unit."""
    demux = TsDemuxer()
    units = [u for u in demux.feed(ts.read_bytes()) + demux.flush() if u.kind == "video"]
    first = units[0].pts
    out = []
    for unit in units:
        nals = [n for n in split_annexb(unit.data) if h264_nal_type(n) != H264_NAL_AUD]
        out.append((b"".join(b"\x00\x00\x00\x01" + n for n in nals), unit.pts - first))
    return out


def _probe(path: Path) -> dict[str, object]:
    result = subprocess.run(
        ["ffprobe", "-v", "error", "-show_streams", "-show_format", "-of", "json", str(path)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert result.stderr == ""
    info: dict[str, object] = json.loads(result.stdout)
    return info


def test_rtc_to_ts_decodes_with_ffmpeg(baseline_ts: Path, tmp_path: Path) -> None:
    video = _video_units(baseline_ts)
    audio = _opus_frames(SECONDS)
    events: list[tuple[float, str, object]] = []
    for i, (data, ts) in enumerate(video):
        events.append((0.010 + i / FPS, "v", (data, (ts + 1_000_000) % (1 << 32))))  # arbitrary RTP start
    for j, frame in enumerate(audio):
        events.append((0.025 + j * 0.020, "a", frame))
    events.sort(key=lambda e: e[0])
    bridge = RtcToTs()
    out: list[bytes] = []
    for arrival, kind, item in events:
        if kind == "v":
            data, ts = item  # type: ignore[misc]
            out += bridge.on_video(data, ts, arrival)
        else:
            out += bridge.on_audio(item, arrival)  # type: ignore[arg-type]
    out += bridge.flush()
    assert all(len(d) == 1316 for d in out)
    assert bridge.stats.video_units == SECONDS * FPS and bridge.units.stats.video_units == SECONDS * FPS
    assert bridge.units.stats.late_units == 0 and bridge.units.stats.dropped_before_keyframe == 0
    assert bridge.stats.silence_samples == 0 and bridge.stats.audio_restarts == 1
    path = tmp_path / "out.ts"
    path.write_bytes(b"".join(out))
    demux = TsDemuxer()
    remuxed = demux.feed(path.read_bytes()) + demux.flush()
    first_video = next(u for u in remuxed if u.kind == "video")
    first_audio = next(u for u in remuxed if u.kind == "audio")
    assert first_video.pts == TIMESTAMP_BASE  # video arrived first: the session starts with it
    # audio arrived 15 ms later; the AAC encoder's first packet is its 1024-sample priming
    assert first_audio.pts == TIMESTAMP_BASE + 1_350 - 1_920
    info = _probe(path)
    streams = info["streams"]
    assert isinstance(streams, list)
    assert sorted(s["codec_name"] for s in streams) == ["aac", "h264"]
    durations = {s["codec_name"]: float(s["duration"]) for s in streams}
    assert durations["h264"] == pytest.approx(SECONDS, abs=0.1)
    assert durations["aac"] == pytest.approx(SECONDS, abs=0.15)
    starts = {s["codec_name"]: float(s["start_time"]) for s in streams}
    assert abs(starts["h264"] - starts["aac"]) < 0.1  # arrivals 15 ms apart, AAC priming 21 ms
    decode = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "null", "-"], capture_output=True, text=True, timeout=60
    )
    assert decode.returncode == 0 and decode.stderr == ""


def test_rtc_to_ts_audio_gap_is_filled_and_video_only_session(tmp_path: Path) -> None:
    audio = _opus_frames(1.0)
    bridge = RtcToTs(video=False)
    out: list[bytes] = []
    for j, frame in enumerate(audio):
        if 10 <= j < 15:
            continue  # 100 ms of lost packets
        out += bridge.on_audio(frame, j * 0.020)
    out += bridge.on_video(b"\x00\x00\x00\x01\x65\x88", 0, 1.0)  # no video track: dropped
    out += bridge.flush()
    assert bridge.stats.silence_samples == 5 * 960 and bridge.stats.dropped_video == 1
    path = tmp_path / "audio.ts"
    path.write_bytes(b"".join(out))
    info = _probe(path)
    streams = info["streams"]
    assert isinstance(streams, list) and [s["codec_name"] for s in streams] == ["aac"]
    assert float(streams[0]["duration"]) == pytest.approx(1.0, abs=0.1)


def test_a_second_frame_on_one_timestamp_is_dropped() -> None:
    """RFC 6184 §5.1: a timestamp is one access unit; a reassembled remainder is not muxed twice."""
    from services.edge.webrtc.media import RtcToTs

    idr = (
        b"\x00\x00\x00\x01\x67\x42\xc0\x1f\x8c\x8d\x40"
        + b"\x00\x00\x00\x01\x68\xce\x3c\x80"
        + b"\x00\x00\x00\x01\x65\x88\x84"
    )
    mux = RtcToTs(video=True, audio=False)
    mux.on_video(idr, 0, 1.0)
    mux.on_video(idr, 0, 1.01)
    assert mux.stats.dropped_video == 1 and mux.stats.video_units == 1
