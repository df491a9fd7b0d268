"""The tunnel worker process: one ``TunnelRunner`` per tunnel, commands, reports.

Started by ``TunnelSupervisor`` as ``python -m services.edge.tunnels.worker --fd N`` with one
end of a socketpair, framed as the engine's link (``services.edge.engine.ipc``: u32 length ‖
JSON object). It lives in its own process (architecture.md, "the processes beside the
workers"): QUIC and payload crypto never share a GIL with the API or a packet loop, and a
crash here takes down only the tunnels.

control → worker: ``start_tunnel {id, tunnel, edge_id}`` (the TunnelConfig with its secrets
revealed: this link is a private socketpair), ``stop_tunnel {id, tunnel_id}``, ``shutdown``.

worker → control: ``ready`` once the runner module is loaded (or found missing: then every
start is refused with the reason); ``reply {id, ok, error?}``; every ``REPORT_INTERVAL_S``
``events {events: [Event]}`` when anything happened, then ``tunnels {tunnels: {id: {state,
counters}}}``.

Events (interop.md 11, category ``tunnel``), one per transition, never repeated while the
state holds: started and stopped (info, from the commands); Connected (info, a recovery);
Connected → Connecting or Waiting (warning: relay link or peer down); → Failed (critical: bind
rejected when the runner's reason says so, else tunnel failed). A runner that raises (it is
meant never to) is the tunnel's boundary: logged, Failed, and the other tunnels run on.

Secrets never leave this process except in the tunnel's own protocol: no log line, event
or reply carries a field of the tunnel other than its id and name.

The worker exits on EOF of its link (the control process is gone) or on ``shutdown``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import signal
import socket
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Protocol

import trio
from pydantic import ValidationError

from appliance.models.config import TunnelConfig
from appliance.models.events import Event, EventCategory, critical, info, warning
from appliance.models.stats import TunnelCounters, TunnelState
from services.edge.engine.ipc import MessageStream, serve_commands

REPORT_INTERVAL_S: Final = 0.5
STOP_TIMEOUT_S: Final = 5.0  # a runner's clean-up (closing QUIC) after its cancellation
DEFAULT_RUNNER: Final = "services.edge.tunnels.runner:TunnelRunner"
_REASON_MAX: Final = 300  # of the runner's reason text in an event (Event.message ≤ 1024)
_RUNNER_STATES: Final = frozenset(state.value for state in TunnelState) - {TunnelState.STOPPED.value}
_log = logging.getLogger("mediaplane.tunnels")


class Runner(Protocol):
    """What the worker needs of a ``TunnelRunner`` (``services/edge/tunnels/runner.py``)."""

    state: str
    counters: Any  # a dataclass with the fields of ``TunnelCounters``

    async def run(self) -> None: ...


class RunnerFactory(Protocol):
    def __call__(
        self,
        tunnel: TunnelConfig,
        *,
        edge_id: str | None,
        software_version: str,
        on_state: Callable[[str, str | None], None],
    ) -> Runner: ...


class CommandRefused(Exception):
    """A command the worker answers ``ok: false``; the text is user-facing (no secret)."""


# --------------------------------------------------------------------------- events


def _details(tunnel: TunnelConfig, state: str, reason: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {"tunnel_id": str(tunnel.id), "tunnel_name": tunnel.name, "state": state}
    if reason:
        details["reason"] = reason[:_REASON_MAX]
    return details


def _with_reason(text: str, reason: str | None) -> str:
    return f"{text}: {reason[:_REASON_MAX]}" if reason else text


def started_event(tunnel: TunnelConfig) -> Event:
    return info(EventCategory.TUNNEL, f"tunnel '{tunnel.name}' started", **_details(tunnel, "Connecting", None))


def stopped_event(tunnel: TunnelConfig) -> Event:
    return info(EventCategory.TUNNEL, f"tunnel '{tunnel.name}' stopped", **_details(tunnel, "Stopped", None))


def transition_event(tunnel: TunnelConfig, old: str, new: str, reason: str | None) -> Event | None:
    """The one event of a state change ``old`` → ``new`` (interop.md 11, ``tunnel``), or None.

    Connecting ⇄ Waiting and Failed → Connecting (a retry) are quiet: the first is the normal
    course of a relay bind, the second follows the critical event already sent.
    """
    if old == new:
        return None
    name = tunnel.name
    if new == TunnelState.CONNECTED:
        return info(EventCategory.TUNNEL, f"tunnel '{name}' connected", **_details(tunnel, new, reason))
    if new in (TunnelState.CONNECTING, TunnelState.WAITING) and old == TunnelState.CONNECTED:
        text = _with_reason(f"tunnel '{name}': relay link or peer down", reason)
        return warning(EventCategory.TUNNEL, text, **_details(tunnel, new, reason))
    if new == TunnelState.FAILED:
        # interop.md 8.2: the relay's bind checks; the runner says "bind rejected" in its reason.
        what = "bind rejected" if reason and "bind" in reason.lower() else "failed"
        text = _with_reason(f"tunnel '{name}' {what}", reason)
        return critical(EventCategory.TUNNEL, text, **_details(tunnel, new, reason))
    return None


# --------------------------------------------------------------------------- the worker


@dataclasses.dataclass
class _Running:
    tunnel: TunnelConfig
    runner: Runner | None = None
    state: str = TunnelState.CONNECTING.value
    scope: trio.CancelScope = dataclasses.field(default_factory=trio.CancelScope)
    done: trio.Event = dataclasses.field(default_factory=trio.Event)


def counters_of(runner: Runner) -> dict[str, int]:
    """The runner's counters as the report carries them: the fields of ``TunnelCounters`` only."""
    source = runner.counters
    return {name: int(getattr(source, name, 0) or 0) for name in TunnelCounters.model_fields}


