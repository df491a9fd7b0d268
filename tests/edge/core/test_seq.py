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


def _counters(tracker: SequenceTracker) -> tuple[int, int, int, int]:
    return tracker.lost, tracker.duplicates, tracker.late, tracker.resyncs


@given(
    st.integers(0, 0xFFFF),
    st.lists(st.sampled_from(["run", "gap", "late", "dup", "jump", "ssrc"]), min_size=1, max_size=40),
    st.integers(1, 64),
)
def test_on_run_counts_exactly_as_packet_by_packet(start: int, events: list[str], size: int) -> None:
    """Batches fed through on_run (with the per-packet path where it declines) match on_packet."""
    seqs: list[tuple[int, int]] = []
    seq, ssrc = start, SSRC
    for event in events:
        if event == "run":
            seqs += [((seq + k) & 0xFFFF, ssrc) for k in range(size)]
            seq += size
        elif event == "gap":
            seq += 3
        elif event == "late" and seqs:
            seqs.append(((seq - 5) & 0xFFFF, ssrc))
        elif event == "dup" and seqs:
            seqs.append(seqs[-1])
        elif event == "jump":
            seq += 5000
        elif event == "ssrc":
            ssrc += 1
    one_by_one = SequenceTracker()
    for number, source in seqs:
        one_by_one.on_packet(number, source)
    batched = SequenceTracker()
    for begin in range(0, len(seqs), size):
        chunk = seqs[begin : begin + size]
        numbers = tuple(number for number, _ in chunk)
        sources = {source for _, source in chunk}
        if len(sources) != 1 or not batched.on_run(numbers, chunk[0][1]):
            for number, source in chunk:
                batched.on_packet(number, source)
        assert _counters(batched) == _counters(feed_pairs(seqs[: begin + len(chunk)]))
    assert _counters(batched) == _counters(one_by_one)


def feed_pairs(pairs: list[tuple[int, int]]) -> SequenceTracker:
    tracker = SequenceTracker()
    for number, source in pairs:
        tracker.on_packet(number, source)
    return tracker


def test_on_run_takes_a_wrapping_run_and_declines_the_rest() -> None:
    tracker = feed([0xFFF0])
    assert tracker.on_run(tuple((0xFFF1 + k) & 0xFFFF for k in range(40)), SSRC)
    assert _counters(tracker) == (0, 0, 0, 0)
    assert not tracker.on_run((30, 31), SSRC)  # a gap: the caller goes packet by packet
    assert not tracker.on_run((25, 27), SSRC)  # not consecutive
    assert not tracker.on_run((25, 26), SSRC + 1)  # another source
    assert _counters(tracker) == (0, 0, 0, 0)
    tracker.on_packet(0x0010, SSRC)  # a duplicate still tells, after a run
    assert tracker.duplicates == 1
