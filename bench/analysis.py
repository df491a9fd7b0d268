"""How fast the stream analysis runs: TS packets/s analysed per core, pure Python vs numpy.

    python -m bench.analysis [--forwarding-pps N] [--seconds S] [--media/--no-media]

CPU time (process_time), so a busy machine slows the figures less than wall time would.
Feeds a synthetic 7-packets-per-datagram transport stream (default 100 Mbit/s; PAT/PMT every 100 ms, H.264-like
video with a PCR every 40 ms and a PES start per frame, an audio PID, null stuffing) through
``FlowAnalysis`` in one process, per datagram (``on_datagram``) and in batches of 1-64 datagrams
(``on_batch``) forced onto each path. Prints medians of 5 runs, and the forwarding benchmark's
peak datagram rate beside it (pass it with --forwarding-pps; "n/a" until that bench exists).
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.edge.core import analysis as analysis_mod
from services.edge.core.analysis import FlowAnalysis
from services.edge.core.ts.psi import crc32_mpeg2

TS = 188
PER_DATAGRAM = 7


def _section(table_id: int, ext: int, body: bytes) -> bytes:
    length = 5 + len(body) + 4
    head = bytes([table_id, 0xB0 | (length >> 8), length & 0xFF, ext >> 8, ext & 0xFF, 0xC1, 0, 0])
    return head + body + crc32_mpeg2(head + body).to_bytes(4, "big")


def _packet(pid: int, cc: int, payload: bytes, *, pusi: bool = False, pcr: int | None = None) -> bytes:
    head = bytes([0x47, (0x40 if pusi else 0) | (pid >> 8), pid & 0xFF])
    if pcr is None and len(payload) >= 184:
        return head + bytes([0x10 | cc]) + payload[:184]
    af = b"\x10" if pcr is not None else b"\x00"
    if pcr is not None:
        base, ext = divmod(pcr, 300)
        af += ((base << 15) | (0x3F << 9) | ext).to_bytes(6, "big")
    room = 184 - 1 - len(af)
    payload = payload[:room]
    af += b"\xff" * (room - len(payload))
    return head + bytes([0x30 | cc, len(af)]) + af + payload


def synthetic_stream(seconds: float, rate_bps: float = 10e6) -> tuple[list[bytes], list[float]]:
    """(datagrams, arrival times) of a constant-rate stream."""
    n_packets = int(seconds * rate_bps / (TS * 8))
    n_packets -= n_packets % PER_DATAGRAM
    per_packet_s = TS * 8 / rate_bps
    pat = _section(0, 1, struct.pack(">HH", 1, 0xE000 | 0x1000))
    pmt = _section(2, 1, struct.pack(">HHBHHBHH", 0xE100, 0xF000, 0x1B, 0xE100, 0xF000, 0x0F, 0xE101, 0xF000))
    cc = {0: 0, 0x1000: 0, 0x100: 0, 0x101: 0}
    pkts = []
    next_psi = next_pcr = next_frame = next_audio = 0.0
    for i in range(n_packets):
        t = i * per_packet_s

        def nxt(pid: int) -> int:
            c = cc[pid]
            cc[pid] = (c + 1) & 15
            return c

        if t >= next_psi:
            next_psi += 0.1
            pkts.append(_packet(0, nxt(0), b"\x00" + pat, pusi=True))
            continue
        if t >= next_psi - 0.1 + per_packet_s and cc[0x1000] != cc[0]:
            pkts.append(_packet(0x1000, nxt(0x1000), b"\x00" + pmt, pusi=True))
            continue
        if t >= next_pcr:
            next_pcr += 0.04
            pkts.append(_packet(0x100, nxt(0x100), b"", pcr=round(t * 27e6)))
            continue
        if t >= next_frame:
            next_frame += 0.04
            pts = round(t * 90000)
            pes = bytes([0, 0, 1, 0xE0, 0, 0, 0x80, 0x80, 5, 0x21 | ((pts >> 29) & 0x0E), (pts >> 22) & 0xFF,
                         0x01 | ((pts >> 14) & 0xFE), (pts >> 7) & 0xFF, 0x01 | ((pts << 1) & 0xFE)])  # fmt: skip
            pkts.append(_packet(0x100, nxt(0x100), pes + b"\x00" * 170, pusi=True))
            continue
        if t >= next_audio:
            next_audio += 0.021
            pkts.append(_packet(0x101, nxt(0x101), b"\x00" * 184))
            continue
        if i % 20 == 19:  # ~5 % null stuffing
            pkts.append(bytes([0x47, 0x1F, 0xFF, 0x10]) + b"\xff" * 184)
            continue
        pkts.append(_packet(0x100, nxt(0x100), b"\x00" * 184))
    datagrams = [b"".join(pkts[i : i + PER_DATAGRAM]) for i in range(0, len(pkts), PER_DATAGRAM)]
    arrivals = [(i + 1) * PER_DATAGRAM * per_packet_s for i in range(len(datagrams))]
    return datagrams, arrivals


def _run(datagrams: list[bytes], arrivals: list[float], batch: int | None, path: str, media: bool) -> float:
    """CPU seconds spent inside the analysis calls; batch None = on_datagram.

    Like the engine, every batch is first received into the same preallocated slots (the copy
    is not timed), so the analysis reads cache-warm buffers as it does behind recvmmsg.
    """
    analysis_mod.NUMPY_MIN_PACKETS = 0 if path == "numpy" else 1 << 30
    fa = FlowAnalysis(media_analysis=media)
    size = max(len(d) for d in datagrams)
    slots = [bytearray(size) for _ in range(batch or 1)]
    stamps: list[int | None] = [None] * (batch or 1)
    clock = time.process_time
    elapsed = 0.0
    step = batch or 1
    for i in range(0, len(datagrams), step):
        chunk = datagrams[i : i + step]
        views = []
        for slot, d in zip(slots, chunk, strict=False):
            slot[: len(d)] = d
            views.append(memoryview(slot)[: len(d)])
        if batch is None:
            start = clock()
            fa.on_datagram(views[0], arrivals[i], None)
            elapsed += clock() - start
        else:
            times = arrivals[i : i + step]
            start = clock()
            fa.on_batch(views, times, stamps[: len(views)])
            elapsed += clock() - start
    assert fa.internal_errors == 0, fa.last_internal_error
    snap = fa.snapshot(arrivals[-1])["tr101290"]
    assert isinstance(snap, dict) and snap["cc_errors"] == 0, snap
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.analysis", description=__doc__.split("\n\n")[0])
    ap.add_argument("--forwarding-pps", type=float, default=None, help="the forwarding bench's peak datagrams/s")
    ap.add_argument("--seconds", type=float, default=1.0, help="stream length analysed per run")
    ap.add_argument("--rate-mbps", type=float, default=100.0, help="the synthetic stream's rate (Mbit/s)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-media", action="store_true", help="media_analysis off")
    args = ap.parse_args(argv)
    media = not args.no_media
    datagrams, arrivals = synthetic_stream(args.seconds, args.rate_mbps * 1e6)
    n_packets = len(datagrams) * PER_DATAGRAM
    saved = analysis_mod.NUMPY_MIN_PACKETS
    print(
        f"stream: {args.rate_mbps:g} Mbit/s, {n_packets} TS packets in {len(datagrams)} datagrams,"
        f" media_analysis={media}, {args.runs} runs, CPU time"
    )
    print(f"{'call':<16}{'path':<8}{'median TS pkt/s':>16}{'best TS pkt/s':>15}{'median dgram/s':>16}")
    rows: dict[tuple[str, str], float] = {}
    cases: list[tuple[str, int | None, str]] = [("on_datagram", None, "python")]
    for b in (1, 4, 8, 16, 32, 64, 128, 256):
        cases += [(f"on_batch({b})", b, "python"), (f"on_batch({b})", b, "numpy")]
    try:
        for label, batch, path in cases:
            times = [_run(datagrams, arrivals, batch, path, media) for _ in range(args.runs)]
            pps = n_packets / statistics.median(times)
            best = n_packets / min(times)
            rows[(label, path)] = pps
            print(f"{label:<16}{path:<8}{pps:>16,.0f}{best:>15,.0f}{pps / PER_DATAGRAM:>16,.0f}")
    finally:
        analysis_mod.NUMPY_MIN_PACKETS = saved
    chosen_path = "numpy" if 64 * PER_DATAGRAM >= saved else "python"
    chosen = rows[("on_batch(64)", chosen_path)]
    fwd = "n/a" if args.forwarding_pps is None else f"{args.forwarding_pps:,.0f} datagrams/s"
    fwd_ts = "n/a" if args.forwarding_pps is None else f"{args.forwarding_pps * PER_DATAGRAM:,.0f} TS packets/s"
    print()
    print(f"pure Python (on_datagram):       {rows[('on_datagram', 'python')]:>14,.0f} TS packets/s per core")
    print(
        f"chosen path at the engine's batch of 64 ({chosen_path}; numpy from {saved} packets):"
        f" {chosen:,.0f} TS packets/s per core"
    )
    print(f"forwarding peak:                 {fwd} ({fwd_ts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
