"""appliance.netio on real loopback UDP sockets: batched paths, per-packet fallbacks, helpers."""

from __future__ import annotations

import ctypes
import errno
import itertools
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from appliance.netio import BatchReceiver, BatchSender, _libc, join_multicast, set_dscp, set_socket_buffers
from appliance.netio import receiver as receiver_module
from appliance.netio.sockopts import multicast_request

FAMILIES = [pytest.param(socket.AF_INET, id="ipv4"), pytest.param(socket.AF_INET6, id="ipv6")]
PATHS = [pytest.param(False, id="batched"), pytest.param(True, id="fallback")]
RTP_SIZE = 1328  # 12-byte RTP header + 7 x 188 TS packets


def _loopback(family: int) -> str:
    return "127.0.0.1" if family == socket.AF_INET else "::1"


@pytest.fixture(scope="module", autouse=True)
def _kernel_timestamps_switched_on() -> Iterator[None]:
    """Hold an SO_TIMESTAMPNS socket open, once the kernel stamps datagrams as they arrive.

    The first socket in the system to ask for timestamps only schedules their switch-on (the
    netstamp static key, flipped from a work item); a datagram queued before that runs gets the
    receive call's time ("race between timestamp enabling and packet receiving" in the kernel's
    __sock_recv_timestamp). That made the first test's early datagrams look ~20 ms (its sleep)
    younger than later ones. While this socket holds the switch on, any new receiver gets true
    arrival times from its first datagram.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(2.0)
        sock.setsockopt(socket.SOL_SOCKET, _libc.SO_TIMESTAMPNS, 1)
        deadline = time.monotonic() + 2.0
        while True:
            sock.sendto(b"probe", sock.getsockname())
            time.sleep(0.005)
            called = time.time()
            _, ancdata, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(16))
            sec, nsec = struct.unpack_from("=qq", ancdata[0][2])
            if sec + nsec * 1e-9 < called - 0.002:  # stamped on arrival, not at the receive call
                break
            assert time.monotonic() < deadline, "the kernel never switched receive timestamps on"
        yield


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def sockets(family: int) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(receiver, sender): non-blocking UDP sockets bound to the loopback address."""
    host = _loopback(family)
    rx = socket.socket(family, socket.SOCK_DGRAM)
    tx = socket.socket(family, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((host, 0))
        tx.bind((host, 0))
        rx.setblocking(False)
        tx.setblocking(False)
        set_socket_buffers(rx, rcvbuf=4 * 1024 * 1024)
        yield rx, tx


def _addr(sock: socket.socket) -> tuple[str, int]:
    host, port = sock.getsockname()[:2]
    return host, port


def _datagram(index: int, size: int) -> bytes:
    return (index.to_bytes(4, "big") + bytes((index + k) & 0xFF for k in range(256)) * (size // 256 + 1))[:size]


def _wait_readable(sock: socket.socket) -> None:
    readable, _, _ = select.select([sock], [], [], 2.0)
    assert readable, "nothing arrived within 2 s"


WallClock = tuple[float, float, float]  # (time.time(), its offset from time.monotonic(), uncertainty)


def _wall_clock() -> WallClock:
    """``time.time()`` read between two ``time.monotonic()`` reads.

    CLOCK_MONOTONIC follows NTP's slewing of CLOCK_REALTIME but never its steps, so the change of
    the offset between two readings is how far the wall clock (and SO_TIMESTAMPNS) stepped.
    """
    before = time.monotonic()
    wall = time.time()
    after = time.monotonic()
    return wall, wall - (before + after) / 2, (after - before) / 2


def _clock_step(start: WallClock, end: WallClock) -> float:
    """A bound on how far the wall clock stepped, either way, between two readings."""
    return abs(end[1] - start[1]) + start[2] + end[2]


def _assert_kernel_times(arrivals: list[float], start: WallClock, end: WallClock) -> None:
    """``arrivals``: kernel times of datagrams sent in list order between the two readings.

    Each lies in [start, end] and they run in send order; the only slack is the wall-clock step
    measured between the readings (an NTP step between packets shifts the later ones by it).
    Missing, zero or misread times (another field, another message's) fall outside or out of order.
    """
    step = _clock_step(start, end)
    low, high = start[0] - 0.001 - step, end[0] + step
    outside = [arrival for arrival in arrivals if not low <= arrival <= high]
    assert not outside, f"{len(outside)} times outside [{low:.6f}, {high:.6f}], e.g. {outside[0]!r}"
    backwards = sum(max(0.0, a - b) for a, b in itertools.pairwise(arrivals))
    assert backwards <= step + 1e-6, f"times go back {backwards:.6f} s in all, the clock stepped {step:.6f} s"


def _receive_all(rx: BatchReceiver, sock: socket.socket, expected: int) -> tuple[list[bytes], list[float], list]:
    """Drain with recv_batch until ``expected`` datagrams arrived (bounded: 2 s)."""
    data: list[bytes] = []
    arrivals: list[float] = []
    sources: list = []
    deadline = time.monotonic() + 2.0
    while len(data) < expected and time.monotonic() < deadline:
        if rx.recv_batch() == 0:
            select.select([sock], [], [], 0.05)
            continue
        data += [bytes(view) for view in rx.views]
        arrivals += rx.arrivals
        sources += rx.sources
    return data, arrivals, sources


def _plain_receive(sock: socket.socket, expected: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 2.0
    while len(got) < expected and time.monotonic() < deadline:
        try:
            got.append(sock.recv(65536))
        except BlockingIOError:
            select.select([sock], [], [], 0.05)
    return got


@pytest.mark.parametrize("fallback", PATHS)
def test_recv_batch_gives_contents_lengths_sources_and_kernel_times(
    sockets: tuple[socket.socket, socket.socket], fallback: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rx_sock, tx_sock = sockets
    # The receiver reads its own clock only for a datagram the kernel gave no time: make that
    # time unmistakable, so no wall-clock tolerance can let it pass for a kernel time.
    no_kernel_time = -1.0
    monkeypatch.setattr(receiver_module, "time", SimpleNamespace(time=lambda: no_kernel_time))
    rx = BatchReceiver(rx_sock, batch=64, force_fallback=fallback)
    assert rx.batched is not fallback
    sizes = [1, 7, 188, RTP_SIZE, 1500, 2048, 12, 1316]
    sent = [_datagram(i, sizes[i % len(sizes)]) for i in range(40)]
    half = len(sent) // 2
    start = _wall_clock()
    for datagram in sent[:half]:
        tx_sock.sendto(datagram, _addr(rx_sock))
    paused = time.monotonic()
    time.sleep(0.01)  # each datagram has its own time: the second half's come >= 10 ms later
    pause = time.monotonic() - paused
    for datagram in sent[half:]:
        tx_sock.sendto(datagram, _addr(rx_sock))
    time.sleep(0.02)  # the arrival times must be the kernel's, not this later return time
    _wait_readable(rx_sock)
    count = rx.recv_batch()
    end = _wall_clock()

    assert count == len(sent) == len(rx.views) == len(rx.arrivals) == len(rx.sources)
    assert [bytes(v) for v in rx.views] == sent
    assert [len(v) for v in rx.views] == [len(d) for d in sent]
    assert rx.sources == [_addr(tx_sock)] * len(sent)
    assert no_kernel_time not in rx.arrivals, "a datagram came without a kernel time"
    _assert_kernel_times(rx.arrivals, start, end)
    step = _clock_step(start, end)
    assert rx.arrivals[half] - rx.arrivals[half - 1] >= pause - 0.005 - step, "datagrams share one time"
    assert end[0] - max(rx.arrivals) >= 0.015 - step, "arrival looks like the return time, not the kernel's"
    assert rx.recv_batch() == 0


@pytest.mark.parametrize("fallback", PATHS)
def test_recv_batch_reports_each_datagrams_own_source(
    sockets: tuple[socket.socket, socket.socket], family: int, fallback: bool
) -> None:
    rx_sock, tx_sock = sockets
    with socket.socket(family, socket.SOCK_DGRAM) as other:
        other.bind((_loopback(family), 0))
        rx = BatchReceiver(rx_sock, force_fallback=fallback)
        senders = [tx_sock, other, other, tx_sock, other]
        start = _wall_clock()
        for index, sender in enumerate(senders):
            sender.sendto(_datagram(index, 50), _addr(rx_sock))
        _wait_readable(rx_sock)
        assert rx.recv_batch() == len(senders)
        end = _wall_clock()
        assert rx.sources == [_addr(s) for s in senders]
        assert [bytes(v) for v in rx.views] == [_datagram(i, 50) for i in range(len(senders))]
        _assert_kernel_times(rx.arrivals, start, end)


@pytest.mark.parametrize("fallback", PATHS)
def test_recv_batch_returns_zero_when_nothing_is_queued(
    sockets: tuple[socket.socket, socket.socket], fallback: bool
) -> None:
    rx_sock, _ = sockets
    rx = BatchReceiver(rx_sock, force_fallback=fallback)
    assert rx.recv_batch() == 0
    assert rx.views == [] and rx.arrivals == [] and rx.sources == []


@pytest.mark.parametrize("fallback", PATHS)
def test_recv_batch_is_bounded_by_batch_and_keeps_order(
    sockets: tuple[socket.socket, socket.socket], fallback: bool
) -> None:
    rx_sock, tx_sock = sockets
    rx = BatchReceiver(rx_sock, batch=16, force_fallback=fallback)
    sent = [_datagram(i, 100 + i) for i in range(40)]
    for datagram in sent:
        tx_sock.sendto(datagram, _addr(rx_sock))
    _wait_readable(rx_sock)
    counts = []
    received: list[bytes] = []
    while (count := rx.recv_batch()) != 0:
        counts.append(count)
        received += [bytes(v) for v in rx.views]
    assert counts == [16, 16, 8]
    assert received == sent


@pytest.mark.parametrize("fallback", PATHS)
def test_oversized_datagrams_are_dropped_and_counted(
    sockets: tuple[socket.socket, socket.socket], fallback: bool
) -> None:
    rx_sock, tx_sock = sockets
    rx = BatchReceiver(rx_sock, slot_size=256, force_fallback=fallback)
    for datagram in (b"a" * 10, b"b" * 257, b"c" * 256):
        tx_sock.sendto(datagram, _addr(rx_sock))
    _wait_readable(rx_sock)
    assert rx.recv_batch() == 2
    assert [bytes(v) for v in rx.views] == [b"a" * 10, b"c" * 256]
    assert rx.truncated == 1


def test_timestamps_off_gives_return_time(sockets: tuple[socket.socket, socket.socket]) -> None:
    rx_sock, tx_sock = sockets
    rx = BatchReceiver(rx_sock, timestamps=False)
    tx_sock.sendto(b"x", _addr(rx_sock))
    time.sleep(0.02)
    before = time.time()
    assert rx.recv_batch() == 1
    assert before <= rx.arrivals[0] <= time.time()


@pytest.mark.parametrize("fallback", PATHS)
def test_send_batch_mixed_sizes_arrive_intact_and_in_order(
    sockets: tuple[socket.socket, socket.socket], fallback: bool
) -> None:
    rx_sock, tx_sock = sockets
    tx = BatchSender(tx_sock, force_fallback=fallback)
    assert tx.batched is not fallback
    sent = [_datagram(i, (37 * i) % 1500 + 1) for i in range(150)]
    sent[3:6] = [_datagram(900 + i, RTP_SIZE) for i in range(3)]  # a short equal-size run inside
    as_views = [memoryview(bytearray(d)) if i % 2 else d for i, d in enumerate(sent)]
    assert tx.send_batch(as_views, _addr(rx_sock)) == len(sent)
    assert _plain_receive(rx_sock, len(sent)) == sent


@pytest.mark.parametrize("fallback", PATHS)
def test_send_batch_equal_sizes_arrive_intact_and_in_order(
    sockets: tuple[socket.socket, socket.socket], fallback: bool
) -> None:
    rx_sock, tx_sock = sockets
    tx = BatchSender(tx_sock, force_fallback=fallback)
    sent = [_datagram(i, RTP_SIZE) for i in range(200)]  # > 64 segments and > 64 KB: several GSO sends
    assert tx.send_batch(sent, _addr(rx_sock)) == len(sent)
    assert _plain_receive(rx_sock, len(sent)) == sent


def test_equal_sizes_leave_as_gso_super_datagrams(sockets: tuple[socket.socket, socket.socket]) -> None:
    """A receiver with UDP_GRO sees the unsegmented GSO buffer on loopback: proof GSO was used."""
    rx_sock, tx_sock = sockets
    rx_sock.setsockopt(_libc.SOL_UDP, _libc.UDP_GRO, 1)
    tx = BatchSender(tx_sock)
    assert tx.gso_enabled
    sent = [_datagram(i, RTP_SIZE) for i in range(10)]
    assert tx.send_batch(sent, _addr(rx_sock)) == 10
    _wait_readable(rx_sock)
    data, ancdata, _, _ = rx_sock.recvmsg(65536, socket.CMSG_SPACE(4))
    assert data == b"".join(sent)
    assert [(level, kind, int.from_bytes(value[:4], "little")) for level, kind, value in ancdata] == [
        (_libc.SOL_UDP, _libc.UDP_GRO, RTP_SIZE)
    ]


def test_gso_off_sends_separate_datagrams(sockets: tuple[socket.socket, socket.socket]) -> None:
    rx_sock, tx_sock = sockets
    rx_sock.setsockopt(_libc.SOL_UDP, _libc.UDP_GRO, 1)
    tx = BatchSender(tx_sock, gso=False)
    sent = [_datagram(i, RTP_SIZE) for i in range(10)]
    assert tx.send_batch(sent, _addr(rx_sock)) == 10
    assert _plain_receive(rx_sock, 10) == sent


@pytest.mark.parametrize("fallback", PATHS)
def test_gro_receiver_splits_coalesced_buffers(sockets: tuple[socket.socket, socket.socket], fallback: bool) -> None:
    rx_sock, tx_sock = sockets
    rx = BatchReceiver(rx_sock, gro=True, force_fallback=fallback)
    sent = [_datagram(i, RTP_SIZE) for i in range(100)] + [_datagram(100, 200)]
    start = _wall_clock()
    assert BatchSender(tx_sock).send_batch(sent, _addr(rx_sock)) == len(sent)
    data, arrivals, sources = _receive_all(rx, rx_sock, len(sent))
    end = _wall_clock()
    assert data == sent
    assert sources == [_addr(tx_sock)] * len(sent)
    _assert_kernel_times(arrivals, start, end)


def test_send_batch_stops_at_eagain_without_raising() -> None:
    # Loopback UDP never pushes back (the skb leaves the send buffer at once), so a datagram
    # socketpair stands in: its peer queue holds net.unix.max_dgram_qlen datagrams, then EAGAIN.
    for fallback in (False, True):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with a, b:
            tx = BatchSender(a, gso=False, force_fallback=fallback)
            sent_data = [_datagram(i, 100) for i in range(300)]
            first = tx.send_batch(sent_data, None)
            assert 0 < first < len(sent_data), fallback
            assert tx.send_batch(sent_data[first:], None) == 0
            b.setblocking(False)
            assert _plain_receive(b, first) == sent_data[:first]
            assert tx.send_batch(sent_data[first : first + 3], None) == 3


@pytest.mark.parametrize("fallback", PATHS)
def test_send_batch_to_a_connected_socket(sockets: tuple[socket.socket, socket.socket], fallback: bool) -> None:
    rx_sock, tx_sock = sockets
    tx_sock.connect(_addr(rx_sock))
    tx = BatchSender(tx_sock, force_fallback=fallback)
    sent = [_datagram(i, RTP_SIZE) for i in range(70)] + [b"tail"]
    assert tx.send_batch(sent, None) == len(sent)
    assert _plain_receive(rx_sock, len(sent)) == sent


def test_ipv4_destination_on_a_dual_stack_socket() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx_sock,
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx_sock,
    ):
        rx_sock.bind(("127.0.0.1", 0))
        rx_sock.setblocking(False)
        for fallback in (False, True):
            tx = BatchSender(tx_sock, force_fallback=fallback)
            assert tx.send_batch([b"one", b"two"], _addr(rx_sock)) == 2
            assert _plain_receive(rx_sock, 2) == [b"one", b"two"]


def _fail_with(err: int) -> Callable[..., int]:
    def call(*_args: object) -> int:
        ctypes.set_errno(err)
        return -1

    return call


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EINVAL])
def test_missing_batched_calls_switch_to_the_per_packet_path(
    sockets: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    rx_sock, tx_sock = sockets
    monkeypatch.setattr(_libc, "recvmmsg", _fail_with(err))
    monkeypatch.setattr(_libc, "sendmmsg", _fail_with(err))
    rx = BatchReceiver(rx_sock)
    tx = BatchSender(tx_sock)
    assert rx.batched and tx.batched
    sent = [_datagram(i, RTP_SIZE) for i in range(5)]
    assert tx.send_batch(sent, _addr(rx_sock)) == 5
    assert not tx.batched
    data, _, sources = _receive_all(rx, rx_sock, 5)
    assert not rx.batched
    assert data == sent and sources == [_addr(tx_sock)] * 5


def test_other_errors_raise(sockets: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    rx_sock, tx_sock = sockets
    monkeypatch.setattr(_libc, "recvmmsg", _fail_with(errno.EBADF))
    monkeypatch.setattr(_libc, "sendmmsg", _fail_with(errno.EBADF))
    with pytest.raises(OSError) as raised:
        BatchReceiver(rx_sock).recv_batch()
    assert raised.value.errno == errno.EBADF
    with pytest.raises(OSError) as raised:
        BatchSender(tx_sock).send_batch([b"x"], _addr(rx_sock))
    assert raised.value.errno == errno.EBADF


@pytest.mark.parametrize("strided", [False, True], ids=["send_batch", "send_strided"])
def test_gso_error_falls_back_to_plain_sendmmsg(
    sockets: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch, strided: bool
) -> None:
    rx_sock, tx_sock = sockets
    real = _libc.sendmmsg
    assert real is not None
    calls: list[int] = []

    def no_gso(fd: int, hdrs: int, count: int, flags: int) -> int:
        controllen = _libc.RESULT.unpack_from(ctypes.string_at(hdrs, _libc.MMSGHDR_SIZE))[1]
        calls.append(controllen)
        if controllen:  # a device without checksum offload refuses GSO with EIO
            ctypes.set_errno(errno.EIO)
            return -1
        return real(fd, hdrs, count, flags)

    monkeypatch.setattr(_libc, "sendmmsg", no_gso)
    tx = BatchSender(tx_sock)
    sent = [_datagram(i, RTP_SIZE) for i in range(20)]
    if strided:
        assert tx.send_strided(_slots(sent, 2048), 0, 2048, RTP_SIZE, 20, _addr(rx_sock)) == 20
    else:
        assert tx.send_batch(sent, _addr(rx_sock)) == 20
    assert not tx.gso_enabled and tx.batched
    assert calls[0] > 0 and calls[-1] == 0
    assert _plain_receive(rx_sock, 20) == sent


def test_set_socket_buffers_reports_effective_sizes(sockets: tuple[socket.socket, socket.socket]) -> None:
    rx_sock, _ = sockets
    rcvbuf, sndbuf = set_socket_buffers(rx_sock, rcvbuf=1_000_000, sndbuf=300_000)
    assert rcvbuf == rx_sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= 1_000_000
    assert sndbuf == rx_sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 300_000


def test_set_dscp_marks_tos_and_traffic_class(family: int) -> None:
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        set_dscp(sock, 46)  # EF
        if family == socket.AF_INET:
            assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 46 << 2
        else:
            assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS) == 46 << 2
        with pytest.raises(ValueError):
            set_dscp(sock, 64)


def test_multicast_requests_are_ip_mreq_and_ipv6_mreq() -> None:
    assert multicast_request("239.1.2.3", "127.0.0.1") == (
        socket.IPPROTO_IP,
        socket.IP_ADD_MEMBERSHIP,
        bytes([239, 1, 2, 3, 127, 0, 0, 1]),
    )
    assert multicast_request("239.1.2.3")[2] == bytes([239, 1, 2, 3, 0, 0, 0, 0])
    level, option, value = multicast_request("ff15::1", 1)
    assert (level, option) == (socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP)
    assert value == socket.inet_pton(socket.AF_INET6, "ff15::1") + (1).to_bytes(4, "little")
    assert multicast_request("ff15::1", "lo")[2][16:] == socket.if_nametoindex("lo").to_bytes(4, "little")


def test_join_multicast_on_loopback_and_refuse_a_unicast_group() -> None:
    # Membership only: nothing is sent to the group; the join stays on the lo interface.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        join_multicast(sock, "239.255.77.1", "127.0.0.1")
        with pytest.raises(OSError):
            join_multicast(sock, "127.0.0.2", "127.0.0.1")


@pytest.mark.parametrize(
    ("sizes", "max_messages", "gso", "bounds", "gso_sizes"),
    [
        ([100] * 5, 64, True, [5], [100]),
        ([100] * 5, 64, False, [1, 2, 3, 4, 5], [0] * 5),
        ([100, 100, 7, 100, 100, 100], 64, True, [2, 3, 6], [100, 0, 100]),
        ([1328] * 100, 64, True, [48, 96, 100], [1328, 1328, 1328]),  # 65000 // 1328 = 48 per GSO message
        ([10] * 130, 64, True, [64, 128, 130], [10, 10, 10]),  # GSO_MAX_SEGMENTS = 64
        ([40000, 40000, 0, 0], 64, True, [1, 2, 3, 4], [0, 0, 0, 0]),  # too large to pair; empty never GSO
        ([5, 6, 7, 8], 2, True, [1, 2], [0, 0]),  # capped at max_messages
        ([9] * 10, 1, False, [1], [0]),
    ],
)
def test_send_layout_groups_equal_size_runs(
    sizes: list[int], max_messages: int, gso: bool, bounds: list[int], gso_sizes: list[int]
) -> None:
    from appliance.netio.sender import _layout

    assert _layout(sizes, max_messages, gso) == (bounds, gso_sizes)


def _slots(datagrams: list[bytes], stride: int, offset: int = 0) -> bytearray:
    """Datagrams laid out in fixed slots, as BatchReceiver's buffer holds them."""
    buffer = bytearray(b"\xee" * (stride * len(datagrams) + offset))
    for k, datagram in enumerate(datagrams):
        buffer[offset + k * stride : offset + k * stride + len(datagram)] = datagram
    return buffer


@pytest.mark.parametrize("fallback", PATHS)
def test_send_strided_sends_slots_in_place_intact_and_in_order(
    sockets: tuple[socket.socket, socket.socket], fallback: bool
) -> None:
    rx_sock, tx_sock = sockets
    tx = BatchSender(tx_sock, force_fallback=fallback)
    sent = [_datagram(i, RTP_SIZE) for i in range(200)]  # > 64 segments and > 64 KB: several GSO messages
    buffer = _slots(sent, 2048, offset=5)
    assert tx.send_strided(buffer, 5, 2048, RTP_SIZE, len(sent), _addr(rx_sock)) == len(sent)
    assert _plain_receive(rx_sock, len(sent)) == sent
    # The cached layout is reused for a second call, and an inner part (the TS payload) can be sent.
    assert tx.send_strided(buffer, 5 + 12, 2048, RTP_SIZE - 12, 3, _addr(rx_sock)) == 3
    assert _plain_receive(rx_sock, 3) == [d[12:] for d in sent[:3]]


def test_send_strided_leaves_as_gso_super_datagrams(sockets: tuple[socket.socket, socket.socket]) -> None:
    rx_sock, tx_sock = sockets
    rx_sock.setsockopt(_libc.SOL_UDP, _libc.UDP_GRO, 1)
    sent = [_datagram(i, RTP_SIZE) for i in range(10)]
    assert BatchSender(tx_sock).send_strided(_slots(sent, 2048), 0, 2048, RTP_SIZE, 10, _addr(rx_sock)) == 10
    _wait_readable(rx_sock)
    data, ancdata, _, _ = rx_sock.recvmsg(65536, socket.CMSG_SPACE(4))
    assert data == b"".join(sent)
    assert [(level, kind) for level, kind, _ in ancdata] == [(_libc.SOL_UDP, _libc.UDP_GRO)]


def test_send_strided_to_two_destinations_and_after_changing_the_buffer(family: int) -> None:
    host = _loopback(family)
    receivers = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(2)]
    with receivers[0], receivers[1], socket.socket(family, socket.SOCK_DGRAM) as tx_sock:
        for rx_sock in receivers:
            rx_sock.bind((host, 0))
            rx_sock.setblocking(False)
        tx = BatchSender(tx_sock)
        first = [_datagram(i, 300) for i in range(7)]
        buffer = _slots(first, 512)
        for rx_sock in receivers:
            assert tx.send_strided(buffer, 0, 512, 300, 7, _addr(rx_sock)) == 7
        second = [_datagram(50 + i, 300) for i in range(7)]
        buffer[:] = _slots(second, 512)  # same object, new contents: sent as they are now
        assert tx.send_strided(buffer, 0, 512, 300, 7, _addr(receivers[0])) == 7
        assert _plain_receive(receivers[0], 14) == first + second
        assert _plain_receive(receivers[1], 7) == first


def test_send_strided_stops_at_eagain_without_raising() -> None:
    for fallback in (False, True):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with a, b:
            tx = BatchSender(a, gso=False, force_fallback=fallback)
            sent = [_datagram(i, 100) for i in range(300)]
            buffer = _slots(sent, 128)
            first = tx.send_strided(buffer, 0, 128, 100, 300, None)
            assert 0 < first < len(sent), fallback
            b.setblocking(False)
            assert _plain_receive(b, first) == sent[:first]
            assert tx.send_strided(buffer, first * 128, 128, 100, 3, None) == 3
            assert _plain_receive(b, 3) == sent[first : first + 3]


@pytest.mark.parametrize("gso", [True, False])
def test_send_strided_every_count_from_one_layout(sockets: tuple[socket.socket, socket.socket], gso: bool) -> None:
    """Counts 1..64 (and a short last GSO message of one segment) all come from one cached layout."""
    rx_sock, tx_sock = sockets
    tx = BatchSender(tx_sock, gso=gso)
    sent = [_datagram(i, RTP_SIZE) for i in range(64)]
    buffer = _slots(sent, 2048)
    for count in (1, 2, 47, 48, 49, 50, 63, 64, 3, 97):  # 97: more than the buffer's 64 slots hold
        taken = tx.send_strided(buffer, 0, 2048, RTP_SIZE, min(count, 64), _addr(rx_sock))
        assert taken == min(count, 64)
        assert _plain_receive(rx_sock, taken) == sent[:taken], count
    assert len(tx._s_layouts) == 1
