"""SRT inputs and outputs of the engine, on ``engine.srt``'s leg runners (libsrt).

An SRT output carries raw MPEG-TS in 1316-byte messages (7 x 188, SRT's live-mode
default payload), fanned out to every connected peer of each leg: a caller has one,
a listener up to ``SRT_LISTENER_MAX_VIEWERS`` viewers, and a ``redundancy`` leg gets
every message too. Sending never waits: a peer whose send buffer is full drops that
message (counted). Connection trouble is the output's ``state``
(``connecting``/``connected``/``broken``), never a flow failure.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trio

from appliance.errors import InvalidInput
from appliance.models.config import SrtEndpoint, SrtLeg, SrtOutput
from services.edge.engine.srt import SrtError, SrtLegEvent, SrtLegRunner, SrtPeerConnected, SrtPeerDisconnected
from services.edge.engine.srt import check_supported as check_leg_supported
from services.edge.engine.udp import TS_DATAGRAM, FlowStartError

SRT_LISTENER_MAX_VIEWERS: Final = 16
_log = logging.getLogger("mediaplane.engine")
_LEG_FIELDS: Final = frozenset(SrtLeg.model_fields)


def legs_of(endpoint: SrtEndpoint) -> list[SrtLeg]:
    """The first leg, and the ``redundancy`` leg when there is one."""
    first = SrtLeg.model_validate({k: v for k, v in endpoint.model_dump().items() if k in _LEG_FIELDS})
    return [first] if endpoint.redundancy is None else [first, endpoint.redundancy]


def check_supported(endpoint: SrtEndpoint) -> None:
    """InvalidInput (400) when the installed libsrt cannot run a leg of ``endpoint``."""
    for leg in legs_of(endpoint):
        check_leg_supported(leg)


def log_event(flow_id: str, where: str, leg: int) -> Any:
    """An ``on_event`` for a runner that logs state changes (the manager uplink comes later)."""

    def on_event(event: SrtLegEvent) -> None:
        if isinstance(event, SrtPeerConnected):
            _log.info("flow %s %s leg %d: SRT peer %s connected", flow_id, where, leg + 1, event.peer_addr)
        elif isinstance(event, SrtPeerDisconnected):
            _log.warning(
                "flow %s %s leg %d: SRT peer %s disconnected: %s",
                flow_id,
                where,
                leg + 1,
                event.peer_addr,
                event.reason,
            )
        else:
            _log.info("flow %s %s leg %d: %s", flow_id, where, leg + 1, event)

    return on_event


async def start_runners(runners: list[SrtLegRunner], nursery: trio.Nursery, what: str) -> None:
    """Start each runner; a refused option set or a failed bind is a FlowStartError."""
    for runner in runners:
        try:
            await nursery.start(runner.run)
        except (InvalidInput, SrtError, OSError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise FlowStartError(f"{what}: {message}") from exc


class SrtOutputDriver:
    """An ``srt`` output: the engine's output-driver interface over one or two leg runners."""

    def __init__(self, config: SrtOutput, flow_id: str) -> None:
        self.config = config
        self.output_id = config.id
        self.runners = [
            SrtLegRunner(leg, max_peers=SRT_LISTENER_MAX_VIEWERS, on_event=log_event(flow_id, f"output {config.id}", i))
            for i, leg in enumerate(legs_of(config))
        ]
        self.packets_sent = 0
        self.bytes_sent = 0
        self.fec_packets_sent = 0
        self._carry = bytearray()
        self._scope = trio.CancelScope()

    def open(self) -> None:
        """Nothing to open synchronously: the runners bind in ``serve``."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the legs; ready once each is accepted by libsrt (and bound, for a listener)."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                await start_runners(self.runners, nursery, f"output {self.output_id!r}")
                task_status.started()

    def offer(self, datagram: bytes | None, payload: memoryview, arrival: float) -> None:
        """Send the TS in 1316-byte messages on every leg; never waits."""
        if len(payload) == TS_DATAGRAM and not self._carry:
            self._send(payload)
            return
        carry = self._carry
        carry += payload
        while len(carry) >= TS_DATAGRAM:
            self._send(bytes(carry[:TS_DATAGRAM]))
            del carry[:TS_DATAGRAM]

    def _send(self, message: bytes | memoryview) -> None:
        taken = 0
        for runner in self.runners:
            taken += runner.send_nowait(message)
        if taken:
            self.packets_sent += 1
            self.bytes_sent += len(message)

    def flush(self) -> None:
        """Messages leave in ``offer``: libsrt paces them itself."""

    def close(self) -> None:
        self._scope.cancel()

    @property
    def packets_dropped(self) -> int:
        return sum(runner.messages_dropped for runner in self.runners)

    @property
    def state(self) -> str:
        states = [str(runner.state) for runner in self.runners]
        return "connected" if "connected" in states else states[0]

    def counters(self) -> dict[str, object]:
        stats = [runner.stats() for runner in self.runners]
        return {
            "output_id": self.output_id,
            "state": self.state,
            "packets_sent": self.packets_sent,
            "bytes_sent": self.bytes_sent,
            "packets_dropped": self.packets_dropped,
            "fec_packets_sent": 0,
            "srt_stats": stats[0],
            "srt_leg2_stats": stats[1] if len(stats) > 1 else None,
        }
