"""Payload merge of two raw-TS legs: each position once, even when content repeats."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from services.edge.core.dedup import PayloadMerger


def run(messages: list[bytes], lost: list[set[int]], skew: int = 0) -> list[bytes]:
    """Interleave two legs (leg 1 ``skew`` messages behind), each missing ``lost[leg]``."""
    merger = PayloadMerger(window_s=1.0)
    events = []
    for leg in (0, 1):
        for i, m in enumerate(messages):
            if i not in lost[leg]:
                events.append((i + (skew if leg else 0) + 0.5 * leg, leg, m))
    out = []
    for t, leg, m in sorted(events):
        if merger.accept(leg, m, t / 1000):
            out.append(m)
    return out


def test_repeating_content_is_passed_once_per_position() -> None:
    messages = [bytes([i % 16]) * 188 for i in range(200)]  # period 16, like wrapping CCs
    assert run(messages, [set(), set()]) == messages


@given(st.integers(0, 2**31), st.integers(0, 5))
def test_any_loss_covered_by_one_leg_leaves_no_gap(seed: int, skew: int) -> None:
    rng = random.Random(seed)
    messages = [i.to_bytes(2, "big") * 94 for i in range(300)]  # real TS: payloads differ
    lost_a = {i for i in range(300) if rng.random() < 0.1}
    lost_b = {i for i in range(300) if rng.random() < 0.1} - lost_a
    out = run(messages, [lost_a, lost_b], skew)
    assert sorted(out) == sorted(messages)  # every message exactly once
    if skew == 0:
        assert out == messages  # and in order when the legs are not skewed


@given(st.integers(0, 2**31), st.integers(0, 5))
def test_repeating_content_with_losses_on_one_leg(seed: int, skew: int) -> None:
    rng = random.Random(seed)
    messages = [bytes([i % 16]) * 188 for i in range(300)]
    lost_b = {i for i in range(300) if rng.random() < 0.2}
    assert run(messages, [set(), lost_b], skew) == messages


def test_a_dead_leg_leaves_the_other_alone_and_pending_copies_expire() -> None:
    merger = PayloadMerger(window_s=0.5)
    assert all(merger.accept(0, bytes([i]) * 10, i * 0.01) for i in range(100))
    assert merger.counters.expired > 0 and merger.counters.switches == 0
