"""Backoff, lockout and the offline event queue (interop.md 6 "Node client", "Lockout")."""

from __future__ import annotations

import random

import pytest
from pydantic import SecretStr

from appliance.protocol import EVENT_QUEUE_CAPACITY, Backoff, EventQueue, Lockout, lockout_identifier

NOMINAL = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_backoff_sequence_with_a_seeded_random_stays_within_ten_percent() -> None:
    backoff = Backoff(random.Random(1234))
    delays = [backoff.next_delay() for _ in NOMINAL]
    for delay, nominal in zip(delays, NOMINAL, strict=True):
        assert nominal * 0.9 <= delay <= nominal * 1.1
    assert delays != NOMINAL  # jittered
    # The same seed gives the same delays: the session draws only from the source it was given.
    assert [Backoff(random.Random(1234)).next_delay()] == delays[:1]


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 0.9), (0.5, 1.0), (0.999999, 1.1)])
def test_backoff_jitter_bounds(draw: float, factor: float) -> None:
    backoff = Backoff(lambda: draw)  # any () -> float in [0, 1) is a random source
    delays = [backoff.next_delay() for _ in NOMINAL]
    assert delays == pytest.approx([n * factor for n in NOMINAL], rel=1e-5)


def test_backoff_reset_after_a_successful_auth() -> None:
    backoff = Backoff(lambda: 0.5)
    assert [backoff.next_delay() for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    backoff.reset()
    assert [backoff.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]


def test_backoff_stays_capped_after_many_failures() -> None:
    backoff = Backoff(lambda: 0.5)
    for _ in range(2000):  # no float overflow, no growth past the cap
        delay = backoff.next_delay()
    assert delay == 60.0


def test_five_failures_within_60_s_lock_for_the_rest_of_that_window() -> None:
    lockout = Lockout()
    for t in (100.0, 110.0, 120.0, 130.0):
        assert lockout.record_failure("node-a", t) is False
        assert not lockout.is_locked("node-a", t)
    assert lockout.record_failure("node-a", 140.0) is True  # the fifth within [100, 160)
    assert lockout.locked_until("node-a", 140.0) == 160.0
    for t in (140.0, 150.0, 159.999):
        assert lockout.is_locked("node-a", t)  # every attempt refused, correct secret or not
    assert lockout.record_failure("node-a", 150.0) is True  # still locked; does not extend
    assert lockout.locked_until("node-a", 150.0) == 160.0
    assert not lockout.is_locked("node-a", 160.0)  # the window is over
    assert lockout.locked_until("node-a", 160.0) is None
    assert not lockout.is_locked("node-b", 150.0)  # per identifier


def test_failures_spread_over_more_than_60_s_do_not_lock() -> None:
    lockout = Lockout()
    for t in (0.0, 20.0, 40.0, 59.0):
        lockout.record_failure("node-a", t)
    assert lockout.record_failure("node-a", 60.0) is False  # a new window opens at 60
    assert not lockout.is_locked("node-a", 60.0)
    for t in (61.0, 62.0, 63.0):
        assert lockout.record_failure("node-a", t) is False
    assert lockout.record_failure("node-a", 64.0) is True  # fifth in [60, 120)
    assert lockout.locked_until("node-a", 64.0) == 120.0


def test_after_a_lock_the_count_starts_over() -> None:
    lockout = Lockout()
    for t in range(5):
        lockout.record_failure("x", float(t))
    assert lockout.is_locked("x", 59.0)
    assert lockout.record_failure("x", 61.0) is False
    assert not lockout.is_locked("x", 61.5)


def test_lockout_memory_is_bounded() -> None:
    lockout = Lockout(max_identifiers=3)
    for i in range(3):
        lockout.record_failure(f"n{i}", 0.0)
    lockout.record_failure("late", 70.0)  # prunes the ended windows first
    assert len(lockout) == 1
    for i in range(5):
        lockout.record_failure(f"m{i}", 80.0)  # then drops the oldest
    assert len(lockout) == 3
    lockout.prune(1000.0)
    assert len(lockout) == 0


def test_lockout_identifier() -> None:
    assert lockout_identifier(node_id="5b0c", registration_token=None) == "5b0c"
    assert lockout_identifier(node_id="5b0c", registration_token="7c9e6679-7425") == "5b0c"
    assert lockout_identifier(node_id=None, registration_token=SecretStr("7c9e6679-7425")) == "token:7c9e6679"
    assert lockout_identifier(node_id=None, registration_token="abc") == "token:abc"
    with pytest.raises(ValueError):
        lockout_identifier(node_id=None, registration_token=None)


def test_event_queue_keeps_order_and_drops_the_oldest_when_full() -> None:
    queue: EventQueue[int] = EventQueue()
    assert queue.capacity == EVENT_QUEUE_CAPACITY == 1000
    for i in range(1000):
        assert queue.put(i) is True
    assert queue.dropped == 0 and len(queue) == 1000
    assert queue.put(1000) is False
    assert queue.put(1001) is False
    assert queue.dropped == 2 and len(queue) == 1000
    assert queue.peek() == 2  # 0 and 1 were dropped
    items = queue.drain()
    assert items == list(range(2, 1002))
    assert len(queue) == 0 and queue.pop() is None and queue.peek() is None


def test_event_queue_peek_then_pop_keeps_an_unsent_event() -> None:
    queue: EventQueue[str] = EventQueue(capacity=3)
    for name in ("a", "b", "c"):
        queue.put(name)
    assert queue.peek() == "a" and len(queue) == 3  # send failed: still queued
    assert queue.pop() == "a"
    assert list(queue) == ["b", "c"]
    with pytest.raises(ValueError):
        EventQueue(capacity=0)
