"""A sequence-ordered release buffer whose wait for a missing packet is bounded in time, sans-IO.

Shared by the FEC decoder and the SMPTE 2022-7 merger. Packets are addressed by an *extended*
sequence number (the 16-bit RTP sequence number unwrapped into an int, RFC 3550 A.1), so the
wrap from 65535 to 0 is invisible above this module.

Start-up: for ``window_s`` after the first packet nothing is released and a packet with a lower
sequence number may still take the head (the first packet to arrive need not be the first sent:
its predecessor may be late, on the slower 2022-7 leg, or rebuilt by FEC). After that one burst
the steady state has no added latency.

Release rule: the packet at the head of the sequence is released as soon as it is present. A
missing head is waited for until ``window_s`` after the arrival of the first packet present
beyond it; then the whole gap up to that packet is declared lost at once. The ring keeps released
packets until their slot is reused, so FEC can still read them as the other members of its row
or column. Nothing here reads a clock: every call takes ``now`` (H2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import Final

from services.edge.core.rtp import seq_delta

DEFAULT_CAPACITY: Final = 8192
# Extended sequence numbers start here, so a backward step before the first wrap stays positive.
_EXT_BASE: Final = 1 << 24


class PutResult(IntEnum):
    """What ``ReorderBuffer.put`` did with a packet."""

    STORED = 0
    DUPLICATE = 1  # the same sequence number is already held (or was released)
    LATE = 2  # behind the release point and not held: it was declared lost before it came


class ReorderBuffer:
    """Ring of packets released in sequence order; see the module docstring for the rule.

    ``put`` copies nothing: hand it ``bytes`` the buffer may keep. ``output`` is a deque of the
    released packets that the owner drains. ``on_lost`` is called once per sequence number
    declared lost (recovery owners use it to drop FEC that can no longer help).
    """

    __slots__ = (
        "_blocked_head",
        "_blocked_next",
        "_data",
        "_deadline",
        "_mask",
        "_on_lost",
        "_priming_until",
        "_seq",
        "_tag",
        "_time",
        "capacity",
        "highest",
        "lost",
        "next_out",
        "output",
        "released",
        "window_s",
    )

    def __init__(
        self, window_s: float, *, capacity: int = DEFAULT_CAPACITY, on_lost: Callable[[int], None] | None = None
    ) -> None:
        if capacity < 64 or capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two >= 64")
        if window_s < 0:
            raise ValueError("window_s must be >= 0")
        self.window_s = window_s
        self.capacity = capacity
        self._mask = capacity - 1
        self._seq: list[int] = [-1] * capacity
        self._data: list[bytes | None] = [None] * capacity
        self._time: list[float] = [0.0] * capacity
        self._tag: list[int] = [0] * capacity
        self._on_lost = on_lost
        self.output: deque[bytes] = deque()
        self.highest: int | None = None
        self.next_out = 0
        self.released = 0
        self.lost = 0
        self._deadline: float | None = None
        self._blocked_head = -1
        self._blocked_next = -1
        self._priming_until: float | None = None

    # -- sequence numbers -------------------------------------------------------------------
    def extend(self, seq16: int) -> int:
        """Unwrap a 16-bit sequence number against the highest one held (the first one starts)."""
        if self.highest is None:
            return _EXT_BASE + seq16
        return self.highest + seq_delta(seq16, self.highest & 0xFFFF)

    def distance(self, seq16: int) -> int | None:
        """Signed distance of ``seq16`` from the highest sequence number held; None when empty."""
        if self.highest is None:
            return None
        return seq_delta(seq16, self.highest & 0xFFFF)

    # -- slots ------------------------------------------------------------------------------
    def get(self, ext: int) -> bytes | None:
        """The packet held for ``ext`` (released or not), or None."""
        i = ext & self._mask
        return self._data[i] if self._seq[i] == ext else None

    def has(self, ext: int) -> bool:
        return self._seq[ext & self._mask] == ext

    def tag(self, ext: int) -> int | None:
        """The owner's small integer stored with ``ext`` (the merger keeps its leg mask there)."""
        i = ext & self._mask
        return self._tag[i] if self._seq[i] == ext else None

    def arrival(self, ext: int) -> float | None:
        i = ext & self._mask
        return self._time[i] if self._seq[i] == ext else None

    def or_tag(self, ext: int, bits: int) -> None:
        i = ext & self._mask
        if self._seq[i] == ext:
            self._tag[i] |= bits

    def put(self, ext: int, packet: bytes, now: float, tag: int = 0) -> PutResult:
        """Hold ``packet`` as sequence ``ext``. Never raises; a full ring releases its oldest."""
        if self.highest is None:
            self.highest = ext
            self.next_out = ext
            self._priming_until = now + self.window_s
        elif ext < self.next_out:
            if self.has(ext):
                return PutResult.DUPLICATE
            if self._priming_until is None or self.highest - ext >= self.capacity:
                return PutResult.LATE
            self.next_out = ext  # still priming: an earlier packet takes the head
        i = ext & self._mask
        if self._seq[i] == ext:
            return PutResult.DUPLICATE
        if ext - self.next_out >= self.capacity:
            self._force_release(ext - self.capacity + 1)
        self._seq[i] = ext
        self._data[i] = packet
        self._time[i] = now
        self._tag[i] = tag
        if ext > self.highest:
            self.highest = ext
        if self._blocked_head < ext < self._blocked_next:
            self._blocked_next = ext
        return PutResult.STORED

    # -- release ----------------------------------------------------------------------------
    def release(self, now: float) -> None:
        """Move every packet that may go now into ``output``; declare expired gaps lost."""
        self._deadline = None
        highest = self.highest
        if highest is None:
            return
        if self._priming_until is not None:
            if now < self._priming_until:
                self._deadline = self._priming_until
                return
            self._priming_until = None
        seqs, data, mask = self._seq, self._data, self._mask
        out = self.output
        while self.next_out <= highest:
            head = self.next_out
            i = head & mask
            if seqs[i] == head:
                packet = data[i]
                if packet is not None:
                    out.append(packet)
                self.released += 1
                self.next_out = head + 1
                continue
            if self._blocked_head != head or seqs[self._blocked_next & mask] != self._blocked_next:
                nxt = head + 1
                while seqs[nxt & mask] != nxt:  # ends at ``highest`` at the latest: it is held
                    nxt += 1
                self._blocked_head, self._blocked_next = head, nxt
            nxt = self._blocked_next
            deadline = self._time[nxt & mask] + self.window_s
            if now < deadline:
                self._deadline = deadline
                return
            self._declare_lost(head, nxt)
            self.next_out = nxt

    def flush(self) -> None:
        """Release everything held, in order, without waiting; gaps are skipped, not counted."""
        if self.highest is None:
            return
        for ext in range(self.next_out, self.highest + 1):
            i = ext & self._mask
            if self._seq[i] == ext:
                packet = self._data[i]
                if packet is not None:
                    self.output.append(packet)
                self.released += 1
        self.next_out = self.highest + 1
        self._deadline = None
        self._priming_until = None

    def reset(self) -> None:
        """Forget every slot and the sequence position (after a flush, for a new stream)."""
        self._seq = [-1] * self.capacity
        self._data = [None] * self.capacity
        self.highest = None
        self.next_out = 0
        self._deadline = None
        self._priming_until = None
        self._blocked_head = self._blocked_next = -1

    @property
    def deadline(self) -> float | None:
        """When the blocked head's wait ends (as of the last ``release``), or None."""
        return self._deadline

    @property
    def pending(self) -> int:
        """How many sequence numbers lie between the release point and the highest held."""
        return 0 if self.highest is None else self.highest + 1 - self.next_out

    def _force_release(self, until: int) -> None:
        # The ring is full: release or declare lost everything below ``until`` now.
        mask = self._mask
        while self.next_out < until:
            head = self.next_out
            i = head & mask
            if self._seq[i] == head:
                packet = self._data[i]
                if packet is not None:
                    self.output.append(packet)
                self.released += 1
            else:
                self._declare_lost(head, head + 1)
            self.next_out = head + 1

    def _declare_lost(self, first: int, end: int) -> None:
        self.lost += end - first
        if self._on_lost is not None:
            for ext in range(first, end):
                self._on_lost(ext)
