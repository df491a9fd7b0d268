"""MPEG-2 transport stream muxer for one program (ISO/IEC 13818-1), sans-IO.

Access units in (Annex B H.264/HEVC pictures, ADTS AAC frames, 90 kHz timestamps), 188-byte
TS packets out. What it writes:

* PAT and PMT (§2.4.4.3, §2.4.4.8, CRC per Annex A) at the start, in front of every keyframe
  and again once ``psi_interval`` of DTS has passed (checked at each access unit).
* One PES packet per access unit (§2.4.3.6): stream_id 0xE0 (video) / 0xC0 (audio),
  data_alignment_indicator set, PTS always, DTS only when it differs from the PTS (§2.4.3.7).
  PES_packet_length is the real length when it fits 16 bits; a larger video PES says 0, which
  §2.4.3.7 allows for video elementary streams only (a larger audio unit raises ValueError).
* The PCR (§2.4.3.5) in the adaptation field of the PCR PID (the video PID by default): on the
  first packet of a PES when ``pcr_interval`` has passed, always on a keyframe, and as a
  payload-less packet (adaptation_field_control '10', continuity counter unchanged, §2.4.3.3)
  before another stream's PES when it is due. In VBR mode PCR = (DTS - ``pcr_offset``) x 300,
  so the PCR never passes the DTS of the unit it travels with; in CBR mode it is the packet's
  position at ``mux_rate`` (the muxer pads with null packets, PID 0x1FFF, up to each unit's
  DTS - ``pcr_offset``).
* random_access_indicator on the first packet of every keyframe PES, per-PID continuity
  counters, and stuffing in the adaptation field of a PES's last packet (§2.4.3.5).

The PCR spacing bound: a PCR goes out at the first access unit (of any stream) that finds
``pcr_interval`` elapsed, so two PCRs are at most ``pcr_interval`` plus the largest DTS gap
between consecutive access units apart (15 + 23.2 ms for 44.1 kHz AAC with any video); in
CBR mode the padding carries PCRs too. A DTS jump of more than ``max_clock_jump`` re-anchors
the PCR and flags the discontinuity_indicator (§2.4.3.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from ..ts.psi import crc32_mpeg2
from .codec import annexb_keyframe
from .units import TS_MASK, AccessUnit, ts_delta

TS_PACKET_SIZE: Final = 188
TS_PAYLOAD_SIZE: Final = 184
NULL_PID: Final = 0x1FFF
PCR_PER_90K: Final = 300  # §2.4.2.2: PCR = PCR_base (90 kHz) x 300 + PCR_ext (27 MHz)
PCR_WRAP: Final = (1 << 33) * 300
STREAM_ID_VIDEO: Final = 0xE0  # §2.4.3.7 Table 2-22: ITU-T H.26x video stream number 0
STREAM_ID_AUDIO: Final = 0xC0  # ISO/IEC 13818-3/14496-3 audio stream number 0
# §2.4.4.10 Table 2-34 stream_type.
STREAM_TYPE_H264: Final = 0x1B
STREAM_TYPE_HEVC: Final = 0x24
STREAM_TYPE_AAC_ADTS: Final = 0x0F
DATAGRAM_PACKETS: Final = 7  # 7 x 188 = 1316 bytes, the usual UDP/RTP payload

NULL_PACKET: Final = bytes((0x47, 0x1F, 0xFF, 0x10)) + b"\xff" * TS_PAYLOAD_SIZE


@dataclass(frozen=True, slots=True)
class MuxConfig:
    """One program's layout and pacing. Times are 90 kHz ticks; ``mux_rate`` in bit/s, 0 = VBR."""

    video_codec: Literal["h264", "hevc"] | None = "h264"
    audio_codec: Literal["aac"] | None = "aac"
    program_number: int = 1
    transport_stream_id: int = 1
    pmt_pid: int = 0x1000
    video_pid: int = 0x100
    audio_pid: int = 0x101
    pcr_pid: int | None = None  # default: the video PID, else the audio PID
    psi_interval: int = 9_000  # 100 ms
    pcr_interval: int = 1_350  # 15 ms, see the module docstring for the resulting bound
    pcr_offset: int = 63_000  # PCR = DTS - 700 ms in VBR mode (ffmpeg's default max_delay)
    mux_rate: int = 0
    max_clock_jump: int = 90_000  # 1 s

    def __post_init__(self) -> None:
        if self.video_codec is None and self.audio_codec is None:
            raise ValueError("a program needs a video or an audio stream")
        pids = [self.pmt_pid]
        pids += [self.video_pid] if self.video_codec else []
        pids += [self.audio_pid] if self.audio_codec else []
        if any(not 0x10 <= p < NULL_PID for p in pids) or len(set(pids)) != len(pids):
            raise ValueError(f"PIDs must be distinct and in 0x0010..0x1FFE, not {[hex(p) for p in pids]}")
        if self.pcr_pid is not None and not 0x10 <= self.pcr_pid <= NULL_PID:
            raise ValueError("pcr_pid out of range")
        if not 0 < self.program_number <= 0xFFFF or not 0 <= self.transport_stream_id <= 0xFFFF:
            raise ValueError("program_number / transport_stream_id out of range")
        if self.mux_rate < 0 or self.psi_interval <= 0 or self.pcr_interval <= 0 or self.pcr_offset < 0:
            raise ValueError("intervals, offset and mux_rate must be positive")

    @property
    def effective_pcr_pid(self) -> int:
        if self.pcr_pid is not None:
            return self.pcr_pid
        return self.video_pid if self.video_codec else self.audio_pid


