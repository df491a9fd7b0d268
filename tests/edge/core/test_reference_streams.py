"""Reference streams made by ffmpeg: the analysis must agree with ffprobe, and with the known
damage that tools/tsdamage.py applies (and with tshark where it counts the same error)."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from services.edge.core import analysis as analysis_mod
from services.edge.core.analysis import FlowAnalysis
from tests.helpers.tools import need_tool
from tools import tsdamage

pytestmark = pytest.mark.interop


# name -> (ffmpeg arguments, mux rate in bit/s). Short and small where the case allows.
STREAMS: dict[str, tuple[list[str], int]] = {
    "h264_aac_720p25": (
        ["-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=25", "-f", "lavfi", "-i", "sine=sample_rate=48000",
         "-t", "2", "-c:v", "libx264", "-preset", "ultrafast", "-b:v", "2M", "-g", "25",
         "-c:a", "aac", "-ac", "2", "-b:a", "128k", "-metadata:s:a:0", "language=eng"],
        4_000_000,
    ),
    "hevc_mp2_1080p2997": (
        ["-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30000/1001", "-f", "lavfi", "-i", "sine=sample_rate=44100",
         "-t", "1", "-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=error", "-b:v", "3M",
         "-c:a", "mp2", "-ac", "2", "-b:a", "192k"],
        6_000_000,
    ),
    "mpeg2_ac3_1080i25": (
        ["-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=25", "-f", "lavfi", "-i", "sine=sample_rate=48000",
         "-t", "1", "-c:v", "mpeg2video", "-b:v", "5M", "-flags", "+ildct+ilme", "-top", "1",
         "-c:a", "ac3", "-ac", "6", "-b:a", "384k", "-metadata:s:a:0", "language=fra"],
        8_000_000,
    ),
    "h264_eac3_1080i2997": (
        ["-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=30000/1001", "-f", "lavfi", "-i", "sine=sample_rate=48000",
         "-t", "1", "-c:v", "libx264", "-preset", "ultrafast", "-flags", "+ildct+ilme", "-x264opts", "interlaced=1",
         "-b:v", "4M", "-c:a", "eac3", "-ac", "6", "-b:a", "256k"],
        6_000_000,
    ),
    "h264_latm_720p2997": (
        ["-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=30000/1001", "-f", "lavfi", "-i", "sine=sample_rate=44100",
         "-t", "1", "-c:v", "libx264", "-preset", "ultrafast", "-b:v", "1M",
         "-c:a", "aac", "-ac", "1", "-b:a", "64k", "-mpegts_flags", "latm", "-metadata:s:a:0", "language=deu"],
        2_000_000,
    ),
}  # fmt: skip


@pytest.fixture(scope="session")
def reference_streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    ffmpeg = need_tool("ffmpeg")
    out_dir = tmp_path_factory.mktemp("ts")
    paths = {}
    for name, (args, rate) in STREAMS.items():
        path = out_dir / f"{name}.ts"
        cmd = [
            ffmpeg,
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            *args,
            "-f",
            "mpegts",
            "-muxrate",
            str(rate),
            str(path),
        ]
        subprocess.run(cmd, check=True, timeout=120)
        paths[name] = path
    return paths


def _ffprobe(path: Path) -> dict[str, object]:
    ffprobe = need_tool("ffprobe")
    out = subprocess.run(
        [ffprobe, "-v", "error", "-show_programs", "-show_streams", "-of", "json", str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def analyse(pkts: list[bytes], rate: int, *, numpy_path: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Feed packets as 7-packet datagrams at the mux rate, per datagram or in batches of 64."""
    fa = FlowAnalysis(media_analysis=True)
    grams = list(tsdamage.iter_datagrams(pkts, rate))
    if numpy_path:
        monkeypatch.setattr(analysis_mod, "NUMPY_MIN_PACKETS", 1)
        for i in range(0, len(grams), 64):
            batch = grams[i : i + 64]
            fa.on_batch([memoryview(d) for d, _ in batch], [t for _, t in batch], [None] * len(batch))
    else:
        for d, t in grams:
            fa.on_datagram(memoryview(d), t, None)
    assert fa.internal_errors == 0, fa.last_internal_error
    return fa.snapshot(grams[-1][1])


