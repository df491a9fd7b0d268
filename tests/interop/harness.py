"""Thin trio drivers around the FEC and 2022-7 cores, for interop tests with real peers.

These are what the engine's drivers will look like (H1): sockets in, ``(datagram, now)`` into the
core, outputs drained after each datagram and on each timer. Every loop is bounded in time.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from services.edge.core.fec import FecDecoder, FecEncoder, parse_fec
from services.edge.core.merge2022_7 import HitlessMerger, MergerEvent
from services.edge.core.rtp import build_rtp_header
from tests.tools.lossy_proxy import LossyUdpProxy, free_port_block

RCVBUF_BYTES = 4 << 20  # rmem_max here is 4 MiB: absorbs a whole test stream


def require_tool(*argv: str) -> None:
    """Skip when a peer tool (or a GStreamer element) is missing; fail instead under CI."""
    ok = shutil.which(argv[0]) is not None
    if ok and len(argv) > 1:
        ok = subprocess.run(list(argv), capture_output=True, timeout=30, check=False).returncode == 0
    if not ok:
        message = f"interop peer missing: {' '.join(argv)}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def udp_socket(port: int = 0) -> trio.socket.SocketType:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    return sock


async def bound_udp_socket(port: int = 0) -> trio.socket.SocketType:
    sock = udp_socket()
    await sock.bind(("127.0.0.1", port))
    return sock


def port_of(sock: trio.socket.SocketType) -> int:
    return int(sock.getsockname()[1])


def udp_port_bound(port: int) -> bool:
    """Whether some process has a UDP socket bound to ``port`` (reads /proc/net/udp)."""
    needle = f":{port:04X} "
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            if needle in Path(table).read_text():
                return True
        except OSError:
            continue
    return False


async def wait_udp_bound(ports: Sequence[int], timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not all(udp_port_bound(p) for p in ports):
            await trio.sleep(0.05)


@dataclass
class ReceiveResult:
    output: list[bytes] = field(default_factory=list)
    fec: list[bytes] = field(default_factory=list)  # FEC datagrams as received (for the model)
    received: list[int] = field(default_factory=lambda: [0, 0, 0])
    events: list[MergerEvent] = field(default_factory=list)


async def _pump(
    sock: trio.socket.SocketType,
    handle: Callable[[memoryview, float], None],
    seen: list[float],
    idx: int,
    counts: list[int],
) -> None:
    buf = bytearray(65536)
    while True:
        n = await sock.recv_into(buf)
        now = trio.current_time()
        seen[0] = now
        counts[idx] += 1
        handle(memoryview(buf)[:n], now)


async def drive(
    sockets: Sequence[tuple[trio.socket.SocketType, Callable[[memoryview, float], None]]],
    core: FecDecoder | HitlessMerger,
    result: ReceiveResult,
    *,
    idle_s: float,
    max_s: float,
    tick_s: float = 0.005,
) -> None:
    """Receive on every socket into the core until idle for ``idle_s`` (after traffic) or ``max_s``."""
    seen = [0.0]
    start = trio.current_time()

    def drain() -> None:
        while (packet := core.pop_output()) is not None:
            result.output.append(packet)
        if isinstance(core, HitlessMerger):
            while (event := core.next_event()) is not None:
                result.events.append(event)

    async with trio.open_nursery() as nursery:
        for idx, (sock, handle) in enumerate(sockets):

            def handle_and_drain(
                view: memoryview, now: float, _h: Callable[[memoryview, float], None] = handle
            ) -> None:
                _h(view, now)
                drain()

            nursery.start_soon(_pump, sock, handle_and_drain, seen, idx, result.received)
        while True:
            await trio.sleep(tick_s)
            now = trio.current_time()
            timer = core.get_timer()
            if timer is not None and timer <= now:
                core.handle_timer(now)
            drain()
            if seen[0] and now - seen[0] > idle_s:
                break
            if now - start > max_s:
                break
        nursery.cancel_scope.cancel()
    core.handle_timer(trio.current_time() + 3600.0)
    core.flush()
    drain()


async def receive_fec(
    decoder: FecDecoder,
    media: trio.socket.SocketType,
    column: trio.socket.SocketType,
    row: trio.socket.SocketType,
    *,
    idle_s: float = 1.5,
    max_s: float = 30.0,
) -> ReceiveResult:
    result = ReceiveResult()

    def on_fec(view: memoryview, now: float) -> None:
        result.fec.append(bytes(view))
        decoder.on_fec(view, now)

    await drive(
        [(media, decoder.on_media), (column, on_fec), (row, on_fec)], decoder, result, idle_s=idle_s, max_s=max_s
    )
    return result


async def receive_merged(
    merger: HitlessMerger,
    leg0: trio.socket.SocketType,
    leg1: trio.socket.SocketType,
    *,
    idle_s: float = 1.0,
    max_s: float = 30.0,
) -> ReceiveResult:
    result = ReceiveResult()
    await drive(
        [(leg0, lambda v, t: merger.feed(0, v, t)), (leg1, lambda v, t: merger.feed(1, v, t))],
        merger,
        result,
        idle_s=idle_s,
        max_s=max_s,
    )
    return result


# -- loss model -------------------------------------------------------------------------------
def fec_groups(fec_datagrams: Sequence[bytes]) -> list[tuple[int, ...]]:
    """The media sequence numbers each received FEC packet protects."""
    groups = []
    for datagram in fec_datagrams:
        fec = parse_fec(datagram)
        assert fec is not None
        groups.append(tuple((fec.snbase + k * fec.offset) & 0xFFFF for k in range(fec.na)))
    return groups


def recoverable(lost: set[int], groups: Sequence[tuple[int, ...]]) -> set[int]:
    """Iterative peeling: the lost sequence numbers that XOR FEC can rebuild from ``groups``."""
    lost = set(lost)
    rebuilt: set[int] = set()
    changed = True
    while changed:
        changed = False
        for group in groups:
            missing = [s for s in group if s in lost]
            if len(missing) == 1:
                lost.discard(missing[0])
                rebuilt.add(missing[0])
                changed = True
    return rebuilt


def seq_of(datagram: bytes) -> int:
    return (datagram[2] << 8) | datagram[3]


# -- sources ----------------------------------------------------------------------------------
def make_ts_file(path: Path, seconds: float = 2.5, video_kbps: int = 1500, muxrate_kbps: int = 3000) -> Path:
    """A short MPEG-2 video transport stream made by ffmpeg (the bytes every peer sends).

    Constant ``muxrate_kbps`` (null-padded), so a sender paces it evenly: the defaults give
    about 700 RTP datagrams of 7 TS packets.
    """
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
         "testsrc=size=320x240:rate=25", "-t", str(seconds), "-c:v", "mpeg2video", "-b:v", f"{video_kbps}k",
         "-f", "mpegts", "-muxrate", f"{muxrate_kbps}k", str(path)],
        check=True, timeout=60,
    )  # fmt: skip
    return path


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Wait for an external sender to end (killed after ``timeout_s``); it must exit 0."""
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 0, (err or b"").decode(errors="replace")[-2000:]


