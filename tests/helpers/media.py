"""Test media: valid MPEG-TS in RTP, a bounded sender and a UDP sink.

The TS is well formed (ISO/IEC 13818-1): a PAT and a PMT every datagram group,
one video PID with continuity counters that advance, so the TR 101 290 analyser
sees no error unless a test damages it on purpose.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final

TS = 188
VIDEO_PID = 0x100
PMT_PID = 0x1000


def _crc32_mpeg(data: bytes) -> int:
    # ISO/IEC 13818-1 Annex A CRC-32 (poly 0x04C11DB7, no reflection, init 0xFFFFFFFF).
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


_ = zlib  # (zlib.crc32 is the reflected variant: not the MPEG one)


def _section_packet(pid: int, cc: int, section: bytes) -> bytes:
    payload = b"\x00" + section + struct.pack("!I", _crc32_mpeg(section))
    header = struct.pack("!BHB", 0x47, 0x4000 | pid, 0x10 | (cc & 0x0F))
    return header + payload + b"\xff" * (TS - 4 - len(payload))


# The PAT and PMT differ only in their continuity counter: 16 packets each, built once. (The
# bit-by-bit CRC above costs ~0.2 ms a section; 8,000 datagrams built inside a trio task blocked
# the event loop of an in-process edge for seconds on a loaded host.)
@lru_cache(maxsize=16)
def pat_packet(cc: int) -> bytes:
    body = struct.pack("!HBBB", 1, 0xC1, 0, 0) + struct.pack("!HH", 1, 0xE000 | PMT_PID)
    section = struct.pack("!BH", 0x00, 0xB000 | (len(body) + 4)) + body
    return _section_packet(0, cc, section)


@lru_cache(maxsize=16)
def pmt_packet(cc: int) -> bytes:
    body = struct.pack("!HBBBHH", 1, 0xC1, 0, 0, 0xE000 | VIDEO_PID, 0xF000)
    body += struct.pack("!BHH", 0x1B, 0xE000 | VIDEO_PID, 0xF000)  # H.264 video on VIDEO_PID
    section = struct.pack("!BH", 0x02, 0xB000 | (len(body) + 4)) + body
    return _section_packet(PMT_PID, cc, section)


def video_packet(cc: int) -> bytes:
    return struct.pack("!BHB", 0x47, VIDEO_PID, 0x10 | (cc & 0x0F)) + bytes(range(184))


class TsSource:
    """An endless TS of 7-packet datagrams: PAT+PMT then 5 video packets."""

    def __init__(self) -> None:
        self.cc = {0: 0, PMT_PID: 0, VIDEO_PID: 0}

    def _next(self, pid: int) -> int:
        value = self.cc[pid]
        self.cc[pid] = (value + 1) & 0x0F
        return value

    def datagram(self) -> bytes:
        packets = [pat_packet(self._next(0)), pmt_packet(self._next(PMT_PID))]
        packets += [video_packet(self._next(VIDEO_PID)) for _ in range(5)]
        return b"".join(packets)


def rtp_packet(seq: int, timestamp: int, payload: bytes, ssrc: int = 0x1234ABCD, pt: int = 33) -> bytes:
    return struct.pack("!BBHII", 0x80, pt, seq & 0xFFFF, timestamp & 0xFFFFFFFF, ssrc) + payload


def rtp_stream(count: int, *, first_seq: int = 0, ssrc: int = 0x1234ABCD) -> Iterator[bytes]:
    source = TsSource()
    for i in range(count):
        yield rtp_packet(first_seq + i, i * 900, source.datagram(), ssrc)


MAX_CATCH_UP: Final = 8
"""Datagrams a paced sender that fell behind sends back to back before it lets the rest slip."""


class Pacer:
    """Paces a test's sender at ``pps`` without bursts: after a stall (the test process not
    scheduled, on a loaded CI host) it sends at most :data:`MAX_CATCH_UP` datagrams back to back
    and lets the rest of the schedule slip. Catching up at once put 150+ datagrams into a
    receiver's default socket buffer (about 90 of them fit) and CI lost 65 in a row on both SRT
    legs of a test: at the feed, not in the product."""

    def __init__(
        self, pps: float, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._interval = 1.0 / pps
        self._clock, self._sleep = clock, sleep
        self._due = clock()

    def sent_one(self) -> None:
        """Call after each datagram: sleeps until the next is due."""
        self._due += self._interval
        now = self._clock()
        if self._due > now:
            self._sleep(self._due - now)
        elif now - self._due > MAX_CATCH_UP * self._interval:
            self._due = now - MAX_CATCH_UP * self._interval


def send_datagrams(dest: tuple[str, int], datagrams: Iterator[bytes] | list[bytes], pps: float = 2000.0) -> int:
    """Send paced datagrams (bounded by the iterable, no bursts: :class:`Pacer`); the count sent."""
    family = socket.AF_INET6 if ":" in dest[0] else socket.AF_INET
    sent = 0
    pacer = Pacer(pps)
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        for datagram in datagrams:
            sock.sendto(datagram, dest)
            sent += 1
            pacer.sent_one()
    return sent


@dataclass
class UdpSink:
    """Receives on 127.0.0.1:port in a thread; bounded by ``stop()``."""

    port: int
    host: str = "127.0.0.1"
    datagrams: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self._sock.bind((self.host, self.port))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.datagrams.append(data)

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
        return self.datagrams

    def __enter__(self) -> UdpSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ts_decode_errors(ts: bytes, tmp_path: Path) -> str:
    """What ``ffmpeg -v error`` says decoding ``ts`` (an MPEG-TS capture) to null: "" when clean.

    Frames are timed on the demuxer's 90 kHz clock (``-enc_time_base:v -1``), not on a grid of the
    guessed frame rate, where two frames of a variable-rate source (a browser's camera under load)
    could land on one tick and the null muxer would call that an error."""
    from tests.helpers.tools import need_tool

    path = tmp_path / "out.ts"
    path.write_bytes(ts)
    run = subprocess.run(
        [
            need_tool("ffmpeg"),
            "-nostdin",
            "-v",
            "error",
            "-f",
            "mpegts",
            "-i",
            str(path),
            "-enc_time_base:v",
            "-1",
            "-f",
            "null",
            "-",
        ],
        capture_output=True,
        timeout=60,
    )
    return run.stderr.decode(errors="replace") + ("" if run.returncode == 0 else f"exit {run.returncode}")
