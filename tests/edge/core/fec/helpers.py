"""Canned RTP media and a loopback harness for the FEC cores (no sockets, no clock)."""

from __future__ import annotations

import random
from collections.abc import Iterable

from services.edge.core.fec import FecDecoder, FecEncoder
from services.edge.core.rtp import build_rtp_header


def media(
    seq: int,
    *,
    size: int = 1316,
    ssrc: int = 0x1234,
    ts: int | None = None,
    marker: bool = False,
    pt: int = 33,
    fill: int | None = None,
) -> bytes:
    """One RTP datagram with a payload derived from ``seq`` (or ``fill``)."""
    out = bytearray(12 + size)
    build_rtp_header(
        out,
        payload_type=pt,
        sequence=seq & 0xFFFF,
        timestamp=(seq * 3003 if ts is None else ts),
        ssrc=ssrc,
        marker=marker,
    )
    rng = random.Random(seq if fill is None else fill)
    out[12:] = rng.randbytes(size)
    return bytes(out)


def stream(first: int, count: int, **kw: object) -> list[bytes]:
    return [media(first + i, **kw) for i in range(count)]  # type: ignore[arg-type]


def run_pair(
    packets: list[bytes],
    columns: int,
    rows: int,
    *,
    drop_media: Iterable[int] = (),
    drop_column: Iterable[int] = (),
    drop_row: Iterable[int] = (),
    row_fec: bool = True,
    window_s: float | None = 10.0,
    step_s: float = 0.001,
) -> tuple[list[bytes], FecDecoder]:
    """Encode ``packets``, drop by index (media) / FEC packet number, decode; return the output."""
    enc = FecEncoder(columns, rows, row_fec=row_fec)
    dec = FecDecoder(columns, rows, reorder_window_s=window_s)
    drop_media, drop_column, drop_row = set(drop_media), set(drop_column), set(drop_row)
    out: list[bytes] = []
    n_col = n_row = 0
    now = 0.0

    def drain_fec() -> None:
        nonlocal n_col, n_row
        while (col := enc.pop_column()) is not None:
            if n_col not in drop_column:
                dec.on_fec(memoryview(col), now)
            n_col += 1
        while (row := enc.pop_row()) is not None:
            if n_row not in drop_row:
                dec.on_fec(memoryview(row), now)
            n_row += 1

    for i, packet in enumerate(packets):
        now += step_s
        enc.on_media(memoryview(packet), now)
        if i not in drop_media:
            dec.on_media(memoryview(packet), now)
        drain_fec()
        while (o := dec.pop_output()) is not None:
            out.append(o)
    enc.flush()
    drain_fec()
    now += (window_s or 2.0) + 1
    dec.handle_timer(now)
    while (o := dec.pop_output()) is not None:
        out.append(o)
    return out, dec