def rtp_packets_from_ts(ts: bytes, *, first_seq: int, ssrc: int, pt: int = 33) -> list[bytes]:
    """Packetise whole TS packets 7 per RTP datagram (RFC 2250), 90 kHz timestamps."""
    out = []
    for i, off in enumerate(range(0, len(ts) - len(ts) % 1316, 1316)):
        pkt = bytearray(12 + 1316)
        build_rtp_header(pkt, payload_type=pt, sequence=first_seq + i, timestamp=i * 900, ssrc=ssrc)
        pkt[12:] = ts[off : off + 1316]
        out.append(bytes(pkt))
    return out


async def send_with_fec(
    packets: Sequence[bytes],
    encoder: FecEncoder,
    media_to: tuple[str, int],
    column_to: tuple[str, int],
    row_to: tuple[str, int],
    *,
    rate_pps: float = 1000.0,
) -> None:
    """Our FEC output over UDP: media, paced column FEC, row FEC (a thin output driver)."""
    sock = udp_socket()
    try:
        batch = 10
        for start in range(0, len(packets), batch):
            for packet in packets[start : start + batch]:
                await sock.sendto(packet, media_to)
                encoder.on_media(memoryview(packet), trio.current_time())
                while (col := encoder.pop_column()) is not None:
                    await sock.sendto(col, column_to)
                while (row := encoder.pop_row()) is not None:
                    await sock.sendto(row, row_to)
            await trio.sleep(batch / rate_pps)
        encoder.flush()
        while (col := encoder.pop_column()) is not None:
            await sock.sendto(col, column_to)
    finally:
        sock.close()


def proxy_block(targets: Sequence[tuple[str, int]], lossy: dict[int, dict[str, object]]) -> list[LossyUdpProxy]:
    """Proxies listening on P, P+2, P+4 (what a 2022-1 sender addresses) forwarding to ``targets``.

    ``lossy`` maps a position (0 media, 1 column, 2 row) to ``LossyUdpProxy`` keyword arguments.
    """
    for _ in range(10):
        base = free_port_block()
        proxies: list[LossyUdpProxy] = []
        try:
            for i, target in enumerate(targets):
                proxies.append(LossyUdpProxy(target, listen=("127.0.0.1", base + 2 * i), **lossy.get(i, {})))  # type: ignore[arg-type]
            return proxies
        except OSError:
            for p in proxies:
                p.stop()
    raise RuntimeError("could not bind a proxy port block")
