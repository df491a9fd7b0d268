"""The relay's data planes at zero loss on loopback: one QUIC tunnel, and the native UDP plane beside socat.

    python -m bench.relay [--quick] [--json PATH] [--keep DIR]

Two measurements, each a zero-loss rate search (the one of ``bench.scenarios.common``: 2 s steps,
double from 20k pkt/s until a step is not clean, then bisect to 5 %, at most 7 steps; each
target searched ``rounds`` times and its best clean step kept):

1. **UDP through one QUIC tunnel, payload encryption on** (interop.md 8.3, 10)::

       rtpgen --UDP--> egress TunnelRunner --QUIC--> mp-relay --QUIC--> ingress TunnelRunner --UDP--> sink

   Three processes under test, each its own: the real ``mp-relay`` (``--quic-addr``,
   ``--udp-addr``, ``--api-addr`` on free loopback ports, a config file that does not exist, so
   the built-in defaults) and two ``TunnelRunner`` children (this module's ``--runner-child``:
   ``TunnelRunner(TunnelConfig)`` under trio, its states and counters as JSON lines), with a
   ``tunnel_encryption_key`` set, a fresh tunnel id per search. A step is clean when every
   datagram reached the sink and no socket on the path (the egress runner's input, the relay's
   and both runners' QUIC sockets) still held data 0.5 s after the generator stopped: a process
   that keeps up only thanks to its socket buffer has not kept up. Figures: the highest clean
   rate in Mbit/s of TS (pps x 1316 x 8), and CPU us per packet summed over the three processes
   (``/proc/<pid>/stat``, from the generator's start until the path is empty), also per process.
   Goal (issue 16): >= 300 Mbit/s.
2. **The relay's native UDP plane against socat** (interop.md 9), alternating in one run. The
   native plane forwards ``[16-byte tunnel uuid][payload]`` between two latched addresses, so the
   generator sends that form (``RtpGenerator(prefix=uuid)``) from a socket registered as
   ``egress``, and the sink (this module's ``--sink-child``, ``RtpSink(skip=16)``) reads on a
   socket registered as ``ingress`` (``register`` sent from the very socket, ack awaited; again
   before every relay step, as an edge re-registers every 5 s). The same generator socket and
   the same sink are then pointed at ``socat -u -b 2048 UDP4-RECV:IN,bind=127.0.0.1,rcvbuf=32MiB
   UDP4-SENDTO:127.0.0.1:SINK`` (the scenario-1 peer), which forwards the same bytes. Figures:
   both zero-loss rates, their ratio (goal >= 1.0x socat), CPU us per packet of the ``mp-relay``
   process and of socat. mp-relay asks for 32 MiB socket buffers with ``SO_RCVBUFFORCE`` (root
   here); socat's ``rcvbuf`` is capped by ``net.core.rmem_max``.

The generator runs in this process, the sinks in child processes. The table goes to stdout (no
``|`` in it: ``python -m bench`` prints it after its own table), progress to stderr. ``--quick``
runs one half-second step per target (the smoke test; its figures mean nothing). Every load
loop is bounded in count and time; everything binds 127.0.0.1; the relay, the runners, socat and
the sinks are stopped on exit, an exception or Ctrl-C (and die with this process: PDEATHSIG).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.edge_forward import JsonLineChild, free_port, udp_counters
from bench.scenarios.common import (
    Options,
    ProcessTarget,
    SearchResult,
    Sequence,
    Step,
    _wait_input_drained,
    _wait_sinks,
    have,
    load_average,
    log,
    run_step,
    sink_child,
    socat_argv,
    step_line,
    step_record,
    ts_mbps,
    udp_sockets,
    wait_udp_bound,
)
from bench.tools.procfs import cpu_seconds, udp_ports_of

REPO: Final = Path(__file__).resolve().parents[1]
BIN: Final = Path(sys.executable).parent
GOAL_MBPS: Final = 300.0
GOAL_RATIO: Final = 1.0
# A bench-only key (interop.md 10 test-vector material), never a deployment's.
BENCH_KEY: Final = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
PREFIX_LEN: Final = 16
CONNECT_TIMEOUT_S: Final = 30.0
REGISTER_TIMEOUT_S: Final = 3.0
CHAIN_DRAIN_LIMIT_S: Final = 6.0
MAX_DRAIN_S: Final = 0.5  # as in bench.scenarios.common
QUIC_START_PPS: Final = 5000.0  # ~53 Mbit/s; the search doubles from here (or halves)
WARM_UP_PPS: Final = 1000.0  # one second on each fresh tunnel before its search: past slow start
QUIC_BUDGET_S: Final = 120.0  # search budgets, so a full run stays near 5 minutes
NATIVE_BUDGET_S: Final = 160.0
ROW_NAMES: Final = ("quic", "native", "socat")
_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the bench dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 5 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# ---------------------------------------------------------------------------- mp-relay


@dataclass
class Relay:
    """A running ``mp-relay``."""

    process: subprocess.Popen[bytes]
    quic_port: int
    udp_port: int
    api_port: int

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def running_relay(workdir: Path, name: str) -> Iterator[Relay]:
    """``mp-relay`` on free loopback ports with built-in defaults; stopped on exit."""
    quic_port, udp_port, api_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM), free_port()
    log_path = workdir / f"relay-{name}.log"
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            [
                str(BIN / "mp-relay"),
                "--config",
                str(workdir / f"relay-{name}-absent.json"),
                "--quic-addr",
                f"127.0.0.1:{quic_port}",
                "--udp-addr",
                f"127.0.0.1:{udp_port}",
                "--api-addr",
                f"127.0.0.1:{api_port}",
                "--log-level",
                "warning",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the bench, which stops it
            preexec_fn=_die_with_parent,
        )
    relay = Relay(process, quic_port, udp_port, api_port)
    try:
        wait_udp_bound(quic_port, process, timeout=30)
        wait_udp_bound(udp_port, process, timeout=30)
        log(f"mp-relay pid {process.pid}: quic {quic_port}, udp {udp_port}, api {api_port}")
        yield relay
    finally:
        stop_process(process)
        if process.returncode not in (0, -signal.SIGTERM):
            log(f"mp-relay exited with {process.returncode}: {log_path.read_text(errors='replace')[-1500:]}")


# ---------------------------------------------------------------------------- TunnelRunner children


def runner_child(config_json: str) -> None:
    """Child mode: run one ``TunnelRunner``; print its states; stdin ``counters`` / ``quit``."""
    import trio

    from appliance.models.config import TunnelConfig
    from services.edge.tunnels.runner import TunnelRunner

    tunnel = TunnelConfig.model_validate_json(config_json)

    def emit(obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    async def serve() -> None:
        runner = TunnelRunner(
            tunnel,
            edge_id=f"bench-{tunnel.direction}",
            software_version="bench",
            on_state=lambda state, reason: emit({"state": state, "reason": reason}),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                command = line.strip()
                if command in ("", "quit"):  # EOF: the bench is gone
                    break
                if command == "counters":
                    carrier = runner._carrier  # the QUIC connection's own queue drops (appliance.quic)
                    queue_dropped = carrier.connection.datagrams_dropped if carrier is not None else 0
                    emit({"counters": asdict(runner.counters) | {"quic_queue_dropped": queue_dropped}})
            nursery.cancel_scope.cancel()

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


class RunnerChild:
    """One ``--runner-child`` process."""

    def __init__(self, config: dict[str, Any], log_path: Path) -> None:
        self.direction = str(config["direction"])
        self.state = "?"
        self.reason: str | None = None
        with log_path.open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.relay", "--runner-child", json.dumps(config)],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._buffer = b""  # read with os.read: a buffered reader would hide lines from select()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _line(self, timeout: float) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            fd = self.process.stdout.fileno()
            readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the {self.direction} runner exited with {self.process.poll()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        obj = dict(json.loads(line))
        if "state" in obj:
            self.state, self.reason = obj["state"], obj["reason"]
        return obj

    def wait_state(self, state: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.state != state:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.direction} runner is {self.state} ({self.reason}), not {state}")
            self._line(deadline - time.monotonic())

    def counters(self) -> dict[str, int]:
        assert self.process.stdin is not None
        self.process.stdin.write(b"counters\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            obj = self._line(deadline - time.monotonic())
            if obj is not None and "counters" in obj:
                return dict(obj["counters"])
        raise RuntimeError(f"the {self.direction} runner did not report its counters")

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.process.stdin is not None
            self.process.stdin.write(b"quit\n")
            self.process.stdin.flush()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            stop_process(self.process)


class QuicTunnelTarget:
    """generator -> egress runner -> mp-relay -> ingress runner -> sink (a ``Target``)."""

    label = "QUIC tunnel"

    def __init__(self, relay: Relay, workdir: Path) -> None:
        self.relay = relay
        self.workdir = workdir
        self.egress: RunnerChild | None = None
        self.ingress: RunnerChild | None = None
        self.path_ports: dict[int, str] = {}  # UDP port on the path -> the process holding it

    def pids(self) -> dict[str, int]:
        found = {"egress": self.egress, "relay": None, "ingress": self.ingress}
        return {
            name: (self.relay.pid if name == "relay" else child.pid if child else 0) for name, child in found.items()
        }

    def open(self, sink_ports: list[int]) -> int:
        tunnel_id = str(uuid.uuid4())
        input_port = free_port(socket.SOCK_DGRAM)
        common = {
            "id": tunnel_id,
            "protocol": "udp",
            "mode": "relay",
            "relay_addr": f"127.0.0.1:{self.relay.quic_port}",
            "tunnel_encryption_key": BENCH_KEY,
        }
        try:
            self.ingress = RunnerChild(
                {**common, "name": "bench-ingress", "direction": "ingress", "local_addr": f"127.0.0.1:{sink_ports[0]}"},
                self.workdir / "runner-ingress.log",
            )
            self.egress = RunnerChild(
                {**common, "name": "bench-egress", "direction": "egress", "local_addr": f"127.0.0.1:{input_port}"},
                self.workdir / "runner-egress.log",
            )
            self.ingress.wait_state("Connected", CONNECT_TIMEOUT_S)
            self.egress.wait_state("Connected", CONNECT_TIMEOUT_S)
            wait_udp_bound(input_port, self.egress.process)
        except BaseException:
            self.close()
            raise
        # Every UDP socket on the path: the egress input, the runners' and the relay's QUIC sockets.
        self.path_ports = {port: name for name, pid in self.pids().items() for port in udp_ports_of([pid])}
        log(f"  tunnel {tunnel_id} connected; path sockets (port: process) {self.path_ports}")
        return input_port

    def dropped(self) -> int:
        """Datagrams the runners counted as dropped (no carrier, or the oldest out of a full QUIC
        datagram queue: congestion-limited), replayed or failing the tag."""
        if self.egress is None or self.ingress is None:
            return 0
        egress, ingress = self.egress.counters(), self.ingress.counters()
        return int(
            egress["dropped"]
            + egress["quic_queue_dropped"]
            + ingress["dropped"]
            + ingress["replayed"]
            + ingress["decrypt_errors"]
        )

    def cpu_by_process(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids().items()}

    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_process().values())

    def close(self) -> None:
        for child in (self.egress, self.ingress):
            if child is not None:
                child.close()
        self.egress = self.ingress = None


class PathDrainWatch:
    """From the generator's planned end on, how long any socket on the path still held data, and the
    path's CPU time when it was last empty (a thread; sampling every 20 ms)."""

    def __init__(self, ports: dict[int, str], cpu: Callable[[], dict[str, float]], planned_s: float) -> None:
        self.ports = ports
        self.cpu = cpu
        self.started = time.monotonic()
        self.planned_end = self.started + planned_s
        self.last_busy = 0.0
        self.cpu_start = cpu()
        self.cpu_end: dict[str, float] | None = None
        self.drops_start = udp_sockets()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="path-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(max(0.0, self.planned_end - time.monotonic())):
            return
        limit = self.planned_end + 60.0  # bounded even if never stopped
        pending = True
        while not self._stop.is_set() and time.monotonic() < limit:
            sockets = udp_sockets()
            busy = any(sockets.get(port, (0, 0))[0] for port in self.ports)
            now = time.monotonic()
            if busy:
                self.last_busy, pending = now, True
            elif pending:
                self.cpu_end, pending = self.cpu(), False
            self._stop.wait(0.02)

    def finish(self, generator_seconds: float) -> tuple[float, dict[str, float]]:
        """Stop; (seconds the path held data after the generator's real end, CPU seconds per process).
        ``socket_drops``: receive-buffer overflows on the path's sockets meanwhile."""
        self._stop.set()
        self._thread.join(5)
        now = udp_sockets()
        self.socket_drops: dict[str, int] = {}
        for port, name in self.ports.items():
            dropped = now.get(port, (0, 0))[1] - self.drops_start.get(port, (0, 0))[1]
            self.socket_drops[name] = self.socket_drops.get(name, 0) + dropped
        end = self.started + generator_seconds
        drain = max(0.0, self.last_busy - end) if self.last_busy else 0.0
        cpu_end = self.cpu_end or self.cpu()
        return min(drain, CHAIN_DRAIN_LIMIT_S), {k: cpu_end[k] - self.cpu_start.get(k, 0.0) for k in cpu_end}


