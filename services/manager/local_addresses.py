"""The host's own IP addresses, for the self-signed certificate's SANs (interop.md 1.3).

Read from the kernel with one rtnetlink ``RTM_GETADDR`` dump (rtnetlink(7)): every address
of every interface, secondary IPv4 addresses included (the ``SIOCGIFADDR`` ioctl sees only
the primary one). No packet leaves the box and no name is resolved, so this works with no
network at all and never waits on DNS. The appliance unit allows ``AF_NETLINK`` for this.

Link-scope addresses (IPv6 ``fe80::/10``; IPv4 ``169.254/16`` as usually configured) are
left out: a URL cannot name one without a zone, so no client could match it. The loopbacks
are always in.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
from typing import Final

__all__ = ["IpAddress", "local_addresses", "parse_address_dump"]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_log = logging.getLogger("mediaplane.manager")

# linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h
_NLMSG_HEADER: Final = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
_IFADDRMSG: Final = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTATTR: Final = struct.Struct("=HH")  # len, type
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_RTM_NEWADDR: Final = 20
_RTM_GETADDR: Final = 22
_NLM_F_REQUEST: Final = 0x1
_NLM_F_DUMP: Final = 0x300  # NLM_F_ROOT | NLM_F_MATCH
_IFA_ADDRESS: Final = 1
_IFA_LOCAL: Final = 2
_RT_SCOPE_LINK: Final = 253
_NETLINK_ROUTE: Final = 0
_SEQ: Final = 1
_RECV_BYTES: Final = 65536
_TIMEOUT_S: Final = 2.0

LOOPBACKS: Final[frozenset[IpAddress]] = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})


def _align4(n: int) -> int:
    return (n + 3) & ~3  # NLMSG_ALIGN / RTA_ALIGN


def parse_address_dump(data: bytes) -> tuple[list[IpAddress], bool]:
    """The addresses in a chunk of ``RTM_GETADDR`` dump replies, and whether the dump ended.

    Sans-IO: bytes in, addresses out. A truncated or malformed message ends the parse of
    its chunk (what was parsed before it is kept); an ``NLMSG_ERROR`` ends the dump.
    """
    found: list[IpAddress] = []
    offset = 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, msg_type, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size or offset + length > len(data):
            break
        if msg_type in (_NLMSG_DONE, _NLMSG_ERROR):
            return found, True
        if msg_type == _RTM_NEWADDR:
            address = _address_of(data[offset + _NLMSG_HEADER.size : offset + length])
            if address is not None:
                found.append(address)
        offset += _align4(length)
    return found, False


def _address_of(body: bytes) -> IpAddress | None:
    if len(body) < _IFADDRMSG.size:
        return None
    family, _prefixlen, _flags, scope, _index = _IFADDRMSG.unpack_from(body)
    if scope == _RT_SCOPE_LINK or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    attrs: dict[int, bytes] = {}
    offset = _align4(_IFADDRMSG.size)
    while offset + _RTATTR.size <= len(body):
        length, attr_type = _RTATTR.unpack_from(body, offset)
        if length < _RTATTR.size or offset + length > len(body):
            break
        attrs[attr_type] = body[offset + _RTATTR.size : offset + length]
        offset += _align4(length)
    # rtnetlink(7): IFA_LOCAL is the local address; IFA_ADDRESS is the peer's on a
    # point-to-point link, and the only one given for most IPv6 addresses.
    raw = attrs.get(_IFA_LOCAL) or attrs.get(_IFA_ADDRESS)
    if raw is None or len(raw) != (4 if family == socket.AF_INET else 16):
        return None
    return ipaddress.ip_address(raw)


def _dump_addresses() -> list[IpAddress]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_ROUTE) as sock:
        sock.settimeout(_TIMEOUT_S)
        sock.bind((0, 0))
        request = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        header = _NLMSG_HEADER.pack(
            _NLMSG_HEADER.size + len(request), _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, _SEQ, os.getpid()
        )
        sock.sendto(header + request, (0, 0))
        found: list[IpAddress] = []
        done = False
        while not done:
            chunk = sock.recv(_RECV_BYTES)
            if not chunk:
                break
            addresses, done = parse_address_dump(chunk)
            found.extend(addresses)
        return found


def local_addresses() -> list[IpAddress]:
    """The loopbacks plus every non-link-scope address of this host, sorted, no duplicates.

    Blocking (one netlink round trip, 2 s at most). Never raises: when netlink is not
    available the loopbacks alone are returned and a warning is logged.
    """
    found: set[IpAddress] = set(LOOPBACKS)
    try:
        found.update(_dump_addresses())
    except OSError as exc:
        _log.warning("cannot list the local IP addresses (%s): the certificate names the loopbacks only", exc)
    return sorted(found, key=lambda address: (address.version, address.packed))
