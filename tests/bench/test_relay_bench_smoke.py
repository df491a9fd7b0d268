"""``python -m bench.relay --quick``: both relay measurements run end to end and the table has their rows.

A smoke test, so the relay bench cannot rot: it starts the real ``mp-relay``, two TunnelRunner
children and socat, and asserts on the table's shape and the JSON record, never on a rate (a
half-second step on a shared machine means nothing). The generator's ``prefix`` and the sink's
``skip`` (the native plane's ``[uuid][payload]`` form) are checked on loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.relay import HEADER, ROW_NAMES
from bench.tools.rtpgen import RtpGenerator
from bench.tools.rtpsink import RtpSink

REPO = Path(__file__).resolve().parents[2]
# Measured: 25-50 s on this 2-core machine at a load average of 5 (two mp-relay starts, two
# runner children, one warm-up and one half-second step per target).
QUICK_TIMEOUT_S = 240


def test_prefix_and_skip_carry_the_same_stream() -> None:
    prefix = bytes(range(16))
    with RtpSink(("127.0.0.1", 0), seconds=5, count=200, skip=len(prefix)) as sink:
        with RtpGenerator(sink.address, pps=2000, count=200, seconds=None, prefix=prefix) as gen:
            assert bytes(gen._slots[0][: len(prefix)]) == prefix
            sent = gen.run().sent
        report = sink.run()
    assert sent == 200
    assert report.received == 200 and report.lost == 0 and report.not_rtp == 0
    assert report.bytes == 200 * (16 + 12 + 1316)
    assert report.latency_ms  # the probe was found past the prefix


@pytest.mark.e2e
def test_quick_run_prints_both_rows(tmp_path: Path) -> None:
    if shutil.which("socat") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("socat is missing in CI")
        pytest.skip("socat is not installed")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.relay",
            "--quick",
            "--json",
            str(tmp_path / "relay.json"),
            "--keep",
            str(tmp_path),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert HEADER in lines
    rows = lines[lines.index(HEADER) + 1 : lines.index(HEADER) + 1 + len(ROW_NAMES)]
    assert [row.split()[0] for row in rows] == list(ROW_NAMES), result.stdout
    assert rows[0].rstrip().endswith(("yes", "NO")) and rows[1].rstrip().endswith(("yes", "NO"))
    assert not any("failed" in line for line in lines), result.stdout
    assert not any("|" in line for line in lines)  # python -m bench prints it under its own table
    assert any(line.startswith("verdict: QUIC tunnel goal >= 300 Mbit/s: ") for line in lines)

    record = json.loads((tmp_path / "relay.json").read_text())
    assert record["failed"] is False
    for name in ("quic", "native", "socat"):
        assert record[name]["steps"], name  # every target stepped at least once
        assert record[name]["error"] is None, name
    assert set(record["quic"]["steps"][0]) >= {"sent", "missing", "cpu_us_per_packet"}