# ---------------------------------------------------------------------------- the native plane


def sink_child_main(relay_port: int, tunnel_id: str) -> None:
    """Child mode: one ``RtpSink(skip=16)``; stdin ``register`` / ``reset`` / ``report`` / ``quit``."""
    from bench.tools.rtpsink import RtpSink

    sink = RtpSink(("127.0.0.1", 0), seconds=1e9, skip=PREFIX_LEN)
    relay = ("127.0.0.1", relay_port)
    print(json.dumps({"ports": [sink.address[1]]}), flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin, sink.sock], [], [], 0.05)
        sink.poll()
        if sys.stdin not in readable:
            continue
        command = sys.stdin.readline().strip()
        if command in ("quit", ""):
            return
        if command == "register":
            ready = register(sink.sock, relay, tunnel_id, "ingress")
            print(json.dumps({"ack": ready is not None, "ready": bool(ready)}), flush=True)
        elif command == "reset":
            sink.poll()  # anything late from the previous step goes with the old counters
            sink = RtpSink(("127.0.0.1", 0), sock=sink.sock, seconds=1e9, skip=PREFIX_LEN)
            print(json.dumps({"reset": True}), flush=True)
        elif command == "report":
            sink.poll()
            r = sink.report(0.0)
            body = {"received": r.received, "lost": r.lost, "reordered": r.reordered, "latency_ms": r.latency_ms}
            print(json.dumps({"sinks": [body]}), flush=True)


