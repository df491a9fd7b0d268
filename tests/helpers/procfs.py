"""What ``/proc`` says about a test's processes (proc(5)): children by command line, and sockets.

One reader for the e2e tests that find an edge's workers (``engine_workers``,
``webrtc_worker``) or check which sockets a process holds (``listening_tcp_ports``,
``udp_socket_count``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ENGINE_WORKER",
    "WEBRTC_WORKER",
    "children",
    "engine_workers",
    "listening_tcp_ports",
    "socket_inodes",
    "udp_socket_count",
    "webrtc_worker",
]

ENGINE_WORKER = b"services.edge.engine.worker"
WEBRTC_WORKER = b"services.edge.webrtc.worker"


def children(pid: int, marker: bytes | None = None, *, comm: str | None = None) -> list[int]:
    """``pid``'s child processes: those whose command line contains ``marker``, or whose name is
    ``comm``, when given. Every thread's children count (a child started from a worker thread is
    listed under that thread's task)."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # a thread that ended meanwhile
    if marker is not None:
        found = [child for child in found if marker in _read(child, "cmdline")]
    if comm is not None:
        found = [child for child in found if _read(child, "comm").strip() == comm.encode()]
    return found


def engine_workers(edge_pid: int) -> list[int]:
    """An mp-edge's engine workers (the webrtc worker is its child too, and not one of them)."""
    return children(edge_pid, ENGINE_WORKER)


def webrtc_worker(edge_pid: int) -> int | None:
    """An mp-edge's webrtc worker, or None while it runs none."""
    found = children(edge_pid, WEBRTC_WORKER)
    return found[0] if found else None


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""  # gone since the children were listed


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening_tcp_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets in /proc/net/tcp and tcp6)."""
    inodes = socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def udp_socket_count(pid: int) -> int:
    """How many UDP sockets process ``pid`` has (IPv4, /proc/net/udp)."""
    inodes = socket_inodes(pid)
    lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[9] in inodes)