def encode_timestamp(prefix: int, ts: int) -> bytes:
    """A 5-byte PTS or DTS field (§2.4.3.7): 4-bit prefix, 33 bits in 3+15+15 with marker bits."""
    ts &= TS_MASK
    return bytes(
        (
            (prefix << 4) | ((ts >> 29) & 0x0E) | 1,
            (ts >> 22) & 0xFF,
            ((ts >> 14) & 0xFE) | 1,
            (ts >> 7) & 0xFF,
            ((ts << 1) & 0xFE) | 1,
        )
    )


def encode_pcr(pcr: int) -> bytes:
    """The 6-byte PCR field (§2.4.3.5): 33-bit base, 6 reserved bits, 9-bit extension."""
    pcr %= PCR_WRAP
    base, ext = divmod(pcr, PCR_PER_90K)
    return bytes(
        (
            (base >> 25) & 0xFF,
            (base >> 17) & 0xFF,
            (base >> 9) & 0xFF,
            (base >> 1) & 0xFF,
            ((base & 1) << 7) | 0x7E | (ext >> 8),
            ext & 0xFF,
        )
    )


def pes_header(stream_id: int, payload_length: int, pts: int, dts: int | None, *, bounded: bool) -> bytes:
    """PES header (§2.4.3.6) with data_alignment_indicator, PTS and (when given) DTS.

    ``bounded`` writes the real PES_packet_length; a length over 16 bits is written as 0 for a
    video stream_id and raises ValueError for any other (§2.4.3.7).
    """
    if dts is None:
        fields = encode_timestamp(0b0010, pts)
        flags = 0x80  # PTS_DTS_flags '10'
    else:
        fields = encode_timestamp(0b0011, pts) + encode_timestamp(0b0001, dts)
        flags = 0xC0  # PTS_DTS_flags '11'
    length = 3 + len(fields) + payload_length
    if not bounded:
        length = 0
    elif length > 0xFFFF:
        if stream_id & 0xF0 != 0xE0:
            raise ValueError(f"a {payload_length}-byte PES payload needs PES_packet_length 0, video only")
        length = 0
    # '10' marker, scrambling 00, priority 0, data_alignment_indicator 1, copyright 0, original 0
    return bytes((0, 0, 1, stream_id, length >> 8, length & 0xFF, 0x84, flags, len(fields))) + fields


def _long_section(table_id: int, id_field: int, body: bytes, version: int = 0) -> bytes:
    """A long-form PSI section (§2.4.4.3 / §2.4.4.8) with its CRC_32 (Annex A)."""
    length = 5 + len(body) + 4  # id .. last_section_number, body, CRC_32
    head = bytes(
        (
            table_id,
            0xB0 | (length >> 8),  # section_syntax_indicator 1, '0', reserved '11'
            length & 0xFF,
            id_field >> 8,
            id_field & 0xFF,
            0xC1 | ((version & 0x1F) << 1),  # reserved '11', version, current_next_indicator 1
            0,  # section_number
            0,  # last_section_number
        )
    )
    section = head + body
    return section + crc32_mpeg2(section).to_bytes(4, "big")


def pat_section(transport_stream_id: int, program_number: int, pmt_pid: int, version: int = 0) -> bytes:
    """A PAT (§2.4.4.3) listing one program."""
    body = bytes((program_number >> 8, program_number & 0xFF, 0xE0 | (pmt_pid >> 8), pmt_pid & 0xFF))
    return _long_section(0x00, transport_stream_id, body, version)


