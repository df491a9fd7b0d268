"""What every scenario shares: options, table rows, forwarding targets (the edge and its peers),
the zero-loss rate search, and /proc readers for CPU and memory.

A *target* is anything that takes RTP on one loopback UDP port and forwards it to N sink ports:
a flow of the real ``mp-edge`` (created through its REST API), ``srt-live-transmit``, ``socat``
or a GStreamer pipeline. Every target is driven by the same generator (``bench.tools.rtpgen``)
and counted by the same sinks (``bench.tools.rtpsink`` in a child process, by RTP sequence), so
their figures are comparable in one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.edge_forward import (
    SinkChild,
    _edge_dropped,
    free_port,
    running_edge,
    udp_counters,
)
from bench.tools.procfs import ENGINE_WORKER, descendant, process_tree, tree_cpu_seconds, udp_table

REPO = Path(__file__).resolve().parents[2]
TS_BYTES = 1316  # TS payload of one datagram (7 x 188)
DATAGRAM_BYTES = TS_BYTES + 12  # with the RTP header
RCVBUF = 32 * 1024 * 1024  # what the edge asks for on its input (engine/udp.py); peers get the same ask


def ts_mbps(pps: float) -> float:
    """Mbit/s of MPEG-TS carried at ``pps`` datagrams per second (RTP header not counted)."""
    return pps * TS_BYTES * 8 / 1e6


def pps_for_ts_mbps(mbps: float) -> float:
    return mbps * 1e6 / (TS_BYTES * 8)


# ---------------------------------------------------------------------------- options and rows


@dataclass
class Options:
    quick: bool = False
    step_seconds: float = 2.0
    max_steps: int = 7
    start_pps: float = 20000.0
    max_pps: float = 400000.0
    rounds: int = 2
    resolution: float = 0.05  # a search stops when its bracket is this narrow (relative)
    profile: bool = True
    profile_seconds: float = 4.0
    flows: int = 50
    # Scenario 3's flow counts on one worker (the first is the issue's 50, the reference figure).
    multiflow_counts: tuple[int, ...] = (50, 100, 200)
    multiflow_seconds: float = 60.0
    latency_seconds: float = 5.0
    isolation_seconds: float = 10.0
    ws_clients: int = 50
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    # Quick mode starts one edge for every scenario (an edge start costs seconds on a busy host).
    shared_edge: tuple[str, int] | None = None
    # Figures one scenario hands to a later one (scenario 1's peak drives 4 and 5).
    shared: dict[str, Any] = field(default_factory=dict)
    # Everything measured, for --json and bench/README.md.
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def quick_options(cls, workdir: Path) -> Options:
        return cls(
            quick=True,
            step_seconds=0.5,
            max_steps=1,
            start_pps=5000.0,
            rounds=1,
            profile=False,
            flows=3,
            multiflow_counts=(3, 6),
            multiflow_seconds=1.0,
            latency_seconds=1.0,
            isolation_seconds=1.0,
            ws_clients=5,
            workdir=workdir,
        )


@dataclass
class Row:
    """One line of the table. ``met`` is None where the scenario has no goal (or could not run)."""

    number: str
    scenario: str
    ours: str
    peers: str = "-"
    ratio: str = "-"
    goal: str = "-"
    met: bool | None = None

    @property
    def verdict(self) -> str:
        return {True: "yes", False: "NO", None: "-"}[self.met]


def log(text: str) -> None:
    """Progress lines go to stderr; the table goes to stdout."""
    print(text, file=sys.stderr, flush=True)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# ---------------------------------------------------------------------------- /proc readers


def udp_port_bound(port: int) -> bool:
    """Whether some socket on this host is bound to UDP ``port`` (IPv4 or IPv6)."""
    needle = f":{port:04X} "
    return any(needle in fields[1] + " " for fields in udp_table())


def wait_udp_bound(port: int, process: subprocess.Popen[bytes] | None = None, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not udp_port_bound(port):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode} before binding UDP {port}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing bound UDP port {port} within {timeout} s")
        time.sleep(0.05)


def memory_kib(root: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB summed over ``root`` and its descendants. PSS shares common pages fairly."""
    rss = pss = 0
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
    return rss, pss


def worker_pid(edge_pid: int) -> int | None:
    """The engine worker (``python -m services.edge.engine.worker``) under ``edge_pid``."""
    return descendant(edge_pid, ENGINE_WORKER)


# ---------------------------------------------------------------------------- targets


