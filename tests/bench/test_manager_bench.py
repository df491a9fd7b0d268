"""``python -m bench.manager --quick``: the fleet manager benchmark runs end to end.

Smoke tests, so the benchmark cannot rot. The capacity climb (``--no-fleet``) starts the real
``mp-manager``, registers 20 simulated nodes over WSS and sends a few commands; the fleet scenario
(``--fleet``) starts PostgreSQL and two instances on it, 10 nodes on each, sends commands through
both routes and kills one instance. Both assert on the table's structure and the JSON record,
never on a rate (20 nodes on a shared machine say nothing about 5,000); the one bound is the
failover's 30 s, three times what the client's backoff needs on a loaded host.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from bench.manager import HEADER, build_parser, link_error, options_from, run_fleet_part
from bench.manager_fleet import BACK_ONLINE, CROSS_ROW, FLEET_HEADER, SAME_ROW
from tests.helpers.postgres import require_postgres

REPO = Path(__file__).resolve().parents[2]
# Measured: ~19 s on this 2-core machine (setup + serve start ~9 s, 20 nodes, 5 commands).
QUICK_TIMEOUT_S = 40
# Measured: ~20 s (PostgreSQL ~1 s, setup ~8 s, both instances ~2 s, 20 nodes, 50 commands, the
# failover ~2 s); the scenario's own bounds (60 s of commands, 30 s of failover) fit inside.
FLEET_TIMEOUT_S = 120
FAILOVER_CEILING_S = 30.0


@pytest.mark.e2e
def test_quick_run_prints_the_table_with_a_numeric_p99(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.manager", "--quick", "--no-fleet", "--json", str(tmp_path / "manager.json")],
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


def columns(line: str) -> list[str]:
    """A table line split on runs of 2+ spaces (labels hold single spaces)."""
    return re.split(r"\s{2,}", line.strip())


@pytest.mark.e2e
def test_quick_fleet_run_prints_both_routes_and_the_failover(tmp_path: Path) -> None:
    require_postgres()  # skips without PostgreSQL, fails in CI
    result = subprocess.run(
        [sys.executable, "-m", "bench.manager", "--fleet", "--quick", "--json", str(tmp_path / "fleet.json")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=FLEET_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert FLEET_HEADER in lines, result.stdout
    assert HEADER not in lines  # --fleet: no capacity climb
    names = columns(FLEET_HEADER)
    at = lines.index(FLEET_HEADER)
    rows = {}
    for line in lines[at + 1 : at + 5]:
        values = dict(zip(names, columns(line), strict=True))
        rows[values["route"], int(values["at a time"])] = values
    # One at a time, then the quick mode's 4 at a time; each with both routes.
    assert set(rows) == {(route, n) for route in (SAME_ROW, CROSS_ROW) for n in (1, 4)}, lines[at : at + 5]
    for key, values in rows.items():
        assert int(values["commands"]) >= 1, key
        for column in ("p50 ms", "p99 ms"):
            assert math.isfinite(float(values[column])), (key, column, values)
    assert re.search(r"\d+ CPUs, load average [0-9.]+ [0-9.]+ [0-9.]+ \(1/5/15 min\)", lines[at - 1]), lines[at - 1]
    back = re.search(re.escape(BACK_ONLINE) + r" ([0-9.]+) s", result.stdout)
    assert back is not None, result.stdout[-3000:] + result.stderr[-3000:]
    assert float(back.group(1)) < FAILOVER_CEILING_S
    assert not any("|" in line for line in lines)  # python -m bench prints it under its own table

    record = json.loads((tmp_path / "fleet.json").read_text())
    fleet = record["fleet"]
    assert fleet["connected"] == 20
    assert fleet["held_by"] == {"A": 10, "B": 10}
    assert fleet["failover"]["nodes"] == 10
    assert fleet["failover"]["all_back_s"] < FAILOVER_CEILING_S
    assert record["steps"] == []


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_options_run_the_fleet_after_the_climb_unless_told_otherwise() -> None:
    full = options_from(parse([]))
    assert full.capacity and full.fleet is not None and full.fleet.nodes_per_instance == 100
    quick = options_from(parse(["--quick"]))
    assert quick.capacity and quick.fleet is not None and quick.fleet.quick and quick.fleet.nodes_per_instance == 10
    only = options_from(parse(["--fleet", "--fleet-nodes", "50"]))
    assert not only.capacity and only.fleet_required and only.fleet is not None
    assert only.fleet.nodes_per_instance == 50
    assert options_from(parse(["--no-fleet"])).fleet is None
    with pytest.raises(SystemExit):
        parse(["--fleet", "--no-fleet"])


def test_link_errors_are_found_inside_exception_groups() -> None:
    closed = ConnectionClosed(None)
    kinds = (ConnectionClosed, OSError)
    assert link_error(closed, kinds) is closed
    assert link_error(BaseExceptionGroup("g", [ExceptionGroup("h", [closed]), OSError()]), kinds) is closed
    assert link_error(BaseExceptionGroup("g", [closed, ValueError()]), kinds) is None
    assert link_error(ValueError(), kinds) is None
    assert link_error(BaseExceptionGroup("g", [closed, trio.TooSlowError()]), kinds) is None


def test_without_postgres_the_default_run_skips_the_fleet_and_fleet_alone_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench.manager_fleet

    monkeypatch.setattr(bench.manager_fleet, "postgres_available", lambda: False)
    fleet, failed = run_fleet_part(options_from(parse(["--quick"])), tmp_path)
    assert fleet == {"text": "mp-manager fleet: skipped: PostgreSQL is not installed (tools/ensure-debs.sh)"}
    assert not failed
    with pytest.raises(RuntimeError, match="needs PostgreSQL"):
        run_fleet_part(options_from(parse(["--fleet", "--quick"])), tmp_path)
    assert run_fleet_part(options_from(parse(["--no-fleet"])), tmp_path) == (None, False)
