"""Loopback rates of ``appliance.netio``: batched vs per-packet receive and send (on demand).

    python -m bench.tools.netio_rates [--count 10000] [--runs 5] [--size 1328]

Receive: the socket queue is prefilled with ``count`` datagrams, then drained and timed (the
receive cost alone). Send: ``count`` datagrams are sent to a socket with a large buffer that is
drained afterwards (untimed); a run with any kernel drop (short count) is reported. Prints the
median pkt/s (wall clock) and CPU µs per datagram (``time.process_time``: this
process, including the kernel's loopback work done on its behalf) of ``runs`` runs per mode. On
a shared host the CPU figure is the steadier one. Loopback only; bounded in count and time.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from collections.abc import Callable

from appliance.netio import BatchReceiver, BatchSender, set_socket_buffers

_BUFFER_BYTES = 96 * 1024 * 1024


def _pair(family: int = socket.AF_INET) -> tuple[socket.socket, socket.socket, tuple[str, int]]:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    rx = socket.socket(family, socket.SOCK_DGRAM)
    rx.bind((host, 0))
    rx.setblocking(False)
    tx = socket.socket(family, socket.SOCK_DGRAM)
    tx.bind((host, 0))
    tx.setblocking(False)
    set_socket_buffers(rx, rcvbuf=_BUFFER_BYTES)
    set_socket_buffers(tx, sndbuf=4 * 1024 * 1024)
    return rx, tx, rx.getsockname()[:2]


def _fill(tx: socket.socket, dest: tuple[str, int], count: int, size: int, gso: bool) -> int:
    sender = BatchSender(tx, gso=gso)
    payload = [bytes([i & 0xFF]) * size for i in range(64)]
    sent = 0
    deadline = time.monotonic() + 10
    while sent < count and time.monotonic() < deadline:
        sent += sender.send_batch(payload[: min(64, count - sent)], dest)
    return sent


def _drain_plain(rx: socket.socket) -> int:
    buf = bytearray(65536)
    got = 0
    while True:
        try:
            rx.recvfrom_into(buf)
        except BlockingIOError:
            return got
        got += 1


def bench_receive(mode: str, count: int, size: int) -> tuple[float, float]:
    rx, tx, dest = _pair()
    with rx, tx:
        # The receiver exists before the fill: UDP_GRO must be on when the datagrams arrive.
        receiver = BatchReceiver(
            rx, batch=64, force_fallback=(mode == "BatchReceiver fallback"), gro=(mode == "recvmmsg+gro")
        )
        sent = _fill(tx, dest, count, size, gso=(mode == "recvmmsg+gro"))
        time.sleep(0.05)
        got = 0
        if mode == "recvfrom_into loop":  # the bare syscall loop: no views, times or sources kept
            buf = bytearray(2048)
            start, cpu_start = time.perf_counter(), time.process_time()
            while True:
                try:
                    rx.recvfrom_into(buf)
                except BlockingIOError:
                    break
                got += 1
        elif mode == "recvfrom_into, kept":  # what a driver does without netio: a slot, view, time each
            slots = [memoryview(bytearray(2048)) for _ in range(64)]
            start, cpu_start = time.perf_counter(), time.process_time()
            while True:
                views, arrivals, sources = [], [], []
                for slot in slots:
                    try:
                        n, source = rx.recvfrom_into(slot)
                    except BlockingIOError:
                        break
                    views.append(slot[:n])
                    arrivals.append(time.time())
                    sources.append(source)
                if not views:
                    break
                got += len(views)
        else:
            start, cpu_start = time.perf_counter(), time.process_time()
            while n := receiver.recv_batch():
                got += n
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        if got != sent:
            print(f"  ({mode}: sent {sent}, received {got})")
        return got / elapsed, cpu / max(got, 1) * 1e6


def bench_send(mode: str, count: int, size: int) -> tuple[float, float]:
    rx, tx, dest = _pair()
    with rx, tx:
        datagrams = [bytes([i & 0xFF]) * size for i in range(64)]
        sent = 0
        start, cpu_start = time.perf_counter(), time.process_time()
        if mode == "sendto loop":
            while sent < count:
                tx.sendto(datagrams[sent & 63], dest)
                sent += 1
        else:
            sender = BatchSender(tx, gso=(mode == "sendmmsg+gso"), force_fallback=(mode == "BatchSender fallback"))
            while sent < count:
                n = sender.send_batch(datagrams[: min(64, count - sent)], dest)
                if n == 0:
                    time.sleep(0.0001)  # the send buffer is full: rare with 4 MiB
                sent += n
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        got = _drain_plain(rx)
        if got != sent:
            print(f"  ({mode}: sent {sent}, received {got}: the run is not clean)")
        return sent / elapsed, cpu / max(sent, 1) * 1e6


def _medians(
    fn: Callable[[str, int, int], tuple[float, float]], modes: tuple[str, ...], args: argparse.Namespace
) -> list[tuple[float, float]]:
    """Median (pkt/s, CPU µs/pkt) per mode; modes take turns within each run, so load drifts hit all alike."""
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for _ in range(args.runs):
        for mode in modes:
            runs[mode].append(fn(mode, args.count, args.size))
    return [
        (statistics.median(r for r, _ in runs[mode]), statistics.median(c for _, c in runs[mode])) for mode in modes
    ]


def _table(title: str, modes: tuple[str, ...], results: list[tuple[float, float]]) -> None:
    print(f"{title:<26}{'pkt/s':>12}{'':>8}{'CPU us/pkt':>12}")
    for mode, (rate, cpu) in zip(modes, results, strict=True):
        print(f"{mode:<26}{rate:>12,.0f}  x{rate / results[0][0]:.2f}{cpu:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=1328, help="datagram bytes (RTP header + 7 TS packets)")
    args = parser.parse_args()
    args.count = min(args.count, 50000)
    print(f"loopback, {args.size}-byte datagrams, {args.count} per run, median of {args.runs}")
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores, shared)")
    receive_modes = ("recvfrom_into loop", "recvfrom_into, kept", "BatchReceiver fallback", "recvmmsg", "recvmmsg+gro")
    _table("receive", receive_modes, _medians(bench_receive, receive_modes, args))
    send_modes = ("sendto loop", "BatchSender fallback", "sendmmsg", "sendmmsg+gso")
    _table("send", send_modes, _medians(bench_send, send_modes, args))


if __name__ == "__main__":
    main()
