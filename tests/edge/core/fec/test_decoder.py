"""FEC decoder core: recovery patterns, matrix sizes at the range edges, wrap, reorder, garbage."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.fec import FecDecoder, FecEncoder, parse_fec
from services.edge.core.fec.decoder import MIN_AUTO_WINDOW_S
from tests.edge.core.fec.helpers import media, run_pair, stream

EDGE_SIZES = [*itertools.product((1, 2, 20), (4, 20)), (10, 10), (5, 4)]


def idx(row: int, col: int, columns: int, matrix: int = 0, rows: int = 0) -> int:
    return matrix * columns * rows + row * columns + col


@pytest.mark.parametrize(("columns", "rows"), EDGE_SIZES)
def test_no_loss_passes_through_unchanged(columns: int, rows: int) -> None:
    packets = stream(100, 2 * columns * rows + 3)
    out, dec = run_pair(packets, columns, rows)
    assert out == packets
    assert (dec.counters.recovered, dec.counters.unrecoverable) == (0, 0)
    assert dec.counters.fec_received > 0


@pytest.mark.parametrize(("columns", "rows"), EDGE_SIZES)
def test_one_loss_per_column_is_recovered_at_every_edge_size(columns: int, rows: int) -> None:
    packets = stream(7, 3 * columns * rows)
    # In matrix 1, lose one packet in every column, each in a different row where possible.
    drops = [idx(c % rows, c, columns, 1, rows) for c in range(columns)]
    out, dec = run_pair(packets, columns, rows, row_fec=False)
    assert out == packets  # sanity: nothing dropped
    out, dec = run_pair(packets, columns, rows, drop_media=drops, row_fec=False)
    assert out == packets
    assert dec.counters.recovered == len(drops)
    assert dec.counters.unrecoverable == 0


@pytest.mark.parametrize(("columns", "rows"), [s for s in EDGE_SIZES if s[0] > 1])
def test_one_loss_per_row_is_recovered_by_row_fec(columns: int, rows: int) -> None:
    packets = stream(65000, 3 * columns * rows)
    # Two losses in one column per matrix: column FEC alone cannot, rows can.
    drops = [idx(r, 0, columns, 1, rows) for r in range(rows)]
    out, dec = run_pair(packets, columns, rows, drop_media=drops)
    assert out == packets
    assert dec.counters.recovered == rows
    assert dec.counters.unrecoverable == 0


@pytest.mark.parametrize(("columns", "rows"), [(4, 4), (10, 10), (20, 20), (1, 4)])
def test_a_burst_of_one_row_is_recovered_by_columns(columns: int, rows: int) -> None:
    packets = stream(1, 3 * columns * rows)
    drops = range(idx(2, 0, columns, 1, rows), idx(2, 0, columns, 1, rows) + columns)
    out, dec = run_pair(packets, columns, rows, drop_media=drops, row_fec=False)
    assert out == packets
    assert dec.counters.recovered == columns


def test_iterative_row_then_column_recovery() -> None:
    columns, rows = 5, 5
    packets = stream(40, 3 * columns * rows)
    cells = [(0, 0), (0, 1), (1, 0), (2, 1)]  # no single FEC can start alone except row 1 / row 2
    drops = [idx(r, c, columns, 1, rows) for r, c in cells]
    out, dec = run_pair(packets, columns, rows, drop_media=drops)
    assert out == packets
    assert dec.counters.recovered == 4


def test_a_two_by_two_square_is_unrecoverable_and_counted() -> None:
    columns, rows = 5, 5
    packets = stream(0, 3 * columns * rows)
    cells = [(1, 1), (1, 2), (2, 1), (2, 2)]
    drops = {idx(r, c, columns, 1, rows) for r, c in cells}
    out, dec = run_pair(packets, columns, rows, drop_media=drops)
    assert out == [p for i, p in enumerate(packets) if i not in drops]
    assert (dec.counters.recovered, dec.counters.unrecoverable) == (0, 4)


def test_recovery_survives_the_loss_of_fec_packets_too() -> None:
    columns, rows = 4, 4
    packets = stream(0, 4 * columns * rows)
    # Lose row FEC number 5 (matrix 1, row 1) and the media packet it would have repaired:
    # its column repairs it instead.
    drop = idx(1, 2, columns, 1, rows)
    out, dec = run_pair(packets, columns, rows, drop_media=[drop], drop_row=[5])
    assert out == packets and dec.counters.recovered == 1


def test_rebuilds_header_fields_and_variable_lengths_exactly() -> None:
    packets = [
        media(i, size=(188 * (1 + i % 7)), marker=(i % 3 == 0), pt=33 + (i % 2), ts=0xFFFFFF00 + i * 77)
        for i in range(60)
    ]
    drops = [21, 27, 33, 39]
    out, dec = run_pair(packets, 5, 4, drop_media=drops)
    assert out == packets
    assert dec.counters.recovered == 4


def test_sequence_wrap_inside_a_matrix() -> None:
    packets = stream(65536 - 13, 100)
    out, dec = run_pair(packets, 5, 5, drop_media=[12, 13, 14, 40])
    assert out == packets
    assert dec.counters.recovered == 4


def test_reordered_media_is_released_in_order() -> None:
    packets = stream(500, 40)
    dec = FecDecoder(5, 4, reorder_window_s=0.05)
    order = list(range(40))
    order[10], order[11], order[12] = 12, 10, 11
    out = []
    for n, i in enumerate(order):
        dec.on_media(memoryview(packets[i]), n * 0.001)
        while (o := dec.pop_output()) is not None:
            out.append(o)
    assert out == []  # start-up: held for one window, in case an earlier packet is late
    dec.handle_timer(0.05)
    out += iter(dec.pop_output, None)
    assert out == packets
    assert dec.counters.unrecoverable == 0


def test_missing_packet_waits_for_the_window_then_is_counted() -> None:
    packets = stream(0, 10)
    dec = FecDecoder(5, 4, reorder_window_s=0.1)
    for i in (0, 1):
        dec.on_media(memoryview(packets[i]), 1.0)
    assert dec.get_timer() == pytest.approx(1.1)  # the start-up hold
    dec.handle_timer(1.1)
    dec.on_media(memoryview(packets[3]), 2.0)
    assert [dec.pop_output(), dec.pop_output(), dec.pop_output()] == [packets[0], packets[1], None]
    assert dec.get_timer() == pytest.approx(2.1)
    dec.handle_timer(2.05)
    assert dec.pop_output() is None
    dec.handle_timer(2.1)
    assert dec.pop_output() == packets[3]
    assert dec.counters.unrecoverable == 1
    assert dec.get_timer() is None
    dec.on_media(memoryview(packets[2]), 2.2)  # too late now
    dec.on_media(memoryview(packets[3]), 2.2)  # and a duplicate
    assert (dec.counters.late, dec.counters.duplicates) == (1, 1)
    assert dec.pop_output() is None


def _row_fec(packets: list[bytes], columns: int, rows: int) -> list[bytes]:
    enc = FecEncoder(columns, rows)
    out = []
    for p in packets:
        enc.on_media(memoryview(p), 0.0)
        out += iter(enc.pop_row, None)
    return out


def test_row_fec_overtaking_its_last_packet_rebuilds_nothing() -> None:
    packets = stream(0, 16)
    rows_fec = _row_fec(packets, 4, 4)
    dec = FecDecoder(4, 4)
    for p in packets[:3]:
        dec.on_media(memoryview(p), 0.0)
    dec.on_fec(memoryview(rows_fec[0]), 0.0)  # row 0 is complete but packet 3 is still in flight
    dec.on_media(memoryview(packets[3]), 0.0)
    assert (dec.counters.recovered, dec.counters.duplicates) == (0, 0)
    dec.handle_timer(1.0)
    assert list(iter(dec.pop_output, None)) == packets[:4]


def test_a_missing_packet_is_rebuilt_once_a_later_one_shows_it_is_overdue() -> None:
    packets = stream(0, 16)
    rows_fec = _row_fec(packets, 4, 4)
    dec = FecDecoder(4, 4)
    for p in packets[:3]:
        dec.on_media(memoryview(p), 0.0)
    dec.on_fec(memoryview(rows_fec[0]), 0.0)
    assert dec.counters.recovered == 0
    dec.on_media(memoryview(packets[4]), 0.0)  # packet 3 was lost after all
    assert dec.counters.recovered == 1
    dec.handle_timer(1.0)
    assert list(iter(dec.pop_output, None)) == packets[:5]


def test_flush_rebuilds_a_lost_last_packet() -> None:
    packets = stream(0, 4)
    rows_fec = _row_fec(packets, 4, 4)
    dec = FecDecoder(4, 4)
    for p in packets[:3]:
        dec.on_media(memoryview(p), 0.0)
    dec.on_fec(memoryview(rows_fec[0]), 0.0)
    dec.flush()
    assert dec.counters.recovered == 1
    assert list(iter(dec.pop_output, None)) == packets


def test_ssrc_change_flushes_and_restarts() -> None:
    old = stream(10, 20, ssrc=1)
    new = stream(3000, 20, ssrc=2)
    out, dec = run_pair(old + new, 5, 4)
    assert out == old + new
    assert dec.counters.resyncs == 1


def test_a_lone_wild_sequence_number_is_dropped_and_a_confirmed_jump_resyncs() -> None:
    dec = FecDecoder(5, 4)
    for i in range(5):
        dec.on_media(memoryview(media(i)), 0.0)
    dec.on_media(memoryview(media(30000)), 0.0)
    dec.on_media(memoryview(media(5)), 0.0)
    assert dec.counters.out_of_range == 1
    dec.on_media(memoryview(media(40000)), 0.0)
    dec.on_media(memoryview(media(40001)), 0.0)
    assert dec.counters.resyncs == 1
    dec.handle_timer(10.0)
    out = []
    while (o := dec.pop_output()) is not None:
        out.append(o)
    assert out == [media(i) for i in range(6)] + [media(40001)]


def test_dimension_mismatch_is_counted_but_used() -> None:
    packets = stream(0, 60)
    enc = FecEncoder(5, 4)
    dec = FecDecoder(10, 10)
    out = []
    for i, p in enumerate(packets):
        enc.on_media(memoryview(p), i * 0.001)
        if i != 25:
            dec.on_media(memoryview(p), i * 0.001)
        while (r := enc.pop_row()) is not None:
            dec.on_fec(memoryview(r), i * 0.001)
    dec.handle_timer(10.0)
    out += iter(dec.pop_output, None)
    assert out == packets[: len(out)] and len(out) >= 55
    assert dec.counters.recovered == 1
    assert dec.counters.fec_dimension_mismatch > 0


def test_garbage_is_counted() -> None:
    dec = FecDecoder(5, 4)
    dec.on_fec(memoryview(b"\x80" * 10), 0.0)
    dec.on_media(memoryview(b"\x00" * 30), 0.0)
    bad_type = bytearray(28)
    bad_type[0], bad_type[24], bad_type[25], bad_type[26] = 0x80, 0x08, 1, 5
    dec.on_fec(memoryview(bad_type), 0.0)
    zero_na = bytearray(28)
    zero_na[0] = 0x80
    dec.on_fec(memoryview(zero_na), 0.0)
    c = dec.counters
    assert (c.fec_malformed, c.media_malformed, c.fec_unsupported, c.fec_received) == (2, 1, 1, 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80), st.binary(max_size=80), st.booleans())
def test_any_bytes_never_raise(fec_bytes: bytes, media_bytes: bytes, first_media: bool) -> None:
    dec = FecDecoder(4, 4)
    if first_media:
        dec.on_media(memoryview(media(0, size=20)), 0.0)
    dec.on_fec(memoryview(fec_bytes), 0.0)
    dec.on_media(memoryview(media_bytes), 0.0)
    dec.handle_timer(100.0)
    while dec.pop_output() is not None:
        pass
    c = dec.counters
    assert c.media_received + c.media_malformed == 1 + first_media


@settings(max_examples=15, deadline=None)
@given(
    st.integers(2, 20),
    st.integers(4, 20),
    st.integers(0, 65535),
    st.data(),
)
def test_any_single_loss_per_row_is_recovered(columns: int, rows: int, first: int, data: st.DataObject) -> None:
    # Matrix 0 stays whole: a packet before the first one received cannot be output (docs/fec.md).
    packets = stream(first, 3 * columns * rows, size=64)
    picks = data.draw(st.lists(st.one_of(st.none(), st.integers(0, columns - 1)), min_size=2 * rows, max_size=2 * rows))
    drops = [columns * rows + r * columns + c for r, c in enumerate(picks) if c is not None]
    out, dec = run_pair(packets, columns, rows, drop_media=drops)
    assert out == packets
    assert dec.counters.recovered == len(drops)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 20), st.integers(4, 20), st.integers(0, 65535), st.data())
def test_any_single_loss_per_column_is_recovered(columns: int, rows: int, first: int, data: st.DataObject) -> None:
    packets = stream(first, 3 * columns * rows, size=64)
    # For each column of each matrix, lose at most one packet (any row).
    picks = data.draw(
        st.lists(st.one_of(st.none(), st.integers(0, rows - 1)), min_size=2 * columns, max_size=2 * columns)
    )
    drops = [
        (1 + k // columns) * columns * rows + r * columns + (k % columns) for k, r in enumerate(picks) if r is not None
    ]
    out, dec = run_pair(packets, columns, rows, drop_media=drops, row_fec=False)
    assert out == packets
    assert dec.counters.recovered == len(drops)


def test_each_deferred_packet_waits_its_own_window() -> None:
    packets = stream(0, 8)
    rows_fec = _row_fec(packets, 4, 4)
    dec = FecDecoder(4, 4, reorder_window_s=0.25)
    for p in packets[:3]:
        dec.on_media(memoryview(p), 0.0)
    dec.on_fec(memoryview(rows_fec[0]), 0.0)  # packet 3 deferred at t=0 ...
    dec.on_media(memoryview(packets[3]), 0.01)  # ... and it was only in flight
    for p in packets[4:7]:
        dec.on_media(memoryview(p), 0.2)
    dec.on_fec(memoryview(rows_fec[1]), 0.2)  # packet 7 deferred at t=0.2
    dec.handle_timer(0.26)  # the first deferral's window is over, not the second's
    dec.on_media(memoryview(packets[7]), 0.27)
    assert (dec.counters.recovered, dec.counters.duplicates) == (0, 0)
    dec.handle_timer(1.0)
    assert list(iter(dec.pop_output, None)) == packets


@pytest.mark.parametrize("start_col", [0, 3, 9])
def test_two_d_repairs_any_burst_of_l_plus_one(start_col: int) -> None:
    columns, rows = 10, 5
    packets = stream(300, 4 * columns * rows)
    first = columns * rows + 2 * columns + start_col
    out, dec = run_pair(packets, columns, rows, drop_media=range(first, first + columns + 1))
    assert out == packets
    assert dec.counters.recovered == columns + 1


def test_two_d_cannot_repair_a_burst_of_two_full_rows() -> None:
    columns, rows = 5, 5
    packets = stream(0, 4 * columns * rows)
    first = columns * rows + columns
    drops = set(range(first, first + 2 * columns))
    out, dec = run_pair(packets, columns, rows, drop_media=drops)
    assert dec.counters.recovered == 0 and dec.counters.unrecoverable == 2 * columns
    assert out == [p for i, p in enumerate(packets) if i not in drops]


def _groups(packets: list[bytes], columns: int, rows: int, row_fec: bool) -> list[tuple[int, ...]]:
    enc = FecEncoder(columns, rows, row_fec=row_fec)
    fec = []
    for p in packets:
        enc.on_media(memoryview(p), 0.0)
        fec += [*iter(enc.pop_column, None), *iter(enc.pop_row, None)]
    enc.flush()
    fec += list(iter(enc.pop_column, None))
    groups = []
    for datagram in fec:
        parsed = parse_fec(datagram)
        assert parsed is not None
        groups.append(tuple(range(parsed.snbase, parsed.snbase + parsed.offset * parsed.na, parsed.offset)))
    return groups


def _peel(lost: set[int], groups: list[tuple[int, ...]]) -> set[int]:
    lost, rebuilt, changed = set(lost), set(), True
    while changed:
        changed = False
        for group in groups:
            missing = [s for s in group if s in lost]
            if len(missing) == 1:
                lost.discard(missing[0])
                rebuilt.add(missing[0])
                changed = True
    return rebuilt


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.integers(4, 8), st.booleans(), st.data())
def test_any_loss_pattern_matches_the_peeling_model(
    columns: int, rows: int, row_fec: bool, data: st.DataObject
) -> None:
    m = columns * rows
    packets = stream(0, 4 * m, size=40)
    drops = data.draw(st.sets(st.integers(m, 3 * m - 1), max_size=m))
    rebuilt = _peel(set(drops), _groups(packets, columns, rows, row_fec))
    out, dec = run_pair(packets, columns, rows, drop_media=drops, row_fec=row_fec)
    assert dec.counters.recovered == len(rebuilt)
    assert dec.counters.unrecoverable == len(drops) - len(rebuilt)
    assert out == [p for i, p in enumerate(packets) if i not in drops or i in rebuilt]


def test_the_default_window_follows_the_packet_rate() -> None:
    # 20 x 20 column-only at 1000 packets/s: a loss early in a matrix needs its column FEC, which
    # comes during the next matrix, up to ~0.8 s later: more than a fixed 0.25 s window allows.
    columns, rows = 20, 20
    packets = stream(0, 4 * columns * rows, size=32)
    drop = [columns * rows + 1]
    _, fixed = run_pair(packets, columns, rows, drop_media=drop, row_fec=False, window_s=0.25)
    assert (fixed.counters.recovered, fixed.counters.unrecoverable) == (0, 1)
    out, auto = run_pair(packets, columns, rows, drop_media=drop, row_fec=False, window_s=None)
    assert out == packets and auto.counters.recovered == 1
    assert auto.reorder_window_s == pytest.approx(1.2, rel=0.01)  # 3 x 400 packets at 1 ms each
    fast = FecDecoder(4, 4)
    for i in range(1000):
        fast.on_media(memoryview(media(i, size=8)), i * 1e-5)  # 100 000 packets/s
    assert fast.reorder_window_s == MIN_AUTO_WINDOW_S
