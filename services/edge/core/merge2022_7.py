"""SMPTE ST 2022-7 seamless (hitless) protection switching: merge two RTP legs, sans-IO.

Both legs carry the same RTP stream (same SSRC, sequence numbers and payloads). ``feed`` takes a
datagram from leg 0 or 1; ``pop_output`` gives each sequence number exactly once, in order,
whichever leg brought it first. A packet missing on both legs is waited for ``window_s`` (the
path differential, SMPTE 2022-7 §6: default 50 ms) after the first packet beyond it arrived, then
counted in ``counters.packets_lost`` and skipped. FEC decoding, when configured, runs on the
merged output (merge first, then decode).

Accounting, done once a packet's window has passed (or both copies came):

- per-leg loss: a sequence number that leg never delivered (both legs count a packet neither had);
- ``redundancy_switches``: the *supplying* leg is the one that delivered the previous packet as
  long as it still delivers; when it misses a packet the other leg supplied, that is a switch.
  Two healthy legs racing each other therefore cause no switches, while every repair does.

Leg health: a leg silent for ``leg_timeout_s`` yields ``LegLost``; its next packet ``LegRestored``
(events for the ``redundancy`` category, interop §11). A new SSRC on either leg is a new stream:
what is held is released, the old SSRC is retired and its late copies from the slower leg are
dropped (counted in ``stale_ssrc``). A sequence jump past ``MAX_DROPOUT`` is believed only when
the next packet on that leg follows it (RFC 3550 A.1). Never raises on peer input (H5).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

from services.edge.core.fec.reorder import DEFAULT_CAPACITY, PutResult, ReorderBuffer
from services.edge.core.rtp import parse_rtp

DEFAULT_WINDOW_S: Final = 0.050
DEFAULT_LEG_TIMEOUT_S: Final = 0.5
MAX_DROPOUT: Final = 3000
_MAX_EVENTS: Final = 256
_RETIRED_SSRCS: Final = 4
LEGS: Final = (0, 1)


@dataclass(frozen=True, slots=True)
class LegLost:
    """A leg sent nothing for ``leg_timeout_s``."""

    leg: int
    """0 or 1."""
    legs_up: int
    """How many legs still deliver (0: both lost, a critical event)."""


@dataclass(frozen=True, slots=True)
class LegRestored:
    """A leg that had been lost delivers again."""

    leg: int
    legs_up: int


MergerEvent = LegLost | LegRestored


def _pair() -> list[int]:
    return [0, 0]


@dataclass(slots=True)
class MergerCounters:
    """Plain-int counters; per-leg lists are indexed by leg (0, 1)."""

    received: list[int] = field(default_factory=_pair)  # valid RTP datagrams per leg
    malformed: list[int] = field(default_factory=_pair)  # not RTP v2, per leg
    lost: list[int] = field(default_factory=_pair)  # sequence numbers each leg did not deliver
    redundant: int = 0  # the expected second copy of a packet (the other leg had it already)
    duplicates: int = 0  # the same leg delivered the same sequence number twice
    late: int = 0  # came after its sequence number was given up (beyond the path differential)
    out_of_range: int = 0  # unconfirmed sequence jumps
    stale_ssrc: int = 0  # copies carrying a retired SSRC
    resyncs: int = 0  # new stream: SSRC change or confirmed jump
    redundancy_switches: int = 0
    packets_lost: int = 0  # missing on both legs
    released: int = 0  # packets handed to pop_output
    events_dropped: int = 0


class HitlessMerger:
    """SMPTE 2022-7 merger of two legs of one RTP stream.

    API (sans-IO; ``now`` is the caller's clock in seconds):

    - ``feed(leg, datagram, now)``: one datagram from leg 0 or 1; the view is copied if kept.
    - ``pop_output() -> bytes | None``: the next merged datagram, in sequence order.
    - ``get_timer() -> float | None`` / ``handle_timer(now)``: wait deadlines, accounting and leg
      timeouts; ``handle_timer`` may be called any time.
    - ``next_event() -> LegLost | LegRestored | None``.
    - ``flush()``: release everything held now (end of stream).
    - ``counters``: ``MergerCounters``.

    Raises ``ValueError`` only for a leg other than 0 or 1 (a caller bug).
    """

    def __init__(
        self,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        leg_timeout_s: float = DEFAULT_LEG_TIMEOUT_S,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        if window_s < 0 or leg_timeout_s <= 0:
            raise ValueError("window_s must be >= 0 and leg_timeout_s > 0")
        self.window_s = window_s
        self.leg_timeout_s = leg_timeout_s
        self.counters = MergerCounters()
        self._buffer = ReorderBuffer(window_s, capacity=capacity, on_lost=self._on_lost)
        self._ssrc: int | None = None
        self._retired: deque[int] = deque(maxlen=_RETIRED_SSRCS)
        self._probe: list[int | None] = [None, None]
        self._acct: int | None = None  # next sequence number to account
        self._acct_deadline: float | None = None
        self._active: int | None = None  # the supplying leg
        self._last_seen: list[float | None] = [None, None]
        self._up = [False, False]
        self._was_lost = [False, False]
        self._events: deque[MergerEvent] = deque()

    # -- public API -------------------------------------------------------------------------
    def feed(self, leg: int, datagram: memoryview, now: float) -> None:
        """Take one datagram from ``leg``. Never raises on peer input."""
        if leg not in LEGS:
            raise ValueError("leg must be 0 or 1")
        header = parse_rtp(datagram)
        counters = self.counters
        if header is None:
            counters.malformed[leg] += 1
            return
        counters.received[leg] += 1
        self._seen(leg, now)
        if header.ssrc != self._ssrc:
            if header.ssrc in self._retired:
                counters.stale_ssrc += 1
                return
            if self._ssrc is not None:
                self._retired.append(self._ssrc)
                self._resync()
            self._ssrc = header.ssrc
        buf = self._buffer
        distance = buf.distance(header.sequence)
        if distance is not None and (distance > MAX_DROPOUT or distance < -(buf.capacity // 2)):
            if self._probe[leg] != header.sequence:
                self._probe[leg] = (header.sequence + 1) & 0xFFFF
                counters.out_of_range += 1
                return
            self._resync()
        self._probe[leg] = None
        ext = buf.extend(header.sequence)
        bit = 1 << leg
        tag = buf.tag(ext)
        if tag is not None:
            if tag & bit:
                counters.duplicates += 1
            else:
                counters.redundant += 1
                buf.or_tag(ext, bit)
            return
        result = buf.put(ext, bytes(datagram), now, bit)
        if result is PutResult.LATE:
            counters.late += 1
            return
        if self._acct is None or ext < self._acct:
            # The start-up hold can admit a packet before the first one seen (the other leg's
            # copy of it was lost): account from there, so that loss is counted on its leg.
            self._acct = ext
        self._service(now)

    def pop_output(self) -> bytes | None:
        """The next merged datagram in sequence order, or None. Owned by the caller."""
        out = self._buffer.output
        if out:
            self.counters.released += 1
            return out.popleft()
        return None

    def next_event(self) -> MergerEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        """The earliest deadline among the reorder wait, accounting and leg timeouts."""
        timers = [t for t in (self._buffer.deadline, self._acct_deadline) if t is not None]
        for leg in LEGS:
            seen = self._last_seen[leg]
            if self._up[leg] and seen is not None:
                timers.append(seen + self.leg_timeout_s)
        return min(timers) if timers else None

    def handle_timer(self, now: float) -> None:
        for leg in LEGS:
            seen = self._last_seen[leg]
            if self._up[leg] and seen is not None and now >= seen + self.leg_timeout_s:
                self._up[leg] = False
                self._was_lost[leg] = True
                self._emit(LegLost(leg, sum(self._up)))
        self._service(now)

    def flush(self) -> None:
        """Release everything held now, in order, without waiting (end of stream)."""
        self._buffer.flush()

    # -- internals --------------------------------------------------------------------------
    def _seen(self, leg: int, now: float) -> None:
        self._last_seen[leg] = now
        if not self._up[leg]:
            self._up[leg] = True
            if self._was_lost[leg]:
                self._was_lost[leg] = False
                self._emit(LegRestored(leg, sum(self._up)))

    def _emit(self, event: MergerEvent) -> None:
        if len(self._events) >= _MAX_EVENTS:
            self._events.popleft()
            self.counters.events_dropped += 1
        self._events.append(event)

    def _on_lost(self, ext: int) -> None:
        self.counters.packets_lost += 1

    def _resync(self) -> None:
        self._buffer.flush()
        self._buffer.reset()
        self._acct = None
        self._acct_deadline = None
        self._probe = [None, None]
        self.counters.resyncs += 1

    def _service(self, now: float) -> None:
        buf = self._buffer
        buf.release(now)
        # Account each released (or given-up) packet once its window has passed.
        self._acct_deadline = None
        acct = self._acct
        if acct is None:
            return
        counters = self.counters
        lost = counters.lost
        while acct < buf.next_out:
            tag = buf.tag(acct)
            if tag is None:  # neither leg delivered it (or its slot is long reused)
                lost[0] += 1
                lost[1] += 1
                acct += 1
                continue
            if tag != 0b11:
                arrival = buf.arrival(acct)
                if arrival is not None and now < arrival + self.window_s:
                    self._acct_deadline = arrival + self.window_s
                    break
                lost[1 if tag == 0b01 else 0] += 1
            active = self._active
            if active is None or not tag & (1 << active):
                if active is not None:
                    counters.redundancy_switches += 1
                self._active = 0 if tag & 0b01 else 1
            acct += 1
        self._acct = acct
