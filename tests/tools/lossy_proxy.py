"""A lossy UDP proxy for tests (tc netem is unavailable here): loopback only, bounded in time.

One ``LossyUdpProxy`` listens on one UDP port and forwards each datagram to one target, dropping
some on purpose. It runs in its own thread, so it serves sync tests, trio tests and external
processes alike. Everything it decides is reproducible from its arguments (``seed``)::

    with LossyUdpProxy(target=("127.0.0.1", 5000), drop_rate=0.05, seed=1) as proxy:
        send_to(proxy.port)                # the peer sends here instead of to 5000
        ...
    proxy.stats.dropped_indices            # which datagrams (0-based arrival index) it dropped

Drop rules, applied in this order to datagram number ``i`` (0-based, in arrival order):

- ``passthrough_first``: the first N datagrams are never dropped (let a stream start cleanly);
- ``drop_indices``: explicit arrival indices;
- ``drop_seqs``: explicit RTP sequence numbers (read from bytes 2-3 of an RTP v2 datagram);
- ``bursts``: ``(start_index, length)`` pairs, each dropping ``length`` consecutive datagrams;
- ``burst_every`` / ``burst_length`` / ``burst_offset``: a periodic burst, ``burst_length``
  datagrams dropped from each index ``i`` with ``(i - burst_offset) % burst_every == 0``;
- ``drop_rate``: independent random loss with probability ``drop_rate`` from ``random.Random(seed)``.

``blackhole()`` drops everything until ``restore()`` (a link or sender dying and coming back);
``delay_s`` holds every forwarded datagram that long (a longer path, e.g. for a 2022-7 leg).
Every datagram seen is recorded in ``stats.seen`` (bounded by ``record_limit``) so a test can
compare what a receiver rebuilt with what the sender really sent. The thread stops on ``stop()``
or ``__exit__``, and in any case after ``max_duration_s``.
"""

from __future__ import annotations

import heapq
import random
import select
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType

# Re-exported for the interop tests.
from tests.helpers.ports import free_port_block as free_port_block

_MAX_DATAGRAM = 65535


@dataclass
class ProxyStats:
    """What the proxy saw and did; read it after ``stop()`` (or accept a moving snapshot)."""

    received: int = 0
    forwarded: int = 0
    dropped: int = 0
    dropped_indices: list[int] = field(default_factory=list)
    seen: list[bytes] = field(default_factory=list)  # every datagram received, in order (bounded)
    send_errors: int = 0


class LossyUdpProxy:
    """Forward UDP datagrams from ``listen`` to ``target``, dropping by rule (module docstring)."""

    def __init__(
        self,
        target: tuple[str, int],
        *,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        drop_rate: float = 0.0,
        seed: int = 0,
        drop_indices: Iterable[int] = (),
        drop_seqs: Iterable[int] = (),
        bursts: Iterable[tuple[int, int]] = (),
        burst_every: int = 0,
        burst_length: int = 0,
        burst_offset: int = 0,
        passthrough_first: int = 0,
        delay_s: float = 0.0,
        max_duration_s: float = 60.0,
        record_limit: int = 200_000,
        rcvbuf_bytes: int = 4 << 20,
    ) -> None:
        if not 0.0 <= drop_rate <= 1.0:
            raise ValueError("drop_rate must be within 0..1")
        if burst_every and burst_length >= burst_every:
            raise ValueError("burst_length must be shorter than burst_every")
        self.target = target
        self.drop_rate = drop_rate
        self._rng = random.Random(seed)
        self._drop_indices = frozenset(drop_indices)
        self._drop_seqs = frozenset(s & 0xFFFF for s in drop_seqs)
        self._burst_indices = frozenset(i for start, length in bursts for i in range(start, start + length))
        self._burst_every = burst_every
        self._burst_length = burst_length
        self._burst_offset = burst_offset
        self._passthrough_first = passthrough_first
        self.delay_s = delay_s
        self.max_duration_s = max_duration_s
        self._record_limit = record_limit
        self.stats = ProxyStats()
        self._blackholed = threading.Event()
        self._stopping = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
            self._sock.bind(listen)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self._out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._thread = threading.Thread(target=self._run, name=f"lossy-proxy-{self.port}", daemon=True)
        self._started = False

    @property
    def port(self) -> int:
        """The port the proxy listens on (send here)."""
        return int(self._sock.getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> LossyUdpProxy:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop forwarding and join the thread; idempotent. Held (delayed) datagrams are sent."""
        self._stopping.set()
        if self._started:
            self._thread.join(timeout_s)
        self._sock.close()
        self._out.close()

    def blackhole(self) -> None:
        """Drop everything from now on (counted as dropped) until ``restore``."""
        self._blackholed.set()

    def restore(self) -> None:
        self._blackholed.clear()

    def __enter__(self) -> LossyUdpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the rule ---------------------------------------------------------------------------
    def should_drop(self, index: int, datagram: bytes) -> bool:
        """Apply the drop rules to datagram number ``index`` (also usable without the thread)."""
        if index < self._passthrough_first:
            return False
        if self._blackholed.is_set() or index in self._drop_indices or index in self._burst_indices:
            return True
        if self._drop_seqs and len(datagram) >= 12 and datagram[0] >> 6 == 2:
            if ((datagram[2] << 8) | datagram[3]) in self._drop_seqs:
                return True
        if self._burst_every and index >= self._burst_offset:
            if (index - self._burst_offset) % self._burst_every < self._burst_length:
                return True
        return bool(self.drop_rate) and self._rng.random() < self.drop_rate

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        deadline = time.monotonic() + self.max_duration_s
        held: list[tuple[float, int, bytes]] = []  # (due, tie-break, datagram) when delaying
        counter = 0
        stats = self.stats
        while True:
            now = time.monotonic()
            while held and held[0][0] <= now:
                self._forward(heapq.heappop(held)[2])
            if now >= deadline or self._stopping.is_set():
                break
            wait = 0.02 if not held else max(0.0, min(0.02, held[0][0] - now))
            readable, _, _ = select.select([self._sock], [], [], wait)
            if not readable:
                continue
            for _ in range(256):  # drain a bounded batch per wakeup
                try:
                    datagram = self._sock.recv(_MAX_DATAGRAM)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    return
                index = stats.received
                stats.received += 1
                if len(stats.seen) < self._record_limit:
                    stats.seen.append(datagram)
                if self.should_drop(index, datagram):
                    stats.dropped += 1
                    stats.dropped_indices.append(index)
                elif self.delay_s > 0:
                    counter += 1
                    heapq.heappush(held, (time.monotonic() + self.delay_s, counter, datagram))
                else:
                    self._forward(datagram)
        for _, _, datagram in sorted(held):
            self._forward(datagram)

    def _forward(self, datagram: bytes) -> None:
        try:
            self._out.sendto(datagram, self.target)
            self.stats.forwarded += 1
        except OSError:
            self.stats.send_errors += 1
