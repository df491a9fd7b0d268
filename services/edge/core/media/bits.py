"""Bit reading for codec headers: MSB-first bits, Exp-Golomb codes, NAL unit helpers. Sans-IO."""

from __future__ import annotations

from collections.abc import Iterator


class BitsExhausted(Exception):
    """A header ran past its bytes: the caller answers None (a truncated header is not ours)."""


class BitReader:
    __slots__ = ("_data", "_end", "_pos")

    def __init__(self, data: bytes, start_byte: int = 0) -> None:
        self._data = data
        self._pos = start_byte * 8
        self._end = len(data) * 8

    @property
    def bits_left(self) -> int:
        return self._end - self._pos

    def u(self, n: int) -> int:
        """Read ``n`` bits as an unsigned integer (MSB first)."""
        if n == 0:
            return 0
        if self._pos + n > self._end:
            raise BitsExhausted
        value = 0
        data = self._data
        pos = self._pos
        for _ in range(n):
            value = (value << 1) | ((data[pos >> 3] >> (7 - (pos & 7))) & 1)
            pos += 1
        self._pos = pos
        return value

    def flag(self) -> bool:
        return self.u(1) == 1

    def skip(self, n: int) -> None:
        if self._pos + n > self._end:
            raise BitsExhausted
        self._pos += n

    def ue(self) -> int:
        """ue(v), H.264 §9.1 Exp-Golomb; more than 31 leading zeros is malformed."""
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise BitsExhausted
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) >> 1 if k & 1 else -(k >> 1)


def skip_vui_picture_fields(r: BitReader) -> None:
    """Skip the VUI fields H.264 (Annex E.1.1) and H.265 (Annex E.2.1) share, in that order:
    aspect ratio (with Extended_SAR), overscan, video signal type (with colour description)
    and chroma sample location. The reader then stands at what follows in each codec."""
    if r.flag():  # aspect_ratio_info_present_flag
        if r.u(8) == 255:  # aspect_ratio_idc Extended_SAR: sar_width, sar_height
            r.skip(32)
    if r.flag():  # overscan_info_present_flag
        r.skip(1)
    if r.flag():  # video_signal_type_present_flag: video_format, video_full_range_flag
        r.skip(4)
        if r.flag():  # colour_description_present_flag
            r.skip(24)
    if r.flag():  # chroma_loc_info_present_flag
        r.ue()
        r.ue()


def unescape_rbsp(nal: bytes) -> bytes:
    """Remove emulation_prevention_three_byte (H.264 §7.4.1, H.265 §7.4.2): 00 00 03 -> 00 00."""
    if b"\x00\x00\x03" not in nal:
        return nal
    out = bytearray()
    i = 0
    n = len(nal)
    while i < n:
        j = nal.find(b"\x00\x00\x03", i)
        if j < 0:
            out += nal[i:]
            break
        out += nal[i : j + 2]
        i = j + 3
    return bytes(out)


def iter_nal_units(data: bytes) -> Iterator[bytes]:
    """NAL units of an Annex B byte stream (start codes 00 00 01 / 00 00 00 01); the last may be cut."""
    pos = data.find(b"\x00\x00\x01")
    while pos >= 0:
        start = pos + 3
        nxt = data.find(b"\x00\x00\x01", start)
        end = len(data) if nxt < 0 else nxt
        # A four-byte start code leaves a trailing zero on the previous unit.
        unit = data[start:end]
        if nxt >= 0 and unit.endswith(b"\x00"):
            unit = unit.rstrip(b"\x00")
        if unit:
            yield unit
        pos = nxt
