"""Codec glue between container framings: AVCC/HVCC records, Annex B, AAC ASC and ADTS. Sans-IO.

* AVCDecoderConfigurationRecord (ISO/IEC 14496-15 §5.3.3) and HEVCDecoderConfigurationRecord
  (ISO/IEC 14496-15 §8.3.3): parse and build.
* Length-prefixed NAL units (14496-15 §5.3.2 / §8.3.2 sample format) <-> Annex B byte stream
  (ITU-T H.264 / H.265 Annex B). NAL payloads already carry their emulation prevention bytes,
  so the conversion only swaps the framing.
* ``ParameterSetInserter``: repeats the last parameter sets (and an access unit delimiter) in
  front of every IDR/IRAP access unit that lacks them, which ISO/IEC 13818-1 §2.14 (AVC) and
  §2.17 (HEVC) transport expects and RTMP/MP4 sources do not do.
* AAC AudioSpecificConfig (ISO/IEC 14496-3 §1.6.2.1) <-> ADTS header (14496-3 §1.A.2.2).

Parsers answer None on malformed input; builders raise ValueError on arguments they cannot encode.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from ..media.audio import AAC_SAMPLE_RATES, read_audio_object_type, read_sampling_frequency
from ..media.bits import BitReader, BitsExhausted, iter_nal_units, unescape_rbsp

VideoCodec = Literal["h264", "hevc"]

START_CODE: Final = b"\x00\x00\x00\x01"

# ITU-T H.264 Table 7-1 nal_unit_type.
H264_NAL_SLICE: Final = 1
H264_NAL_IDR: Final = 5
H264_NAL_SEI: Final = 6
H264_NAL_SPS: Final = 7
H264_NAL_PPS: Final = 8
H264_NAL_AUD: Final = 9
# ITU-T H.265 Table 7-1 nal_unit_type.
HEVC_NAL_BLA_W_LP: Final = 16
HEVC_NAL_RSV_IRAP_23: Final = 23
HEVC_NAL_VPS: Final = 32
HEVC_NAL_SPS: Final = 33
HEVC_NAL_PPS: Final = 34
HEVC_NAL_AUD: Final = 35

# H.264 §7.3.2.4 access_unit_delimiter_rbsp: primary_pic_type 7 (any slice type) + stop bit.
H264_AUD: Final = b"\x09\xf0"
# H.265 §7.3.2.5: NAL header (type 35, layer 0, TemporalId 0 + 1), pic_type 2 (I, P, B) + stop bit.
HEVC_AUD: Final = b"\x46\x01\x50"

_H264_HIGH_PROFILES: Final = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
# 14496-15 §5.3.3.1.2: the chroma/bit-depth extension follows for these profile_idc values.
_AVCC_EXT_PROFILES: Final = frozenset({100, 110, 122, 144})


def h264_nal_type(nal: bytes | bytearray | memoryview) -> int:
    """nal_unit_type of an H.264 NAL unit (H.264 §7.3.1), header byte first."""
    return nal[0] & 0x1F


def hevc_nal_type(nal: bytes | bytearray | memoryview) -> int:
    """nal_unit_type of an HEVC NAL unit (H.265 §7.3.1.2), two-byte header first."""
    return (nal[0] >> 1) & 0x3F


def nal_type(codec: VideoCodec, nal: bytes | bytearray | memoryview) -> int:
    """nal_unit_type of ``nal`` for ``codec``."""
    return h264_nal_type(nal) if codec == "h264" else hevc_nal_type(nal)


def is_vcl(codec: VideoCodec, nal_unit_type: int) -> bool:
    """True for coded slice NAL units (H.264 types 1-5, H.265 types 0-31)."""
    if codec == "h264":
        return 1 <= nal_unit_type <= 5
    return nal_unit_type <= 31


def is_random_access(codec: VideoCodec, nal_unit_type: int) -> bool:
    """True for an IDR slice (H.264 type 5) or an IRAP picture (H.265 types 16-23, §3.73)."""
    if codec == "h264":
        return nal_unit_type == H264_NAL_IDR
    return HEVC_NAL_BLA_W_LP <= nal_unit_type <= HEVC_NAL_RSV_IRAP_23


def annexb_keyframe(codec: VideoCodec, data: bytes | bytearray | memoryview) -> bool | None:
    """Whether the Annex B access unit starts with an IDR/IRAP slice; None when it has no slice.

    Looks only at NAL headers up to the first slice (emulation prevention guarantees that
    00 00 01 occurs only as a start code), so it is cheap even on a large picture.
    """
    buf = bytes(data) if isinstance(data, memoryview) else data
    pos = buf.find(b"\x00\x00\x01")
    n = len(buf)
    while 0 <= pos and pos + 3 < n:
        t = nal_type(codec, buf[pos + 3 : pos + 4])
        if is_vcl(codec, t):
            return is_random_access(codec, t)
        pos = buf.find(b"\x00\x00\x01", pos + 3)
    return None


def split_annexb(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B buffer, start codes removed."""
    return list(iter_nal_units(data))


