"""``python -m bench.rtmp --quick``: both RTMP ingest measurements run end to end (a real mp-edge
with an rtmp input, and ffmpeg's remux beside it), so the benchmark cannot rot. Its figures mean
nothing at 3 s; only that both paths delivered and the table has its rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tools import need_tool

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_the_rtmp_bench_runs_both_paths(tmp_path: Path) -> None:
    need_tool("ffmpeg")
    done = subprocess.run(
        [sys.executable, "-m", "bench.rtmp", "--quick", "--keep", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("RTMP ingest, 8000 kbit/s")
    rows = [line for line in lines if "ms/s" in line]
    assert len(rows) == 2 and rows[0].lstrip().startswith("mediaplane") and "ffmpeg" in rows[1]
    assert all(float(row.split("received")[1].split()[0]) > 0.5 for row in rows)  # MB at each sink
    assert "ratio mediaplane / ffmpeg" in lines[-1]