class RegisteredSink(JsonLineChild):
    """``SinkChild``'s interface (ports, command, close) on the ``--sink-child`` above."""

    def __init__(self, relay_port: int, tunnel_id: str) -> None:
        super().__init__("bench.relay", "--sink-child", str(relay_port), tunnel_id)
        self.ports: list[int] = self._read(30.0)["ports"]


def register(sock: socket.socket, relay: tuple[str, int], tunnel_id: str, direction: str) -> bool | None:
    """Send a native ``register`` from ``sock`` and wait for the ack: its ``ready``, None without one.
    Media arriving meanwhile is dropped (nothing is sent between steps)."""
    from services.relay.native_plane import NIL_PREFIX, ControlError, Register, decode_ack, encode_register

    message = encode_register(Register(uuid.UUID(tunnel_id), direction, None))  # type: ignore[arg-type]
    with contextlib.suppress(BlockingIOError):
        for _ in range(1000):  # acks left from an earlier register must not answer this one
            sock.recv(4096, socket.MSG_DONTWAIT)
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    sock.sendto(message, relay)
    while (remaining := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], remaining)
        if not readable:
            break
        try:
            data = sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        if data[:PREFIX_LEN] == NIL_PREFIX:
            with contextlib.suppress(ControlError):
                return decode_ack(data).ready
    return None


