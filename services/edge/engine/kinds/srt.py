"""The ``srt`` input and output kinds, on ``engine.srt``'s leg runners (libsrt).

An SRT input delivers messages that are either raw TS (7 x 188) or RTP carrying TS,
told apart per message; with ``redundancy`` two legs are merged (RTP on the sequence
number, raw TS on the payload). An SRT output carries raw MPEG-TS in 1316-byte
messages (SRT's live-mode default payload), fanned out to every connected peer of each
leg: a caller has one, a listener up to ``SRT_LISTENER_MAX_VIEWERS`` viewers, and a
``redundancy`` leg gets every message too. Sending never waits: a peer whose send buffer
is full drops that message (counted). Connection trouble is the output's ``state``
(``connecting``/``connected``/``broken``) and an ``srt`` event, never a flow failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from appliance.errors import InvalidInput
from appliance.models.config import SrtEndpoint, SrtInput, SrtLeg, SrtOutput
from appliance.models.events import Event, EventCategory, critical, info, warning
from appliance.models.stats import OutputCounters, SrtLegStats
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.srt import (
    SrtConnectFailed,
    SrtError,
    SrtLegEvent,
    SrtLegRunner,
    SrtPeerConnected,
    SrtPeerDisconnected,
    SrtPeerRefused,
)
from services.edge.engine.srt import check_supported as check_leg_supported
from services.edge.engine.udp import TS_DATAGRAM, TS_PACKET, FlowStartError

SRT_LISTENER_MAX_VIEWERS: Final = 16
TIMER_TICK_S: Final = 0.002
_log = logging.getLogger("mediaplane.engine")
_LEG_FIELDS: Final = frozenset(SrtLeg.model_fields)


def legs_of(endpoint: SrtEndpoint) -> list[SrtLeg]:
    """The first leg, and the ``redundancy`` leg when there is one."""
    first = SrtLeg.model_validate({k: v for k, v in endpoint.model_dump().items() if k in _LEG_FIELDS})
    return [first] if endpoint.redundancy is None else [first, endpoint.redundancy]


def check_srt_supported(endpoint: Any) -> None:
    """InvalidInput (400) when the installed libsrt cannot run a leg of ``endpoint``."""
    assert isinstance(endpoint, SrtEndpoint)
    for leg in legs_of(endpoint):
        check_leg_supported(leg)


def leg_event(flow_id: str, where: str, leg: int, event: SrtLegEvent) -> Event | None:
    """interop.md 11 ``srt`` events of one leg runner's event (None: not worth one).

    A failed connect attempt is an event the first time after each outage only (the runner
    numbers them); the retries that follow are logged at debug.
    """
    name = f"SRT {where} leg {leg + 1}"
    if isinstance(event, SrtPeerConnected):
        return info(EventCategory.SRT, f"{name} connected to {event.peer_addr}", flow_id=flow_id, leg=leg + 1)
    if isinstance(event, SrtPeerDisconnected):
        return warning(
            EventCategory.SRT,
            f"{name}: peer {event.peer_addr} disconnected ({event.reason}); reconnecting",
            flow_id=flow_id,
            leg=leg + 1,
        )
    if isinstance(event, SrtConnectFailed):
        if event.attempt != 1:
            return None
        return critical(EventCategory.SRT, f"{name}: connection failed ({event.reason})", flow_id=flow_id, leg=leg + 1)
    if isinstance(event, SrtPeerRefused):
        return warning(
            EventCategory.SRT, f"{name}: refused {event.peer_addr} ({event.reason})", flow_id=flow_id, leg=leg + 1
        )
    return None


def _on_event(flow: FlowPort, where: str, leg: int) -> Callable[[SrtLegEvent], None]:
    def on_event(event: SrtLegEvent) -> None:
        _log.debug("flow %s %s leg %d: %s", flow.flow_id, where, leg + 1, event)
        made = leg_event(flow.flow_id, where, leg, event)
        if made is not None:
            flow.publish(made)

    return on_event


async def start_runners(runners: list[SrtLegRunner], nursery: trio.Nursery, what: str) -> None:
    """Start each runner; a refused option set or a failed bind is a FlowStartError."""
    for runner in runners:
        try:
            await nursery.start(runner.run)
        except (InvalidInput, SrtError, OSError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise FlowStartError(f"{what}: {message}") from exc


def _leg_stats(runners: list[SrtLegRunner]) -> dict[str, SrtLegStats | None]:
    stats = [SrtLegStats.model_validate(runner.stats()) for runner in runners]
    return {"srt_stats": stats[0], "srt_leg2_stats": stats[1] if len(stats) > 1 else None}


def _state(runners: list[SrtLegRunner]) -> str:
    states = [str(runner.state) for runner in runners]
    return "connected" if "connected" in states else states[0]


class SrtInputDriver:
    """One or two leg runners delivering messages to the flow (one peer per leg)."""

    def __init__(self, config: SrtInput, flow: FlowPort) -> None:
        self.flow = flow
        self.runners = [
            SrtLegRunner(
                leg,
                sink=self._sink(i),
                batch_end=flow.end_batch,  # send and analyse per batch, not per message
                max_peers=1,
                on_event=_on_event(flow, "input", i),
            )
            for i, leg in enumerate(legs_of(config))
        ]
        self.two_legs = len(self.runners) == 2

    def open(self) -> None:
        """Nothing to open synchronously: the runners bind in ``serve``."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await start_runners(self.runners, nursery, "input")
            if self.two_legs:
                nursery.start_soon(self._timers)
            task_status.started()

    def _sink(self, leg: int) -> Callable[[memoryview], None]:
        flow = self.flow

        def sink(message: memoryview) -> None:
            # Raw TS (7 x 188) or RTP carrying TS, told apart per message.
            arrival = time.monotonic()
            size = len(message)
            if size and message[0] == 0x47 and size % TS_PACKET == 0:
                flow.on_ts(leg, message, arrival)
                return
            header = flow.admit_rtp(message, None, arrival)
            if header is not None:
                flow.on_rtp(leg, message, arrival, header)

        return sink

    async def _timers(self) -> None:
        """Two legs over RTP: release what the merger holds once its deadlines pass."""
        while True:
            await trio.sleep(TIMER_TICK_S)
            self.flow.release(time.monotonic(), timers=True)
            self.flow.end_batch()

    def state(self, now_monotonic: float) -> str:
        return _state(self.runners)

    def extra_counters(self) -> dict[str, Any]:
        return _leg_stats(self.runners)

    def close(self) -> None:
        """The runners close with the flow's cancel scope."""


