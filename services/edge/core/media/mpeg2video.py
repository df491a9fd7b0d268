"""MPEG-2 video sequence header and sequence extension (ISO/IEC 13818-2 §6.2.2). Sans-IO."""

from __future__ import annotations

from .h264 import VideoParams

_SEQUENCE_HEADER = b"\x00\x00\x01\xb3"
_EXTENSION = b"\x00\x00\x01\xb5"
# Table 6-4 frame_rate_code.
_FRAME_RATES = {1: 24000 / 1001, 2: 24.0, 3: 25.0, 4: 30000 / 1001, 5: 30.0, 6: 50.0, 7: 60000 / 1001, 8: 60.0}
# §8.2 Table 8-2 and 8-3; the 4:2:2 profile is an escape (Table 8-1).
_PROFILES = {1: "High", 2: "Spatially Scalable", 3: "SNR Scalable", 4: "Main", 5: "Simple"}
_LEVELS = {4: "High", 6: "High 1440", 8: "Main", 10: "Low"}


def find_sequence(data: bytes) -> VideoParams | None:
    """Parameters from the first sequence header in ``data`` (and its extension if present)."""
    pos = data.find(_SEQUENCE_HEADER)
    if pos < 0 or pos + 12 > len(data):
        return None
    h = data[pos + 4 : pos + 12]
    width = (h[0] << 4) | (h[1] >> 4)
    height = ((h[1] & 0x0F) << 8) | h[2]
    rate_code = h[3] & 0x0F
    frame_rate = _FRAME_RATES.get(rate_code)
    if width == 0 or height == 0:
        return None
    end = pos + 12
    if h[7] & 0x02:  # load_intra_quantiser_matrix
        end += 64
    ext = data.find(_EXTENSION, end)
    profile = level = None
    codec = "mpeg1video"
    interlaced = False
    if ext >= 0 and ext + 10 <= len(data) and data[ext + 4] >> 4 == 1:
        e = data[ext + 4 : ext + 10]
        codec = "mpeg2video"
        pli = ((e[0] & 0x0F) << 4) | (e[1] >> 4)
        if pli & 0x80:
            profile = "4:2:2" if pli in (0x82, 0x85) else None
            level = {0x82: "High", 0x85: "Main"}.get(pli)
        else:
            profile = _PROFILES.get((pli >> 4) & 0x07)
            level = _LEVELS.get(pli & 0x0F)
        interlaced = not (e[1] & 0x08)  # progressive_sequence
        width |= ((e[1] & 0x01) << 1 | e[2] >> 7) << 12
        height |= ((e[2] >> 5) & 0x03) << 12
        n = (e[5] >> 5) & 0x03
        d = e[5] & 0x1F
        if frame_rate is not None:
            frame_rate = frame_rate * (n + 1) / (d + 1)
    return VideoParams(
        codec, profile, level, width, height, None if frame_rate is None else round(frame_rate, 3), interlaced
    )


def has_sequence_header(data: bytes) -> bool:
    return _SEQUENCE_HEADER in data
