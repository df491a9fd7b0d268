"""bench.tools.procfs against real processes: a child that burns CPU and starts a marked grandchild."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.tools.procfs import (
    cpu_seconds,
    descendant,
    find_descendant,
    process_tree,
    tree_cpu_seconds,
    udp_ports_of,
    udp_table,
)

BURN_S = 0.3  # CPU seconds each of the child and the grandchild spends before it waits
MARKER = "procfs-test-grandchild"

# Burn BURN_S of CPU, then wait for stdin's EOF (the child and the grandchild share the pipe).
_BURN = f"import sys, time\nt = time.process_time()\nwhile time.process_time() - t < {BURN_S}: pass\nsys.stdin.read()\n"
_CHILD = (
    "import subprocess, sys\n"
    # MARKER is joined here, so that the child's own command line does not hold it
    f"grandchild = subprocess.Popen([sys.executable, '-c', {_BURN!r}, 'procfs-test-' + 'grandchild'])\n"
    f"{_BURN}"
    "grandchild.wait(10)\n"
)


@pytest.fixture
def family() -> Iterator[subprocess.Popen[bytes]]:
    """The child (burning, then waiting) and its grandchild with MARKER in its command line."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE)
    try:
        yield child
    finally:
        grandchild = descendant(child.pid, MARKER.encode())
        assert child.stdin is not None
        child.stdin.close()  # EOF for both
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
        if grandchild is not None:  # it ends on the same EOF; should it linger, end it
            with contextlib.suppress(OSError):
                if MARKER.encode() in Path(f"/proc/{grandchild}/cmdline").read_bytes():
                    os.kill(grandchild, signal.SIGKILL)


def test_cpu_tree_and_descendant_of_a_real_family(family: subprocess.Popen[bytes]) -> None:
    grandchild = find_descendant(os.getpid(), MARKER.encode(), timeout_s=20.0)
    assert find_descendant(family.pid, MARKER.encode(), timeout_s=1.0) == grandchild

    tree = process_tree(os.getpid())
    assert tree[0] == os.getpid()
    assert tree.index(family.pid) < tree.index(grandchild)  # an ancestor before its descendants
    assert process_tree(family.pid)[:1] == [family.pid] and grandchild in process_tree(family.pid)

    deadline = time.monotonic() + 30.0  # both burn BURN_S, and then some to start and wait
    while min(cpu_seconds(family.pid), cpu_seconds(grandchild)) < BURN_S and time.monotonic() < deadline:
        time.sleep(0.05)
    child_s, grandchild_s, tree_s = cpu_seconds(family.pid), cpu_seconds(grandchild), tree_cpu_seconds(family.pid)
    assert child_s >= BURN_S and grandchild_s >= BURN_S
    assert child_s + grandchild_s - 1e-6 <= tree_s < child_s + grandchild_s + 0.5  # the tree sums both


def test_gone_processes_and_absent_markers() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    assert cpu_seconds(gone.pid) == 0.0
    assert tree_cpu_seconds(gone.pid) == 0.0
    assert process_tree(gone.pid) == [gone.pid]
    assert descendant(os.getpid(), b"no-such-marker-in-any-command-line") is None
    with pytest.raises(RuntimeError, match="no-such-marker"):
        find_descendant(os.getpid(), b"no-such-marker-in-any-command-line", timeout_s=0.3)


def test_udp_sockets_of_this_process() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert port in udp_ports_of([os.getpid()])
        inode = str(os.fstat(sock.fileno()).st_ino)
        rows = [fields for fields in udp_table() if fields[9] == inode]
        assert len(rows) == 1 and int(rows[0][1].rsplit(":", 1)[1], 16) == port
    assert port not in udp_ports_of([os.getpid()])
