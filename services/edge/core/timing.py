"""Inter-arrival time and packet delay variation meters, sans-IO (the caller owns the clock).

``IatMeter`` keeps min/max/mean of the gaps between datagram arrivals over a rolling window.
``JitterMeter`` is the RFC 3550 §6.4.1 interarrival jitter: an exponential filter (gain 1/16)
of |D(i-1, i)|, the change in transit time between consecutive packets. The sender's clock is
the RTP timestamp when the flow has one (90 kHz for MP2T, RFC 3551 §6), else the PCR the
packets carry (27 MHz, ISO/IEC 13818-1 §2.4.2.2): the same formula with the encoder's own
clock as the send time.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Final

import numpy as np
import numpy.typing as npt

_BUCKET_S: Final = 0.1


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

    def on_arrivals(self, arrivals: list[float]) -> None:
        for arrival in arrivals:
            self.on_arrival(arrival)

    def on_arrival_batch(self, arrivals: list[float]) -> None:
        """A batch of arrivals at once; its gaps go to the bucket of its last arrival.

        Cheaper than ``on_arrival`` per datagram (min/max/sum run in C); the same figures
        whenever a batch does not straddle a 100 ms bucket boundary.
        """
        if not arrivals:
            return
        last = self._last
        self._last = arrivals[-1]
        gaps = [b - a for a, b in pairwise(arrivals if last is None else [last, *arrivals])]
        if not gaps:
            return
        end = arrivals[-1]
        if not self._cur_start <= end < self._cur_end:
            self._roll(end)
        self._cur_min = min(self._cur_min, max(0.0, min(gaps)))
        self._cur_max = max(self._cur_max, max(gaps))
        self._cur_sum += sum(g for g in gaps if g > 0.0)
        self._cur_count += len(gaps)

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

        The filter J <- J + (|D| - J)/16 over k values is J_k = a^k J_0 + sum (1/16) a^(k-i) |D_i|
        with a = 15/16.
        """
        if arrivals.size == 0:
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
        ok = np.abs(dt_sender) <= self.MAX_STEP_S
        d = np.abs((cur_t - prev_t)[ok] - dt_sender[ok])
        k = d.size
        if not k:
            return
        decay = (15.0 / 16.0) ** np.arange(k - 1, -1, -1, dtype=np.float64)
        self._jitter = (15.0 / 16.0) ** k * self._jitter + float(np.dot(decay, d)) / 16.0
        self._samples += k

    @property
    def jitter_s(self) -> float | None:
        """The current estimate in seconds, or None before two comparable samples."""
        return self._jitter if self._samples else None