def pmt_section(program_number: int, pcr_pid: int, streams: list[tuple[int, int]], version: int = 0) -> bytes:
    """A PMT (§2.4.4.8) with no descriptors; ``streams`` is [(stream_type, elementary_PID)]."""
    body = bytearray((0xE0 | (pcr_pid >> 8), pcr_pid & 0xFF, 0xF0, 0x00))  # program_info_length 0
    for stream_type, pid in streams:
        body += bytes((stream_type, 0xE0 | (pid >> 8), pid & 0xFF, 0xF0, 0x00))  # ES_info_length 0
    return _long_section(0x02, program_number, bytes(body), version)


def section_packets(pid: int, section: bytes, cc: int) -> tuple[bytes, int]:
    """``section`` as TS packets on ``pid`` (pointer_field 0, stuffed with 0xFF, §2.4.4.2), and
    the next continuity counter."""
    out = bytearray()
    data = b"\x00" + section
    first = True
    while data or first:
        chunk, data = data[:TS_PAYLOAD_SIZE], data[TS_PAYLOAD_SIZE:]
        out += bytes((0x47, (0x40 if first else 0) | (pid >> 8), pid & 0xFF, 0x10 | cc))
        out += chunk + b"\xff" * (TS_PAYLOAD_SIZE - len(chunk))
        cc = (cc + 1) & 0x0F
        first = False
    return bytes(out), cc


def chunk_datagrams(packets: bytes | bytearray, per: int = DATAGRAM_PACKETS) -> list[bytes]:
    """Split concatenated TS packets into datagrams of ``per`` packets (the last may be shorter)."""
    size = per * TS_PACKET_SIZE
    return [bytes(packets[i : i + size]) for i in range(0, len(packets), size)]


class DatagramPacker:
    """Groups TS packets into full datagrams across muxer calls; ``flush`` sends the remainder."""

    __slots__ = ("_pending", "per")

    def __init__(self, per: int = DATAGRAM_PACKETS) -> None:
        self.per = per
        self._pending = bytearray()

    def push(self, packets: bytes | bytearray) -> list[bytes]:
        """The full datagrams that ``packets`` completes; fewer than ``per`` packets stay pending."""
        self._pending += packets
        size = self.per * TS_PACKET_SIZE
        full = len(self._pending) - len(self._pending) % size
        out = chunk_datagrams(self._pending[:full], self.per)
        del self._pending[:full]
        return out

    def flush(self) -> list[bytes]:
        """Whatever is pending, as one short datagram (or nothing)."""
        out = [bytes(self._pending)] if self._pending else []
        self._pending.clear()
        return out


@dataclass(slots=True)
class MuxStats:
    packets: int = 0
    null_packets: int = 0
    pes_packets: int = 0
    psi_repetitions: int = 0
    pcrs: int = 0
    late_units: int = 0  # CBR: units whose last packet leaves after their DTS (mux_rate too low)
    clock_jumps: int = 0


