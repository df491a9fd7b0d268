"""The WebRTC kinds on the engine side: ``webrtc`` (WHIP server) and ``whep`` (WHEP client) inputs,
the ``webrtc`` output (``whep_server`` or ``whip_client``).

The peers themselves live in the webrtc worker process (asyncio + aiortc, see
``services/edge/webrtc``); these drivers keep the flow's side thin:

- each **registers** with the worker over its Unix socket (``WEBRTC_SOCKET``, given to the engine
  worker as ``--webrtc-socket``) and holds that connection for its life: the worker ends the
  kind's sessions when it closes, and the kind registers again when the worker was restarted
  (its sessions are reported failed, with a ``webrtc`` warning event);
- **media** crosses as loopback UDP datagrams of whole TS packets: an input binds
  ``127.0.0.1:0`` and receives the worker's TS exactly like a ``udp`` input; an output sends to
  the port the worker bound for it, through the ``udp`` output driver, and only while the
  worker says it is ``active`` (a viewer watches, or its WHIP session runs);
- the worker's **status** (state, sessions) becomes the kind's state and ``webrtc_stats``, and its
  **events** are published as the flow's ``webrtc`` events.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import trio

from appliance.models.config import OutputConfig, UdpInput, UdpOutput, WebrtcInput, WebrtcOutput, WhepInput
from appliance.models.events import EventCategory, Severity, info, warning
from appliance.models.stats import OutputCounters, WebrtcSession, WebrtcStats
from services.edge.engine.ipc import FrameError, MessageStream
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.kinds.udp import UdpInputDriver
from services.edge.engine.udp import UdpOutputDriver

_log = logging.getLogger("mediaplane.engine")

WEBRTC_SOCKET: str | None = None  # set by the engine worker from --webrtc-socket
RETRY_S: Final = 0.5


class WorkerRegistration:
    """One kind's registration with the webrtc worker, kept up (see the module docstring)."""

    def __init__(self, flow: FlowPort, message: dict[str, Any]) -> None:
        self.flow = flow
        self.message = message
        self.registered = False
        self.reply: dict[str, Any] = {}
        self.status: dict[str, Any] = {}
        self.lost = False  # the worker went away since the last registration
        self.registrations = 0
        self.changed = trio.Event()

    @property
    def active(self) -> bool:
        return self.registered and bool(self.status.get("active"))

    def sessions(self) -> list[WebrtcSession]:
        out = []
        for raw in self.status.get("sessions", []):
            try:
                out.append(WebrtcSession.model_validate(raw))
            except ValueError:
                continue
        return out

    def stats(self) -> WebrtcStats:
        return WebrtcStats(sessions=self.sessions(), worker_connected=self.registered)

    def state(self, fallback: str) -> str:
        if not self.registered:  # the sessions of a lost worker stay listed, failed, until it is back
            return "error" if self.lost else "connecting"
        return str(self.status.get("state") or fallback)

    async def run(self) -> None:
        """Register, follow the worker's pushes; on a broken link report it and register again."""
        while True:
            try:
                await self._session()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, FrameError):
                pass
            if self.registered:
                self._worker_lost()
            self.registered = False
            self.changed.set()
            await trio.sleep(RETRY_S)

    async def _session(self) -> None:
        if WEBRTC_SOCKET is None:
            raise OSError("no webrtc worker")
        stream = await trio.open_unix_socket(WEBRTC_SOCKET)
        link = MessageStream(stream)
        try:
            await link.send(self.message)
            reply = await link.receive()
            if reply is None:
                return
            if reply.get("op") != "registered":
                self._publish(Severity.WARNING, f"WebRTC: {reply.get('error', 'registration refused')}", {})
                await trio.sleep(5)  # a refusal does not change by retrying at once
                return
            self.reply = reply
            self.registered = True
            self.registrations += 1
            self.lost = False
            self.changed.set()
            while True:
                message = await link.receive()
                if message is None:
                    return
                op = message.get("op")
                if op == "status":
                    was_active = self.active
                    self.status = message
                    if self.active != was_active:
                        self.changed.set()
                elif op == "event":
                    severity = Severity(str(message.get("severity", "info")))
                    raw = message.get("details")
                    self._publish(severity, str(message.get("message", "")), raw if isinstance(raw, dict) else {})
        finally:
            await link.aclose()

    def _worker_lost(self) -> None:
        """The worker died: every session it held ended (architecture: its sessions go to Error)."""
        self.lost = True
        ended = [s for s in self.sessions() if s.state == "connected"]
        self.status = {
            "state": "error",
            "active": False,
            "sessions": [{**s.model_dump(), "state": "failed"} for s in self.sessions()],
        }
        self._publish(
            Severity.WARNING,
            "WebRTC session failed: the webrtc worker exited (it is being restarted)",
            {"sessions_ended": len(ended)},
        )

    def _publish(self, severity: Severity, message: str, details: dict[str, Any]) -> None:
        make = warning if severity != Severity.INFO else info
        self.flow.publish(make(EventCategory.WEBRTC, message, flow_id=self.flow.flow_id, **details))


