"""One flow's stream analysis: TR 101 290, media content, IAT and PDV, behind one small facade.

The engine calls ``FlowAnalysis`` from its data-plane task for every datagram or batch, and
``snapshot`` once per stats tick. Sans-IO (style H1, H2): no sockets, clock or trio here; the
engine passes kernel receive times. See docs/analysis.md for every indicator, window and limit.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from .media.analyser import MediaAnalyser
from .timing import IatMeter, JitterMeter
from .ts.packet import TS_PACKET_SIZE
from .ts.tr101290 import Tr101290Analyzer

# Below this many TS packets in one call the Python loop is cheaper than the numpy path's
# fixed cost per batch. bench/analysis.py on this project's 2-core machine (busy, CPU time):
# at the engine's batches (<= 64 datagrams) Python is 1.5-20x faster, and numpy at best ties
# near 128-256 datagrams, so the engine always takes the Python path (docs/analysis.md).
NUMPY_MIN_PACKETS = 1792
IAT_WINDOW_S: Final = 1.0
BITRATE_SAMPLE_S: Final = 0.25
TIMER_PERIOD_S: Final = 0.005


class FlowAnalysis:
    """Everything the stats snapshot reports about one flow's stream.

    ``on_datagram``/``on_batch`` never raise: malformed input moves counters (TR 101 290 §5.2),
    and an internal failure is counted in ``internal_errors`` with its text in
    ``last_internal_error`` for the engine to log, so analysis never takes a flow off air.
    Payload views are not kept past the call.
    """

    def __init__(self, *, media_analysis: bool, tr07_mode: bool = False, pid_timeout_s: float = 5.0) -> None:
        self._media = MediaAnalyser() if media_analysis else None
        self._tr = Tr101290Analyzer(pid_timeout_s=pid_timeout_s, tr07_mode=tr07_mode, sink=self._media)
        if self._media is not None:
            self._media.attach(self._tr)
        self._iat = IatMeter(IAT_WINDOW_S)
        self._rtp_jitter = JitterMeter.for_rtp()
        self._pcr_jitter = JitterMeter.for_pcr()
        self._pcr_resets_seen = 0
        self._has_rtp = False
        self._index = 0  # flow-wide TS packet number of the next packet
        self._next_sample = 0.0
        self._next_timers = 0.0
        self._last_arrival: float | None = None
        self.datagrams = 0
        self.internal_errors = 0
        self.last_internal_error: str | None = None

    @property
    def tr101290(self) -> Tr101290Analyzer:
        return self._tr

    def on_datagram(self, payload: memoryview, arrival: float, rtp_timestamp: int | None) -> None:
        """Analyse one datagram's TS bytes (normally 7 x 188) that arrived at ``arrival``.

        ``arrival`` is monotonic seconds (the kernel receive time); ``rtp_timestamp`` the RTP
        header's timestamp, or None for raw UDP. Never raises; ``payload`` is not kept.
        """
        try:
            self.datagrams += 1
            self._iat.on_arrival(arrival)
            if rtp_timestamp is not None:
                self._has_rtp = True
                self._rtp_jitter.on_sample(arrival, rtp_timestamp)
            n, rest = divmod(len(payload), TS_PACKET_SIZE)
            if rest:
                self._tr.truncated_packets += 1
            if n:
                self._tr.feed_packets(payload, n, arrival, self._index)
                self._index += n
            self._after(arrival)
        except Exception as exc:  # the interface's promise: the data plane never sees a raise
            self._internal(exc)

    def on_batch(self, payloads: list[memoryview], arrivals: list[float], rtp_timestamps: list[int | None]) -> None:
        """The same as ``on_datagram`` for each datagram of a batch (the fast path).

        Large batches go through the numpy path, small ones through the Python loop; the
        counters are the same either way. Never raises; the payloads are not kept.
        """
        try:
            if not payloads:
                return
            self.datagrams += len(payloads)
            total_bytes = sum(map(len, payloads))
            if total_bytes < NUMPY_MIN_PACKETS * TS_PACKET_SIZE:
                on_arrival = self._iat.on_arrival
                tr = self._tr
                jitter = self._rtp_jitter
                index = self._index
                for payload, arrival, stamp in zip(payloads, arrivals, rtp_timestamps, strict=False):
                    on_arrival(arrival)
                    if stamp is not None:
                        self._has_rtp = True
                        jitter.on_sample(arrival, stamp)
                    n, rest = divmod(len(payload), TS_PACKET_SIZE)
                    if rest:
                        tr.truncated_packets += 1
                    if n:
                        tr.feed_packets(payload, n, arrival, index)
                        index += n
                self._index = index
                self._after(arrivals[-1])
                return
            lens = list(map(len, payloads))
            first_len = lens[0]
            uniform = first_len % TS_PACKET_SIZE == 0 and min(lens) == max(lens)
            total = (first_len // TS_PACKET_SIZE) * len(lens) if uniform else sum(lens) // TS_PACKET_SIZE
            times_dg = np.asarray(arrivals, dtype=np.float64)
            self._iat.on_arrival_batch(arrivals)
            self._rtp_samples(arrivals, rtp_timestamps, times_dg)
            if uniform:
                joined = b"".join(payloads)
                per = first_len // TS_PACKET_SIZE
                times = np.repeat(times_dg, per)
            else:
                counts = [length // TS_PACKET_SIZE for length in lens]
                self._tr.truncated_packets += sum(1 for length in lens if length % TS_PACKET_SIZE)
                joined = b"".join(p[: n * TS_PACKET_SIZE] for p, n in zip(payloads, counts, strict=False))
                total = sum(counts)
                times = np.repeat(times_dg, counts)
            if total:
                packets = np.frombuffer(joined, dtype=np.uint8).reshape(total, TS_PACKET_SIZE)
                self._tr.feed_array(packets, times, self._index)
                self._index += total
            self._after(arrivals[-1])
        except Exception as exc:
            self._internal(exc)

    def _rtp_samples(
        self, arrivals: list[float], stamps: list[int | None], times: npt.NDArray[np.float64] | None
    ) -> None:
        if stamps[0] is None and stamps[-1] is None:
            return  # raw UDP (the engine sends all or none)
        self._has_rtp = True
        if times is not None and None not in stamps:
            self._rtp_jitter.on_sample_array(times, np.asarray(stamps, dtype=np.int64))
            return
        for arrival, ts in zip(arrivals, stamps, strict=False):
            if ts is not None:
                self._rtp_jitter.on_sample(arrival, ts)

    def _after(self, now: float) -> None:
        self._last_arrival = now
        tr = self._tr
        if now >= self._next_timers:
            # Interval checks every TIMER_PERIOD_S of arrival time, not per datagram: a late
            # table or PID is then counted at most that much later (one error per gap either way).
            self._next_timers = now + TIMER_PERIOD_S
            tr.check_timers(now)
        if tr.pcr_samples:
            if not self._has_rtp:
                if tr.pcr_resets != self._pcr_resets_seen:
                    self._pcr_resets_seen = tr.pcr_resets
                    self._pcr_jitter.reset_reference()
                for arrival, pcr in tr.pcr_samples:
                    self._pcr_jitter.on_sample(arrival, pcr)
            tr.pcr_samples.clear()
        if self._media is not None and now >= self._next_sample:
            self._next_sample = now + BITRATE_SAMPLE_S
            self._media.sample(now, tr.pid_packet_counts())

    def _internal(self, exc: Exception) -> None:
        self.internal_errors += 1
        self.last_internal_error = f"{type(exc).__name__}: {exc}"

    def snapshot(self, now: float) -> dict[str, object]:
        """JSON-ready statistics at ``now`` (same clock as the arrivals).

        ``{"tr101290": {Tr101290Stats fields}, "media": {program_count, video_streams,
        audio_streams, total_bitrate_bps} or None when media analysis is off, "iat":
        {min_us, max_us, avg_us} or None before two datagrams, "pdv_jitter_us": float or None}``.
        """
        iat = self._iat.stats(now)
        jitter = (self._rtp_jitter if self._has_rtp else self._pcr_jitter).jitter_s
        media = None
        if self._media is not None:
            media = self._media.snapshot(now, self._tr.pid_packet_counts(), self._last_arrival)
        return {
            "tr101290": self._tr.counters(now),
            "media": media,
            "iat": None if iat is None else {"min_us": iat[0] * 1e6, "max_us": iat[1] * 1e6, "avg_us": iat[2] * 1e6},
            "pdv_jitter_us": None if jitter is None else jitter * 1e6,
        }


__all__ = ["FlowAnalysis"]
