"""Scenario 5: packets lost while the control plane is saturated.

One flow at 50 % of scenario 1's peak for ``opts.isolation_seconds``, once unloaded and once
while ``wrk`` (Debian package ``wrk``) drives ``GET /api/v1/stats`` as fast as the API answers
and ``opts.ws_clients`` WebSocket clients read the stats stream. The goal is 0 lost in the
loaded step: the control plane runs in another process than the packets.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
from typing import Any

from bench.scenarios.common import (
    REPO,
    EdgeTarget,
    Options,
    Row,
    Sequence,
    edge,
    fmt_pps,
    have,
    log,
    opened,
    run_step,
    sink_child,
    step_line,
    step_record,
    worker_pid,
)
from bench.tools.procfs import tree_cpu_seconds

FALLBACK_PPS = 20000.0
WRK_CONNECTIONS = 32


def _read_json(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if readable else ""
    return dict(json.loads(line)) if line else {}


def _control_cpu(edge_pid: int, worker: int | None) -> float:
    """CPU seconds of the mp-edge control process alone (the tree minus the worker)."""
    return tree_cpu_seconds(edge_pid) - (tree_cpu_seconds(worker) if worker else 0.0)


def scenario_5(opts: Options) -> list[Row]:
    peak = opts.shared.get("s1_peak_pps")
    pps = 0.5 * peak if peak else (2000.0 if opts.quick else FALLBACK_PPS)
    basis = "50% of scenario 1's peak" if peak else "fixed rate: scenario 1 not run"
    seconds = opts.isolation_seconds
    with edge(opts, "s5") as (url, pid), sink_child(1) as sinks:
        target = EdgeTarget(url, pid, "s5", "mediaplane")
        sequence = Sequence()
        with opened(target, sinks.ports) as port:
            quiet = run_step(target, sinks, port, pps, seconds, sequence)
            log(step_line("unloaded", quiet))
            ws_url = url.replace("http://", "ws://") + "/api/v1/ws/stats"
            ws = subprocess.Popen(
                [sys.executable, "-m", "bench.scenarios.wsclients", ws_url, str(opts.ws_clients), str(seconds + 3)],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.PIPE,
                text=True,
            )
            wrk: subprocess.Popen[str] | None = None
            try:
                connected = _read_json(ws, 40).get("connected", 0)
                if have("wrk"):
                    wrk = subprocess.Popen(
                        [
                            "wrk",
                            "-t1",
                            f"-c{WRK_CONNECTIONS}",
                            f"-d{max(1, round(seconds + 1))}s",
                            "--timeout",
                            "5s",
                            f"{url}/api/v1/stats",
                        ],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                worker = worker_pid(pid)
                control_before = _control_cpu(pid, worker)
                loaded = run_step(target, sinks, port, pps, seconds, sequence)
                control_cpu = _control_cpu(pid, worker) - control_before
                log(step_line("API + WS loaded", loaded))
                wrk_out = wrk.communicate(timeout=seconds + 30)[0] if wrk else ""
                ws_result = _read_json(ws, seconds + 40)
            finally:
                for process in (wrk, ws):
                    if process is not None and process.poll() is None:
                        process.kill()
                    if process is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            process.wait(5)
    match = re.search(r"Requests/sec:\s+([\d.]+)", wrk_out)
    requests_s = float(match.group(1)) if match else 0.0
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", wrk_out)
    opts.record["scenario_5"] = {
        "pps": round(pps),
        "basis": basis,
        "unloaded": step_record(quiet),
        "loaded": step_record(loaded),
        "wrk_requests_per_s": requests_s,
        "control_cpu_s": round(control_cpu, 2),
        "control_cpu_ms_per_request": round(control_cpu / max(requests_s * seconds, 1) * 1000, 1),
        "wrk_non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "ws_connected": connected,
        "ws": ws_result,
    }
    log(f"[s5] wrk {requests_s:.0f} req/s; websocket {ws_result}")
    ours = (
        f"{loaded.missing} of {loaded.sent:,} lost at {fmt_pps(pps)} ({basis}); "
        f"p99 {loaded.latency_ms.get('p99', float('nan')):.2f} ms loaded vs "
        f"{quiet.latency_ms.get('p99', float('nan')):.2f} ms unloaded ({quiet.missing} lost); "
        f"API under load: wrk {requests_s:,.0f} req/s on /api/v1/stats "
        f"(control process {control_cpu / seconds:.0%} of a core), "
        f"{connected}/{opts.ws_clients} WebSocket clients, {ws_result.get('frames', 0)} frames"
    )
    met = loaded.lossless and quiet.lossless and bool(match) and connected == opts.ws_clients
    return [Row("5", "Isolation: packets vs a saturated REST API + WebSockets", ours, "-", "-", "0 lost", met)]
