"""RTP sequence accounting (RFC 3550 A.1, A.3): loss, reordering, duplicates, wrap, restarts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.edge.core.seq import SequenceTracker

SSRC = 0x1234


def feed(seqs: list[int], ssrc: int = SSRC) -> SequenceTracker:
    tracker = SequenceTracker()
    for seq in seqs:
        tracker.on_packet(seq & 0xFFFF, ssrc)
    return tracker


def test_in_order_is_lossless() -> None:
    assert feed(list(range(1000))).lost == 0


def test_gaps_count_each_missing_packet() -> None:
    seqs = [s for s in range(100) if s not in (10, 11, 50)]
    assert feed(seqs).lost == 3


def test_a_late_packet_cancels_the_loss_it_caused() -> None:
    tracker = feed([0, 1, 3, 4, 2, 5])
    assert tracker.lost == 0 and tracker.late == 1


def test_duplicates_do_not_hide_loss() -> None:
    tracker = feed([0, 1, 1, 1, 3])
    assert tracker.lost == 1 and tracker.duplicates == 2


def test_wrap_around() -> None:
    assert feed(list(range(65530, 65546))).lost == 0
    assert feed([65534, 65535, 1, 2]).lost == 1


def test_a_restarted_sender_keeps_the_loss_so_far() -> None:
    tracker = feed([0, 1, 3])  # one lost
    tracker.on_packet(40000, SSRC)  # a jump: the sender restarted
    tracker.on_packet(40001, SSRC)
    assert tracker.lost == 1 and tracker.resyncs == 1


def test_a_new_ssrc_starts_a_new_sequence() -> None:
    tracker = feed([0, 1, 2, 4])
    tracker.on_packet(9000, SSRC + 1)
    tracker.on_packet(9001, SSRC + 1)
    assert tracker.lost == 1


@given(st.integers(0, 0xFFFF), st.sets(st.integers(1, 498), max_size=50))
def test_loss_equals_the_dropped_count(start: int, dropped: set[int]) -> None:
    seqs = [start + i for i in range(500) if i not in dropped]
    assert feed(seqs).lost == len(dropped)