def join_annexb(nals: Iterable[bytes]) -> bytes:
    """An Annex B buffer of ``nals``, each behind a four-byte start code (H.264 B.1.1 zero_byte)."""
    return b"".join(START_CODE + nal for nal in nals)


def length_prefixed_to_annexb(data: bytes | memoryview, nal_length_size: int = 4) -> bytes | None:
    """ISO/IEC 14496-15 §5.3.2 sample (NALUnitLength + NAL unit)* -> Annex B; None when truncated."""
    if nal_length_size not in (1, 2, 4):
        return None
    view = memoryview(data)
    out = bytearray()
    pos = 0
    n = len(view)
    while pos < n:
        if pos + nal_length_size > n:
            return None
        length = int.from_bytes(view[pos : pos + nal_length_size], "big")
        pos += nal_length_size
        if length == 0 or pos + length > n:
            return None
        out += START_CODE
        out += view[pos : pos + length]
        pos += length
    return bytes(out)


def annexb_to_length_prefixed(data: bytes, nal_length_size: int = 4) -> bytes:
    """Annex B -> ISO/IEC 14496-15 §5.3.2 length-prefixed NAL units.

    Raises ValueError when a NAL unit does not fit the length field.
    """
    if nal_length_size not in (1, 2, 4):
        raise ValueError(f"nal_length_size must be 1, 2 or 4, not {nal_length_size}")
    limit = 1 << (8 * nal_length_size)
    out = bytearray()
    for nal in iter_nal_units(data):
        if len(nal) >= limit:
            raise ValueError(f"a {len(nal)}-byte NAL unit does not fit a {nal_length_size}-byte length")
        out += len(nal).to_bytes(nal_length_size, "big")
        out += nal
    return bytes(out)


@dataclass(frozen=True, slots=True)
class ParameterSets:
    """Parameter set NAL units (headers included) found in, or to put in, a stream."""

    vps: tuple[bytes, ...] = ()
    sps: tuple[bytes, ...] = ()
    pps: tuple[bytes, ...] = ()

    @property
    def complete(self) -> bool:
        """True when a decoder can start from these (HEVC needs a VPS too)."""
        return bool(self.sps and self.pps)

    def nals(self) -> list[bytes]:
        """The sets in decoding order: VPS, SPS, PPS."""
        return [*self.vps, *self.sps, *self.pps]


def extract_parameter_sets(codec: VideoCodec, annexb: bytes) -> ParameterSets:
    """The VPS/SPS/PPS NAL units of an Annex B buffer, in order, duplicates removed."""
    vps: list[bytes] = []
    sps: list[bytes] = []
    pps: list[bytes] = []
    for nal in iter_nal_units(annexb):
        t = nal_type(codec, nal)
        if codec == "h264":
            target = {H264_NAL_SPS: sps, H264_NAL_PPS: pps}.get(t)
        else:
            target = {HEVC_NAL_VPS: vps, HEVC_NAL_SPS: sps, HEVC_NAL_PPS: pps}.get(t)
        if target is not None and nal not in target:
            target.append(nal)
    return ParameterSets(tuple(vps), tuple(sps), tuple(pps))


# NAL unit types that may only come before the first VCL NAL unit of an access unit: H.264
# §7.4.1.2.3 (SEI, SPS, PPS, AUD, prefix NAL, subset SPS, depth PS); HEVC §7.4.2.4.4 (VPS, SPS,
# PPS, AUD, prefix SEI). A decoder that meets one after a slice starts a new access unit there.
_PREFIX_TYPES: Final[dict[VideoCodec, frozenset[int]]] = {
    "h264": frozenset({6, 7, 8, 9, 13, 14, 15, 16}),
    "hevc": frozenset({32, 33, 34, 35, 39}),
}


