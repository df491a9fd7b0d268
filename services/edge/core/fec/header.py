"""SMPTE ST 2022-1 (Pro-MPEG CoP#3 r2) FEC packet: RTP header + 16-byte FEC header, sans-IO.

Wire layout of one FEC datagram (SMPTE 2022-1 §8; RFC 2733 §7 for the fields it inherits)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |V=2|P|X|  CC   |M|     PT      |       sequence number         |  RTP header (12 bytes):
    |                           timestamp                           |  P, X, CC and M carry the XOR
    |                     SSRC (0 from real encoders)               |  of the protected packets' bits
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |      SNBase low bits          |        Length recovery        |  FEC header (16 bytes)
    |E| PT recovery |                    Mask (0)                   |
    |                          TS recovery                          |
    |N|D|type |index|    Offset     |      NA       |SNBase ext bits|
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  XOR of the protected packets' bytes after their 12-byte RTP  |  FEC payload
    |  fixed header, each zero-padded to the longest                |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

D=0 is a column FEC packet (Offset = L, NA = D, sent to media port + 2); D=1 a row FEC packet
(Offset = 1, NA = L, media port + 4). Type 0 is XOR, the only type 2022-1 defines for RTP.

Both real encoders (GStreamer's ``rtpst2022-1-fecenc``, ffmpeg's ``prompeg``) put the XOR of the
media packets' P/X/CC bits into the FEC packet's own RTP header, so that header's X and CC bits do
*not* describe the FEC packet: the FEC header always starts at byte 12 and ``parse_fec`` never
follows X or CC. ``parse_fec`` never raises on peer input: it answers None (H5).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

FEC_HEADER_LEN: Final = 16
FEC_RTP_HEADER_LEN: Final = 12
FEC_MIN_DATAGRAM: Final = FEC_RTP_HEADER_LEN + FEC_HEADER_LEN
FEC_TYPE_XOR: Final = 0
DEFAULT_FEC_PAYLOAD_TYPE: Final = 96  # GStreamer's default and ffmpeg's PROMPEG_RTP_PT (0x60)

# RTP fixed header (12) + FEC header (16) in one unpack.
_FEC: Final = struct.Struct("!BBHIIHHBBHIBBBB")


@dataclass(frozen=True, slots=True)
class FecPacket:
    """One parsed FEC packet. ``payload`` is a view into the caller's datagram (copy to keep it)."""

    rtp_byte0: int  # the FEC packet's RTP byte 0: its low 6 bits are P/X/CC recovery
    marker: bool  # M recovery
    payload_type: int  # the FEC packet's own RTP PT (96 from GStreamer and ffmpeg)
    sequence: int  # the FEC stream's own RTP sequence number
    timestamp: int
    ssrc: int
    snbase: int  # SNBase low bits: the first protected media sequence number
    length_recovery: int
    extension_flag: bool  # E (1 in 2022-1)
    pt_recovery: int
    mask: int
    ts_recovery: int
    n_flag: bool  # N (RFC 2733) / X (2022-1 §8): reserved, 0
    is_row: bool  # D: False = column (port + 2), True = row (port + 4)
    fec_type: int
    index: int
    offset: int
    na: int
    snbase_ext: int
    payload: memoryview


def parse_fec(datagram: bytes | bytearray | memoryview) -> FecPacket | None:
    """Parse one FEC datagram; None when it is too short or not RTP version 2."""
    if len(datagram) < FEC_MIN_DATAGRAM:
        return None
    (b0, b1, seq, ts, ssrc, snbase, length_rec, e_pt, mask_hi, mask_lo, ts_rec, b24, offset, na, ext) = (
        _FEC.unpack_from(datagram, 0)
    )
    if b0 >> 6 != 2:
        return None
    return FecPacket(
        rtp_byte0=b0,
        marker=bool(b1 & 0x80),
        payload_type=b1 & 0x7F,
        sequence=seq,
        timestamp=ts,
        ssrc=ssrc,
        snbase=snbase,
        length_recovery=length_rec,
        extension_flag=bool(e_pt & 0x80),
        pt_recovery=e_pt & 0x7F,
        mask=(mask_hi << 16) | mask_lo,
        ts_recovery=ts_rec,
        n_flag=bool(b24 & 0x80),
        is_row=bool(b24 & 0x40),
        fec_type=(b24 >> 3) & 0x07,
        index=b24 & 0x07,
        offset=offset,
        na=na,
        snbase_ext=ext,
        payload=memoryview(datagram)[FEC_MIN_DATAGRAM:],
    )


def build_fec_header(
    buffer: bytearray | memoryview,
    *,
    rtp_bits: int,
    marker: bool,
    payload_type: int,
    sequence: int,
    timestamp: int,
    ssrc: int,
    snbase: int,
    length_recovery: int,
    pt_recovery: int,
    ts_recovery: int,
    is_row: bool,
    offset: int,
    na: int,
) -> None:
    """Write the 12-byte RTP header and the 16-byte FEC header into ``buffer[0:28]``.

    ``rtp_bits`` is the XOR of the protected packets' P/X/CC bits (byte 0, low 6 bits), written
    into the FEC packet's RTP byte 0 as both real encoders do. E is 1, Mask 0, type XOR, index 0,
    SNBase ext bits 0 (SMPTE 2022-1 §8).
    """
    _FEC.pack_into(
        buffer,
        0,
        0x80 | (rtp_bits & 0x3F),
        (0x80 if marker else 0) | (payload_type & 0x7F),
        sequence & 0xFFFF,
        timestamp & 0xFFFFFFFF,
        ssrc & 0xFFFFFFFF,
        snbase & 0xFFFF,
        length_recovery & 0xFFFF,
        0x80 | (pt_recovery & 0x7F),
        0,  # mask, high byte
        0,  # mask, low 16 bits
        ts_recovery & 0xFFFFFFFF,
        0x40 if is_row else 0x00,  # N=0, D, type=0 (XOR), index=0
        offset & 0xFF,
        na & 0xFF,
        0,  # SNBase ext bits
    )