def _level(codec: str, ffprobe_level: int) -> str:
    """ffprobe prints levels as numbers; we print the names the standards use."""
    if codec == "h264":
        major, minor = divmod(ffprobe_level, 10)
    elif codec == "hevc":
        major, minor = divmod(ffprobe_level // 3, 10)
    else:  # MPEG-2: level_indication 4 High, 6 High 1440, 8 Main, 10 Low
        return {4: "High", 6: "High 1440", 8: "Main", 10: "Low"}[ffprobe_level]
    return f"{major}" if minor == 0 else f"{major}.{minor}"


@pytest.mark.parametrize("numpy_path", [False, True], ids=["python", "numpy"])
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_media_analysis_matches_ffprobe(
    name: str, numpy_path: bool, reference_streams: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = reference_streams[name]
    rate = STREAMS[name][1]
    snap = analyse(tsdamage.split(path.read_bytes()), rate, numpy_path=numpy_path, monkeypatch=monkeypatch)
    probe = _ffprobe(path)
    media = snap["media"]
    assert isinstance(media, dict)
    programs = probe["programs"]
    assert isinstance(programs, list)
    assert media["program_count"] == len(programs)
    streams = probe["streams"]
    assert isinstance(streams, list) and len(streams) == 2
    ours = {s["pid"]: s for s in media["video_streams"] + media["audio_streams"]}  # type: ignore[operator]
    for ref in streams:
        pid = int(ref["id"], 16)
        got = ours[pid]
        assert got["codec"] == ref["codec_name"], name
        if ref["codec_type"] == "video":
            assert got["resolution"] == f"{ref['width']}x{ref['height']}"
            assert got["frame_rate"] == pytest.approx(float(Fraction(ref["r_frame_rate"])), abs=0.001)
            assert got["profile"] == ref["profile"]
            assert got["level"] == _level(got["codec"], ref["level"])
        else:
            assert got["sample_rate_hz"] == int(ref["sample_rate"])
            assert got["channels"] == ref["channels"]
            assert got["language"] == ref.get("tags", {}).get("language")
    assert len(ours) == len(streams)
    # Bitrates over the last second of a constant-rate mux: the total is the mux rate.
    assert media["total_bitrate_bps"] == pytest.approx(rate, rel=0.02)
    assert sum(s["bitrate_bps"] for s in ours.values()) < media["total_bitrate_bps"]
    tr = snap["tr101290"]
    assert isinstance(tr, dict)
    assert {k: v for k, v in tr.items() if k.endswith("_errors") and v} == {}
    assert tr["pat_count"] > 0 and tr["pmt_count"] > 0


ERROR_FIELDS = [
    "sync_loss_count",
    "sync_byte_errors",
    "cc_errors",
    "pat_errors",
    "pmt_errors",
    "tei_errors",
    "pcr_discontinuity_errors",
    "pcr_accuracy_errors",
    "pid_errors",
    "crc_errors",
    "pcr_repetition_errors",
    "pts_errors",
    "cat_errors",
    "section_errors",
]
VIDEO_PID, PMT_PID = 0x100, 0x1000  # ffmpeg's defaults
RATE = STREAMS["h264_aac_720p25"][1]
DAMAGE = {
    "drop": lambda p: tsdamage.drop(p, VIDEO_PID, 5),
    "drop_audio": lambda p: tsdamage.drop(p, 0x101, 3),
    "duplicate": lambda p: tsdamage.duplicate(p, VIDEO_PID, 5, copies=1),
    "triplicate": lambda p: tsdamage.duplicate(p, VIDEO_PID, 4, copies=2),
    "reorder": lambda p: tsdamage.reorder(p, VIDEO_PID, 3),
    "sync_isolated": lambda p: tsdamage.corrupt_sync(p, 4),
    "sync_loss": lambda p: tsdamage.corrupt_sync(p, 3, burst=2),
    "tei": lambda p: tsdamage.set_tei(p, VIDEO_PID, 6),
    "withhold_pat": lambda p: tsdamage.withhold(p, 0, 0.5, 1.0, RATE),
    "withhold_pmt": lambda p: tsdamage.withhold(p, PMT_PID, 0.3, 0.8, RATE),
    "pcr_jump": lambda p: tsdamage.pcr_jump(p, VIDEO_PID, 2),
    "pcr_jump_flagged": lambda p: tsdamage.pcr_jump(p, VIDEO_PID, 2, flagged=True),
    "bad_crc_pmt": lambda p: tsdamage.bad_crc(p, PMT_PID, 3),
    "bad_crc_pat": lambda p: tsdamage.bad_crc(p, 0, 2),
}


@pytest.mark.parametrize("numpy_path", [False, True], ids=["python", "numpy"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_known_damage_gives_known_counts(
    damage: str, numpy_path: bool, reference_streams: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = tsdamage.split(reference_streams["h264_aac_720p25"].read_bytes())
    damaged, expected = DAMAGE[damage](clean)
    if damage not in ("duplicate", "pcr_jump_flagged"):
        assert sum(expected.counts.values()) > 0  # the damage must be there to be counted
    tr = analyse(damaged, RATE, numpy_path=numpy_path, monkeypatch=monkeypatch)["tr101290"]
    assert isinstance(tr, dict)
    assert {f: tr[f] for f in ERROR_FIELDS} == {f: expected.counts.get(f, 0) for f in ERROR_FIELDS}
    assert tr["ts_packets_analyzed"] == len(damaged)


def _tshark_cc_drops(path: Path) -> int:
    tshark = need_tool("tshark")
    out = subprocess.run(
        [tshark, "-r", str(path), "-Y", "mp2t.cc.drop", "-T", "fields", "-e", "mp2t.pid"],
        check=True,
        capture_output=True,
        timeout=120,
        text=True,
    ).stdout
    return len([line for line in out.splitlines() if line.strip()])


@pytest.mark.parametrize("damage", ["drop", "reorder"])
def test_continuity_errors_agree_with_tshark(
    damage: str, reference_streams: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = tsdamage.split(reference_streams["h264_aac_720p25"].read_bytes())
    damaged, _ = DAMAGE[damage](clean)
    path = tmp_path / "damaged.ts"
    path.write_bytes(b"".join(damaged))
    tr = analyse(damaged, RATE, numpy_path=True, monkeypatch=monkeypatch)["tr101290"]
    assert isinstance(tr, dict)
    assert tr["cc_errors"] > 0
    assert tr["cc_errors"] == _tshark_cc_drops(path)


def test_tsdamage_command_line(reference_streams: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.ts"
    src = reference_streams["h264_aac_720p25"]
    result = subprocess.run(
        [sys.executable, "-m", "tools.tsdamage", str(src), str(out), "drop", "--pid", "0x100", "--count", "2"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert json.loads(result.stdout) == {"cc_errors": 2}
    assert out.stat().st_size == src.stat().st_size
