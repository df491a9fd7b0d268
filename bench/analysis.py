"""How fast the stream analysis runs, in CPU time per datagram (process_time), per entry point.

    python -m bench.analysis [--seconds S] [--runs N] [--before REV] [--no-media] [--paths]

Two streams of 7-packet datagrams: the forwarding bench's (bench/tools/tsgen.py: H.264-typed
video PID with a PCR every 20 ms, PAT+PMT every 40 datagrams, RTP timestamps, 150 k datagrams/s)
and a synthetic mixed one (default 100 Mbit/s raw UDP: PAT/PMT every 100 ms, video with a PCR
and a PES start every 40 ms, an audio PID, ~5 % null stuffing). Each goes through
``FlowAnalysis`` per datagram (``on_datagram``), as batches of memoryviews (``on_batch``) and
in the engine's receive layout (``on_strided``: slot k at k * 2048, TS bytes after 12 bytes
of RTP header) at batch sizes 1, 8, 48 and 64. Like the engine, each batch is first received
into preallocated slots (the copy is not timed); about 64 datagrams are timed per clock read.
Prints medians of ``--runs`` runs in µs per datagram (1 s of the synthetic stream, 0.2 s =
30 k datagrams of the forwarding one). ``--before REV`` also measures
``on_datagram``/``on_batch`` of the analysis code at git revision REV (default: the commit
before the batch fast path), in a subprocess on an exported tree. ``--paths`` adds the older
table (TS packets/s per core, Python vs numpy path, batches 1-256).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


def _paths_table(args: argparse.Namespace, media: bool) -> None:
    """The older table: TS packets/s per core, on_datagram and on_batch forced onto each path."""
    datagrams, arrivals = synthetic_stream(args.seconds, args.rate_mbps * 1e6)
    n_packets = len(datagrams) * PER_DATAGRAM
    saved = analysis_mod.NUMPY_MIN_PACKETS
    print(
        f"\nstream: {args.rate_mbps:g} Mbit/s, {n_packets} TS packets in {len(datagrams)} datagrams,"
        f" media_analysis={media}, {args.runs} runs, CPU time"
    )
    print(f"{'call':<16}{'path':<8}{'median TS pkt/s':>16}{'best TS pkt/s':>15}{'median dgram/s':>16}")
    cases: list[tuple[str, int | None, str]] = [("on_datagram", None, "python")]
    for b in (1, 4, 8, 16, 32, 64, 128, 256):
        cases += [(f"on_batch({b})", b, "python"), (f"on_batch({b})", b, "numpy")]
    try:
        for label, batch, path in cases:
            times = [_run(datagrams, arrivals, batch, path, media) for _ in range(args.runs)]
            pps = n_packets / statistics.median(times)
            best = n_packets / min(times)
            print(f"{label:<16}{path:<8}{pps:>16,.0f}{best:>15,.0f}{pps / PER_DATAGRAM:>16,.0f}")
    finally:
        analysis_mod.NUMPY_MIN_PACKETS = saved


# ------------------------------------------------------------------ µs per datagram, per entry point
SLOT = 2048  # the engine's receive slots (appliance/netio BatchReceiver)
RTP_HEADER = 12
BATCHES = (1, 8, 48, 64)
ROUND = 64  # datagrams timed per clock read
Stream = tuple[list[bytes], list[float], list[int] | None]


def forwarding_stream(seconds: float, rate: float = 150_000.0) -> Stream:
    """The forwarding bench's stream (bench/tools/tsgen.py) with 90 kHz RTP timestamps."""
    from bench.tools.tsgen import TsPayloadWriter

    writer = TsPayloadWriter()
    buf = bytearray(TS * PER_DATAGRAM)
    datagrams = []
    for i in range(int(seconds * rate)):
        writer.write(buf, 0, i / rate, i, 0)
        datagrams.append(bytes(buf))
    arrivals = [100.0 + i / rate for i in range(len(datagrams))]
    stamps = [(0xFFFF0000 + i * 90_000 // int(rate)) & 0xFFFFFFFF for i in range(len(datagrams))]
    return datagrams, arrivals, stamps


def time_entry(stream: Stream, mode: str, batch: int, media: bool) -> float:
    """CPU µs per datagram of one entry point over the stream (one run).

    Rounds of about ROUND datagrams: the round's batches are copied into their own slot
    buffers (not timed), then the calls of the round are timed together. The first fifth of
    the stream warms the analyser up (a flow runs for hours: its tables, plans and patterns are
    learnt once).
    """
    from services.edge.core.analysis import FlowAnalysis

    datagrams, arrivals, stamps = stream
    fa = FlowAnalysis(media_analysis=media)
    per_round = max(1, ROUND // batch)
    size = len(datagrams[0])
    bufs = [bytearray(SLOT * batch) for _ in range(per_round)]
    views = [[memoryview(b)[k * SLOT + RTP_HEADER : k * SLOT + RTP_HEADER + size] for k in range(batch)] for b in bufs]
    clock = time.process_time
    elapsed = 0.0
    step = batch * per_round
    no_stamps: list[int | None] = [None] * batch
    warm = len(datagrams) // 5  # the first fifth is not timed (tables, plans, patterns learnt)
    timed = 0
    for start in range(0, len(datagrams) - step + 1, step):
        calls: list[Callable[[], None]] = []
        for r in range(per_round):
            first = start + r * batch
            buf = bufs[r]
            for k in range(batch):
                buf[k * SLOT + RTP_HEADER : k * SLOT + RTP_HEADER + size] = datagrams[first + k]
            times = arrivals[first : first + batch]
            rtp = None if stamps is None else stamps[first : first + batch]
            if mode == "on_strided":
                calls.append(lambda b=buf, t=times, s=rtp: fa.on_strided(b, RTP_HEADER, SLOT, batch, size, t, s))
            elif mode == "on_batch":
                s2: list[int | None] = no_stamps if rtp is None else list(rtp)
                calls.append(lambda v=views[r], t=times, s=s2: fa.on_batch(v, t, s))
            else:
                for k in range(batch):
                    stamp = None if rtp is None else rtp[k]
                    calls.append(lambda v=views[r][k], t=times[k], s=stamp: fa.on_datagram(v, t, s))
        t0 = clock()
        for call in calls:
            call()
        if start >= warm:
            elapsed += clock() - t0
            timed += step
    n = timed
    # The timed loop calls through a lambda; measure that overhead and take it off.
    calls = [lambda: None] * n
    t0 = clock()
    for call in calls:
        call()
    overhead = clock() - t0
    assert fa.internal_errors == 0, fa.last_internal_error
    return (elapsed - overhead * (n if mode == "on_datagram" else n // batch) / n) / n * 1e6


def measure(
    streams: dict[str, Stream], modes: list[str], runs: int, media: bool
) -> dict[str, dict[str, dict[int, float]]]:
    """{stream: {mode: {batch: median µs per datagram}}}; on_datagram is measured once."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, stream in streams.items():
        out[name] = {}
        for mode in modes:
            batches = (ROUND,) if mode == "on_datagram" else BATCHES
            out[name][mode] = {
                b: statistics.median(time_entry(stream, mode, b, media) for _ in range(runs)) for b in batches
            }
    return out


def _streams(seconds: float, rate_mbps: float) -> dict[str, Stream]:
    datagrams, arrivals = synthetic_stream(seconds, rate_mbps * 1e6)
    return {
        "forwarding (tsgen, RTP)": forwarding_stream(min(seconds, 0.2)),
        f"synthetic mixed {rate_mbps:g} Mbit/s (UDP)": (datagrams, [100.0 + t for t in arrivals], None),
    }


def _before(rev: str, args: argparse.Namespace, media: bool) -> dict[str, dict[str, dict[int, float]]] | None:
    """on_datagram and on_batch of the analysis code at ``rev``: ``services`` exported from git
    beside a link to this bench, measured in a subprocess (its own imports)."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "services"], capture_output=True, check=False)
        if archive.returncode:
            print(f"--before {rev}: {archive.stderr.decode().strip()}", file=sys.stderr)
            return None
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        os.symlink(root / "bench", Path(tmp) / "bench")
        cmd = [sys.executable, "-m", "bench.analysis", "--_measure", "on_datagram,on_batch"]
        cmd += ["--seconds", str(args.seconds), "--rate-mbps", str(args.rate_mbps), "--runs", str(args.runs)]
        cmd += ["--no-media"] if not media else []
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=env, check=False)
        if done.returncode:
            print(f"--before {rev}: {done.stderr.strip()[-500:]}", file=sys.stderr)
            return None
        result: dict[str, dict[str, dict[int, float]]] = json.loads(done.stdout.splitlines()[-1])
        return {s: {m: {int(b): v for b, v in by.items()} for m, by in modes.items()} for s, modes in result.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.analysis", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="stream length per run (forwarding: at most 0.2 s)")
    ap.add_argument("--rate-mbps", type=float, default=100.0, help="the synthetic stream's rate (Mbit/s)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-media", action="store_true", help="media_analysis off")
    ap.add_argument("--before", default="6ef7adc^", help="git revision to measure on_batch before (''=skip)")
    ap.add_argument("--paths", action="store_true", help="also the Python-vs-numpy path table")
    ap.add_argument("--_measure", default=None, help=argparse.SUPPRESS)  # --before's subprocess
    args = ap.parse_args(argv)
    media = not args.no_media
    streams = _streams(args.seconds, args.rate_mbps)
    if args._measure:
        print(json.dumps(measure(streams, args._measure.split(","), args.runs, media)))
        return 0
    before = _before(args.before, args, media) if args.before else None
    now = measure(streams, ["on_datagram", "on_batch", "on_strided"], args.runs, media)
    print(
        f"CPU µs per datagram (7 TS packets), median of {args.runs} runs, {args.seconds:g} s of each stream,"
        f" media_analysis={media}; 'before' = {args.before or 'not measured'}"
    )
    head = f"{'stream':<38}{'batch':>6}{'on_datagram':>13}{'on_batch before':>17}{'on_batch':>10}{'on_strided':>12}"
    print(head)
    for name in streams:
        per_dg = now[name]["on_datagram"][ROUND]
        per_dg_before = before[name]["on_datagram"][ROUND] if before else None
        for b in BATCHES:
            old = f"{before[name]['on_batch'][b]:.3f}" if before else "n/a"
            dg = f"{per_dg:.3f}" + (f" ({per_dg_before:.2f})" if per_dg_before is not None and b == BATCHES[0] else "")
            print(
                f"{name:<38}{b:>6}{dg if b == BATCHES[0] else '':>13}{old:>17}"
                f"{now[name]['on_batch'][b]:>10.3f}{now[name]['on_strided'][b]:>12.3f}"
            )
    if before:
        print("(on_datagram before in brackets)")
    if args.paths:
        _paths_table(args, media)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