class TsMuxer:
    """Muxes one program's access units into 188-byte TS packets (see the module docstring).

    Feed units in DTS order across streams (within a few hundred ms); every ``mux_*`` call
    answers the packets it produced as one ``bytearray``: a multiple of 188 bytes, never
    empty (at least the unit's PES; tables, PCR-only and CBR null packets come before it).
    """

    def __init__(
        self, config: MuxConfig | None = None, *, version: int = 0, continuity: dict[int, int] | None = None
    ) -> None:
        """``version``: the PAT/PMT version_number; ``continuity``: the counters to go on from
        (``previous.continuity`` when a new program replaces a muxer's on one stream: a changed
        PAT/PMT takes a new version, §2.4.4.5/§2.4.4.9, and the PIDs that go on keep counting,
        §2.4.3.3)."""
        self.config = cfg = config if config is not None else MuxConfig()
        self.stats = MuxStats()
        self._pcr_pid = cfg.effective_pcr_pid
        streams: list[tuple[int, int]] = []
        if cfg.video_codec is not None:
            streams.append((STREAM_TYPE_H264 if cfg.video_codec == "h264" else STREAM_TYPE_HEVC, cfg.video_pid))
        if cfg.audio_codec is not None:
            streams.append((STREAM_TYPE_AAC_ADTS, cfg.audio_pid))
        self._pat = pat_section(cfg.transport_stream_id, cfg.program_number, cfg.pmt_pid, version & 0x1F)
        self._pmt = pmt_section(cfg.program_number, self._pcr_pid, streams, version & 0x1F)
        self._cc: dict[int, int] = dict(continuity or {})
        self._headers: dict[int, list[bytes]] = {}
        self._clock: int | None = None  # unwrapped DTS of the last unit (90 kHz)
        self._last_raw = 0
        self._last_psi: int | None = None
        self._last_pcr: int | None = None  # 27 MHz, unwrapped
        self._pcr_discontinuity = False
        # CBR: PCR of packet n is _cbr_anchor + (n - _cbr_anchor_index) x 188 x 8 x 27e6 / mux_rate
        self._sent = 0
        self._cbr_anchor: int | None = None
        self._cbr_anchor_index = 0

    # -- public API ---------------------------------------------------------------------------

    def mux(self, unit: AccessUnit) -> bytearray:
        """Mux an ``AccessUnit`` (its ``pid`` is ignored: the configured PIDs are used)."""
        if unit.kind == "video":
            return self.mux_video(unit.data, unit.pts, unit.dts, keyframe=unit.keyframe)
        return self.mux_audio(unit.data, unit.pts)

    def mux_video(self, data: bytes, pts: int, dts: int | None = None, *, keyframe: bool | None = None) -> bytearray:
        """Mux one Annex B picture; ``keyframe=None`` detects IDR/IRAP from the NAL types."""
        codec = self.config.video_codec
        if codec is None:
            raise ValueError("this program has no video stream")
        if keyframe is None:
            keyframe = bool(annexb_keyframe(codec, data))
        return self._mux_unit(self.config.video_pid, STREAM_ID_VIDEO, data, pts, dts, keyframe)

    def mux_audio(self, data: bytes, pts: int) -> bytearray:
        """Mux one or more ADTS frames as one PES (PTS of the first frame)."""
        if self.config.audio_codec is None:
            raise ValueError("this program has no audio stream")
        return self._mux_unit(self.config.audio_pid, STREAM_ID_AUDIO, data, pts, None, False)

    def tables(self) -> bytearray:
        """PAT and PMT packets now (e.g. for a receiver that just joined)."""
        out = bytearray()
        self._put_tables(out)
        return self._finish(out)

    @property
    def pat(self) -> bytes:
        """The PAT section this muxer sends."""
        return self._pat

    @property
    def pmt(self) -> bytes:
        """The PMT section this muxer sends."""
        return self._pmt

    @property
    def continuity(self) -> dict[int, int]:
        """The last continuity_counter per PID (a copy), for a muxer that takes over."""
        return dict(self._cc)

    # -- internals ----------------------------------------------------------------------------

    def _finish(self, out: bytearray) -> bytearray:
        n = len(out) // TS_PACKET_SIZE
        self._sent += n
        self.stats.packets += n
        return out

    def _advance_clock(self, dts: int) -> int:
        if self._clock is None:
            self._clock = dts & TS_MASK
        else:
            step = ts_delta(dts, self._last_raw)
            if abs(step) > self.config.max_clock_jump:
                self.stats.clock_jumps += 1
                self._pcr_discontinuity = True
                self._last_pcr = None
                self._cbr_anchor = None
            self._clock += step
        self._last_raw = dts & TS_MASK
        return self._clock

    def _mux_unit(self, pid: int, stream_id: int, data: bytes, pts: int, dts: int | None, keyframe: bool) -> bytearray:
        cfg = self.config
        if dts is not None and (dts - pts) & TS_MASK == 0:
            dts = None
        clock = self._advance_clock(pts if dts is None else dts)
        # Validate before any state moves (a too-large audio PES raises here).
        header = pes_header(stream_id, len(data), pts, dts, bounded=True)
        out = bytearray()
        target_pcr = (clock - cfg.pcr_offset) * PCR_PER_90K
        if cfg.mux_rate:
            self._pad_until(out, target_pcr)
        if self._last_psi is None or (keyframe and pid == cfg.video_pid) or clock - self._last_psi >= cfg.psi_interval:
            self._put_tables(out)
            self._last_psi = clock
        pcr: int | None = None
        pcr_due = self._last_pcr is None or target_pcr - self._last_pcr >= cfg.pcr_interval * PCR_PER_90K
        if pid == self._pcr_pid:
            if pcr_due or keyframe:
                pcr = self._pcr_value(out, target_pcr)
        elif pcr_due:
            self._put_pcr_only(out, self._pcr_value(out, target_pcr))
        self._packetize(out, pid, header + data, keyframe, pcr)
        self.stats.pes_packets += 1
        if cfg.mux_rate:
            done = self._cbr_pcr(self._sent + len(out) // TS_PACKET_SIZE)
            if done is not None and done > clock * PCR_PER_90K:
                self.stats.late_units += 1  # the rate is too low: the unit ends after its DTS
        return self._finish(out)

    def _cbr_pcr(self, index: int) -> int | None:
        if self._cbr_anchor is None:
            return None
        return self._cbr_anchor + (index - self._cbr_anchor_index) * TS_PACKET_SIZE * 8 * 27_000_000 // (
            self.config.mux_rate
        )

    def _pad_until(self, out: bytearray, target_pcr: int) -> None:
        """CBR: null packets (or PCR-only packets when a PCR is due) until the target time."""
        index = self._sent + len(out) // TS_PACKET_SIZE
        if self._cbr_anchor is None:
            self._cbr_anchor, self._cbr_anchor_index = target_pcr, index
            return
        now = self._cbr_pcr(index)
        assert now is not None
        if now > target_pcr:
            return  # still sending earlier units: this one goes out right after them
        interval = self.config.pcr_interval * PCR_PER_90K
        while True:
            now = self._cbr_pcr(self._sent + len(out) // TS_PACKET_SIZE)
            assert now is not None
            if now >= target_pcr:
                return
            if self._last_pcr is None or now - self._last_pcr >= interval:
                self._put_pcr_only(out, now)
            else:
                out += NULL_PACKET
                self.stats.null_packets += 1

    def _pcr_value(self, out: bytearray, target_pcr: int) -> int:
        """The PCR of the next packet: its CBR position, or DTS - offset kept monotonic (VBR)."""
        cbr = self._cbr_pcr(self._sent + len(out) // TS_PACKET_SIZE) if self.config.mux_rate else None
        value = cbr if cbr is not None else target_pcr
        if self._last_pcr is not None and value < self._last_pcr:
            value = self._last_pcr
        return value

    def _take_discontinuity(self) -> int:
        if self._pcr_discontinuity:
            self._pcr_discontinuity = False
            return 0x80
        return 0

    def _put_pcr_only(self, out: bytearray, pcr: int) -> None:
        """§2.4.3.3/§2.4.3.5: adaptation field only ('10'), 183 bytes, CC not incremented."""
        pid = self._pcr_pid
        cc = (self._cc.get(pid, 0) - 1) & 0x0F  # the last CC used on the PID
        flags = 0x10 | self._take_discontinuity()
        af = bytes((flags,)) + encode_pcr(pcr)
        out += bytes((0x47, (pid >> 8) & 0x1F, pid & 0xFF, 0x20 | cc, 183)) + af + b"\xff" * (183 - len(af))
        self._last_pcr = pcr
        self.stats.pcrs += 1

    def _put_tables(self, out: bytearray) -> None:
        for pid, section in ((0, self._pat), (self.config.pmt_pid, self._pmt)):
            packets, self._cc[pid] = section_packets(pid, section, self._cc.get(pid, 0))
            out += packets
        self.stats.psi_repetitions += 1

    def _packetize(self, out: bytearray, pid: int, pes: bytes, keyframe: bool, pcr: int | None) -> None:
        """Split one PES into TS packets (§2.4.3.2), the first with PUSI and the adaptation field."""
        headers = self._headers.get(pid)
        if headers is None:
            headers = [bytes((0x47, (pid >> 8) & 0x1F, pid & 0xFF, 0x10 | cc)) for cc in range(16)]
            self._headers[pid] = headers
        cc = self._cc.get(pid, 0)
        view = memoryview(pes)
        n = len(pes)
        pos = 0
        # First packet: PUSI, adaptation field when there is a PCR or a random access point.
        af = b""
        if pcr is not None or keyframe:
            flags = (0x40 if keyframe else 0) | (0x10 if pcr is not None else 0)
            if pcr is not None:
                flags |= self._take_discontinuity()
                af = bytes((flags,)) + encode_pcr(pcr)
                self._last_pcr = pcr
                self.stats.pcrs += 1
            else:
                af = bytes((flags,))
        first = True
        while pos < n:
            remaining = n - pos
            has_af = bool(af)
            space = TS_PAYLOAD_SIZE - (1 + len(af) if has_af else 0)
            if remaining < space:
                # Stuffing in the adaptation field of the last packet (§2.4.3.5 stuffing_byte).
                total = TS_PAYLOAD_SIZE - remaining  # adaptation_field_length byte included
                if has_af:
                    af = af + b"\xff" * (total - 1 - len(af))
                elif total > 1:
                    af = b"\x00" + b"\xff" * (total - 2)
                has_af = True
                space = remaining
            if first or has_af:
                b1 = (0x40 if first else 0) | ((pid >> 8) & 0x1F)
                b3 = (0x30 if has_af else 0x10) | cc
                out += bytes((0x47, b1, pid & 0xFF, b3))
                if has_af:
                    out.append(len(af))
                    out += af
            else:
                out += headers[cc]
            out += view[pos : pos + space]
            pos += space
            cc = (cc + 1) & 0x0F
            first = False
            af = b""
        self._cc[pid] = cc
