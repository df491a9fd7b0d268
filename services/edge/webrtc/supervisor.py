"""Control-process side of the webrtc worker: spawn it, restart it, hand it offers.

The worker (``services.edge.webrtc.worker``) is one asyncio process for every WebRTC session of
the edge. It is supervised like an engine worker: when it dies, the engine kinds that had
registered with it see their links close (their sessions end with a ``webrtc`` warning event
and they register again), and a fresh worker is started after ``RESPAWN_DELAY_S``.

The kinds find the worker at ``socket_path``, a Unix socket in a private (0700) directory made
at construction; the engine workers get it as ``--webrtc-socket``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import trio

from services.edge.engine.ipc import WorkerLinkError, WorkerProcess

_log = logging.getLogger("mediaplane.webrtc")
RESPAWN_DELAY_S: Final = 0.5
READY_TIMEOUT_S: Final = 120.0
REQUEST_TIMEOUT_S: Final = 25.0  # the worker bounds an offer at 20 s


class WebrtcUnavailable(Exception):
    """The worker is not running (starting, restarting): answered 503."""


class WebrtcSupervisor:
    """Runs the webrtc worker; ``run`` must be started in a nursery first."""

    def __init__(self, *, log_level: str = "info", on_watch_idle: Callable[[str], None] | None = None) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="mp-webrtc-"))
        self.socket_path = str(self._dir / "kinds.sock")
        self._log_level = log_level
        self._worker: WorkerProcess | None = None
        self._ready = trio.Event()
        self._wanted = trio.Event()
        self.on_watch_idle = on_watch_idle
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        worker = self._worker
        return worker.process.pid if worker is not None and worker.alive else None

    def want(self) -> None:
        """Start the worker (if it is not yet): a WebRTC kind or the status page's watch needs it.
        An edge that never runs one never pays for the process (aiortc and PyAV imports)."""
        self._wanted.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep one worker running once it is wanted (in the background: its imports take a while)."""
        task_status.started()
        try:
            await self._wanted.wait()
            while True:
                worker = await WorkerProcess.spawn(
                    "services.edge.webrtc.worker", ["--socket", self.socket_path, "--log-level", self._log_level]
                )
                try:
                    if await worker.wait_ready(READY_TIMEOUT_S):
                        self._worker = worker
                        self._ready.set()
                        await worker.read(self._on_message)
                finally:
                    worker.mark_dead()
                    self._worker = None
                    self._ready = trio.Event()
                    await worker.close()
                self.restarts += 1
                _log.error("webrtc worker exited (status %s); restarting it", worker.process.returncode)
                await trio.sleep(RESPAWN_DELAY_S)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _on_message(self, message: dict[str, Any]) -> None:
        if message.get("op") == "watch_idle" and self.on_watch_idle is not None:
            self.on_watch_idle(str(message.get("flow_id")))

    async def request(self, message: dict[str, Any], *, wait_ready: float = 20.0) -> dict[str, Any]:
        """Send ``message`` and return the worker's reply; WebrtcUnavailable without a worker."""
        self.want()
        with trio.move_on_after(wait_ready):
            await self._ready.wait()
        worker = self._worker
        if worker is None:
            raise WebrtcUnavailable("the WebRTC worker is not running; try again")
        try:
            return await worker.request(message, REQUEST_TIMEOUT_S)
        except WorkerLinkError as exc:
            raise WebrtcUnavailable("the WebRTC worker did not answer; try again") from exc

    async def shutdown(self) -> None:
        worker = self._worker
        if worker is not None:
            await worker.send_unanswered({"op": "shutdown"})
            await worker.close()


__all__ = ["WebrtcSupervisor", "WebrtcUnavailable"]
