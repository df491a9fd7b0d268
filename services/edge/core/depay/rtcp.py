"""RTCP for an RTP receiver (RFC 3550): reception statistics, parsing, receiver reports. Sans-IO.

* :class:`ReceptionStats` follows one source as RFC 3550 Appendix A does: the extended highest
  sequence number and probation-free resynchronisation of §A.1, the cumulative number and the
  fraction of packets lost of §A.3, the interarrival jitter estimate of §A.8 (in RTP timestamp
  units, from the arrival times the caller passes in seconds), and the last sender report's
  NTP <-> RTP mapping plus the LSR/DLSR fields of §6.4.1.
* :func:`parse_rtcp` splits a compound RTCP packet (§6.1) into SR (§6.4.1), RR (§6.4.2), SDES
  (§6.5), BYE (§6.6) and anything else (kept raw). It never raises: a malformed packet ends
  the parse, and what came before it is answered (nothing gives an empty list).
* :func:`build_receiver_report` builds the compound packet a receiver sends: an RR (with at
  most 31 report blocks each, §6.4.2 RC) first, then an SDES with our CNAME (§6.1: every
  compound packet carries a CNAME; §6.5.1).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from ..rtp import seq_delta

RTCP_SR: Final = 200
RTCP_RR: Final = 201
RTCP_SDES: Final = 202
RTCP_BYE: Final = 203
SDES_CNAME: Final = 1
MAX_DROPOUT: Final = 3000  # §A.1
MAX_MISORDER: Final = 100  # §A.1
_BLOCK: Final = struct.Struct("!IB3sIIII")


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One reception report block (RFC 3550 §6.4.1)."""

    ssrc: int
    fraction_lost: int  # 8-bit fixed point, lost / expected x 256 over the last interval
    cumulative_lost: int  # 24-bit signed
    highest_seq: int  # extended highest sequence number received
    jitter: int  # interarrival jitter, RTP timestamp units
    lsr: int  # middle 32 bits of the last SR's NTP timestamp, 0 without one
    dlsr: int  # delay since that SR, 1/65536 s

    def pack(self) -> bytes:
        """The 24-byte wire form (§6.4.1); the cumulative loss clamped to 24 signed bits."""
        lost = max(-0x800000, min(0x7FFFFF, self.cumulative_lost)) & 0xFFFFFF
        return _BLOCK.pack(
            self.ssrc & 0xFFFFFFFF,
            self.fraction_lost & 0xFF,
            lost.to_bytes(3, "big"),
            self.highest_seq & 0xFFFFFFFF,
            self.jitter & 0xFFFFFFFF,
            self.lsr & 0xFFFFFFFF,
            self.dlsr & 0xFFFFFFFF,
        )


@dataclass(frozen=True, slots=True)
class SenderReport:
    """An SR (§6.4.1): the sender's wallclock (64-bit NTP) for one RTP timestamp."""

    ssrc: int
    ntp: int  # 64-bit NTP timestamp: seconds since 1900 << 32 | fraction
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    reports: tuple[ReportBlock, ...] = ()

    @property
    def ntp_seconds(self) -> float:
        """The NTP timestamp in seconds."""
        return self.ntp / (1 << 32)


@dataclass(frozen=True, slots=True)
class ReceiverReport:
    """An RR (§6.4.2)."""

    ssrc: int
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceDescription:
    """An SDES packet (§6.5): per chunk, the SSRC and its items (type -> value)."""

    chunks: tuple[tuple[int, dict[int, bytes]], ...] = ()


@dataclass(frozen=True, slots=True)
class Goodbye:
    """A BYE packet (§6.6)."""

    ssrcs: tuple[int, ...] = ()
    reason: bytes = b""


@dataclass(frozen=True, slots=True)
class OtherRtcp:
    """Any other RTCP packet type (APP, feedback, XR, ...), body kept as is."""

    packet_type: int
    count: int
    body: bytes


RtcpPacket = SenderReport | ReceiverReport | SourceDescription | Goodbye | OtherRtcp


def _blocks(body: bytes, pos: int, count: int) -> tuple[ReportBlock, ...] | None:
    if pos + 24 * count > len(body):
        return None
    out = []
    for i in range(count):
        ssrc, fraction, lost, highest, jitter, lsr, dlsr = _BLOCK.unpack_from(body, pos + 24 * i)
        cum = int.from_bytes(lost, "big")
        cum = cum - (1 << 24) if cum & 0x800000 else cum
        out.append(ReportBlock(ssrc, fraction, cum, highest, jitter, lsr, dlsr))
    return tuple(out)


