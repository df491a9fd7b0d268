"""RTP fixed header parsing and building (RFC 3550 §5.1), sans-IO.

A parser that never raises on peer input: ``parse_rtp`` answers None for a
datagram that is not RTP version 2 or whose header does not fit (H5).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

RTP_VERSION: Final = 2
RTP_FIXED_HEADER_LEN: Final = 12
PT_MP2T: Final = 33  # RFC 3551 §6: MPEG-2 transport stream, 90 kHz clock
_HEADER: Final = struct.Struct("!BBHII")


@dataclass(frozen=True, slots=True)
class RtpHeader:
    """The fields of one RTP header. ``payload_offset``/``payload_end`` index the datagram."""

    marker: bool
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload_offset: int
    payload_end: int


def parse_rtp(datagram: bytes | bytearray | memoryview) -> RtpHeader | None:
    """Parse the RTP header of ``datagram``; None when it is not valid RTP v2.

    Handles CSRCs (RFC 3550 §5.1 CC), the header extension (§5.3.1 X) and padding
    (§5.1 P, the last octet counts the padding octets including itself).
    """
    length = len(datagram)
    if length < RTP_FIXED_HEADER_LEN:
        return None
    b0, b1, sequence, timestamp, ssrc = _HEADER.unpack_from(datagram, 0)
    if b0 >> 6 != RTP_VERSION:
        return None
    offset = RTP_FIXED_HEADER_LEN + 4 * (b0 & 0x0F)
    if b0 & 0x10:  # X: one extension header, RFC 3550 §5.3.1
        if offset + 4 > length:
            return None
        ext_words = (datagram[offset + 2] << 8) | datagram[offset + 3]
        offset += 4 + 4 * ext_words
    end = length
    if b0 & 0x20:  # P: padding
        pad = datagram[length - 1]
        if pad == 0:
            return None
        end -= pad
    if offset > end:
        return None
    return RtpHeader(bool(b1 & 0x80), b1 & 0x7F, sequence, timestamp, ssrc, offset, end)


def build_rtp_header(
    buffer: bytearray | memoryview,
    *,
    payload_type: int,
    sequence: int,
    timestamp: int,
    ssrc: int,
    marker: bool = False,
    offset: int = 0,
) -> None:
    """Write a 12-byte RTP v2 header (no CSRC, no extension) into ``buffer`` at ``offset``."""
    _HEADER.pack_into(
        buffer,
        offset,
        RTP_VERSION << 6,
        (0x80 if marker else 0) | (payload_type & 0x7F),
        sequence & 0xFFFF,
        timestamp & 0xFFFFFFFF,
        ssrc & 0xFFFFFFFF,
    )


def seq_delta(new: int, old: int) -> int:
    """Signed distance from ``old`` to ``new`` in 16-bit sequence space (RFC 3550 A.1)."""
    return ((new - old + 0x8000) & 0xFFFF) - 0x8000
