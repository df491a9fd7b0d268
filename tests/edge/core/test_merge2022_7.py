"""SMPTE 2022-7 merger core: independent loss, dead legs, path differential, wrap, SSRC, garbage."""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.edge.core.merge2022_7 import HitlessMerger, LegLost, LegRestored
from tests.edge.core.fec.helpers import media, stream


def drain(m: HitlessMerger) -> list[bytes]:
    return list(iter(m.pop_output, None))


def run(
    packets: list[bytes],
    *,
    drop: tuple[set[int], set[int]] = (set(), set()),
    delay_s: tuple[float, float] = (0.0, 0.0),
    step_s: float = 0.001,
    window_s: float = 0.050,
) -> tuple[list[bytes], HitlessMerger]:
    """Feed both legs with per-leg drops and a fixed extra delay per leg, in arrival order."""
    m = HitlessMerger(window_s=window_s, leg_timeout_s=0.02)
    arrivals = sorted(
        (i * step_s + delay_s[leg], leg, i) for leg in (0, 1) for i in range(len(packets)) if i not in drop[leg]
    )
    out: list[bytes] = []
    for t, leg, i in arrivals:
        timer = m.get_timer()
        if timer is not None and timer <= t:
            m.handle_timer(timer)
        m.feed(leg, memoryview(packets[i]), t)
        out += drain(m)
    m.handle_timer(arrivals[-1][0] + 1.0)
    out += drain(m)
    return out, m


def test_identical_legs_give_each_packet_once_and_no_switch() -> None:
    packets = stream(0, 200)
    out, m = run(packets)
    assert out == packets
    c = m.counters
    assert (c.redundancy_switches, c.packets_lost, c.lost, c.redundant) == (0, 0, [0, 0], 200)


def test_independent_five_percent_loss_per_leg_leaves_no_gap() -> None:
    packets = stream(60000, 4000)  # wraps
    rng = random.Random(2022)
    drop0 = {i for i in range(4000) if rng.random() < 0.05}
    drop1 = {i for i in range(4000) if rng.random() < 0.05} - drop0
    out, m = run(packets, drop=(drop0, drop1), delay_s=(0.0, 0.004))
    assert out == packets
    c = m.counters
    assert c.packets_lost == 0
    assert c.lost == [len(drop0), len(drop1)]
    assert c.redundancy_switches > 0


def test_switch_counting_follows_the_supplying_leg() -> None:
    packets = stream(0, 100)
    # Leg 0 misses 10 (switch to 1), leg 1 then carries on; leg 1 misses 50 (switch back to 0).
    out, m = run(packets, drop=({10, 11, 12}, {50}))
    assert out == packets
    assert m.counters.redundancy_switches == 2


def test_a_dead_leg_leaves_no_gap_and_raises_events() -> None:
    packets = stream(0, 300)
    dead = set(range(100, 200))
    out, m = run(packets, drop=(dead, set()))
    assert out == packets
    assert m.counters.lost == [100, 0]
    assert m.counters.redundancy_switches == 1  # to leg 1 at 100; leg 1 keeps supplying after 200
    events = list(iter(m.next_event, None))
    # ... then both legs go quiet when the stream ends (the harness's last timer, 1 s later).
    assert events == [LegLost(0, 1), LegRestored(0, 2), LegLost(0, 1), LegLost(1, 0)]


def test_path_differential_within_the_window_is_absorbed() -> None:
    packets = stream(0, 300)
    drop1 = set(range(0, 300, 7))
    out, m = run(packets, drop=(set(), drop1), delay_s=(0.040, 0.0))  # leg 0 (the complete one) is late
    assert out == packets
    assert m.counters.packets_lost == 0 and m.counters.late == 0


def test_path_differential_beyond_the_window_loses_and_counts_late() -> None:
    packets = stream(0, 300)
    out, m = run(packets, drop=(set(), {150}), delay_s=(0.080, 0.0))
    assert out == [p for i, p in enumerate(packets) if i != 150]
    assert m.counters.packets_lost == 1
    assert m.counters.late == 1


def test_loss_on_both_legs_is_counted_once() -> None:
    packets = stream(0, 50)
    out, m = run(packets, drop=({20}, {20}))
    assert len(out) == 49 and m.counters.packets_lost == 1
    assert m.counters.lost == [1, 1]


def test_same_leg_duplicate_and_garbage_are_counted() -> None:
    m = HitlessMerger()
    p = media(5)
    m.feed(0, memoryview(p), 0.0)
    m.feed(0, memoryview(p), 0.0)
    m.feed(1, memoryview(b"junk"), 0.0)
    m.handle_timer(1.0)
    assert drain(m) == [p]
    assert (m.counters.duplicates, m.counters.malformed) == (1, [0, 1])


def test_ssrc_change_resyncs_and_drops_the_old_ssrc_from_the_slow_leg() -> None:
    old = stream(100, 10, ssrc=1)
    new = stream(9000, 10, ssrc=2)
    m = HitlessMerger()
    out = []
    for p in old:
        m.feed(0, memoryview(p), 0.0)
    for p in new:
        m.feed(0, memoryview(p), 0.1)
    for p in old[5:]:
        m.feed(1, memoryview(p), 0.11)  # leg 1 still delivers the old stream
    for p in new:
        m.feed(1, memoryview(p), 0.12)
    m.handle_timer(1.0)
    out = drain(m)
    assert out == old + new
    assert m.counters.resyncs == 1 and m.counters.stale_ssrc == 5


def test_leg_restart_with_a_new_sequence_space_resyncs() -> None:
    m = HitlessMerger()
    first = stream(0, 20)
    second = stream(40000, 20)
    for p in first:
        m.feed(0, memoryview(p), 0.0)
    for p in second:
        m.feed(0, memoryview(p), 1.0)
    m.handle_timer(2.0)
    assert drain(m) == first + second[1:]  # the first packet of a jump is held as a probe only
    assert m.counters.resyncs == 1 and m.counters.out_of_range == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.binary(max_size=40)), max_size=20))
def test_any_bytes_never_raise(items: list[tuple[int, bytes]]) -> None:
    m = HitlessMerger()
    for n, (leg, data) in enumerate(items):
        m.feed(leg, memoryview(data), n * 0.01)
    m.handle_timer(100.0)
    drain(m)
    assert sum(m.counters.received) + sum(m.counters.malformed) == len(items)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 65535),
    st.sets(st.integers(0, 119), max_size=60),
    st.sets(st.integers(0, 119), max_size=60),
    st.floats(0.0, 0.040),
)
@example(0, {0}, set(), 0.03125)  # the first packet only on the later leg: still counted as leg 1's loss
def test_no_packet_lost_on_both_legs_means_no_gap(first: int, drop0: set[int], drop1: set[int], skew: float) -> None:
    packets = stream(first, 120)
    drop1 = drop1 - drop0
    out, m = run(packets, drop=(drop0, drop1), delay_s=(0.0, skew))
    assert out == packets
    assert m.counters.packets_lost == 0
    assert m.counters.lost == [len(drop0), len(drop1)]
