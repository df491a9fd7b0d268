"""Mediaplane benchmarks against real peers, in one run, as one table (``make bench``).

    python -m bench [--quick] [--only N [N ...]] [--json PATH] [--keep DIR]

Scenarios (bench/README.md says how each is measured):
  1  1 input -> 1 UDP output: highest zero-loss rate; peers srt-live-transmit and socat
  2  1 input -> 4 and -> 16 outputs; peer GStreamer udpsrc ! tee ! udpsink x N
  3  50, 100 and 200 flows of 10 Mbit/s on one worker for 60 s each: loss and CPU per count, the
     largest count held at zero loss, CPU/pkt at 50 flows over scenario 1's single flow
  4  added latency p50/p99 at 50 % of scenario 1's peak; peer srt-live-transmit
  5  isolation: scenario 1 at 50 % of its peak while wrk saturates the REST API and 50
     WebSocket stats clients are connected: packets lost must be 0
  6  memory: RSS of mp-edge (all processes) idle, with 1 flow and with 50 flows
  7  scaling: K flows of equal rate over mp-edge --workers W, W = 1 .. the CPUs there are: the
     highest aggregate zero-loss rate per W and its ratio to W = 1

Each scenario's header line (stderr) gives the core count and the load average at its start.

After the table, the fleet manager benchmark (``bench/manager.py``: simulated nodes over WSS
against one ``mp-manager``, 500 to 5,000 nodes, command round trip p50/p99, RSS per node) prints
its own table; ``--no-manager`` skips it, ``--manager-only`` runs only it, and ``--only`` leaves
it out. Then the relay benchmark (``bench/relay.py``: UDP through one QUIC tunnel, egress
TunnelRunner -> mp-relay -> ingress TunnelRunner, and the relay's native UDP plane against socat)
prints its table; ``--no-relay`` skips it, ``--relay-only`` runs only it, ``--only`` leaves it out.
Then the RTMP ingest benchmark (``bench/rtmp.py``: an 8 Mbit/s H.264/AAC publisher into an
``rtmp`` input with two outputs, CPU per second of media, beside ffmpeg remuxing the same RTMP to
TS); ``--no-rtmp`` skips it, ``--rtmp-only`` runs only it, ``--only`` leaves it out.
Last, the RTSP ingest benchmark (``bench/rtsp.py``: a gst-rtsp-server camera, 1280x720 H.264 + AAC,
pulled by an ``rtsp`` input over TCP and over UDP with two outputs, CPU per second of media,
beside ffmpeg pulling the same camera to TS); ``--no-rtsp`` skips it, ``--rtsp-only`` runs only
it, ``--only`` leaves it out.
Then the WebRTC egress benchmark (``bench/webrtc.py``: an 8 Mbit/s H.264 flow served to aiortc WHEP
viewers, the webrtc worker's CPU per viewer and the viewers it holds at zero loss, beside ffmpeg
remuxing the same stream); ``--no-webrtc`` skips it, ``--webrtc-only`` runs only it, ``--only``
leaves it out.

``--quick`` runs each scenario for about a second, the manager benchmark with 20 nodes and the
relay benchmark with one half-second step per target (the smoke test uses it: its figures mean
nothing). Every load loop is bounded in count and time; all
traffic stays on 127.0.0.1. The table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.scenarios import SCENARIOS
from bench.scenarios.common import Options, Row, dump_json, load_average, log, machine, start_edge

COLUMNS = ("#", "scenario", "mediaplane", "peers (same run)", "ratio", "goal", "met?")


def render(rows: list[Row]) -> str:
    """A plain-text table; long cells wrap inside their column."""
    widths = (3, 34, 44, 50, 20, 24, 4)
    cells = [COLUMNS] + [(r.number, r.scenario, r.ours, r.peers, r.ratio, r.goal, r.verdict) for r in rows]
    lines: list[str] = []
    rule = "+".join("-" * (w + 2) for w in widths)
    for index, row in enumerate(cells):
        wrapped = [_wrap(text, width) for text, width in zip(row, widths, strict=True)]
        for k in range(max(len(w) for w in wrapped)):
            parts = [(w[k] if k < len(w) else "").ljust(width) for w, width in zip(wrapped, widths, strict=True)]
            lines.append(" " + " | ".join(parts))
        lines.append(rule)
        if index == 0:
            lines[-1] = rule.replace("-", "=")
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    out: list[str] = []
    for chunk in text.split("; "):
        line = ""
        for word in chunk.split(" "):
            if line and len(line) + 1 + len(word) > width:
                out.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        out.append(line)
    return out or [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="each scenario for about a second (smoke test)")
    parser.add_argument("--only", type=int, nargs="+", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and py-spy profiles in this directory")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy step in scenarios 1 and 2")
    parser.add_argument("--no-manager", action="store_true", help="skip the fleet manager benchmark (bench/manager.py)")
    parser.add_argument("--manager-only", action="store_true", help="run only the fleet manager benchmark")
    parser.add_argument("--no-relay", action="store_true", help="skip the relay benchmark (bench/relay.py)")
    parser.add_argument("--relay-only", action="store_true", help="run only the relay benchmark")
    parser.add_argument("--no-rtmp", action="store_true", help="skip the RTMP ingest benchmark (bench/rtmp.py)")
    parser.add_argument("--rtmp-only", action="store_true", help="run only the RTMP ingest benchmark")
    parser.add_argument("--no-rtsp", action="store_true", help="skip the RTSP ingest benchmark (bench/rtsp.py)")
    parser.add_argument("--rtsp-only", action="store_true", help="run only the RTSP ingest benchmark")
    parser.add_argument("--no-webrtc", action="store_true", help="skip the WebRTC egress benchmark (bench/webrtc.py)")
    parser.add_argument("--webrtc-only", action="store_true", help="run only the WebRTC egress benchmark")
    args = parser.parse_args(argv)
    only_other = args.manager_only or args.relay_only or args.rtmp_only or args.rtsp_only or args.webrtc_only
    with_manager = not args.no_manager and (args.manager_only or not (args.only or only_other))
    with_relay = not args.no_relay and (args.relay_only or not (args.only or only_other))
    with_rtmp = not args.no_rtmp and (args.rtmp_only or not (args.only or only_other))
    with_rtsp = not args.no_rtsp and (args.rtsp_only or not (args.only or only_other))
    with_webrtc = not args.no_webrtc and (args.webrtc_only or not (args.only or only_other))

    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        opts = Options.quick_options(workdir) if args.quick else Options(workdir=workdir)
        if args.no_profile:
            opts.profile = False
        started = time.monotonic()
        load_before = load_average()
        log(f"bench: {'quick' if args.quick else 'full'} run, load average {load_before}, {os.cpu_count()} CPUs")
        rows: list[Row] = []
        with contextlib.ExitStack() as stack:
            if args.quick:
                opts.shared_edge = stack.enter_context(start_edge(workdir, "shared"))
            for number in [] if only_other else args.only or sorted(SCENARIOS):
                title, run = SCENARIOS[number]
                rows += _run_one(number, title, run, opts)
        manager_ok = _run_manager(args.quick, workdir, opts.record) if with_manager else True
        relay_ok = _run_relay(args.quick, workdir, opts.record) if with_relay else True
        rtmp_ok = _run_rtmp(args.quick, workdir, opts.record) if with_rtmp else True
        rtsp_ok = _run_rtsp(args.quick, workdir, opts.record) if with_rtsp else True
        webrtc_ok = _run_webrtc(args.quick, workdir, opts.record) if with_webrtc else True
        elapsed = time.monotonic() - started
        load_after = load_average()
        if rows or not only_other:
            print(render(rows))
        if "manager" in opts.record:
            print(opts.record["manager"].pop("text"))
        if "relay" in opts.record:
            print(opts.record["relay"].pop("text"))
        if "rtmp" in opts.record:
            print(opts.record["rtmp"].pop("text"))
        if "rtsp" in opts.record:
            print(opts.record["rtsp"].pop("text"))
        if "webrtc" in opts.record:
            print(opts.record["webrtc"].pop("text"))
        print(
            f"run took {elapsed:.0f} s; load average (1/5/15 min) {load_before} at the start, {load_after} at the end;"
            f" {os.cpu_count()} CPUs. Ratios = mediaplane / peer, measured alternately in this run."
        )
        opts.record["run"] = {
            "quick": args.quick,
            "seconds": round(elapsed, 1),
            "load_before": load_before,
            "load_after": load_after,
            "rows": [r.__dict__ | {"verdict": r.verdict} for r in rows],
        }
        if args.json:
            dump_json(args.json, opts.record)
    ok = manager_ok and relay_ok and rtmp_ok and rtsp_ok and webrtc_ok
    return 0 if ok and all(r.ours != "failed" for r in rows) else 1


def _run_manager(quick: bool, workdir: Path, record: dict[str, object]) -> bool:
    """``bench.manager`` with its default steps (or ``--quick``'s 20 nodes); its table and figures
    go into ``record["manager"]``. False when it broke (its traceback on stderr), never for a
    goal not met: that is the verdict line's to say."""
    from bench import manager as manager_bench

    log(f"--- fleet manager benchmark (load average {load_average()})")
    started = time.monotonic()
    argv = ["--quick"] if quick else []
    try:
        opts = manager_bench.options_from(manager_bench.build_parser().parse_args(argv))
        (workdir / "manager").mkdir(parents=True, exist_ok=True)
        record["manager"] = manager_bench.run(opts, workdir / "manager")
    except Exception:  # the scenario table above must still print
        traceback.print_exc(file=sys.stderr)
        record["manager"] = {"text": "fleet manager benchmark: failed (see stderr)"}
        return False
    finally:
        log(f"--- fleet manager benchmark took {time.monotonic() - started:.0f} s")
    return True


def _run_suite(key: str, title: str, workdir: Path, record: dict[str, object], run: Callable[[Path], Any]) -> bool:
    """One benchmark with a table of its own (``bench.relay``, ``bench.rtmp``): ``run(dir)``
    returns its figures with ``text`` and ``failed``, kept in ``record[key]``. False when a
    measurement broke (traceback on stderr), never for a goal not met."""
    log(f"--- {title} (load average {load_average()})")
    started = time.monotonic()
    try:
        (workdir / key).mkdir(parents=True, exist_ok=True)
        result = run(workdir / key)
        record[key] = result
        return not result["failed"]
    except Exception:  # the tables above must still print
        traceback.print_exc(file=sys.stderr)
        record[key] = {"text": f"{title}: failed (see stderr)"}
        return False
    finally:
        log(f"--- {title} took {time.monotonic() - started:.0f} s")


def _run_relay(quick: bool, workdir: Path, record: dict[str, object]) -> bool:
    """``bench.relay`` (full or ``--quick``)."""
    from bench import relay as relay_bench

    return _run_suite(
        "relay", "relay benchmark", workdir, record, lambda d: relay_bench.run(relay_bench.options(quick, d), d)
    )


def _run_rtmp(quick: bool, workdir: Path, record: dict[str, object]) -> bool:
    """``bench.rtmp`` (20 s, or 3 s with ``--quick``)."""
    from bench import rtmp as rtmp_bench

    return _run_suite(
        "rtmp", "RTMP ingest benchmark", workdir, record, lambda d: rtmp_bench.run(3.0 if quick else 20.0, 8000, d)
    )


def _run_rtsp(quick: bool, workdir: Path, record: dict[str, object]) -> bool:
    """``bench.rtsp`` (20 s per path, or 3 s with ``--quick``)."""
    from bench import rtsp as rtsp_bench

    return _run_suite(
        "rtsp", "RTSP ingest benchmark", workdir, record, lambda d: rtsp_bench.run(3.0 if quick else 20.0, 8000, d)
    )


def _run_webrtc(quick: bool, workdir: Path, record: dict[str, object]) -> bool:
    """``bench.webrtc`` (parts 1-3, about 5 min; a smoke run with ``--quick``)."""
    from bench import webrtc as webrtc_bench

    return _run_suite("webrtc", "WebRTC egress benchmark", workdir, record, lambda d: webrtc_bench.run(d, quick=quick))


def _run_one(number: int, title: str, run: Callable[[Options], list[Row]], opts: Options) -> list[Row]:
    # Core count and load average on every scenario's header: figures on a shared host need both.
    log(f"--- scenario {number}: {title} ({machine()})")
    opts.record.setdefault("machine", {})[str(number)] = machine()
    started = time.monotonic()
    try:
        rows = run(opts)
    except Exception as exc:  # one broken scenario must not hide the others' rows
        traceback.print_exc(file=sys.stderr)
        rows = [Row(str(number), title, "failed", f"{type(exc).__name__}: {exc}"[:200])]
    log(f"--- scenario {number} took {time.monotonic() - started:.0f} s")
    return rows


if __name__ == "__main__":
    sys.exit(main())
