"""Merge two legs of raw MPEG-TS messages by payload: each message once, first copy wins.

For SRT redundancy without RTP (interop.md 2.4 ``redundancy``; the SRT issue: raw TS is
merged on the payload). Both legs carry the same messages in the same order, each leg in
order. A message is passed on when it is the first copy of its position, and dropped as
redundant when it is the second copy, i.e. when the other leg already delivered the same
bytes and that copy has not yet been matched. Copies are matched first-in-first-out per
content, so a payload that legitimately repeats (continuity counters wrap every 16
packets; a static or null-padded stream repeats datagrams) is still passed once per
position, not once per content. An unmatched copy (the other leg lost it, or is down)
waits at most ``window_s`` for its partner; after that a late partner counts as a new
message. So killing either leg, or losing different messages on each, leaves no gap as
long as each message arrives on at least one leg within ``window_s`` of its other copy.

Limit: payload alone cannot tell apart two identical messages that each leg lost a
different one of within the window (A lost the first X, B the second); one X is then
passed. Real TS payloads differ (PES data, continuity counters with payload); RTP-wrapped
TS is merged on the sequence number instead, which has no such limit. Without sequence
numbers there is also no reordering: when the leading leg loses a message, the lagging
leg's copy goes out when it arrives, after the leading leg's later messages.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

DEFAULT_WINDOW_S: Final = 1.0
MAX_PENDING: Final = 65536  # unmatched copies kept at most (a dead leg: ~6 s at 100 Mbit/s)


def _pair() -> list[int]:
    return [0, 0]


@dataclass(slots=True)
class PayloadMergeCounters:
    received: list[int] = field(default_factory=_pair)
    redundant: int = 0  # second copies dropped
    expired: int = 0  # first copies whose partner never came within the window
    switches: int = 0  # changes of the leg that supplies the output
    released: int = 0


class PayloadMerger:
    """``accept(leg, message, now)`` says whether to pass this copy on. Sans-IO."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self.counters = PayloadMergeCounters()
        # Per leg: content key -> how many of its released copies still await the other leg.
        self._unmatched: list[dict[int, int]] = [{}, {}]
        self._order: deque[tuple[float, int, int]] = deque()  # (when, leg, key), oldest first
        self._last_leg: int | None = None

    def accept(self, leg: int, message: bytes | memoryview, now: float) -> bool:
        if leg not in (0, 1):
            raise ValueError("leg must be 0 or 1")
        self._expire(now)
        self.counters.received[leg] += 1
        key = hash(bytes(message))
        other = self._unmatched[1 - leg]
        waiting = other.get(key, 0)
        if waiting:
            # The second copy of a position the other leg already supplied.
            if waiting == 1:
                del other[key]
            else:
                other[key] = waiting - 1
            self._forget_one(1 - leg, key)
            self.counters.redundant += 1
            return False
        mine = self._unmatched[leg]
        mine[key] = mine.get(key, 0) + 1
        self._order.append((now, leg, key))
        if len(self._order) > MAX_PENDING:
            self._drop_oldest()
        if self._last_leg is not None and leg != self._last_leg:
            self.counters.switches += 1
        self._last_leg = leg
        self.counters.released += 1
        return True

    def _forget_one(self, leg: int, key: int) -> None:
        # Remove the oldest pending record of (leg, key): matching is FIFO per content.
        for index, (_, pending_leg, k) in enumerate(self._order):
            if pending_leg == leg and k == key:
                del self._order[index]
                return

    def _expire(self, now: float) -> None:
        limit = now - self.window_s
        while self._order and self._order[0][0] < limit:
            self._drop_oldest()
            self.counters.expired += 1

    def _drop_oldest(self) -> None:
        _, leg, key = self._order.popleft()
        pending = self._unmatched[leg]
        count = pending.get(key, 0)
        if count <= 1:
            pending.pop(key, None)
        else:
            pending[key] = count - 1