def hoist_prefix_nals(codec: VideoCodec, nals: list[bytes], types: list[int]) -> tuple[list[bytes], list[int]]:
    """``nals`` with the prefix-only NAL units that follow a slice moved in front of the first
    slice (an exact repeat of one already there is dropped, a second AUD too).

    Encoders that repeat the parameter sets before every slice (GStreamer's ``rtph264pay
    config-interval=-1`` on a two-slice IDR) make units a decoder would split into two
    pictures with one timestamp; this puts them back in the order §7.4.1.2.3 asks for.
    """
    first_vcl = next((i for i, t in enumerate(types) if is_vcl(codec, t)), None)
    prefix = _PREFIX_TYPES[codec]
    if first_vcl is None or not any(t in prefix for t in types[first_vcl + 1 :]):
        return nals, types
    aud = H264_NAL_AUD if codec == "h264" else HEVC_NAL_AUD
    head, head_types = nals[:first_vcl], types[:first_vcl]
    tail: list[bytes] = []
    tail_types: list[int] = []
    for nal, kind in zip(nals[first_vcl:], types[first_vcl:], strict=True):
        if kind in prefix and not is_vcl(codec, kind):
            if nal in head or (kind == aud and aud in head_types):
                continue
            head.append(nal)
            head_types.append(kind)
        else:
            tail.append(nal)
            tail_types.append(kind)
    return head + tail, head_types + tail_types


class ParameterSetInserter:
    """Puts parameter sets in front of IDR/IRAP access units that lack them (Annex B in, out).

    It remembers the last complete sets it saw in the stream (or was given, e.g. from an AVCC
    record received over RTMP) and, when a random access unit arrives without an SPS, inserts
    them after the access unit delimiter. With ``add_aud`` it also starts every access unit
    with an AUD when it has none (ISO/IEC 13818-1 §2.14.1 for AVC, §2.17.2 for HEVC ask for
    one in transport streams). Non-random-access units pass through untouched apart from the AUD.
    """

    __slots__ = ("_codec", "_sets", "add_aud", "inserted")

    def __init__(self, codec: VideoCodec, sets: ParameterSets | None = None, *, add_aud: bool = True) -> None:
        self._codec: VideoCodec = codec
        self._sets = sets if sets is not None and sets.complete else None
        self.add_aud = add_aud
        self.inserted = 0  # access units the sets were inserted into

    @property
    def parameter_sets(self) -> ParameterSets | None:
        """The sets currently remembered."""
        return self._sets

    def update(self, sets: ParameterSets) -> None:
        """Replace the remembered sets (e.g. from a new sequence header)."""
        if sets.complete:
            self._sets = sets

    def process(self, annexb: bytes) -> bytes:
        """The access unit, with an AUD and parameter sets added where needed."""
        codec = self._codec
        nals = split_annexb(annexb)
        if not nals:
            return annexb
        types = [nal_type(codec, nal) for nal in nals]
        original = nals
        nals, types = hoist_prefix_nals(codec, nals, types)
        reordered = nals is not original
        aud_type, sps_type = (H264_NAL_AUD, H264_NAL_SPS) if codec == "h264" else (HEVC_NAL_AUD, HEVC_NAL_SPS)
        found = extract_parameter_sets(codec, annexb) if sps_type in types else None
        if found is not None and found.complete:
            self._sets = found
        keyframe = any(is_vcl(codec, t) and is_random_access(codec, t) for t in types)
        need_sets = keyframe and sps_type not in types and self._sets is not None
        has_aud = types[0] == aud_type
        if not need_sets and (has_aud or not self.add_aud) and not reordered:
            return annexb
        head: list[bytes] = []
        if has_aud:
            head.append(nals.pop(0))
        elif self.add_aud:
            head.append(H264_AUD if codec == "h264" else HEVC_AUD)
        if need_sets and self._sets is not None:
            head += self._sets.nals()
            self.inserted += 1
        return join_annexb([*head, *nals])


# ---------------------------------------------------------------------------------------------
# AVCDecoderConfigurationRecord, ISO/IEC 14496-15 §5.3.3.1


