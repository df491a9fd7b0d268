"""MPEG-2 transport stream packet fields (ISO/IEC 13818-1 §2.4.3), sans-IO.

Small pure functions over a buffer and an offset: the analyser's hot loops read the four
header bytes themselves, and call these only for the rare packets that need more (an
adaptation field with a PCR, a PES header). None of them raises on peer input: a field
that does not fit answers None.
"""

from __future__ import annotations

from typing import Final

TS_PACKET_SIZE: Final = 188
SYNC_BYTE: Final = 0x47
NULL_PID: Final = 0x1FFF
PAT_PID: Final = 0x0000
CAT_PID: Final = 0x0001
NIT_PID: Final = 0x0010
SDT_PID: Final = 0x0011
PID_COUNT: Final = 8192

PCR_HZ: Final = 27_000_000
PTS_HZ: Final = 90_000
PCR_WRAP: Final = (1 << 33) * 300  # ISO/IEC 13818-1 §2.4.2.2: 33-bit base x 300 + extension
PTS_WRAP: Final = 1 << 33

Buffer = bytes | bytearray | memoryview


def packet_pid(buf: Buffer, off: int) -> int:
    """The 13-bit PID of the packet at ``off``."""
    return ((buf[off + 1] & 0x1F) << 8) | buf[off + 2]


def adaptation_flags(buf: Buffer, off: int) -> int:
    """The adaptation field flags byte, or 0 when the packet has none (or it is empty)."""
    if not buf[off + 3] & 0x20 or buf[off + 4] == 0:
        return 0
    return buf[off + 5]


def discontinuity_indicator(buf: Buffer, off: int) -> bool:
    """ISO/IEC 13818-1 §2.4.3.5 discontinuity_indicator of the packet at ``off``."""
    return bool(adaptation_flags(buf, off) & 0x80)


def packet_pcr(buf: Buffer, off: int) -> int | None:
    """The PCR (27 MHz units) of the packet at ``off``, or None when it carries none.

    ISO/IEC 13818-1 §2.4.3.5: PCR_flag in the adaptation field, 33-bit base (90 kHz),
    6 reserved bits, 9-bit extension (27 MHz); PCR = base x 300 + extension.
    """
    if not buf[off + 3] & 0x20:
        return None
    af_len = buf[off + 4]
    if af_len < 7 or af_len > 183 or not buf[off + 5] & 0x10:
        return None
    p = off + 6
    base = (buf[p] << 25) | (buf[p + 1] << 17) | (buf[p + 2] << 9) | (buf[p + 3] << 1) | (buf[p + 4] >> 7)
    ext = ((buf[p + 4] & 0x01) << 8) | buf[p + 5]
    return base * 300 + ext


def payload_offset(buf: Buffer, off: int) -> int | None:
    """Offset (in ``buf``) of the packet's payload, or None when it has none or the AF is absurd."""
    afc = (buf[off + 3] >> 4) & 0x3
    if not afc & 0x1:
        return None
    if afc & 0x2:
        start = off + 5 + buf[off + 4]
        if start >= off + TS_PACKET_SIZE:
            return None
        return start
    return off + 4


def pes_pts(buf: Buffer, start: int, end: int) -> int | None:
    """The PTS (90 kHz) of a PES header starting at ``start``, or None.

    ISO/IEC 13818-1 §2.4.3.7: packet_start_code_prefix 00 00 01, stream_id, length, then for
    stream ids with the optional header the '10' marker, PTS_DTS_flags in the second flags byte,
    and the PTS as 3+15+15 bits with marker bits.
    """
    if end - start < 14:
        return None
    if buf[start] != 0 or buf[start + 1] != 0 or buf[start + 2] != 1:
        return None
    stream_id = buf[start + 3]
    # Table 2-22: these stream ids carry no optional PES header.
    if stream_id in (0xBC, 0xBE, 0xBF, 0xF0, 0xF1, 0xFF, 0xF2, 0xF8):
        return None
    if buf[start + 6] & 0xC0 != 0x80 or not buf[start + 7] & 0x80:
        return None
    p = start + 9
    return ((buf[p] >> 1) & 0x07) << 30 | buf[p + 1] << 22 | (buf[p + 2] >> 1) << 15 | buf[p + 3] << 7 | buf[p + 4] >> 1


def pes_payload_start(buf: Buffer, start: int, end: int) -> int | None:
    """Offset of the elementary-stream bytes after the PES header at ``start``, or None."""
    if end - start < 9:
        return None
    if buf[start] != 0 or buf[start + 1] != 0 or buf[start + 2] != 1:
        return None
    stream_id = buf[start + 3]
    if stream_id in (0xBC, 0xBE, 0xBF, 0xF0, 0xF1, 0xFF, 0xF2, 0xF8):
        return start + 6
    if buf[start + 6] & 0xC0 != 0x80:
        return None
    es = start + 9 + buf[start + 8]
    return es if es <= end else None
