"""BatchSender: send many datagrams to one destination with one ``sendmmsg`` (and UDP GSO)."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from collections.abc import Sequence
from typing import Any, Final

from appliance.netio import _libc

_U64: Final = struct.Struct("=Q")
_IOVEC: Final = struct.Struct("=QQ")
_U16: Final = struct.Struct("=H")
_U32: Final = struct.Struct("=I")
_GSO_ERRNOS: Final = frozenset({errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT})
_MAX_DEST_CACHE: Final = 256


class BatchSender:
    """Send batches of datagrams from a UDP socket to one destination, without blocking.

    ``send_batch`` copies the datagrams into a preallocated arena, so the caller may reuse its
    buffers as soon as it returns. Each run of consecutive equal-size datagrams (up to 64
    segments and ~64 KB) goes as one UDP GSO super-datagram (a ``UDP_SEGMENT`` cmsg): the kernel
    cuts it into the original datagrams. All messages of one call go in one ``sendmmsg``.

    Fallbacks, chosen automatically and for good: GSO off after an EIO/EINVAL on a GSO message
    (a device without checksum offload, a segment larger than the path MTU); the per-packet
    path (``sendto``) when ``sendmmsg`` is missing or answers ENOSYS/EINVAL.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        gso: bool = True,
        force_fallback: bool = False,
        max_messages: int = 64,
        arena_size: int = 256 * 1024,
    ) -> None:
        if not 1 <= max_messages <= _libc.MAX_VLEN:
            raise ValueError(f"max_messages must be 1..{_libc.MAX_VLEN}")
        self._sock = sock
        self._fd = sock.fileno()
        self._family = sock.family
        self._gso = gso
        self._fallback = force_fallback or _libc.sendmmsg is None
        self._max_messages = max_messages
        self._arena = bytearray(arena_size)
        self._arena_addr = _libc.buffer_address(self._arena)
        self._name = bytearray(_libc.SOCKADDR_SIZE)
        self._name_addr = _libc.buffer_address(self._name)
        self._dest: tuple[Any, ...] | None = None  # None: a connected socket, no msg_name
        self._dest_cache: dict[tuple[Any, ...], tuple[bytes, tuple[Any, ...]]] = {}
        self._fallback_dest: tuple[Any, ...] | None = None
        self._ctrl_space = _libc.cmsg_space(2)
        self._ctrl = bytearray(max_messages * self._ctrl_space)
        ctrl_addr = _libc.buffer_address(self._ctrl)
        for k in range(max_messages):
            _libc.CMSG_U16.pack_into(
                self._ctrl, k * self._ctrl_space, _libc.cmsg_len(2), _libc.SOL_UDP, _libc.UDP_SEGMENT, 0
            )
        self._iovs = (_libc.Iovec * max_messages)()
        self._iovs_mv = memoryview(self._iovs).cast("B")
        self._hdrs = (_libc.Mmsghdr * max_messages)()
        self._hdrs_mv = memoryview(self._hdrs).cast("B")
        self._hdrs_addr = ctypes.addressof(self._hdrs)
        self._namelen = 16 if self._family == socket.AF_INET else _libc.SOCKADDR_SIZE
        iov_addr = ctypes.addressof(self._iovs)
        for k in range(max_messages):
            hdr = self._hdrs[k].msg_hdr
            hdr.msg_name = self._name_addr
            hdr.msg_namelen = 0
            hdr.msg_iov = iov_addr + k * ctypes.sizeof(_libc.Iovec)
            hdr.msg_iovlen = 1
            hdr.msg_control = ctrl_addr + k * self._ctrl_space
            hdr.msg_controllen = 0
        self._segments = [0] * max_messages

    @property
    def batched(self) -> bool:
        """True while ``sendmmsg`` is in use; False on the per-packet fallback."""
        return not self._fallback

    @property
    def gso_enabled(self) -> bool:
        """True while runs of equal-size datagrams go out as UDP GSO super-datagrams."""
        return self._gso and not self._fallback

    def send_batch(self, datagrams: Sequence[bytes | bytearray | memoryview], dest: tuple[Any, ...] | None) -> int:
        """Send ``datagrams`` in order to ``dest`` (a numeric ``(host, port)``); never blocks.

        ``dest=None`` sends on a connected socket (no per-datagram route lookup in the kernel).

        Returns how many were handed to the kernel: fewer than ``len(datagrams)`` when the
        socket buffer filled (EAGAIN) or the device queue did (ENOBUFS); those never raise.
        Other socket errors raise ``OSError`` (datagrams before the failing one were sent).
        """
        count = len(datagrams)
        if count == 0:
            return 0
        self._set_dest(dest)
        if self._fallback:
            return self._send_each(datagrams, 0)
        sent = 0
        while sent < count:
            messages = self._pack(datagrams, sent)
            sendmmsg = _libc.sendmmsg
            assert sendmmsg is not None
            result = sendmmsg(self._fd, self._hdrs_addr, messages, _libc.MSG_DONTWAIT)
            if result < 0:
                err = ctypes.get_errno()
                if err in _libc.WOULD_BLOCK_ERRNOS:
                    return sent
                if err == errno.EINTR:
                    continue
                if self._gso and err in _GSO_ERRNOS and any(n > 1 for n in self._segments[:messages]):
                    self._gso = False  # retry this chunk unsegmented
                    continue
                if err in _libc.UNSUPPORTED_ERRNOS:
                    self._fallback = True
                    return self._send_each(datagrams, sent)
                raise OSError(err, os.strerror(err))
            sent += sum(self._segments[:result])
        return sent

    def _pack(self, datagrams: Sequence[bytes | bytearray | memoryview], start: int) -> int:
        """Copy datagrams from ``start`` into the arena as up to ``max_messages`` messages."""
        arena, arena_len, arena_addr = self._arena, len(self._arena), self._arena_addr
        iovs_mv, hdrs_mv, ctrl = self._iovs_mv, self._hdrs_mv, self._ctrl
        segments, gso = self._segments, self._gso
        count = len(datagrams)
        offset = 0
        messages = 0
        index = start
        while index < count and messages < self._max_messages:
            first = datagrams[index]
            size = len(first)
            if offset + size > arena_len:
                if messages == 0:
                    raise ValueError(f"datagram of {size} bytes exceeds the send arena")
                break
            begin = offset
            arena[offset : offset + size] = first
            offset += size
            index += 1
            nseg = 1
            if gso and size:
                limit = min(_libc.GSO_MAX_SEGMENTS, _libc.GSO_MAX_BYTES // size)
                while nseg < limit and index < count and offset + size <= arena_len:
                    nxt = datagrams[index]
                    if len(nxt) != size:
                        break
                    arena[offset : offset + size] = nxt
                    offset += size
                    index += 1
                    nseg += 1
            _IOVEC.pack_into(iovs_mv, messages * 16, arena_addr + begin, offset - begin)
            hdr_off = messages * _libc.MMSGHDR_SIZE
            if nseg > 1:
                _U16.pack_into(ctrl, messages * self._ctrl_space + _libc.CMSG_HDR.size, size)
                _U64.pack_into(hdrs_mv, hdr_off + _libc.OFF_CONTROLLEN, self._ctrl_space)
            else:
                _U64.pack_into(hdrs_mv, hdr_off + _libc.OFF_CONTROLLEN, 0)
            segments[messages] = nseg
            messages += 1
        return messages

    def _set_dest(self, dest: tuple[Any, ...] | None) -> None:
        if dest == self._dest:
            return
        if dest is None or self._dest is None:  # connected <-> explicit: rewrite every namelen
            namelen = 0 if dest is None else self._namelen
            for k in range(self._max_messages):
                _U32.pack_into(self._hdrs_mv, k * _libc.MMSGHDR_SIZE + _libc.OFF_NAMELEN, namelen)
        if dest is None:
            self._dest = self._fallback_dest = None
            return
        entry = self._dest_cache.get(dest)
        if entry is None:
            raw = _libc.encode_sockaddr(self._family, dest)
            normalized = _libc.decode_sockaddr(raw) + tuple(dest[2:4])  # keep an IPv6 scope
            entry = (raw, normalized)
            if len(self._dest_cache) >= _MAX_DEST_CACHE:
                self._dest_cache.clear()
            self._dest_cache[dest] = entry
        raw, fallback_dest = entry
        self._name[: len(raw)] = raw
        self._dest, self._fallback_dest = dest, fallback_dest

    def _send_each(self, datagrams: Sequence[bytes | bytearray | memoryview], start: int) -> int:
        """The per-packet path: one ``sendto`` per datagram."""
        sock, dest = self._sock, self._fallback_dest
        sent = start
        for index in range(start, len(datagrams)):
            try:
                if dest is None:
                    sock.send(datagrams[index], _libc.MSG_DONTWAIT)
                else:
                    sock.sendto(datagrams[index], _libc.MSG_DONTWAIT, dest)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in _libc.WOULD_BLOCK_ERRNOS:
                    break
                raise
            sent += 1
        return sent
