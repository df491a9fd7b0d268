"""RTP AAC depacketisers: RFC 3640 ``mpeg4-generic`` (AAC-hbr / AAC-lbr) and RFC 6416 ``MP4A-LATM``. Sans-IO.

Both answer one :class:`Frame` per AAC access unit, framed as ADTS (ISO/IEC 14496-3 §1.A.2,
7-byte header, built from the AudioSpecificConfig of the SDP) for an MPEG-TS stream_type 0x0F.
An AAC frame is 1024 samples of the core sampling rate (960-sample frames are refused): the
n-th frame of a packet is timed ``timestamp + n x 1024 x clock_rate / sample_rate``.

**RFC 3640.** The payload is an AU Header Section (16-bit AU-headers-length in bits, then one
AU-header per access unit: AU-size, AU-Index / AU-Index-delta, and the optional CTS/DTS/RAP/
stream-state fields the fmtp announces, §3.2.1.1), an optional Auxiliary Section (skipped,
§3.2.2) and the access units back to back (§3.2.3). ``mode=AAC-hbr`` (sizeLength 13,
indexLength 3, indexDeltaLength 3, §3.3.6) and ``mode=AAC-lbr`` (6/2/2, §3.3.5) are accepted,
with the lengths read from the fmtp when present. One access unit may be fragmented over
several packets (§3.2.3: same timestamp, AU-size is the size of the whole unit, marker on the
last fragment); a fragmented unit that loses a packet is dropped and counted. Interleaving
(non-zero AU-Index-delta) is not reordered: units are output in packet order.

**RFC 6416.** ``cpresent=0`` with the StreamMuxConfig in the ``config`` fmtp parameter (§7.3;
audioMuxVersion 0, one program, one layer, frameLengthType 0); in-band configuration
(``cpresent=1``, the RFC's default) is refused with a ValueError. The payload is a sequence
of AudioMuxElements (PayloadLengthInfo: a run of 0xFF bytes ending with a smaller one, then
PayloadMux, for each of numSubFrames + 1 subframes, ISO/IEC 14496-3 §1.7.3), fragmented over
packets that share a timestamp, the marker bit on the last (RFC 6416 §6.1).

Configuration problems (missing or invalid ``config``, a mode or layout not handled, a
configuration ADTS cannot carry) raise ValueError from the constructor.
"""

from __future__ import annotations

from typing import Final

from ..media.audio import read_audio_object_type, read_sampling_frequency
from ..media.bits import BitReader, BitsExhausted
from ..mux.codec import AacConfig, build_adts_frame, build_adts_header, parse_asc
from .common import MAX_UNIT_BYTES, DepayStats, Frame, normalise_fmtp, seq_next

AAC_FRAME_SAMPLES: Final = 1024
MAX_LATM_BYTES: Final = 1 << 20  # an AudioMuxElement buffered over packets: far above any AAC frame
_GA_OBJECT_TYPES: Final = frozenset({1, 2, 3, 4, 6, 7, 17, 19, 20, 21, 22, 23})  # GASpecificConfig users


def _int_param(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"fmtp {name}={raw!r} is not an integer") from None
    if not 0 <= value <= 32:
        raise ValueError(f"fmtp {name}={value} is out of range")
    return value


def _hex_param(params: dict[str, str], name: str) -> bytes:
    raw = params.get(name, "")
    try:
        data = bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"fmtp {name}={raw!r} is not hexadecimal") from None
    if not data:
        raise ValueError(f"the AAC stream has no fmtp {name} (its AudioSpecificConfig): it cannot be decoded")
    return data


def _check_adts(config: AacConfig) -> None:
    """ValueError when ADTS cannot carry ``config`` (object type > 4, odd rate, channels 0)."""
    build_adts_header(config, 0)
    if config.channel_config == 0:
        raise ValueError("AAC with channelConfiguration 0 (a program_config_element) is not supported")