@dataclass(frozen=True, slots=True)
class AvcConfig:
    """AVCDecoderConfigurationRecord fields (ISO/IEC 14496-15 §5.3.3.1.2).

    ``chroma_format``/``bit_depth_*`` are the high-profile extension (None when absent).
    """

    profile_idc: int
    profile_compatibility: int
    level_idc: int
    nal_length_size: int
    sps: tuple[bytes, ...]
    pps: tuple[bytes, ...]
    chroma_format: int | None = None
    bit_depth_luma: int | None = None
    bit_depth_chroma: int | None = None
    sps_ext: tuple[bytes, ...] = ()

    @property
    def parameter_sets(self) -> ParameterSets:
        return ParameterSets((), self.sps, self.pps)

    @classmethod
    def from_parameter_sets(cls, sps: Iterable[bytes], pps: Iterable[bytes], nal_length_size: int = 4) -> AvcConfig:
        """A record for these SPS/PPS NAL units; profile, level and extension from the first SPS.

        Raises ValueError when there is no parseable SPS.
        """
        sps_t, pps_t = tuple(sps), tuple(pps)
        if not sps_t or len(sps_t[0]) < 4 or h264_nal_type(sps_t[0]) != H264_NAL_SPS:
            raise ValueError("an AVCDecoderConfigurationRecord needs an SPS")
        first = sps_t[0]
        profile_idc = first[1]
        chroma = luma = chroma_depth = None
        if profile_idc in _AVCC_EXT_PROFILES:
            chroma, luma, chroma_depth = _h264_sps_chroma(first) or (1, 8, 8)
        return cls(profile_idc, first[2], first[3], nal_length_size, sps_t, pps_t, chroma, luma, chroma_depth)


def _h264_sps_chroma(sps: bytes) -> tuple[int, int, int] | None:
    """(chroma_format_idc, BitDepthY, BitDepthC) of a high-profile SPS (H.264 §7.3.2.1.1)."""
    try:
        r = BitReader(unescape_rbsp(sps[1:]), 3)
        r.ue()  # seq_parameter_set_id
        if sps[1] not in _H264_HIGH_PROFILES:
            return 1, 8, 8
        chroma = r.ue()
        if chroma == 3:
            r.skip(1)  # separate_colour_plane_flag
        return chroma, r.ue() + 8, r.ue() + 8
    except BitsExhausted:
        return None


def parse_avcc(record: bytes | memoryview) -> AvcConfig | None:
    """Parse an AVCDecoderConfigurationRecord (the body of an ``avcC`` box or an RTMP sequence header)."""
    data = bytes(record)
    if len(data) < 7 or data[0] != 1:  # configurationVersion = 1
        return None
    profile_idc, compat, level = data[1], data[2], data[3]
    nal_length_size = (data[4] & 0x03) + 1
    if nal_length_size == 3:
        return None
    pos = 5

    def read_list(count: int) -> list[bytes] | None:
        nonlocal pos
        out = []
        for _ in range(count):
            if pos + 2 > len(data):
                return None
            length = int.from_bytes(data[pos : pos + 2], "big")
            pos += 2
            if length == 0 or pos + length > len(data):
                return None
            out.append(data[pos : pos + length])
            pos += length
        return out

    num_sps = data[pos] & 0x1F  # reserved '111' + numOfSequenceParameterSets
    pos += 1
    sps = read_list(num_sps)
    if sps is None or pos >= len(data):
        return None
    num_pps = data[pos]
    pos += 1
    pps = read_list(num_pps)
    if pps is None:
        return None
    chroma = luma = chroma_depth = None
    sps_ext: list[bytes] = []
    # §5.3.3.1.2: the extension is present for these profiles (older writers may omit it).
    if profile_idc in _AVCC_EXT_PROFILES and pos + 4 <= len(data):
        chroma = data[pos] & 0x03
        luma = (data[pos + 1] & 0x07) + 8
        chroma_depth = (data[pos + 2] & 0x07) + 8
        n_ext = data[pos + 3]
        pos += 4
        ext = read_list(n_ext)
        if ext is None:
            return None
        sps_ext = ext
    return AvcConfig(
        profile_idc, compat, level, nal_length_size, tuple(sps), tuple(pps), chroma, luma, chroma_depth, tuple(sps_ext)
    )


