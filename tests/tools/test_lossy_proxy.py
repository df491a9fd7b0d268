"""The lossy UDP proxy used by the interop tests: drop rules are exact and reproducible."""

from __future__ import annotations

import socket
import time

import pytest

from tests.tools.lossy_proxy import LossyUdpProxy


def rtp(seq: int) -> bytes:
    return bytes([0x80, 33, seq >> 8, seq & 0xFF]) + bytes(8) + seq.to_bytes(4, "big")


def test_rules_without_the_thread() -> None:
    proxy = LossyUdpProxy(("127.0.0.1", 9), drop_indices=[3], drop_seqs=[70000], bursts=[(10, 3)],
                          burst_every=50, burst_length=2, burst_offset=40, passthrough_first=2)  # fmt: skip
    try:
        dropped = [i for i in range(100) if proxy.should_drop(i, rtp(i))]
        # 3 explicit, 10-12 burst, 40-41 and 90-91 periodic, 70000 & 0xFFFF = 4464 never seen here
        assert dropped == [3, 10, 11, 12, 40, 41, 90, 91]
        assert proxy.should_drop(5, rtp(4464))
    finally:
        proxy.stop()


def test_random_loss_is_seeded() -> None:
    def pattern(seed: int) -> list[int]:
        proxy = LossyUdpProxy(("127.0.0.1", 9), drop_rate=0.1, seed=seed)
        try:
            return [i for i in range(1000) if proxy.should_drop(i, b"x")]
        finally:
            proxy.stop()

    assert pattern(1) == pattern(1) != pattern(2)
    assert 60 < len(pattern(1)) < 140


def test_forwards_over_loopback_and_records() -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(2.0)
    src = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with LossyUdpProxy(sink.getsockname(), drop_indices=[1, 2], max_duration_s=10) as proxy:
            for i in range(6):
                src.sendto(rtp(i), proxy.address)
            got = [sink.recv(100) for _ in range(4)]
            proxy.blackhole()
            src.sendto(rtp(6), proxy.address)
            deadline = time.monotonic() + 2
            while proxy.stats.received < 7 and time.monotonic() < deadline:
                time.sleep(0.01)
            proxy.restore()
            src.sendto(rtp(7), proxy.address)
            got.append(sink.recv(100))
        assert got == [rtp(i) for i in (0, 3, 4, 5, 7)]
        assert proxy.stats.dropped_indices == [1, 2, 6]
        assert proxy.stats.seen == [rtp(i) for i in range(8)]
    finally:
        sink.close()
        src.close()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        LossyUdpProxy(("127.0.0.1", 9), drop_rate=1.5)
