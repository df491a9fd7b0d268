"""H.264 and HEVC access units -> RTP payloads and packets. Sans-IO.

``video_payloads`` follows the sender rules of RFC 6184 (packetization-mode 1) and RFC 7798:

* the access unit delimiter is dropped (RFC 6184 §5.3 / RFC 7798 §4.4: the RTP marker and
  timestamp delimit access units; receivers add one back when muxing to TS);
* the parameter sets (SPS/PPS; VPS/SPS/PPS) go together in one aggregation packet, STAP-A
  (RFC 6184 §5.7.1) or AP (RFC 7798 §4.4.2), in front of the picture (when they fit the MTU;
  one set alone otherwise);
* every other NAL unit travels alone when it fits ``mtu`` bytes of payload, else in
  fragmentation units, FU-A (RFC 6184 §5.8) or FU (RFC 7798 §4.4.3), of at most ``mtu`` bytes.

``RtpVideoPacketizer`` adds the RTP header (RFC 3550 §5.1): one sequence counter, the 90 kHz
timestamp of the access unit (RFC 6184 §5.1: the sampling instant, i.e. the PTS), and the
marker bit on the unit's last packet.
"""

from __future__ import annotations

from typing import Final, Literal

from ..mux.codec import split_annexb
from ..rtp import build_rtp_header

VideoCodec = Literal["h264", "hevc"]

DEFAULT_MTU: Final = 1200  # RTP payload bytes: fits a 1280-byte path MTU with headers (and SRTP)
_H264_STAP_A: Final = 24
_H264_FU_A: Final = 28
_HEVC_AP: Final = 48
_HEVC_FU: Final = 49
# AUD and parameter-set NAL unit types per codec.
_AUD: Final = {"h264": 9, "hevc": 35}
_SETS: Final = {"h264": (7, 8), "hevc": (32, 33, 34)}


def _nal_type(codec: VideoCodec, nal: bytes) -> int:
    return nal[0] & 0x1F if codec == "h264" else (nal[0] >> 1) & 0x3F


def _aggregate(codec: VideoCodec, nals: list[bytes]) -> bytes:
    """One STAP-A / AP carrying ``nals`` (16-bit size before each NAL unit)."""
    body = b"".join(len(n).to_bytes(2, "big") + n for n in nals)
    if codec == "h264":
        nri = max(n[0] & 0x60 for n in nals)  # RFC 6184 §5.7.1: the highest NRI of the units
        return bytes((nri | _H264_STAP_A,)) + body
    # RFC 7798 §4.4.2: F = any F, LayerId and TID = the lowest of the units (all 0 and 1 here).
    layer_tid = min(((n[0] & 1) << 8 | n[1]) for n in nals)
    return bytes(((_HEVC_AP << 1) | (layer_tid >> 8), layer_tid & 0xFF)) + body


def _fragments(codec: VideoCodec, nal: bytes, mtu: int) -> list[bytes]:
    """``nal`` as FU-A / FU packets of at most ``mtu`` bytes."""
    kind = _nal_type(codec, nal)
    if codec == "h264":
        head, body = bytes(((nal[0] & 0xE0) | _H264_FU_A,)), nal[1:]  # FU indicator: F, NRI, 28
    else:
        head, body = bytes(((nal[0] & 0x81) | (_HEVC_FU << 1), nal[1])), nal[2:]  # PayloadHdr, type 49
    room = mtu - len(head) - 1  # the FU header byte
    if room <= 0:
        raise ValueError(f"an MTU of {mtu} bytes leaves no room for a fragment")
    chunks = [body[i : i + room] for i in range(0, len(body), room)]
    out = []
    for i, chunk in enumerate(chunks):
        fu = (0x80 if i == 0 else 0) | (0x40 if i == len(chunks) - 1 else 0) | kind  # S, E, type
        out.append(head + bytes((fu,)) + chunk)
    return out


def video_payloads(codec: VideoCodec, annexb: bytes, mtu: int = DEFAULT_MTU) -> list[bytes]:
    """The RTP payloads of one access unit (Annex B), in order (see the module docstring)."""
    nals = [n for n in split_annexb(annexb) if len(n) >= (1 if codec == "h264" else 2)]
    nals = [n for n in nals if _nal_type(codec, n) != _AUD[codec]]
    sets = [n for n in nals if _nal_type(codec, n) in _SETS[codec]]
    out: list[bytes] = []
    if len(sets) > 1 and 1 + sum(2 + len(n) for n in sets) + (1 if codec == "hevc" else 0) <= mtu:
        out.append(_aggregate(codec, sets))
        nals = [n for n in nals if _nal_type(codec, n) not in _SETS[codec]]
    for nal in nals:
        out += [nal] if len(nal) <= mtu else _fragments(codec, nal, mtu)
    return out


class RtpVideoPacketizer:
    """Access units -> RTP packets of one video stream (one SSRC, one sequence)."""

    def __init__(
        self, codec: VideoCodec, *, payload_type: int, ssrc: int, first_sequence: int = 0, mtu: int = DEFAULT_MTU
    ) -> None:
        self.codec: VideoCodec = codec
        self.payload_type = payload_type
        self.ssrc = ssrc
        self.mtu = mtu
        self.sequence = first_sequence & 0xFFFF  # of the next packet

    def packets(self, annexb: bytes, timestamp_90k: int) -> list[bytes]:
        """The RTP packets of one access unit at ``timestamp_90k`` (the marker on the last)."""
        payloads = video_payloads(self.codec, annexb, self.mtu)
        out = []
        for i, payload in enumerate(payloads):
            packet = bytearray(12 + len(payload))
            build_rtp_header(
                packet,
                payload_type=self.payload_type,
                sequence=self.sequence,
                timestamp=timestamp_90k & 0xFFFFFFFF,
                ssrc=self.ssrc,
                marker=i == len(payloads) - 1,
            )
            packet[12:] = payload
            out.append(bytes(packet))
            self.sequence = (self.sequence + 1) & 0xFFFF
        return out


__all__ = ["DEFAULT_MTU", "RtpVideoPacketizer", "VideoCodec", "video_payloads"]