class Target(Protocol):
    label: str

    def open(self, sink_ports: list[int]) -> int:
        """Start forwarding to ``sink_ports``; the UDP input port (bound when this returns)."""
        ...

    def dropped(self) -> int:
        """Datagrams the target itself counted as dropped so far (0 where it does not say)."""
        ...

    def cpu_seconds(self) -> float: ...

    def close(self) -> None: ...


class EdgeTarget:
    """One flow of a running ``mp-edge`` (RTP in, ``outputs`` RTP outputs), through the REST API."""

    def __init__(self, url: str, edge_pid: int, flow_id: str, label: str = "mediaplane") -> None:
        self.url = url
        self.edge_pid = edge_pid
        self.flow_id = flow_id
        self.label = label

    def open(self, sink_ports: list[int]) -> int:
        input_port = free_port(socket.SOCK_DGRAM)
        create_flow(self.url, self.flow_id, input_port, sink_ports)
        wait_udp_bound(input_port)
        return input_port

    def dropped(self) -> int:
        import httpx

        return _edge_dropped(httpx.get(f"{self.url}/api/v1/stats/{self.flow_id}", timeout=10).json())

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.edge_pid)

    def close(self) -> None:
        import httpx

        with contextlib.suppress(httpx.HTTPError):
            httpx.delete(f"{self.url}/api/v1/flows/{self.flow_id}", timeout=30)


def create_flow(url: str, flow_id: str, input_port: int, sink_ports: list[int]) -> None:
    import httpx

    flow = {
        "id": flow_id,
        "name": flow_id,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{input_port}"},
        "outputs": [
            {"type": "rtp", "id": f"o{k + 1}", "name": f"o{k + 1}", "dest_addr": f"127.0.0.1:{port}"}
            for k, port in enumerate(sink_ports)
        ],
    }
    answer = httpx.post(url + "/api/v1/flows", json=flow, timeout=30)
    if answer.status_code != 200:
        raise RuntimeError(f"POST /api/v1/flows answered {answer.status_code}: {answer.text}")


class ProcessTarget:
    """A peer tool as a subprocess; ``argv(input_port, sink_ports)`` builds its command line."""

    def __init__(self, label: str, argv: Callable[[int, list[int]], list[str]], log_dir: Path) -> None:
        self.label = label
        self._argv = argv
        self._log_path = log_dir / f"{label.replace(' ', '_').replace('/', '_')}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def open(self, sink_ports: list[int]) -> int:
        input_port = free_port(socket.SOCK_DGRAM)
        with self._log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                self._argv(input_port, sink_ports),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_udp_bound(input_port, self.process)
        time.sleep(0.2)  # bound is not yet reading (GStreamer goes to PLAYING after binding)
        return input_port

    def dropped(self) -> int:
        return 0

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.process.pid) if self.process else 0.0

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # gst-launch and srt-live-transmit exit cleanly on it
            try:
                self.process.wait(3)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None


