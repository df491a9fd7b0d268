"""What ``/proc`` says about the processes a bench measures (proc(5)).

One reader for the benches: the CPU time of a process or of a process tree, the tree under a
pid, a descendant found by its command line, and the local ports of the UDP sockets that
processes hold. CPU time is ``utime + stime`` of ``/proc/<pid>/stat`` (all the process's
threads) in seconds; a process that is gone counts 0.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

__all__ = [
    "CLK_TCK",
    "ENGINE_WORKER",
    "UDP_TABLES",
    "WEBRTC_WORKER",
    "cpu_seconds",
    "descendant",
    "find_descendant",
    "process_tree",
    "tree_cpu_seconds",
    "udp_ports_of",
    "udp_table",
]

CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
ENGINE_WORKER: Final = b"services.edge.engine.worker"  # in an mp-edge engine worker's command line
WEBRTC_WORKER: Final = b"services.edge.webrtc.worker"  # in an mp-edge webrtc worker's command line
UDP_TABLES: Final = ("/proc/net/udp", "/proc/net/udp6")


def _stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` text after ``pid (comm)``: [0] is the state, [1] the
    ppid, [11] utime and [12] stime (clock ticks). ``comm`` may hold spaces and parentheses."""
    return stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0.0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = _stat_fields(stat)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _all_stats() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (ppid, utime + stime in ticks). One that ends meanwhile is left out."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = _stat_fields(stat)
        stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return stats


def _tree(root_pid: int, stats: dict[int, tuple[int, int]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _ticks) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree, seen, frontier = [root_pid], {root_pid}, [root_pid]
    while frontier:
        for pid in children.get(frontier.pop(), []):
            if pid not in seen:
                seen.add(pid)
                tree.append(pid)
                frontier.append(pid)
    return tree


def process_tree(root_pid: int) -> list[int]:
    """``root_pid`` (first, even once it is gone) and its live descendants, by the ppid of each
    ``/proc/<pid>/stat``."""
    return _tree(root_pid, _all_stats())


def tree_cpu_seconds(root_pid: int) -> float:
    """User + system CPU seconds of ``root_pid`` and its live descendants (one read of each
    process's stat); 0.0 once they are all gone."""
    stats = _all_stats()
    return sum(stats[pid][1] for pid in _tree(root_pid, stats) if pid in stats) / CLK_TCK


def descendant(root_pid: int, marker: bytes) -> int | None:
    """A descendant of ``root_pid`` (not itself) whose command line contains ``marker``, or None
    while there is none. One look, no waiting."""
    for pid in process_tree(root_pid)[1:]:
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


def find_descendant(root_pid: int, marker: bytes, timeout_s: float = 30.0) -> int:
    """The pid of a descendant of ``root_pid`` whose command line contains ``marker``, looked for
    every 0.2 s; RuntimeError after ``timeout_s`` without one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = descendant(root_pid, marker)
        if pid is not None:
            return pid
        time.sleep(0.2)
    raise RuntimeError(
        f"no process with {marker.decode()!r} in its command line under pid {root_pid} after {timeout_s:.0f} s"
    )


def udp_table(tables: Iterable[str] = UDP_TABLES) -> Iterator[list[str]]:
    """The socket lines of /proc/net/udp and /proc/net/udp6, each split on whitespace (header
    left out): [1] local address:port (hex), [4] tx_queue:rx_queue (hex), [9] inode, [12] drops.
    A table that cannot be read (no IPv6) has no lines."""
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            yield line.split()


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (none once it is gone)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def udp_ports_of(pids: Iterable[int]) -> set[int]:
    """Local ports of the UDP sockets these processes hold (their fds' inodes in /proc/net/udp*)."""
    inodes: set[str] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    return {int(fields[1].rsplit(":", 1)[1], 16) for fields in udp_table() if fields[9] in inodes}
