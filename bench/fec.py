"""SMPTE 2022-1 FEC core throughput, one core, pure Python: ``python -m bench.fec [--packets N]``.

Prints media packets per second (median of 5 runs) for the encoder (column + row FEC) and the
decoder (fed media and both FEC streams) at 10 x 10, with no loss and with 1 % and 5 % random
media loss, plus 1-D and 20 x 20 rows for scale, next to a baseline that only parses the RTP
header (``parse_rtp``) and the 2022-7 merger. Datagrams are 1328 bytes (7 TS packets). The clock
is advanced by hand (the cores never read it): 1 ms per packet, so reorder windows behave as on a
1000 packets/s stream; everything is in memory, no sockets. Rates are per second of this
process's CPU time (``time.process_time``), so other load on a shared machine skews them less
(it still costs cache and frequency: compare rows of one run, not runs).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from services.edge.core.fec import FecDecoder, FecEncoder
from services.edge.core.merge2022_7 import HitlessMerger
from services.edge.core.rtp import build_rtp_header, parse_rtp

RUNS = 5


def make_packets(count: int, first_seq: int = 60000) -> list[bytes]:
    rng = random.Random(1)
    payload = rng.randbytes(1316)
    out = []
    for i in range(count):
        pkt = bytearray(1328)
        build_rtp_header(pkt, payload_type=33, sequence=first_seq + i, timestamp=i * 900, ssrc=0x1234)
        pkt[12:] = payload[i % 7 :] + payload[: i % 7]  # differ per packet, cheaply
        out.append(bytes(pkt))
    return out


def encoded(packets: list[bytes], columns: int, rows: int, row_fec: bool) -> list[tuple[int, bytes]]:
    """The interleaved stream a receiver sees: (0 media | 1 FEC, datagram)."""
    enc = FecEncoder(columns, rows, row_fec=row_fec)
    stream: list[tuple[int, bytes]] = []
    for i, p in enumerate(packets):
        stream.append((0, p))
        enc.on_media(memoryview(p), i * 0.001)
        stream += [(1, c) for c in iter(enc.pop_column, None)]
        stream += [(1, r) for r in iter(enc.pop_row, None)]
    enc.flush()
    stream += [(1, c) for c in iter(enc.pop_column, None)]
    return stream


def rate(fn: Callable[[], int]) -> float:
    """Median packets per CPU second of ``fn`` (which returns how many media packets it handled)."""
    results = []
    for _ in range(RUNS):
        start = time.process_time()  # CPU time: this machine is shared, wall time is not ours
        n = fn()
        results.append(n / (time.process_time() - start))
    return statistics.median(results)


def bench_parse(packets: list[bytes]) -> Callable[[], int]:
    views = [memoryview(p) for p in packets]

    def run() -> int:
        for v in views:
            parse_rtp(v)
        return len(views)

    return run


def bench_encode(packets: list[bytes], columns: int, rows: int, row_fec: bool) -> Callable[[], int]:
    views = [memoryview(p) for p in packets]

    def run() -> int:
        enc = FecEncoder(columns, rows, row_fec=row_fec)
        pop_c, pop_r = enc.pop_column, enc.pop_row
        for i, v in enumerate(views):
            enc.on_media(v, i * 0.001)
            while pop_c() is not None:
                pass
            while pop_r() is not None:
                pass
        return len(views)

    return run


def bench_decode(packets: list[bytes], columns: int, rows: int, row_fec: bool, loss: float) -> Callable[[], int]:
    stream = encoded(packets, columns, rows, row_fec)
    rng = random.Random(7)
    kept = [(kind, memoryview(d)) for kind, d in stream if kind == 1 or rng.random() >= loss]
    media_total = len(packets)

    def run() -> int:
        dec = FecDecoder(columns, rows, reorder_window_s=0.5)
        on_media, on_fec, pop = dec.on_media, dec.on_fec, dec.pop_output
        now = 0.0
        for kind, view in kept:
            if kind == 0:
                now += 0.001
                on_media(view, now)
            else:
                on_fec(view, now)
            while pop() is not None:
                pass
        dec.handle_timer(now + 10.0)
        dec.flush()
        while pop() is not None:
            pass
        run.recovered = dec.counters.recovered  # type: ignore[attr-defined]
        return media_total

    return run


def bench_merge(packets: list[bytes], loss: float) -> Callable[[], int]:
    rng = random.Random(3)
    feed = []
    for p in packets:
        v = memoryview(p)
        if rng.random() >= loss:
            feed.append((0, v))
        if rng.random() >= loss:
            feed.append((1, v))

    def run() -> int:
        m = HitlessMerger(window_s=0.05)
        now = 0.0
        for leg, v in feed:
            now += 0.0005
            m.feed(leg, v, now)
            while m.pop_output() is not None:
                pass
        return len(packets)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=20_000)
    args = parser.parse_args()
    packets = make_packets(args.packets)
    rows_out: list[tuple[str, float, str]] = []
    baseline = rate(bench_parse(packets))
    rows_out.append(("parse_rtp only (baseline)", baseline, ""))
    for label, columns, rows, row_fec in (("10x10 2-D", 10, 10, True), ("10x10 1-D (columns)", 10, 10, False),
                                          ("20x20 2-D", 20, 20, True), ("4x4 2-D", 4, 4, True)):  # fmt: skip
        rows_out.append((f"encode {label}", rate(bench_encode(packets, columns, rows, row_fec)), ""))
        for loss in (0.0, 0.01, 0.05) if label == "10x10 2-D" else (0.0, 0.01):
            run = bench_decode(packets, columns, rows, row_fec, loss)
            pps = rate(run)
            rows_out.append((f"decode {label}, {loss:.0%} loss", pps, f"rebuilt {run.recovered}"))  # type: ignore[attr-defined]
    for loss in (0.0, 0.05):
        rows_out.append((f"2022-7 merge, {loss:.0%} loss per leg", rate(bench_merge(packets, loss)), ""))
    print(f"{'core (1328-byte datagrams, one core)':<40} {'packets/s':>12} {'x baseline':>10}  note")
    for name, pps, note in rows_out:
        print(f"{name:<40} {pps:>12,.0f} {pps / baseline:>10.3f}  {note}")


if __name__ == "__main__":
    main()
