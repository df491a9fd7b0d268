"""RTP sequence accounting: packets lost, late and duplicated (RFC 3550 §6.4.1, A.1, A.3).

``lost`` is the cumulative number of packets expected but not received,
``expected - received`` over the extended (wrap-counted) sequence space, so a
reordered packet that arrives late reduces the loss it first caused and a
duplicate does not hide a loss. A jump larger than ``MAX_DROPOUT`` or an SSRC
change starts a new sequence (the sender restarted); the loss counted so far is
kept.
"""

from __future__ import annotations

from typing import Final

MAX_DROPOUT: Final = 3000  # RFC 3550 A.1
MAX_MISORDER: Final = 100  # RFC 3550 A.1
# Every 16-bit sequence number twice: a slice from any start is the in-order run from there, wrap included.
_SEQUENCE_RUN: Final = tuple(range(0x10000)) * 2


class SequenceTracker:
    """Feed each RTP packet's sequence number and SSRC; read ``lost``, ``duplicates``, ``late``."""

    __slots__ = (
        "_base_ext",
        "_lost_before",
        "_max_ext",
        "_received",
        "_seen",
        "_ssrc",
        "duplicates",
        "late",
        "resyncs",
    )

    def __init__(self) -> None:
        self._ssrc: int | None = None
        self._base_ext = 0
        self._max_ext = -1
        self._received = 0
        self._lost_before = 0  # loss carried over from earlier sequences (resyncs)
        self._seen: set[int] = set()  # recent extended numbers, to tell duplicates from late packets
        self.duplicates = 0
        self.late = 0
        self.resyncs = 0

    @property
    def lost(self) -> int:
        """Cumulative packets lost (never negative)."""
        if self._max_ext < 0:
            return self._lost_before
        expected = self._max_ext - self._base_ext + 1
        return self._lost_before + max(0, expected - self._received)

    def on_packet(self, sequence: int, ssrc: int) -> None:
        if self._max_ext < 0 or ssrc != self._ssrc:
            self._restart(sequence, ssrc)
            return
        max_seq = self._max_ext & 0xFFFF
        delta = (sequence - max_seq) & 0xFFFF
        if 0 < delta < MAX_DROPOUT:
            ext = self._max_ext + delta
            self._max_ext = ext
        elif delta == 0 or delta > 0x10000 - MAX_MISORDER:
            # At or behind the highest: a duplicate or a late (reordered) packet.
            ext = self._max_ext - ((0x10000 - delta) & 0xFFFF)
            if ext in self._seen or ext < self._base_ext:
                self.duplicates += 1
                return
            self.late += 1
        else:
            # A big jump either way: the source restarted (RFC 3550 A.1 "bad_seq").
            self._restart(sequence, ssrc)
            self.resyncs += 1
            return
        self._received += 1
        self._remember(ext)

    def on_run(self, sequences: tuple[int, ...], ssrc: int) -> bool:
        """Account a batch at once when it simply continues the stream; False (nothing changed) if not.

        The steady case: same SSRC, the first number right after the highest seen, the rest
        consecutive. Then the counters move exactly as ``on_packet`` per packet would move them;
        otherwise the caller feeds the packets one by one.
        """
        count = len(sequences)
        if not count or count > 0x10000 or ssrc != self._ssrc or self._max_ext < 0:
            return False
        first = sequences[0]
        if first != (self._max_ext + 1) & 0xFFFF or sequences != _SEQUENCE_RUN[first : first + count]:
            return False
        start = self._max_ext + 1
        self._max_ext += count
        self._received += count
        seen = self._seen
        seen.update(range(max(start, self._max_ext - 4 * MAX_MISORDER), self._max_ext + 1))
        if len(seen) > 4 * MAX_MISORDER:
            floor = self._max_ext - MAX_MISORDER
            self._seen = {e for e in seen if e >= floor}
        return True

    def _restart(self, sequence: int, ssrc: int) -> None:
        self._lost_before = self.lost
        self._ssrc = ssrc
        self._base_ext = sequence
        self._max_ext = sequence
        self._received = 1
        self._seen = {sequence}

    def _remember(self, ext: int) -> None:
        seen = self._seen
        seen.add(ext)
        if len(seen) > 4 * MAX_MISORDER:
            floor = self._max_ext - MAX_MISORDER
            self._seen = {e for e in seen if e >= floor}
