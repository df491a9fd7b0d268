"""Inter-arrival time and packet delay variation meters, sans-IO (the caller owns the clock).

``IatMeter`` keeps min/max/mean of the gaps between datagram arrivals over a rolling window.
``JitterMeter`` is the RFC 3550 §6.4.1 interarrival jitter: an exponential filter (gain 1/16)
of |D(i-1, i)|, the change in transit time between consecutive packets. The sender's clock is
the RTP timestamp when the flow has one (90 kHz for MP2T, RFC 3551 §6), else the PCR the
packets carry (27 MHz, ISO/IEC 13818-1 §2.4.2.2): the same formula with the encoder's own
clock as the send time.

Both take one item at a time, or batches as numpy arrays (``on_arrival_array``,
``on_sample_array``): the IAT figures are the same bit for bit, the jitter to within 1e-12
relative (closed form of the filter). ``FlowAnalysis`` folds the engine's batches in 1024 at a
time: at the engine's batch sizes that measured about half the cost of pure-Python list forms
(which were removed for that reason).
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

_BUCKET_S: Final = 0.1
# RFC 3550 A.8's filter J <- J + (|D| - J) / 16 over k values, in closed form:
# J_k = a^k J_0 + sum_i a^(k-1-i) |D_i| / 16 with a = 15/16 (JitterMeter.on_sample_array).
_GAIN: Final = 15.0 / 16.0
_ARRAY_CHUNK: Final = 1024  # on_sample_array folds at most this many samples at once
_DECAY_NP: Final = _GAIN ** np.arange(_ARRAY_CHUNK - 1, -1, -1, dtype=np.float64)


class IatMeter:
    """Datagram inter-arrival times over the last ``window_s`` seconds (100 ms buckets).

    The current bucket's figures live in plain attributes (the per-datagram cost is a few
    compares); a finished bucket moves into a ring that ``stats`` folds in.
    """

    __slots__ = (
        "_buckets",
        "_count",
        "_cur",
        "_cur_count",
        "_cur_end",
        "_cur_max",
        "_cur_min",
        "_cur_start",
        "_cur_sum",
        "_last",
        "_max",
        "_min",
        "_n",
        "_sum",
    )

    def __init__(self, window_s: float = 1.0) -> None:
        n = max(1, round(window_s / _BUCKET_S))
        self._n = n
        self._buckets = [-1] * n  # bucket index held by each slot
        self._min = [0.0] * n
        self._max = [0.0] * n
        self._sum = [0.0] * n
        self._count = [0] * n
        self._last: float | None = None
        self._cur = -1
        self._cur_start = 0.0
        self._cur_end = 0.0  # an empty bucket: the first gap rolls
        self._cur_min = 0.0
        self._cur_max = 0.0
        self._cur_sum = 0.0
        self._cur_count = 0

    def _roll(self, arrival: float) -> None:
        if self._cur_count:
            slot = self._cur % self._n
            self._buckets[slot] = self._cur
            self._min[slot] = self._cur_min
            self._max[slot] = self._cur_max
            self._sum[slot] = self._cur_sum
            self._count[slot] = self._cur_count
        bucket = int(arrival / _BUCKET_S)
        self._cur = bucket
        self._cur_start = bucket * _BUCKET_S
        self._cur_end = self._cur_start + _BUCKET_S
        self._cur_min = float("inf")
        self._cur_max = 0.0
        self._cur_sum = 0.0
        self._cur_count = 0

    def on_arrival(self, arrival: float) -> None:
        """Record one datagram's arrival time (seconds, any monotonic origin)."""
        last = self._last
        self._last = arrival
        if last is None:
            return
        gap = arrival - last
        if gap < 0.0:  # kernel timestamps from two sockets may interleave: no negative gaps
            gap = 0.0
        if not self._cur_start <= arrival < self._cur_end:
            self._roll(arrival)
        if gap < self._cur_min:
            self._cur_min = gap
        if gap > self._cur_max:
            self._cur_max = gap
        self._cur_sum += gap
        self._cur_count += 1

    def on_arrival_array(self, arrivals: npt.NDArray[np.float64]) -> None:
        """``on_arrival`` for each arrival in turn (a float64 array), with the same figures.

        For arrivals in time order, each run of them inside one 100 ms bucket is found with
        ``searchsorted`` and folded in with numpy: min and max are exact, and ``cumsum``
        adds in order (sequentially, unlike ``sum``), so the running sum is the same float.
        A batch with a negative gap goes through ``on_arrival``.
        """
        n = arrivals.size
        if not n:
            return
        if self._last is None:
            self.on_arrival(float(arrivals[0]))
            arrivals = arrivals[1:]
            n -= 1
            if not n:
                return
        gaps = np.empty(n, dtype=np.float64)
        gaps[0] = arrivals[0] - self._last
        np.subtract(arrivals[1:], arrivals[:-1], out=gaps[1:])
        if gaps.min() < 0.0:
            for arrival in arrivals.tolist():
                self.on_arrival(arrival)
            return
        self._last = float(arrivals[-1])
        pos = 0
        while pos < n:
            a = float(arrivals[pos])
            if not self._cur_start <= a < self._cur_end:
                self._roll(a)
            if not self._cur_start <= a < self._cur_end:
                # Float rounding put a outside its own bucket (0.6 / 0.1 = 5.999...): as in
                # on_arrival, its gap goes to the new bucket, and the next arrival rolls again.
                end = pos + 1
            else:
                end = pos + int(np.searchsorted(arrivals[pos:], self._cur_end, "left"))
            seg = gaps[pos:end]
            lo = float(seg.min())
            hi = float(seg.max())
            if lo < self._cur_min:
                self._cur_min = lo
            if hi > self._cur_max:
                self._cur_max = hi
            acc = np.empty(end - pos + 1, dtype=np.float64)
            acc[0] = self._cur_sum
            acc[1:] = seg
            self._cur_sum = float(np.cumsum(acc)[-1])
            self._cur_count += end - pos
            pos = end

    def stats(self, now: float) -> tuple[float, float, float] | None:
        """(min, max, mean) gap in seconds over the window ending at ``now``; None when empty."""
        newest = int(now / _BUCKET_S)
        oldest = newest - self._n + 1
        lo = float("inf")
        hi = 0.0
        total = 0.0
        count = 0
        for slot in range(self._n):
            b = self._buckets[slot]
            if b < oldest or b > newest or b == self._cur or not self._count[slot]:
                continue
            lo = min(lo, self._min[slot])
            hi = max(hi, self._max[slot])
            total += self._sum[slot]
            count += self._count[slot]
        if self._cur_count and oldest <= self._cur <= newest:
            lo = min(lo, self._cur_min)
            hi = max(hi, self._cur_max)
            total += self._cur_sum
            count += self._cur_count
        if not count:
            return None
        return lo, hi, total / count


