"""Test-side RTP packetisers fed with real encoder output (ffmpeg -> TS -> TsDemuxer access units).

The video payloads are the edge's own packetiser (``services/edge/core/pay``: RFC 6184 single
NAL, STAP-A for the parameter sets, FU-A above the MTU; RFC 7798 single NAL, AP, FU); the
audio ones follow RFC 3640 AAC-hbr (several AUs per
packet, a large AU fragmented) and RFC 6416 (one AudioMuxElement per frame, cpresent=0).
"""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass
from pathlib import Path

from services.edge.core.mux import TsDemuxer, build_asc, chunk_datagrams, parse_adts
from services.edge.core.mux.codec import AacConfig, split_annexb
from services.edge.core.mux.units import AccessUnit
from services.edge.core.pay import video_payloads
from services.edge.core.rtp import build_rtp_header
from tests.helpers.tools import need_tool

MTU = 1200
VIDEO_PT = 96
AUDIO_PT = 97
ENCODERS = {
    "h264": ["-c:v", "libx264", "-g", "25", "-bf", "2", "-pix_fmt", "yuv420p"],
    "hevc": ["-c:v", "libx265", "-x265-params", "log-level=error:bframes=2", "-g", "25", "-pix_fmt", "yuv420p"],
}


@dataclass
class Source:
    """Access units of an ffmpeg-made stream."""

    video: list[AccessUnit]
    audio: list[AccessUnit]
    codec: str


def encode(tmp: Path, codec: str, seconds: float = 2.0, extra: list[str] | None = None) -> Source:
    ffmpeg = need_tool("ffmpeg")
    path = tmp / f"src-{codec}.ts"
    cmd = [ffmpeg, "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"]
    cmd += ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000", "-t", str(seconds), *ENCODERS[codec]]
    cmd += [*(extra or []), "-c:a", "aac", "-ac", "2", "-f", "mpegts", str(path)]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)
    d = TsDemuxer()
    units: list[AccessUnit] = []
    for dgram in chunk_datagrams(path.read_bytes()):
        units += d.feed(dgram)
    units += d.flush()
    return Source([u for u in units if u.kind == "video"], [u for u in units if u.kind == "audio"], codec)


def rtp(seq: int, ts: int, marker: bool, payload: bytes, ssrc: int, pt: int) -> bytes:
    buf = bytearray(12 + len(payload))
    build_rtp_header(buf, payload_type=pt, sequence=seq, timestamp=ts, ssrc=ssrc, marker=marker)
    buf[12:] = payload
    return bytes(buf)


def h264_type(nal: bytes) -> int:
    return nal[0] & 0x1F


def hevc_type(nal: bytes) -> int:
    return (nal[0] >> 1) & 0x3F


def h264_payloads(au: bytes, mtu: int = MTU) -> list[bytes]:
    """RFC 6184 packetization-mode 1, by the edge's own packetiser (``core.pay``)."""
    return video_payloads("h264", au, mtu)


def hevc_payloads(au: bytes, mtu: int = MTU) -> list[bytes]:
    """RFC 7798, by the edge's own packetiser (``core.pay``)."""
    return video_payloads("hevc", au, mtu)


def sprop_h264(src: Source) -> dict[str, str]:
    nals = split_annexb(src.video[0].data)
    sets = [n for n in nals if h264_type(n) in (7, 8)]
    return {
        "packetization-mode": "1",
        "sprop-parameter-sets": ",".join(base64.b64encode(n).decode() for n in sets),
    }


def sprop_hevc(src: Source) -> dict[str, str]:
    nals = split_annexb(src.video[0].data)
    out = {}
    for name, t in (("sprop-vps", 32), ("sprop-sps", 33), ("sprop-pps", 34)):
        out[name] = ",".join(base64.b64encode(n).decode() for n in nals if hevc_type(n) == t)
    return out


def aac_config(src: Source) -> AacConfig:
    frame = parse_adts(src.audio[0].data)
    assert frame is not None
    return frame.config


def raw_aac(unit: AccessUnit) -> bytes:
    frame = parse_adts(unit.data)
    assert frame is not None
    return frame.raw


def hbr_fmtp(config: AacConfig) -> dict[str, str]:
    return {
        "streamtype": "5",
        "profile-level-id": "1",
        "mode": "AAC-hbr",
        "sizelength": "13",
        "indexlength": "3",
        "indexdeltalength": "3",
        "config": build_asc(config).hex(),
    }


def hbr_payload(frames: list[bytes]) -> bytes:
    """RFC 3640 §3.2: AU-headers-length, 16-bit AU-headers (13-bit size, 3-bit index 0), AUs."""
    headers = b"".join((len(f) << 3).to_bytes(2, "big") for f in frames)
    return (16 * len(frames)).to_bytes(2, "big") + headers + b"".join(frames)


def hbr_fragments(frame: bytes, size: int) -> list[bytes]:
    """One AU over several packets (§3.2.3): each carries the AU-header with the whole size."""
    header = (16).to_bytes(2, "big") + (len(frame) << 3).to_bytes(2, "big")
    return [header + frame[i : i + size] for i in range(0, len(frame), size)]


