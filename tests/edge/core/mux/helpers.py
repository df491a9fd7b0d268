"""Shared bits of the mux tests: packet splitting, field readers and synthetic access units."""

from __future__ import annotations

from services.edge.core.mux.codec import AacConfig, build_adts_frame

TS = 188


def split(ts: bytes | bytearray) -> list[bytes]:
    assert len(ts) % TS == 0
    return [bytes(ts[i : i + TS]) for i in range(0, len(ts), TS)]


def pid_of(pkt: bytes) -> int:
    return ((pkt[1] & 0x1F) << 8) | pkt[2]


def pcr_of(pkt: bytes) -> int | None:
    if not pkt[3] & 0x20 or pkt[4] < 7 or not pkt[5] & 0x10:
        return None
    b = pkt[6:12]
    base = (b[0] << 25) | (b[1] << 17) | (b[2] << 9) | (b[3] << 1) | (b[4] >> 7)
    return base * 300 + (((b[4] & 1) << 8) | b[5])


def has_payload(pkt: bytes) -> bool:
    return bool(pkt[3] & 0x10)


# x264's SPS/PPS for 320x240 High@1.3 (from an ffmpeg 5.1 avcC record).
SPS = bytes.fromhex("6764000dacd94141fb011000000300100000030320f1429960")
PPS = bytes.fromhex("68ebe3cb22c0")


def h264_au(size: int, *, idr: bool, seed: int = 0) -> bytes:
    """A synthetic Annex B H.264 access unit: AUD, (SPS, PPS,) one slice of ``size`` bytes.

    The slice body avoids 00 00 0x so that it stays one NAL unit, as emulation prevention would.
    """
    body = bytes(((seed + i) % 251) + 1 for i in range(size))
    nals = [b"\x09\xf0"]
    if idr:
        nals += [SPS, PPS]
    nals.append(bytes([0x65 if idr else 0x41]) + body)
    return b"".join(b"\x00\x00\x00\x01" + n for n in nals)


AAC_LC_48K_STEREO = AacConfig(2, 48000, 2)


def adts(size: int, seed: int = 0, config: AacConfig = AAC_LC_48K_STEREO) -> bytes:
    return build_adts_frame(config, bytes((seed + i) % 256 for i in range(size)))