class JitterMeter:
    """RFC 3550 §6.4.1 interarrival jitter, fed RTP timestamps or PCRs (seconds out)."""

    __slots__ = ("_hz", "_jitter", "_last_arrival", "_last_sender", "_samples", "_wrap")

    # A sender-clock step larger than this is a new timeline (a restart or a splice), not jitter.
    MAX_STEP_S: Final = 1.0

    def __init__(self, clock_hz: int, wrap: int) -> None:
        self._hz = clock_hz
        self._wrap = wrap
        self._jitter = 0.0
        self._last_arrival = 0.0
        self._last_sender: int | None = None
        self._samples = 0

    @classmethod
    def for_rtp(cls) -> JitterMeter:
        return cls(90_000, 1 << 32)

    @classmethod
    def for_pcr(cls) -> JitterMeter:
        return cls(27_000_000, (1 << 33) * 300)

    def reset_reference(self) -> None:
        """Forget the previous sample (after a signalled discontinuity); keep the estimate."""
        self._last_sender = None

    def on_sample(self, arrival: float, sender_ticks: int) -> None:
        """One packet: its arrival (seconds) and its sender timestamp in clock ticks."""
        last = self._last_sender
        self._last_sender = sender_ticks
        prev_arrival = self._last_arrival
        self._last_arrival = arrival
        if last is None:
            return
        # RFC 3550 A.8: the timestamp difference is taken modulo the clock's wrap.
        half = self._wrap >> 1
        dt_sender = (((sender_ticks - last + half) % self._wrap) - half) / self._hz
        if abs(dt_sender) > self.MAX_STEP_S:
            return
        d = (arrival - prev_arrival) - dt_sender
        self._jitter += (abs(d) - self._jitter) / 16.0
        self._samples += 1

    def on_sample_array(self, arrivals: npt.NDArray[np.float64], sender_ticks: npt.NDArray[np.int64]) -> None:
        """A batch of samples; the same result as ``on_sample`` on each, in closed form.

        The filter J <- J + (|D| - J)/16 over k values is J_k = a^k J_0 + sum (1/16) a^(k-1-i) |D_i|
        with a = 15/16. D_i, the A.8 modular step and the MAX_STEP_S skip are computed as in
        ``on_sample`` (the same float operations); the sum differs from the sequential filter by
        a few ulps (non-negative terms, at most _ARRAY_CHUNK of them at a time).
        """
        size = arrivals.size
        if size > _ARRAY_CHUNK:
            for i in range(0, size, _ARRAY_CHUNK):
                self.on_sample_array(arrivals[i : i + _ARRAY_CHUNK], sender_ticks[i : i + _ARRAY_CHUNK])
            return
        if size == 0:
            return
        last = self._last_sender
        if last is None:
            prev_t = arrivals[:-1]
            prev_s = sender_ticks[:-1]
            cur_t = arrivals[1:]
            cur_s = sender_ticks[1:]
        else:
            prev_t = np.concatenate(([self._last_arrival], arrivals[:-1]))
            prev_s = np.concatenate(([last], sender_ticks[:-1]))
            cur_t = arrivals
            cur_s = sender_ticks
        self._last_sender = int(sender_ticks[-1])
        self._last_arrival = float(arrivals[-1])
        if cur_t.size == 0:
            return
        half = self._wrap >> 1
        dt_sender = (((cur_s - prev_s + half) % self._wrap) - half) / self._hz
        d = np.abs((cur_t - prev_t) - dt_sender)
        ok = np.abs(dt_sender) <= self.MAX_STEP_S
        k = d.size
        if not ok.all():
            d = d[ok]
            k = d.size
            if not k:
                return
        self._jitter = _GAIN**k * self._jitter + float(np.dot(_DECAY_NP[-k:], d)) / 16.0
        self._samples += k

    @property
    def jitter_s(self) -> float | None:
        """The current estimate in seconds, or None before two comparable samples."""
        return self._jitter if self._samples else None