class _AacBase:
    media = "audio"
    codec = "aac"

    def __init__(self, config: AacConfig, clock_rate: int) -> None:
        if clock_rate <= 0:
            raise ValueError(f"RTP clock rate {clock_rate} is not usable")
        _check_adts(config)
        self.config = config
        self.clock_rate = clock_rate
        self.stats = DepayStats()
        self._last_seq: int | None = None

    def _frame_ts(self, timestamp: int, index: int) -> int:
        """RTP timestamp of the ``index``-th frame of a packet stamped ``timestamp``."""
        return (timestamp + index * AAC_FRAME_SAMPLES * self.clock_rate // self.config.sample_rate) & 0xFFFFFFFF

    def _gap(self, seq: int) -> bool:
        gap = self._last_seq is not None and seq != seq_next(self._last_seq)
        self._last_seq = seq & 0xFFFF
        return gap

    def _frame(self, raw: bytes, timestamp: int) -> Frame | None:
        try:
            data = build_adts_frame(self.config, raw)
        except ValueError:  # larger than ADTS's 13-bit frame length
            self.stats.bad_packets += 1
            return None
        self.stats.units += 1
        return Frame(data, timestamp, True)


class AacHbrDepacketizer(_AacBase):
    """RFC 3640 mpeg4-generic AAC-hbr / AAC-lbr payloads -> ADTS frames."""

    def __init__(self, fmtp: dict[str, str], clock_rate: int, channels: int | None = None) -> None:
        params = normalise_fmtp(fmtp)
        mode = params.get("mode", "").lower()
        if mode not in ("aac-hbr", "aac-lbr"):
            raise ValueError(f"mpeg4-generic mode {params.get('mode')!r} is not supported (AAC-hbr or AAC-lbr)")
        size, index, delta = (13, 3, 3) if mode == "aac-hbr" else (6, 2, 2)  # RFC 3640 §3.3.6 / §3.3.5
        self.size_length = _int_param(params, "sizelength", size)
        self.index_length = _int_param(params, "indexlength", index)
        self.index_delta_length = _int_param(params, "indexdeltalength", delta)
        self.cts_delta_length = _int_param(params, "ctsdeltalength", 0)
        self.dts_delta_length = _int_param(params, "dtsdeltalength", 0)
        self.random_access = _int_param(params, "randomaccessindication", 0) > 0
        self.stream_state_length = _int_param(params, "streamstateindication", 0)
        self.aux_size_length = _int_param(params, "auxiliarydatasizelength", 0)
        if self.size_length == 0:
            raise ValueError("mpeg4-generic without AU-size (sizeLength 0, constantSize) is not supported")
        if params.get("constantduration") not in (None, "", "1024") or params.get("framelengthflag") == "1":
            raise ValueError("AAC frames of other than 1024 samples are not supported")
        config = parse_asc(_hex_param(params, "config"))
        if config is None:
            raise ValueError(f"fmtp config={params.get('config')!r} is not a valid AudioSpecificConfig")
        super().__init__(config, clock_rate)
        self._frag: bytearray | None = None  # a fragmented access unit in progress
        self._lost_ts: int | None = None  # timestamp of a fragmented unit being dropped
        self._frag_size = 0
        self._frag_ts = 0

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes | memoryview) -> list[Frame]:
        """One RTP payload: the ADTS frames it completes."""
        gap = self._gap(seq)
        timestamp &= 0xFFFFFFFF
        data = bytes(payload)
        if self._frag is not None and (gap or timestamp != self._frag_ts):
            self._drop_fragment()
        if timestamp == self._lost_ts:
            return []  # the rest of a fragmented unit already dropped
        self._lost_ts = None
        sizes = self._au_sizes(data)
        if sizes is None:
            self.stats.bad_packets += 1
            if self._frag is not None:
                self._drop_fragment()
            return []
        body_start, au_sizes = sizes
        body = data[body_start:]
        out: list[Frame] = []
        if self._frag is not None:  # a continuation: one AU-header naming the whole unit (§3.2.3)
            if len(au_sizes) != 1 or au_sizes[0] != self._frag_size:
                self.stats.bad_packets += 1
                self._drop_fragment()
                return []
            self._frag += body
            if len(self._frag) >= self._frag_size or marker:
                self._end_fragment(out)
            return out
        if len(au_sizes) == 1 and au_sizes[0] > len(body):  # the first fragment of a large unit
            if marker or au_sizes[0] > MAX_UNIT_BYTES:
                self.stats.lost_units += 1
                return []
            self._frag = bytearray(body)
            self._frag_size = au_sizes[0]
            self._frag_ts = timestamp
            return out
        pos = 0
        for i, size in enumerate(au_sizes):
            if pos + size > len(body):
                self.stats.bad_packets += 1
                break
            frame = self._frame(body[pos : pos + size], self._frame_ts(timestamp, i))
            if frame is not None:
                out.append(frame)
            pos += size
        return out

    def flush(self) -> list[Frame]:
        """End of stream: a fragmented unit still incomplete is dropped."""
        if self._frag is not None:
            self._drop_fragment()
        return []

    def _drop_fragment(self) -> None:
        self._frag = None
        self._lost_ts = self._frag_ts
        self.stats.lost_units += 1

    def _end_fragment(self, out: list[Frame]) -> None:
        frag = self._frag
        self._frag = None
        if frag is None or len(frag) != self._frag_size:
            self.stats.lost_units += 1
            return
        frame = self._frame(bytes(frag), self._frag_ts)
        if frame is not None:
            out.append(frame)

    def _au_sizes(self, data: bytes) -> tuple[int, list[int]] | None:
        """(offset of the first access unit, AU sizes) of an RFC 3640 §3.2 payload, None if malformed."""
        if len(data) < 2:
            return None
        header_bits = (data[0] << 8) | data[1]  # AU-headers-length, §3.2.1
        header_bytes = (header_bits + 7) // 8
        pos = 2 + header_bytes
        if header_bits == 0 or pos > len(data):
            return None
        r = BitReader(data[2:pos])
        sizes: list[int] = []
        try:
            while (header_bytes * 8 - r.bits_left) < header_bits:
                sizes.append(r.u(self.size_length))
                r.skip(self.index_length if len(sizes) == 1 else self.index_delta_length)
                if self.cts_delta_length and r.flag():  # CTS-flag + CTS-delta
                    r.skip(self.cts_delta_length)
                if self.dts_delta_length and r.flag():
                    r.skip(self.dts_delta_length)
                if self.random_access:
                    r.skip(1)
                r.skip(self.stream_state_length)
        except BitsExhausted:
            return None
        if (header_bytes * 8 - r.bits_left) != header_bits:
            return None
        if self.aux_size_length:  # §3.2.2 Auxiliary Section: skipped
            if pos + (self.aux_size_length + 7) // 8 > len(data):
                return None
            aux = BitReader(data[pos:])
            try:
                aux_bits = aux.u(self.aux_size_length)
            except BitsExhausted:
                return None
            pos += (self.aux_size_length + aux_bits + 7) // 8
            if pos > len(data):
                return None
        return pos, sizes


