"""``python -m bench --quick --only 1 2 3 4 5 6 7``: every scenario runs for about a second and the table
has every row (the protocol benchmarks that ``python -m bench`` runs after them have smoke tests of
their own: test_manager_bench, test_relay/rtmp/rtsp/srt/webrtc_bench_smoke).

A smoke test, so the bench code cannot rot: it asserts on the table's shape and that no scenario
failed, never on a rate (the figures of a one-second run on a shared machine mean nothing).
The table-rendering and profile-folding helpers are checked on canned input.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import render
from bench.scenarios import SCENARIOS
from bench.scenarios.common import Row
from bench.scenarios.profile import summarise

REPO = Path(__file__).resolve().parents[2]
# Scenario 3: one row per flow count (--quick: 3 and 6) and its summary; 7: one row per worker count.
SCALING_ROWS = ("7a", "7b") if len(os.sched_getaffinity(0)) >= 2 else ("7a",)
ROWS = ("1", "2a", "2b", "3a", "3b", "3", "4", "5", "6", *SCALING_ROWS)
# Measured: 25 s on this 2-core machine when quiet, 50-90 s at a load average of 6-10; scenario 7
# and the second scenario-3 count (issue 23) add ~12 s quiet, ~20 s at load 3 (46-53 s in all).
QUICK_TIMEOUT_S = 420
SCENARIO_ARGS = [str(n) for n in sorted(SCENARIOS)]


def _outputs(tmp_path: Path) -> list[str]:
    return ["--json", str(tmp_path / "bench.json"), "--keep", str(tmp_path)]


@pytest.mark.e2e
def test_quick_run_prints_every_row_and_no_scenario_fails(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", *SCENARIO_ARGS, *_outputs(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["run"]["rows"]
    assert [row["number"] for row in rows] == list(ROWS)
    for row in rows:
        assert row["ours"] not in ("", "failed"), row
        assert row["verdict"] in ("yes", "NO", "-"), row
    table_numbers = [line.split("|")[0].strip() for line in result.stdout.splitlines() if "|" in line]
    assert [n for n in table_numbers if n] == ["#", *ROWS]
    by_number = {row["number"]: row["ours"] for row in rows}
    for number in ("3a", "3b"):  # each flow count: loss and CPU per packet, in numbers
        assert re.search(r"\d+ of [\d,]+ lost", by_number[number]), by_number[number]
        assert re.search(r"[\d.]+ us/pkt", by_number[number]), by_number[number]
    assert re.search(r"largest count held at zero loss: \d+|no count held", by_number["3"]), by_number["3"]
    for number in SCALING_ROWS:  # each worker count: an aggregate rate (or that no step was clean)
        assert re.search(r"W=\d+: ([\d,]+ Mbit/s = [\d.,]+k pkt/s|no step clean)", by_number[number]), by_number[number]


def test_every_scenario_is_registered() -> None:
    assert sorted(SCENARIOS) == [1, 2, 3, 4, 5, 6, 7]


def test_render_wraps_long_cells_inside_their_column() -> None:
    rows = [Row("1", "a scenario", "x " * 60, "peer: 1; other: 2", "0.5x", "goal", False)]
    lines = render(rows).splitlines()
    widths = {len(line) for line in lines if "|" in line}
    assert len(widths) == 1  # every table line has the same width: nothing spilled over
    assert any("NO" in line for line in lines)
    assert sum("other: 2" in line for line in lines) == 1  # "; " starts a new line in the cell


def test_summarise_folds_py_spy_raw_stacks(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (w.py:1);run (trio/_core/_run.py:2424);get_events (trio/_core/_io_epoll.py:238) 6\n"
        "main (w.py:1);_pump (services/edge/engine/flow.py:208);parse_rtp (services/edge/core/rtp.py:32) 3\n"
        "main (w.py:1);_pump (services/edge/engine/flow.py:208) 1\n"
    )
    profile = summarise(raw)
    assert profile.samples == 10
    assert profile.idle_samples == 6
    assert profile.own[0] == ("get_events (trio/_core/_io_epoll.py:238)", 6)
    assert dict(profile.own)["parse_rtp (services/edge/core/rtp.py:32)"] == 3
    assert dict(profile.total)["_pump (services/edge/engine/flow.py:208)"] == 4
    assert dict(profile.total)["main (w.py:1)"] == 10
