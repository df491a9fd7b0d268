"""The two driver interfaces every kind implements (the way httpx's ``BaseTransport``
makes a new transport one class), and what a driver may call on its flow.

An **input driver** owns its sockets or connections and its receive loops and feeds the
flow's common path (``FlowPort``); an **output driver** takes what the flow offers and
sends it without ever blocking the input (interop.md 11: a full queue drops and counts).
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from appliance.models.events import Event
from appliance.models.stats import OutputCounters
from appliance.netio import BatchReceiver
from services.edge.core.rtp import RtpHeader
from services.edge.engine.drain import DrainTick


class FlowPort(Protocol):
    """The flow's side, as drivers see it (``engine.flow.FlowRuntime``)."""

    flow_id: str
    ssrc: int
    realtime_offset: float
    drain_tick: DrainTick
    """The worker's drain tick: plain UDP inputs drain their sockets on it."""

    def admit_rtp(self, view: memoryview, source: tuple[str, int] | None, arrival: float) -> RtpHeader | None: ...

    def on_rtp(self, leg: int, view: memoryview, arrival: float, header: RtpHeader | None) -> None: ...

    def on_fec(self, view: memoryview, arrival: float) -> None: ...

    def on_ts(self, leg: int, view: memoryview, arrival: float) -> None: ...

    def rtp_run_in_place(self, receiver: BatchReceiver, count: int) -> bool: ...

    def ts_run_in_place(self, receiver: BatchReceiver, count: int) -> bool: ...

    def release(self, now: float, *, timers: bool = False) -> None: ...

    def end_batch(self) -> None: ...

    def signal_state(self, now_monotonic: float) -> str: ...

    def publish(self, event: Event) -> None: ...

    def internal_error(self, where: str, exc: BaseException) -> None: ...

    @property
    def protected(self) -> bool:
        """Whether 2022-7 merging or FEC decoding is on (the input drains on a timer then)."""
        ...


class InputDriver(Protocol):
    """A flow's input: binds in ``open``, receives in ``serve`` (until cancelled)."""

    def open(self) -> None:
        """Bind synchronously; ``FlowStartError`` (user-facing text) when it cannot."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the receive loops; ``started()`` once the input accepts traffic."""

    def state(self, now_monotonic: float) -> str:
        """``listening``, ``receiving``, ``waiting``, or a connection state (``connected``...)."""

    def extra_counters(self) -> dict[str, Any]:
        """This kind's own ``InputCounters`` fields (``srt_stats``...), or ``{}``; a ``packets_lost``
        here (RTP lost before the TS, as an rtsp input sees it) is added to the flow's own."""

    def close(self) -> None:
        """Release every socket (idempotent)."""


class OutputDriver(Protocol):
    """A flow's output: ready in ``serve``; ``offer`` never waits."""

    output_id: str

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the output's own task(s); ``started()`` once it can take packets."""

    def offer(self, datagram: bytes | None, payload: memoryview, arrival: float) -> None:
        """Queue one unit: an RTP ``datagram`` with ``payload`` its TS, or raw TS (``datagram=None``)."""

    def flush(self) -> None:
        """Send what ``offer`` queued (called once per input batch)."""

    def slot_layout(self, header_len: int, size: int) -> tuple[int, int] | None:
        """``(offset, length)`` of this output's datagrams inside an input slot, or None when it
        makes its own packets (then it gets ``offer`` calls instead of ``send_slots``)."""

    def send_slots(self, buffer: bytearray, offset: int, stride: int, length: int, count: int) -> None:
        """Send ``count`` datagrams lying in place in the input's receive slots."""

    def close(self) -> None:
        """Stop and release everything (idempotent)."""

    def counters(self) -> OutputCounters:
        """The typed counters of this output for the worker's report."""