class NativeBench:
    """The generator socket (registered as egress) and the sink child (ingress) of measurement 2."""

    def __init__(self, relay: Relay) -> None:
        from appliance.netio import set_socket_buffers

        self.relay = relay
        self.tunnel_id = str(uuid.uuid4())
        self.prefix = uuid.UUID(self.tunnel_id).bytes
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        set_socket_buffers(self.sock, sndbuf=4 * 1024 * 1024)
        self.sink = RegisteredSink(relay.udp_port, self.tunnel_id)

    def latch(self) -> None:
        """Both registers (sink first); raises unless the relay acks the second as ready."""
        for _ in range(3):
            self.sink.command("register")
            if register(self.sock, ("127.0.0.1", self.relay.udp_port), self.tunnel_id, "egress"):
                return
        raise RuntimeError("the relay did not latch the native session (no ready ack)")

    def step(self, dest_port: int, cpu: Callable[[], float], pps: float, seconds: float, sequence: Sequence) -> Step:
        """``run_step`` with this socket and the prefix: send, count, judge the same way."""
        from bench.tools.rtpgen import RtpGenerator

        sinks = self.sink
        sinks.command("reset")
        before, kernel_before, cpu_before = udp_counters(), udp_sockets(), cpu()
        with RtpGenerator(
            ("127.0.0.1", dest_port),
            pps=pps,
            seconds=seconds,
            first_sequence=sequence.next,
            sock=self.sock,
            prefix=self.prefix,
        ) as gen:
            report = gen.run()
        sequence.advance(report.sent)
        drain_s = _wait_input_drained(dest_port)
        cpu_s = cpu() - cpu_before
        reports = _wait_sinks(sinks, sinks.ports)  # type: ignore[arg-type]
        kernel_after, after = udp_sockets(), udp_counters()

        def drops(port: int) -> int:
            return kernel_after.get(port, (0, 0))[1] - kernel_before.get(port, (0, 0))[1]

        return Step(
            target_pps=pps,
            sent=report.sent,
            seconds=report.seconds,
            received=[r["received"] for r in reports],
            sink_drops=[drops(port) for port in sinks.ports],
            seq_lost=[r["lost"] for r in reports],
            reordered=[r["reordered"] for r in reports],
            forwarder_dropped=0,
            input_drops=drops(dest_port),
            rcvbuf_errors=after["RcvbufErrors"] - before["RcvbufErrors"],
            latency_ms=reports[0]["latency_ms"],
            drain_s=drain_s,
            cpu_s=cpu_s,
        )

    def close(self) -> None:
        self.sink.close()
        self.sock.close()


