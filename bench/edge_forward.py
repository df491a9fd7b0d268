"""Edge forwarding rate at zero loss: 1 RTP input to 1 and to 4 RTP outputs, on loopback.

    python -m bench.edge_forward [--step-seconds 2.5] [--max-steps 6] [--start-pps 10000]

Starts the real ``mp-edge`` (``.venv/bin/mp-edge``, one worker, a temporary config dir, a free
port), creates the flow through ``POST /api/v1/flows``, and searches the highest input rate at
which every sink received every datagram: doubling from ``--start-pps`` until a step loses, then
bisecting, each step ``--step-seconds`` long (whole run about a minute). Per step it prints the
generator's achieved rate, what each sink received and lost (by RTP sequence), the edge's
output-queue drops, the sink-side latency p50/p99 (send time in the payload to kernel receive
time at the sink), and the change of ``RcvbufErrors`` in ``/proc/net/snmp`` (a socket buffer
overflow anywhere on the host: the edge input, a sink). A step where the generator fell short
of 90% of the target is reported as generator-limited and ends the search upwards.

It also prints the CPU time the mp-edge process tree spent per input datagram (from
/proc/<pid>/stat), which a busy shared host moves much less than the rates.

The sinks run in one child process (``--sink-child``) so that they do not share a GIL with the
generator. Everything binds 127.0.0.1; nothing is left running at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.tools.procfs import tree_cpu_seconds as tree_cpu_seconds  # also imported from here

BIN = Path(sys.executable).parent
# Datagrams still arriving this long after the generator stopped mean a standing backlog (the
# 32 MiB input buffer holds ~14,000 datagrams: seconds of data at these rates).
MAX_DRAIN_S = 0.5
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- sink child


def sink_child(count: int) -> None:
    """Child mode: ``count`` sinks on 127.0.0.1; stdin takes ``reset`` / ``report`` / ``quit``."""
    from bench.tools.rtpsink import RtpSink

    def fresh(old: list[RtpSink] | None) -> list[RtpSink]:
        socks = [s.sock for s in old] if old else [None] * count
        sinks = []
        for index, sock in enumerate(socks):
            sinks.append(RtpSink(("127.0.0.1", 0), sock=sock, seconds=1e9, latency=index == 0))
        return sinks

    sinks = fresh(None)
    print(json.dumps({"ports": [s.address[1] for s in sinks]}), flush=True)
    socks = [s.sock for s in sinks]
    while True:
        readable, _, _ = select.select([sys.stdin, *socks], [], [], 0.05)
        for sink in sinks:
            sink.poll()
        if sys.stdin in readable:
            command = sys.stdin.readline().strip()
            if command in ("quit", ""):
                return
            if command == "reset":
                for sink in sinks:
                    sink.poll()  # anything late from the previous step is discarded with it
                sinks = fresh(sinks)
                print(json.dumps({"reset": True}), flush=True)
            elif command == "report":
                reports = []
                for sink in sinks:
                    report = sink.report(0.0)
                    reports.append(
                        {
                            "received": report.received,
                            "lost": report.lost,
                            "reordered": report.reordered,
                            "duplicated": report.duplicated,
                            "latency_ms": report.latency_ms,
                        }
                    )
                print(json.dumps({"sinks": reports}), flush=True)


class JsonLineChild:
    """A helper process of the bench that answers each stdin line with one JSON line."""

    def __init__(self, module: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _read(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not readable:
            raise RuntimeError("the sink child did not answer")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the sink child exited with {self.process.poll()}")
        return dict(json.loads(line))

    def command(self, text: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


class SinkChild(JsonLineChild):
    def __init__(self, count: int) -> None:
        super().__init__("bench.edge_forward", "--sink-child", str(count))
        self.ports: list[int] = self._read()["ports"]


# ---------------------------------------------------------------------------- edge


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def udp_counters() -> dict[str, int]:
    """The ``Udp:`` line of /proc/net/snmp as a dict."""
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Udp:")]
    return dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=True))


@contextlib.contextmanager
def running_edge(
    config_dir: Path,
    log_path: Path,
    *,
    timeout_s: float = 60.0,
    ready: Callable[[int], object] | None = None,
) -> Iterator[tuple[str, int]]:
    """``mp-edge --workers 1`` on a free loopback port; yields its base URL and pid.

    Ready once ``/health`` answers and ``ready(pid)`` (when given) is true. At
    ``--log-level info`` the per-request access log is off, so REST load does not also
    measure log writing. On exit: SIGTERM, then SIGKILL to its session (the edge and
    its worker only).
    """
    import httpx

    port = free_port()
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                str(BIN / "mp-edge"),
                "--config-dir",
                str(config_dir),
                "--listen-addr",
                "127.0.0.1",
                "--listen-port",
                str(port),
                "--workers",
                "1",
                "--log-level",
                "info",
                # Extra mp-edge flags for an experiment (e.g. "--no-pin-cpus --worker-nice 0").
                *os.environ.get("MPB_EDGE_ARGS", "").split(),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mp-edge exited with {process.returncode}; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200 and (ready is None or ready(process.pid)):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"mp-edge did not answer /health in {timeout_s:g} s; see {log_path}")
            time.sleep(0.1)
        yield url, process.pid
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


# ---------------------------------------------------------------------------- search


@dataclass
class Step:
    target_pps: float
    sent: int
    achieved_pps: float
    received: list[int]
    lost: list[int]
    edge_dropped: int
    rcvbuf_errors: int
    latency_ms: dict[str, float]
    drain_s: float  # how long datagrams kept arriving after the generator stopped
    edge_cpu_s: float  # CPU the mp-edge process tree used during the step (and its drain)

    @property
    def cpu_us_per_packet(self) -> float:
        """Edge CPU per input datagram: a figure the other loads on the host barely move."""
        return self.edge_cpu_s / self.sent * 1e6 if self.sent else float("nan")

    @property
    def lossless(self) -> bool:
        return self.sent > 0 and all(r == self.sent for r in self.received) and not any(self.lost)

    @property
    def clean(self) -> bool:
        """Lossless and no standing backlog: a rate the edge only survived on buffers is not kept up."""
        return self.lossless and self.drain_s <= MAX_DRAIN_S

    @property
    def generator_limited(self) -> bool:
        return self.achieved_pps < 0.9 * self.target_pps


def run_step(
    url: str, edge_pid: int, sinks: SinkChild, input_port: int, pps: float, seconds: float, first_sequence: int
) -> Step:
    import httpx

    from bench.tools.rtpgen import RtpGenerator

    sinks.command("reset")
    dropped_before = _edge_dropped(httpx.get(url + "/api/v1/stats/f1", timeout=10).json())
    before = udp_counters()
    cpu_before = tree_cpu_seconds(edge_pid)
    with RtpGenerator(("127.0.0.1", input_port), pps=pps, seconds=seconds, first_sequence=first_sequence) as gen:
        report = gen.run()
    sink_reports, drain_s = _wait_drained(sinks)
    after = udp_counters()
    edge_cpu_s = tree_cpu_seconds(edge_pid) - cpu_before
    dropped_after = _edge_dropped(httpx.get(url + "/api/v1/stats/f1", timeout=10).json())
    return Step(
        target_pps=pps,
        sent=report.sent,
        achieved_pps=report.sent / max(report.seconds, 1e-9),
        received=[s["received"] for s in sink_reports],
        lost=[s["lost"] for s in sink_reports],
        edge_dropped=dropped_after - dropped_before,
        rcvbuf_errors=after["RcvbufErrors"] - before["RcvbufErrors"],
        latency_ms=sink_reports[0]["latency_ms"],
        drain_s=drain_s,
        edge_cpu_s=edge_cpu_s,
    )


def _wait_drained(sinks: SinkChild, limit_s: float = 6.0) -> tuple[list[dict[str, Any]], float]:
    """Poll the sinks until their counts stop moving for 0.3 s; (reports, seconds it took)."""
    started = time.monotonic()
    last_total, last_change = -1, started
    while True:
        reports: list[dict[str, Any]] = sinks.command("report")["sinks"]
        total = sum(r["received"] for r in reports)
        now = time.monotonic()
        if total != last_total:
            last_total, last_change = total, now
        elif now - last_change >= 0.3 or now - started >= limit_s:
            return reports, last_change - started
        time.sleep(0.1)


def _edge_dropped(body: Any) -> int:
    """Sum of ``packets_dropped`` over the outputs in a stats answer (shape-tolerant)."""
    total = 0
    stack = [body]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "packets_dropped" and isinstance(value, int):
                    total += value
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _print_step(outputs: int, step: Step) -> None:
    received = "/".join(str(r) for r in step.received)
    lost = sum(max(0, step.sent - r) for r in step.received)  # missing datagrams over all sinks
    latency = step.latency_ms
    verdict = "clean" if step.clean else ("BACKLOG" if step.lossless else "LOSS")
    if step.generator_limited:
        verdict += " (generator-limited)"
    print(
        f"{outputs:>3} {step.target_pps:>9,.0f} {step.achieved_pps:>9,.0f} {step.sent:>8} {received:>29} "
        f"{lost:>6} {step.edge_dropped:>6} {step.rcvbuf_errors:>8} "
        f"{latency.get('p50', float('nan')):>7.2f} {latency.get('p99', float('nan')):>7.2f} {step.drain_s:>6.2f} "
        f"{step.cpu_us_per_packet:>7.1f}  "
        f"{verdict}",
        flush=True,
    )


def search(url: str, edge_pid: int, outputs: int, args: argparse.Namespace, sequence: list[int]) -> Step | None:
    """Double until loss (or the generator's limit), then bisect; the best clean step."""
    import httpx

    sinks = SinkChild(outputs)
    try:
        input_port = free_port(socket.SOCK_DGRAM)
        flow = {
            "id": "f1",
            "name": "bench",
            "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{input_port}"},
            "outputs": [
                {"type": "rtp", "id": f"o{k + 1}", "name": f"o{k + 1}", "dest_addr": f"127.0.0.1:{port}"}
                for k, port in enumerate(sinks.ports)
            ],
        }
        answer = httpx.post(url + "/api/v1/flows", json=flow, timeout=30)
        if answer.status_code != 200:
            raise RuntimeError(f"POST /api/v1/flows answered {answer.status_code}: {answer.text}")
        time.sleep(0.5)  # the worker binds the input
        best: Step | None = None
        low, high = 0.0, None
        pps = float(args.start_pps)
        for _ in range(args.max_steps):
            step = run_step(url, edge_pid, sinks, input_port, pps, args.step_seconds, sequence[0])
            sequence[0] = (sequence[0] + step.sent + 1000) & 0xFFFF
            _print_step(outputs, step)
            if step.clean:
                if best is None or step.achieved_pps > best.achieved_pps:
                    best = step
                low = pps
                if step.generator_limited:
                    break  # the sender, not the edge, is the limit here
            else:
                high = pps
            if high is None:
                pps = min(pps * 2, args.max_pps)
                if low >= args.max_pps:
                    break
            else:
                if high - low <= max(0.1 * low, 2000):
                    break
                pps = (low + high) / 2 if low else high / 2
        httpx.delete(url + "/api/v1/flows/f1", timeout=30)
        return best
    finally:
        sinks.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.edge_forward", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--step-seconds", type=float, default=2.5)
    parser.add_argument("--max-steps", type=int, default=6, help="per output count")
    parser.add_argument("--start-pps", type=float, default=10000)
    parser.add_argument("--max-pps", type=float, default=400000)
    parser.add_argument("--outputs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--sink-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sink_child is not None:
        sink_child(args.sink_child)
        return
    args.step_seconds = min(args.step_seconds, 10.0)
    args.max_steps = min(args.max_steps, 12)
    started = time.monotonic()
    print(f"mp-edge forwarding, RTP 1328-byte datagrams on loopback; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{'out':>3} {'target':>9} {'in pps':>9} {'sent':>8} {'received per sink':>29} "
        f"{'lost':>6} {'dropped':>6} {'rcvbuf':>8} {'p50 ms':>7} {'p99 ms':>7} {'drain':>6} {'cpu us':>7}"
    )
    results: dict[int, Step | None] = {}
    sequence = [0]
    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        config_dir = Path(tmp) / "edge"
        config_dir.mkdir(mode=0o700)
        with running_edge(config_dir, Path(tmp) / "edge.log") as (url, edge_pid):
            for outputs in args.outputs:
                results[outputs] = search(url, edge_pid, outputs, args, sequence)
    print()
    print(f"{'outputs':>7} {'in pkt/s at zero loss':>22} {'out pkt/s':>10} {'edge CPU us/in pkt':>19}")
    for outputs, best in results.items():
        if best is None:
            print(f"{outputs:>7} {'none clean':>22}")
        else:
            limited = " (generator-limited)" if best.generator_limited else ""
            print(
                f"{outputs:>7} {best.achieved_pps:>22,.0f} {best.achieved_pps * outputs:>10,.0f} "
                f"{best.cpu_us_per_packet:>19.1f}{limited}"
            )
    print("edge CPU us/in pkt: CPU of mp-edge and its worker per input datagram; 1e6 / it = one core's ceiling")
    print(f"run took {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
