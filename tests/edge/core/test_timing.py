from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.edge.core.timing import IatMeter, JitterMeter


def test_iat_reports_a_50ms_gap() -> None:
    meter = IatMeter()
    for t in (0.000, 0.001, 0.002, 0.052):
        meter.on_arrival(t)
    stats = meter.stats(0.052)
    assert stats is not None
    lo, hi, avg = stats
    assert lo == pytest.approx(0.001)
    assert hi == pytest.approx(0.050)
    assert avg == pytest.approx(0.052 / 3)


def test_iat_window_rolls_and_none_before_two_arrivals() -> None:
    meter = IatMeter(window_s=1.0)
    meter.on_arrival(0.0)
    assert meter.stats(0.0) is None
    meter.on_arrival(0.5)  # a 500 ms gap
    for i in range(1, 100):
        meter.on_arrival(0.5 + i * 0.02)
    stats = meter.stats(2.48)
    assert stats is not None
    assert stats[1] == pytest.approx(0.02)  # the 500 ms gap left the window
    assert meter.stats(10.0) is None


def test_rtp_jitter_zero_for_a_perfect_sender_and_rfc3550_filter() -> None:
    meter = JitterMeter.for_rtp()
    assert meter.jitter_s is None
    for i in range(100):
        meter.on_sample(i * 0.001, (i * 90) & 0xFFFFFFFF)
    assert meter.jitter_s == pytest.approx(0.0, abs=1e-12)
    meter.on_sample(0.1 + 0.001, 100 * 90)  # 1 ms late: D = 1 ms, J += (1 ms - 0) / 16
    assert meter.jitter_s == pytest.approx(0.001 / 16)


def test_rtp_jitter_survives_timestamp_wrap() -> None:
    meter = JitterMeter.for_rtp()
    start = 0xFFFFFFFF - 450
    for i in range(20):
        meter.on_sample(i * 0.001, (start + i * 90) & 0xFFFFFFFF)
    assert meter.jitter_s == pytest.approx(0.0, abs=1e-12)


def test_pcr_jitter_measures_arrival_variation() -> None:
    meter = JitterMeter.for_pcr()
    for i in range(200):
        wobble = 0.0005 if i % 2 else 0.0
        meter.on_sample(i * 0.04 + wobble, i * 1_080_000)
    j = meter.jitter_s
    assert j is not None
    assert 0.0004 < j < 0.0011  # |D| alternates 0.5 ms: the filter settles near 1 ms


def test_iat_batch_equals_per_arrival_within_a_bucket() -> None:
    arrivals = [0.200 + 0.001 * i + (0.0004 if i % 3 else 0.0) for i in range(60)]
    one, batch = IatMeter(), IatMeter()
    for t in arrivals:
        one.on_arrival(t)
    batch.on_arrival_array(np.array(arrivals[:1]))
    batch.on_arrival_array(np.array(arrivals[1:]))
    a, b = one.stats(0.29), batch.stats(0.29)
    assert a is not None and b is not None
    assert a == b


def test_jitter_array_equals_the_sequential_filter() -> None:
    import numpy as np

    arrivals = [0.001 * i + (0.0003 * ((i * 7) % 5)) for i in range(200)]
    stamps = [(0xFFFFFF00 + 90 * i) & 0xFFFFFFFF for i in range(200)]
    seq, arr = JitterMeter.for_rtp(), JitterMeter.for_rtp()
    for t, s in zip(arrivals, stamps, strict=True):
        seq.on_sample(t, s)
    for i in range(0, 200, 64):
        arr.on_sample_array(np.asarray(arrivals[i : i + 64]), np.asarray(stamps[i : i + 64], dtype=np.int64))
    assert seq.jitter_s is not None and seq.jitter_s > 0
    assert arr.jitter_s == pytest.approx(seq.jitter_s, rel=1e-9)


# ------------------------------------------------------------------ batch methods == per item
def _arrival_lists(rng: random.Random, n: int) -> list[float]:
    """Arrivals with what kernels give: steady gaps, bursts, stalls across 100 ms buckets,
    now and then one out of order, some on round times (0.6 / 0.1 = 5.999...)."""
    t = rng.choice((0.0, 0.6, 1000.0, 12345.678))
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.01:
            t += rng.uniform(0.05, 0.7)  # a stall: a bucket or several go by
        elif r < 0.02:
            t = round(t + 0.1, 1)  # a round time on a bucket edge
        elif r < 0.03:
            out.append(t - rng.uniform(0.0, 0.0005))  # out of order
            continue
        else:
            t += rng.choice((0.0, 6.7e-6, 1e-5, 1e-3, rng.uniform(0.0, 2e-3)))
        out.append(t)
    return out


def _iat_state(meter: IatMeter) -> tuple[object, ...]:
    return tuple(getattr(meter, name) for name in IatMeter.__slots__)


