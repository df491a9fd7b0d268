"""``python -m bench.webrtc --quick``: the WebRTC egress benchmark runs end to end (a real mp-edge
serving an 8 Mbit/s flow over WHEP to aiortc viewers in separate processes, ffmpeg remuxing the
same stream as the peer), so it cannot rot. Its figures mean little at 2 s windows; only that
every step connected its viewers and the table has its rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_the_webrtc_bench_runs_every_part(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.webrtc", "--quick", "--keep", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "WebRTC (WHEP) egress" in out and "part 1" in out and "part 2" in out, out
    steps = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "%" in line]
    assert [(s[0], s[1]) for s in steps[:3]] == [("0", "0"), ("1", "1"), ("2", "2")], out  # viewers connected
    assert "per viewer" in out and "largest viewer count at zero loss:" in out
    assert "peer: ffmpeg" in out
