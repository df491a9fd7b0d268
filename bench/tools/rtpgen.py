"""RTP/MPEG-TS load generator, paced with sendmmsg/GSO batches (library and CLI).

    python -m bench.tools.rtpgen --dest 127.0.0.1:5000 --pps 20000 --seconds 5

Each datagram: a 12-byte RTP header (PT 33, incrementing sequence number, 90 kHz timestamp from
the media clock, RFC 3551 §6 / RFC 2250) and 7 valid TS packets (PAT, PMT, PCR, continuity
counters; see ``tsgen``) with a probe (packet index, send time) in the last one unless
``--no-probe``. ``--raw-ts``
sends the 1316-byte TS payload without the RTP header. Paced to ``pps`` in bursts of ``batch``
datagrams (default about one burst per millisecond); bounded by ``--seconds`` and ``--count``.
A library caller can put fixed ``prefix`` bytes before every datagram (the relay's native plane
wants ``[16-byte tunnel uuid][payload]``, interop.md 9); they are written once per reusable slot.

Library::

    gen = RtpGenerator(("127.0.0.1", 5000), pps=20000, seconds=1.0)
    report = gen.run()              # blocking, plain socket
    report = await gen.arun()       # the same under trio
"""

from __future__ import annotations

import argparse
import json
import math
import select
import socket
import struct
import time
from dataclasses import asdict, dataclass
from typing import Final

from appliance.netio import BatchSender, set_dscp, set_socket_buffers
from bench.tools.tsgen import TS_PAYLOAD_SIZE, TsPayloadWriter
from services.edge.core.rtp import PT_MP2T, RTP_FIXED_HEADER_LEN

RTP_CLOCK_HZ: Final = 90000
MAX_BATCH: Final = 64
_RTP: Final = struct.Struct("!BBHII")  # RFC 3550 §5.1: V=2, no padding/extension/CSRC; M=0, PT


@dataclass(slots=True)
class GeneratorReport:
    """What a run sent. ``send_stalls``: times the socket pushed back (datagrams were retried)."""

    sent: int
    seconds: float
    pps: float
    target_pps: float
    send_stalls: int
    first_sequence: int
    ssrc: int


