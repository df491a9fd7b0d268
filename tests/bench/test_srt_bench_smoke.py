"""``python -m bench.srt --quick``: one short step per path, and the table has both rows.

A smoke test, so the SRT bench cannot rot: it checks the table's shape, never a rate (a half-second
step on a shared machine means nothing). Needs srt-live-transmit, like the SRT e2e tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.srt import PATHS, Step, render

REPO = Path(__file__).resolve().parents[2]
# About 15 s on a quiet 2-core machine (an mp-edge start, four half-second steps); far more under load.
QUICK_TIMEOUT_S = 180


@pytest.mark.e2e
@pytest.mark.interop
def test_quick_run_prints_both_rows() -> None:
    if shutil.which("srt-live-transmit") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("srt-live-transmit (srt-tools) is missing in CI")
        pytest.skip("srt-live-transmit (srt-tools) is not installed")
    result = subprocess.run(
        [sys.executable, "-m", "bench.srt", "--quick"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert cells[0][0] == "path" and "ratio" in cells[0], result.stdout
    rows = cells[2:]  # after the header and its rule
    assert [row[0] for row in rows] == list(PATHS), result.stdout
    assert all(len(row) == len(cells[0]) for row in rows), result.stdout
    assert "FAILED" not in result.stdout, result.stdout  # every path came up (a lossy step is fine)


def test_render_has_a_row_per_path_and_a_ratio_only_when_both_sides_are_clean() -> None:
    step = Step(
        target_pps=1000,
        sent=1000,
        achieved_pps=1000.0,
        received=1000,
        lost=0,
        cc_errors=0,
        rcvbuf_errors=0,
        drain_s=0.1,
        cpu_s=0.05,
    )
    text = render([(PATHS[0], step, step), (PATHS[1], step, None)])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # aligned
    assert "1.00x" in lines[2] and "none clean" in lines[3] and lines[3].rstrip(" |").endswith("-")
    assert "10.5" in lines[2]  # 1,000 pkt/s x 1316 bytes = 10.5 Mbit/s
