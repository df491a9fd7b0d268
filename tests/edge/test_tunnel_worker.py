"""The tunnel worker process under its supervisor, with the fake runner of ``tunnel_fakes``.

Real processes and a real socketpair; the fake runner is driven through files. Every wait is
an awaited condition bounded by ``trio.fail_after`` (no autojump clock: another process runs).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

from appliance.models.config import TunnelConfig
from appliance.models.events import Event, Severity
from appliance.models.stats import TunnelState
from services.edge.tunnels.supervisor import WORKER_EXITED, TunnelError, TunnelSupervisor
from services.edge.tunnels.worker import transition_event

FAKE = "tests.edge.tunnel_fakes:FakeRunner"
KEY = "ab" * 32
WAIT_S = 20.0  # bounds a whole test: the worker's imports take a second or two on a loaded box


def tunnel(name: str = "t", **fields: object) -> TunnelConfig:
    return TunnelConfig.model_validate(
        {
            "id": str(uuid.uuid4()),
            "name": name,
            "protocol": "udp",
            "mode": "relay",
            "direction": "egress",
            "local_addr": "127.0.0.1:7000",
            "relay_addr": "relay.example:4433",
            "tunnel_encryption_key": KEY,
            **fields,
        }
    )


async def until(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(WAIT_S):
        while not condition():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what}")


class Rig:
    def __init__(self, fake_dir: Path, runner: str = FAKE) -> None:
        self.dir = fake_dir
        self.events: list[Event] = []
        self.states_at_event: list[TunnelState] = []
        self.supervisor = TunnelSupervisor(
            on_event=self._event, software_version="9.9.9", log_level="warning", runner=runner
        )
        self.watched: str | None = None

    def _event(self, event: Event) -> None:
        self.events.append(event)
        if self.watched is not None:
            self.states_at_event.append(self.supervisor.state(self.watched))

    def drive(self, t: TunnelConfig, line: str) -> None:
        (self.dir / f"{t.id}.state").write_text(line)

    def runs(self, t: TunnelConfig) -> int:
        path = self.dir / f"{t.id}.runs"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def messages(self, t: TunnelConfig) -> list[tuple[Severity, str]]:
        return [
            (e.severity, e.message)
            for e in self.events
            if e.details is not None and e.details.get("tunnel_id") == str(t.id)
        ]


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    monkeypatch.setenv("FAKE_TUNNEL_DIR", str(tmp_path))
    rig = Rig(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(rig.supervisor.run)
        yield rig
        with trio.fail_after(10):
            await rig.supervisor.shutdown()
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- the event rules


@pytest.mark.parametrize(
    ("old", "new", "reason", "expected"),
    [
        ("Connecting", "Connected", None, (Severity.INFO, "tunnel 't' connected")),
        ("Waiting", "Connected", None, (Severity.INFO, "tunnel 't' connected")),
        (
            "Connected",
            "Connecting",
            "relay closed",
            (Severity.WARNING, "tunnel 't': relay link or peer down: relay closed"),
        ),
        ("Connected", "Waiting", None, (Severity.WARNING, "tunnel 't': relay link or peer down")),
        (
            "Connecting",
            "Failed",
            "bind rejected: bad token",
            (Severity.CRITICAL, "tunnel 't' bind rejected: bind rejected: bad token"),
        ),
        ("Connected", "Failed", "handshake timed out", (Severity.CRITICAL, "tunnel 't' failed: handshake timed out")),
        ("Connecting", "Waiting", None, None),
        ("Waiting", "Connecting", None, None),
        ("Failed", "Connecting", None, None),
        ("Connected", "Connected", None, None),
    ],
)
def test_one_event_per_transition_as_interop_11_says(
    old: str, new: str, reason: str | None, expected: tuple[Severity, str] | None
) -> None:
    event = transition_event(tunnel(), old, new, reason)
    if expected is None:
        assert event is None
        return
    assert event is not None
    assert (event.severity, event.message) == expected
    assert event.category == "tunnel" and event.details is not None and event.details["state"] == new


# --------------------------------------------------------------------------- the worker process


async def test_start_report_transitions_and_stop(rig: Rig) -> None:
    sup, t = rig.supervisor, tunnel()
    tid = str(t.id)
    assert sup.state(tid) is TunnelState.STOPPED and sup.worker_pid() is None  # spawned on demand
    with trio.fail_after(WAIT_S):
        await sup.start_tunnel(t, edge_id="5b0c9d7e-1f2a-4b3c-8d4e-6f7a8b9c0d1e")
    assert sup.worker_pid() is not None
    assert sup.state(tid) is TunnelState.CONNECTING
    # The worker rebuilt the TunnelConfig with its secret revealed, and got edge id and version.
    assert (rig.dir / f"{tid}.secret").read_text() == KEY
    assert (rig.dir / f"{tid}.edge").read_text() == "5b0c9d7e-1f2a-4b3c-8d4e-6f7a8b9c0d1e 9.9.9"

    rig.drive(t, "Connected")
    await until(lambda: sup.state(tid) is TunnelState.CONNECTED, "Connected")
    await until(lambda: sup.counters(tid).bytes_sent > 0, "counters")
    counters = sup.counters(tid)
    assert counters.replayed == 3 and counters.decrypt_errors == 2 and counters.datagrams_sent > 0
    first = sup.counters(tid).bytes_sent
    await until(lambda: sup.counters(tid).bytes_sent > first, "counters to move on")  # reported again and again

    rig.drive(t, "Waiting")
    await until(lambda: sup.state(tid) is TunnelState.WAITING, "Waiting")
    rig.drive(t, "Failed bind rejected: unknown tunnel")
    await until(lambda: sup.state(tid) is TunnelState.FAILED, "Failed")
    # The runner says its state on every poll: the events stay one per transition.
    await until(lambda: len(rig.messages(t)) >= 4, "the events")
    with trio.fail_after(WAIT_S):
        await sup.stop_tunnel(tid)
    assert sup.state(tid) is TunnelState.STOPPED and sup.counters(tid).bytes_sent == 0
    await until(lambda: any("stopped" in m for _, m in rig.messages(t)), "the stopped event")
    assert rig.messages(t) == [
        (Severity.INFO, "tunnel 't' started"),
        (Severity.INFO, "tunnel 't' connected"),
        (Severity.WARNING, "tunnel 't': relay link or peer down"),
        (Severity.CRITICAL, "tunnel 't' bind rejected: bind rejected: unknown tunnel"),
        (Severity.INFO, "tunnel 't' stopped"),
    ]
    assert sup.rejected_reports == 0  # the fake's extra counter field is not sent
    assert KEY not in repr(rig.events)


async def test_a_killed_worker_fails_its_tunnels_then_is_respawned_and_restarts_them(rig: Rig) -> None:
    sup = rig.supervisor
    first, second, stopped = tunnel("first"), tunnel("second"), tunnel("stopped")
    with trio.fail_after(WAIT_S):
        for t in (first, second, stopped):
            await sup.start_tunnel(t, edge_id=None)
        await sup.stop_tunnel(str(stopped.id))
    rig.drive(first, "Connected")
    await until(lambda: sup.state(str(first.id)) is TunnelState.CONNECTED, "Connected")
    pid = sup.worker_pid()
    assert pid is not None
    rig.watched = str(first.id)
    mark = len(rig.events)

    os.kill(pid, signal.SIGKILL)

    def lost() -> list[Event]:
        return [e for e in rig.events[mark:] if e.details is not None and e.details.get("reason") == WORKER_EXITED]

    await until(lambda: len(lost()) == 2, "a critical event per tunnel")
    assert {e.details["tunnel_id"] for e in lost() if e.details} == {str(first.id), str(second.id)}
    assert all(e.severity is Severity.CRITICAL and e.category == "tunnel" for e in lost())
    assert TunnelState.FAILED in rig.states_at_event  # Failed while the worker was down

    await until(lambda: sup.worker_pid() not in (None, pid), "a new worker")
    await until(lambda: rig.runs(first) == 2 and rig.runs(second) == 2, "both tunnels started again")
    await until(lambda: sup.state(str(first.id)) is TunnelState.CONNECTED, "Connected again")
    assert rig.runs(stopped) == 1  # a stopped tunnel is not brought back
    assert sup.state(str(stopped.id)) is TunnelState.STOPPED
    assert sup.restarts == 1


async def test_a_refused_or_failing_runner_is_failed_and_the_others_run_on(rig: Rig) -> None:
    sup = rig.supervisor
    good, refused, exploding = tunnel("good"), tunnel("refuse"), tunnel("explode")
    with trio.fail_after(WAIT_S):
        await sup.start_tunnel(good, edge_id=None)
        with pytest.raises(TunnelError, match="could not be created: ValueError"):
            await sup.start_tunnel(refused, edge_id=None)
        await sup.start_tunnel(exploding, edge_id=None)
    assert sup.state(str(refused.id)) is TunnelState.FAILED
    await until(lambda: sup.state(str(exploding.id)) is TunnelState.FAILED, "the exploding runner Failed")
    await until(lambda: any(s is Severity.CRITICAL for s, _ in rig.messages(exploding)), "its critical event")
    rig.drive(good, "Connected")
    await until(lambda: sup.state(str(good.id)) is TunnelState.CONNECTED, "the good one to run on")
    with trio.fail_after(WAIT_S):
        await sup.stop_tunnel(str(refused.id))
    assert sup.state(str(refused.id)) is TunnelState.STOPPED


async def test_a_runner_that_does_not_load_refuses_every_start_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TUNNEL_DIR", str(tmp_path))
    rig = Rig(tmp_path, runner="tests.edge.no_such_module:Runner")
    t = tunnel()
    async with trio.open_nursery() as nursery:
        await nursery.start(rig.supervisor.run)
        with trio.fail_after(WAIT_S):
            with pytest.raises(TunnelError, match="tunnels are not available on this edge"):
                await rig.supervisor.start_tunnel(t, edge_id=None)
            assert rig.supervisor.state(str(t.id)) is TunnelState.FAILED
            await rig.supervisor.shutdown()
        nursery.cancel_scope.cancel()


async def test_the_worker_exits_when_its_link_closes() -> None:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "services.edge.tunnels.worker", "--fd", str(child.fileno()), "--runner", FAKE],
            pass_fds=(child.fileno(),),
        )
    finally:
        child.close()
    try:
        with trio.fail_after(WAIT_S):
            ready = await trio.to_thread.run_sync(parent.recv, 4096)
            assert b'"ready"' in ready
            parent.close()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
