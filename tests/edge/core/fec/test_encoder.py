"""FEC encoder core: header fields, XOR content, pacing, discontinuities, limits."""

from __future__ import annotations

import pytest

from services.edge.core.fec import FecEncoder, parse_fec
from tests.edge.core.fec.helpers import media, stream


def encode(packets: list[bytes], columns: int, rows: int, **kw: object) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Per media packet, the column and row FEC packets due right after it."""
    enc = FecEncoder(columns, rows, **kw)  # type: ignore[arg-type]
    cols, rws = [], []
    for p in packets:
        enc.on_media(memoryview(p), 0.0)
        cols.append(list(iter(enc.pop_column, None)))
        rws.append(list(iter(enc.pop_row, None)))
    return cols, rws


def xor(chunks: list[bytes]) -> bytes:
    width = max(len(c) for c in chunks)
    out = bytearray(width)
    for c in chunks:
        for i, b in enumerate(c):
            out[i] ^= b
    return bytes(out)


def test_row_packet_fields_and_payload() -> None:
    packets = [media(65534 + i, size=100 + i, marker=(i == 1), ts=1000 + i) for i in range(4)]
    _, rws = encode(packets, 4, 4)
    assert [len(r) for r in rws] == [0, 0, 0, 1]
    fec = parse_fec(rws[3][0])
    assert fec is not None
    assert fec.is_row and (fec.offset, fec.na, fec.snbase) == (1, 4, 65534)
    assert (fec.payload_type, fec.ssrc, fec.extension_flag, fec.mask, fec.fec_type) == (96, 0, True, 0, 0)
    assert fec.length_recovery == 100 ^ 101 ^ 102 ^ 103
    assert fec.ts_recovery == 1000 ^ 1001 ^ 1002 ^ 1003
    assert fec.marker  # one marker among four
    assert fec.pt_recovery == 0  # 33 ^ 33 ^ 33 ^ 33
    assert bytes(fec.payload) == xor([p[12:] for p in packets])


def test_column_packets_are_paced_across_the_next_matrix() -> None:
    columns, rows = 5, 4
    packets = stream(10, 3 * columns * rows)
    cols, _ = encode(packets, columns, rows)
    per_packet = [len(c) for c in cols]
    assert max(per_packet) == 1
    assert sum(per_packet[: columns * rows]) == 0  # nothing while the first matrix fills
    released_at = [i for i, n in enumerate(per_packet) if n]
    m = columns * rows
    assert released_at[:columns] == [m + rows * k - 1 for k in range(1, columns + 1)]
    for k, i in enumerate(released_at[:columns]):
        fec = parse_fec(cols[i][0])
        assert fec is not None and not fec.is_row
        assert (fec.offset, fec.na, fec.snbase) == (columns, rows, 10 + k)
        assert bytes(fec.payload) == xor([packets[k + r * columns][12:] for r in range(rows)])


def test_flush_releases_the_last_matrix_columns() -> None:
    enc = FecEncoder(4, 4)
    for p in stream(0, 16):
        enc.on_media(memoryview(p), 0.0)
    assert enc.pop_column() is None
    enc.flush()
    assert len(list(iter(enc.pop_column, None))) == 4
    assert enc.counters.fec_packets_sent == 4  # counts what was popped: the rows still wait
    assert len(list(iter(enc.pop_row, None))) == 4
    assert enc.counters.fec_packets_sent == 8


def test_fec_sequence_numbers_count_per_stream_and_wrap() -> None:
    enc = FecEncoder(4, 4, row_seq=65535, column_seq=7)
    for p in stream(0, 32):
        enc.on_media(memoryview(p), 0.0)
    rows = [parse_fec(r) for r in iter(enc.pop_row, None)]
    assert [r.sequence for r in rows if r] == [65535, 0, 1, 2, 3, 4, 5, 6]
    cols = [parse_fec(c) for c in iter(enc.pop_column, None)]
    assert [c.sequence for c in cols if c] == [7, 8, 9, 10]


def test_one_dimensional_sends_no_rows_and_one_column_sends_no_rows() -> None:
    assert sum(len(r) for r in encode(stream(0, 40), 4, 4, row_fec=False)[1]) == 0
    cols, rws = encode(stream(0, 40), 1, 4)
    assert sum(len(r) for r in rws) == 0 and sum(len(c) for c in cols) > 0


def test_discontinuity_starts_a_new_matrix() -> None:
    enc = FecEncoder(4, 4)
    for p in stream(0, 6) + stream(100, 16):
        enc.on_media(memoryview(p), 0.0)
    assert enc.counters.matrix_resets == 1
    rows = [parse_fec(r) for r in iter(enc.pop_row, None)]
    assert [r.snbase for r in rows if r] == [0, 100, 104, 108, 112]
    enc.flush()
    cols = [parse_fec(c) for c in iter(enc.pop_column, None)]
    assert [c.snbase for c in cols if c] == [100, 101, 102, 103]


def test_malformed_media_is_counted() -> None:
    enc = FecEncoder(4, 4)
    enc.on_media(memoryview(b"\x00" * 20), 0.0)
    assert enc.counters.media_malformed == 1


@pytest.mark.parametrize(("columns", "rows"), [(0, 4), (21, 4), (4, 3), (4, 21)])
def test_out_of_range_matrix_is_a_caller_error(columns: int, rows: int) -> None:
    with pytest.raises(ValueError):
        FecEncoder(columns, rows)
