"""RTP / raw-UDP MPEG-TS sink: counts received, lost, reordered, duplicated; latency percentiles.

    python -m bench.tools.rtpsink --bind 127.0.0.1:5000 --seconds 5 [--mode rtp|ts] [--idle 1]

``rtp`` mode counts by RTP sequence number (RFC 3550 A.1 extended sequence): ``lost`` is
expected minus unique received at the end (late arrivals are reordered, not lost);
``duplicated`` is a sequence number seen again within the last 32768. ``ts`` mode (raw UDP TS
outputs) counts by TS continuity counters per PID (ISO/IEC 13818-1 §2.4.3.3: one repeat is a
legal duplicate; a gap counts the missing TS packets). Both read the ``rtpgen`` probe when
present: latency = kernel receive time - embedded send time (same host clock). A library caller
can give ``skip``: bytes ignored at the start of every datagram (the native relay plane's 16-byte
tunnel uuid, interop.md 9) before the RTP header or the TS.

Library::

    with RtpSink(("127.0.0.1", 0), seconds=2) as sink:   # sink.address: the bound port
        report = sink.run()          # blocking; or: report = await sink.arun() under trio
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Final

from appliance.netio import BatchReceiver, set_socket_buffers
from bench.tools.tsgen import TS_PACKET_SIZE, read_probe
from services.edge.core.rtp import parse_rtp, seq_delta

_WINDOW: Final = 32768  # sequence numbers remembered for duplicate detection
_MAX_LATENCY_SAMPLES: Final = 1_000_000


class SequenceCounter:
    """Loss, reordering and duplication of one RTP stream by sequence number (sans-IO)."""

    def __init__(self) -> None:
        self.received = 0
        self.duplicated = 0
        self.reordered = 0
        self.first: int | None = None
        self.highest = 0  # extended sequence number
        self._seen = [-1] * 65536  # extended sequence last seen in each 16-bit slot

    def feed(self, sequence: int) -> None:
        self.received += 1
        if self.first is None:
            self.first = self.highest = sequence
            self._seen[sequence] = sequence
            return
        ext = self.highest + seq_delta(sequence, self.highest & 0xFFFF)
        slot = ext & 0xFFFF
        if self._seen[slot] == ext:
            self.duplicated += 1
            return
        if ext < self.highest - _WINDOW:  # older than the window: unknowable, call it late
            self.reordered += 1
            return
        self._seen[slot] = ext
        if ext > self.highest:
            self.highest = ext
        else:
            self.reordered += 1

    @property
    def unique(self) -> int:
        return self.received - self.duplicated

    @property
    def expected(self) -> int:
        return 0 if self.first is None else self.highest - self.first + 1

    @property
    def lost(self) -> int:
        return max(0, self.expected - self.unique)


class ContinuityCounter:
    """TS continuity per PID over whole datagrams of 188-byte packets (sans-IO)."""

    def __init__(self) -> None:
        self.ts_packets = 0
        self.cc_errors = 0
        self.ts_lost = 0  # TS packets missing according to the counter gaps
        self.ts_duplicates = 0
        self.sync_errors = 0
        self._last = [-1] * 8192

    def feed(self, payload: bytes | bytearray | memoryview) -> None:
        last = self._last
        for offset in range(0, len(payload) - TS_PACKET_SIZE + 1, TS_PACKET_SIZE):
            if payload[offset] != 0x47:
                self.sync_errors += 1
                continue
            self.ts_packets += 1
            pid = ((payload[offset + 1] & 0x1F) << 8) | payload[offset + 2]
            flags = payload[offset + 3]
            if pid == 0x1FFF or not flags & 0x10:  # null packets; no payload: counter does not move
                continue
            cc = flags & 0x0F
            previous = last[pid]
            last[pid] = cc
            if previous < 0:
                continue
            if cc == previous:
                self.ts_duplicates += 1
            elif cc != (previous + 1) & 0x0F:
                self.cc_errors += 1
                self.ts_lost += (cc - previous - 1) & 0x0F


@dataclass(slots=True)
class SinkReport:
    received: int = 0
    lost: int = 0
    reordered: int = 0
    duplicated: int = 0
    expected: int = 0
    not_rtp: int = 0
    bytes: int = 0
    seconds: float = 0.0
    pps: float = 0.0
    cc_errors: int = 0
    ts_lost: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)


class RtpSink:
    """Receives on ``bind`` (or ``sock``) and counts, until ``seconds``, ``count`` or ``idle``.

    ``idle``: stop once nothing arrived for this long after the first datagram. ``mode``:
    ``"rtp"`` or ``"ts"``; ``check_cc`` runs the TS continuity check in ``rtp`` mode too
    (costs ~2 µs per datagram). ``skip``: bytes ignored at the start of each datagram. The
    receive buffer is 32 MiB, so the sink is not the bottleneck in a loss measurement (check
    ``RcvbufErrors`` anyway).
    """

    def __init__(
        self,
        bind: tuple[str, int] = ("127.0.0.1", 0),
        *,
        seconds: float = 5.0,
        count: int | None = None,
        idle: float | None = None,
        mode: str = "rtp",
        check_cc: bool = False,
        latency: bool = True,
        sock: socket.socket | None = None,
        skip: int = 0,
    ) -> None:
        if skip < 0:
            raise ValueError("skip must not be negative")
        if mode not in ("rtp", "ts"):
            raise ValueError(f"mode must be 'rtp' or 'ts', got {mode!r}")
        self._own_socket = sock is None
        if sock is None:
            family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_DGRAM)
            set_socket_buffers(sock, rcvbuf=32 * 1024 * 1024)
            sock.bind(bind)
        sock.setblocking(False)
        self.sock = sock
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self.seconds = seconds
        self.count = count
        self.idle = idle
        self.mode = mode
        self.check_cc = check_cc or mode == "ts"
        self.latency = latency
        self.skip = skip
        self.sequence = SequenceCounter()
        self.continuity = ContinuityCounter()
        self.not_rtp = 0
        self.bytes = 0
        self.latencies: list[float] = []
        self._receiver = BatchReceiver(sock, batch=64, slot_size=2048)
        self.datagrams = 0
        self._first_arrival = 0.0  # kernel times (time.time() domain)
        self._last_kernel_arrival = 0.0
        self._last_arrival = 0.0  # monotonic, for the idle stop

    def close(self) -> None:
        if self._own_socket:
            self.sock.close()

    def __enter__(self) -> RtpSink:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def feed(self, datagram: memoryview, arrival: float) -> None:
        """Count one datagram (the sans-IO entry point; the drivers below call it)."""
        self.datagrams += 1
        self.bytes += len(datagram)
        if self.skip:
            datagram = datagram[self.skip :]
        if self.mode == "rtp":
            if len(datagram) >= 12 and datagram[0] == 0x80:  # V=2 without P, X, CSRC: the usual case
                self.sequence.feed((datagram[2] << 8) | datagram[3])
                payload = datagram[12:]
            else:
                header = parse_rtp(datagram)
                if header is None:
                    self.not_rtp += 1
                    return
                self.sequence.feed(header.sequence)
                payload = datagram[header.payload_offset : header.payload_end]
        else:
            payload = datagram
        if self.check_cc:
            self.continuity.feed(payload)
        if self.latency or self.mode == "ts":
            probe = read_probe(payload)
            if probe is not None:
                if self.mode == "ts":  # no RTP header: the probe's packet index is the sequence
                    self.sequence.feed(probe[0] & 0xFFFF)
                if self.latency and len(self.latencies) < _MAX_LATENCY_SAMPLES:
                    self.latencies.append(arrival - probe[1] * 1e-9)

    def poll(self) -> int:
        """Drain what is queued now; returns how many datagrams were counted."""
        total = 0
        receiver = self._receiver
        while (n := receiver.recv_batch()) > 0:
            if not self._first_arrival:
                self._first_arrival = receiver.arrivals[0]
            self._last_kernel_arrival = receiver.arrivals[-1]
            self._last_arrival = time.monotonic()
            for view, arrival in zip(receiver.views, receiver.arrivals, strict=True):
                self.feed(view, arrival)
            total += n
            if n < 64:
                break
        return total

    def _done(self, start: float, now: float) -> bool:
        if now - start >= self.seconds:
            return True
        if self.count is not None and self.datagrams >= self.count:
            return True
        return self.idle is not None and self._last_arrival > 0 and now - self._last_arrival >= self.idle

    def run(self) -> SinkReport:
        """Blocking run (select-based waits)."""
        start = time.monotonic()
        while not self._done(start, time.monotonic()):
            if not self.poll():
                select.select([self.sock], [], [], 0.05)
        return self.report(time.monotonic() - start)

    async def arun(self) -> SinkReport:
        """The same under trio."""
        import trio

        start = time.monotonic()
        while not self._done(start, time.monotonic()):
            if not self.poll():
                with trio.move_on_after(0.05):
                    await trio.lowlevel.wait_readable(self.sock)
            else:
                await trio.lowlevel.checkpoint()
        return self.report(time.monotonic() - start)

    def report(self, elapsed: float) -> SinkReport:
        """The counts so far; ``pps`` is over the span between the first and last arrival."""
        seq = self.sequence
        received = self.datagrams - self.not_rtp
        span = self._last_kernel_arrival - self._first_arrival
        return SinkReport(
            received=received,
            lost=seq.lost,
            reordered=seq.reordered,
            duplicated=seq.duplicated,
            expected=seq.expected,
            not_rtp=self.not_rtp,
            bytes=self.bytes,
            seconds=round(elapsed, 4),
            pps=round((received - 1) / span, 1) if span > 0 else 0.0,
            cc_errors=self.continuity.cc_errors,
            ts_lost=self.continuity.ts_lost,
            latency_ms=_percentiles(self.latencies),
        )


def _percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)
    last = len(ordered) - 1

    def at(q: float) -> float:
        return round(ordered[min(last, int(q * last + 0.5))] * 1000, 3)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "p99.9": at(0.999), "max": at(1.0)}


def main(argv: list[str] | None = None) -> None:
    from bench.tools.rtpgen import parse_endpoint

    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.rtpsink", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bind", type=parse_endpoint, required=True, help="HOST:PORT to receive on")
    parser.add_argument("--seconds", type=float, default=5.0, help="stop after this long")
    parser.add_argument("--count", type=int, default=None, help="stop after this many datagrams")
    parser.add_argument("--idle", type=float, default=None, help="stop after this long without datagrams")
    parser.add_argument("--mode", choices=("rtp", "ts"), default="rtp")
    parser.add_argument("--check-cc", action="store_true", help="also check TS continuity in rtp mode")
    args = parser.parse_args(argv)
    with RtpSink(
        args.bind, seconds=args.seconds, count=args.count, idle=args.idle, mode=args.mode, check_cc=args.check_cc
    ) as sink:
        print(json.dumps({"listening": f"{sink.address[0]}:{sink.address[1]}"}), flush=True)
        report = sink.run()
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
