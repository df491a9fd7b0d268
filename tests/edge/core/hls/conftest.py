"""Real MPEG-TS from ffmpeg for the HLS core tests (made once per session)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FFMPEG = shutil.which("ffmpeg") or "/usr/bin/ffmpeg"


def need_ffmpeg() -> None:
    if shutil.which("ffmpeg") is None:
        if os.environ.get("CI"):
            pytest.fail("ffmpeg is missing in CI (tools/ensure-debs.sh installs it)")
        pytest.skip("ffmpeg not installed")


def _make(path: Path, args: list[str]) -> bytes:
    need_ffmpeg()
    cmd = [FFMPEG, "-nostdin", "-v", "error", "-y", *args, "-f", "mpegts", str(path)]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    return path.read_bytes()


@pytest.fixture(scope="session")
def h264_ts(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """6 s of 320x240 25 fps H.264 (a keyframe every 25 frames, B frames) + AAC."""
    path = tmp_path_factory.mktemp("hls") / "h264.ts"
    lavfi = ["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25", "-f", "lavfi", "-i", "sine"]
    return _make(path, [*lavfi, "-c:v", "libx264", "-g", "25", "-c:a", "aac", "-t", "6"])


@pytest.fixture(scope="session")
def hevc_ts(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """4 s of HEVC (a keyframe every 25 frames) + AAC."""
    path = tmp_path_factory.mktemp("hls") / "hevc.ts"
    lavfi = ["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25", "-f", "lavfi", "-i", "sine"]
    x265 = ["-c:v", "libx265", "-x265-params", "log-level=error:keyint=25:min-keyint=25:scenecut=0"]
    return _make(path, [*lavfi, *x265, "-c:a", "aac", "-t", "4"])


@pytest.fixture(scope="session")
def audio_ts(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """5 s of AAC alone."""
    path = tmp_path_factory.mktemp("hls") / "audio.ts"
    return _make(path, ["-f", "lavfi", "-i", "sine", "-c:a", "aac", "-t", "5"])
