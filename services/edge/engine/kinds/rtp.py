"""The ``rtp`` input kind: RTP/UDP carrying MPEG-TS, unicast or multicast (interop.md 2.3).

Its driver owns the sockets (the media port; the SMPTE 2022-7 second leg; the SMPTE
2022-1 column and row FEC ports, media port + 2 and + 4) and the receive loops; the
flow's common path does the rest. The ``rtp`` *output* is ``engine.udp.UdpOutputDriver``
(shared with ``udp``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from appliance.models.config import RtpInput, split_host_port
from appliance.models.kinds import FEC_COLUMN_PORT_OFFSET, FEC_ROW_PORT_OFFSET
from appliance.netio import BatchReceiver
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.udp import FlowStartError, open_input_socket

RECV_BATCH: Final = 64
SLOT_BYTES: Final = 2048
TIMER_TICK_S: Final = 0.002  # protected flows drain and judge this often (architecture.md: 1-2 ms)
MAX_BATCHES_PER_TICK: Final = 32  # per socket: bounds one tick's work (~2000 datagrams)
_FEC: Final = -1  # the leg number of the FEC sockets in the protected pump


async def drain(
    sock: socket.socket,
    flow: FlowPort,
    in_place: Callable[[BatchReceiver, int], bool],
    per_packet: Callable[[BatchReceiver, int], None],
) -> None:
    """Drain one socket on the worker's drain tick (``services.edge.engine.drain``) in bounded
    batches (recvmmsg with kernel timestamps, the arrivals on the flow's monotonic clock):
    ``in_place`` takes a steady batch in the receive slots, ``per_packet`` anything else, then
    the flow ends the batch (outputs sent, analysed). Returns only by cancellation; raises what
    a batch raised."""
    receiver = BatchReceiver(
        sock, batch=RECV_BATCH, slot_size=SLOT_BYTES, timestamps=True, clock_offset=flow.realtime_offset
    )
    end_batch = flow.end_batch

    def take() -> int:
        # Until the socket is empty, at most MAX_BATCHES_PER_TICK batches: one busy flow cannot
        # hold the tick (the epoll is level-triggered: the rest is taken on the next one).
        taken = 0
        for _ in range(MAX_BATCHES_PER_TICK):
            count = receiver.recv_batch()
            if count == 0:
                break
            taken += count
            if not (receiver.slotted and in_place(receiver, count)):
                per_packet(receiver, count)
            end_batch()
            if count < RECV_BATCH:
                break  # the socket had less than a batch: it is empty now, skip the EAGAIN call
        return taken

    await flow.drain_tick.serve(sock, take)


class RtpInputDriver:
    """Binds every socket of an ``rtp`` input in ``open``; drains them in ``serve``."""

    def __init__(self, config: RtpInput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.sockets: list[tuple[socket.socket, int]] = []  # (socket, leg: 0, 1 or _FEC)

    def _plan(self) -> list[tuple[str, str | None, int]]:
        inp = self.config
        plan = [(inp.bind_addr, inp.interface_addr, 0)]
        if inp.redundancy is not None:
            plan.append((inp.redundancy.bind_addr, inp.redundancy.interface_addr, 1))
        if inp.fec_decode is not None:
            host, port = split_host_port(inp.bind_addr)
            shown = f"[{host}]" if ":" in host else host
            for offset in (FEC_COLUMN_PORT_OFFSET, FEC_ROW_PORT_OFFSET):
                if port + offset > 65535:
                    raise FlowStartError(f"FEC port {port + offset} is out of range: lower the media port")
                plan.append((f"{shown}:{port + offset}", inp.interface_addr, _FEC))
        return plan

    def open(self) -> None:
        try:
            for addr, interface, leg in self._plan():
                self.sockets.append((open_input_socket(addr, interface), leg))
        except FlowStartError:
            self.close()
            raise

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.flow.protected:
                nursery.start_soon(self._pump_protected)
            else:
                for sock, leg in self.sockets:
                    nursery.start_soon(self._pump, sock, leg)
            task_status.started()

    def state(self, now_monotonic: float) -> str:
        return self.flow.signal_state(now_monotonic)

    def extra_counters(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        for sock, _ in self.sockets:
            sock.close()
        self.sockets.clear()

    async def _pump(self, sock: socket.socket, leg: int) -> None:
        """Plain flows: the steady batch in place, anything else packet by packet."""
        flow = self.flow
        admit, on_rtp = flow.admit_rtp, flow.on_rtp

        def per_packet(receiver: BatchReceiver, count: int) -> None:
            views, arrivals, sources = receiver.views, receiver.arrivals, receiver.sources
            for i in range(count):
                view = views[i]
                arrival = arrivals[i]
                header = admit(view, sources[i], arrival)
                if header is not None:
                    on_rtp(leg, view, arrival, header)

        await drain(sock, flow, flow.rtp_run_in_place, per_packet)

    async def _pump_protected(self) -> None:
        """2022-7 and FEC flows: every tick, drain every socket, then feed in arrival order.

        The merger and the decoder judge a packet lost when its copy or its repair has not
        arrived within a window. Draining all legs before judging, and feeding them sorted by
        kernel receive time, means a copy waiting unread in the other leg's socket is never
        mistaken for a loss when the worker runs late (measured: with one task per leg, a
        loaded worker declared ~3x the real loss).
        """
        flow = self.flow
        receivers = [
            (BatchReceiver(sock, batch=RECV_BATCH, slot_size=SLOT_BYTES, timestamps=True), leg)
            for sock, leg in self.sockets
        ]
        offset = flow.realtime_offset
        while True:
            await trio.sleep(TIMER_TICK_S)
            now = time.monotonic()  # taken first: everything that arrived before it is queued now
            arrived: list[tuple[float, int, bytes]] = []
            for receiver, leg in receivers:
                for _ in range(MAX_BATCHES_PER_TICK):
                    count = receiver.recv_batch()
                    views, arrivals, sources = receiver.views, receiver.arrivals, receiver.sources
                    for i in range(count):
                        arrival = arrivals[i] - offset
                        view = views[i]
                        if leg == _FEC or flow.admit_rtp(view, sources[i], arrival) is not None:
                            arrived.append((arrival, leg, bytes(view)))
                    if count < RECV_BATCH:
                        break
            arrived.sort(key=lambda item: item[0])
            for arrival, leg, data in arrived:
                if leg == _FEC:
                    flow.on_fec(memoryview(data), arrival)
                else:
                    flow.on_rtp(leg, memoryview(data), arrival, None)
            flow.release(now, timers=True)
            flow.end_batch()
