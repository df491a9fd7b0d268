"""SRT throughput at zero loss on loopback: mp-edge against srt-live-transmit, in one run.

    python -m bench.srt [--quick] [--step-seconds 2] [--max-steps 6] [--start-pps 4000]

Two paths through a real ``mp-edge --workers 1`` (flows created with ``POST /api/v1/flows``):

- **SRT -> UDP**: generator --UDP--> ``srt-live-transmit udp://A srt://B?mode=caller`` --SRT-->
  mp-edge (``srt`` listener input on B, ``udp`` output) --UDP--> sink;
- **UDP -> SRT**: generator --UDP--> mp-edge (``udp`` input on A, ``srt`` caller output to B)
  --SRT--> ``srt-live-transmit srt://B?mode=listener udp://sink`` --UDP--> sink.

and, for each, the same path with srt-live-transmit in mp-edge's place, measured right after
it in the same run (so the two see the same machine load)::

    srt-live-transmit udp://A?rcvbuf=4194304 srt://B?mode=caller  -->  srt-live-transmit srt://B?mode=listener udp://sink

In both mp-edge paths the caller sends and the listener receives, so the srt-live-transmit
pipeline that stands in for either is the same one (it is measured once per row anyway).

The payload is raw MPEG-TS, 1316 bytes (7 x 188, SRT's live-mode message; srt-live-transmit
reads 1316-byte UDP datagrams as one message each), from ``bench.tools.rtpgen --raw-ts``:
every datagram carries a probe with its index, so the sink (``bench.tools.rtpsink`` in ``ts``
mode, in a child process so it does not share a GIL with the generator) counts missing
datagrams exactly and checks TS continuity. A step is clean when the sink received every
datagram the generator sent, none missing, no continuity error, and nothing kept arriving
more than ``MAX_DRAIN_S`` after the generator stopped (a standing backlog in a buffer). Each
step sets the path up fresh (processes, flow, SRT connection) and tears it down, so an
overloaded step cannot spoil the next one.

Search per path: double from ``--start-pps`` until a step loses, then bisect (like
``bench.edge_forward``), at most ``--max-steps`` steps; the whole run is about 2-3 minutes.
``--quick`` runs one short step per path (about 10-20 s): a smoke run whose figures mean little.

Also printed: the CPU time per datagram of the box under test (the mp-edge process tree, or the
srt-live-transmit process in its place), which the load of a shared host moves much less than
the rates. Everything binds 127.0.0.1; nothing is left running at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.edge_forward import JsonLineChild, free_port, running_edge, udp_counters
from bench.tools.procfs import cpu_seconds, tree_cpu_seconds

REPO: Final = Path(__file__).resolve().parents[1]
TS_MESSAGE: Final = 1316
LATENCY_MS: Final = 120
# SRT holds every message for its latency; more than this after the generator stopped is a backlog.
MAX_DRAIN_S: Final = 0.5 + LATENCY_MS / 1000
CONNECT_TIMEOUT_S: Final = 10.0
# srt-live-transmit's UDP input keeps the kernel default buffer (rmem_default, ~200 KB: ~90 datagrams, a
# 20 ms stall at 4,000 pkt/s) unless told; mp-edge asks for 32 MiB (SO_RCVBUFFORCE as root). Give it
# what a plain SO_RCVBUF can get (net.core.rmem_max, 4 MiB here), so the measurement is not of a default.
SLT_UDP_RCVBUF: Final = 4 * 1024 * 1024
PATHS: Final = ("SRT -> UDP", "UDP -> SRT")


# ---------------------------------------------------------------------------- sink child


def sink_child() -> None:
    """Child mode: one ts-mode sink on 127.0.0.1; stdin takes ``reset`` / ``report`` / ``quit``."""
    from bench.tools.rtpsink import RtpSink

    sink = RtpSink(("127.0.0.1", 0), seconds=1e9, mode="ts", latency=False)
    print(json.dumps({"port": sink.address[1]}), flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin, sink.sock], [], [], 0.05)
        sink.poll()
        if sys.stdin not in readable:
            continue
        command = sys.stdin.readline().strip()
        if command in ("quit", ""):
            return
        if command == "reset":
            sink.poll()  # anything late from the previous step goes with the old counters
            sink = RtpSink(("127.0.0.1", 0), sock=sink.sock, seconds=1e9, mode="ts", latency=False)
            print(json.dumps({"reset": True}), flush=True)
        elif command == "report":
            r = sink.report(0.0)
            print(
                json.dumps(
                    {"received": r.received, "lost": r.lost, "cc_errors": r.cc_errors, "duplicated": r.duplicated}
                ),
                flush=True,
            )


class SinkChild(JsonLineChild):
    def __init__(self) -> None:
        super().__init__("bench.srt", "--sink-child")
        self.port: int = self._read(30.0)["port"]


# ---------------------------------------------------------------------------- processes


class Slt:
    """One srt-live-transmit process; its (unbuffered-enough) log says when it is connected."""

    def __init__(self, binary: str, source: str, target: str, log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [binary, source, target], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def saw(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:.0f} s")
        time.sleep(0.05)


# ---------------------------------------------------------------------------- one step


@dataclass
class Step:
    target_pps: float
    sent: int
    achieved_pps: float
    received: int
    lost: int
    cc_errors: int
    rcvbuf_errors: int
    drain_s: float
    cpu_s: float  # CPU of the box under test during the step (mp-edge tree, or the srt-live-transmit in its place)
    note: str = ""

    @property
    def lossless(self) -> bool:
        return self.sent > 0 and self.received == self.sent and self.lost == 0 and self.cc_errors == 0

    @property
    def clean(self) -> bool:
        return self.lossless and self.drain_s <= MAX_DRAIN_S

    @property
    def generator_limited(self) -> bool:
        return self.achieved_pps < 0.9 * self.target_pps

    @property
    def cpu_us_per_packet(self) -> float:
        return self.cpu_s / self.sent * 1e6 if self.sent else float("nan")

    @property
    def mbps(self) -> float:
        return self.achieved_pps * TS_MESSAGE * 8 / 1e6


class Bench:
    """The shared pieces of a run: the edge, the sink child, srt-live-transmit, a temp dir."""

    def __init__(self, url: str, edge_pid: int, sink: SinkChild, slt: str, tmp: Path, step_seconds: float) -> None:
        self.url = url
        self.edge_pid = edge_pid
        self.sink = sink
        self.slt = slt
        self.tmp = tmp
        self.step_seconds = step_seconds
        self._flows = 0
        self._slts = 0

    def _slt(self, source: str, target: str) -> Slt:
        self._slts += 1
        return Slt(self.slt, source, target, self.tmp / f"slt-{self._slts}.log")

    def _flow_stats(self, flow_id: str) -> dict[str, Any]:
        import httpx

        answer = httpx.get(f"{self.url}/api/v1/stats/{flow_id}", timeout=10)
        return dict(answer.json().get("data") or {}) if answer.status_code == 200 else {}

    @contextlib.contextmanager
    def _flow(self, flow: dict[str, Any]) -> Iterator[str]:
        import httpx

        answer = httpx.post(f"{self.url}/api/v1/flows", json=flow, timeout=30)
        if answer.status_code != 200:
            raise RuntimeError(f"POST /api/v1/flows answered {answer.status_code}: {answer.text}")
        try:
            yield flow["id"]
        finally:
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{self.url}/api/v1/flows/{flow['id']}", timeout=30)

    def _next_flow_id(self) -> str:
        self._flows += 1
        return f"srt{self._flows}"

    # Each path: set up, yield (generator target port, a CPU probe of the box under test), tear down.

    @contextlib.contextmanager
    def path_srt_to_udp_edge(self) -> Iterator[tuple[int, Callable[[], float]]]:
        udp_in, srt_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
        flow_id = self._next_flow_id()
        flow = {
            "id": flow_id,
            "name": "bench srt in",
            "input": {
                "type": "srt",
                "mode": "listener",
                "local_addr": f"127.0.0.1:{srt_port}",
                "latency_ms": LATENCY_MS,
            },
            "outputs": [{"type": "udp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{self.sink.port}"}],
        }
        with self._flow(flow):
            tx = self._slt(
                f"udp://127.0.0.1:{udp_in}?rcvbuf={SLT_UDP_RCVBUF}",
                f"srt://127.0.0.1:{srt_port}?mode=caller&latency={LATENCY_MS}",
            )
            try:
                wait_until(lambda: tx.saw("SRT target connected"), "srt-live-transmit did not connect to mp-edge")
                wait_until(
                    lambda: self._flow_stats(flow_id).get("input", {}).get("state") == "connected",
                    "mp-edge's SRT input did not show connected",
                )
                yield udp_in, lambda: tree_cpu_seconds(self.edge_pid)
            finally:
                tx.stop()

    @contextlib.contextmanager
    def path_udp_to_srt_edge(self) -> Iterator[tuple[int, Callable[[], float]]]:
        udp_in, srt_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
        rx = self._slt(
            f"srt://127.0.0.1:{srt_port}?mode=listener&latency={LATENCY_MS}", f"udp://127.0.0.1:{self.sink.port}"
        )
        try:
            time.sleep(0.2)  # the listener binds
            flow_id = self._next_flow_id()
            flow = {
                "id": flow_id,
                "name": "bench srt out",
                "input": {"type": "udp", "bind_addr": f"127.0.0.1:{udp_in}"},
                "outputs": [
                    {
                        "type": "srt",
                        "id": "s",
                        "name": "s",
                        "mode": "caller",
                        "local_addr": "0.0.0.0:0",
                        "remote_addr": f"127.0.0.1:{srt_port}",
                        "latency_ms": LATENCY_MS,
                    }
                ],
            }
            with self._flow(flow):
                wait_until(
                    lambda: rx.saw("Accepted SRT source connection"), "mp-edge did not connect to srt-live-transmit"
                )
                wait_until(
                    lambda: (self._flow_stats(flow_id).get("outputs") or [{}])[0].get("state") == "connected",
                    "mp-edge's SRT output did not show connected",
                )
                yield udp_in, lambda: tree_cpu_seconds(self.edge_pid)
        finally:
            rx.stop()

    @contextlib.contextmanager
    def path_slt(self, role: str) -> Iterator[tuple[int, Callable[[], float]]]:
        """srt-live-transmit alone; ``role`` picks whose CPU is reported: ``rx`` or ``tx``."""
        udp_in, srt_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
        rx = self._slt(
            f"srt://127.0.0.1:{srt_port}?mode=listener&latency={LATENCY_MS}", f"udp://127.0.0.1:{self.sink.port}"
        )
        tx: Slt | None = None
        try:
            time.sleep(0.2)
            tx = self._slt(
                f"udp://127.0.0.1:{udp_in}?rcvbuf={SLT_UDP_RCVBUF}",
                f"srt://127.0.0.1:{srt_port}?mode=caller&latency={LATENCY_MS}",
            )
            wait_until(lambda: tx is not None and tx.saw("SRT target connected"), "srt-live-transmit did not connect")
            wait_until(lambda: rx.saw("Accepted SRT source connection"), "srt-live-transmit did not accept")
            yield udp_in, (rx.cpu_seconds if role == "rx" else tx.cpu_seconds)
        finally:
            if tx is not None:
                tx.stop()
            rx.stop()

    def step(
        self, path: Callable[[], contextlib.AbstractContextManager[tuple[int, Callable[[], float]]]], pps: float
    ) -> Step:
        from bench.tools.rtpgen import RtpGenerator

        try:
            with path() as (port, cpu):
                time.sleep(0.2)  # srt-live-transmit reads its UDP input once connected
                self.sink.command("reset")
                before = udp_counters()
                cpu_before = cpu()
                with RtpGenerator(("127.0.0.1", port), pps=pps, seconds=self.step_seconds, raw_ts=True) as gen:
                    report = gen.run()
                sink, drain_s = self._drained()
                cpu_s = cpu() - cpu_before
                after = udp_counters()
        except RuntimeError as exc:  # a path that did not come up: a failed step, never a hang
            return Step(pps, 0, 0.0, 0, 0, 0, 0, 0.0, 0.0, note=str(exc))
        return Step(
            target_pps=pps,
            sent=report.sent,
            achieved_pps=report.sent / max(report.seconds, 1e-9),
            received=int(sink["received"]),
            lost=int(sink["lost"]),
            cc_errors=int(sink["cc_errors"]),
            rcvbuf_errors=after["RcvbufErrors"] - before["RcvbufErrors"],
            drain_s=drain_s,
            cpu_s=cpu_s,
        )

    def _drained(self, limit_s: float = 6.0) -> tuple[dict[str, Any], float]:
        """Poll the sink until its count stops moving for 0.4 s; (report, seconds it kept moving)."""
        started = time.monotonic()
        last, last_change = -1, started
        while True:
            report = self.sink.command("report")
            now = time.monotonic()
            if report["received"] != last:
                last, last_change = report["received"], now
            elif now - last_change >= 0.4 or now - started >= limit_s:
                return report, last_change - started
            time.sleep(0.1)


# ---------------------------------------------------------------------------- search


def print_step(label: str, step: Step) -> None:
    verdict = "clean" if step.clean else ("BACKLOG" if step.lossless else "LOSS")
    if step.note:
        verdict = f"FAILED: {step.note}"
    elif step.generator_limited:
        verdict += " (generator-limited)"
    missing = max(0, step.sent - step.received)
    print(
        f"{label:<22} {step.target_pps:>8,.0f} {step.achieved_pps:>8,.0f} {step.sent:>7} {step.received:>7} "
        f"{missing:>6} {step.cc_errors:>5} {step.rcvbuf_errors:>6} {step.drain_s:>5.2f} "
        f"{step.cpu_us_per_packet:>7.1f}  {verdict}",
        flush=True,
    )


def search(label: str, run: Callable[[float], Step], args: argparse.Namespace) -> Step | None:
    """Double until a step loses (or the generator's limit), then bisect; the best clean step."""
    best: Step | None = None
    low, high = 0.0, None
    pps = float(args.start_pps)
    for _ in range(args.max_steps):
        step = run(pps)
        print_step(label, step)
        if step.clean:
            if best is None or step.achieved_pps > best.achieved_pps:
                best = step
            low = pps
            if step.generator_limited:
                break
        else:
            high = pps
        if high is None:
            if pps >= args.max_pps:
                break
            pps = min(pps * 2, args.max_pps)
        else:
            if high - low <= max(0.1 * low, 1000):
                break
            pps = (low + high) / 2 if low else high / 2
    return best


def render(rows: list[tuple[str, Step | None, Step | None]]) -> str:
    def rate(step: Step | None) -> tuple[str, str, str]:
        if step is None:
            return "none clean", "-", "-"
        return f"{step.achieved_pps:,.0f}", f"{step.mbps:,.1f}", f"{step.cpu_us_per_packet:.1f}"

    header = (
        "path",
        "ours pkt/s",
        "ours Mbit/s",
        "ours CPU us/pkt",
        "slt pkt/s",
        "slt Mbit/s",
        "slt CPU us/pkt",
        "ratio",
    )
    lines = [header]
    for path, ours, theirs in rows:
        ratio = f"{ours.achieved_pps / theirs.achieved_pps:.2f}x" if ours and theirs else "-"
        lines.append((path, *rate(ours), *rate(theirs), ratio))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append(
            "| "
            + " | ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
            + " |"
        )
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.srt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one short step per path (a smoke run)")
    parser.add_argument("--step-seconds", type=float, default=2.0)
    parser.add_argument("--max-steps", type=int, default=6, help="per path")
    parser.add_argument("--start-pps", type=float, default=4000)
    parser.add_argument("--max-pps", type=float, default=128000)
    parser.add_argument("--sink-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sink_child:
        sink_child()
        return
    slt = shutil.which("srt-live-transmit")
    if slt is None:
        sys.exit("srt-live-transmit (Debian srt-tools) is not installed")
    if args.quick:
        args.step_seconds, args.max_steps, args.start_pps = 0.5, 1, 2000
    args.step_seconds = min(args.step_seconds, 10.0)
    args.max_steps = min(args.max_steps, 10)
    started = time.monotonic()
    print(
        f"SRT at zero loss on loopback, raw TS in 1316-byte messages, SRT latency {LATENCY_MS} ms; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"{'path':<22} {'target':>8} {'in pps':>8} {'sent':>7} {'recv':>7} {'miss':>6} {'cc':>5} {'rcvbuf':>6} "
        f"{'drain':>5} {'cpu us':>7}",
        flush=True,
    )
    rows: list[tuple[str, Step | None, Step | None]] = []
    with tempfile.TemporaryDirectory(prefix="mp-bench-srt-") as tmp_name:
        tmp = Path(tmp_name)
        config_dir = tmp / "edge"
        config_dir.mkdir(mode=0o700)
        sink = SinkChild()
        try:
            with running_edge(config_dir, tmp / "edge.log") as (url, edge_pid):
                bench = Bench(url, edge_pid, sink, slt, tmp, args.step_seconds)
                plan = (
                    (PATHS[0], bench.path_srt_to_udp_edge, "rx"),  # the edge receives SRT
                    (PATHS[1], bench.path_udp_to_srt_edge, "tx"),  # the edge sends SRT
                )
                for name, ours_path, role in plan:
                    ours = search(f"{name} mp-edge", lambda pps, p=ours_path: bench.step(p, pps), args)  # type: ignore[misc]
                    theirs = search(f"{name} slt", lambda pps, r=role: bench.step(lambda: bench.path_slt(r), pps), args)  # type: ignore[misc]
                    rows.append((name, ours, theirs))
        finally:
            sink.close()
    print()
    print(render(rows))
    print(
        "slt: srt-live-transmit in mp-edge's place (udp->srt caller into srt->udp listener); "
        "ratio: ours / slt pkt/s at zero loss"
    )
    print(
        "CPU us/pkt: CPU of the box under test per datagram (mp-edge and its worker, or the one srt-live-transmit "
        "in its place)"
    )
    print(f"run took {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
