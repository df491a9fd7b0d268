"""Media content analysis of a transport stream: programs, streams, codecs, bitrates. Sans-IO.

Fed by the TR 101 290 analyser (it is its ``PesSink``): the program map from PAT/PMT, and the
first bytes of PES packets on the PIDs whose codec parameters are not known yet. Once a PID's
header has been parsed it stops asking for bytes, and asks again every ``REPROBE_S`` seconds
so a change of format shows up. The field conventions are ffprobe's (docs/analysis.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from ..ts.packet import TS_PACKET_SIZE
from ..ts.psi import Pmt

if TYPE_CHECKING:
    from ..ts.tr101290 import Tr101290Analyzer

BITRATE_WINDOW_S: Final = 1.0
REPROBE_S: Final = 10.0

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
    probed_at: float | None = None  # arrival of the last successful header parse


class MediaAnalyser:
    """Programs and elementary streams of one flow, with per-PID and total bitrates."""

    def __init__(self) -> None:
        self._tr: Tr101290Analyzer | None = None
        self._streams: dict[int, _Stream] = {}
        self._program_count = 0
        self._samples: deque[tuple[float, npt.NDArray[np.int64]]] = deque()
        self._last_arrival: float | None = None

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
                kind, codec = STREAM_TYPES.get(es.stream_type, ("", f"0x{es.stream_type:02x}"))
                streams[es.pid] = _Stream(es.pid, es.stream_type, kind, codec, es.language, {})
        self._streams = streams

    def on_pes(self, pid: int, pusi: bool, data: bytes, pts: int | None, arrival: float) -> bool:
        return False

    # bitrates ------------------------------------------------------------------------
    def sample(self, now: float, counts: npt.NDArray[np.int64]) -> None:
        """Record the per-PID packet counts at ``now`` (called every ~250 ms of arrivals)."""
        self._last_arrival = now
        samples = self._samples
        samples.append((now, counts))
        while len(samples) > 2 and samples[1][0] <= now - BITRATE_WINDOW_S:
            samples.popleft()

    def _rates(self, now: float, counts: npt.NDArray[np.int64]) -> npt.NDArray[np.float64] | None:
        if not self._samples or self._last_arrival is None:
            return None
        if now - self._last_arrival > BITRATE_WINDOW_S:
            return np.zeros(counts.shape, dtype=np.float64)
        t0, c0 = self._samples[0]
        end = self._last_arrival
        dt = end - t0
        if dt <= 0:
            return None
        return (counts - c0).astype(np.float64) * (TS_PACKET_SIZE * 8) / dt

    def snapshot(self, now: float, counts: npt.NDArray[np.int64]) -> dict[str, object]:
        rates = self._rates(now, counts)
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