def _read_asc(r: BitReader) -> AacConfig:
    """An AudioSpecificConfig read in place (ISO/IEC 14496-3 §1.6.2.1, GASpecificConfig §4.4.1),
    leaving ``r`` after it; ValueError when it is not a usable AAC configuration."""
    aot = read_audio_object_type(r)
    rate = read_sampling_frequency(r)
    channels = r.u(4)
    sbr = ps = False
    ext_rate = None
    if aot in (5, 29):  # explicit SBR / PS signalling
        sbr, ps = True, aot == 29
        ext_rate = read_sampling_frequency(r)
        aot = read_audio_object_type(r)
    if rate is None or aot not in _GA_OBJECT_TYPES:
        raise ValueError(f"LATM config: audio object type {aot} is not AAC")
    if r.u(1):  # frameLengthFlag: 960-sample frames
        raise ValueError("AAC with 960-sample frames is not supported")
    if r.u(1):  # dependsOnCoreCoder
        r.skip(14)  # coreCoderDelay
    extension = r.u(1)
    if channels == 0:
        raise ValueError("AAC with channelConfiguration 0 (a program_config_element) is not supported")
    if aot in (6, 20):
        r.skip(3)  # layerNr
    if extension:
        if aot == 22:
            r.skip(16)  # numOfSubFrame, layer_length
        if aot in (17, 19, 20, 23):
            r.skip(3)  # the three resilience flags
        r.skip(1)  # extensionFlag3
    return AacConfig(aot, rate, channels, sbr, ps, ext_rate)


