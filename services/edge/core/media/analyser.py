"""Media content analysis of a transport stream: programs, streams, codecs, bitrates. Sans-IO.

Fed by the TR 101 290 analyser (it is its ``PesSink``): the program map from PAT/PMT, and the
first bytes of PES packets on the PIDs whose codec parameters are not known yet. Once a PID's
header has been parsed it stops asking for bytes, and asks again every ``REPROBE_S`` seconds
so a change of format shows up. The field conventions are ffprobe's (docs/analysis.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from ..ts.packet import PTS_WRAP, TS_PACKET_SIZE
from ..ts.psi import DESC_AAC, DESC_AC3, DESC_EAC3, EsInfo, Pmt
from . import h264, hevc, mpeg2video
from .audio import AudioParams, find_ac3, find_adts, find_latm, find_mpeg_audio
from .h264 import VideoParams

if TYPE_CHECKING:
    from ..ts.tr101290 import Tr101290Analyzer

BITRATE_WINDOW_S: Final = 1.0
REPROBE_S: Final = 10.0
PROBE_BYTES: Final = 2048  # enough for AUD + VPS/SPS/PPS at the start of a keyframe's PES
_PTS_DELTAS: Final = 16

# ISO/IEC 13818-1 Table 2-34 and registrations: stream_type -> (kind, ffprobe codec name).
STREAM_TYPES: Final[dict[int, tuple[str, str]]] = {
    0x01: ("video", "mpeg1video"),
    0x02: ("video", "mpeg2video"),
    0x03: ("audio", "mp2"),
    0x04: ("audio", "mp2"),
    0x0F: ("audio", "aac"),
    0x10: ("video", "mpeg4"),
    0x11: ("audio", "aac_latm"),
    0x1B: ("video", "h264"),
    0x24: ("video", "hevc"),
    0x32: ("video", "jpegxs"),
    0x81: ("audio", "ac3"),
    0x87: ("audio", "eac3"),
}


@dataclass(slots=True)
class _Stream:
    pid: int
    stream_type: int
    kind: str  # "video", "audio" or "" (data / unknown)
    codec: str
    language: str | None
    params: dict[str, object]
    parser: str  # key of _PARSERS
    probed_at: float | None = None  # arrival of the last successful header parse
    buffer: bytearray | None = None  # ES bytes being collected from a PES start
    last_pts: int | None = None
    pts_deltas: deque[int] | None = None


class MediaAnalyser:
    """Programs and elementary streams of one flow, with per-PID and total bitrates."""

    def __init__(self) -> None:
        self._tr: Tr101290Analyzer | None = None
        self._streams: dict[int, _Stream] = {}
        self._program_count = 0
        self._samples: deque[tuple[float, npt.NDArray[np.int64]]] = deque()

    def attach(self, tr: Tr101290Analyzer) -> None:
        self._tr = tr

    # PesSink -------------------------------------------------------------------------
    def on_programs(self, pmts: dict[int, Pmt]) -> None:
        self._program_count = len(pmts)
        streams: dict[int, _Stream] = {}
        for prog in sorted(pmts):
            for es in pmts[prog].streams:
                old = self._streams.get(es.pid)
                if old is not None and old.stream_type == es.stream_type:
                    old.language = es.language
                    streams[es.pid] = old
                    continue
                kind, codec, parser = _classify(es)
                streams[es.pid] = _Stream(es.pid, es.stream_type, kind, codec, es.language, {}, parser)
        self._streams = streams

    def on_pes(self, pid: int, pusi: bool, data: bytes, pts: int | None, arrival: float) -> bool:
        """One ES packet's payload (PES header included at a PES start); answers whether the
        next packets of the PID are wanted (a header is being collected)."""
        st = self._streams.get(pid)
        if st is None or not st.parser:
            return False
        if pusi:
            if st.kind == "video" and pts is not None:
                self._on_video_pts(st, pts)
            if st.buffer is not None:
                self._probe(st, arrival)  # the previous PES ended before PROBE_BYTES
            if st.probed_at is not None and arrival - st.probed_at < REPROBE_S:
                return False
            es_start = pes_payload_start(data)
            if es_start is None:
                return False
            body = data[es_start:]
            if st.kind == "video" and not _VIDEO_START[st.parser](body):
                return False  # not a PES that starts with a sequence header / SPS
            st.buffer = bytearray(body)
        elif st.buffer is not None:
            st.buffer += data
        else:
            return False
        if len(st.buffer) >= (PROBE_BYTES if st.kind == "video" else 256):
            self._probe(st, arrival)
        return st.buffer is not None

    def _probe(self, st: _Stream, arrival: float) -> None:
        data = bytes(st.buffer or b"")
        st.buffer = None
        found = _PARSERS[st.parser](data)
        if found is None:
            return
        st.probed_at = arrival
        st.codec = found.codec
        if isinstance(found, VideoParams):
            rate = found.frame_rate if found.frame_rate is not None else st.params.get("pts_frame_rate")
            st.params.update(
                resolution=found.resolution,
                profile=found.profile,
                level=found.level,
                frame_rate=rate,
                sps_frame_rate=found.frame_rate,
            )
        else:
            st.params.update(sample_rate_hz=found.sample_rate_hz, channels=found.channels)

    def _on_video_pts(self, st: _Stream, pts: int) -> None:
        # Fallback frame rate when the stream's header carries none: the smallest PTS step
        # between PES starts (one picture per PES, as muxers send it).
        if st.last_pts is not None:
            delta = (pts - st.last_pts) % PTS_WRAP
            if 0 < delta < 90_000:
                if st.pts_deltas is None:
                    st.pts_deltas = deque(maxlen=_PTS_DELTAS)
                st.pts_deltas.append(delta)
                rate = round(90_000 / min(st.pts_deltas), 3)
                st.params["pts_frame_rate"] = rate
                if st.params.get("sps_frame_rate") is None and "resolution" in st.params:
                    st.params["frame_rate"] = rate
        st.last_pts = pts

    # bitrates ------------------------------------------------------------------------
    def sample(self, now: float, counts: npt.NDArray[np.int64]) -> None:
        """Record the per-PID packet counts at ``now`` (called every ~250 ms of arrivals)."""
        samples = self._samples
        samples.append((now, counts))
        while len(samples) > 2 and samples[1][0] <= now - BITRATE_WINDOW_S:
            samples.popleft()

    def _rates(
        self, now: float, counts: npt.NDArray[np.int64], last_arrival: float | None
    ) -> npt.NDArray[np.float64] | None:
        if not self._samples or last_arrival is None:
            return None
        if now - last_arrival > BITRATE_WINDOW_S:
            return np.zeros(counts.shape, dtype=np.float64)
        t0, c0 = self._samples[0]
        end = last_arrival
        dt = end - t0
        if dt <= 0:
            return None
        return (counts - c0).astype(np.float64) * (TS_PACKET_SIZE * 8) / dt

    def snapshot(self, now: float, counts: npt.NDArray[np.int64], last_arrival: float | None) -> dict[str, object]:
        """The media object of the stats snapshot; bitrates over the last second up to
        ``last_arrival`` (the packets counted in ``counts``), zero when the flow went quiet."""
        rates = self._rates(now, counts, last_arrival)
        video: list[dict[str, object]] = []
        audio: list[dict[str, object]] = []
        for pid in sorted(self._streams):
            st = self._streams[pid]
            bitrate = 0 if rates is None else round(float(rates[pid]))
            entry: dict[str, object] = {"pid": pid, "stream_type": st.stream_type, "codec": st.codec}
            if st.kind == "video":
                entry.update(
                    resolution=st.params.get("resolution"),
                    profile=st.params.get("profile"),
                    level=st.params.get("level"),
                    frame_rate=st.params.get("frame_rate"),
                    bitrate_bps=bitrate,
                )
                video.append(entry)
            elif st.kind == "audio":
                entry.update(
                    sample_rate_hz=st.params.get("sample_rate_hz"),
                    channels=st.params.get("channels"),
                    bitrate_bps=bitrate,
                    language=st.language,
                )
                audio.append(entry)
        total = 0 if rates is None else round(float(rates.sum()))
        return {
            "program_count": self._program_count,
            "video_streams": video,
            "audio_streams": audio,
            "total_bitrate_bps": total,
        }


def pes_payload_start(data: bytes) -> int | None:
    """Offset of the ES bytes after the PES header at the start of ``data`` (§2.4.3.7)."""
    if len(data) < 9 or data[0] != 0 or data[1] != 0 or data[2] != 1:
        return None
    if data[3] in (0xBC, 0xBE, 0xBF, 0xF0, 0xF1, 0xFF, 0xF2, 0xF8):
        return 6
    if data[6] & 0xC0 != 0x80:
        return None
    start = 9 + data[8]
    return start if start <= len(data) else None


_PARSERS: Final[dict[str, Callable[[bytes], VideoParams | AudioParams | None]]] = {
    "h264": h264.find_sps,
    "hevc": hevc.find_sps,
    "mpeg2": mpeg2video.find_sequence,
    "adts": find_adts,
    "latm": find_latm,
    "mpa": find_mpeg_audio,
    "ac3": find_ac3,
}
_VIDEO_START: Final[dict[str, Callable[[bytes], bool]]] = {
    "h264": h264.has_sps,
    "hevc": hevc.has_sps,
    "mpeg2": mpeg2video.has_sequence_header,
}
_PARSER_BY_TYPE: Final = {
    0x01: "mpeg2",
    0x02: "mpeg2",
    0x1B: "h264",
    0x24: "hevc",
    0x03: "mpa",
    0x04: "mpa",
    0x0F: "adts",
    0x11: "latm",
    0x81: "ac3",
    0x87: "ac3",
}


def _classify(es: EsInfo) -> tuple[str, str, str]:
    """(kind, codec name, parser) of a PMT entry, before its headers are seen."""
    if es.stream_type == 0x06:
        # ETSI EN 300 468 Annex D / H: AC-3, E-AC-3 and AAC in private PES, told by descriptor.
        tags = set(es.descriptor_tags)
        if DESC_EAC3 in tags or es.registration == "EAC3":
            return "audio", "eac3", "ac3"
        if DESC_AC3 in tags or es.registration == "AC-3":
            return "audio", "ac3", "ac3"
        if DESC_AAC in tags:
            return "audio", "aac", "adts"
        return "", "private", ""
    kind, codec = STREAM_TYPES.get(es.stream_type, ("", f"0x{es.stream_type:02x}"))
    return kind, codec, _PARSER_BY_TYPE.get(es.stream_type, "")
