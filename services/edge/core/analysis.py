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

# Below this many TS packets in one on_batch call the strided Python path is cheaper than the
# numpy path's fixed cost per batch (bench/analysis.py --paths): the engine's batches (<= 64
# datagrams) always take it (docs/analysis.md).
NUMPY_MIN_PACKETS = 1792
IAT_WINDOW_S: Final = 1.0
BITRATE_SAMPLE_S: Final = 0.25
TIMER_PERIOD_S: Final = 0.005
# Batches' arrivals (and RTP timestamps) fold into the IAT and jitter meters this many at a time.
TIMING_BLOCK = 1024


class FlowAnalysis:
    """Everything the stats snapshot reports about one flow's stream.

    ``on_datagram``/``on_batch``/``on_strided`` never raise: malformed input moves counters
    (TR 101 290 §5.2), and an internal failure is counted in ``internal_errors`` with its text
    in ``last_internal_error`` for the engine to log, so analysis never takes a flow off air.
    Payload views are not kept past the call. The three count the same: a batch gives the
    counters, IAT and jitter (to 1e-12) of its datagrams fed one by one (tests/edge/core/
    test_strided.py).
    """

    def __init__(self, *, media_analysis: bool, tr07_mode: bool = False, pid_timeout_s: float = 5.0) -> None:
        self._media = MediaAnalyser() if media_analysis else None
        self._tr = Tr101290Analyzer(pid_timeout_s=pid_timeout_s, tr07_mode=tr07_mode, sink=self._media)
        if self._media is not None:
            self._media.attach(self._tr)
        self._iat = IatMeter(IAT_WINDOW_S)
        self._rtp_jitter = JitterMeter.for_rtp()
        self._pending_t: list[float] = []  # arrivals not yet in the meters (see _timing)
        self._pending_s: list[int] = []  # their RTP timestamps, when _pending_rtp
        self._pending_rtp = False
        self._pcr_jitter = JitterMeter.for_pcr()
        self._pcr_resets_seen = 0
        self._has_rtp = False
        self._index = 0  # flow-wide TS packet number of the next packet
        self._next_sample = 0.0
        self._next_timers = 0.0
        self._last_arrival: float | None = None
        self.datagrams = 0
        self.internal_errors = 0
        self.last_internal_exception: Exception | None = None
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
            if self._pending_t:
                self._flush_timing()
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
        """The same as ``on_datagram`` for each datagram of a batch.

        Below ``NUMPY_MIN_PACKETS`` packets (every batch the engine makes), each run of
        datagrams of equal length is joined into one buffer (one copy) and analysed like
        ``on_strided``: the same counters as ``on_datagram``, timers included. Larger batches
        take the numpy path (its interval checks run once per batch). Never raises; the
        payloads are not kept.
        """
        try:
            if not payloads:
                return
            count = len(payloads)
            lens = list(map(len, payloads))
            if sum(lens) < NUMPY_MIN_PACKETS * TS_PACKET_SIZE:
                if count == 1:  # nothing to batch: the per-datagram path is cheaper
                    self.on_datagram(payloads[0], arrivals[0], rtp_timestamps[0])
                    return
                self.datagrams += count
                if None not in rtp_timestamps:
                    self._timing(arrivals, rtp_timestamps)  # type: ignore[arg-type]
                else:
                    self._timing(arrivals, None)
                    if rtp_timestamps.count(None) != count:  # some with RTP (the engine sends all or none)
                        self._flush_timing()
                        self._has_rtp = True
                        for arrival, stamp in zip(arrivals, rtp_timestamps, strict=False):
                            if stamp is not None:
                                self._rtp_jitter.on_sample(arrival, stamp)
                if min(lens) == max(lens):
                    self._strided(b"".join(payloads), 0, lens[0], lens[0], arrivals)
                    return
                start = 0
                while start < count:  # runs of equal length, in order
                    size = lens[start]
                    stop = start + 1
                    while stop < count and lens[stop] == size:
                        stop += 1
                    self._strided(b"".join(payloads[start:stop]), 0, size, size, arrivals[start:stop])
                    start = stop
                return
            self.datagrams += count
            first_len = lens[0]
            uniform = first_len % TS_PACKET_SIZE == 0 and min(lens) == max(lens)
            total = (first_len // TS_PACKET_SIZE) * len(lens) if uniform else sum(lens) // TS_PACKET_SIZE
            times_dg = np.asarray(arrivals, dtype=np.float64)
            self._flush_timing()
            self._iat.on_arrival_array(times_dg)
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

    def on_strided(
        self,
        buf: bytes | bytearray | memoryview,
        offset: int,
        stride: int,
        count: int,
        ts_bytes: int,
        arrivals: list[float],
        rtp_timestamps: list[int] | None,
    ) -> None:
        """``count`` datagrams whose TS payloads are ``buf[offset + k*stride : offset + k*stride
        + ts_bytes]`` (k = 0..count-1), arrived at ``arrivals[k]`` (monotonic seconds), with RTP
        timestamps (or None for raw UDP). Same counters as ``on_batch`` over those payloads;
        never raises; keeps no view.

        The engine's receive layout (recvmmsg into fixed slots of one buffer; all datagrams
        of a call of equal length). The counters, IAT and jitter are those of ``on_datagram``
        on each datagram in turn: the batch fast paths (``Tr101290Analyzer.feed_strided``,
        ``IatMeter.on_arrival_array``, ``JitterMeter.on_sample_array``) count the same, and the
        interval checks and bitrate samples run after the same datagrams. A ``ts_bytes`` that
        is not a multiple of 188 counts one truncated packet per datagram, as ``on_datagram``
        does. A layout that does not fit in ``buf`` (or fewer arrivals or timestamps than
        ``count``) is an internal error: nothing is counted. ``arrivals`` and
        ``rtp_timestamps`` may be longer than ``count`` (the rest is ignored).
        """
        try:
            if count == 1 and offset >= 0 and ts_bytes >= 0 and offset + ts_bytes <= len(buf) and arrivals:
                # Nothing to batch: the per-datagram path is cheaper.
                stamp = None if rtp_timestamps is None else rtp_timestamps[0]
                self.on_datagram(memoryview(buf)[offset : offset + ts_bytes], arrivals[0], stamp)
                return
            if count <= 0:
                return
            if (
                offset < 0
                or stride <= 0
                or ts_bytes < 0
                or offset + (count - 1) * stride + ts_bytes > len(buf)
                or len(arrivals) < count
                or (rtp_timestamps is not None and len(rtp_timestamps) < count)
            ):
                raise ValueError(f"on_strided: layout {offset}+{count}x{stride} ({ts_bytes} B) outside {len(buf)} B")
            if len(arrivals) > count:
                arrivals = arrivals[:count]
            self.datagrams += count
            self._timing(
                arrivals,
                rtp_timestamps if rtp_timestamps is None or len(rtp_timestamps) == count else rtp_timestamps[:count],
            )
            self._strided(buf, offset, stride, ts_bytes, arrivals)
        except Exception as exc:  # the interface's promise: the data plane never sees a raise
            self._internal(exc)

    def _timing(self, arrivals: list[float], rtp_timestamps: list[int] | None) -> None:
        """IAT of a batch, and its RTP jitter when it has timestamps.

        The arrivals (and timestamps) wait in lists until ``TIMING_BLOCK`` of them, a read or
        a per-datagram call, then fold in as arrays (``_flush_timing``): the meters' figures
        are those of per-datagram calls (IAT exactly, jitter to a few ulps), at a fraction of
        the cost (bench/analysis.py: converting 1024 floats and a dozen array operations cost
        less than the per-batch Python passes).
        """
        rtp = rtp_timestamps is not None
        if rtp:
            self._has_rtp = True
        if rtp != self._pending_rtp:
            self._flush_timing()
            self._pending_rtp = rtp
        pending = self._pending_t
        pending += arrivals
        if rtp_timestamps is not None:
            self._pending_s += rtp_timestamps
        if len(pending) >= TIMING_BLOCK:
            self._flush_timing()

    def _flush_timing(self) -> None:
        """Fold the waiting arrivals (and RTP timestamps) into the IAT and jitter meters."""
        pending = self._pending_t
        if not pending:
            return
        times = np.array(pending, dtype=np.float64)
        pending.clear()
        self._iat.on_arrival_array(times)
        if self._pending_rtp:
            self._rtp_jitter.on_sample_array(times, np.array(self._pending_s, dtype=np.int64))
            self._pending_s.clear()

    def _strided(
        self, buf: bytes | bytearray | memoryview, offset: int, stride: int, ts_bytes: int, arrivals: list[float]
    ) -> None:
        """The TS analysis of a strided batch (IAT and jitter are the caller's).

        ``on_datagram`` runs ``_after`` after every datagram, and ``_after`` only acts when
        the interval checks or a bitrate sample are due (the first arrival at or past
        ``_next_timers``/``_next_sample``) or PCR samples wait. So the batch is cut right after
        those datagrams (``feed_strided`` stops after a datagram that left PCR samples) and
        ``_after`` runs there and at the end: the same calls with the same state.
        """
        count = len(arrivals)
        n, rest = divmod(ts_bytes, TS_PACKET_SIZE)
        tr = self._tr
        if rest:
            tr.truncated_packets += count
        heads = tr.strided_headers(buf, offset, stride, count, n) if n else b""
        latest = max(arrivals)
        start = 0
        while start < count:
            due = self._next_timers
            if self._media is not None and self._next_sample < due:
                due = self._next_sample
            stop = count
            if latest >= due:  # cut after the first datagram arrived at or after ``due``
                stop = start
                while stop < count and arrivals[stop] < due:
                    stop += 1
                stop = min(stop + 1, count)
            if n:
                stop = tr.feed_strided(buf, offset, stride, n, arrivals, start, stop, self._index + start * n, heads)
            self._after(arrivals[stop - 1])
            start = stop
        self._index += count * n

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
        self.last_internal_exception = exc  # with its traceback: the engine logs and reports it

    def snapshot(self, now: float) -> dict[str, object]:
        """JSON-ready statistics at ``now`` (same clock as the arrivals).

        ``{"tr101290": {Tr101290Stats fields}, "media": {program_count, video_streams,
        audio_streams, total_bitrate_bps} or None when media analysis is off, "iat":
        {min_us, max_us, avg_us} or None before two datagrams, "pdv_jitter_us": float or None}``.
        """
        self._flush_timing()
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