def parse_stream_mux_config(data: bytes) -> tuple[AacConfig, int, int]:
    """(AAC config, numSubFrames + 1, otherDataLenBits) of a StreamMuxConfig (ISO/IEC 14496-3
    §1.7.3.1) with audioMuxVersion 0, one program, one layer, frameLengthType 0; ValueError otherwise."""
    r = BitReader(data)
    try:
        if r.u(1):
            raise ValueError("LATM audioMuxVersion 1 is not supported (only 0)")
        r.skip(1)  # allStreamsSameTimeFraming
        subframes = r.u(6) + 1
        if r.u(4) != 0 or r.u(3) != 0:  # numProgram, numLayer (minus one)
            raise ValueError("LATM with several programs or layers is not supported")
        config = _read_asc(r)
    except BitsExhausted:
        raise ValueError("LATM config (StreamMuxConfig) is truncated") from None
    try:
        frame_length_type = r.u(3)
        if frame_length_type != 0:
            raise ValueError(f"LATM frameLengthType {frame_length_type} is not supported (only 0)")
        r.skip(8)  # latmBufferFullness
        other_bits = 0
        if r.u(1):  # otherDataPresent (audioMuxVersion 0: 8-bit chunks with an escape bit)
            while True:
                esc = r.u(1)
                other_bits = (other_bits << 8) | r.u(8)
                if not esc:
                    break
        return config, subframes, other_bits
    except BitsExhausted:
        # GStreamer's rtpmp4apay (and cameras built on it) ends the config right after the
        # AudioSpecificConfig: FFmpeg's rtpdec_latm reads no further either. What follows can
        # only be frameLengthType 0 (payload lengths in the stream) with no other data.
        return config, subframes, 0


class LatmDepacketizer(_AacBase):
    """RFC 6416 MP4A-LATM payloads (cpresent=0) -> ADTS frames."""

    def __init__(self, fmtp: dict[str, str], clock_rate: int, channels: int | None = None) -> None:
        params = normalise_fmtp(fmtp)
        if params.get("cpresent", "1") != "0":  # RFC 6416 §7.3: cpresent defaults to 1
            raise ValueError(
                "MP4A-LATM with in-band configuration (cpresent=1) is not supported: "
                "the camera must announce cpresent=0 and the StreamMuxConfig in fmtp config"
            )
        config, self.subframes, other_bits = parse_stream_mux_config(_hex_param(params, "config"))
        if other_bits % 8:
            raise ValueError("LATM otherData that is not a whole number of bytes is not supported")
        self.other_bytes = other_bits // 8
        super().__init__(config, clock_rate)
        self._buf = bytearray()
        self._ts: int | None = None
        self._lost_ts: int | None = None
        self._broken = False

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes | memoryview) -> list[Frame]:
        """One RTP payload: the ADTS frames of the AudioMuxElements it completes."""
        gap = self._gap(seq)
        timestamp &= 0xFFFFFFFF
        out: list[Frame] = []
        if self._ts is not None and (gap or timestamp != self._ts):
            self._lost_ts = self._ts
            self._drop()  # a fragmented element lost its tail (or a middle packet)
        if timestamp == self._lost_ts:  # the rest of a dropped element
            if marker:
                self._lost_ts = None
            return out
        self._lost_ts = None
        self._ts = timestamp
        self._buf += payload
        if len(self._buf) > MAX_LATM_BYTES:
            self._drop()
            return out
        if marker:
            self._parse(out)
        return out

    def flush(self) -> list[Frame]:
        """End of stream: an element without its last packet is dropped."""
        if self._ts is not None:
            self._drop()
        return []

    def _drop(self) -> None:
        if self._buf:
            self.stats.lost_units += 1
        self._buf.clear()
        self._ts = None

    def _parse(self, out: list[Frame]) -> None:
        buf, ts = bytes(self._buf), self._ts
        self._buf.clear()
        self._ts = None
        if ts is None:
            return
        n = len(buf)
        pos = 0
        index = 0
        while pos < n:
            for _ in range(self.subframes):  # PayloadLengthInfo, §1.7.3.2
                length = 0
                while pos < n and buf[pos] == 0xFF:
                    length += 255
                    pos += 1
                if pos >= n:
                    self.stats.bad_packets += 1
                    return
                length += buf[pos]
                pos += 1
                if pos + length > n:
                    self.stats.bad_packets += 1
                    return
                # allStreamsSameTimeFraming: PayloadLengthInfo/PayloadMux alternate per subframe
                raw = buf[pos : pos + length]
                pos += length
                if length:
                    frame = self._frame(raw, self._frame_ts(ts, index))
                    if frame is not None:
                        out.append(frame)
                index += 1
            pos += self.other_bytes


__all__ = ["AacHbrDepacketizer", "LatmDepacketizer", "parse_stream_mux_config"]
