"""Audio frame headers: AAC (ADTS, LATM/LOAS), MPEG-1/2 audio, AC-3 and E-AC-3. Sans-IO.

Each ``find_*`` scans a buffer that starts at (or near) a PES payload for the first frame
header that parses, and answers ``AudioParams`` in ffprobe's terms, or None. Never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from .bits import BitReader, BitsExhausted


@dataclass(frozen=True, slots=True)
class AudioParams:
    codec: str
    sample_rate_hz: int
    channels: int
    profile: str | None = None


# ISO/IEC 14496-3 §1.6.3.4 samplingFrequencyIndex, §1.6.3.5 channelConfiguration.
AAC_SAMPLE_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
AAC_CHANNELS = (0, 1, 2, 3, 4, 5, 6, 8)
_AAC_PROFILES = {1: "Main", 2: "LC", 3: "SSR", 4: "LTP", 5: "HE-AAC", 29: "HE-AACv2"}


def find_adts(data: bytes) -> AudioParams | None:
    """ISO/IEC 13818-7 / 14496-3 §1.A.2.2 adts_fixed_header."""
    n = len(data)
    pos = 0
    while pos + 7 <= n:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 7 > n:
            return None
        b1 = data[pos + 1]
        if b1 & 0xF6 == 0xF0:  # syncword 0xFFF, layer 00
            sf = (data[pos + 2] >> 2) & 0x0F
            cc = ((data[pos + 2] & 0x01) << 2) | (data[pos + 3] >> 6)
            aot = (data[pos + 2] >> 6) + 1
            if sf < len(AAC_SAMPLE_RATES) and cc:
                return AudioParams("aac", AAC_SAMPLE_RATES[sf], AAC_CHANNELS[cc], _AAC_PROFILES.get(aot))
        pos += 1
    return None


def read_audio_object_type(r: BitReader) -> int:
    """GetAudioObjectType() of ISO/IEC 14496-3 §1.6.2.1 (5 bits, 31 escapes to 32 + 6 bits)."""
    aot = r.u(5)
    return 32 + r.u(6) if aot == 31 else aot


def read_sampling_frequency(r: BitReader) -> int | None:
    """samplingFrequencyIndex (§1.6.2.1, Table 1.18), 15 escaping to an explicit 24-bit rate;
    None for a reserved index."""
    idx = r.u(4)
    if idx == 15:
        return r.u(24)
    return AAC_SAMPLE_RATES[idx] if idx < len(AAC_SAMPLE_RATES) else None


def _audio_specific_config(r: BitReader) -> AudioParams | None:
    """ISO/IEC 14496-3 §1.6.2.1 AudioSpecificConfig (enough for rate and channels)."""
    aot = read_audio_object_type(r)
    rate = read_sampling_frequency(r)
    channel_config = r.u(4)
    if aot in (5, 29):  # explicit SBR/PS signalling: the output rate is the extension's
        ext_rate = read_sampling_frequency(r)
        rate = ext_rate or rate
        if aot == 29 and channel_config == 1:
            channel_config = 2  # §8.A.1: parametric stereo decodes mono to stereo
        aot = read_audio_object_type(r)
    if rate is None or not 0 < channel_config < len(AAC_CHANNELS):
        return None
    return AudioParams("aac_latm", rate, AAC_CHANNELS[channel_config], _AAC_PROFILES.get(aot))


def _latm_value(r: BitReader) -> int:
    count = r.u(2)
    return r.u(8 * (count + 1))


def find_latm(data: bytes) -> AudioParams | None:
    """ISO/IEC 14496-3 §1.7.2 AudioSyncStream (LOAS) carrying an AudioMuxElement(1).

    Only frames that carry a StreamMuxConfig (useSameStreamMux = 0) tell the format; the others
    answer None and the analyser waits for the next configuration frame.
    """
    n = len(data)
    pos = 0
    while pos + 3 <= n:
        pos = data.find(b"\x56", pos)
        if pos < 0 or pos + 3 > n:
            return None
        if data[pos + 1] & 0xE0 == 0xE0:  # syncword 0x2B7 (11 bits)
            try:
                params = _stream_mux_config(BitReader(data[pos + 3 :]))
            except BitsExhausted:
                params = None
            if params is not None:
                return params
        pos += 1
    return None


def _stream_mux_config(r: BitReader) -> AudioParams | None:
    if r.flag():  # useSameStreamMux
        return None
    version = r.u(1)
    if version:
        if r.u(1):  # audioMuxVersionA
            return None
        _latm_value(r)  # taraBufferFullness
    r.skip(1)  # allStreamsSameTimeFraming
    r.skip(6)  # numSubFrames
    if r.u(4) != 0 or r.u(3) != 0:  # numProgram, numLayer: one program, one layer
        return None
    if version:
        length = _latm_value(r)  # ascLen
        if length > r.bits_left:
            return None
    return _audio_specific_config(r)


# ISO/IEC 11172-3 §2.4.2.3 and 13818-3: sampling_frequency by version (MPEG-1, -2, -2.5).
_MPA_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MPA_CODECS = {3: "mp1", 2: "mp2", 1: "mp3"}


def find_mpeg_audio(data: bytes) -> AudioParams | None:
    n = len(data)
    pos = 0
    while pos + 4 <= n:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 4 > n:
            return None
        b1, b2, b3 = data[pos + 1], data[pos + 2], data[pos + 3]
        version = (b1 >> 3) & 0x03
        layer = (b1 >> 1) & 0x03
        bitrate_idx = b2 >> 4
        rate_idx = (b2 >> 2) & 0x03
        if b1 & 0xE0 == 0xE0 and version != 1 and layer and bitrate_idx not in (0, 15) and rate_idx != 3:
            channels = 1 if b3 >> 6 == 3 else 2
            return AudioParams(_MPA_CODECS[layer], _MPA_RATES[version][rate_idx], channels)
        pos += 1
    return None


# ATSC A/52 Table 5.8 acmod -> full-bandwidth channels; §5.4.1.3 fscod.
_AC3_CHANNELS = (2, 1, 2, 3, 3, 4, 4, 5)
_AC3_RATES = (48000, 44100, 32000)
_EAC3_REDUCED_RATES = (24000, 22050, 16000)


def find_ac3(data: bytes) -> AudioParams | None:
    """AC-3 (A/52 §5.3 syncinfo + bsi) or E-AC-3 (A/52 Annex E §E.1.2) frame header."""
    n = len(data)
    pos = 0
    while pos + 8 <= n:
        pos = data.find(b"\x0b\x77", pos)
        if pos < 0 or pos + 8 > n:
            return None
        params = _ac3_at(data, pos)
        if params is not None:
            return params
        pos += 1
    return None


def _ac3_at(data: bytes, pos: int) -> AudioParams | None:
    bsid = data[pos + 5] >> 3
    try:
        if bsid <= 10:
            r = BitReader(data, pos + 4)
            fscod = r.u(2)
            r.skip(6)  # frmsizecod
            r.skip(5 + 3)  # bsid, bsmod
            acmod = r.u(3)
            if acmod & 1 and acmod != 1:
                r.skip(2)  # cmixlev
            if acmod & 4:
                r.skip(2)  # surmixlev
            if acmod == 2:
                r.skip(2)  # dsurmod
            lfe = r.u(1)
            if fscod == 3:
                return None
            return AudioParams("ac3", _AC3_RATES[fscod], _AC3_CHANNELS[acmod] + lfe)
        if 11 <= bsid <= 16:
            r = BitReader(data, pos + 2)
            r.skip(2 + 3 + 11)  # strmtyp, substreamid, frmsiz
            fscod = r.u(2)
            if fscod == 3:
                rate = _EAC3_REDUCED_RATES[min(r.u(2), 2)]
            else:
                r.skip(2)  # numblkscod
                rate = _AC3_RATES[fscod]
            acmod = r.u(3)
            lfe = r.u(1)
            return AudioParams("eac3", rate, _AC3_CHANNELS[acmod] + lfe)
    except BitsExhausted:
        return None
    return None
