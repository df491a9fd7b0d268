"""RTP video depacketisers: H.264 (RFC 6184) and H.265/HEVC (RFC 7798). Sans-IO.

Both rebuild access units from RTP payloads and answer them as Annex B byte streams, an
access unit delimiter first and the parameter sets in front of every keyframe that lacks them
(:class:`ParameterSetInserter`, ISO/IEC 13818-1 §2.14 / §2.17 expect both in a TS).

**Payload structures.** H.264 (RFC 6184 §5.2, packetization-mode 0 and 1): single NAL unit
packets (types 1-23, §5.6), STAP-A (24, §5.7.1) and FU-A (28, §5.8). STAP-B, MTAP16/24 and
FU-B (25, 26, 27, 29) belong to the interleaved mode 2, which is not supported: they are
counted in ``stats.unsupported_packets`` and skipped. HEVC (RFC 7798 §4.4): single NAL unit
packets (types 0-47, §4.4.1), aggregation packets (48, §4.4.2) and fragmentation units (49,
§4.4.3); PACI (50, §4.4.4) is unsupported. A stream with ``sprop-max-don-diff`` > 0 carries
DONL fields (§4.5, §7.1) and is refused in the constructor (ValueError).

**Access unit boundaries.** An access unit ends on the marker bit (RFC 6184 §5.1, RFC 7798
§4.1: set on the last packet of an access unit) or when the RTP timestamp changes (all the
packets of one access unit share its timestamp), whichever comes first.

**Loss.** A sequence number gap inside an access unit, a fragmentation unit without its start
or end, an unparseable payload or a unit past ``MAX_UNIT_BYTES`` drop that access unit only
(``stats.lost_units``). A gap just before a new timestamp is taken as the lost tail of the
previous unit when that one was not closed by a marker; otherwise the new unit is kept unless
it starts with a fragment continuation.

**Parameter sets.** Out-of-band sets come from the SDP fmtp: ``sprop-parameter-sets`` (RFC
6184 §8.1, base64, comma-separated) or ``sprop-vps``/``sprop-sps``/``sprop-pps`` (RFC 7798
§7.1). Missing, undecodable or unparsable sets are ignored: in-band sets (which also replace
the out-of-band ones) are used instead. Access units without a slice (parameter sets or SEI
sent alone) are carried into the next access unit. Video before the first keyframe that a
decoder can start from (an IDR/IRAP with known parameter sets) is dropped and counted in
``stats.before_keyframe``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

from ..media import h264 as h264_media
from ..media import hevc as hevc_media
from ..mux.codec import (
    H264_NAL_AUD,
    H264_NAL_PPS,
    H264_NAL_SPS,
    HEVC_NAL_AUD,
    HEVC_NAL_PPS,
    HEVC_NAL_VPS,
    ParameterSetInserter,
    ParameterSets,
    VideoCodec,
    is_random_access,
    is_vcl,
    join_annexb,
    nal_type,
)
from .common import MAX_UNIT_BYTES, DepayStats, Frame, normalise_fmtp, seq_next

# RFC 6184 Table 1 / §5.4: payload structure types.
H264_STAP_A: Final = 24
H264_STAP_B: Final = 25
H264_MTAP16: Final = 26
H264_MTAP24: Final = 27
H264_FU_A: Final = 28
H264_FU_B: Final = 29
# RFC 7798 §4.4.
HEVC_AP: Final = 48
HEVC_FU: Final = 49
HEVC_PACI: Final = 50
MAX_CARRIED_NALS: Final = 32  # non-slice NAL units carried to the next access unit
MAX_CARRIED_BYTES: Final = 1 << 20  # ... and their bytes


def decode_sprop(value: str | None) -> list[bytes]:
    """The NAL units of a comma-separated base64 fmtp value; undecodable parts are skipped."""
    out: list[bytes] = []
    for part in (value or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            nal = base64.b64decode(part + "=" * (-len(part) % 4), validate=True)
        except (binascii.Error, ValueError):
            continue
        if nal:
            out.append(nal)
    return out


class _NalDepacketizer:
    """Access unit assembly shared by the H.264 and HEVC depacketisers."""

    media = "video"
    clock_rate = 90_000  # RFC 6184 §8.2.1 / RFC 7798 §7.1: the video RTP clock is 90 kHz

    def __init__(self, codec: VideoCodec, sets: ParameterSets) -> None:
        self.codec: VideoCodec = codec
        self.stats = DepayStats()
        self.inserter = ParameterSetInserter(codec, sets if sets.complete else None)
        self._ts: int | None = None  # RTP timestamp of the unit in progress
        self._nals: list[bytes] = []
        self._size = 0
        self._broken = False
        self._fu: bytearray | None = None  # fragmented NAL unit in progress
        self._last_seq: int | None = None
        self._carry: list[bytes] = []  # non-slice NAL units waiting for the next slice
        self._started = False

    def push(self, seq: int, timestamp: int, marker: bool, payload: bytes | memoryview) -> list[Frame]:
        """One RTP payload (header removed) with its header fields: the units it completes."""
        out: list[Frame] = []
        gap = self._last_seq is not None and seq != seq_next(self._last_seq)
        self._last_seq = seq & 0xFFFF
        timestamp &= 0xFFFFFFFF
        if self._ts is not None and timestamp != self._ts:
            if gap:
                self._broken = True  # the lost packets were (probably) the tail of this unit
            self._finish(out)
        elif gap and self._ts is not None:
            self._broken = True  # a hole inside the unit
        self._ts = timestamp
        self._depay(bytes(payload))
        if self._size > MAX_UNIT_BYTES:
            self._broken = True
            self._nals.clear()
            self._fu = None
            self._size = 0
        if marker:
            self._finish(out)
        return out

    def flush(self) -> list[Frame]:
        """End of stream: the unit in progress, when it is whole (no fragment pending)."""
        out: list[Frame] = []
        if self._ts is not None:
            self._finish(out)
        return out

    # -- payload parsing (per codec) ------------------------------------------------------

    def _depay(self, payload: bytes) -> None:
        raise NotImplementedError

    def _add(self, nal: bytes) -> None:
        if not self._broken:
            self._nals.append(nal)
            self._size += len(nal) + 4

    def _bad(self) -> None:
        self.stats.bad_packets += 1
        self._broken = True

    def _aggregate(self, payload: bytes, pos: int) -> None:
        """The NAL units of an STAP-A (RFC 6184 §5.7.1) / AP (RFC 7798 §4.4.2): 16-bit size + NAL."""
        n = len(payload)
        nals: list[bytes] = []
        while pos < n:
            if pos + 2 > n:
                self._bad()
                return
            size = (payload[pos] << 8) | payload[pos + 1]
            pos += 2
            if size == 0 or pos + size > n:
                self._bad()
                return
            nals.append(payload[pos : pos + size])
            pos += size
        if not nals:
            self._bad()
            return
        for nal in nals:
            self._add(nal)

    def _fragment(self, start: bool, end: bool, header: bytes, data: bytes) -> None:
        """One fragmentation unit (RFC 6184 §5.8 FU-A, RFC 7798 §4.4.3 FU)."""
        if start and end:  # both bits set: RFC 6184 §5.8 / RFC 7798 §4.4.3 forbid it
            self._bad()
            self._fu = None
            return
        if start:
            if self._fu is not None:
                self._broken = True  # the previous fragmented NAL unit never ended
            self._fu = bytearray(header)
            self._fu += data
        else:
            if self._fu is None:
                self._broken = True  # its start was lost
                return
            self._fu += data
            if end:
                self._add(bytes(self._fu))
                self._fu = None
        if self._fu is not None:
            self._size += len(data)

    # -- access unit completion ----------------------------------------------------------

    def _finish(self, out: list[Frame]) -> None:
        ts = self._ts
        if self._fu is not None:
            self._broken = True  # a fragmented NAL unit without its end
        nals, broken = self._nals, self._broken
        self._nals, self._size, self._broken, self._fu, self._ts = [], 0, False, None, None
        if broken:
            self.stats.lost_units += 1
            return
        if not nals or ts is None:
            return
        codec = self.codec
        types = [nal_type(codec, nal) for nal in nals]
        if not any(is_vcl(codec, t) for t in types):
            # parameter sets / SEI alone (some cameras send them under their own timestamp)
            aud = H264_NAL_AUD if codec == "h264" else HEVC_NAL_AUD
            kept = [n for n, t in zip(nals, types, strict=True) if t != aud]  # one AUD per unit
            carry = (self._carry + kept)[-MAX_CARRIED_NALS:]
            while sum(len(n) for n in carry) > MAX_CARRIED_BYTES:
                carry.pop(0)
            self._carry = carry
            return
        if self._carry:
            at = 1 if types[0] == (H264_NAL_AUD if codec == "h264" else HEVC_NAL_AUD) else 0
            nals = [*nals[:at], *self._carry, *nals[at:]]  # after the unit's own AUD
            self._carry = []
            types = [nal_type(codec, nal) for nal in nals]
        keyframe = any(is_vcl(codec, t) and is_random_access(codec, t) for t in types)
        data = self.inserter.process(join_annexb(nals))
        if not self._started:
            if not keyframe or self.inserter.parameter_sets is None:
                self.stats.before_keyframe += 1
                return
            self._started = True
        self.stats.units += 1
        out.append(Frame(data, ts, keyframe))


class H264Depacketizer(_NalDepacketizer):
    """RFC 6184 H.264 RTP payloads (packetization-mode 0/1) -> Annex B access units."""

    def __init__(self, fmtp: dict[str, str] | None = None) -> None:
        params = normalise_fmtp(fmtp or {})
        mode = params.get("packetization-mode", "0")
        if mode not in ("0", "1"):
            raise ValueError(f"H.264 packetization-mode {mode} is not supported (only 0 and 1: no interleaving)")
        sps: list[bytes] = []
        pps: list[bytes] = []
        for nal in decode_sprop(params.get("sprop-parameter-sets")):
            t = nal[0] & 0x1F
            if t == H264_NAL_SPS and h264_media.parse_sps(nal) is not None:
                sps.append(nal)
            elif t == H264_NAL_PPS and len(nal) >= 2 and not nal[0] & 0x80:
                pps.append(nal)
        super().__init__("h264", ParameterSets(sps=tuple(sps), pps=tuple(pps)))

    def _depay(self, payload: bytes) -> None:
        n = len(payload)
        if n < 1 or payload[0] & 0x80:  # empty, or forbidden_zero_bit set (RFC 6184 §5.3)
            self._bad()
            return
        t = payload[0] & 0x1F
        if 1 <= t <= 23:  # §5.6 single NAL unit packet
            self._add(payload)
        elif t == H264_STAP_A:  # §5.7.1
            self._aggregate(payload, 1)
        elif t == H264_FU_A:  # §5.8: FU indicator, FU header (S, E, R, type)
            if n < 3:
                self._bad()
                return
            fu = payload[1]
            header = bytes([(payload[0] & 0xE0) | (fu & 0x1F)])  # F and NRI from the indicator
            self._fragment(bool(fu & 0x80), bool(fu & 0x40), header, payload[2:])
        elif t in (H264_STAP_B, H264_MTAP16, H264_MTAP24, H264_FU_B):
            self.stats.unsupported_packets += 1  # interleaved mode (2) only
        else:  # 0, 30, 31: reserved / undefined
            self._bad()


class HevcDepacketizer(_NalDepacketizer):
    """RFC 7798 H.265 RTP payloads (no DONL) -> Annex B access units."""

    def __init__(self, fmtp: dict[str, str] | None = None) -> None:
        params = normalise_fmtp(fmtp or {})
        don = params.get("sprop-max-don-diff", "0")
        if don not in ("", "0"):
            raise ValueError(
                f"HEVC with sprop-max-don-diff={don} (DONL fields, RFC 7798 §4.5) is not supported: "
                "configure the camera for non-interleaved RTP (sprop-max-don-diff 0)"
            )
        if params.get("sprop-depack-buf-nalus", "0") not in ("", "0"):
            raise ValueError("HEVC with sprop-depack-buf-nalus > 0 (interleaved, RFC 7798 §7.1) is not supported")
        vps = [n for n in decode_sprop(params.get("sprop-vps")) if len(n) > 2 and (n[0] >> 1) & 0x3F == HEVC_NAL_VPS]
        sps = [n for n in decode_sprop(params.get("sprop-sps")) if hevc_media.parse_sps(n) is not None]
        pps = [n for n in decode_sprop(params.get("sprop-pps")) if len(n) > 2 and (n[0] >> 1) & 0x3F == HEVC_NAL_PPS]
        super().__init__("hevc", ParameterSets(tuple(vps), tuple(sps), tuple(pps)))

    def _depay(self, payload: bytes) -> None:
        n = len(payload)
        if n < 3 or payload[0] & 0x80 or (payload[1] & 0x07) == 0:
            self._bad()  # too short, forbidden_zero_bit, or nuh_temporal_id_plus1 = 0 (RFC 7798 §1.1.4)
            return
        t = (payload[0] >> 1) & 0x3F
        if t < HEVC_AP:  # §4.4.1 single NAL unit packet
            self._add(payload)
        elif t == HEVC_AP:  # §4.4.2, no DONL/DOND (sprop-max-don-diff = 0)
            self._aggregate(payload, 2)
        elif t == HEVC_FU:  # §4.4.3: payload header, FU header (S, E, FuType)
            if n < 4:
                self._bad()
                return
            fu = payload[2]
            header = bytes([(payload[0] & 0x81) | ((fu & 0x3F) << 1), payload[1]])
            self._fragment(bool(fu & 0x80), bool(fu & 0x40), header, payload[3:])
        else:  # 50 PACI (§4.4.4), 51-63 unspecified
            self.stats.unsupported_packets += 1


__all__ = ["H264Depacketizer", "HevcDepacketizer", "decode_sprop"]
