"""SMPTE ST 2022-1 FEC decoder (column and row XOR, iterative recovery), sans-IO.

Feed it the media stream (``on_media``) and the column/row FEC streams (``on_fec``, media port
+ 2 and + 4: the driver may hand both to the same method, the D bit tells them apart); take
media packets out with ``pop_output`` in sequence order, recovered ones included. The caller owns
the clock: call ``handle_timer(now)`` at ``get_timer()``.

Recovery (SMPTE 2022-1 §7-8): every FEC packet is the XOR of the ``NA`` media packets
``SNBase + k * Offset`` (k = 0 .. NA-1). When exactly one of them is missing, XOR of the FEC
packet and the others rebuilds it: its payload (bytes after the 12-byte RTP header), its length
(Length recovery), PT, marker, timestamp and P/X/CC bits; SSRC is taken from the other members.
A rebuilt packet can complete another row or column, so recovery iterates until nothing changes:
a 2-D matrix repairs any burst up to L consecutive packets, and many patterns beyond (not an
L x 2 rectangle, nor 2 losses in one row and in one column both).

Output is released in order; a missing packet is waited for the reorder window after the first
packet beyond it arrived, then counted in ``counters.unrecoverable`` and skipped. Column FEC comes
up to a matrix after the matrix it protects, so the window must exceed about two matrix durations:
by default (``reorder_window_s=None``) it follows the measured packet rate, 3 x L x D packet times,
kept within ``MIN_AUTO_WINDOW_S`` .. ``max_reorder_window_s`` (0.25 s until a rate is known); a
number fixes it.

Accepts what real encoders send: media SSRC 0 and FEC PT 96 (GStreamer ``rtpst2022-1-fecenc``),
ffmpeg ``prompeg``'s P/X/CC bits in the FEC RTP header; the matrix dimensions are taken from each
FEC packet's Offset/NA (a mismatch with the configured L x D is counted, not fatal). Never raises
on peer input (H5). Matrix alignment does not matter: SNBase says where each row/column starts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from services.edge.core.fec.header import FEC_TYPE_XOR, parse_fec
from services.edge.core.fec.reorder import DEFAULT_CAPACITY, PutResult, ReorderBuffer
from services.edge.core.rtp import RTP_FIXED_HEADER_LEN, parse_rtp

MIN_COLUMNS: Final = 1
MAX_COLUMNS: Final = 20
MIN_ROWS: Final = 4
MAX_ROWS: Final = 20
DEFAULT_REORDER_WINDOW_S: Final = 0.250  # until the packet rate is known (adaptive mode)
MIN_AUTO_WINDOW_S: Final = 0.100
MAX_AUTO_WINDOW_S: Final = 2.0
_RATE_BLOCK: Final = 64  # media packets per rate measurement
# RFC 3550 A.1: a jump larger than this, or further back than the ring, is a new stream only if
# the next packet confirms it; until then such a packet is counted and dropped.
MAX_DROPOUT: Final = 3000
# Sanity bound on one FEC packet's span (Offset x NA): 2022-1 allows L, D <= 20 (and ffmpeg caps
# L x D at 100), so anything larger is garbage.
_MAX_SPAN: Final = 255 * 20
_TS: Final = struct.Struct("!I")


@dataclass(slots=True)
class FecDecoderCounters:
    """Plain-int counters; ``recovered`` is the interface's ``packets_recovered_fec``."""

    media_received: int = 0
    media_malformed: int = 0  # not RTP v2
    duplicates: int = 0  # a media packet already held (or a rebuilt one arriving after all)
    late: int = 0  # arrived after its sequence number had been declared lost
    out_of_range: int = 0  # sequence jump beyond MAX_DROPOUT, not (yet) confirmed
    resyncs: int = 0  # new stream: SSRC change or confirmed sequence jump
    recovered: int = 0  # packets rebuilt by FEC, each counted once
    unrecoverable: int = 0  # sequence numbers given up as lost
    released: int = 0  # media packets handed to pop_output (recovered ones included)
    fec_received: int = 0  # parsed FEC packets
    fec_malformed: int = 0  # too short, not RTP v2, Offset/NA 0 or absurd
    fec_unsupported: int = 0  # type other than XOR
    fec_dimension_mismatch: int = 0  # Offset/NA differ from the configured L x D (still used)
    fec_stale: int = 0  # needs a member already given up (or gone), or came before any media
    fec_recovery_failed: int = 0  # length recovery longer than the FEC payload


