"""Control-process side of the engine: worker processes, commands, counters.

Each worker is a separate process (architecture.md: the GIL made a busy control
loop cost the packet loop 35-45 %), linked by a socketpair. A flow lives on one
worker, assigned to the least-loaded one. When a worker dies, its flows are
reported lost (the service marks them Error and restarts them) and a fresh
worker is started.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from pydantic import ValidationError

from appliance.models.config import FlowConfig, OutputConfig, RtmpInput, split_host_port
from appliance.models.events import Event
from appliance.models.stats import FlowCounters
from services.edge.engine.ipc import WorkerLinkError, WorkerProcess, deliver_events, terminate

COMMAND_TIMEOUT_S: Final = 10.0
RESPAWN_DELAY_S: Final = 0.5
WORKER_READY_TIMEOUT_S: Final = 120.0  # imports under qemu TCG on a loaded host took minutes
_log = logging.getLogger("mediaplane.engine")
_LINK_ERRORS: Final = {
    "restarting": "engine worker is restarting; try again",
    "unreachable": "engine worker is not reachable",
    "no_answer": "engine did not answer",
}


def shared_listener(flow: FlowConfig) -> tuple[str, int] | None:
    """The listener a flow may share with others (RTMP: one TCP port per worker process), or None.

    Flows whose inputs share one (interop.md 2.3: RTMP flows on one ``listen_addr``) must run in
    one worker, which owns the socket; the key is the port, so a flow on the same port and
    another address lands there too (the clash rule decides whether they may coexist).
    """
    if isinstance(flow.input, RtmpInput):
        return ("rtmp", split_host_port(flow.input.listen_addr)[1])
    return None


class EngineError(Exception):
    """The engine refused or failed a command; the text is user-facing."""


def default_worker_count() -> int:
    """One per core minus one (the control process keeps one), at least one."""
    return max(1, (os.cpu_count() or 2) - 1)


WORKER_NICE: Final = -10  # the data plane before the API, the console and other tenants of the box
# SCHED_FIFO priority of the workers: low among real-time tasks (kernel threads and audio
# servers use 50+), above every normal one. 0 turns real-time scheduling off.
WORKER_REALTIME: Final = 10


def cpu_plan(workers: int, cpus: list[int] | None = None) -> tuple[list[int] | None, list[int | None]]:
    """Which CPUs the control process keeps and which CPU each worker gets.

    The first allowed CPU is the control process's (and the system's); the workers take the
    others in turn, so the API, its clients and the stats never run on a worker's core
    (bench scenario 5). With fewer than two CPUs, or more workers than the other CPUs hold,
    nothing is pinned: sharing a pinned core would be worse than letting the scheduler place.
    """
    allowed = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(allowed) < 2 or workers > len(allowed) - 1:
        return None, [None] * workers
    return allowed[:1], [allowed[1 + index] for index in range(workers)]


@dataclass
class _Worker:
    index: int
    proc: WorkerProcess
    flows: set[str] = field(default_factory=set)
    load: dict[str, Any] | None = None
    """The worker's last ``load`` report (cpu, pps, tick_ms, flows), None before the first."""
    placed: dict[str, float] = field(default_factory=dict)
    """Flows placed here since its last report, with the packets/s each is expected to bring."""

    def expected_pps(self) -> float:
        """Measured packets/s plus what the flows placed since the last report are expected to add."""
        measured = float(self.load.get("pps", 0.0)) if self.load else 0.0
        return measured + sum(self.placed.values())

    @property
    def alive(self) -> bool:
        return self.proc.alive


StatsCallback = Callable[[dict[str, FlowCounters]], None]
EventCallback = Callable[[Event], object]
FailureCallback = Callable[[str, str], None]
LostCallback = Callable[[list[str]], None]