def _sdes(body: bytes, count: int) -> SourceDescription | None:
    chunks: list[tuple[int, dict[int, bytes]]] = []
    pos = 0
    n = len(body)
    for _ in range(count):
        if pos + 4 > n:
            return None
        ssrc = int.from_bytes(body[pos : pos + 4], "big")
        pos += 4
        items: dict[int, bytes] = {}
        while True:
            if pos >= n:
                return None
            kind = body[pos]
            if kind == 0:  # end of the item list, then padding to a 32-bit boundary (§6.5)
                pos = (pos + 4) & ~3
                break
            if pos + 2 > n or pos + 2 + body[pos + 1] > n:
                return None
            items[kind] = body[pos + 2 : pos + 2 + body[pos + 1]]
            pos += 2 + body[pos + 1]
        chunks.append((ssrc, items))
    return SourceDescription(tuple(chunks))


def _one(pt: int, count: int, body: bytes) -> RtcpPacket | None:
    if pt == RTCP_SR:
        if len(body) < 24:
            return None
        ssrc, ntp, rtp_ts, packets, octets = struct.unpack_from("!IQIII", body, 0)
        blocks = _blocks(body, 24, count)
        return None if blocks is None else SenderReport(ssrc, ntp, rtp_ts, packets, octets, blocks)
    if pt == RTCP_RR:
        if len(body) < 4:
            return None
        blocks = _blocks(body, 4, count)
        return None if blocks is None else ReceiverReport(int.from_bytes(body[:4], "big"), blocks)
    if pt == RTCP_SDES:
        return _sdes(body, count)
    if pt == RTCP_BYE:
        if len(body) < 4 * count:
            return None
        ssrcs = tuple(int.from_bytes(body[4 * i : 4 * i + 4], "big") for i in range(count))
        rest = body[4 * count :]
        reason = rest[1 : 1 + rest[0]] if rest else b""
        return Goodbye(ssrcs, reason)
    return OtherRtcp(pt, count, body)


def parse_rtcp(data: bytes | bytearray | memoryview) -> list[RtcpPacket]:
    """The packets of a compound RTCP packet (§6.1); parsing stops at the first malformed one."""
    buf = bytes(data)
    out: list[RtcpPacket] = []
    pos = 0
    n = len(buf)
    while pos + 4 <= n:
        b0, pt, length = struct.unpack_from("!BBH", buf, pos)
        size = 4 * (length + 1)  # §6.4.1 length: 32-bit words minus one
        if b0 >> 6 != 2 or pos + size > n:
            break
        end = pos + size
        if b0 & 0x20:  # padding (§6.4.1 P): the last octet counts it
            pad = buf[end - 1]
            if pad == 0 or pad > size - 4:
                break
            end -= pad
        packet = _one(pt, b0 & 0x1F, buf[pos + 4 : end])
        if packet is None:
            break
        out.append(packet)
        pos += size
    return out


