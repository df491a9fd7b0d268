"""ctypes bindings for the batched socket calls (Linux, x86_64, glibc).

Private to ``appliance.netio``. The layouts below are the x86_64 LP64 ones from
``<bits/socket.h>`` and ``<linux/udp.h>``; ``_check_layout`` pins them at import.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct
from collections.abc import Callable
from typing import Any, Final

# <asm-generic/socket.h> (x86_64 uses the generic values): the Python socket module lacks some.
SO_TIMESTAMPNS: Final = 35  # SCM_TIMESTAMPNS == SO_TIMESTAMPNS; struct timespec (16 bytes, LP64)
SO_SNDBUFFORCE: Final = 32
SO_RCVBUFFORCE: Final = 33
SOL_UDP: Final = 17
UDP_SEGMENT: Final = 103  # <linux/udp.h>: u16 gso_size, cmsg or sockopt (Linux 4.18)
UDP_GRO: Final = 104  # <linux/udp.h>: int, cmsg carries the segment size (Linux 5.0)
MSG_DONTWAIT: Final = int(socket.MSG_DONTWAIT)  # plain ints: IntFlag arithmetic costs ~1 µs
MSG_TRUNC: Final = int(socket.MSG_TRUNC)

# Linux net/ipv4/udp.c: UDP_MAX_SEGMENTS was 64 until 6.10 (128 since); take the older bound.
GSO_MAX_SEGMENTS: Final = 64
# One GSO super-datagram must fit an IP packet: 65535 - 40 (IPv6 header) - 8 (UDP) - margin.
GSO_MAX_BYTES: Final = 65000
# UIO_MAXIOV: sendmmsg/recvmmsg silently cap vlen at 1024.
MAX_VLEN: Final = 1024

# Errors that mean "the kernel or libc cannot do this call": switch to the per-packet path.
UNSUPPORTED_ERRNOS: Final = frozenset({errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT})
# Errors that mean "nothing more can go now": stop the batch without raising.
WOULD_BLOCK_ERRNOS: Final = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})


class Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.c_void_p),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", Msghdr), ("msg_len", ctypes.c_uint)]


MMSGHDR_SIZE: Final = ctypes.sizeof(Mmsghdr)  # 64
# Byte offsets inside one mmsghdr, for struct.pack_into/unpack_from on the array's memory.
OFF_NAMELEN: Final = Msghdr.msg_namelen.offset
OFF_IOV: Final = Msghdr.msg_iov.offset
OFF_IOVLEN: Final = Msghdr.msg_iovlen.offset
OFF_CONTROLLEN: Final = Msghdr.msg_controllen.offset
OFF_FLAGS: Final = Msghdr.msg_flags.offset
OFF_MSGLEN: Final = Mmsghdr.msg_len.offset

# What recvmmsg writes back per message: namelen, controllen, flags, msg_len.
RESULT: Final = struct.Struct(
    f"={OFF_NAMELEN}xI{OFF_CONTROLLEN - OFF_NAMELEN - 4}xQi{OFF_MSGLEN - OFF_FLAGS - 4}xI"
    f"{MMSGHDR_SIZE - OFF_MSGLEN - 4}x"
)
# struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; } then data, 8-aligned.
CMSG_HDR: Final = struct.Struct("=Qii")
CMSG_TIMESPEC: Final = struct.Struct("=Qiiqq")  # header + struct timespec
CMSG_INT: Final = struct.Struct("=Qiii")  # header + int (UDP_GRO)
CMSG_U16: Final = struct.Struct("=QiiH")  # header + u16 (UDP_SEGMENT)
SOCKADDR_SIZE: Final = 28  # sizeof(struct sockaddr_in6); sockaddr_in (16) fits


def cmsg_space(data_len: int) -> int:
    """CMSG_SPACE for LP64: 16-byte header plus data rounded up to 8."""
    return CMSG_HDR.size + ((data_len + 7) & ~7)


def cmsg_len(data_len: int) -> int:
    """CMSG_LEN for LP64."""
    return CMSG_HDR.size + data_len


def _check_layout() -> None:
    if ctypes.sizeof(ctypes.c_void_p) != 8 or MMSGHDR_SIZE != 64 or RESULT.size != MMSGHDR_SIZE:
        raise ImportError("appliance.netio's ctypes layouts are for x86_64 (LP64) Linux only")


_check_layout()


def _load() -> tuple[Callable[..., int] | None, Callable[..., int] | None]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no dynamic libc at all
        return None, None
    recvmmsg: Any = getattr(libc, "recvmmsg", None)
    sendmmsg: Any = getattr(libc, "sendmmsg", None)
    if recvmmsg is not None:
        # int recvmmsg(int fd, struct mmsghdr *vec, unsigned vlen, int flags, struct timespec *timeout)
        recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        recvmmsg.restype = ctypes.c_int
    if sendmmsg is not None:
        # int sendmmsg(int fd, struct mmsghdr *vec, unsigned vlen, int flags)
        sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        sendmmsg.restype = ctypes.c_int
    return recvmmsg, sendmmsg


recvmmsg, sendmmsg = _load()


def buffer_address(buf: bytearray) -> int:
    """The address of a bytearray's storage. The caller must never resize ``buf``."""
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def encode_sockaddr(family: int, dest: tuple[Any, ...]) -> bytes:
    """A ``struct sockaddr_in``/``sockaddr_in6`` for a numeric ``(host, port[, flowinfo, scope_id])``.

    An IPv4 host on an AF_INET6 socket becomes the v4-mapped address. A host name is
    resolved once by getaddrinfo (callers cache the result).
    """
    host, port = str(dest[0]), int(dest[1])
    if family == socket.AF_INET:
        try:
            packed = socket.inet_pton(socket.AF_INET, host)
        except OSError:
            packed = socket.inet_pton(socket.AF_INET, _resolve(family, host, port))
        return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + packed + bytes(8)
    flowinfo = int(dest[2]) if len(dest) > 2 else 0
    scope_id = int(dest[3]) if len(dest) > 3 else 0
    try:
        packed = socket.inet_pton(socket.AF_INET6, host)
    except OSError:
        try:
            packed = b"\0" * 10 + b"\xff\xff" + socket.inet_pton(socket.AF_INET, host)
        except OSError:
            packed = socket.inet_pton(socket.AF_INET6, _resolve(family, host, port))
    return (
        struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, flowinfo) + packed + struct.pack("=I", scope_id)
    )


def _resolve(family: int, host: str, port: int) -> str:
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    return str(infos[0][4][0])


def decode_sockaddr(raw: bytes) -> tuple[str, int]:
    """``(host, port)`` from a raw sockaddr_in/sockaddr_in6 (IPv6 flowinfo and scope are dropped)."""
    (family,) = struct.unpack_from("=H", raw, 0)
    (port,) = struct.unpack_from("!H", raw, 2)
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    return "", 0
