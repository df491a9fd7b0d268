"""``make_depacketizer``: the depacketiser for an SDP media description (rtpmap + fmtp)."""

from __future__ import annotations

from .audio import AacHbrDepacketizer, LatmDepacketizer
from .common import Depacketizer
from .video import H264Depacketizer, HevcDepacketizer

SUPPORTED_ENCODINGS = ("H264", "H265", "MPEG4-GENERIC", "MP4A-LATM")


def make_depacketizer(
    encoding: str, clock_rate: int, channels: int | None, fmtp: dict[str, str]
) -> Depacketizer | None:
    """The depacketiser for an ``a=rtpmap`` encoding name (RFC 4566 §6, case-insensitive).

    None for a codec that is not handled here (anything but H.264, H.265 and AAC as
    ``mpeg4-generic`` or ``MP4A-LATM``); ValueError with a readable reason for a handled codec
    whose parameters cannot be used (interleaving, DONL, a missing or invalid AAC config, ...).
    """
    name = encoding.strip().upper()
    if name == "H264":
        return H264Depacketizer(fmtp)
    if name in ("H265", "HEVC"):
        return HevcDepacketizer(fmtp)
    if name == "MPEG4-GENERIC":
        return AacHbrDepacketizer(fmtp, clock_rate, channels)
    if name == "MP4A-LATM":
        return LatmDepacketizer(fmtp, clock_rate, channels)
    return None


__all__ = ["SUPPORTED_ENCODINGS", "make_depacketizer"]
