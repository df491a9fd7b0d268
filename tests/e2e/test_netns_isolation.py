"""The netns tests' links and addresses never reach the namespace the browser tests run in.

Chromium watches its network namespace over rtnetlink (net/base/address_tracker_linux.cc): a
new or removed address or link there fails every request in flight with
``net::ERR_NETWORK_CHANGED``. ``make test`` therefore runs the tests marked ``netns`` in a
network namespace of their own (tools/run-tests.sh) and names the shared one, where the
browsers run, in ``MP_TEST_SHARED_NETNS``. This test subscribes to link and address changes
in both namespaces, makes a veth pair as every netns test does, and requires that the shared
namespace heard nothing of it while its own namespace heard all of it (so the watch works).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import threading
from pathlib import Path

import pytest

from tests.helpers.netns import SHARED_NETNS_VARIABLE, apart_from_the_browsers, missing, netns_pair, shared_namespace

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

CLONE_NEWNET = 0x40000000
# rtnetlink multicast groups (linux/rtnetlink.h): RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR
RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100


def rtnetlink_watch_in(namespace: Path) -> socket.socket:
    """An rtnetlink socket subscribed to link and address changes of ``namespace``.

    A socket belongs to the namespace of the thread that made it, for its whole life, so a
    short-lived thread enters ``namespace`` (setns(2)), makes and binds it, and ends.
    """
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(namespace, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({namespace})")
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
            made.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            made.append(exc)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def pending_messages(sock: socket.socket) -> list[bytes]:
    """Every datagram queued on ``sock`` (the kernel queues them before the change returns)."""
    out: list[bytes] = []
    while True:
        try:
            out.append(sock.recv(1 << 16, socket.MSG_DONTWAIT))
        except BlockingIOError:
            return out
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # an overrun: more came than fit, so some did come
                out.append(b"ENOBUFS")
                continue
            raise


def test_a_veth_made_by_a_netns_test_is_not_seen_where_the_browsers_run() -> None:
    shared = shared_namespace()
    if shared is None:
        missing(f"{SHARED_NETNS_VARIABLE} is not set: run the netns tests through tools/run-tests.sh (make test)")
        return
    if os.geteuid() != 0:
        pytest.skip("needs root (setns, ip netns add)")
    own = Path("/proc/self/ns/net")
    assert apart_from_the_browsers(), "the netns tests run in the browsers' namespace"
    with (
        contextlib.closing(rtnetlink_watch_in(shared)) as there,
        contextlib.closing(rtnetlink_watch_in(own)) as here,
    ):
        with netns_pair("iso") as net:
            marks = [net.host_if.encode(), socket.inet_aton(net.host_addr)]
        heard_here = [m for m in pending_messages(here) if any(mark in m for mark in marks)]
        heard_there = [m for m in pending_messages(there) if any(mark in m for mark in marks) or m == b"ENOBUFS"]
    # The veth's creation, its address, its link up and its removal: at least those four.
    assert len(heard_here) >= 4, heard_here
    assert heard_there == [], f"{len(heard_there)} rtnetlink messages of the test's veth reached the shared namespace"
