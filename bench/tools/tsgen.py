"""Synthetic MPEG-TS for the load generator: PAT, PMT, PCR and continuity counters (no I/O).

Each datagram payload is 7 x 188-byte TS packets (1316 bytes). The stream is one program:
PAT (PID 0) and PMT (PID 0x1000) every ``psi_interval`` datagrams, an H.264-typed elementary
stream on PID 0x100 carrying a PCR at least every 20 ms (of media time), and a probe in the last
TS packet of every datagram: ``b"MPTS"``, the 64-bit packet index and the 64-bit send time in ns
(CLOCK_REALTIME), which ``rtpsink`` reads back for exact counting and latency.
"""

from __future__ import annotations

import struct
from typing import Final

TS_PACKET_SIZE: Final = 188
TS_PER_DATAGRAM: Final = 7
TS_PAYLOAD_SIZE: Final = TS_PACKET_SIZE * TS_PER_DATAGRAM  # 1316
SYNC_BYTE: Final = 0x47
PAT_PID: Final = 0x0000
PMT_PID: Final = 0x1000
VIDEO_PID: Final = 0x0100
PROGRAM_NUMBER: Final = 1
PCR_INTERVAL_S: Final = 0.020  # ISO/IEC 13818-1 §2.7.2: PCRs at most 100 ms apart (TR 101 290 1.5/2.3: 40 ms)
PROBE_MAGIC: Final = b"MPTS"
# The probe sits right after the 4-byte TS header of the datagram's last TS packet.
PROBE: Final = struct.Struct("!4sQQ")  # magic, packet index, send time (ns since the epoch)
PROBE_OFFSET_FROM_END: Final = TS_PACKET_SIZE - 4
_TS_HEADER: Final = struct.Struct("!BHB")


def crc32_mpeg2(data: bytes | bytearray) -> int:
    """CRC-32/MPEG-2 (ISO/IEC 13818-1 Annex A): poly 0x04C11DB7, init all ones, no reflection."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else (crc << 1)
            crc &= 0xFFFFFFFF
    return crc


def _section_packet(pid: int, section: bytes) -> bytearray:
    """One TS packet carrying a whole PSI section (PUSI set, pointer_field 0, 0xFF stuffing)."""
    section = section + crc32_mpeg2(section).to_bytes(4, "big")
    packet = bytearray(b"\xff" * TS_PACKET_SIZE)
    _TS_HEADER.pack_into(packet, 0, SYNC_BYTE, 0x4000 | pid, 0x10)
    packet[4] = 0  # pointer_field
    packet[5 : 5 + len(section)] = section
    return packet


def pat_packet() -> bytearray:
    """PAT (ISO/IEC 13818-1 §2.4.4.3): transport_stream_id 1, program 1 -> PMT_PID."""
    body = struct.pack("!HBBBHH", 1, 0xC1, 0, 0, PROGRAM_NUMBER, 0xE000 | PMT_PID)
    return _section_packet(PAT_PID, bytes([0x00]) + struct.pack("!H", 0xB000 | (len(body) + 4)) + body)


def pmt_packet() -> bytearray:
    """PMT (§2.4.4.8): PCR on VIDEO_PID, one stream of type 0x1B (H.264) on VIDEO_PID."""
    body = struct.pack("!HBBBHH", PROGRAM_NUMBER, 0xC1, 0, 0, 0xE000 | VIDEO_PID, 0xF000)
    body += struct.pack("!BHH", 0x1B, 0xE000 | VIDEO_PID, 0xF000)
    return _section_packet(PMT_PID, bytes([0x02]) + struct.pack("!H", 0xB000 | (len(body) + 4)) + body)


class TsPayloadWriter:
    """Writes successive 1316-byte TS payloads into caller buffers (continuity kept per PID)."""

    def __init__(self, *, psi_interval: int = 40, probe: bool = True) -> None:
        self._probe = probe
        self._pat = pat_packet()
        self._pmt = pmt_packet()
        self._psi_interval = max(1, psi_interval)
        self._cc = {PAT_PID: 0, PMT_PID: 0, VIDEO_PID: 0}
        self._datagrams = 0
        self._next_pcr_s = 0.0
        # The common datagram is 7 video packets without a PCR: one template per starting
        # counter (7 x 16 = 112 = 0 mod 16 after 16 datagrams), copied in one slice assignment.
        self._video_templates = []
        for phase in range(16):
            template = bytearray(b"\xa5" * TS_PAYLOAD_SIZE)
            for slot in range(TS_PER_DATAGRAM):
                _TS_HEADER.pack_into(
                    template, slot * TS_PACKET_SIZE, SYNC_BYTE, VIDEO_PID, 0x10 | ((phase + slot) & 0x0F)
                )
            self._video_templates.append(bytes(template))

    def write(self, buf: bytearray | memoryview, offset: int, media_time_s: float, index: int, send_ns: int) -> None:
        """Fill ``buf[offset : offset + 1316]``; ``media_time_s`` drives the PCR (27 MHz)."""
        cc = self._cc
        if self._datagrams % self._psi_interval and media_time_s < self._next_pcr_s:
            video_cc = cc[VIDEO_PID]
            buf[offset : offset + TS_PAYLOAD_SIZE] = self._video_templates[video_cc]
            cc[VIDEO_PID] = (video_cc + TS_PER_DATAGRAM) & 0x0F
            self._datagrams += 1
            if self._probe:
                PROBE.pack_into(buf, offset + TS_PAYLOAD_SIZE - PROBE_OFFSET_FROM_END, PROBE_MAGIC, index, send_ns)
            return
        first = 0
        if self._datagrams % self._psi_interval == 0:
            for slot, (pid, packet) in enumerate(((PAT_PID, self._pat), (PMT_PID, self._pmt))):
                start = offset + slot * TS_PACKET_SIZE
                buf[start : start + TS_PACKET_SIZE] = packet
                buf[start + 3] = 0x10 | cc[pid]
                cc[pid] = (cc[pid] + 1) & 0x0F
            first = 2
        self._datagrams += 1
        for slot in range(first, TS_PER_DATAGRAM):
            start = offset + slot * TS_PACKET_SIZE
            video_cc = cc[VIDEO_PID]
            cc[VIDEO_PID] = (video_cc + 1) & 0x0F
            if slot == first and media_time_s >= self._next_pcr_s:
                self._next_pcr_s = media_time_s + PCR_INTERVAL_S
                _TS_HEADER.pack_into(buf, start, SYNC_BYTE, VIDEO_PID, 0x30 | video_cc)
                base = int(media_time_s * 90000) & 0x1FFFFFFFF  # §2.4.3.5: PCR_base at 90 kHz, ext 0
                buf[start + 4] = 7  # adaptation_field_length
                buf[start + 5] = 0x10  # PCR_flag
                buf[start + 6 : start + 12] = ((base << 15) | 0x7E00).to_bytes(6, "big")
            else:
                _TS_HEADER.pack_into(buf, start, SYNC_BYTE, VIDEO_PID, 0x10 | video_cc)
        if self._probe:
            PROBE.pack_into(buf, offset + TS_PAYLOAD_SIZE - PROBE_OFFSET_FROM_END, PROBE_MAGIC, index, send_ns)


def read_probe(datagram: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(packet index, send time ns)`` from a datagram's last TS packet, or None."""
    offset = len(datagram) - PROBE_OFFSET_FROM_END
    if offset < 0:
        return None
    magic, index, send_ns = PROBE.unpack_from(datagram, offset)
    if magic != PROBE_MAGIC:
        return None
    return index, send_ns
