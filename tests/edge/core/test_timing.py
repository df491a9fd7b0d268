from __future__ import annotations

import pytest

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
    batch.on_arrival_batch(arrivals[:1])
    batch.on_arrival_batch(arrivals[1:])
    a, b = one.stats(0.29), batch.stats(0.29)
    assert a is not None and b is not None
    assert a == pytest.approx(b)


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
