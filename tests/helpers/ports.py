"""Free loopback ports for tests, picked outside the kernel's ephemeral range.

A test picks a port, starts peers, and binds it (or has a process bind it) seconds later. Any
socket that binds port 0 or connects without binding (another xdist worker's, srt-live-transmit's,
Chromium's, PostgreSQL's clients) gets its port from ``net.ipv4.ip_local_port_range``
(32768-60999 by default), so a port picked from that range can be taken in between: CI once
failed a sink's bind with ``EADDRINUSE`` on a port it had picked a few seconds earlier. Ports
below the range are never handed out by the kernel, only by explicit binds, and this module
picks them at random (from the OS's entropy, not ``random``'s per-test seed: xdist workers would
draw the same sequence) and checks that they are free now.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Final

__all__ = ["free_port", "free_port_block", "free_udp_port"]

LOWEST: Final = 20000
"""Below this, fixed ports of services and tools (8080, 5432, 4433 ...) live."""
_RNG: Final = random.SystemRandom()
_ATTEMPTS: Final = 200


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _candidates(span: int) -> range | None:
    """Bases whose ``span`` ports all lie outside the ephemeral range (None: no room)."""
    low, high = _ephemeral_range()
    below = range(LOWEST, low - span + 1)
    above = range(max(high + 1, LOWEST), 65536 - span + 1)
    best = max(below, above, key=len)
    return best if len(best) > 0 else None


def _all_free(host: str, ports: Iterable[int], kind: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probes: list[socket.socket] = []
    try:
        for port in ports:
            probe = socket.socket(family, kind)
            probes.append(probe)
            probe.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for probe in probes:
            probe.close()


def free_port_block(
    offsets: Iterable[int] = (0, 2, 4), *, kind: int = socket.SOCK_DGRAM, host: str = "127.0.0.1"
) -> int:
    """A base port P such that P + each offset is free on ``host`` now (media and FEC on +2 and +4:
    ``offsets=(0, 2, 4)``), outside the ephemeral range where the machine allows it."""
    offsets = tuple(offsets)
    span = max(offsets) + 1
    candidates = _candidates(span)
    for _ in range(_ATTEMPTS):
        if candidates is not None:
            base = _RNG.choice(candidates)
        else:  # the whole range is ephemeral here: let the kernel pick, as before
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, kind) as probe:
                probe.bind((host, 0))
                base = int(probe.getsockname()[1])
            if base + span > 65536:
                continue
        if _all_free(host, (base + offset for offset in offsets), kind):
            return base
    raise RuntimeError(f"no free {'UDP' if kind == socket.SOCK_DGRAM else 'TCP'} port block {offsets} on {host}")


def free_port(kind: int = socket.SOCK_STREAM, host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (TCP by default), outside the ephemeral range."""
    return free_port_block((0,), kind=kind, host=host)


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port free on ``host`` now, outside the ephemeral range."""
    return free_port_block((0,), kind=socket.SOCK_DGRAM, host=host)
