"""Start-up time of `mp`: median wall time of `mp --help` and `mp flow list`.

Each command is a fresh process, as when a field engineer types it. The bare
interpreter (`python -c pass`, the same venv interpreter, so the same site
start-up) is measured in the same run, interleaved, so machine load hits all
figures alike. The goal: `mp flow list` within 120 ms of the bare interpreter.

    .venv/bin/python bench/cli_start.py                 # starts a throwaway mp-edge
    .venv/bin/python bench/cli_start.py --url http://127.0.0.1:8080 --runs 31

`mp flow list` runs with stdout piped (JSON, the scripting case) and, as an
extra line, with `-o table`. One flow is created first so the list is not empty.

Bytecode: an installed `mp` (the appliance image, a wheel) has .pyc files, so
the runs use a private PYTHONPYCACHEPREFIX, filled by a warm-up run, even when
the caller set PYTHONDONTWRITEBYTECODE (as this dev box does). One extra line
shows `mp flow list` compiling its own modules from source, for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent
GOAL_MS = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _edge(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    tmp = Path(tempfile.mkdtemp(prefix="mp-bench-"))
    port = _free_port()
    log = (tmp / "edge.log").open("wb")
    proc = subprocess.Popen(
        [
            str(BIN / "mp-edge"),
            "--config-dir",
            str(tmp / "cfg"),
            "--listen-addr",
            "127.0.0.1",
            "--listen-port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"mp-edge did not start; see {tmp / 'edge.log'}") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _seed(url: str, env: dict[str, str]) -> None:
    body = json.dumps(
        {
            "id": "bench1",
            "name": "Bench 1",
            "enabled": False,
            "input": {"type": "rtp", "bind_addr": "127.0.0.1:1"},
            "outputs": [{"type": "udp", "id": "out1", "name": "out1", "dest_addr": "127.0.0.1:9"}],
        }
    )
    subprocess.run([str(BIN / "mp"), "flow", "create", "-f", "-"], input=body.encode(), env=env, capture_output=True)


def _time_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms): CPU is user+system time of the child, which load on a shared box barely moves."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode().strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed * 1000, cpu * 1000


def _edge_round_trip(url: str, runs: int = 21) -> float:
    """Median ms of GET /api/v1/flows from this (warm) process: the edge's share of `mp flow list`."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        with urllib.request.urlopen(url + "/api/v1/flows", timeout=10) as resp:
            resp.read()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running edge (default: start a throwaway one)")
    parser.add_argument("--runs", type=int, default=21, help="runs per command (default 21)")
    args = parser.parse_args()
    mp = str(BIN / "mp")
    with _edge(args.url) as url, tempfile.TemporaryDirectory(prefix="mp-bench-pyc-") as pyc:
        env = {**os.environ, "MEDIAPLANE_URL": url, "NO_COLOR": "1", "PYTHONPYCACHEPREFIX": pyc}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        no_pyc = {k: v for k, v in env.items() if k != "PYTHONPYCACHEPREFIX"} | {"PYTHONDONTWRITEBYTECODE": "1"}
        _seed(url, env)
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "mp --help": ([mp, "--help"], env),
            "mp flow list": ([mp, "flow", "list"], env),
            "mp flow list -o table": ([mp, "flow", "list", "-o", "table"], env),
            "mp flow list, no .pyc": ([mp, "flow", "list"], no_pyc),
        }
        for argv, case_env in cases.values():  # warm the page cache and write the .pyc files
            _time_once(argv, case_env)
        walls: dict[str, list[float]] = {name: [] for name in cases}
        cpus: dict[str, list[float]] = {name: [] for name in cases}
        load_before = os.getloadavg()[0]
        for _ in range(args.runs):
            for name, (argv, case_env) in cases.items():
                wall, cpu = _time_once(argv, case_env)
                walls[name].append(wall)
                cpus[name].append(cpu)
        round_trip = _edge_round_trip(url)
    wall = {name: statistics.median(values) for name, values in walls.items()}
    cpu = {name: statistics.median(values) for name, values in cpus.items()}
    base, base_cpu = wall["python -c pass"], cpu["python -c pass"]
    load = max(load_before, os.getloadavg()[0])
    print(f"mp start-up, median of {args.runs} runs ({os.cpu_count()} CPUs, load average up to {load:.2f})")
    print(f"  {'command':<24}{'wall ms':>9}{'over python':>13}{'CPU ms':>9}{'over python':>13}")
    for name in cases:
        if name == "python -c pass":
            print(f"  {name:<24}{wall[name]:9.1f}{'':>13}{cpu[name]:9.1f}")
        else:
            over_wall, over_cpu = wall[name] - base, cpu[name] - base_cpu
            print(f"  {name:<24}{wall[name]:9.1f}{over_wall:+13.1f}{cpu[name]:9.1f}{over_cpu:+13.1f}")
    print(f"  (edge GET /api/v1/flows round trip from a warm process: median {round_trip:.1f} ms, inside mp flow list)")
    over = wall["mp flow list"] - base
    verdict = "within" if over <= GOAL_MS else "OVER"
    print(f"goal: mp flow list within {GOAL_MS:.0f} ms of python -c pass (wall): {verdict} ({over:+.1f} ms)")
    if load > (os.cpu_count() or 1):
        print("note: the machine was busy (load above the CPU count); wall times are inflated, CPU times less so")


if __name__ == "__main__":
    main()