class DirectTarget:
    """No forwarder: the generator sends straight to the sink (the latency baseline)."""

    label = "direct (no forwarder)"

    def open(self, sink_ports: list[int]) -> int:
        return sink_ports[0]

    def dropped(self) -> int:
        return 0

    def cpu_seconds(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def srt_live_transmit_argv(input_port: int, sink_ports: list[int]) -> list[str]:
    # UDP medium options of srt-live-transmit 1.5: rcvbuf on the source. -q: no per-packet chatter.
    return [
        "srt-live-transmit",
        "-q",
        f"udp://127.0.0.1:{input_port}?rcvbuf={RCVBUF}",
        f"udp://127.0.0.1:{sink_ports[0]}",
    ]


def socat_argv(input_port: int, sink_ports: list[int]) -> list[str]:
    return [
        "socat",
        "-u",
        "-b",
        "2048",
        f"UDP4-RECV:{input_port},bind=127.0.0.1,rcvbuf={RCVBUF}",
        f"UDP4-SENDTO:127.0.0.1:{sink_ports[0]}",
    ]


def gstreamer_argv(input_port: int, sink_ports: list[int]) -> list[str]:
    # udpsrc ! tee ! udpsink x N, as the issue names it: no queues, so every branch runs in the
    # source's streaming thread (a queue per branch adds a thread and a copy per packet).
    argv = [
        "gst-launch-1.0",
        "-q",
        "udpsrc",
        "address=127.0.0.1",
        f"port={input_port}",
        f"buffer-size={RCVBUF}",
        "!",
        "tee",
        "name=t",
    ]
    for port in sink_ports:
        argv += ["t.", "!", "udpsink", "host=127.0.0.1", f"port={port}", "sync=false", "async=false"]
    return argv


# ---------------------------------------------------------------------------- steps and the search


def udp_sockets() -> dict[int, tuple[int, int]]:
    """Local UDP port -> (bytes queued for reading, datagrams the kernel dropped on that socket).

    The per-socket ``drops`` column of /proc/net/udp counts receive-buffer overflows: a datagram
    dropped there *reached* that socket, so at a sink it was delivered by the forwarder (the
    sink was slow), and at a forwarder's input it is the forwarder's loss.
    """
    sockets: dict[int, tuple[int, int]] = {}
    for fields in udp_table():
        port = int(fields[1].rsplit(":", 1)[1], 16)
        rx_queue = int(fields[4].split(":")[1], 16)
        queued, drops = sockets.get(port, (0, 0))
        sockets[port] = (queued + rx_queue, drops + int(fields[12]))
    return sockets


class Sequence:
    """RTP sequence numbers carried on from step to step (a forwarder sees one continuing stream)."""

    def __init__(self) -> None:
        self.next = 0

    def advance(self, sent: int) -> None:
        self.next = (self.next + sent + 1000) & 0xFFFF


@dataclass
class Step:
    """One fixed-rate step through one target.

    ``delivered[i]``: datagrams that reached sink socket i = read by the sink (counted by RTP
    sequence) + dropped by the kernel on the sink's own socket (the sink, not the forwarder, was
    slow). ``missing`` = sent - delivered, summed over sinks: what the forwarder lost.
    ``drain_s``: how long the forwarder's input socket still held datagrams after the generator
    stopped; more than ``MAX_DRAIN_S`` is a standing backlog (kept up only on buffers).
    """

    target_pps: float
    sent: int
    seconds: float
    received: list[int]
    sink_drops: list[int]
    seq_lost: list[int]
    reordered: list[int]
    forwarder_dropped: int
    input_drops: int
    rcvbuf_errors: int
    latency_ms: dict[str, float]
    drain_s: float
    cpu_s: float

    @property
    def achieved_pps(self) -> float:
        return self.sent / max(self.seconds, 1e-9)

    @property
    def delivered(self) -> list[int]:
        return [r + d for r, d in zip(self.received, self.sink_drops, strict=True)]

    @property
    def missing(self) -> int:
        return sum(max(0, self.sent - d) for d in self.delivered)

    @property
    def lossless(self) -> bool:
        return self.sent > 0 and self.missing == 0

    @property
    def clean(self) -> bool:
        return self.lossless and self.drain_s <= MAX_DRAIN_S

    @property
    def generator_limited(self) -> bool:
        return self.achieved_pps < 0.9 * self.target_pps

    @property
    def cpu_us_per_packet(self) -> float:
        return self.cpu_s / self.sent * 1e6 if self.sent else float("nan")


MAX_DRAIN_S = 0.5
SINK_SETTLE_LIMIT_S = 10.0  # 16 sinks in one Python process can trail the forwarder by seconds


def _wait_input_drained(port: int, limit_s: float = 6.0) -> float:
    """Seconds until the forwarder's input socket is empty (``limit_s`` when it never empties)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if udp_sockets().get(port, (0, 0))[0] == 0:
            return time.monotonic() - started
        time.sleep(0.02)
    return limit_s


def _wait_sinks(sinks: SinkChild, sink_ports: list[int]) -> list[dict[str, Any]]:
    """Sink reports once every sink socket is empty and the counts stopped moving for 0.2 s."""
    started = time.monotonic()
    last_total, last_change = -1, started
    while True:
        reports: list[dict[str, Any]] = sinks.command("report")["sinks"]
        total = sum(r["received"] for r in reports)
        now = time.monotonic()
        if total != last_total:
            last_total, last_change = total, now
        queued = udp_sockets()
        empty = all(queued.get(port, (0, 0))[0] == 0 for port in sink_ports)
        if (empty and now - last_change >= 0.2) or now - started >= SINK_SETTLE_LIMIT_S:
            return reports
        time.sleep(0.05)


def run_step(
    target: Target,
    sinks: SinkChild,
    input_port: int,
    pps: float,
    seconds: float,
    sequence: Sequence,
    *,
    during: Callable[[], None] | None = None,
) -> Step:
    """Send ``seconds`` of RTP at ``pps`` through ``target``; count what reached every sink.

    ``during`` runs right before the generator starts (to start a profiler, say).
    """
    from bench.tools.rtpgen import RtpGenerator

    sink_ports = sinks.ports
    sinks.command("reset")
    dropped_before = target.dropped()
    before = udp_counters()
    kernel_before = udp_sockets()
    cpu_before = target.cpu_seconds()
    if during is not None:
        during()
    with RtpGenerator(("127.0.0.1", input_port), pps=pps, seconds=seconds, first_sequence=sequence.next) as gen:
        report = gen.run()
    sequence.advance(report.sent)
    drain_s = _wait_input_drained(input_port) if input_port not in sink_ports else 0.0
    cpu_s = target.cpu_seconds() - cpu_before
    reports = _wait_sinks(sinks, sink_ports)
    kernel_after = udp_sockets()
    after = udp_counters()

    def drops(port: int) -> int:
        return kernel_after.get(port, (0, 0))[1] - kernel_before.get(port, (0, 0))[1]

    return Step(
        target_pps=pps,
        sent=report.sent,
        seconds=report.seconds,
        received=[r["received"] for r in reports],
        sink_drops=[drops(port) for port in sink_ports],
        seq_lost=[r["lost"] for r in reports],
        reordered=[r["reordered"] for r in reports],
        forwarder_dropped=target.dropped() - dropped_before,
        input_drops=drops(input_port) if input_port not in sink_ports else 0,
        rcvbuf_errors=after["RcvbufErrors"] - before["RcvbufErrors"],
        latency_ms=reports[0]["latency_ms"],
        drain_s=drain_s,
        cpu_s=cpu_s,
    )


def step_line(label: str, step: Step) -> str:
    verdict = "clean" if step.clean else ("BACKLOG" if step.lossless else "LOSS")
    if step.generator_limited:
        verdict += " (generator-limited)"
    p99 = step.latency_ms.get("p99", float("nan"))
    return (
        f"  {label:<20} target {step.target_pps:>8,.0f} sent {step.achieved_pps:>8,.0f}/s "
        f"missing {step.missing:>6} (input drops {step.input_drops}, own drops {step.forwarder_dropped}) "
        f"sink drops {sum(step.sink_drops):>5} drain {step.drain_s:4.2f}s p99 {p99:6.2f}ms "
        f"cpu {step.cpu_us_per_packet:5.1f}us/pkt  {verdict}"
    )


@dataclass
class SearchResult:
    label: str
    best: Step | None
    steps: list[Step]

    @property
    def pps(self) -> float:
        """The best clean rate: the step's target (targets share one grid, so equal steps tie
        exactly), or what the generator achieved when it fell short of the target."""
        if self.best is None:
            return 0.0
        return self.best.achieved_pps if self.best.generator_limited else self.best.target_pps

    @property
    def generator_limited(self) -> bool:
        return bool(self.best and self.best.generator_limited)

    def merged(self, other: SearchResult) -> SearchResult:
        """The better of two rounds (the highest clean rate seen), with every step kept."""
        best = self.best if self.pps >= other.pps else other.best
        return SearchResult(self.label, best, self.steps + other.steps)


def search(
    target: Target,
    sinks: SinkChild,
    input_port: int,
    opts: Options,
    sequence: Sequence,
    start_pps: float | None = None,
    deadline: float = float("inf"),
) -> SearchResult:
    """Double from ``start_pps`` until a step is not clean (loss or backlog), then bisect.

    Bounded by ``opts.max_steps`` steps of ``opts.step_seconds``. A clean step where the generator
    fell short of 90 % of its target ends the climb: beyond it the sender is the limit.
    """
    best: Step | None = None
    steps: list[Step] = []
    low, high = 0.0, None
    pps = start_pps or opts.start_pps
    for _ in range(opts.max_steps):
        if time.monotonic() > deadline:
            log(f"  {target.label}: time budget spent, search stopped at {len(steps)} steps")
            break
        step = run_step(target, sinks, input_port, pps, opts.step_seconds, sequence)
        steps.append(step)
        log(step_line(target.label, step))
        if step.clean:
            if best is None or step.target_pps > best.target_pps:
                best = step
            low = max(low, pps)
            if step.generator_limited:
                break
        else:
            high = pps if high is None else min(high, pps)
        if high is None:
            if pps >= opts.max_pps:
                break
            pps = min(pps * 2, opts.max_pps)
        else:
            if high - low <= max(opts.resolution * low, 1000):
                break
            pps = (low + high) / 2 if low else high / 2
    return SearchResult(target.label, best, steps)


@contextlib.contextmanager
def opened(target: Target, sink_ports: list[int]) -> Iterator[int]:
    port = target.open(sink_ports)
    try:
        yield port
    finally:
        target.close()


@contextlib.contextmanager
def start_edge(workdir: Path, name: str, workers: int = 1) -> Iterator[tuple[str, int]]:
    """``mp-edge --workers N`` (default 1) with a fresh config dir, ready once all its workers run;
    yields (url, pid)."""
    config_dir = Path(tempfile.mkdtemp(prefix=f"edge-{name}-", dir=workdir))
    config_dir.chmod(0o700)

    def ready(pid: int) -> bool:
        return len(worker_pids(pid)) >= workers

    with _edge_workers_arg(workers), running_edge(config_dir, workdir / f"edge-{name}.log", ready=ready) as started:
        yield started


@contextlib.contextmanager
def _edge_workers_arg(workers: int) -> Iterator[None]:
    """``running_edge`` (bench/edge_forward.py, shared with other benchmarks) always passes
    ``--workers 1``; its command line ends with ``$MPB_EDGE_ARGS``, and argparse keeps the last
    ``--workers``, so N workers are asked for there, only while the edge is spawned."""
    if workers == 1:
        yield
        return
    saved = os.environ.get("MPB_EDGE_ARGS")
    os.environ["MPB_EDGE_ARGS"] = f"{saved or ''} --workers {workers}".strip()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MPB_EDGE_ARGS", None)
        else:
            os.environ["MPB_EDGE_ARGS"] = saved


@contextlib.contextmanager
def edge(opts: Options, name: str, workers: int = 1) -> Iterator[tuple[str, int]]:
    """The run's shared edge (quick mode, one worker), else a fresh one with ``workers`` workers."""
    if opts.shared_edge is not None and workers == 1:
        yield opts.shared_edge
        return
    with start_edge(opts.workdir, name, workers) as started:
        yield started