def parse_endpoint(text: str) -> tuple[str, int]:
    """``"127.0.0.1:5000"`` or ``"[::1]:5000"`` -> ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class RtpGenerator:
    """Sends a paced RTP/MPEG-TS stream to ``dest`` until ``seconds`` or ``count`` is reached.

    Owns its socket (bound to ``bind``, default the loopback address of ``dest``'s family) unless
    ``sock`` is given. Datagrams are retried, never dropped, when the socket pushes back, so a
    sink's loss is the path's loss.
    """

    def __init__(
        self,
        dest: tuple[str, int],
        *,
        pps: float = 10000.0,
        seconds: float | None = 5.0,
        count: int | None = None,
        batch: int | None = None,
        raw_ts: bool = False,
        probe: bool = True,
        ssrc: int = 0x4D504C31,
        first_sequence: int = 0,
        sock: socket.socket | None = None,
        bind: tuple[str, int] | None = None,
        dscp: int | None = None,
        prefix: bytes = b"",
    ) -> None:
        if pps <= 0:
            raise ValueError("pps must be positive")
        if seconds is None and count is None:
            raise ValueError("give seconds or count: a run must be bounded")
        self.dest = dest
        self.pps = float(pps)
        self.seconds = seconds
        self.count = count
        self.batch = batch or max(1, min(MAX_BATCH, math.ceil(self.pps / 1000)))
        self.raw_ts = raw_ts
        self.ssrc = ssrc
        self.first_sequence = first_sequence
        family = socket.AF_INET6 if ":" in dest[0] else socket.AF_INET
        self._own_socket = sock is None
        if sock is None:
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.bind(bind or ("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
            set_socket_buffers(sock, sndbuf=4 * 1024 * 1024)
        sock.setblocking(False)
        if dscp is not None:
            set_dscp(sock, dscp)
        self.sock = sock
        self._sender = BatchSender(sock)
        header = 0 if raw_ts else RTP_FIXED_HEADER_LEN
        self.prefix = bytes(prefix)
        self._header = header
        self._offset = len(self.prefix)  # where the RTP header (or the raw TS) starts in a slot
        self._size = self._offset + header + TS_PAYLOAD_SIZE
        self._slots = [bytearray(self.prefix) + bytearray(self._size - self._offset) for _ in range(self.batch)]
        self._views = [memoryview(slot) for slot in self._slots]
        self._ts = TsPayloadWriter(probe=probe)
        self._built = 0  # datagrams built (== their packet index)
        self._pending: list[memoryview] = []
        self.sent = 0
        self.send_stalls = 0
        self._start = 0.0
        self._limit = count if count is not None else math.inf

    def close(self) -> None:
        if self._own_socket:
            self.sock.close()

    def __enter__(self) -> RtpGenerator:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _build(self, n: int) -> list[memoryview]:
        send_ns = time.time_ns()
        header, first_sequence, ssrc, offset = self._header, self.first_sequence, self.ssrc, self._offset
        for k in range(n):
            index = self._built + k
            slot = self._slots[k]
            media_s = index / self.pps
            if header:  # services.edge.core.rtp.build_rtp_header, inlined: it is the hot loop
                _RTP.pack_into(
                    slot,
                    offset,
                    0x80,
                    PT_MP2T,
                    (first_sequence + index) & 0xFFFF,
                    int(media_s * RTP_CLOCK_HZ) & 0xFFFFFFFF,
                    ssrc,
                )
            self._ts.write(slot, offset + header, media_s, index, send_ns)
        self._built += n
        return self._views[:n]

    def step(self, now: float) -> float | None:
        """Send what is due at ``now`` (perf_counter seconds); the delay until the next call, None when done."""
        if self._pending:
            sent = self._sender.send_batch(self._pending, self.dest)
            self.sent += sent
            self._pending = self._pending[sent:]
            if self._pending:
                self.send_stalls += 1
                return 0.0005
        elapsed = now - self._start
        if self.sent >= self._limit or (self.seconds is not None and elapsed >= self.seconds):
            return None
        due = min(int(elapsed * self.pps) + 1, self._limit) - self._built
        if due <= 0:
            return (self._built / self.pps) - elapsed
        views = self._build(min(due, self.batch))
        sent = self._sender.send_batch(views, self.dest)
        self.sent += sent
        if sent < len(views):
            self._pending = views[sent:]
            self.send_stalls += 1
            return 0.0005
        return 0.0 if due > len(views) else (self._built / self.pps) - elapsed

    def _report(self, elapsed: float) -> GeneratorReport:
        return GeneratorReport(
            sent=self.sent,
            seconds=round(elapsed, 4),
            pps=round(self.sent / elapsed, 1) if elapsed > 0 else 0.0,
            target_pps=self.pps,
            send_stalls=self.send_stalls,
            first_sequence=self.first_sequence,
            ssrc=self.ssrc,
        )

    def run(self) -> GeneratorReport:
        """Blocking run with time.sleep pacing (~0.1 ms granularity on Linux)."""
        self._start = time.perf_counter()
        while True:
            now = time.perf_counter()
            delay = self.step(now)
            if delay is None:
                return self._report(now - self._start)
            if self._pending:
                select.select([], [self.sock], [], delay)
            elif delay > 0:
                time.sleep(delay)

    async def arun(self) -> GeneratorReport:
        """The same run under trio (trio.sleep pacing; other tasks run between bursts)."""
        import trio

        self._start = time.perf_counter()
        while True:
            now = time.perf_counter()
            delay = self.step(now)
            if delay is None:
                return self._report(now - self._start)
            if self._pending:
                with trio.move_on_after(delay):
                    await trio.lowlevel.wait_writable(self.sock)
            elif delay > 0:
                await trio.sleep(delay)
            else:
                await trio.lowlevel.checkpoint()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.rtpgen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dest", type=parse_endpoint, required=True, help="HOST:PORT ([::1]:PORT for IPv6)")
    parser.add_argument("--pps", type=float, default=10000.0, help="datagrams per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="stop after this long (0: only --count)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many datagrams")
    parser.add_argument("--batch", type=int, default=None, help="datagrams per burst (default pps/1000, max 64)")
    parser.add_argument("--raw-ts", action="store_true", help="send the TS payload without an RTP header")
    parser.add_argument("--no-probe", action="store_true", help="no send time/index in the last TS packet")
    parser.add_argument("--ssrc", type=lambda s: int(s, 0), default=0x4D504C31)
    parser.add_argument("--dscp", type=int, default=None)
    args = parser.parse_args(argv)
    seconds = args.seconds or None
    if seconds is None and args.count is None:
        parser.error("give --seconds or --count")
    with RtpGenerator(
        args.dest,
        pps=args.pps,
        seconds=seconds,
        count=args.count,
        batch=args.batch,
        raw_ts=args.raw_ts,
        probe=not args.no_probe,
        ssrc=args.ssrc,
        dscp=args.dscp,
    ) as gen:
        report = gen.run()
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