@dataclass(slots=True)
class ReceptionStats:
    """What a receiver knows of one RTP source (RFC 3550 Appendix A); times in seconds."""

    clock_rate: int
    ssrc: int | None = None
    base_seq: int = 0
    max_seq: int = 0
    cycles: int = 0
    bad_seq: int = -1
    received: int = 0
    expected_prior: int = 0
    received_prior: int = 0
    jitter: float = 0.0
    _transit: float | None = None
    _last_rtp: int = 0
    _last_arrival: float = 0.0
    last_sr: SenderReport | None = None
    last_sr_arrival: float = 0.0
    reordered: int = field(default=0)

    def on_rtp(self, seq: int, rtp_timestamp: int, arrival: float, ssrc: int | None = None) -> None:
        """One received packet (§A.1 update_seq, §A.8 jitter)."""
        if ssrc is not None and ssrc != self.ssrc:
            self.ssrc = ssrc
            self._init(seq)
        elif self.received == 0:
            self._init(seq)
        else:
            delta = seq_delta(seq, self.max_seq)
            if 0 < delta < MAX_DROPOUT:
                if seq < self.max_seq:
                    self.cycles += 1 << 16  # the sequence number wrapped
                self.max_seq = seq
            elif -MAX_MISORDER <= delta <= 0:
                self.reordered += 1  # duplicate or reordered: counted as received (§A.3)
            elif seq == self.bad_seq:  # two sequential packets after a big jump: the source restarted
                self._init(seq)
            else:
                self.bad_seq = (seq + 1) & 0xFFFF
                return
        self.received += 1
        # §A.8: J += (|D(i-1, i)| - J) / 16, D from transit times in RTP timestamp units
        if self._transit is None:
            self._transit = 0.0
        else:
            rtp_step = ((rtp_timestamp - self._last_rtp + 0x80000000) & 0xFFFFFFFF) - 0x80000000
            d = (arrival - self._last_arrival) * self.clock_rate - rtp_step
            self.jitter += (abs(d) - self.jitter) / 16
        self._last_rtp = rtp_timestamp & 0xFFFFFFFF
        self._last_arrival = arrival

    def _init(self, seq: int) -> None:
        self.base_seq = self.max_seq = seq & 0xFFFF
        self.bad_seq = -1
        self.cycles = 0
        self.received = self.expected_prior = self.received_prior = 0

    def on_sr(self, sr: SenderReport, arrival: float) -> None:
        """A sender report of this source (for LSR/DLSR and the NTP <-> RTP mapping)."""
        self.last_sr = sr
        self.last_sr_arrival = arrival

    @property
    def extended_highest(self) -> int:
        """The extended highest sequence number received (§A.3)."""
        return self.cycles + self.max_seq

    @property
    def expected(self) -> int:
        """Packets expected so far (§A.3)."""
        return self.extended_highest - self.base_seq + 1 if self.received else 0

    @property
    def lost(self) -> int:
        """Cumulative number of packets lost (§A.3; duplicates can make it negative)."""
        return self.expected - self.received

    def report_block(self, now: float) -> ReportBlock:
        """A report block for this source, closing the interval of the fraction lost (§A.3)."""
        expected = self.expected
        expected_interval = expected - self.expected_prior
        received_interval = self.received - self.received_prior
        self.expected_prior, self.received_prior = expected, self.received
        lost_interval = expected_interval - received_interval
        fraction = 0 if expected_interval <= 0 or lost_interval <= 0 else (lost_interval << 8) // expected_interval
        lsr = dlsr = 0
        if self.last_sr is not None:
            lsr = (self.last_sr.ntp >> 16) & 0xFFFFFFFF  # §6.4.1 LSR: the middle 32 bits
            dlsr = max(0, int((now - self.last_sr_arrival) * 65536))
        return ReportBlock(
            self.ssrc or 0, min(fraction, 255), self.lost, self.extended_highest, int(self.jitter), lsr, dlsr
        )


def _header(pt: int, count: int, body_len: int) -> bytes:
    return struct.pack("!BBH", 0x80 | count, pt, (body_len + 4) // 4 - 1)


def build_receiver_report(
    our_ssrc: int, cname: str, reports: Sequence[ReceptionStats | ReportBlock], now: float
) -> bytes:
    """A compound RTCP packet: RR(s) (§6.4.2) then SDES CNAME (§6.5.1), per §6.1."""
    blocks = [r.report_block(now) if isinstance(r, ReceptionStats) else r for r in reports]
    out = bytearray()
    for i in range(0, max(len(blocks), 1), 31):  # RC is 5 bits: 31 blocks per RR at most
        chunk = blocks[i : i + 31]
        body = our_ssrc.to_bytes(4, "big") + b"".join(b.pack() for b in chunk)
        out += _header(RTCP_RR, len(chunk), len(body)) + body
    name = cname.encode()[:255]
    chunk_body = our_ssrc.to_bytes(4, "big") + bytes((SDES_CNAME, len(name))) + name + b"\x00"
    chunk_body += b"\x00" * (-len(chunk_body) % 4)  # null items to the 32-bit boundary (§6.5)
    out += _header(RTCP_SDES, 1, len(chunk_body)) + chunk_body
    return bytes(out)


__all__ = [
    "Goodbye",
    "OtherRtcp",
    "ReceiverReport",
    "ReceptionStats",
    "ReportBlock",
    "RtcpPacket",
    "SenderReport",
    "SourceDescription",
    "build_receiver_report",
    "parse_rtcp",
]