# ---------------------------------------------------------------------------- the search


def search_with(
    label: str, step: Callable[[float], Step], opts: Options, start_pps: float | None = None, deadline: float = math.inf
) -> SearchResult:
    """``bench.scenarios.common.search`` with a step function of our own (same climb and bisection)."""
    best: Step | None = None
    steps: list[Step] = []
    low, high = 0.0, None
    pps = start_pps or opts.start_pps
    for _ in range(opts.max_steps):
        if time.monotonic() > deadline:
            log(f"  {label}: time budget spent, search stopped at {len(steps)} steps")
            break
        result = step(pps)
        steps.append(result)
        log(step_line(label, result))
        if result.clean:
            if best is None or result.target_pps > best.target_pps:
                best = result
            low = max(low, pps)
            if result.generator_limited:
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
    return SearchResult(label, best, steps)


def _next_start(floor: float, previous: SearchResult | None) -> float | None:
    """Later rounds start just under the best rate so far (as scenario 1 does), not below ``floor``."""
    return max(floor, 0.75 * previous.pps) if previous and previous.best else None


@dataclass
class Measured:
    """One row's search, or why it could not run."""

    result: SearchResult | None = None
    error: str | None = None
    cpu_by_process: dict[str, float] = field(default_factory=dict)  # us per packet at the best step

    @property
    def pps(self) -> float:
        return self.result.pps if self.result else 0.0


