"""The engine side of the WebRTC kinds: a kind's registration with the webrtc worker, against a
scripted worker on a real Unix socket (``engine/kinds/webrtc.py``)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from appliance.models.config import WebrtcOutput
from appliance.models.events import Event
from services.edge.engine.ipc import MessageStream
from services.edge.engine.kinds import webrtc as kinds

VIEWER = {
    "session_id": "s1",
    "role": "viewer",
    "state": "connected",
    "peer": "127.0.0.1:50000",
    "bytes": 1000,
    "bitrate_bps": 8000,
    "connected_secs": 3,
}


class FakeFlow:
    flow_id = "f1"
    ssrc = 1234

    def __init__(self) -> None:
        self.events: list[Event] = []

    def publish(self, event: Event) -> None:
        self.events.append(event)


async def until(condition: Callable[[], object]) -> None:
    """An awaited condition (the registration runs on real sockets), bounded by the caller."""
    while not condition():
        await trio.sleep(0.01)


@pytest.fixture
def worker_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    path = str(tmp_path / "kinds.sock")
    monkeypatch.setattr(kinds, "WEBRTC_SOCKET", path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the scripted worker's listening socket
    sock.bind(path)
    sock.listen(4)
    return sock


async def test_a_registration_follows_the_worker_and_survives_its_restart(worker_socket: socket.socket) -> None:
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(worker_socket))
    flow = FakeFlow()
    output = WebrtcOutput(type="webrtc", id="w", name="w", mode="whep_server", max_viewers=2)
    driver = kinds.WebrtcOutputDriver(output, flow)  # type: ignore[arg-type]
    registration = driver.registration
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.serve)
            assert registration.state("waiting") == "connecting" and not registration.active

            # The worker takes the registration, reports a viewer and an event.
            link = MessageStream(await listener.accept())
            message: dict[str, Any] | None = await link.receive()
            assert message is not None and message["op"] == "register" and message["role"] == "output"
            assert message["flow_id"] == "f1" and message["output_id"] == "w" and message["config"]["max_viewers"] == 2
            await link.send({"op": "registered", "media_port": 9})
            await link.send({"op": "status", "state": "active", "active": True, "sessions": [VIEWER]})
            await link.send({"op": "event", "severity": "info", "message": "WebRTC viewer connected", "details": {}})
            await until(lambda: registration.active and flow.events)
            assert flow.events[0].category == "webrtc" and flow.events[0].flow_id == "f1"
            counters = driver.counters()
            assert counters.state == "active" and counters.webrtc_stats is not None
            assert counters.webrtc_stats.sessions[0].peer == "127.0.0.1:50000"
            # Active: TS goes to the worker's port (the udp output inside) until it is not.
            await until(lambda: driver._udp is not None)
            assert driver._port == 9

            # The worker dies: its sessions failed, a warning, no more TS for it.
            await link.aclose()
            await until(lambda: not registration.registered)
            assert registration.state("waiting") == "error"
            lost = registration.stats()
            assert [s.state for s in lost.sessions] == ["failed"] and lost.worker_connected is False
            assert any("webrtc worker exited" in e.message and e.severity == "warning" for e in flow.events)
            await until(lambda: driver._udp is None)

            # The restarted worker takes the registration again.
            link = MessageStream(await listener.accept())
            message = await link.receive()
            assert message is not None and message["op"] == "register"
            await link.send({"op": "registered", "media_port": 10})
            await link.send({"op": "status", "state": "waiting", "active": False, "sessions": []})
            await until(lambda: registration.registered and registration.status.get("state") == "waiting")
            assert registration.registrations == 2 and driver.counters().state == "waiting"

            # A hot removal ends serve, and with it the registration (the worker sees EOF).
            driver.close()
            assert await link.receive() is None
