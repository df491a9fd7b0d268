"""HEVC sequence parameter set (ITU-T H.265 §7.3.2.2, Annex E VUI). Sans-IO, never raises."""

from __future__ import annotations

from .bits import BitReader, BitsExhausted, iter_nal_units, skip_vui_picture_fields, unescape_rbsp
from .h264 import VideoParams

NAL_VPS = 32
NAL_SPS = 33

# libavcodec's names for general_profile_idc (what ffprobe prints).
_PROFILES = {1: "Main", 2: "Main 10", 3: "Main Still Picture", 4: "Rext", 9: "SCC"}


def _level_name(level_idc: int) -> str:
    # A.4: general_level_idc is 30 x the level number.
    major, rest = divmod(level_idc, 30)
    minor = rest // 3
    return f"{major}" if minor == 0 else f"{major}.{minor}"


def _profile_tier_level(r: BitReader, max_sub_layers_minus1: int) -> tuple[int, int, int]:
    """(general_profile_idc, compatibility flags, general_level_idc), §7.3.3."""
    r.skip(2 + 1)  # general_profile_space, general_tier_flag
    profile_idc = r.u(5)
    compat = r.u(32)
    r.skip(4 + 43 + 1)  # source flags, constraint flags, inbld/reserved
    level_idc = r.u(8)
    present = []
    for _ in range(max_sub_layers_minus1):
        present.append((r.flag(), r.flag()))
    if max_sub_layers_minus1 > 0:
        r.skip(2 * (8 - max_sub_layers_minus1))
    for profile_present, level_present in present:
        if profile_present:
            r.skip(88)
        if level_present:
            r.skip(8)
    return profile_idc, compat, level_idc


def _skip_scaling_list_data(r: BitReader) -> None:
    for size_id in range(4):
        for _ in range(0, 6, 3 if size_id == 3 else 1):
            if not r.flag():  # scaling_list_pred_mode_flag
                r.ue()
            else:
                if size_id > 1:
                    r.se()
                for _ in range(min(64, 1 << (4 + (size_id << 1)))):
                    r.se()


def _skip_st_ref_pic_sets(r: BitReader, count: int) -> None:
    """§7.3.7 st_ref_pic_set for each of the SPS's ``count`` sets."""
    num_delta_pocs: list[int] = []
    for idx in range(count):
        inter = idx != 0 and r.flag()
        if inter:
            r.skip(1)  # delta_rps_sign
            r.ue()  # abs_delta_rps_minus1
            n = 0
            for _ in range(num_delta_pocs[idx - 1] + 1):
                used = r.flag()
                use_delta = True if used else r.flag()
                n += used or use_delta
            num_delta_pocs.append(n)
        else:
            neg, pos = r.ue(), r.ue()
            if neg > 16 or pos > 16:
                raise BitsExhausted
            for _ in range(neg + pos):
                r.ue()
                r.skip(1)
            num_delta_pocs.append(neg + pos)


def parse_sps(nal: bytes) -> VideoParams | None:
    """Parse one SPS NAL unit (two-byte header included); None when malformed or truncated."""
    if len(nal) < 4 or (nal[0] >> 1) & 0x3F != NAL_SPS:
        return None
    try:
        return _parse(unescape_rbsp(nal[2:]))
    except BitsExhausted:
        return None


def _parse(rbsp: bytes) -> VideoParams | None:
    r = BitReader(rbsp)
    r.skip(4)  # sps_video_parameter_set_id
    max_sub_layers_minus1 = r.u(3)
    r.skip(1)
    profile_idc, compat, level_idc = _profile_tier_level(r, max_sub_layers_minus1)
    if profile_idc == 0:  # take the first compatible profile (A.3)
        for idc in range(1, 32):
            if compat & (1 << (31 - idc)):
                profile_idc = idc
                break
    if r.ue() > 15:  # sps_seq_parameter_set_id
        return None
    chroma_format_idc = r.ue()
    if chroma_format_idc > 3:
        return None
    separate = chroma_format_idc == 3 and r.flag()
    width = r.ue()
    height = r.ue()
    if r.flag():  # conformance_window_flag, §7.4.3.2.1 SubWidthC/SubHeightC
        left, right, top, bottom = r.ue(), r.ue(), r.ue(), r.ue()
        cat = 0 if separate else chroma_format_idc
        sub_w = 2 if cat in (1, 2) else 1
        sub_h = 2 if cat == 1 else 1
        width -= sub_w * (left + right)
        height -= sub_h * (top + bottom)
    if width <= 0 or height <= 0 or width > 16888 or height > 16888:
        return None
    r.ue()  # bit_depth_luma_minus8
    r.ue()  # bit_depth_chroma_minus8
    log2_max_poc_lsb = r.ue() + 4
    if log2_max_poc_lsb > 16:
        return None
    ordering_all = r.flag()
    for _ in range(0 if ordering_all else max_sub_layers_minus1, max_sub_layers_minus1 + 1):
        r.ue()
        r.ue()
        r.ue()
    for _ in range(6):  # coding/transform block sizes and hierarchy depths
        r.ue()
    if r.flag() and r.flag():  # scaling_list_enabled_flag, sps_scaling_list_data_present_flag
        _skip_scaling_list_data(r)
    r.skip(2)  # amp_enabled_flag, sample_adaptive_offset_enabled_flag
    if r.flag():  # pcm_enabled_flag
        r.skip(8)
        r.ue()
        r.ue()
        r.skip(1)
    n_sets = r.ue()
    if n_sets > 64:
        return None
    _skip_st_ref_pic_sets(r, n_sets)
    if r.flag():  # long_term_ref_pics_present_flag
        n = r.ue()
        if n > 32:
            return None
        for _ in range(n):
            r.skip(log2_max_poc_lsb + 1)
    r.skip(2)  # sps_temporal_mvp_enabled_flag, strong_intra_smoothing_enabled_flag
    frame_rate = None
    field_seq = False
    if r.flag():  # vui_parameters_present_flag
        frame_rate, field_seq = _vui(r)
    if field_seq and frame_rate is not None:
        frame_rate = round(frame_rate / 2, 3)  # E.3.1: each picture is a field
    profile = _PROFILES.get(profile_idc, str(profile_idc))
    return VideoParams("hevc", profile, _level_name(level_idc), width, height, frame_rate, field_seq)


def _vui(r: BitReader) -> tuple[float | None, bool]:
    skip_vui_picture_fields(r)
    r.skip(1)  # neutral_chroma_indication_flag
    field_seq = r.flag()
    r.skip(1)  # frame_field_info_present_flag
    if r.flag():  # default_display_window_flag
        r.ue()
        r.ue()
        r.ue()
        r.ue()
    if not r.flag():  # vui_timing_info_present_flag
        return None, field_seq
    num_units_in_tick = r.u(32)
    time_scale = r.u(32)
    if not num_units_in_tick or not time_scale:
        return None, field_seq
    return round(time_scale / num_units_in_tick, 3), field_seq


def find_sps(data: bytes) -> VideoParams | None:
    for nal in iter_nal_units(data):
        if len(nal) >= 2 and (nal[0] >> 1) & 0x3F == NAL_SPS:
            params = parse_sps(nal)
            if params is not None:
                return params
    return None


def has_sps(data: bytes) -> bool:
    return any((nal[0] >> 1) & 0x3F == NAL_SPS for nal in iter_nal_units(data))
