"""One drain tick for every plain UDP input socket of an engine worker.

A flow of 10 Mbit/s gets ~950 datagrams a second, one at a time. With one task per socket
waiting in trio's epoll, each datagram cost a wake-up of its own: at 50 flows, ~47,500
``epoll_wait`` returns, task switches and one-datagram ``recvmmsg`` calls a second, and those
per-wake-up costs, not the per-packet work, were most of the worker's CPU (bench scenario 3:
18-19 µs per packet against 4-5 µs for one fat flow; issue 23).

Here the worker's input sockets sit in one level-triggered ``epoll`` of their own. One task
waits for that epoll to become readable (one wake-up for any number of ready sockets), drains
every ready socket in bounded batches, and then lets at least one tick pass before the next
wait, so the datagrams of many flows are taken together. An idle worker sleeps in the wait: no
tick without input.

The tick adapts to the load, as a NIC coalesces interrupts: :data:`TICK_S` (1 ms) while the
drains take little of the worker's time, so a lightly loaded flow waits at most a millisecond;
doubled (up to :data:`MAX_TICK_S`) while they take more than :data:`BUSY_HIGH` of it, so that a
loaded worker takes several datagrams per flow per call and its per-call costs (the syscalls,
one analyser call, one send per output) are shared by them; halved again below
:data:`BUSY_LOW`. A busy worker so trades a few milliseconds of delay for not losing packets.

The drain functions are plain callables run in this task. A flow's exception is handed back to
that flow's own task (:meth:`DrainTick.serve` raises it there), so a failing flow fails alone,
through its usual path, and the tick goes on for the others.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import trio

__all__ = ["MAX_EVENTS", "TICK_S", "DrainTick"]

TICK_S: Final = 0.001
"""The shortest time between two drains of the same worker (trio sleeps in whole milliseconds)."""
MAX_TICK_S: Final = 0.008
"""The longest: at 10 Mbit/s a flow then brings ~8 datagrams per drain."""
BUSY_HIGH: Final = 0.5
"""Above this share of the last :data:`JUDGE_S` spent draining, the tick doubles."""
BUSY_LOW: Final = 0.15
"""Below this share, it halves (the gap keeps it from flapping)."""
JUDGE_S: Final = 0.1
MAX_EVENTS: Final = 4096
"""Ready sockets taken from one epoll poll; more wait for the next tick (level-triggered)."""


@dataclass(eq=False)
class _Entry:
    take: Callable[[], None]
    failed: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None


class DrainTick:
    """The worker's input sockets and the one task that drains them (:meth:`run`)."""

    def __init__(self, tick_s: float = TICK_S, max_tick_s: float = MAX_TICK_S) -> None:
        self._min_tick_s = tick_s
        self._max_tick_s = max_tick_s
        self.tick_s = tick_s
        """The tick now (adapted to the load)."""
        self._epoll = select.epoll()
        self._entries: dict[int, _Entry] = {}
        self.ticks = 0
        """Drains run (each covers every socket that was ready)."""

    @property
    def socket_count(self) -> int:
        return len(self._entries)

    async def serve(self, sock: socket.socket, take: Callable[[], None]) -> None:
        """Drain ``sock`` with ``take`` on every tick it is readable, until cancelled.

        ``take`` reads what is queued (bounded) and hands it on; it must not block. If it raises,
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
        busy = 0.0
        judged = trio.current_time()
        try:
            while True:
                await trio.lowlevel.wait_readable(self._epoll)
                started = trio.current_time()
                self.ticks += 1
                for fd, _ in self._epoll.poll(0, MAX_EVENTS):
                    entry = self._entries.get(fd)
                    if entry is None or entry.error is not None:
                        continue
                    try:
                        entry.take()
                    except Exception as exc:  # the flow's boundary is its own task: hand it over
                        entry.error = exc
                        entry.failed.set()
                now = trio.current_time()
                busy += now - started
                if now - judged >= JUDGE_S:
                    share = busy / (now - judged)
                    if share > BUSY_HIGH:
                        self.tick_s = min(self.tick_s * 2, self._max_tick_s)
                    elif share < BUSY_LOW:
                        self.tick_s = max(self.tick_s / 2, self._min_tick_s)
                    busy, judged = 0.0, now
                await trio.sleep_until(started + self.tick_s)
        finally:
            self._epoll.close()
