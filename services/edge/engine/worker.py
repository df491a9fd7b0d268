"""The engine worker process: runs flows, answers commands, reports counters.

Started by the control process as ``python -m services.edge.engine.worker --fd N``
with one end of a socketpair. Packets never wait on the control process: the
stats snapshot is sent from its own task every ``STATS_INTERVAL_S``, and a slow
control process only delays snapshots.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import time
from typing import Any

import trio
from pydantic import TypeAdapter, ValidationError

from appliance.models.config import FlowConfig, OutputConfig
from services.edge.core.watch import FlowWatch
from services.edge.engine.drain import DrainTick
from services.edge.engine.flow import FlowRuntime
from services.edge.engine.ipc import STATS_INTERVAL_S, MessageStream, serve_commands
from services.edge.engine.kinds import webrtc as webrtc_kinds
from services.edge.engine.rtmp import tls as rtmp_tls
from services.edge.engine.udp import FlowStartError

_log = logging.getLogger("mediaplane.engine")
_OUTPUT = TypeAdapter[OutputConfig](OutputConfig)


class Worker:
    """Flows of this worker, keyed by id, and the command handlers (a dispatch table, H4)."""

    def __init__(self, link: MessageStream, nursery: trio.Nursery) -> None:
        self.link = link
        self.nursery = nursery
        self.flows: dict[str, FlowRuntime] = {}
        self.drain_tick = DrainTick()
        self._last_load = (time.monotonic(), time.process_time(), 0)
        """One drain of every plain UDP input per tick, for all this worker's flows (issue 23)."""
        self._failures: list[dict[str, Any]] = []
        self._watches: dict[str, FlowWatch] = {}  # flow id -> its event rules (new per start)
        self._orphan_events: list[dict[str, Any]] = []  # events of flows that ended since the last report
        self._handlers = {
            "start_flow": self._start_flow,
            "stop_flow": self._stop_flow,
            "add_output": self._add_output,
            "remove_output": self._remove_output,
        }

    async def serve(self) -> None:
        await serve_commands(
            self.link,
            self._handlers,
            refused=(FlowStartError, ValidationError, KeyError),
            refusal_text=_message_of,
            internal_text=lambda exc: f"engine error: {exc}",
            log=_log,
        )

    async def _start_flow(self, message: dict[str, Any]) -> None:
        config = FlowConfig.model_validate(message["flow"])
        rtmp_tls.configure(message.get("rtmp_tls"))  # the RTMPS certificate files, when named
        if config.id in self.flows:
            raise FlowStartError(f"flow {config.id!r} is already running")
        runtime = FlowRuntime(config, self._flow_failed, self.drain_tick)
        self._watches.pop(config.id, None)
        await self.nursery.start(self._run_flow, runtime)

    async def _run_flow(
        self, runtime: FlowRuntime, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.flows[runtime.flow_id] = runtime
        try:
            await runtime.run(task_status=task_status)
        finally:
            if self.flows.get(runtime.flow_id) is runtime:
                del self.flows[runtime.flow_id]
            while runtime.pending_events:
                self._orphan_events.append(runtime.pending_events.popleft().model_dump(mode="json", exclude_none=True))

    async def _stop_flow(self, message: dict[str, Any]) -> None:
        flow_id = str(message["flow_id"])
        runtime = self.flows.pop(flow_id, None)
        self._watches.pop(flow_id, None)
        if runtime is not None:
            runtime.stop()

    async def _add_output(self, message: dict[str, Any]) -> None:
        runtime = self._flow(message)
        await runtime.add_output(_OUTPUT.validate_python(message["output"]))

    async def _remove_output(self, message: dict[str, Any]) -> None:
        runtime = self._flow(message)
        if not runtime.remove_output(str(message["output_id"])):
            raise FlowStartError(f"output {message['output_id']!r} is not running in flow {runtime.flow_id!r}")

    def _flow(self, message: dict[str, Any]) -> FlowRuntime:
        runtime = self.flows.get(str(message["flow_id"]))
        if runtime is None:
            raise FlowStartError(f"flow {message['flow_id']!r} is not running in this worker")
        return runtime

    def _flow_failed(self, flow_id: str, error: str) -> None:
        self._failures.append({"op": "flow_failed", "flow_id": flow_id, "error": error})

    def load(self, now: float, cpu: float, packets: int) -> dict[str, Any]:
        """This worker's load since the last report: its CPU (a share of one core: what the
        placement and the operator look at), input packets a second, the drain tick now."""
        last_at, last_cpu, last_packets = self._last_load
        span = max(now - last_at, 1e-6)
        self._last_load = (now, cpu, packets)
        return {
            "cpu": round(max(0.0, cpu - last_cpu) / span, 4),
            "pps": round(max(0, packets - last_packets) / span, 1),
            "tick_ms": round(self.drain_tick.tick_s * 1000, 3),
            "flows": len(self.flows),
        }

    async def report(self) -> None:
        """Every ``STATS_INTERVAL_S``: failures, then events, then every flow's typed counters
        and the worker's load (``load``)."""
        while True:
            await trio.sleep(STATS_INTERVAL_S)
            # The arrival clock of the flows (kernel receive times mapped onto CLOCK_MONOTONIC),
            # not trio's clock, which has an offset of its own.
            now = time.monotonic()
            flows: dict[str, Any] = {}
            events, self._orphan_events = self._orphan_events, []
            for flow_id, runtime in list(self.flows.items()):
                try:
                    counters = runtime.counters(now)
                    watch = self._watches.get(flow_id)
                    if watch is None:
                        watch = self._watches[flow_id] = FlowWatch(flow_id)
                    for event in watch.update(runtime.signal_state(now), counters.analysis.tr101290, now):
                        runtime.publish(event)
                except Exception as exc:  # a counting bug must not end the reports of other flows
                    runtime.internal_error("stats report failed", exc)
                else:
                    flows[flow_id] = counters.model_dump(mode="json")
                while runtime.pending_events:
                    events.append(runtime.pending_events.popleft().model_dump(mode="json", exclude_none=True))
            for gone in set(self._watches) - set(self.flows):
                del self._watches[gone]
            while self._failures:
                await self.link.send(self._failures.pop(0))
            if events:
                await self.link.send({"op": "events", "events": events})
            packets = sum(int(f["input"]["packets_received"]) for f in flows.values())
            # A flow that ended since the last report takes its packets with it: the sum can
            # go down, and load() clamps that interval's rate at 0.
            load = self.load(time.monotonic(), time.process_time(), packets)
            await self.link.send({"op": "stats", "flows": flows, "load": load})


def _place(nice: int, cpu: int | None, realtime: int = 0) -> None:
    """Take the data plane's scheduling class, priority and CPU; without the right, run on as we are.

    ``realtime`` > 0 asks for SCHED_FIFO at that priority (sched(7)): a worker woken by a
    datagram then runs at once instead of waiting for the sink, the API or another process to
    use up its slice (bench scenario 4 at 120k pkt/s with other work on the host: p99 added
    latency 0.7-0.9 ms, against 2.5-8.6 ms at niceness -10; on a quiet host the two are within
    noise of each other). The kernel's RT throttling (sched_rt_runtime_us, 95 %)
    leaves the rest of the box a share even of a saturated worker's CPU. Refused (no
    CAP_SYS_NICE or RLIMIT_RTPRIO, RestrictRealtime), the worker falls back to ``nice``.
    """
    if realtime > 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime))
            nice = 0  # a SCHED_FIFO task ignores its niceness
        except OSError as exc:
            _log.info("engine worker not real-time (SCHED_FIFO %d refused: %s)", realtime, exc.strerror)
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:
            _log.info("engine worker keeps its priority (niceness %d refused: %s)", nice, exc.strerror)
    if cpu is not None:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:
            _log.warning("engine worker not pinned to CPU %d: %s", cpu, exc.strerror)


