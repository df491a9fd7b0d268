"""SMPTE ST 2022-1 FEC encoder (column and row XOR), sans-IO, paced column output.

Media packets fill an L x D matrix row by row (L = columns, D = rows), starting at the first
packet seen. Each row of L consecutive packets gives one row FEC packet (D=1, Offset 1, NA L) as
soon as the row is complete; each column of D packets spaced L apart gives one column FEC packet
(D=0, Offset L, NA D). A matrix's L column packets are complete together, so they are *paced*:
one is released every D media packets across the next matrix (SMPTE 2022-1 §8 lets column FEC
lag its matrix; spreading it keeps the FEC stream as smooth as the media and keeps a burst on
the media from also taking the column FEC that would repair it).

The FEC packets look like the ones GStreamer's ``rtpst2022-1-fecenc`` and ffmpeg's ``prompeg``
send: PT 96, SSRC 0, E=1, mask 0, the protected packets' XORed P/X/CC and M bits in the FEC RTP
header, timestamp = that of the latest media packet at send time. A sequence discontinuity or an
SSRC change on the input starts a new matrix (the unfinished one cannot be completed; its rows
already sent stay valid).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Final

from services.edge.core.fec.decoder import MAX_COLUMNS, MAX_ROWS, MIN_COLUMNS, MIN_ROWS
from services.edge.core.fec.header import DEFAULT_FEC_PAYLOAD_TYPE, FEC_MIN_DATAGRAM, build_fec_header
from services.edge.core.rtp import RTP_FIXED_HEADER_LEN, parse_rtp

_TS: Final = struct.Struct("!I")


@dataclass(slots=True)
class FecEncoderCounters:
    """Plain-int counters; ``fec_packets_sent`` = ``column_packets + row_packets`` (popped)."""

    media_received: int = 0
    media_malformed: int = 0
    matrix_resets: int = 0  # discontinuities that abandoned an unfinished matrix
    column_packets: int = 0
    row_packets: int = 0

    @property
    def fec_packets_sent(self) -> int:
        return self.column_packets + self.row_packets


class _Xor:
    """Running XOR of the protected fields of a group of media packets."""

    __slots__ = ("acc", "bits", "count", "length", "marker", "pt", "snbase", "ts", "width")

    def __init__(self) -> None:
        self.count = 0
        self.snbase = self.acc = self.bits = self.marker = self.pt = self.ts = self.length = self.width = 0

    def add(self, packet: memoryview, seq: int) -> None:
        body_len = len(packet) - RTP_FIXED_HEADER_LEN
        body = int.from_bytes(packet[RTP_FIXED_HEADER_LEN:], "little")  # zero padding is implicit
        if self.count == 0:
            self.snbase = seq
            self.acc = body
            self.bits = packet[0]
            self.marker = packet[1] >> 7
            self.pt = packet[1]
            self.ts = _TS.unpack_from(packet, 4)[0]
            self.length = body_len
            self.width = body_len
        else:
            self.acc ^= body
            self.bits ^= packet[0]
            self.marker ^= packet[1] >> 7
            self.pt ^= packet[1]
            self.ts ^= _TS.unpack_from(packet, 4)[0]
            self.length ^= body_len
            if body_len > self.width:
                self.width = body_len
        self.count += 1

    def build(self, *, is_row: bool, offset: int, payload_type: int, seq: int, timestamp: int, ssrc: int) -> bytes:
        out = bytearray(FEC_MIN_DATAGRAM + self.width)
        build_fec_header(
            out,
            rtp_bits=self.bits & 0x3F,
            marker=bool(self.marker & 1),
            payload_type=payload_type,
            sequence=seq,
            timestamp=timestamp,
            ssrc=ssrc,
            snbase=self.snbase,
            length_recovery=self.length,
            pt_recovery=self.pt & 0x7F,
            ts_recovery=self.ts,
            is_row=is_row,
            offset=offset,
            na=self.count,
        )
        out[FEC_MIN_DATAGRAM:] = self.acc.to_bytes(self.width, "little")
        self.count = 0
        return bytes(out)


class FecEncoder:
    """SMPTE 2022-1 encoder for one RTP media stream.

    API (sans-IO; ``now`` is the caller's clock, unused today but kept for pacing by time):

    - ``on_media(datagram, now)``: one RTP media datagram being sent; the view is not kept.
    - ``pop_column() -> bytes | None``: the next column FEC datagram due (to media port + 2).
    - ``pop_row() -> bytes | None``: the next row FEC datagram due (to media port + 4).
    - ``flush()``: make every queued column FEC packet due now (end of stream).
    - ``counters``: ``FecEncoderCounters``.

    ``row_fec=False`` sends column FEC only (1-D); with ``columns == 1`` rows are always off
    (a row of one packet would be its copy). ``ssrc`` and the initial FEC sequence numbers are
    the caller's to choose (H2: no dice in the core); 0 matches the real encoders.
    """

    def __init__(
        self,
        columns: int,
        rows: int,
        *,
        row_fec: bool = True,
        payload_type: int = DEFAULT_FEC_PAYLOAD_TYPE,
        ssrc: int = 0,
        column_seq: int = 0,
        row_seq: int = 0,
    ) -> None:
        if not MIN_COLUMNS <= columns <= MAX_COLUMNS:
            raise ValueError(f"columns (L) must be {MIN_COLUMNS}-{MAX_COLUMNS}")
        if not MIN_ROWS <= rows <= MAX_ROWS:
            raise ValueError(f"rows (D) must be {MIN_ROWS}-{MAX_ROWS}")
        if not 0 <= payload_type <= 127:
            raise ValueError("payload_type must be 0-127")
        self.columns = columns
        self.rows = rows
        self.row_fec = row_fec and columns > 1
        self.payload_type = payload_type
        self.ssrc = ssrc
        self.counters = FecEncoderCounters()
        self._column_seq = column_seq & 0xFFFF
        self._row_seq = row_seq & 0xFFFF
        self._row = _Xor()
        self._cols = [_Xor() for _ in range(columns)]
        self._pos = 0  # index in the current matrix, row-major
        self._expected_seq: int | None = None
        self._media_ssrc: int | None = None
        self._last_ts = 0
        self._column_queue: deque[_Xor] = deque()  # finished columns awaiting their turn
        self._spare: list[_Xor] = []
        self._tick = 0
        self._column_out: deque[bytes] = deque()
        self._row_out: deque[bytes] = deque()

    def on_media(self, datagram: memoryview, now: float) -> None:
        """Account one media datagram into the matrix. Never raises on peer input."""
        header = parse_rtp(datagram)
        if header is None:
            self.counters.media_malformed += 1
            return
        self.counters.media_received += 1
        seq = header.sequence
        if (self._expected_seq is not None and seq != self._expected_seq) or (
            self._media_ssrc is not None and header.ssrc != self._media_ssrc
        ):
            if self._pos:
                self.counters.matrix_resets += 1
            self._pos = 0
            self._row.count = 0
            for col in self._cols:
                col.count = 0
        self._expected_seq = (seq + 1) & 0xFFFF
        self._media_ssrc = header.ssrc
        self._last_ts = header.timestamp
        view = datagram if isinstance(datagram, memoryview) else memoryview(datagram)
        column_index = self._pos % self.columns
        if self.row_fec:
            self._row.add(view, seq)
            if column_index == self.columns - 1:
                self._row_out.append(
                    self._row.build(
                        is_row=True,
                        offset=1,
                        payload_type=self.payload_type,
                        seq=self._next_row_seq(),
                        timestamp=self._last_ts,
                        ssrc=self.ssrc,
                    )
                )
        self._cols[column_index].add(view, seq)
        self._pos += 1
        # Pace the previous matrix's columns: one every D media packets.
        self._tick += 1
        if self._column_queue and self._tick % self.rows == 0:
            self._emit_column()
        if self._pos == self.columns * self.rows:
            self._pos = 0
            while self._column_queue:  # only after a reset shifted the schedule
                self._emit_column()
            finished = self._cols
            self._cols = [self._spare.pop() if self._spare else _Xor() for _ in range(self.columns)]
            self._column_queue.extend(finished)
            self._tick = 0

    def pop_column(self) -> bytes | None:
        """The next column FEC datagram due (media port + 2), or None."""
        if self._column_out:
            self.counters.column_packets += 1
            return self._column_out.popleft()
        return None

    def pop_row(self) -> bytes | None:
        """The next row FEC datagram due (media port + 4), or None."""
        if self._row_out:
            self.counters.row_packets += 1
            return self._row_out.popleft()
        return None

    def flush(self) -> None:
        """Make every queued column FEC packet due now (the stream ended)."""
        while self._column_queue:
            self._emit_column()

    def _emit_column(self) -> None:
        column = self._column_queue.popleft()
        self._column_out.append(
            column.build(
                is_row=False,
                offset=self.columns,
                payload_type=self.payload_type,
                seq=self._next_column_seq(),
                timestamp=self._last_ts,
                ssrc=self.ssrc,
            )
        )
        self._spare.append(column)

    def _next_row_seq(self) -> int:
        seq = self._row_seq
        self._row_seq = (seq + 1) & 0xFFFF
        return seq

    def _next_column_seq(self) -> int:
        seq = self._column_seq
        self._column_seq = (seq + 1) & 0xFFFF
        return seq