def build_avcc(config: AvcConfig) -> bytes:
    """Serialise an AVCDecoderConfigurationRecord (ISO/IEC 14496-15 §5.3.3.1.1)."""
    if config.nal_length_size not in (1, 2, 4):
        raise ValueError("nal_length_size must be 1, 2 or 4")
    if len(config.sps) > 31 or len(config.pps) > 255:
        raise ValueError("too many parameter sets for an AVCDecoderConfigurationRecord")
    out = bytearray(
        [1, config.profile_idc, config.profile_compatibility, config.level_idc, 0xFC | (config.nal_length_size - 1)]
    )
    out.append(0xE0 | len(config.sps))
    for nal in config.sps:
        out += len(nal).to_bytes(2, "big") + nal
    out.append(len(config.pps))
    for nal in config.pps:
        out += len(nal).to_bytes(2, "big") + nal
    if config.chroma_format is not None:
        out.append(0xFC | config.chroma_format)
        out.append(0xF8 | ((config.bit_depth_luma or 8) - 8))
        out.append(0xF8 | ((config.bit_depth_chroma or 8) - 8))
        out.append(len(config.sps_ext))
        for nal in config.sps_ext:
            out += len(nal).to_bytes(2, "big") + nal
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# HEVCDecoderConfigurationRecord, ISO/IEC 14496-15 §8.3.3.1


@dataclass(frozen=True, slots=True)
class HevcNalArray:
    """One array of an HEVCDecoderConfigurationRecord: NAL units of one type."""

    nal_unit_type: int
    nals: tuple[bytes, ...]
    array_completeness: bool = True


@dataclass(frozen=True, slots=True)
class HevcConfig:
    """HEVCDecoderConfigurationRecord fields (ISO/IEC 14496-15 §8.3.3.1.2)."""

    general_profile_space: int
    general_tier_flag: int
    general_profile_idc: int
    general_profile_compatibility_flags: int
    general_constraint_indicator_flags: int  # 48 bits
    general_level_idc: int
    min_spatial_segmentation_idc: int
    parallelism_type: int
    chroma_format_idc: int
    bit_depth_luma: int
    bit_depth_chroma: int
    avg_frame_rate: int
    constant_frame_rate: int
    num_temporal_layers: int
    temporal_id_nested: int
    nal_length_size: int
    arrays: tuple[HevcNalArray, ...]

    def nals_of_type(self, nal_unit_type: int) -> tuple[bytes, ...]:
        return tuple(nal for a in self.arrays if a.nal_unit_type == nal_unit_type for nal in a.nals)

    @property
    def parameter_sets(self) -> ParameterSets:
        return ParameterSets(
            self.nals_of_type(HEVC_NAL_VPS), self.nals_of_type(HEVC_NAL_SPS), self.nals_of_type(HEVC_NAL_PPS)
        )

    @classmethod
    def from_parameter_sets(
        cls, vps: Iterable[bytes], sps: Iterable[bytes], pps: Iterable[bytes], nal_length_size: int = 4
    ) -> HevcConfig:
        """A record for these VPS/SPS/PPS; profile, tier, level, chroma and depths from the first SPS.

        Raises ValueError when the first SPS does not parse.
        """
        vps_t, sps_t, pps_t = tuple(vps), tuple(sps), tuple(pps)
        fields = _hevc_sps_fields(sps_t[0]) if sps_t else None
        if fields is None:
            raise ValueError("an HEVCDecoderConfigurationRecord needs a parseable SPS")
        ptl, max_sub_layers_minus1, nested, chroma, luma, chroma_depth = fields
        arrays = tuple(
            HevcNalArray(t, nals)
            for t, nals in ((HEVC_NAL_VPS, vps_t), (HEVC_NAL_SPS, sps_t), (HEVC_NAL_PPS, pps_t))
            if nals
        )
        return cls(
            general_profile_space=ptl[0] >> 6,
            general_tier_flag=(ptl[0] >> 5) & 1,
            general_profile_idc=ptl[0] & 0x1F,
            general_profile_compatibility_flags=int.from_bytes(ptl[1:5], "big"),
            general_constraint_indicator_flags=int.from_bytes(ptl[5:11], "big"),
            general_level_idc=ptl[11],
            min_spatial_segmentation_idc=0,
            parallelism_type=0,
            chroma_format_idc=chroma,
            bit_depth_luma=luma,
            bit_depth_chroma=chroma_depth,
            avg_frame_rate=0,
            constant_frame_rate=0,
            num_temporal_layers=max_sub_layers_minus1 + 1,
            temporal_id_nested=nested,
            nal_length_size=nal_length_size,
            arrays=arrays,
        )


