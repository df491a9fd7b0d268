"""Control-process side of the tunnels: the tunnel worker process, its commands and reports.

Supervised like an engine worker (architecture.md): one process, linked by a socketpair with
the engine's framing, spawned when the first tunnel starts (an edge without tunnels runs no
tunnel worker) and respawned when it dies. While it is down every tunnel it ran is ``Failed``,
with one critical ``tunnel`` event each; once a fresh worker is ready, every tunnel that is
still wanted is started on it again.

``state(tunnel_id)`` and ``counters(tunnel_id)`` answer from the worker's latest report; a
tunnel this supervisor was not asked to run is ``Stopped`` with zero counters. The service
(``EdgeService``) decides which tunnels run; this class only carries that out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import trio
from pydantic import ValidationError

from appliance.models.config import TUNNEL_SECRET_FIELDS, TunnelConfig
from appliance.models.events import Event, EventCategory, critical
from appliance.models.stats import TunnelCounters, TunnelState
from services.edge.engine.ipc import WorkerLinkError, WorkerProcess, deliver_events, terminate

COMMAND_TIMEOUT_S: Final = 10.0
RESPAWN_DELAY_S: Final = 0.5
WORKER_READY_TIMEOUT_S: Final = 120.0  # as the engine's: imports under qemu TCG take long
WORKER_EXITED: Final = "the tunnel worker exited"
_log = logging.getLogger("mediaplane.tunnels")
_LINK_ERRORS: Final = {
    "restarting": "the tunnel worker is restarting; try again",
    "unreachable": "the tunnel worker is not reachable",
    "no_answer": "the tunnel worker did not answer",
}

EventCallback = Callable[[Event], object]


class TunnelError(Exception):
    """The tunnel worker refused or failed a command; the text is user-facing (no secret)."""


@dataclass
class _Wanted:
    tunnel: TunnelConfig
    edge_id: str | None


def revealed(tunnel: TunnelConfig) -> dict[str, Any]:
    """The tunnel as JSON with its secrets in clear, for the worker link only (never logged)."""
    data = tunnel.model_dump(mode="json")
    for name in TUNNEL_SECRET_FIELDS:
        value = getattr(tunnel, name)
        data[name] = value.get_secret_value() if value is not None else None
    return data


class TunnelSupervisor:
    """Runs the tunnel worker; ``run`` must be started in a nursery first."""

    def __init__(
        self,
        *,
        on_event: EventCallback,
        software_version: str,
        log_level: str = "info",
        runner: str | None = None,
    ) -> None:
        self._on_event = on_event
        self._software_version = software_version
        self._log_level = log_level
        self._runner = runner  # module:attribute of the runner factory (tests inject a fake)
        self._wanted: dict[str, _Wanted] = {}
        self._reports: dict[str, tuple[TunnelState, TunnelCounters]] = {}
        self._refused: dict[str, str] = {}  # tunnel id -> why its start was refused (state Failed)
        self._lost: set[str] = set()  # wanted tunnels of a dead worker, to start on the next one
        self._worker: WorkerProcess | None = None
        self._down = False  # a worker died and the next one is not ready yet
        self._needed = trio.Event()
        self._ready = trio.Event()  # set while a worker is up; replaced when it dies
        self.rejected_reports = 0
        self.restarts = 0

    # ------------------------------------------------------------------ queries

    def state(self, tunnel_id: str) -> TunnelState:
        if tunnel_id in self._refused:
            return TunnelState.FAILED
        if tunnel_id not in self._wanted:
            return TunnelState.STOPPED
        if self._down:
            return TunnelState.FAILED
        report = self._reports.get(tunnel_id)
        return report[0] if report is not None else TunnelState.CONNECTING

    def counters(self, tunnel_id: str) -> TunnelCounters:
        report = self._reports.get(tunnel_id)
        if report is None or tunnel_id not in self._wanted or self._down:
            return TunnelCounters()
        return report[1]

    def is_running(self, tunnel_id: str) -> bool:
        """Asked to run (whatever its state): what a stop must undo."""
        return tunnel_id in self._wanted

    def worker_pid(self) -> int | None:
        worker = self._worker
        return worker.process.pid if worker is not None and worker.alive else None

    # ------------------------------------------------------------------ the worker process

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Report started at once; spawn the worker when a tunnel first needs it, keep it running."""
        task_status.started()
        await self._needed.wait()
        while True:
            await self._one_worker()
            await trio.sleep(RESPAWN_DELAY_S)

    async def _one_worker(self) -> None:
        worker = await WorkerProcess.spawn(
            "services.edge.tunnels.worker",
            [
                "--log-level",
                self._log_level,
                "--software-version",
                self._software_version,
                *(["--runner", self._runner] if self._runner else []),
            ],
        )
        try:
            async with trio.open_nursery() as nursery:
                if await worker.wait_ready(WORKER_READY_TIMEOUT_S):
                    self._worker = worker
                    self._down = False
                    self._ready.set()
                    nursery.start_soon(self._restart_lost, worker)
                    await worker.read(self._on_message)
                nursery.cancel_scope.cancel()
        finally:
            await worker.close()
        process = worker.process
        if self._worker is worker:
            self._worker = None
        self._ready = trio.Event()
        self._down = True
        self.restarts += 1
        self._reports.clear()
        # One event per tunnel and outage: a tunnel still waiting from an earlier death (a worker
        # that died again before it was ready) is Failed already.
        lost = sorted(set(self._wanted) - self._lost)
        self._lost.update(self._wanted)
        _log.error("tunnel worker exited (status %s); restarting it", process.returncode)
        for tunnel_id in lost:
            tunnel = self._wanted[tunnel_id].tunnel
            self._on_event(
                critical(
                    EventCategory.TUNNEL,
                    f"tunnel '{tunnel.name}' failed: {WORKER_EXITED}",
                    tunnel_id=tunnel_id,
                    tunnel_name=tunnel.name,
                    state=TunnelState.FAILED.value,
                    reason=WORKER_EXITED,
                )
            )

    async def _restart_lost(self, worker: WorkerProcess) -> None:
        """The tunnels of a dead worker, started on ``worker`` (a start refused now is Failed)."""
        for tunnel_id in sorted(self._lost):
            if tunnel_id not in self._lost:
                continue  # a start_tunnel of its own took it
            self._lost.discard(tunnel_id)
            wanted = self._wanted.get(tunnel_id)
            if wanted is None:
                continue  # stopped or deleted while the worker was down
            try:
                await self._send_start(worker, wanted)
            except TunnelError as exc:
                _log.error("tunnel %s not restarted: %s", tunnel_id, exc)
                if worker.alive and self._wanted.get(tunnel_id) is wanted:
                    del self._wanted[tunnel_id]
                    self._refused[tunnel_id] = str(exc)
                continue
            if self._wanted.get(tunnel_id) is not wanted:
                # Stopped while its start was on the way: the worker runs nothing unwanted.
                await self._forget(worker, tunnel_id)

    def _on_message(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "tunnels":
            self._on_report(message.get("tunnels"))
        elif op == "events":
            deliver_events(message.get("events"), self._on_event, lambda exc: self._reject("event", exc))

    def _on_report(self, tunnels: object) -> None:
        if not isinstance(tunnels, dict):
            return
        reports: dict[str, tuple[TunnelState, TunnelCounters]] = {}
        for tunnel_id, raw in tunnels.items():
            try:
                state = TunnelState(raw["state"])
                counters = TunnelCounters.model_validate(raw["counters"])
            except (ValidationError, ValueError, KeyError, TypeError) as exc:
                if isinstance(exc, ValidationError):
                    self._reject(f"report of tunnel {tunnel_id!r}", exc)
                else:
                    self.rejected_reports += 1
                continue
            reports[str(tunnel_id)] = (state, counters)
        self._reports = reports

    def _reject(self, what: str, exc: ValidationError) -> None:
        self.rejected_reports += 1
        if self.rejected_reports <= 10:
            problems = exc.errors(include_input=False, include_url=False)
            _log.error("tunnel worker report rejected (%s): %s", what, problems)

    async def _request(self, worker: WorkerProcess, message: dict[str, Any]) -> None:
        try:
            reply = await worker.request(message, COMMAND_TIMEOUT_S)
        except WorkerLinkError as exc:
            text = WORKER_EXITED if exc.reason == "no_answer" and not worker.alive else _LINK_ERRORS[exc.reason]
            raise TunnelError(text) from exc
        if not reply.get("ok"):
            raise TunnelError(str(reply.get("error") or "the tunnel worker failed"))

    async def _send_start(self, worker: WorkerProcess, wanted: _Wanted) -> None:
        await self._request(
            worker, {"op": "start_tunnel", "tunnel": revealed(wanted.tunnel), "edge_id": wanted.edge_id}
        )

    async def _forget(self, worker: WorkerProcess, tunnel_id: str) -> None:
        """A stop sent without waiting for its reply (idempotent on the worker)."""
        await worker.send_unanswered({"op": "stop_tunnel", "tunnel_id": tunnel_id})

    async def _live_worker(self) -> WorkerProcess | None:
        self._needed.set()
        with trio.move_on_after(WORKER_READY_TIMEOUT_S):
            await self._ready.wait()
        worker = self._worker
        return worker if worker is not None and worker.alive else None

    # ------------------------------------------------------------------ commands

    async def start_tunnel(self, tunnel: TunnelConfig, *, edge_id: str | None) -> None:
        """Run ``tunnel`` (and again after every worker restart, until ``stop_tunnel``).

        Raises TunnelError when the worker refuses it (the tunnel is then ``Failed`` and not
        retried) or cannot be reached (it stays wanted: the next worker starts it).
        """
        tunnel_id = str(tunnel.id)
        wanted = _Wanted(tunnel, edge_id)
        self._wanted[tunnel_id] = wanted
        self._refused.pop(tunnel_id, None)
        self._reports.pop(tunnel_id, None)
        self._lost.discard(tunnel_id)  # this call starts it, not the restart of a new worker
        worker = await self._live_worker()
        if worker is None:
            self._lost.add(tunnel_id)
            raise TunnelError("the tunnel worker is not running")
        try:
            await self._send_start(worker, wanted)
        except TunnelError as exc:
            if worker.alive and self._wanted.get(tunnel_id) is wanted:
                del self._wanted[tunnel_id]  # refused: Failed, not retried
                self._refused[tunnel_id] = str(exc)
            elif not worker.alive:
                self._lost.add(tunnel_id)  # the worker died on the way: the next one starts it
            raise
        except BaseException:
            # Cancelled without an answer: the worker may still start it; tell it to drop it.
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self._forget(worker, tunnel_id)
            self._wanted.pop(tunnel_id, None)
            raise

    async def stop_tunnel(self, tunnel_id: str) -> None:
        """Stop it (if it runs) and forget it: afterwards it is ``Stopped``."""
        self._refused.pop(tunnel_id, None)
        self._lost.discard(tunnel_id)
        self._reports.pop(tunnel_id, None)
        if self._wanted.pop(tunnel_id, None) is None:
            return
        worker = self._worker
        if worker is None or not worker.alive:
            return  # nothing runs it; the next worker will not start it
        await self._request(worker, {"op": "stop_tunnel", "tunnel_id": tunnel_id})

    async def shutdown(self) -> None:
        """Ask the worker to exit and wait for it (bounded)."""
        worker = self._worker
        if worker is None:
            return
        await worker.send_unanswered({"op": "shutdown"})
        await terminate(worker.process)
