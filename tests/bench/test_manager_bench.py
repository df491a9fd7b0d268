"""``python -m bench.manager --quick``: the fleet manager benchmark runs end to end on 20 nodes.

A smoke test, so the benchmark cannot rot: it starts the real ``mp-manager``, registers the
simulated nodes over WSS and sends a few commands, then asserts on the table's structure and the
JSON record, never on a rate (20 nodes on a shared machine say nothing about 5,000).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.manager import HEADER

REPO = Path(__file__).resolve().parents[2]
# Measured: ~19 s on this 2-core machine (setup + serve start ~9 s, 20 nodes, 5 commands).
QUICK_TIMEOUT_S = 40


@pytest.mark.e2e
def test_quick_run_prints_the_table_with_a_numeric_p99(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.manager", "--quick", "--json", str(tmp_path / "manager.json")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert HEADER in lines
    columns = HEADER.split("  ")
    header_names = [c.strip() for c in columns if c.strip()]
    row = lines[lines.index(HEADER) + 1].split()
    assert len(row) == len(header_names), (header_names, row)
    values = dict(zip(header_names, row, strict=True))
    assert values["nodes"] == "20"
    assert math.isfinite(float(values["cmd p99 ms"]))
    assert float(values["RSS MiB"]) > 0
    assert values["held"] in ("yes", "NO")
    assert any(line.startswith("verdict: goal 5000 nodes with command p99 < 250 ms: ") for line in lines)
    assert not any("|" in line for line in lines)  # python -m bench prints it under its own table

    record = json.loads((tmp_path / "manager.json").read_text())
    (step,) = record["steps"]
    assert step["nodes"] == 20
    assert step["commands"] >= 1
    assert record["verdict"].startswith("verdict: ")