def stream_mux_config(config: AacConfig) -> bytes:
    """ISO/IEC 14496-3 §1.7.3.1 StreamMuxConfig, audioMuxVersion 0, one program/layer, frameLengthType 0."""
    asc = build_asc(config)
    bits = (
        "0" + "1" + "000000" + "0000" + "000"
    )  # version, allStreamsSameTimeFraming, numSubFrames, numProgram, numLayer
    bits += "".join(f"{b:08b}" for b in asc)[: 16 if not config.sbr else len(asc) * 8]
    bits += "000" + "11111111" + "0" + "0"  # frameLengthType, latmBufferFullness, otherDataPresent, crcCheckPresent
    bits += "0" * (-len(bits) % 8)
    return int(bits, 2).to_bytes(len(bits) // 8, "big")


def latm_fmtp(config: AacConfig) -> dict[str, str]:
    return {"profile-level-id": "30", "cpresent": "0", "object": "2", "config": stream_mux_config(config).hex()}


def latm_element(frame: bytes) -> bytes:
    """PayloadLengthInfo (0xFF run) + PayloadMux."""
    n = len(frame)
    return b"\xff" * (n // 255) + bytes([n % 255]) + frame


@dataclass
class Packet:
    track: int
    data: bytes
    arrival: float
    seq: int
    media: str


class Stream:
    """Packetises a Source into timed RTP packets of two tracks (0 video, 1 audio)."""

    def __init__(
        self,
        src: Source,
        *,
        audio_mode: str = "hbr",
        video_ts0: int = 0x12345678,
        audio_ts0: int = 0xFFFFF000,
        video_seq0: int = 65500,
        audio_seq0: int = 1000,
        audio_delay: float = 0.0,
        ssrc: tuple[int, int] = (0x11111111, 0x22222222),
        mtu: int = MTU,
    ) -> None:
        self.mtu = mtu
        self.src = src
        self.audio_mode = audio_mode
        self.video_ts0 = video_ts0
        self.audio_ts0 = audio_ts0
        self.seq = [video_seq0, audio_seq0]
        self.audio_delay = audio_delay
        self.ssrc = ssrc
        self.t0 = min(u.pts for u in src.video[:5])
        self.config = aac_config(src)

    def video_ts(self, pts: int) -> int:
        return (self.video_ts0 + pts - self.t0) & 0xFFFFFFFF

    def audio_ts(self, pts: int) -> int:
        return (self.audio_ts0 + (pts - self.t0) * 48000 // 90000) & 0xFFFFFFFF

    def _next(self, track: int) -> int:
        s = self.seq[track]
        self.seq[track] = (s + 1) & 0xFFFF
        return s

    def packets(self) -> list[Packet]:
        out: list[Packet] = []
        split = h264_payloads if self.src.codec == "h264" else hevc_payloads
        for unit in self.src.video:
            arrival = (unit.dts - self.t0) / 90000 + 0.05
            payloads = split(unit.data, self.mtu)
            for i, p in enumerate(payloads):
                seq = self._next(0)
                out.append(
                    Packet(
                        0,
                        rtp(seq, self.video_ts(unit.pts), i == len(payloads) - 1, p, self.ssrc[0], VIDEO_PT),
                        arrival,
                        seq,
                        "video",
                    )
                )
        audio = self.src.audio
        i = 0
        frag_done = False
        while i < len(audio):
            arrival = (audio[i].pts - self.t0) / 90000 + 0.05 + self.audio_delay
            ts = self.audio_ts(audio[i].pts)
            if self.audio_mode == "hbr":
                if not frag_done and i >= 10:  # one AU fragmented over three packets
                    frags = hbr_fragments(raw_aac(audio[i]), max(1, len(raw_aac(audio[i])) // 3 + 1))
                    for k, f in enumerate(frags):
                        seq = self._next(1)
                        out.append(
                            Packet(
                                1, rtp(seq, ts, k == len(frags) - 1, f, self.ssrc[1], AUDIO_PT), arrival, seq, "audio"
                            )
                        )
                    frag_done = True
                    i += 1
                    continue
                group = audio[i : i + 3]  # three AUs per packet
                seq = self._next(1)
                payload = hbr_payload([raw_aac(u) for u in group])
                out.append(Packet(1, rtp(seq, ts, True, payload, self.ssrc[1], AUDIO_PT), arrival, seq, "audio"))
                i += len(group)
            else:
                element = latm_element(raw_aac(audio[i]))
                parts = [element[k : k + 100] for k in range(0, len(element), 100)] if i % 7 == 3 else [element]
                for k, part in enumerate(parts):
                    seq = self._next(1)
                    out.append(
                        Packet(
                            1, rtp(seq, ts, k == len(parts) - 1, part, self.ssrc[1], AUDIO_PT), arrival, seq, "audio"
                        )
                    )
                i += 1
        out.sort(key=lambda p: p.arrival)  # stable: each track keeps its order
        return out

    def tracks(self) -> list:  # type: ignore[type-arg]
        from services.edge.core.depay import TrackSpec

        video_fmtp = sprop_h264(self.src) if self.src.codec == "h264" else sprop_hevc(self.src)
        audio = (
            TrackSpec(1, "audio", "mpeg4-generic", 48000, 2, hbr_fmtp(self.config))
            if self.audio_mode == "hbr"
            else TrackSpec(1, "audio", "MP4A-LATM", 48000, 2, latm_fmtp(self.config))
        )
        return [TrackSpec(0, "video", "H264" if self.src.codec == "h264" else "H265", 90000, None, video_fmtp), audio]