def _hevc_sps_fields(sps: bytes) -> tuple[bytes, int, int, int, int, int] | None:
    """(12-byte general profile_tier_level, sps_max_sub_layers_minus1, temporal_id_nesting,
    chroma_format_idc, BitDepthY, BitDepthC) of an HEVC SPS (H.265 §7.3.2.2.1, §7.3.3)."""
    if len(sps) < 15 or hevc_nal_type(sps) != HEVC_NAL_SPS:
        return None
    rbsp = unescape_rbsp(sps[2:])
    if len(rbsp) < 13:
        return None
    max_sub_layers_minus1 = (rbsp[0] >> 1) & 0x07
    nested = rbsp[0] & 0x01
    ptl = rbsp[1:13]  # general_profile_space .. general_level_idc, byte aligned
    try:
        r = BitReader(rbsp, 13)
        present = [(r.flag(), r.flag()) for _ in range(max_sub_layers_minus1)]
        if max_sub_layers_minus1 > 0:
            r.skip(2 * (8 - max_sub_layers_minus1))
        for profile_present, level_present in present:
            r.skip(88 if profile_present else 0)
            r.skip(8 if level_present else 0)
        r.ue()  # sps_seq_parameter_set_id
        chroma = r.ue()
        if chroma == 3:
            r.skip(1)  # separate_colour_plane_flag
        r.ue()  # pic_width_in_luma_samples
        r.ue()  # pic_height_in_luma_samples
        if r.flag():  # conformance_window_flag
            for _ in range(4):
                r.ue()
        luma = r.ue() + 8
        chroma_depth = r.ue() + 8
    except BitsExhausted:
        return None
    if chroma > 3:
        return None
    return ptl, max_sub_layers_minus1, nested, chroma, luma, chroma_depth


def parse_hvcc(record: bytes | memoryview) -> HevcConfig | None:
    """Parse an HEVCDecoderConfigurationRecord (the body of an ``hvcC`` box)."""
    data = bytes(record)
    if len(data) < 23 or data[0] != 1:  # configurationVersion = 1
        return None
    pos = 23
    arrays: list[HevcNalArray] = []
    for _ in range(data[22]):
        if pos + 3 > len(data):
            return None
        completeness = bool(data[pos] & 0x80)
        t = data[pos] & 0x3F
        count = int.from_bytes(data[pos + 1 : pos + 3], "big")
        pos += 3
        nals: list[bytes] = []
        for _ in range(count):
            if pos + 2 > len(data):
                return None
            length = int.from_bytes(data[pos : pos + 2], "big")
            pos += 2
            if pos + length > len(data):
                return None
            nals.append(data[pos : pos + length])
            pos += length
        arrays.append(HevcNalArray(t, tuple(nals), completeness))
    if (data[21] & 0x03) == 2:  # lengthSizeMinusOne = 2 is not allowed
        return None
    return HevcConfig(
        general_profile_space=data[1] >> 6,
        general_tier_flag=(data[1] >> 5) & 1,
        general_profile_idc=data[1] & 0x1F,
        general_profile_compatibility_flags=int.from_bytes(data[2:6], "big"),
        general_constraint_indicator_flags=int.from_bytes(data[6:12], "big"),
        general_level_idc=data[12],
        min_spatial_segmentation_idc=int.from_bytes(data[13:15], "big") & 0x0FFF,
        parallelism_type=data[15] & 0x03,
        chroma_format_idc=data[16] & 0x03,
        bit_depth_luma=(data[17] & 0x07) + 8,
        bit_depth_chroma=(data[18] & 0x07) + 8,
        avg_frame_rate=int.from_bytes(data[19:21], "big"),
        constant_frame_rate=data[21] >> 6,
        num_temporal_layers=(data[21] >> 3) & 0x07,
        temporal_id_nested=(data[21] >> 2) & 0x01,
        nal_length_size=(data[21] & 0x03) + 1,
        arrays=tuple(arrays),
    )


