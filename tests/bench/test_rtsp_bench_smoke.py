"""``python -m bench.rtsp --quick``: the three RTSP ingest measurements run end to end (a real
mp-edge pulling a gst-rtsp-server camera over TCP and over UDP, and ffmpeg pulling the same
camera), so the benchmark cannot rot. Its figures mean nothing at 3 s; only that every path
delivered and the table has its rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.rtsp_server import need_gst_rtsp

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_the_rtsp_bench_runs_every_path(tmp_path: Path) -> None:
    need_gst_rtsp(video="h264", audio="aac-hbr")
    done = subprocess.run(
        [sys.executable, "-m", "bench.rtsp", "--quick", "--keep", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("RTSP ingest, camera 1280x720 25 fps H.264"), lines
    rows = [line for line in lines if "ms/s" in line]
    assert len(rows) == 3, lines
    assert rows[0].lstrip().startswith("mediaplane (rtsp tcp in")
    assert rows[1].lstrip().startswith("mediaplane (rtsp udp in")
    assert rows[2].lstrip().startswith("ffmpeg -rtsp_transport tcp")
    assert all(float(row.split("Mbit/s")[1].split()[0]) > 0.05 for row in rows), rows  # MB at each sink
    assert all(row.split()[-1].isdigit() for row in rows[:2]), rows  # the edge's RTP loss is reported
    assert rows[2].split()[-1] == "-"
    assert lines[-1].startswith("  ratio mediaplane / ffmpeg: tcp "), lines