def measure_quic(opts: Options, workdir: Path) -> Measured:
    """Measurement 1: the QUIC tunnel chain, ``opts.rounds`` searches on fresh tunnels."""
    measured = Measured()
    per_step_cpu: dict[int, dict[str, float]] = {}
    deadline = time.monotonic() + (30.0 if opts.quick else QUIC_BUDGET_S)
    with running_relay(workdir, "quic") as relay, sink_child(1) as sinks:
        target = QuicTunnelTarget(relay, workdir)
        sequence = Sequence()

        def step(pps: float) -> Step:
            watch: list[PathDrainWatch] = []

            def start() -> None:
                watch.append(PathDrainWatch(target.path_ports, target.cpu_by_process, opts.step_seconds))

            result = run_step(target, sinks, input_port, pps, opts.step_seconds, sequence, during=start)
            drain_s, cpu = watch[0].finish(result.seconds)
            result.drain_s = max(result.drain_s, drain_s)
            result.cpu_s = sum(cpu.values())
            per_step_cpu[id(result)] = {k: v / max(result.sent, 1) * 1e6 for k, v in cpu.items()}
            socket_drops = sum(watch[0].socket_drops.values())
            # The relay's own QUIC datagram queue drops are not in its API: what is left over.
            relay_inferred = result.missing - socket_drops - result.forwarder_dropped
            log(
                f"    path: socket drops {watch[0].socket_drops}, runners dropped {result.forwarder_dropped}"
                f" (QUIC queue, replay, tag), so the relay ~{max(0, relay_inferred)}; CPU us/pkt "
                + ", ".join(f"{k} {v:.1f}" for k, v in per_step_cpu[id(result)].items())
            )
            return result

        for round_index in range(opts.rounds):
            if round_index and time.monotonic() > deadline - QUIC_BUDGET_S / (2 * opts.rounds):
                log("[relay quic] time budget: round skipped")
                break
            log(f"[relay quic] round {round_index + 1}/{opts.rounds}")
            input_port = target.open(sinks.ports)
            try:
                warm_up = run_step(target, sinks, input_port, WARM_UP_PPS, 0.5 if opts.quick else 1.0, sequence)
                log(step_line("(warm-up, not counted)", warm_up))
                first = opts.start_pps if opts.quick else QUIC_START_PPS
                start = _next_start(WARM_UP_PPS, measured.result) or first
                result = search_with(target.label, step, opts, start, deadline)
            finally:
                target.close()
            measured.result = measured.result.merged(result) if measured.result else result
    if measured.result and measured.result.best is not None:
        measured.cpu_by_process = per_step_cpu.get(id(measured.result.best), {})
    return measured


def measure_native(opts: Options, workdir: Path) -> tuple[Measured, Measured]:
    """Measurement 2: the relay's native plane and socat, alternating, one generator/sink pair."""
    relay_m, socat_m = Measured(), Measured()
    if not have("socat"):
        socat_m.error = "socat is not installed"
        log("socat is not installed: its column stays empty")
    deadline = time.monotonic() + (30.0 if opts.quick else NATIVE_BUDGET_S)
    with running_relay(workdir, "native") as relay:
        bench = NativeBench(relay)
        try:
            sequence = Sequence()
            socat = ProcessTarget("socat", socat_argv, workdir)

            def relay_step(pps: float) -> Step:
                bench.latch()  # an edge re-registers every 5 s; a session idle for 30 s is reaped
                return bench.step(relay.udp_port, lambda: cpu_seconds(relay.pid), pps, opts.step_seconds, sequence)

            def search_relay() -> None:
                log(f"[relay native] mp-relay native plane (tunnel {bench.tunnel_id})")
                result = search_with(
                    "relay native", relay_step, opts, _next_start(opts.start_pps, relay_m.result), deadline
                )
                relay_m.result = relay_m.result.merged(result) if relay_m.result else result

            def search_socat() -> None:
                log("[relay native] socat")
                port = socat.open(bench.sink.ports)
                try:
                    result = search_with(
                        "socat",
                        lambda pps: bench.step(port, socat.cpu_seconds, pps, opts.step_seconds, sequence),
                        opts,
                        _next_start(opts.start_pps, socat_m.result),
                        deadline,
                    )
                finally:
                    socat.close()
                socat_m.result = socat_m.result.merged(result) if socat_m.result else result

            for round_index in range(opts.rounds):
                if round_index and time.monotonic() > deadline - NATIVE_BUDGET_S / (2 * opts.rounds):
                    log("[relay native] time budget: round skipped")
                    break
                # relay, socat; then socat, relay: each sees the other's slot in the host's load.
                order = [search_relay, search_socat] if round_index % 2 == 0 else [search_socat, search_relay]
                for run in order:
                    if run is search_socat and socat_m.error:
                        continue
                    run()
        finally:
            bench.close()
    for m in (relay_m, socat_m):
        if m.result and m.result.best:
            m.cpu_by_process = {"total": m.result.best.cpu_us_per_packet}
    return relay_m, socat_m