class SrtOutputDriver:
    """An ``srt`` output over one or two leg runners."""

    def __init__(self, config: SrtOutput, flow: FlowPort) -> None:
        self.config = config
        self.output_id = config.id
        where = f"output {config.id}"
        self.runners = [
            SrtLegRunner(leg, max_peers=SRT_LISTENER_MAX_VIEWERS, on_event=_on_event(flow, where, i))
            for i, leg in enumerate(legs_of(config))
        ]
        self.packets_sent = 0
        self.bytes_sent = 0
        self._carry = bytearray()
        self._scope = trio.CancelScope()

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

    def slot_layout(self, header_len: int, size: int) -> tuple[int, int] | None:
        return None  # SRT messages are made here (1316-byte TS), never sent from the slots

    def send_slots(self, buffer: bytearray, offset: int, stride: int, length: int, count: int) -> None:
        raise AssertionError("slot_layout is None: the flow offers instead")

    def close(self) -> None:
        self._scope.cancel()

    def counters(self) -> OutputCounters:
        return OutputCounters(
            output_id=self.output_id,
            state=_state(self.runners),
            packets_sent=self.packets_sent,
            bytes_sent=self.bytes_sent,
            packets_dropped=sum(runner.messages_dropped for runner in self.runners),
            **_leg_stats(self.runners),
        )
