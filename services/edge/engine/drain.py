"""One drain tick for every plain UDP input socket of an engine worker.

A flow of 10 Mbit/s gets ~950 datagrams a second, one at a time. With one task per socket
waiting in trio's epoll, each datagram cost a wake-up of its own: at 50 flows, ~47,500
``epoll_wait`` returns, task switches and one-datagram ``recvmmsg`` calls a second, and those
per-wake-up costs, not the per-packet work, were most of the worker's CPU (bench scenario 3:
18-19 µs per packet against 4-5 µs for one fat flow; issue 23).

Here the worker's input sockets sit in one level-triggered ``epoll`` of their own. One task
waits for that epoll to become readable (one wake-up for any number of ready sockets) and
drains every ready socket in bounded batches. An idle worker sleeps in the wait.

Between two drains it may hold off a *tick*, adapted to the load as a NIC coalesces
interrupts. The tick is 0 (the next wait at once: a datagram is taken as soon as it lands, the
latency of one task per socket) until the worker is busy (its process used more than
:data:`BUSY_HIGH` of a core over the last :data:`JUDGE_S`: the drains and everything around
them, the wake-ups included) *and* its calls bring small batches (fewer than
:data:`SMALL_BATCH` datagrams per socket per call: many modest flows, not one fat one); then it
grows, 1 ms and doubling up to :data:`MAX_TICK_S`, so that each call takes several datagrams
and its costs (the syscalls, one analyser call, one send per output) are shared by them. It
shrinks again (halving, then 0) when the worker is no longer busy or the batches are big. One
fat flow thus keeps the immediate path (bench scenario 4: the added latency is what it was),
and fifty 10 Mbit/s flows on one worker trade up to 8 ms of delay for a third less CPU a
packet (bench scenario 3).

The drain functions are plain callables run in this task. A flow's exception is handed back to
that flow's own task (:meth:`DrainTick.serve` raises it there), so a failing flow fails alone,
through its usual path, and the tick goes on for the others.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import trio

__all__ = ["MAX_EVENTS", "TICK_S", "DrainTick"]

TICK_S: Final = 0.001
"""The first tick when coalescing starts (trio sleeps in whole milliseconds)."""
MAX_TICK_S: Final = 0.008
"""The longest: at 10 Mbit/s a flow then brings ~8 datagrams per drain."""
BUSY_HIGH: Final = 0.5
"""Above this CPU share of the worker over the last :data:`JUDGE_S` (with small batches), the tick grows."""
BUSY_LOW: Final = 0.15
"""Below this share, it shrinks (the gap keeps it from flapping)."""
SMALL_BATCH: Final = 8
"""Datagrams per socket per call under which a longer tick is worth its delay."""
BIG_BATCH: Final = 32
"""Datagrams per socket per call over which the tick shrinks: the calls are full already."""
JUDGE_S: Final = 0.1
MAX_EVENTS: Final = 4096
"""Ready sockets taken from one epoll poll; more wait for the next tick (level-triggered)."""


@dataclass(eq=False)
class _Entry:
    take: Callable[[], int]
    failed: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None


class DrainTick:
    """The worker's input sockets and the one task that drains them (:meth:`run`)."""

    def __init__(self, tick_s: float = TICK_S, max_tick_s: float = MAX_TICK_S) -> None:
        self._first_tick_s = tick_s
        self._max_tick_s = max_tick_s
        self.tick_s = 0.0
        """The tick now (adapted to the load; 0: none)."""
        self._epoll = select.epoll()
        self._entries: dict[int, _Entry] = {}
        self.ticks = 0
        """Drains run (each covers every socket that was ready)."""

    @property
    def socket_count(self) -> int:
        return len(self._entries)

    async def serve(self, sock: socket.socket, take: Callable[[], int]) -> None:
        """Drain ``sock`` with ``take`` whenever it is readable, until cancelled.

        ``take`` reads what is queued (bounded), hands it on and returns how many datagrams it
        took; it must not block. If it raises,
        the exception is raised here, in the caller's task, and the socket leaves the tick.
        """
        fd = sock.fileno()
        entry = _Entry(take)
        self._epoll.register(fd, select.EPOLLIN)
        self._entries[fd] = entry
        try:
            await entry.failed.wait()
            assert entry.error is not None
            raise entry.error
        finally:
            del self._entries[fd]
            if not self._epoll.closed:  # the worker may be shutting the tick down first
                self._epoll.unregister(fd)

    async def run(self) -> None:
        """Wait for any socket, drain every ready one, hold off one tick; until cancelled."""
        calls = taken = 0
        judged, cpu = trio.current_time(), time.process_time()
        try:
            while True:
                await trio.lowlevel.wait_readable(self._epoll)
                started = trio.current_time()
                self.ticks += 1
                for fd, _ in self._epoll.poll(0, MAX_EVENTS):
                    entry = self._entries.get(fd)
                    if entry is None or entry.error is not None:
                        continue
                    calls += 1
                    try:
                        taken += entry.take()
                    except Exception as exc:  # the flow's boundary is its own task: hand it over
                        entry.error = exc
                        entry.failed.set()
                now = trio.current_time()
                if now - judged >= JUDGE_S:
                    # The process's CPU, not the drains' share: with many small calls the cost
                    # is mostly around them (epoll, the scheduler), which is what a tick saves.
                    used = time.process_time()
                    self._adapt((used - cpu) / (now - judged), taken / calls if calls else 0.0)
                    calls, taken, judged, cpu = 0, 0, now, used
                if self.tick_s:
                    await trio.sleep_until(started + self.tick_s)
                else:
                    await trio.lowlevel.checkpoint()
        finally:
            self._epoll.close()

    def _adapt(self, busy_share: float, per_call: float) -> None:
        """The next tick from the last window's busy share and datagrams per call."""
        if busy_share > BUSY_HIGH and per_call < SMALL_BATCH:
            self.tick_s = min(self.tick_s * 2, self._max_tick_s) if self.tick_s else self._first_tick_s
        elif busy_share < BUSY_LOW or per_call > BIG_BATCH:
            halved = self.tick_s / 2
            self.tick_s = halved if halved >= self._first_tick_s else 0.0
