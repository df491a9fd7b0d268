"""MPEG-2 transport stream demuxer (ISO/IEC 13818-1): TS bytes in, access units out. Sans-IO.

* Takes bytes in any chunking, keeps packet alignment on the 0x47 sync byte and, after a loss,
  resyncs on a sync byte that the next packet confirms (§2.4.3.2).
* Follows the PAT (§2.4.4.3) to the first program's PMT (§2.4.4.8), with CRC checks (Annex A);
  a new PMT version or stream list re-maps the PIDs and drops the PES of streams that left.
* Reassembles PES packets (§2.4.3.6) on the H.264 (0x1B), HEVC (0x24) and ADTS AAC (0x0F)
  PIDs; other stream types are ignored. A PES ends at the next payload_unit_start_indicator, or
  as soon as its PES_packet_length is reached.
* Video: one access unit per PES (Annex B), keyframe from the NAL types (IDR / IRAP), the
  random_access_indicator (§2.4.3.5) used only when the PES has no slice NAL unit.
* Audio: one access unit per ADTS frame, the PTS advanced by 1024 samples at the frame's rate
  for each frame after the first (ISO/IEC 14496-3 §1.A.2.2).
* Continuity errors (§2.4.3.3; one duplicate packet is allowed and skipped) and transport
  errors drop the PES in progress and are counted; PES sizes are capped (8 MiB video,
  64 KiB audio) so garbage never grows a buffer without bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from ..ts.packet import pes_payload_start, pes_pts
from ..ts.psi import SectionAssembler, parse_pat, parse_pmt, section_crc_ok
from .codec import AAC_FRAME_SAMPLES, VideoCodec, annexb_keyframe, iter_adts
from .units import TS_MASK, AccessUnit, Codec, StreamKind

TS_PACKET_SIZE: Final = 188
SYNC_BYTE: Final = 0x47
MAX_VIDEO_PES: Final = 8 * 1024 * 1024
MAX_AUDIO_PES: Final = 64 * 1024

# §2.4.4.10 Table 2-34 stream_type -> (kind, codec).
STREAM_TYPES: Final[dict[int, tuple[StreamKind, Codec]]] = {
    0x1B: ("video", "h264"),
    0x24: ("video", "hevc"),
    0x0F: ("audio", "aac"),
}


@dataclass(slots=True)
class DemuxStats:
    """Counters of everything the demuxer skipped or dropped."""

    packets: int = 0
    bytes_skipped: int = 0  # bytes dropped while looking for sync
    sync_losses: int = 0
    transport_errors: int = 0  # packets with transport_error_indicator set
    cc_errors: int = 0
    dropped_pes: int = 0  # PES dropped because of a CC or transport error
    oversize_pes: int = 0  # PES dropped for passing the size cap
    malformed_pes: int = 0  # PES without a parseable header
    missing_pts: int = 0
    pmt_changes: int = 0
    access_units: int = 0


@dataclass(slots=True)
class _Stream:
    pid: int
    kind: StreamKind
    codec: Codec
    cap: int
    buf: bytearray = field(default_factory=bytearray)
    active: bool = False  # a PES is being collected
    expected: int = 0  # total PES bytes from PES_packet_length; 0 = unbounded, -1 = not read yet
    rai: bool = False
    last_cc: int | None = None
    last_pts: int | None = None


class TsDemuxer:
    """Demuxes the first program of a transport stream into ``AccessUnit``s.

    ``feed`` takes any bytes and answers the units they complete; ``flush`` answers the units
    still held at the end of the stream (a video PES with length 0 ends only at the next one).
    ``program_number`` picks a program other than the PAT's first. Never raises on stream bytes.
    """

    def __init__(self, program_number: int | None = None) -> None:
        self.stats = DemuxStats()
        self._want_program = program_number
        self._rest = bytearray()
        self._synced = False  # the first packet needs its successor's sync byte too
        self._pat = SectionAssembler()
        self._pmt = SectionAssembler()
        self._pat_cc: int | None = None
        self._pmt_cc: int | None = None
        self._pmt_pid: int | None = None
        self._pmt_key: tuple[int, tuple[tuple[int, int], ...]] | None = None
        self._streams: dict[int, _Stream] = {}
        self.program_number: int | None = None
        self.pcr_pid: int | None = None

    @property
    def streams(self) -> dict[int, tuple[StreamKind, Codec]]:
        """PID -> (kind, codec) of the elementary streams being demuxed."""
        return {pid: (s.kind, s.codec) for pid, s in self._streams.items()}

    def feed(self, data: bytes | bytearray | memoryview) -> list[AccessUnit]:
        """Feed TS bytes; answers the access units they complete."""
        out: list[AccessUnit] = []
        buf = self._rest
        buf += data
        n = len(buf)
        pos = 0
        while n - pos >= TS_PACKET_SIZE:
            if self._synced and buf[pos] != SYNC_BYTE:
                self._synced = False
                self.stats.sync_losses += 1
            if not self._synced:
                # §2.4.3.2: look for a sync byte that the next packet's sync byte confirms.
                nxt = buf.find(b"\x47", pos)
                if nxt < 0:
                    self.stats.bytes_skipped += n - pos
                    pos = n
                    break
                self.stats.bytes_skipped += nxt - pos
                pos = nxt
                if n - pos < 2 * TS_PACKET_SIZE:
                    break  # wait for the confirming packet
                if buf[pos + TS_PACKET_SIZE] != SYNC_BYTE:
                    self.stats.bytes_skipped += 1
                    pos += 1
                    continue
                self._synced = True
            self._packet(memoryview(buf)[pos : pos + TS_PACKET_SIZE], out)
            pos += TS_PACKET_SIZE
        del buf[:pos]
        # Bounded: at most one packet plus one confirming packet waits.
        if len(buf) > 2 * TS_PACKET_SIZE:
            self.stats.bytes_skipped += len(buf) - 2 * TS_PACKET_SIZE
            del buf[: len(buf) - 2 * TS_PACKET_SIZE]
        return out

    def flush(self) -> list[AccessUnit]:
        """End of stream: the last packet (if it looks like one) and every PES still being collected."""
        out: list[AccessUnit] = []
        rest = self._rest
        if len(rest) >= TS_PACKET_SIZE and rest[0] == SYNC_BYTE:
            self._packet(memoryview(bytes(rest[:TS_PACKET_SIZE])), out)
        rest.clear()
        for stream in self._streams.values():
            self._finish(stream, out)
        return out

    # -- packets ------------------------------------------------------------------------------

    def _packet(self, pkt: memoryview, out: list[AccessUnit]) -> None:
        self.stats.packets += 1
        b1 = pkt[1]
        pid = ((b1 & 0x1F) << 8) | pkt[2]
        b3 = pkt[3]
        afc = (b3 >> 4) & 0x03
        cc = b3 & 0x0F
        pusi = bool(b1 & 0x40)
        tei = bool(b1 & 0x80)
        stream = self._streams.get(pid)
        if tei:
            self.stats.transport_errors += 1
            if stream is not None and stream.active:
                self._drop(stream)
            return
        discontinuity = False
        rai = False
        payload_start = 4
        if afc & 0x02:
            af_len = pkt[4]
            if af_len > 183 or (af_len > 182 and afc & 0x01):
                if stream is not None and stream.active:
                    self._drop(stream)
                return
            if af_len:
                discontinuity = bool(pkt[5] & 0x80)
                rai = bool(pkt[5] & 0x40)
            payload_start = 5 + af_len
        has_payload = bool(afc & 0x01)
        if pid == 0:
            self._pat_cc = self._psi(self._pat, self._pat_cc, pkt, payload_start, has_payload, pusi, cc, out)
        elif pid == self._pmt_pid:
            self._pmt_cc = self._psi(self._pmt, self._pmt_cc, pkt, payload_start, has_payload, pusi, cc, out)
        elif stream is not None:
            self._es(stream, pkt, payload_start, has_payload, pusi, cc, discontinuity, rai, out)

    def _cc_ok(self, last: int | None, cc: int, has_payload: bool, discontinuity: bool) -> bool | None:
        """True: in order; None: a duplicate to skip (§2.4.3.3); False: packets were lost."""
        if not has_payload or last is None or discontinuity:
            return True
        if cc == last:
            return None
        return cc == (last + 1) & 0x0F

    def _psi(
        self,
        assembler: SectionAssembler,
        last_cc: int | None,
        pkt: memoryview,
        start: int,
        has_payload: bool,
        pusi: bool,
        cc: int,
        out: list[AccessUnit],
    ) -> int | None:
        ok = self._cc_ok(last_cc, cc, has_payload, False)
        if ok is None:
            return last_cc
        if not ok:
            self.stats.cc_errors += 1
            assembler.reset()
        if not has_payload:
            return last_cc
        for section in assembler.feed(pkt[start:], pusi):
            if not section_crc_ok(section):
                continue
            if assembler is self._pat:
                self._on_pat(section)
            else:
                self._on_pmt(section, out)
        return cc

    def _on_pat(self, section: bytes) -> None:
        programs = parse_pat(section)
        if not programs:
            return
        for number, pid in programs:
            if number == 0:
                continue  # network PID
            if self._want_program is None or number == self._want_program:
                if pid != self._pmt_pid:
                    self._pmt_pid = pid
                    self._pmt = SectionAssembler()
                    self._pmt_cc = None
                    self._pmt_key = None
                self.program_number = number
                return

    def _on_pmt(self, section: bytes, out: list[AccessUnit]) -> None:
        pmt = parse_pmt(section)
        if pmt is None or pmt.program_number != self.program_number:
            return
        wanted = tuple((es.pid, es.stream_type) for es in pmt.streams if es.stream_type in STREAM_TYPES)
        key = (pmt.version, wanted)
        if key == self._pmt_key:
            return
        if self._pmt_key is not None:
            self.stats.pmt_changes += 1
        self._pmt_key = key
        self.pcr_pid = pmt.pcr_pid
        new: dict[int, _Stream] = {}
        for pid, stream_type in wanted:
            kind, codec = STREAM_TYPES[stream_type]
            old = self._streams.get(pid)
            if old is not None and old.codec == codec:
                new[pid] = old
                continue
            if old is not None:
                self._finish(old, out)
            new[pid] = _Stream(pid, kind, codec, MAX_VIDEO_PES if kind == "video" else MAX_AUDIO_PES)
        for pid, old in self._streams.items():
            if pid not in new:
                self._finish(old, out)
        self._streams = new

    # -- PES ----------------------------------------------------------------------------------

    def _drop(self, stream: _Stream) -> None:
        stream.buf.clear()
        stream.active = False
        self.stats.dropped_pes += 1

    def _es(
        self,
        stream: _Stream,
        pkt: memoryview,
        start: int,
        has_payload: bool,
        pusi: bool,
        cc: int,
        discontinuity: bool,
        rai: bool,
        out: list[AccessUnit],
    ) -> None:
        ok = self._cc_ok(stream.last_cc, cc, has_payload, discontinuity)
        if ok is None:
            return
        if not ok:
            self.stats.cc_errors += 1
            if stream.active:
                self._drop(stream)
        if not has_payload:
            return
        stream.last_cc = cc
        payload = pkt[start:]
        if pusi:
            self._finish(stream, out)
            stream.active = True
            stream.rai = rai
            stream.expected = -1  # PES_packet_length not read yet (the header may be split)
            stream.buf += payload
        elif stream.active:
            stream.buf += payload
            if len(stream.buf) > stream.cap:
                stream.buf.clear()
                stream.active = False
                self.stats.oversize_pes += 1
                return
        else:
            return  # the middle of a PES whose start we never saw
        if stream.expected < 0 and len(stream.buf) >= 6:
            length = (stream.buf[4] << 8) | stream.buf[5]
            stream.expected = 6 + length if length else 0
        if stream.expected > 0 and len(stream.buf) >= stream.expected:
            self._finish(stream, out)

    def _finish(self, stream: _Stream, out: list[AccessUnit]) -> None:
        """Turn the collected PES into access units (if it is whole and parses)."""
        if not stream.active:
            return
        stream.active = False
        pes = bytes(stream.buf[: stream.expected] if stream.expected > 0 else stream.buf)
        stream.buf.clear()
        end = len(pes)
        if stream.expected > 0 and end < stream.expected:
            self.stats.malformed_pes += 1
            return
        es_start = pes_payload_start(pes, 0, end)
        if es_start is None:
            self.stats.malformed_pes += 1
            return
        pts = pes_pts(pes, 0, end)
        dts = _pes_dts(pes, end) if pts is not None else None
        if pts is None:
            self.stats.missing_pts += 1
            if stream.last_pts is None:
                return
            pts = stream.last_pts
        if dts is None:
            dts = pts
        data = pes[es_start:]
        if not data:
            return
        if stream.kind == "video":
            codec: VideoCodec = "h264" if stream.codec == "h264" else "hevc"
            detected = annexb_keyframe(codec, data)
            keyframe = stream.rai if detected is None else detected
            out.append(AccessUnit("video", stream.codec, stream.pid, pts, dts, keyframe, data))
            self.stats.access_units += 1
            stream.last_pts = pts
            return
        # 14496-3 §1.A.2.2: a PES may carry several ADTS frames; each lasts 1024 samples per
        # raw_data_block, so frame k starts that many samples after the PES's PTS.
        offset_90k = 0
        for offset, frame in iter_adts(data):
            frame_pts = (pts + offset_90k) & TS_MASK
            unit = data[offset : offset + frame.frame_length]
            out.append(AccessUnit("audio", "aac", stream.pid, frame_pts, frame_pts, True, unit))
            self.stats.access_units += 1
            offset_90k += frame.raw_data_blocks * AAC_FRAME_SAMPLES * 90_000 // frame.config.sample_rate
        stream.last_pts = (pts + offset_90k) & TS_MASK  # where a PES without a PTS would start


def _pes_dts(pes: bytes, end: int) -> int | None:
    """The DTS of a PES header whose PTS_DTS_flags are '11' (§2.4.3.7), else None."""
    if end < 19 or pes[7] & 0xC0 != 0xC0:
        return None
    p = 14
    return ((pes[p] >> 1) & 0x07) << 30 | pes[p + 1] << 22 | (pes[p + 2] >> 1) << 15 | pes[p + 3] << 7 | pes[p + 4] >> 1
