"""The host addresses for the certificate's SANs: the rtnetlink dump parser and the real call."""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import struct
import subprocess

import pytest

from services.manager import local_addresses as la

ip = ipaddress.ip_address


def nlmsg(msg_type: int, body: bytes) -> bytes:
    length = 16 + len(body)
    return struct.pack("=IHHII", length, msg_type, 2, 1, 0) + body + b"\0" * ((-length) % 4)


def rtattr(attr_type: int, value: bytes) -> bytes:
    length = 4 + len(value)
    return struct.pack("=HH", length, attr_type) + value + b"\0" * ((-length) % 4)


def newaddr(family: int, scope: int, *attrs: bytes) -> bytes:
    return nlmsg(20, struct.pack("=BBBBI", family, 24, 0, scope, 2) + b"".join(attrs))


DONE = nlmsg(3, struct.pack("=i", 0))
V4 = newaddr(socket.AF_INET, 0, rtattr(1, ip("192.0.2.2").packed), rtattr(2, ip("192.0.2.2").packed))
# A point-to-point link: IFA_ADDRESS is the peer, IFA_LOCAL ours.
V4_P2P = newaddr(socket.AF_INET, 0, rtattr(1, ip("10.9.9.1").packed), rtattr(2, ip("10.9.9.2").packed))
V6 = newaddr(socket.AF_INET6, 0, rtattr(1, ip("fd00::2").packed))
V6_LINK = newaddr(socket.AF_INET6, 253, rtattr(1, ip("fe80::1").packed))
V6_HOST = newaddr(socket.AF_INET6, 254, rtattr(1, ip("::1").packed))


@pytest.mark.parametrize(
    ("data", "expected", "done"),
    [
        (V4 + V6 + DONE, [ip("192.0.2.2"), ip("fd00::2")], True),
        (V4_P2P, [ip("10.9.9.2")], False),
        (V6_LINK + V6_HOST + DONE, [ip("::1")], True),
        (V4 + nlmsg(2, struct.pack("=i", -1)) + V6, [ip("192.0.2.2")], True),  # NLMSG_ERROR ends the dump
        (V4 + V6[:-3], [ip("192.0.2.2")], False),  # a truncated message ends the chunk
        (newaddr(socket.AF_INET, 0, rtattr(1, b"\1\2\3")), [], False),  # a 3-byte IPv4 address
        (newaddr(socket.AF_INET, 0) + DONE, [], True),  # no address attribute
        (nlmsg(20, b"\2\0"), [], False),  # a body shorter than ifaddrmsg
        (b"", [], False),
        (struct.pack("=IHHII", 8, 20, 0, 0, 0), [], False),  # a length below the header's own
    ],
)
def test_parse_address_dump(data: bytes, expected: list[object], done: bool) -> None:
    assert la.parse_address_dump(data) == (expected, done)


def test_local_addresses_hold_the_loopbacks_and_every_host_address() -> None:
    found = la.local_addresses()
    assert found == sorted(set(found), key=lambda a: (a.version, a.packed))
    assert {ip("127.0.0.1"), ip("::1")} <= set(found)
    assert all(not a.is_link_local for a in found)
    if shutil.which("ip") is None:
        pytest.skip("iproute2 is not installed: no independent list to compare with")
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout
    listed = {ip(i["local"]) for link in json.loads(out) for i in link.get("addr_info", []) if i["scope"] != "link"}
    assert listed and listed <= set(found)


def test_without_netlink_the_loopbacks_remain(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> list[la.IpAddress]:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(la, "_dump_addresses", refused)
    assert la.local_addresses() == [ip("127.0.0.1"), ip("::1")]
