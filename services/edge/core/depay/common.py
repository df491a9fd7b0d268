"""Shared types of the RTP depacketisers: ``Frame``, ``DepayStats``, the ``Depacketizer`` protocol.

Every depacketiser is sans-IO and fed one RTP payload at a time, with the fields of its RTP
header that matter (sequence number, RTP timestamp, marker bit). It answers the complete
frames (access units) the packet finished: Annex B pictures for video, ADTS frames for AAC.
Pending data is bounded by ``MAX_UNIT_BYTES``: a unit that grows past it is dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

MAX_UNIT_BYTES: Final = 8 << 20  # 8 MiB: a larger access unit is dropped (memory bound)


@dataclass(frozen=True, slots=True)
class Frame:
    """One access unit out of a depacketiser.

    ``data`` is Annex B (AUD first, parameter sets in front of every keyframe) for video and
    one ADTS frame for AAC; ``timestamp`` the 32-bit RTP timestamp (presentation time) of the
    unit; ``keyframe`` an IDR (H.264) / IRAP (HEVC) picture, always True for audio.
    """

    data: bytes
    timestamp: int
    keyframe: bool


@dataclass(slots=True)
class DepayStats:
    """Counters of one depacketiser."""

    units: int = 0  # frames answered
    lost_units: int = 0  # access units dropped because a packet of them was lost (or they grew too large)
    bad_packets: int = 0  # payloads that do not parse
    unsupported_packets: int = 0  # valid payload formats this depacketiser does not handle
    before_keyframe: int = 0  # video units dropped while waiting for the first keyframe


class Depacketizer(Protocol):
    """What ``make_depacketizer`` answers: RTP payloads in, frames out."""

    @property
    def stats(self) -> DepayStats:
        """The depacketiser's counters."""
        ...

    @property
    def media(self) -> str:
        """ "video" or "audio"."""
        ...

    @property
    def codec(self) -> str:
        """ "h264", "hevc" or "aac"."""
        ...

    @property
    def clock_rate(self) -> int:
        """The RTP clock rate, Hz."""
        ...

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes | memoryview) -> list[Frame]:
        """One RTP payload; the frames it completes (often none)."""
        ...

    def flush(self) -> list[Frame]:
        """End of stream: the unit in progress when it is complete enough to be used."""
        ...


def normalise_fmtp(fmtp: dict[str, str]) -> dict[str, str]:
    """fmtp parameter names are case-insensitive (RFC 4566 §6 / RFC 3640 §4.1): lower-case them."""
    return {k.strip().lower(): v.strip() for k, v in fmtp.items()}


def seq_next(seq: int) -> int:
    """The sequence number after ``seq`` (16 bits, RFC 3550 §5.1)."""
    return (seq + 1) & 0xFFFF