class WebrtcInputDriver(UdpInputDriver):
    """``webrtc`` (WHIP server) and ``whep`` (WHEP client) inputs: TS from the worker on a loopback
    port, received like a ``udp`` input's."""

    def __init__(self, config: WebrtcInput | WhepInput, flow: FlowPort) -> None:
        # An ephemeral loopback port (the model's port rule is for users' addresses, not this).
        super().__init__(UdpInput.model_construct(type="udp", bind_addr="127.0.0.1:0", interface_addr=None), flow)
        self.webrtc_config = config
        self.registration: WorkerRegistration | None = None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.sock is not None
        port = self.sock.getsockname()[1]
        self.registration = WorkerRegistration(
            self.flow,
            {
                "op": "register",
                "role": "input",
                "flow_id": self.flow.flow_id,
                "config": self.webrtc_config.model_dump(mode="json"),
                "media_port": port,
            },
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.registration.run)
            await nursery.start(super().serve)
            task_status.started()

    def state(self, now_monotonic: float) -> str:
        signal = self.flow.signal_state(now_monotonic)
        if signal == "receiving":
            return signal
        if self.registration is None:
            return "connecting"
        return self.registration.state("waiting")

    def extra_counters(self) -> dict[str, Any]:
        if self.registration is None:
            return {}
        stats = self.registration.stats()
        peer = next((s.peer for s in stats.sessions if s.state == "connected" and s.peer), None)
        return {"webrtc_stats": stats, "peer_addr": peer}


class WebrtcOutputDriver:
    """``webrtc`` output: the flow's TS to the worker's loopback port (a ``udp`` output inside),
    only while the worker says the output is ``active``."""

    def __init__(self, config: WebrtcOutput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.output_id = config.id
        self.registration = WorkerRegistration(
            flow,
            {
                "op": "register",
                "role": "output",
                "flow_id": flow.flow_id,
                "output_id": config.id,
                "config": config.model_dump(mode="json"),
            },
        )
        self._udp: UdpOutputDriver | None = None
        self._port: int | None = None
        self._closed = False
        self._scope: trio.CancelScope | None = None
        self.packets_sent = 0
        self.bytes_sent = 0
        self.packets_dropped = 0
        self._opened_at = time.monotonic()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            # close() (a hot removal) ends serve, the registration with it: the worker then ends
            # the sessions (a WHIP client's DELETE goes out).
            self._scope = nursery.cancel_scope
            nursery.start_soon(self.registration.run)
            task_status.started()
            while not self._closed:
                await self.registration.changed.wait()
                self.registration.changed = trio.Event()
                opened = self._follow()
                if opened is not None:
                    nursery.start_soon(opened.run_writer)

    def _follow(self) -> UdpOutputDriver | None:
        """(Re)open the inner udp output when the worker's port is known and the output active."""
        port = self.registration.reply.get("media_port") if self.registration.registered else None
        want = self.registration.active and isinstance(port, int)
        if self._udp is not None and (not want or port != self._port):
            self._retire()
        if want and self._udp is None and not self._closed:
            udp = UdpOutputDriver(
                UdpOutput(type="udp", id=self.output_id, name=self.config.name, dest_addr=f"127.0.0.1:{port}", dscp=0),
                ssrc=self.flow.ssrc,
            )
            udp.open()
            self._udp, self._port = udp, port
            return udp
        return None

    def _retire(self) -> None:
        udp = self._udp
        if udp is None:
            return
        self.packets_sent += udp.packets_sent
        self.bytes_sent += udp.bytes_sent
        self.packets_dropped += udp.packets_dropped
        udp.close()
        self._udp = None

    def offer(self, datagram: bytes | None, payload: memoryview, arrival: float) -> None:
        if self._udp is not None:
            self._udp.offer(datagram, payload, arrival)

    def flush(self) -> None:
        if self._udp is not None:
            self._udp.flush()

    def slot_layout(self, header_len: int, size: int) -> tuple[int, int] | None:
        return None  # the inner output changes with the worker's state: the flow offers

    def send_slots(self, buffer: bytearray, offset: int, stride: int, length: int, count: int) -> None:
        raise AssertionError("slot_layout is None: the flow offers instead")

    def close(self) -> None:
        self._closed = True
        self._retire()
        self.registration.changed.set()
        if self._scope is not None:
            self._scope.cancel()

    def counters(self) -> OutputCounters:
        udp = self._udp
        return OutputCounters(
            output_id=self.output_id,
            state=self.registration.state("waiting"),
            packets_sent=self.packets_sent + (udp.packets_sent if udp else 0),
            bytes_sent=self.bytes_sent + (udp.bytes_sent if udp else 0),
            packets_dropped=self.packets_dropped + (udp.packets_dropped if udp else 0),
            webrtc_stats=self.registration.stats(),
        )


def open_webrtc_output(config: OutputConfig, flow: FlowPort) -> WebrtcOutputDriver:
    assert isinstance(config, WebrtcOutput)
    return WebrtcOutputDriver(config, flow)


__all__ = ["WEBRTC_SOCKET", "WebrtcInputDriver", "WebrtcOutputDriver", "WorkerRegistration", "open_webrtc_output"]