# ---------------------------------------------------------------------------- output

HEADER: Final = (
    "  row     path                                                      zero-loss pkt/s  Mbit/s TS"
    "  CPU us/pkt  p99 ms  goal                met"
)


def _figures(m: Measured) -> str:
    if m.error is not None:
        return f"{'-':>15}  {'-':>9}  {'-':>10}  {'-':>6}"
    result = m.result
    if result is None or result.best is None:
        return f"{'none clean':>15}  {'-':>9}  {'-':>10}  {'-':>6}"
    limited = "*" if result.generator_limited else " "
    p99 = result.best.latency_ms.get("p99", math.nan)
    return (
        f"{result.pps:>14,.0f}{limited}  {ts_mbps(result.pps):9,.0f}  {result.best.cpu_us_per_packet:10.1f}  {p99:6.2f}"
    )


def verdicts(quic: Measured, native: Measured, socat: Measured) -> tuple[bool, bool, str]:
    """(QUIC goal met, native goal met, the ratio text)."""
    quic_met = quic.result is not None and ts_mbps(quic.pps) >= GOAL_MBPS
    if socat.pps > 0 and native.result is not None:
        ratio = native.pps / socat.pps
        cpu_text = ""
        if native.result.best and socat.result and socat.result.best and socat.result.best.cpu_s:
            cpu_text = f", CPU/pkt {native.result.best.cpu_us_per_packet / socat.result.best.cpu_us_per_packet:.2f}x"
        return quic_met, ratio >= GOAL_RATIO, f"{ratio:.2f}x socat{cpu_text}"
    return quic_met, False, "n/a (no clean socat step)"


def render(quic: Measured, native: Measured, socat: Measured) -> str:
    """The table (no ``|``: ``python -m bench`` prints it under its own)."""
    quic_met, native_met, ratio_text = verdicts(quic, native, socat)
    rows = [
        (
            "quic",
            "UDP via one QUIC tunnel, encryption on (egress+relay+ingress)",
            quic,
            f">= {GOAL_MBPS:.0f} Mbit/s",
            "yes" if quic_met else "NO",
        ),
        (
            "native",
            "mp-relay native UDP plane ([uuid][payload], latched)",
            native,
            f">= {GOAL_RATIO:.1f}x socat",
            "yes" if native_met else "NO",
        ),
        ("socat", "socat -u UDP4-RECV UDP4-SENDTO, same traffic (peer)", socat, "-", "-"),
    ]
    lines = [
        f"mp-relay data planes on loopback ({os.cpu_count()} CPUs shared with the generator and the sinks);"
        " zero-loss rate searches, 1316 bytes of TS per datagram",
        HEADER,
    ]
    for name, path, m, goal, met in rows:
        lines.append(f"  {name:<6}  {path:<56}  {_figures(m)}  {goal:<18}  {met}")
    for name, m in (("quic", quic), ("native", native), ("socat", socat)):
        if m.error is not None:
            lines.append(f"  {name}: failed: {m.error}")
    if quic.cpu_by_process:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in quic.cpu_by_process.items())
        lines.append(f"  quic CPU us/pkt by process at the best step: {parts}")
    lines.append(f"  native plane vs socat: {ratio_text}")
    if any(m.result and m.result.generator_limited for m in (quic, native, socat)):
        lines.append("  * generator-limited: a lower bound set by the sender, not by the path")
    quic_figure = (
        "failed"
        if quic.result is None
        else "no clean step"
        if quic.result.best is None
        else f"{ts_mbps(quic.pps):,.0f} Mbit/s"
    )
    lines.append(
        f"verdict: QUIC tunnel goal >= {GOAL_MBPS:.0f} Mbit/s: {'met' if quic_met else 'NOT met'} ({quic_figure});"
        f" native plane goal >= {GOAL_RATIO:.1f}x socat: {'met' if native_met else 'NOT met'} ({ratio_text})"
    )
    return "\n".join(lines)