def worker_pids(edge_pid: int) -> list[int]:
    """Every engine worker under ``edge_pid`` (their command lines name ``ENGINE_WORKER``)."""
    pids = []
    for pid in process_tree(edge_pid)[1:]:
        with contextlib.suppress(OSError):
            if ENGINE_WORKER in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
    return pids


def engine_workers(url: str) -> list[dict[str, Any]] | None:
    """``engine.workers`` of ``GET /api/v1/system/diagnostics`` (index, pid, flows, pps, busy or
    cpu, tick_ms), or None while the edge does not report it (older engine, error)."""
    import httpx

    try:
        answer = httpx.get(f"{url}/api/v1/system/diagnostics", timeout=10)
        workers = answer.json().get("engine", {}).get("workers") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return workers if isinstance(workers, list) else None


def cores() -> int:
    """The CPUs this process may run on (what the bench's processes and the edge share)."""
    return len(os.sched_getaffinity(0))


def machine() -> str:
    """Core count and load average, for every scenario's header line: figures on a shared host
    mean little without them."""
    return f"{cores()} cores, load average {load_average()}"


@contextlib.contextmanager
def sink_child(count: int) -> Iterator[SinkChild]:
    """``count`` RTP sinks in a child process (its own GIL), read when epoll says so."""
    from bench.scenarios.sinks import SinkProcess

    sinks: SinkChild = SinkProcess(count)
    try:
        yield sinks
    finally:
        sinks.close()