def build_hvcc(config: HevcConfig) -> bytes:
    """Serialise an HEVCDecoderConfigurationRecord (ISO/IEC 14496-15 §8.3.3.1.1)."""
    if config.nal_length_size not in (1, 2, 4):
        raise ValueError("nal_length_size must be 1, 2 or 4")
    out = bytearray([1])
    out.append((config.general_profile_space << 6) | (config.general_tier_flag << 5) | config.general_profile_idc)
    out += config.general_profile_compatibility_flags.to_bytes(4, "big")
    out += config.general_constraint_indicator_flags.to_bytes(6, "big")
    out.append(config.general_level_idc)
    out += (0xF000 | config.min_spatial_segmentation_idc).to_bytes(2, "big")
    out.append(0xFC | config.parallelism_type)
    out.append(0xFC | config.chroma_format_idc)
    out.append(0xF8 | (config.bit_depth_luma - 8))
    out.append(0xF8 | (config.bit_depth_chroma - 8))
    out += config.avg_frame_rate.to_bytes(2, "big")
    out.append(
        (config.constant_frame_rate << 6)
        | (config.num_temporal_layers << 3)
        | (config.temporal_id_nested << 2)
        | (config.nal_length_size - 1)
    )
    out.append(len(config.arrays))
    for array in config.arrays:
        out.append((0x80 if array.array_completeness else 0) | array.nal_unit_type)
        out += len(array.nals).to_bytes(2, "big")
        for nal in array.nals:
            out += len(nal).to_bytes(2, "big") + nal
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# AAC: AudioSpecificConfig (ISO/IEC 14496-3 §1.6.2.1) and ADTS (§1.A.2.2)

AAC_FRAME_SAMPLES: Final = 1024  # §4.5.1.1: one raw_data_block decodes to 1024 samples per channel
ADTS_HEADER_SIZE: Final = 7  # protection_absent = 1
ADTS_MAX_FRAME: Final = 0x1FFF  # 13-bit aac_frame_length


@dataclass(frozen=True, slots=True)
class AacConfig:
    """The AudioSpecificConfig fields ADTS can carry.

    ``object_type`` is the core audio object type (2 = AAC LC); ``sbr``/``ps`` record explicit
    HE-AAC signalling (object type 5 / 29 in the ASC), which ADTS does not carry: its header
    names the core object type and the core sampling rate (implicit signalling, §1.6.5.2).
    """

    object_type: int
    sample_rate: int
    channel_config: int
    sbr: bool = False
    ps: bool = False
    extension_sample_rate: int | None = None

    @property
    def sample_rate_index(self) -> int | None:
        """samplingFrequencyIndex (§1.6.3.4), None when the rate needs the explicit 24-bit form."""
        try:
            return AAC_SAMPLE_RATES.index(self.sample_rate)
        except ValueError:
            return None

    def frame_duration_90k(self, frames: int = 1) -> int:
        """90 kHz duration of ``frames`` AAC frames (1024 samples each, at the core rate)."""
        return frames * AAC_FRAME_SAMPLES * 90_000 // self.sample_rate


def parse_asc(data: bytes | memoryview) -> AacConfig | None:
    """Parse an AudioSpecificConfig (ISO/IEC 14496-3 §1.6.2.1), as far as ADTS needs."""
    r = BitReader(bytes(data))
    try:
        aot = read_audio_object_type(r)
        rate = read_sampling_frequency(r)
        channels = r.u(4)
        sbr = ps = False
        ext_rate = None
        if aot in (5, 29):  # explicit SBR / PS: extension rate, then the core object type
            sbr, ps = True, aot == 29
            ext_rate = read_sampling_frequency(r)
            aot = read_audio_object_type(r)
    except BitsExhausted:
        return None
    if rate is None or rate <= 0 or aot == 0:
        return None
    return AacConfig(aot, rate, channels, sbr, ps, ext_rate)


def _frequency_bits(rate: int) -> tuple[int, int]:
    """(value, width) of a samplingFrequencyIndex, with the explicit 24-bit escape."""
    if rate in AAC_SAMPLE_RATES:
        return AAC_SAMPLE_RATES.index(rate), 4
    return (15 << 24) | rate, 28


