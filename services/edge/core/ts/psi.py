"""Program-specific information: section reassembly, CRC32, PAT and PMT (ISO/IEC 13818-1 §2.4.4).

Sans-IO and peer-proof (style H5): malformed sections are counted by the assembler and
answer None from the parsers; nothing here raises on stream bytes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

from .packet import Buffer

# ISO/IEC 13818-1 Annex A: CRC-32/MPEG-2 (polynomial 0x04C11DB7, init all ones, not reflected,
# no final XOR). zlib's CRC-32 is the same polynomial reflected with a final XOR; over bit-reversed
# bytes it runs the MPEG-2 register mirrored, so a section whose CRC is right (its CRC over all
# bytes including CRC_32 is zero) gives zlib 0xFFFFFFFF. This keeps the byte loop in C.
_BIT_REVERSED: Final = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))

TABLE_PAT: Final = 0x00
TABLE_CAT: Final = 0x01
TABLE_PMT: Final = 0x02
MAX_SECTION_BYTES: Final = 4096  # §2.4.4.x: section_length <= 4093 for private sections, 1021 for PSI
_MAX_PSI_SECTION_LENGTH: Final = 1021

DESC_REGISTRATION: Final = 0x05
DESC_ISO_639: Final = 0x0A
DESC_AC3: Final = 0x6A  # ETSI EN 300 468 Annex D
DESC_EAC3: Final = 0x7A
DESC_AAC: Final = 0x7C
DESC_EXTENSION: Final = 0x3F  # ISO/IEC 13818-1 §2.6.90
EXT_JPEG_XS_VIDEO: Final = 0x14  # ISO/IEC 13818-1:2021 Amd. 1, JPEG XS video descriptor


def crc32_mpeg2(data: Buffer) -> int:
    """CRC-32/MPEG-2 of ``data`` (ISO/IEC 13818-1 Annex A)."""
    mirrored = zlib.crc32(bytes(data).translate(_BIT_REVERSED)) ^ 0xFFFFFFFF
    return int(f"{mirrored:032b}"[::-1], 2)


def section_crc_ok(section: Buffer) -> bool:
    """True when the CRC_32 ending ``section`` is right (the CRC over the whole section is 0)."""
    return zlib.crc32(bytes(section).translate(_BIT_REVERSED)) == 0xFFFFFFFF


class SectionAssembler:
    """Reassembles PSI/SI sections of one PID from TS packet payloads.

    ``feed`` takes the payload bytes of one packet and answers the sections completed by it
    (each a fresh ``bytes``). Truncated or absurd sections are dropped and counted in
    ``malformed``; a continuity error should be reported with ``reset`` so that a section is
    never spliced across a lost packet.
    """

    __slots__ = ("_need", "_pending", "malformed")

    def __init__(self) -> None:
        self._pending = bytearray()
        self._need = 0  # bytes the pending section still lacks; 0 = nothing pending
        self.malformed = 0

    @property
    def busy(self) -> bool:
        """True while part of a section waits for the next packets."""
        return bool(self._pending)

    def reset(self) -> None:
        if self._pending:
            self.malformed += 1
        self._pending.clear()
        self._need = 0

    def feed(self, payload: Buffer, pusi: bool) -> list[bytes]:
        out: list[bytes] = []
        n = len(payload)
        if pusi:
            if n < 1:
                self.reset()
                return out
            pointer = payload[0]
            if 1 + pointer > n:
                self.reset()
                self.malformed += 1
                return out
            if self._pending:
                self._continue(payload[1 : 1 + pointer], out)
            # §2.4.4.2: a new section starts after the pointer field; leftovers were stuffing
            # or a section that will never complete.
            self.reset()
            self._parse_from(payload, 1 + pointer, out)
        elif self._pending:
            self._continue(payload, out)
        return out

    def _continue(self, chunk: Buffer, out: list[bytes]) -> None:
        pending = self._pending
        pos = 0
        if len(pending) < 3:
            # The section header itself was split across packets.
            pos = min(3 - len(pending), len(chunk))
            pending += chunk[:pos]
            if len(pending) < 3:
                return
            total = 3 + (((pending[1] & 0x0F) << 8) | pending[2])
            if total > MAX_SECTION_BYTES:
                self.malformed += 1
                pending.clear()
                return
            self._need = total - 3
        take = min(self._need, len(chunk) - pos)
        pending += chunk[pos : pos + take]
        self._need -= take
        if self._need == 0:
            out.append(bytes(pending))
            pending.clear()

    def _parse_from(self, payload: Buffer, pos: int, out: list[bytes]) -> None:
        n = len(payload)
        while pos < n:
            if payload[pos] == 0xFF:  # §2.4.4: stuffing bytes end the packet's sections
                return
            if n - pos < 3:
                self._pending += payload[pos:n]
                self._need = 0
                return
            section_length = ((payload[pos + 1] & 0x0F) << 8) | payload[pos + 2]
            if section_length > MAX_SECTION_BYTES - 3:
                self.malformed += 1
                return
            total = 3 + section_length
            if pos + total <= n:
                out.append(bytes(payload[pos : pos + total]))
                pos += total
            else:
                self._pending += payload[pos:n]
                self._need = total - (n - pos)
                return


@dataclass(frozen=True, slots=True)
class EsInfo:
    """One elementary stream of a PMT (ISO/IEC 13818-1 §2.4.4.9)."""

    stream_type: int
    pid: int
    language: str | None
    descriptor_tags: tuple[int, ...]
    registration: str | None
    jpeg_xs_descriptor: bool


@dataclass(frozen=True, slots=True)
class Pmt:
    program_number: int
    version: int
    pcr_pid: int
    streams: tuple[EsInfo, ...]


def _long_section_bounds(section: bytes, max_length: int) -> tuple[int, int] | None:
    """(start of the table body, start of CRC_32) of a long-form section, or None if malformed."""
    if len(section) < 12 or not section[1] & 0x80:
        return None
    length = ((section[1] & 0x0F) << 8) | section[2]
    if length > max_length or length + 3 != len(section) or length < 9:
        return None
    return 8, len(section) - 4


def parse_pat(section: bytes) -> list[tuple[int, int]] | None:
    """[(program_number, PID)] of a PAT section; program 0 is the network PID (§2.4.4.3)."""
    bounds = _long_section_bounds(section, _MAX_PSI_SECTION_LENGTH)
    if bounds is None or section[0] != TABLE_PAT:
        return None
    start, end = bounds
    if (end - start) % 4:
        return None
    return [
        ((section[p] << 8) | section[p + 1], ((section[p + 2] & 0x1F) << 8) | section[p + 3])
        for p in range(start, end, 4)
    ]


def _descriptors(data: bytes, start: int, end: int) -> list[tuple[int, bytes]] | None:
    out: list[tuple[int, bytes]] = []
    p = start
    while p < end:
        if p + 2 > end:
            return None
        tag, length = data[p], data[p + 1]
        if p + 2 + length > end:
            return None
        out.append((tag, data[p + 2 : p + 2 + length]))
        p += 2 + length
    return out


def parse_pmt(section: bytes) -> Pmt | None:
    """The program map of a PMT section (§2.4.4.8), or None when malformed."""
    bounds = _long_section_bounds(section, _MAX_PSI_SECTION_LENGTH)
    if bounds is None or section[0] != TABLE_PMT:
        return None
    _, end = bounds
    program_number = (section[3] << 8) | section[4]
    version = (section[5] >> 1) & 0x1F
    pcr_pid = ((section[8] & 0x1F) << 8) | section[9]
    info_len = ((section[10] & 0x0F) << 8) | section[11]
    p = 12 + info_len
    if p > end:
        return None
    streams: list[EsInfo] = []
    while p < end:
        if p + 5 > end:
            return None
        stream_type = section[p]
        pid = ((section[p + 1] & 0x1F) << 8) | section[p + 2]
        es_len = ((section[p + 3] & 0x0F) << 8) | section[p + 4]
        if p + 5 + es_len > end:  # ES_info_length past the section (CRC may still be valid)
            return None
        descs = _descriptors(section, p + 5, p + 5 + es_len)
        if descs is None:
            return None
        language = None
        registration = None
        jxs = False
        for tag, body in descs:
            if tag == DESC_ISO_639 and len(body) >= 3 and language is None:
                # §2.6.18: ISO_639_language_code, 3 bytes of ISO 8859-1 text.
                text = body[:3].decode("latin-1")
                language = text if text.isprintable() else None
            elif tag == DESC_REGISTRATION and len(body) >= 4:
                text = body[:4].decode("latin-1")
                registration = text if text.isprintable() else None
            elif tag == DESC_EXTENSION and body[:1] == bytes((EXT_JPEG_XS_VIDEO,)):
                jxs = True
        streams.append(EsInfo(stream_type, pid, language, tuple(t for t, _ in descs), registration, jxs))
        p += 5 + es_len
    return Pmt(program_number, version, pcr_pid, tuple(streams))
