"""The access unit the muxer takes and the demuxer gives, and 33-bit timestamp arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

StreamKind = Literal["video", "audio"]
Codec = Literal["h264", "hevc", "aac"]

TS_WRAP: Final = 1 << 33  # ISO/IEC 13818-1 §2.4.3.7: PTS/DTS are 33-bit counts of a 90 kHz clock
TS_MASK: Final = TS_WRAP - 1
CLOCK_HZ: Final = 90_000


@dataclass(frozen=True, slots=True)
class AccessUnit:
    """One coded picture (Annex B) or one AAC frame (ADTS), with 90 kHz timestamps.

    ``pts``/``dts`` are 33-bit values from the demuxer; the muxer accepts any integers and
    wraps them. ``keyframe`` is an IDR (H.264) or IRAP (HEVC) picture; every AAC frame is one.
    """

    kind: StreamKind
    codec: Codec
    pid: int
    pts: int
    dts: int
    keyframe: bool
    data: bytes


def ts_delta(later: int, earlier: int) -> int:
    """``later - earlier`` on the 33-bit 90 kHz clock, in (-2^32, 2^32]: wrap-aware."""
    d = (later - earlier) & TS_MASK
    return d - TS_WRAP if d > TS_WRAP // 2 else d