class TunnelWorker:
    """Tunnels of this worker, keyed by id, and the command handlers (a dispatch table)."""

    def __init__(
        self,
        link: MessageStream,
        nursery: trio.Nursery,
        factory: RunnerFactory | None,
        *,
        software_version: str,
        unavailable: str | None = None,
    ) -> None:
        self.link = link
        self.nursery = nursery
        self.factory = factory
        self.software_version = software_version
        self.unavailable = unavailable  # why no runner could be loaded (every start is refused)
        self.tunnels: dict[str, _Running] = {}
        self._events: list[dict[str, Any]] = []
        self._handlers = {"start_tunnel": self._start_tunnel, "stop_tunnel": self._stop_tunnel}

    async def serve(self) -> None:
        """Answer commands until ``shutdown`` or the end of the link."""
        await serve_commands(
            self.link,
            self._handlers,
            refused=(CommandRefused,),
            refusal_text=str,
            # The exception's text could quote a tunnel's secrets: only its type is told.
            internal_text=lambda exc: f"tunnel worker error: {type(exc).__name__}",
            log=_log,
            log_traceback=False,
        )

    async def _start_tunnel(self, message: dict[str, Any]) -> None:
        if self.factory is None:
            raise CommandRefused(self.unavailable or "no tunnel runner")
        try:
            tunnel = TunnelConfig.model_validate(message["tunnel"])
        except (ValidationError, KeyError, TypeError):
            raise CommandRefused("invalid tunnel configuration") from None  # the error would echo secrets
        tunnel_id = str(tunnel.id)
        if tunnel_id in self.tunnels:
            raise CommandRefused(f"tunnel '{tunnel_id}' is already running")
        edge_id = message.get("edge_id")
        entry = _Running(tunnel)
        try:
            entry.runner = self.factory(
                tunnel,
                edge_id=str(edge_id) if edge_id else None,
                software_version=self.software_version,
                on_state=partial(self._on_state, entry),
            )
        except Exception as exc:  # a runner that refuses its configuration
            _log.error("tunnel %s could not be created (%s)", tunnel_id, type(exc).__name__)
            raise CommandRefused(f"tunnel could not be created: {type(exc).__name__}") from None
        entry.state = str(entry.runner.state or TunnelState.CONNECTING.value)
        self.tunnels[tunnel_id] = entry
        self._events.append(_dump(started_event(tunnel)))
        await self.nursery.start(self._run, entry)

    async def _run(self, entry: _Running, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert entry.runner is not None
        try:
            with entry.scope:
                task_status.started()
                try:
                    await entry.runner.run()
                except Exception as exc:  # the tunnel boundary: this tunnel fails, the others run on
                    _log.error("tunnel %s: runner failed", entry.tunnel.id, exc_info=exc)
                    self._on_state(entry, TunnelState.FAILED.value, f"internal error ({type(exc).__name__})")
                    return
                if not entry.scope.cancel_called:
                    self._on_state(entry, TunnelState.FAILED.value, "tunnel runner ended")
        finally:
            entry.done.set()

    async def _stop_tunnel(self, message: dict[str, Any]) -> None:
        try:
            tunnel_id = str(message["tunnel_id"])
        except KeyError:
            raise CommandRefused("malformed command: missing 'tunnel_id'") from None
        entry = self.tunnels.pop(tunnel_id, None)
        if entry is None:
            return  # idempotent: the control process may stop what it could not see start
        entry.scope.cancel()
        with trio.move_on_after(STOP_TIMEOUT_S):
            await entry.done.wait()
        if not entry.done.is_set():
            _log.warning("tunnel %s did not stop within %g s", tunnel_id, STOP_TIMEOUT_S)
        self._events.append(_dump(stopped_event(entry.tunnel)))

    def _on_state(self, entry: _Running, state: str, reason: str | None) -> None:
        """The runner's ``on_state``: one event per change, nothing while the state holds."""
        if state == entry.state or self.tunnels.get(str(entry.tunnel.id)) is not entry:
            return  # the same state again, or a tunnel already stopped
        event = transition_event(entry.tunnel, entry.state, state, reason)
        entry.state = state
        if event is not None:
            self._events.append(_dump(event))

    def report_message(self) -> dict[str, Any]:
        """The ``tunnels`` report of this moment (a running runner whose ``state`` moved without
        calling ``on_state`` is caught up here, so its event is not lost; one that ended stays
        as its end left it)."""
        tunnels: dict[str, Any] = {}
        for tunnel_id, entry in list(self.tunnels.items()):
            runner = entry.runner
            if runner is None:
                continue
            current = str(runner.state)
            if not entry.done.is_set() and current in _RUNNER_STATES and current != entry.state:
                self._on_state(entry, current, None)
            tunnels[tunnel_id] = {"state": entry.state, "counters": counters_of(runner)}
        return {"op": "tunnels", "tunnels": tunnels}

    async def report(self) -> None:
        """Every ``REPORT_INTERVAL_S``: the events since the last report, then every tunnel."""
        while True:
            await trio.sleep(REPORT_INTERVAL_S)
            await self.flush()

    async def flush(self) -> None:
        report = self.report_message()
        events, self._events = self._events, []
        if events:
            await self.link.send({"op": "events", "events": events})
        await self.link.send(report)


def _dump(event: Event) -> dict[str, Any]:
    return event.model_dump(mode="json", exclude_none=True)


def load_factory(spec: str) -> RunnerFactory:
    """``module:attribute`` → the runner factory (``DEFAULT_RUNNER``, or a test's fake)."""
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    factory: RunnerFactory = getattr(module, attribute or "TunnelRunner")
    return factory


async def _main(fd: int, runner: str, software_version: str) -> None:
    sock = socket.socket(fileno=fd)
    link = MessageStream(trio.SocketStream(trio.socket.from_stdlib_socket(sock)))
    factory: RunnerFactory | None = None
    unavailable = None
    try:
        factory = load_factory(runner)
    except Exception as exc:  # the worker stays up and refuses every start with the reason
        unavailable = f"tunnels are not available on this edge: the tunnel runner did not load ({type(exc).__name__})"
        _log.error("%s: %s", unavailable, exc)
    async with trio.open_nursery() as nursery:
        worker = TunnelWorker(link, nursery, factory, software_version=software_version, unavailable=unavailable)
        try:
            await link.send({"op": "ready"})
            nursery.start_soon(worker.report)
            await worker.serve()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the control process went away: so do we
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mediaplane-tunnel-worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--software-version", default="0")
    parser.add_argument("--runner", default=DEFAULT_RUNNER, help="the runner factory, module:attribute")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s tunnel-worker %(name)s: %(message)s",
        stream=sys.stderr,
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the control process stops us, not the console
    try:
        trio.run(_main, args.fd, args.runner, args.software_version)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
