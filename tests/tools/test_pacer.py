"""The tests' paced sender (tests/helpers/media.Pacer): on time, and no burst after a stall."""

from __future__ import annotations

from tests.helpers.media import MAX_CATCH_UP, Pacer


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_on_schedule_it_sleeps_one_interval_per_datagram() -> None:
    fake = FakeTime()
    pacer = Pacer(1000, clock=fake.clock, sleep=fake.sleep)
    for _ in range(10):
        pacer.sent_one()
    assert len(fake.sleeps) == 10 and abs(fake.now - 100.010) < 1e-9


def test_after_a_stall_it_catches_up_by_a_few_datagrams_only() -> None:
    fake = FakeTime()
    pacer = Pacer(1000, clock=fake.clock, sleep=fake.sleep)
    pacer.sent_one()
    fake.now += 0.150  # the test process was not scheduled for 150 ms (150 datagrams late)
    back_to_back = 0
    while not fake.sleeps[1:]:
        pacer.sent_one()
        back_to_back += 1
    # Sending all 150 at once overflowed a receiver's default buffer (~90 datagrams) in CI.
    assert back_to_back <= MAX_CATCH_UP + 1
