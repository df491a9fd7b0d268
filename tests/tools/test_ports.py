"""The tests' free-port helper (tests/helpers/ports.py): ports the kernel never hands out."""

from __future__ import annotations

import contextlib
import socket

from tests.helpers.ports import LOWEST, _all_free, _ephemeral_range, free_port, free_port_block, free_udp_port


def test_ports_come_from_outside_the_ephemeral_range_and_are_free() -> None:
    low, high = _ephemeral_range()
    # A socket bound to port 0 (any peer's, any other test's) gets its port from [low, high]:
    # ours never comes from there, so nothing but an explicit bind can take it.
    picked = [free_port() for _ in range(20)] + [free_udp_port() for _ in range(20)]
    assert all(LOWEST <= port < 65536 and not low <= port <= high for port in picked), picked
    assert len(set(picked)) > 30  # random, not one sequence per worker
    for kind, port in ((socket.SOCK_STREAM, picked[0]), (socket.SOCK_DGRAM, picked[-1])):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_block_is_free_at_every_offset_and_a_taken_port_is_seen() -> None:
    low, high = _ephemeral_range()
    base = free_port_block((0, 2, 4))
    assert not any(low <= base + offset <= high for offset in (0, 2, 4))
    with contextlib.ExitStack() as stack:
        for offset in (0, 2, 4):  # every port of the block binds
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)).bind(("127.0.0.1", base + offset))
        # While one of them is held, a block over it is not free.
        assert not _all_free("127.0.0.1", (base + 1, base + 2), socket.SOCK_DGRAM)
        assert _all_free("127.0.0.1", (base + 1, base + 3), socket.SOCK_DGRAM)
