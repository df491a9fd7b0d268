"""H.264 sequence parameter set (ITU-T H.264 §7.3.2.1.1, Annex E VUI). Sans-IO, never raises."""

from __future__ import annotations

from dataclasses import dataclass

from .bits import BitReader, BitsExhausted, iter_nal_units, skip_vui_picture_fields, unescape_rbsp

NAL_SPS = 7


@dataclass(frozen=True, slots=True)
class VideoParams:
    """Codec parameters in ffprobe's terms: displayed size, frames (not fields) per second."""

    codec: str
    profile: str | None
    level: str | None
    width: int
    height: int
    frame_rate: float | None
    interlaced: bool = False

    @property
    def resolution(self) -> str:
        return f"{self.width}x{self.height}"


# libavcodec's profile names (what ffprobe prints), keyed by profile_idc.
_PROFILES = {
    66: "Baseline",
    77: "Main",
    88: "Extended",
    100: "High",
    110: "High 10",
    122: "High 4:2:2",
    244: "High 4:4:4 Predictive",
    44: "CAVLC 4:4:4",
}
_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}


def profile_name(profile_idc: int, constraint_flags: int) -> str:
    if profile_idc == 66 and constraint_flags & 0x40:
        return "Constrained Baseline"
    if profile_idc in (110, 122, 244) and constraint_flags & 0x10:
        return {110: "High 10 Intra", 122: "High 4:2:2 Intra", 244: "High 4:4:4 Intra"}[profile_idc]
    return _PROFILES.get(profile_idc, str(profile_idc))


def level_name(level_idc: int, constraint_flags: int, profile_idc: int) -> str:
    # Annex A: level 1b is level_idc 9, or 11 with constraint_set3 in Baseline/Main/Extended.
    if level_idc == 9 or (level_idc == 11 and constraint_flags & 0x10 and profile_idc in (66, 77, 88)):
        return "1b"
    major, minor = divmod(level_idc, 10)
    return f"{major}" if minor == 0 else f"{major}.{minor}"


def _skip_scaling_list(r: BitReader, size: int) -> None:
    last = 8
    nxt = 8
    for _ in range(size):
        if nxt:
            nxt = (last + r.se() + 256) % 256
        last = nxt if nxt else last


def parse_sps(nal: bytes) -> VideoParams | None:
    """Parse one SPS NAL unit (header byte included); None when malformed or truncated."""
    if len(nal) < 4 or nal[0] & 0x1F != NAL_SPS:
        return None
    try:
        return _parse(unescape_rbsp(nal[1:]))
    except BitsExhausted:
        return None


def _parse(rbsp: bytes) -> VideoParams | None:
    r = BitReader(rbsp)
    profile_idc = r.u(8)
    constraints = r.u(8)
    level_idc = r.u(8)
    if r.ue() > 31:  # seq_parameter_set_id
        return None
    chroma_format_idc = 1
    separate_colour_plane = False
    if profile_idc in _HIGH_PROFILES:
        chroma_format_idc = r.ue()
        if chroma_format_idc > 3:
            return None
        if chroma_format_idc == 3:
            separate_colour_plane = r.flag()
        r.ue()  # bit_depth_luma_minus8
        r.ue()  # bit_depth_chroma_minus8
        r.skip(1)  # qpprime_y_zero_transform_bypass_flag
        if r.flag():  # seq_scaling_matrix_present_flag
            for i in range(8 if chroma_format_idc != 3 else 12):
                if r.flag():
                    _skip_scaling_list(r, 16 if i < 6 else 64)
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()
    elif poc_type == 1:
        r.skip(1)
        r.se()
        r.se()
        n = r.ue()
        if n > 255:
            return None
        for _ in range(n):
            r.se()
    elif poc_type != 2:
        return None
    r.ue()  # max_num_ref_frames
    r.skip(1)  # gaps_in_frame_num_value_allowed_flag
    width_mbs = r.ue() + 1
    height_map_units = r.ue() + 1
    frame_mbs_only = r.flag()
    if not frame_mbs_only:
        r.skip(1)  # mb_adaptive_frame_field_flag
    r.skip(1)  # direct_8x8_inference_flag
    width = width_mbs * 16
    height = (2 - frame_mbs_only) * height_map_units * 16
    if r.flag():  # frame_cropping_flag, §7.4.2.1.1 CropUnitX/Y
        left, right, top, bottom = r.ue(), r.ue(), r.ue(), r.ue()
        chroma_array_type = 0 if separate_colour_plane else chroma_format_idc
        sub_w = 2 if chroma_array_type in (1, 2) else 1
        sub_h = 2 if chroma_array_type == 1 else 1
        crop_x = sub_w if chroma_array_type else 1
        crop_y = (sub_h if chroma_array_type else 1) * (2 - frame_mbs_only)
        width -= crop_x * (left + right)
        height -= crop_y * (top + bottom)
    if width <= 0 or height <= 0 or width > 16384 or height > 16384:
        return None
    frame_rate = None
    if r.flag():  # vui_parameters_present_flag, Annex E.1.1
        frame_rate = _vui_frame_rate(r)
    return VideoParams(
        "h264",
        profile_name(profile_idc, constraints),
        level_name(level_idc, constraints, profile_idc),
        width,
        height,
        frame_rate,
        not frame_mbs_only,
    )


def _vui_frame_rate(r: BitReader) -> float | None:
    skip_vui_picture_fields(r)
    if not r.flag():  # timing_info_present_flag
        return None
    num_units_in_tick = r.u(32)
    time_scale = r.u(32)
    if not num_units_in_tick or not time_scale:
        return None
    # E.2.1: a frame lasts two ticks (a tick is a field period), so frames per second is
    # time_scale / (2 x num_units_in_tick).
    return round(time_scale / (2 * num_units_in_tick), 3)


def find_sps(data: bytes) -> VideoParams | None:
    """The first parseable SPS in an Annex B buffer."""
    for nal in iter_nal_units(data):
        if nal[0] & 0x1F == NAL_SPS:
            params = parse_sps(nal)
            if params is not None:
                return params
    return None


def has_sps(data: bytes) -> bool:
    return any(nal[0] & 0x1F == NAL_SPS for nal in iter_nal_units(data))
