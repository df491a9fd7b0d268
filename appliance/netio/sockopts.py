"""Socket options the data plane sets on its UDP sockets: buffers, DSCP, multicast membership."""

from __future__ import annotations

import contextlib
import socket
import struct

from appliance.netio import _libc


def set_socket_buffers(sock: socket.socket, *, rcvbuf: int | None = None, sndbuf: int | None = None) -> tuple[int, int]:
    """Ask for kernel receive/send buffers of ``rcvbuf``/``sndbuf`` bytes; None leaves one as is.

    Tries ``SO_RCVBUFFORCE``/``SO_SNDBUFFORCE`` first (root or CAP_NET_ADMIN: not capped by
    ``net.core.rmem_max``/``wmem_max``), then the plain options, which the kernel caps. Returns
    the effective ``(rcvbuf, sndbuf)`` as ``getsockopt`` reports them (Linux doubles the request
    for its bookkeeping).
    """
    for size, forced, plain in (
        (rcvbuf, _libc.SO_RCVBUFFORCE, socket.SO_RCVBUF),
        (sndbuf, _libc.SO_SNDBUFFORCE, socket.SO_SNDBUF),
    ):
        if size is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, forced, size)
        except PermissionError:  # EPERM without CAP_NET_ADMIN: the capped option still works
            sock.setsockopt(socket.SOL_SOCKET, plain, size)
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    )


def set_dscp(sock: socket.socket, dscp: int) -> None:
    """Mark outgoing datagrams with DSCP ``dscp`` (0..63): the TOS/traffic-class byte is dscp << 2.

    On an IPv6 socket both IPV6_TCLASS and IP_TOS are set, so v4-mapped traffic of a dual-stack
    socket is marked too.
    """
    if not 0 <= dscp <= 63:
        raise ValueError(f"DSCP must be 0..63, got {dscp}")
    tos = dscp << 2  # RFC 2474 §3: DSCP is the upper six bits of the former TOS octet
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
        # An IPV6_V6ONLY socket rejects IP_TOS; it never sends IPv4, so nothing is lost.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


def multicast_request(group: str, interface: str | int | None = None) -> tuple[int, int, bytes]:
    """The ``(level, option, value)`` that joins ``group``; ``join_multicast`` applies it.

    IPv4: ``IP_ADD_MEMBERSHIP`` with a ``struct ip_mreq`` (group, local interface address;
    None is INADDR_ANY, the kernel picks by route). IPv6: ``IPV6_JOIN_GROUP`` with a
    ``struct ipv6_mreq`` (group, interface index; a name such as ``"eth0"`` is looked up;
    None is 0, by route).
    """
    if ":" in group:
        if interface is None:
            index = 0
        elif isinstance(interface, int) or interface.isdigit():
            index = int(interface)
        else:
            index = socket.if_nametoindex(interface)
        value = socket.inet_pton(socket.AF_INET6, group) + struct.pack("=I", index)
        return socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, value
    local = "0.0.0.0" if interface is None else str(interface)
    value = socket.inet_aton(group) + socket.inet_aton(local)
    return socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, value


def join_multicast(sock: socket.socket, group: str, interface_addr: str | int | None = None) -> None:
    """Join multicast ``group`` on ``sock`` (see ``multicast_request`` for ``interface_addr``).

    Raises ``OSError`` from the kernel (EADDRNOTAVAIL for an unknown interface, EINVAL for a
    group that is not multicast); the caller translates it at its boundary (H6).
    """
    level, option, value = multicast_request(group, interface_addr)
    sock.setsockopt(level, option, value)
