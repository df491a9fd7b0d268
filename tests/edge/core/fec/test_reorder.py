"""The reorder buffer shared by the FEC decoder and the 2022-7 merger."""

from __future__ import annotations

import pytest

from services.edge.core.fec.reorder import PutResult, ReorderBuffer


def test_wrap_start_up_hold_and_lost_gap() -> None:
    lost: list[int] = []
    buf = ReorderBuffer(0.1, capacity=64, on_lost=lost.append)
    first = buf.extend(65535)
    assert buf.put(first, b"a", 0.0) is PutResult.STORED
    assert buf.put(buf.extend(1), b"c", 0.05) is PutResult.STORED  # 0 is missing, across the wrap
    assert buf.put(buf.extend(65534), b"z", 0.05) is PutResult.STORED  # still priming: takes the head
    buf.release(0.05)
    assert list(buf.output) == [] and buf.deadline == 0.1
    buf.release(0.1)
    assert list(buf.output) == [b"z", b"a"] and buf.deadline == pytest.approx(0.15)
    buf.release(0.2)
    assert list(buf.output) == [b"z", b"a", b"c"]
    assert lost == [first + 1] and buf.lost == 1
    assert buf.put(first + 1, b"b", 0.3) is PutResult.LATE
    assert buf.put(first, b"a", 0.3) is PutResult.DUPLICATE


def test_a_full_ring_releases_its_oldest() -> None:
    buf = ReorderBuffer(10.0, capacity=64)
    buf.put(1000, b"0", 0.0)
    buf.release(20.0)
    for ext in range(1002, 1100):
        buf.put(ext, b"x", 20.0)
    assert buf.next_out > 1001 and buf.lost == 1
    assert buf.pending <= 64