class Engine:
    """Runs the worker processes; ``run`` must be started in a nursery first."""

    def __init__(
        self,
        *,
        workers: int,
        on_stats: StatsCallback,
        on_flow_failed: FailureCallback,
        on_workers_lost: LostCallback,
        on_event: EventCallback,
        log_level: str = "info",
        pin_cpus: bool = False,
        worker_nice: int = WORKER_NICE,
        worker_realtime: int = WORKER_REALTIME,
        webrtc_socket: str | None = None,
    ) -> None:
        self._count = workers
        self._webrtc_socket = webrtc_socket
        plan: tuple[list[int] | None, list[int | None]] = cpu_plan(workers) if pin_cpus else (None, [None] * workers)
        self._control_cpus, self._worker_cpus = plan
        self._worker_nice = worker_nice
        self._worker_realtime = worker_realtime
        self._on_stats = on_stats
        self._on_flow_failed = on_flow_failed
        self._on_workers_lost = on_workers_lost
        self._on_event = on_event
        self.rejected_reports = 0
        """Worker reports that did not validate against the contract (should stay 0)."""
        self._log_level = log_level
        self._workers: list[_Worker | None] = [None] * workers
        self._flow_worker: dict[str, int] = {}
        self._flow_listener: dict[str, tuple[str, int]] = {}  # flow -> the listener it shares
        # The RTMPS certificate and key files ({"cert_path", "key_path"}) for the worker, or None
        # (the worker then serves a self-signed certificate of its own): set by the service.
        self.rtmp_tls: Callable[[], dict[str, str] | None] | None = None
        self._nursery: trio.Nursery | None = None
        self._ready = trio.Event()

    @property
    def control_cpus(self) -> list[int] | None:
        """The CPUs the control process should keep (None: not pinned)."""
        return self._control_cpus

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the workers, report started, and keep them running until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for index in range(self._count):
                await nursery.start(self._keep_worker, index)
            task_status.started()
            await trio.sleep_forever()

    async def _keep_worker(self, index: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        first = True
        while True:
            proc = await WorkerProcess.spawn(
                "services.edge.engine.worker",
                [
                    "--worker-id",
                    str(index),
                    "--log-level",
                    self._log_level,
                    "--nice",
                    str(self._worker_nice),
                    "--realtime",
                    str(self._worker_realtime),
                    *(["--cpu", str(cpu)] if (cpu := self._worker_cpus[index]) is not None else []),
                    *(["--webrtc-socket", self._webrtc_socket] if self._webrtc_socket else []),
                ],
            )
            worker = _Worker(index, proc)
            self._workers[index] = worker
            # Wait for the worker's "ready" (its imports take seconds on a slow or loaded box)
            # so the first command is not timed out by a worker still starting.
            await proc.wait_ready(WORKER_READY_TIMEOUT_S)
            if first:
                task_status.started()
                first = False
            try:
                await proc.read(functools.partial(self._on_message, worker))
            finally:
                proc.mark_dead()
                lost = sorted(worker.flows)
                for flow_id in lost:
                    self._flow_worker.pop(flow_id, None)
                    self._flow_listener.pop(flow_id, None)
                await proc.close()
            _log.error("engine worker %d exited (status %s); restarting it", index, proc.process.returncode)
            if lost:
                self._on_workers_lost(lost)
            await trio.sleep(RESPAWN_DELAY_S)

    def _on_message(self, worker: _Worker, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "stats":
            flows = message.get("flows")
            load = message.get("load")
            if isinstance(load, dict):
                worker.load = load
                reported = set(flows) if isinstance(flows, dict) else set()
                # A placed flow the worker reports on is measured from now on.
                worker.placed = {f: pps for f, pps in worker.placed.items() if f not in reported}
            self._on_stats(self._typed_reports(flows))
        elif op == "events":
            deliver_events(message.get("events"), self._on_event, lambda exc: self._reject("event", exc))
        elif op == "flow_failed":
            flow_id = str(message.get("flow_id"))
            worker.flows.discard(flow_id)
            self._flow_worker.pop(flow_id, None)
            self._flow_listener.pop(flow_id, None)
            self._on_flow_failed(flow_id, str(message.get("error")))

    def _typed_reports(self, flows: object) -> dict[str, FlowCounters]:
        """The worker's per-flow counters, validated against the one contract (style: the
        worker built them with the same models). A report that does not validate is dropped,
        logged and counted, so a mismatch shows without ever breaking ``GET /api/v1/stats``."""
        typed: dict[str, FlowCounters] = {}
        if not isinstance(flows, dict):
            return typed
        for flow_id, raw in flows.items():
            try:
                typed[str(flow_id)] = FlowCounters.model_validate(raw)
            except ValidationError as exc:
                self._reject(f"stats of flow {flow_id!r}", exc)
        return typed

    def _reject(self, what: str, exc: ValidationError) -> None:
        self.rejected_reports += 1
        if self.rejected_reports <= 10:  # a persistent mismatch logs a few times, then counts
            _log.error("engine report rejected (%s): %s", what, exc.errors(include_input=False, include_url=False))

    async def _request(self, worker: _Worker, message: dict[str, Any]) -> None:
        try:
            reply = await worker.proc.request(message, COMMAND_TIMEOUT_S)
        except WorkerLinkError as exc:
            raise EngineError(_LINK_ERRORS[exc.reason]) from exc
        if not reply.get("ok"):
            raise EngineError(str(reply.get("error") or "engine failed"))

    def _least_loaded(self) -> _Worker:
        """The worker with the fewest packets a second (measured, plus the flows placed on it
        since its last report); the flow count breaks ties. Issue 23: flows differ by orders of
        magnitude (a 2 Mbit/s contribution feed beside a 1 Gbit/s one), so a count places badly."""
        alive = [w for w in self._workers if w is not None and w.alive]
        if not alive:
            raise EngineError("no engine worker is running")
        return min(alive, key=lambda w: (w.expected_pps(), len(w.flows), w.index))

    def _new_flow_estimate(self) -> float:
        """What a flow not yet measured is expected to bring: the mean of the measured flows
        (a burst of creations then spreads instead of piling on the worker measured idle)."""
        pps, flows = 0.0, 0
        for worker in self._workers:
            if worker is not None and worker.alive and worker.load:
                pps += float(worker.load.get("pps", 0.0))
                flows += int(worker.load.get("flows", 0))
        return pps / flows if flows and pps > 0 else 1.0

    def worker_loads(self) -> list[dict[str, Any]]:
        """Each worker's last load report (``GET /api/v1/system/diagnostics``, the metrics)."""
        loads: list[dict[str, Any]] = []
        for index, worker in enumerate(self._workers):
            alive = worker is not None and worker.alive
            report = (worker.load or {}) if worker is not None else {}
            loads.append(
                {
                    "index": index,
                    "pid": worker.proc.process.pid if worker is not None and alive else None,
                    "alive": alive,
                    "flows": len(worker.flows) if worker is not None else 0,
                    "pps": float(report.get("pps", 0.0)),
                    "cpu": float(report.get("cpu", 0.0)),
                    "tick_ms": report.get("tick_ms"),
                }
            )
        return loads

    def worker_index_of(self, flow_id: str) -> int | None:
        """The worker a running flow is on (its stats show it)."""
        return self._flow_worker.get(flow_id)

    def _worker_for(self, flow: FlowConfig) -> _Worker:
        """The worker of a running flow whose listener ``flow`` shares, else the least loaded."""
        key = shared_listener(flow)
        if key is not None:
            for other, other_key in self._flow_listener.items():
                worker = self._worker_of(other) if other_key == key and other != flow.id else None
                if worker is not None and worker.alive:
                    return worker
        return self._least_loaded()

    def _worker_of(self, flow_id: str) -> _Worker | None:
        index = self._flow_worker.get(flow_id)
        return self._workers[index] if index is not None else None

    # ------------------------------------------------------------------ commands

    def is_running(self, flow_id: str) -> bool:
        return flow_id in self._flow_worker

    def running_flows(self) -> set[str]:
        """The flows the engine runs (or is starting) now: what a config apply must stop."""
        return set(self._flow_worker)

    async def start_flow(self, flow: FlowConfig) -> None:
        """Start ``flow`` on the least-loaded worker (on the worker of the flows whose listener it
        shares, see ``shared_listener``); returns once its input is bound."""
        worker = self._worker_for(flow)
        worker.flows.add(flow.id)
        worker.placed[flow.id] = self._new_flow_estimate()
        self._flow_worker[flow.id] = worker.index
        key = shared_listener(flow)
        if key is not None:
            self._flow_listener[flow.id] = key
        message: dict[str, Any] = {"op": "start_flow", "flow": flow.model_dump(mode="json")}
        if isinstance(flow.input, RtmpInput) and flow.input.tls and self.rtmp_tls is not None:
            message["rtmp_tls"] = self.rtmp_tls()
        try:
            await self._request(worker, message)
        except BaseException:
            worker.flows.discard(flow.id)
            worker.placed.pop(flow.id, None)
            self._flow_worker.pop(flow.id, None)
            self._flow_listener.pop(flow.id, None)
            # Without an answer (timeout, cancellation) the worker may still start it: tell it
            # to drop the flow, so nothing runs there that this side does not know of.
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self._forget(worker, flow.id)
            raise

    async def _forget(self, worker: _Worker, flow_id: str) -> None:
        """A stop sent without waiting for its reply (idempotent on the worker)."""
        await worker.proc.send_unanswered({"op": "stop_flow", "flow_id": flow_id})

    async def stop_flow(self, flow_id: str) -> None:
        worker = self._worker_of(flow_id)
        if worker is None:
            return
        try:
            await self._request(worker, {"op": "stop_flow", "flow_id": flow_id})
        finally:
            worker.flows.discard(flow_id)
            self._flow_worker.pop(flow_id, None)
            self._flow_listener.pop(flow_id, None)

    async def add_output(self, flow_id: str, output: OutputConfig) -> None:
        worker = self._worker_of(flow_id)
        if worker is None:
            raise EngineError(f"flow {flow_id!r} is not running")
        await self._request(worker, {"op": "add_output", "flow_id": flow_id, "output": output.model_dump(mode="json")})

    async def remove_output(self, flow_id: str, output_id: str) -> None:
        worker = self._worker_of(flow_id)
        if worker is None:
            return
        await self._request(worker, {"op": "remove_output", "flow_id": flow_id, "output_id": output_id})

    async def shutdown(self) -> None:
        """Ask every worker to exit and wait for it (bounded)."""
        for worker in self._workers:
            if worker is not None:
                await worker.proc.send_unanswered({"op": "shutdown"})
        for worker in self._workers:
            if worker is not None:
                await terminate(worker.proc.process)

    def worker_pids(self) -> list[int]:
        return [w.proc.process.pid for w in self._workers if w is not None and w.alive]