def fmt_pps(pps: float) -> str:
    return f"{pps / 1000:,.1f}k pkt/s"


def fmt_rate(result: SearchResult) -> str:
    if result.best is None:
        return f"{result.label}: none clean"
    limited = " (gen-limited)" if result.generator_limited else ""
    return (
        f"{fmt_pps(result.pps)} = {ts_mbps(result.pps):,.0f} Mbit/s{limited}, "
        f"{result.best.cpu_us_per_packet:.1f} us CPU/pkt"
    )


def ratio(ours: float, peer: float) -> str:
    return f"{ours / peer:.2f}x" if peer > 0 else "n/a"


def step_record(step: Step | None) -> dict[str, Any] | None:
    if step is None:
        return None
    return {
        "target_pps": round(step.target_pps),
        "achieved_pps": round(step.achieved_pps),
        "sent": step.sent,
        "received": step.received,
        "sink_drops": step.sink_drops,
        "missing": step.missing,
        "seq_lost": step.seq_lost,
        "input_drops": step.input_drops,
        "forwarder_dropped": step.forwarder_dropped,
        "rcvbuf_errors": step.rcvbuf_errors,
        "drain_s": round(step.drain_s, 3),
        "latency_ms": step.latency_ms,
        "cpu_us_per_packet": round(step.cpu_us_per_packet, 2),
        "clean": step.clean,
        "generator_limited": step.generator_limited,
    }


def dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))