def _batches(rng: random.Random, items: list[float], largest: int) -> list[list[float]]:
    out = []
    i = 0
    while i < len(items):
        n = rng.randint(1, largest)
        out.append(items[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(30))
def test_iat_batch_methods_equal_per_arrival_exactly(seed: int) -> None:
    rng = random.Random(seed)
    arrivals = _arrival_lists(rng, rng.choice((5, 200, 3000)))
    one, arrays = IatMeter(), IatMeter()
    largest = rng.choice((4, 64, 1100))
    for batch in _batches(rng, arrivals, largest):
        for t in batch:
            one.on_arrival(t)
        arrays.on_arrival_array(np.array(batch, dtype=np.float64))
        # The same state, bit for bit (sums added in the same order), after every batch.
        assert _iat_state(arrays) == _iat_state(one)
    for now in (arrivals[-1], arrivals[-1] + 0.25, arrivals[-1] + 0.95):
        assert one.stats(now) == arrays.stats(now)


def _jitter_samples(rng: random.Random, n: int) -> tuple[list[float], list[int]]:
    """A 90 kHz sender starting near the wrap, with network jitter, a stall, a restart (a
    timestamp jump over 1 s) and timestamps going backwards."""
    t = 50.0
    ts = 0xFFFFFFFF - rng.randrange(200_000)
    arrivals, stamps = [], []
    for _ in range(n):
        r = rng.random()
        step = rng.choice((0, 1, 90, 3000))
        if r < 0.01:
            step = rng.choice((200_000, -200_000, 1 << 31, 90_001, 90_000, -90_000))
        ts = (ts + step) & 0xFFFFFFFF
        t += step / 90_000 if 0 <= step <= 90_000 else 0.001
        t += rng.choice((0.0, 0.0, rng.uniform(0.0, 0.002)))
        if rng.random() < 0.005:
            t += rng.uniform(0.3, 0.8)  # a stall longer than the fast path's span
        arrivals.append(t)
        stamps.append(ts)
    return arrivals, stamps


@pytest.mark.parametrize("seed", range(30))
def test_jitter_batch_methods_equal_per_sample(seed: int) -> None:
    rng = random.Random(seed)
    arrivals, stamps = _jitter_samples(rng, rng.choice((3, 300, 2500)))
    one, arrays = JitterMeter.for_rtp(), JitterMeter.for_rtp()
    i = 0
    while i < len(arrivals):
        n = rng.randint(1, rng.choice((5, 64, 200, 1500)))
        a, s = arrivals[i : i + n], stamps[i : i + n]
        i += n
        for t, x in zip(a, s, strict=True):
            one.on_sample(t, x)
        arrays.on_sample_array(np.array(a, dtype=np.float64), np.array(s, dtype=np.int64))
        assert arrays._samples == one._samples
        assert arrays._last_sender == one._last_sender and arrays._last_arrival == one._last_arrival
        assert arrays._jitter == pytest.approx(one._jitter, rel=1e-12, abs=1e-18)


def test_jitter_batch_skips_steps_over_a_second_and_wraps() -> None:
    arrivals = [0.001 * i for i in range(100)]
    stamps = [(0xFFFFFF00 + 90 * i + (100_000 if i >= 50 else 0)) & 0xFFFFFFFF for i in range(100)]
    one, arrays = JitterMeter.for_rtp(), JitterMeter.for_rtp()
    for t, s in zip(arrivals, stamps, strict=True):
        one.on_sample(t, s)
    arrays.on_sample_array(np.array(arrivals), np.array(stamps, dtype=np.int64))
    assert one._samples == arrays._samples == 98  # the 1.1 s step is not jitter
    assert arrays.jitter_s == pytest.approx(one.jitter_s, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.01), st.integers(-100_000, 100_000)), min_size=1, max_size=300))
def test_jitter_arrays_equal_per_sample_on_any_steps(steps: list[tuple[float, int]]) -> None:
    t, ts = 7.0, 0xFFFFF000
    arrivals, stamps = [], []
    for gap, step in steps:
        t += gap
        ts = (ts + step) & 0xFFFFFFFF
        arrivals.append(t)
        stamps.append(ts)
    one, arrays = JitterMeter.for_rtp(), JitterMeter.for_rtp()
    for a, s in zip(arrivals, stamps, strict=True):
        one.on_sample(a, s)
    arrays.on_sample_array(np.array(arrivals[:1]), np.array(stamps[:1], dtype=np.int64))
    arrays.on_sample_array(np.array(arrivals[1:]), np.array(stamps[1:], dtype=np.int64))
    assert arrays._samples == one._samples
    assert arrays._jitter == pytest.approx(one._jitter, rel=1e-12, abs=1e-18)