def build_asc(config: AacConfig) -> bytes:
    """Serialise an AudioSpecificConfig (§1.6.2.1) with the GASpecificConfig defaults
    (frameLengthFlag 0, dependsOnCoreCoder 0, extensionFlag 0)."""
    fields: list[tuple[int, int]] = []

    def put_object_type(aot: int) -> None:
        if aot >= 31:
            fields.extend([(31, 5), (aot - 32, 6)])
        else:
            fields.append((aot, 5))

    put_object_type((29 if config.ps else 5) if config.sbr else config.object_type)
    fields.append(_frequency_bits(config.sample_rate))
    fields.append((config.channel_config, 4))
    if config.sbr:
        fields.append(_frequency_bits(config.extension_sample_rate or 2 * config.sample_rate))
        put_object_type(config.object_type)
    fields.append((0, 3))  # GASpecificConfig: frameLengthFlag, dependsOnCoreCoder, extensionFlag
    value = 0
    width = 0
    for v, w in fields:
        value = (value << w) | v
        width += w
    pad = -width % 8
    return (value << pad).to_bytes((width + pad) // 8, "big")


def build_adts_header(config: AacConfig, raw_length: int) -> bytes:
    """A 7-byte ADTS header (protection_absent = 1, one raw_data_block) for a raw AAC frame.

    ISO/IEC 14496-3 §1.A.2.2.1: the 2-bit profile is the object type minus one, so only object
    types 1-4 fit; the rate must have a samplingFrequencyIndex. Raises ValueError otherwise.
    """
    if not 1 <= config.object_type <= 4:
        raise ValueError(f"ADTS cannot carry audio object type {config.object_type}")
    index = config.sample_rate_index
    if index is None:
        raise ValueError(f"ADTS cannot carry a sampling rate of {config.sample_rate} Hz")
    if not 0 <= config.channel_config <= 7:
        raise ValueError(f"channel_configuration {config.channel_config} out of range")
    frame_length = raw_length + ADTS_HEADER_SIZE
    if frame_length > ADTS_MAX_FRAME:
        raise ValueError(f"an AAC frame of {raw_length} bytes does not fit ADTS")
    profile = config.object_type - 1
    ch = config.channel_config
    # syncword 0xFFF, ID 0 (MPEG-4), layer 00, protection_absent 1
    return bytes(
        [
            0xFF,
            0xF1,
            (profile << 6) | (index << 2) | (ch >> 2),
            ((ch & 0x03) << 6) | (frame_length >> 11),
            (frame_length >> 3) & 0xFF,
            ((frame_length & 0x07) << 5) | 0x1F,  # adts_buffer_fullness 0x7FF (VBR)
            0xFC,  # buffer fullness low bits, number_of_raw_data_blocks_in_frame = 0
        ]
    )


def build_adts_frame(config: AacConfig, raw: bytes) -> bytes:
    """An ADTS frame: header + one raw AAC frame."""
    return build_adts_header(config, len(raw)) + raw


@dataclass(frozen=True, slots=True)
class AdtsFrame:
    """One parsed ADTS frame: its configuration, the raw AAC payload and the frame's size."""

    config: AacConfig
    raw: bytes
    frame_length: int
    raw_data_blocks: int

    @property
    def samples(self) -> int:
        return AAC_FRAME_SAMPLES * self.raw_data_blocks


def parse_adts(data: bytes | bytearray | memoryview, offset: int = 0) -> AdtsFrame | None:
    """The ADTS frame at ``offset`` (ISO/IEC 14496-3 §1.A.2.2), or None when none fits there."""
    n = len(data)
    if offset + ADTS_HEADER_SIZE > n:
        return None
    b = data[offset : offset + ADTS_HEADER_SIZE]
    if b[0] != 0xFF or b[1] & 0xF6 != 0xF0:  # syncword, layer 00
        return None
    protection_absent = b[1] & 0x01
    profile = b[2] >> 6
    index = (b[2] >> 2) & 0x0F
    ch = ((b[2] & 0x01) << 2) | (b[3] >> 6)
    frame_length = ((b[3] & 0x03) << 11) | (b[4] << 3) | (b[5] >> 5)
    blocks = (b[6] & 0x03) + 1
    header = ADTS_HEADER_SIZE if protection_absent else ADTS_HEADER_SIZE + 2  # + crc_check
    if index >= len(AAC_SAMPLE_RATES) or frame_length < header or offset + frame_length > n:
        return None
    raw = bytes(data[offset + header : offset + frame_length])
    return AdtsFrame(AacConfig(profile + 1, AAC_SAMPLE_RATES[index], ch), raw, frame_length, blocks)


def iter_adts(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, AdtsFrame]]:
    """(offset, frame) for each ADTS frame in ``data``; bytes between frames are skipped."""
    pos = 0
    n = len(data)
    buf = bytes(data) if isinstance(data, memoryview) else data
    while pos + ADTS_HEADER_SIZE <= n:
        frame = parse_adts(buf, pos)
        if frame is None:
            nxt = buf.find(b"\xff", pos + 1)
            if nxt < 0:
                return
            pos = nxt
            continue
        yield pos, frame
        pos += frame.frame_length