def _record(m: Measured) -> dict[str, Any]:
    if m.result is None:
        return {"error": m.error}
    return {
        "zero_loss_pps": round(m.pps),
        "mbps_ts": round(ts_mbps(m.pps), 1),
        "generator_limited": m.result.generator_limited,
        "cpu_us_per_packet_by_process": {k: round(v, 2) for k, v in m.cpu_by_process.items()},
        "best": step_record(m.result.best),
        "steps": [step_record(s) for s in m.result.steps],
        "error": m.error,
    }


def run(opts: Options, workdir: Path, only: str | None = None) -> dict[str, Any]:
    """Both measurements (or ``only`` one); the table text and every figure (for ``--json``). A
    measurement that breaks keeps its row (``failed``, the reason under the table) and sets ``failed``."""
    import traceback

    started = time.monotonic()
    load_before = load_average()
    log(f"bench.relay: {'quick' if opts.quick else 'full'} run, load average {load_before}")
    skipped = Measured(error="not run (--only)")
    measured: dict[str, Measured] = {"quic": skipped, "native": skipped, "socat": skipped}
    try:
        if only in (None, "quic"):
            measured["quic"] = measure_quic(opts, workdir)
    except Exception as exc:  # the other measurement must still run and the row still print
        traceback.print_exc(file=sys.stderr)
        measured["quic"] = Measured(error=f"{type(exc).__name__}: {exc}"[:300])
    try:
        if only in (None, "native"):
            measured["native"], measured["socat"] = measure_native(opts, workdir)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        measured["native"] = Measured(error=f"{type(exc).__name__}: {exc}"[:300])
        measured["socat"] = Measured(error="not run (the native measurement failed)")
    quic, native, socat = measured["quic"], measured["native"], measured["socat"]
    quic_met, native_met, ratio_text = verdicts(quic, native, socat)
    return {
        "text": render(quic, native, socat),
        "failed": any(m.error is not None and m is not skipped for m in (quic, native)),
        "quic": _record(quic) | {"goal_mbps": GOAL_MBPS, "met": quic_met},
        "native": _record(native) | {"goal_ratio": GOAL_RATIO, "met": native_met, "ratio": ratio_text},
        "socat": _record(socat),
        "seconds": round(time.monotonic() - started, 1),
        "load_before": load_before,
        "load_after": load_average(),
    }


def options(quick: bool, workdir: Path) -> Options:
    return Options.quick_options(workdir) if quick else Options(workdir=workdir)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--runner-child"]:
        runner_child(argv[1])
        return 0
    if argv[:1] == ["--sink-child"]:
        sink_child_main(int(argv[1]), argv[2])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.relay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one half-second step per target (the smoke test)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--keep", type=Path, default=None, help="keep the relay's and the runners' logs here")
    parser.add_argument("--only", choices=("quic", "native"), default=None, help="run one measurement")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mp-bench-relay-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(options(args.quick, workdir), workdir, args.only)
    print(result["text"], flush=True)
    print(
        f"run took {result['seconds']:.0f} s; load average (1/5/15 min) {result['load_before']} at the start,"
        f" {result['load_after']} at the end"
    )
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in result.items() if k != "text"}, indent=2, default=str))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