def _quiet_garbage_collector() -> None:
    """Keep the cyclic garbage collector from pausing the data plane.

    The packet path frees its objects by reference counting; what the collector would scan
    is mostly the imported modules (numpy, pydantic, trio: ~10^5 objects), which never die.
    ``gc.freeze`` moves them out of its reach, so a full collection walks only what flows
    created since; the higher first threshold makes young collections rarer (each still
    short). ``MEDIAPLANE_GC_TRACE=1`` logs every pause over 0.5 ms.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    if os.environ.get("MEDIAPLANE_GC_TRACE"):
        _trace_gc_pauses()


def _trace_gc_pauses() -> None:
    """Log every collection that took longer than 0.5 ms (a diagnostic, off by default)."""
    started: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took = time.perf_counter() - started[0]
        if took > 0.0005:
            generation, collected = info["generation"], info["collected"]
            _log.warning("gc generation %d took %.2f ms (%d collected)", generation, took * 1e3, collected)

    gc.callbacks.append(callback)


def _message_of(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "invalid flow configuration"
    if isinstance(exc, KeyError):
        return f"malformed command: missing {exc}"
    return str(exc)


async def _main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    link = MessageStream(stream)
    async with trio.open_nursery() as nursery:
        worker = Worker(link, nursery)
        _quiet_garbage_collector()
        await link.send({"op": "ready"})  # imports done: commands can be answered now
        nursery.start_soon(worker.drain_tick.run)
        nursery.start_soon(worker.report)
        try:
            await worker.serve()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the control process went away: so do we
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mediaplane-engine-worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--worker-id", type=int, default=0)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--nice", type=int, default=0, help="scheduling niceness to take (needs CAP_SYS_NICE below 0)")
    parser.add_argument("--cpu", type=int, default=None, help="the CPU to run on (default: anywhere)")
    parser.add_argument("--realtime", type=int, default=0, help="SCHED_FIFO priority (0: normal scheduling)")
    parser.add_argument("--webrtc-socket", default=None, help="where the webrtc worker takes registrations")
    args = parser.parse_args(argv)
    webrtc_kinds.WEBRTC_SOCKET = args.webrtc_socket
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker-{args.worker_id} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the control process stops us, not the console
    _place(args.nice, args.cpu, args.realtime)
    try:
        trio.run(_main, args.fd)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