@dataclass(slots=True)
class _FecEntry:
    """A stored FEC packet still waiting for more of its members."""

    protected: tuple[int, ...]  # extended sequence numbers
    missing: int
    rtp_bits: int
    marker: int
    pt_recovery: int
    ts_recovery: int
    length_recovery: int
    payload: bytes
    dead: bool = field(default=False)


class FecDecoder:
    """SMPTE 2022-1 decoder for one RTP media stream and its column/row FEC streams.

    API (all sans-IO; ``now`` is the caller's clock in seconds):

    - ``on_media(datagram, now)``: one RTP media datagram; the view is copied, not kept.
    - ``on_fec(datagram, now)``: one column or row FEC datagram; never raises on garbage.
    - ``pop_output() -> bytes | None``: the next media datagram in sequence order.
    - ``get_timer() -> float | None`` / ``handle_timer(now)``: when a wait for a missing packet
      ends; call ``handle_timer`` then (and any time: it is idempotent).
    - ``flush()``: rebuild what can be and release everything held now (end of stream).
    - ``reorder_window_s``: the window in force (adaptive unless given to the constructor).
    - ``counters``: ``FecDecoderCounters``.

    Raises ``ValueError`` only for L or D out of range (a caller bug).
    """

    def __init__(
        self,
        columns: int,
        rows: int,
        *,
        reorder_window_s: float | None = None,
        max_reorder_window_s: float = MAX_AUTO_WINDOW_S,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        if not MIN_COLUMNS <= columns <= MAX_COLUMNS:
            raise ValueError(f"columns (L) must be {MIN_COLUMNS}-{MAX_COLUMNS}")
        if not MIN_ROWS <= rows <= MAX_ROWS:
            raise ValueError(f"rows (D) must be {MIN_ROWS}-{MAX_ROWS}")
        self.columns = columns
        self.rows = rows
        self.counters = FecDecoderCounters()
        self._auto_window = reorder_window_s is None
        self._max_window_s = max_reorder_window_s
        window = DEFAULT_REORDER_WINDOW_S if reorder_window_s is None else reorder_window_s
        self._buffer = ReorderBuffer(window, capacity=capacity, on_lost=self._on_lost)
        self._block_start: float | None = None
        self._block_count = 0
        self._rate_pps: float | None = None
        self._waiting: dict[int, list[_FecEntry]] = {}  # missing member -> FEC needing it
        # Rebuildable packets not yet overdue: nothing later has arrived, so the original may
        # still be in flight (a row FEC packet can overtake the last packet of its row).
        self._deferred: dict[int, list[_FecEntry]] = {}
        self._highest_rx = -1  # highest extended sequence number *received* (not rebuilt)
        # A rebuildable packet that nothing later has shown to be lost (the stream paused or
        # ended right after it) is rebuilt anyway one reorder window after it could have been.
        self._deferred_at: dict[int, float] = {}
        self._ssrc: int | None = None
        self._probe: int | None = None  # 16-bit seq expected next if an out-of-range jump is real

    # -- public API -------------------------------------------------------------------------
    def on_media(self, datagram: memoryview, now: float) -> None:
        """Take one RTP media datagram (copied). Never raises on peer input."""
        header = parse_rtp(datagram)
        if header is None:
            self.counters.media_malformed += 1
            return
        self.counters.media_received += 1
        if self._auto_window:
            self._measure_rate(now)
        buf = self._buffer
        if self._ssrc is not None and header.ssrc != self._ssrc:
            self._resync()
        self._ssrc = header.ssrc
        distance = buf.distance(header.sequence)
        if distance is not None and (distance > MAX_DROPOUT or distance < -(buf.capacity // 2)):
            # RFC 3550 A.1: believe a big jump only when the next packet follows it.
            if self._probe != header.sequence:
                self._probe = (header.sequence + 1) & 0xFFFF
                self.counters.out_of_range += 1
                return
            self._resync()
        self._probe = None
        ext = buf.extend(header.sequence)
        result = buf.put(ext, bytes(datagram), now)
        if result is PutResult.STORED:
            self._arrived(ext, now)
            if ext > self._highest_rx:
                self._highest_rx = ext
                if self._deferred:
                    self._run_deferred(now, below=ext)
        elif result is PutResult.DUPLICATE:
            self.counters.duplicates += 1
        else:
            self.counters.late += 1
        self._release(now)

    def on_fec(self, datagram: memoryview, now: float) -> None:
        """Take one column (D=0) or row (D=1) FEC datagram. Never raises on peer input."""
        fec = parse_fec(datagram)
        if fec is None or fec.offset == 0 or fec.na == 0 or fec.offset * (fec.na - 1) > _MAX_SPAN:
            self.counters.fec_malformed += 1
            return
        self.counters.fec_received += 1
        if fec.fec_type != FEC_TYPE_XOR:
            self.counters.fec_unsupported += 1
            return
        if fec.is_row:
            expected = (1, self.columns)
        else:
            expected = (self.columns, self.rows)
        if (fec.offset, fec.na) != expected:
            self.counters.fec_dimension_mismatch += 1
        buf = self._buffer
        if buf.highest is None:
            self.counters.fec_stale += 1
            return
        base = buf.extend(fec.snbase)
        protected = tuple(range(base, base + fec.offset * fec.na, fec.offset))
        if base > buf.highest + MAX_DROPOUT:
            self.counters.fec_stale += 1
            return
        missing = [ext for ext in protected if not buf.has(ext)]
        if not missing:
            return
        if missing[0] < buf.next_out:  # a member was given up already: this FEC cannot help
            self.counters.fec_stale += 1
            return
        entry = _FecEntry(
            protected=protected,
            missing=len(missing),
            rtp_bits=fec.rtp_byte0 & 0x3F,
            marker=1 if fec.marker else 0,
            pt_recovery=fec.pt_recovery,
            ts_recovery=fec.ts_recovery,
            length_recovery=fec.length_recovery,
            payload=bytes(fec.payload),
        )
        for ext in missing:
            self._waiting.setdefault(ext, []).append(entry)
        if len(missing) == 1:
            rebuilt = self._attempt(entry, now)
            if rebuilt is not None:
                self._arrived(rebuilt, now)
                self._release(now)

    def pop_output(self) -> bytes | None:
        """The next media datagram in sequence order, or None. Owned by the caller."""
        out = self._buffer.output
        if out:
            self.counters.released += 1
            return out.popleft()
        return None

    @property
    def reorder_window_s(self) -> float:
        """The reorder window in force (it follows the packet rate unless it was fixed)."""
        return self._buffer.window_s

    def get_timer(self) -> float | None:
        """When ``handle_timer`` must next run, or None."""
        deadline = self._buffer.deadline
        if not self._deferred_at:
            return deadline
        deferred = min(self._deferred_at.values()) + self._buffer.window_s
        return deferred if deadline is None else min(deadline, deferred)

    def handle_timer(self, now: float) -> None:
        """Rebuild deferred packets and give up on missing ones whose wait has passed."""
        if self._deferred_at:
            self._run_deferred(now, aged_before=now - self._buffer.window_s)
        self._release(now)

    def flush(self) -> None:
        """Rebuild what can be, then release everything held, in order, without waiting."""
        if self._deferred:
            self._run_deferred(0.0)
        self._buffer.flush()
        self._waiting.clear()
        self._deferred.clear()
        self._deferred_at.clear()

    # -- internals --------------------------------------------------------------------------
    def _measure_rate(self, now: float) -> None:
        # Adaptive window: 3 x L x D packet times at the rate of the last block of packets.
        if self._block_start is None:
            self._block_start = now
            return
        self._block_count += 1
        if self._block_count < _RATE_BLOCK:
            return
        elapsed = now - self._block_start
        self._block_start, self._block_count = now, 0
        if elapsed <= 0:
            return
        rate = _RATE_BLOCK / elapsed
        self._rate_pps = rate if self._rate_pps is None else 0.75 * self._rate_pps + 0.25 * rate
        window = 3.0 * self.columns * self.rows / self._rate_pps
        self._buffer.window_s = min(self._max_window_s, max(MIN_AUTO_WINDOW_S, window))

    def _release(self, now: float) -> None:
        self._buffer.release(now)

    def _on_lost(self, ext: int) -> None:
        self.counters.unrecoverable += 1
        entries = self._waiting.pop(ext, None)
        if entries:
            for entry in entries:
                entry.dead = True
        self._deferred.pop(ext, None)
        self._deferred_at.pop(ext, None)

    def _resync(self) -> None:
        self._buffer.flush()
        self._buffer.reset()
        self._waiting.clear()
        self._deferred.clear()
        self._deferred_at.clear()
        self._highest_rx = -1
        self._probe = None
        self.counters.resyncs += 1

    def _run_deferred(self, now: float, *, below: int | None = None, aged_before: float | None = None) -> None:
        # Rebuild the deferred packets now overdue: below a received sequence number, deferred
        # for a whole window, or (neither given) all of them.
        for target in sorted(self._deferred):
            if target not in self._deferred:  # handled by a cascade within this loop
                continue
            since = self._deferred_at[target]
            if below is not None or aged_before is not None:
                if not ((below is not None and target < below) or (aged_before is not None and since <= aged_before)):
                    continue
            del self._deferred_at[target]
            for entry in self._deferred.pop(target):
                if entry.dead or self._buffer.has(target):
                    continue
                rebuilt = self._recover(entry, now)
                if rebuilt is not None:
                    self._arrived(rebuilt, now)
                    break

    def _attempt(self, entry: _FecEntry, now: float) -> int | None:
        # One member left to rebuild: do it if overdue, else defer it until a later one arrives.
        buf = self._buffer
        target = next((ext for ext in entry.protected if not buf.has(ext)), -1)
        if target < 0:
            entry.dead = True
            return None
        if target > self._highest_rx:
            self._deferred.setdefault(target, []).append(entry)
            self._deferred_at.setdefault(target, now)
            return None
        return self._recover(entry, now)

    def _arrived(self, ext: int, now: float) -> None:
        # A packet is now held (received or rebuilt): update every FEC waiting for it and
        # rebuild whatever that makes possible, iteratively (row rebuilds unblock columns...).
        work = [ext]
        waiting = self._waiting
        while work:
            entries = waiting.pop(work.pop(), None)
            if not entries:
                continue
            for entry in entries:
                if entry.dead:
                    continue
                entry.missing -= 1
                if entry.missing == 1:
                    rebuilt = self._attempt(entry, now)
                    if rebuilt is not None:
                        work.append(rebuilt)
                elif entry.missing <= 0:
                    entry.dead = True

    def _recover(self, entry: _FecEntry, now: float) -> int | None:
        # SMPTE 2022-1 §8 / RFC 2733 §7: XOR the FEC packet with every other member.
        entry.dead = True
        buf = self._buffer
        target = -1
        members: list[bytes] = []
        for ext in entry.protected:
            packet = buf.get(ext)
            if packet is None:
                if target >= 0:
                    return None  # two missing after all (a slot was reused): cannot rebuild
                target = ext
            else:
                members.append(packet)
        if target < buf.next_out or not members:
            return None
        length = entry.length_recovery
        bits = entry.rtp_bits
        marker = entry.marker
        pt = entry.pt_recovery
        ts = entry.ts_recovery
        acc = int.from_bytes(entry.payload, "little")
        width = len(entry.payload)
        for packet in members:
            width = max(width, len(packet) - RTP_FIXED_HEADER_LEN)
            length ^= len(packet) - RTP_FIXED_HEADER_LEN
            bits ^= packet[0]
            marker ^= packet[1] >> 7
            pt ^= packet[1]
            ts ^= _TS.unpack_from(packet, 4)[0]
            # Little-endian ints make the zero padding of shorter packets implicit.
            acc ^= int.from_bytes(memoryview(packet)[RTP_FIXED_HEADER_LEN:], "little")
        if length > len(entry.payload):
            self.counters.fec_recovery_failed += 1
            return None
        rebuilt = bytearray(RTP_FIXED_HEADER_LEN + length)
        rebuilt[0] = 0x80 | (bits & 0x3F)
        rebuilt[1] = ((marker & 1) << 7) | (pt & 0x7F)
        rebuilt[2] = (target >> 8) & 0xFF
        rebuilt[3] = target & 0xFF
        _TS.pack_into(rebuilt, 4, ts & 0xFFFFFFFF)
        rebuilt[8:12] = members[0][8:12]  # SSRC: not protected, the same for every member
        rebuilt[RTP_FIXED_HEADER_LEN:] = acc.to_bytes(width, "little")[:length]
        if buf.put(target, bytes(rebuilt), now) is not PutResult.STORED:
            return None
        self.counters.recovered += 1
        return target
