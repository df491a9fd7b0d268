"""BatchSender: send many datagrams to one destination with one ``sendmmsg`` (and UDP GSO)."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate, compress
from operator import ne
from typing import Any, Final

from appliance.netio import _libc

_U64: Final = struct.Struct("=Q")
_U16: Final = struct.Struct("=H")
_U32: Final = struct.Struct("=I")
_GSO_ERRNOS: Final = frozenset({errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT})
_MAX_DEST_CACHE: Final = 256
# A strided layout: the mmsghdr array as bytes, each message's datagram bound, datagrams per
# message, and the buffer and iovec array its addresses point into (kept alive with it).
_StridedLayout = tuple[bytes, list[int], int, bytearray, Any]


class BatchSender:
    """Send batches of datagrams from a UDP socket to one destination, without blocking.

    ``send_batch`` copies the datagrams into one joined buffer per call, so the caller may reuse its
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
    ) -> None:
        if not 1 <= max_messages <= _libc.MAX_VLEN:
            raise ValueError(f"max_messages must be 1..{_libc.MAX_VLEN}")
        self._sock = sock
        self._fd = sock.fileno()
        self._family = sock.family
        self._gso = gso
        self._fallback = force_fallback or _libc.sendmmsg is None
        self._max_messages = max_messages
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
        self._gso_state = [0] * max_messages  # the UDP_SEGMENT size each message slot holds now (0: none)
        self._bounds: list[int] = []
        self._gso_sizes: list[int] = []
        self._blob = b""
        # send_strided's layouts, keyed by (buffer id, offset, stride, size, gso, connected).
        self._s_layouts: dict[tuple[int | bool, ...], _StridedLayout] = {}
        self._s_size = -1  # the GSO size the shared strided cmsg holds

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
        if not isinstance(datagrams, list | tuple):
            datagrams = list(datagrams)
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
                if self._gso and err in _GSO_ERRNOS and any(self._gso_sizes):
                    self._gso = False  # retry this chunk unsegmented
                    continue
                if err in _libc.UNSUPPORTED_ERRNOS:
                    self._fallback = True
                    return self._send_each(datagrams, sent)
                raise OSError(err, os.strerror(err))
            sent += self._bounds[result - 1] if result else 0
        return sent

    def send_strided(
        self, buffer: bytearray, offset: int, stride: int, size: int, count: int, dest: tuple[Any, ...] | None
    ) -> int:
        """Send ``count`` datagrams of ``size`` bytes found at ``offset + k * stride`` in ``buffer``.

        The zero-copy path for a receive buffer of fixed slots: the kernel reads the datagrams
        where they lie (no join, no per-datagram Python work), as GSO super-datagrams of up to
        64 segments. The message layout for a given (buffer, offset, stride, size) is built once
        and kept (it serves every count), so steady traffic costs one ``memmove`` and one
        ``sendmmsg``. ``buffer`` must not be resized while the sender lives.
        Returns how many were handed to the kernel (in order), like ``send_batch``.
        """
        if count <= 0:
            return 0
        self._set_dest(dest)
        if self._fallback:
            view = memoryview(buffer)
            return self._send_each([view[offset + k * stride : offset + k * stride + size] for k in range(count)], 0)
        sent = 0
        while sent < count:
            messages, bounds = self._load_strided(buffer, offset + sent * stride, stride, size, count - sent)
            sendmmsg = _libc.sendmmsg
            assert sendmmsg is not None
            result = sendmmsg(self._fd, self._s_hdrs_addr, messages, _libc.MSG_DONTWAIT)
            if result < 0:
                err = ctypes.get_errno()
                if err in _libc.WOULD_BLOCK_ERRNOS:
                    return sent
                if err == errno.EINTR:
                    continue
                if self._gso and err in _GSO_ERRNOS:
                    self._gso = False  # retry unsegmented (the layouts are keyed by GSO on/off)
                    continue
                if err in _libc.UNSUPPORTED_ERRNOS:
                    self._fallback = True
                    view = memoryview(buffer)
                    rest = [view[offset + k * stride : offset + k * stride + size] for k in range(sent, count)]
                    return sent + self._send_each(rest, 0)
                raise OSError(err, os.strerror(err))
            sent += bounds[result - 1] if result else 0
        return sent

    def _load_strided(
        self, buffer: bytearray, offset: int, stride: int, size: int, count: int
    ) -> tuple[int, list[int]]:
        """Copy the headers for up to ``count`` datagrams into the send array: (messages, bounds).

        One full layout per (buffer, offset, stride, size, GSO, connected) serves every count:
        its first messages are copied in and the last one cut short in place, so a new batch size
        never builds a layout (a few hundred microseconds of ctypes work) on the packet path.
        """
        key = (id(buffer), offset, stride, size, self._gso, self._dest is None)
        layout = self._s_layouts.get(key)
        if layout is None or layout[3] is not buffer:
            layout = self._build_strided_layout(key, buffer, offset, stride, size)
        template, bounds, per_message, _, _ = layout
        messages = min(-(-count // per_message), len(bounds))
        ctypes.memmove(self._s_hdrs_addr, template, messages * _libc.MMSGHDR_SIZE)
        full = bounds[messages - 1]
        if full <= count:
            return messages, bounds
        # The last message carries fewer segments: its iovlen, and no GSO cmsg for a single one.
        last = count - (messages - 1) * per_message
        at = (messages - 1) * _libc.MMSGHDR_SIZE
        _U64.pack_into(self._s_hdrs_mv, at + _libc.OFF_IOVLEN, last)
        if last == 1:
            _U64.pack_into(self._s_hdrs_mv, at + _libc.OFF_CONTROLLEN, 0)
        return messages, [*bounds[: messages - 1], count]

    def _build_strided_layout(
        self, key: tuple[int | bool, ...], buffer: bytearray, offset: int, stride: int, size: int
    ) -> _StridedLayout:
        if not hasattr(self, "_s_hdrs"):
            self._init_strided()
        # The largest batch a layout serves: every slot the buffer holds from ``offset``.
        count = min((len(buffer) - offset - size) // stride + 1, _libc.MAX_VLEN * _libc.GSO_MAX_SEGMENTS)
        base = _libc.buffer_address(buffer) + offset
        per_message = min(_libc.GSO_MAX_SEGMENTS, max(1, _libc.GSO_MAX_BYTES // max(size, 1))) if self._gso else 1
        messages = min(-(-count // per_message), _libc.MAX_VLEN)
        count = min(count, messages * per_message)
        iovs = (_libc.Iovec * count)()
        for k in range(count):
            iovs[k].iov_base = base + k * stride
            iovs[k].iov_len = size
        iov_addr = ctypes.addressof(iovs)
        hdrs = (_libc.Mmsghdr * messages)()
        namelen = 0 if self._dest is None else self._namelen
        bounds = []
        for m in range(messages):
            first = m * per_message
            end = min(first + per_message, count)
            hdr = hdrs[m].msg_hdr
            hdr.msg_name = self._name_addr
            hdr.msg_namelen = namelen
            hdr.msg_iov = iov_addr + first * ctypes.sizeof(_libc.Iovec)
            hdr.msg_iovlen = end - first
            hdr.msg_control = self._s_ctrl_addr
            hdr.msg_controllen = self._ctrl_space if end - first > 1 else 0
            bounds.append(end)
        # The GSO size lives in one shared cmsg, so every cached layout is for one size; a
        # change of size (or a full cache) starts the cache afresh.
        if self._s_size != size or len(self._s_layouts) >= 16:
            self._s_size = size
            _U16.pack_into(self._s_ctrl, _libc.CMSG_HDR.size, size)
            self._s_layouts.clear()
        # The layout keeps the buffer and the iovec array alive: its addresses point into both.
        layout = (bytes(memoryview(hdrs).cast("B")), bounds, per_message, buffer, iovs)
        self._s_layouts[key] = layout
        return layout

    def _init_strided(self) -> None:
        self._s_hdrs = (_libc.Mmsghdr * _libc.MAX_VLEN)()
        self._s_hdrs_addr = ctypes.addressof(self._s_hdrs)
        self._s_hdrs_mv = memoryview(self._s_hdrs).cast("B")
        self._s_ctrl = bytearray(self._ctrl_space)
        _libc.CMSG_U16.pack_into(self._s_ctrl, 0, _libc.cmsg_len(2), _libc.SOL_UDP, _libc.UDP_SEGMENT, 0)
        self._s_ctrl_addr = _libc.buffer_address(self._s_ctrl)
        self._s_size = -1  # the cmsg is fresh: every layout must write its size

    def _pack(self, datagrams: Sequence[bytes | bytearray | memoryview], start: int) -> int:
        """Lay out datagrams from ``start`` as up to ``max_messages`` messages; the message count.

        The datagrams are joined into one bytes object (one C-level copy, kept alive in
        ``self._blob`` until the next call) and each message's iovec points into it, so the
        per-datagram Python work is only ``len``.
        """
        window = datagrams[start : start + self._max_messages * (_libc.GSO_MAX_SEGMENTS if self._gso else 1)]
        sizes = list(map(len, window))
        bounds, gso_sizes = _layout(sizes, self._max_messages, self._gso)
        used = bounds[-1]
        blob = b"".join(window[:used])
        self._blob = blob
        base: int = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value or 0  # its buffer, not a copy
        offsets = list(accumulate(sizes[:used], initial=0))
        starts = [0, *bounds[:-1]]
        messages = len(bounds)
        iovecs = [
            field
            for begin, end in zip(starts, bounds, strict=True)
            for field in (base + offsets[begin], offsets[end] - offsets[begin])
        ]
        _iovec_array(messages).pack_into(self._iovs_mv, 0, *iovecs)
        if self._gso_state[:messages] != gso_sizes:  # steady traffic: no per-message writes at all
            for k, gso_size in enumerate(gso_sizes):
                if self._gso_state[k] != gso_size:
                    self._gso_state[k] = gso_size
                    if gso_size:
                        _U16.pack_into(self._ctrl, k * self._ctrl_space + _libc.CMSG_HDR.size, gso_size)
                    controllen = self._ctrl_space if gso_size else 0
                    _U64.pack_into(self._hdrs_mv, k * _libc.MMSGHDR_SIZE + _libc.OFF_CONTROLLEN, controllen)
        self._bounds = bounds
        self._gso_sizes = gso_sizes
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


def _layout(sizes: list[int], max_messages: int, gso: bool) -> tuple[list[int], list[int]]:
    """Split datagrams of ``sizes`` into messages: (end index of each, its GSO size or 0).

    With ``gso``, each run of equal sizes becomes messages of up to GSO_MAX_SEGMENTS datagrams
    and GSO_MAX_BYTES; a message of one datagram carries no UDP_SEGMENT.
    """
    count = len(sizes)
    if not gso:
        messages = min(count, max_messages)
        return list(range(1, messages + 1)), [0] * messages
    bounds: list[int] = []
    gso_sizes: list[int] = []
    # Indices where the size changes, found by C-level map/compress, then the end.
    run_ends = [*compress(range(1, count), map(ne, sizes[1:], sizes)), count]
    run_start = 0
    for run_end in run_ends:
        size = sizes[run_start]
        limit = min(_libc.GSO_MAX_SEGMENTS, _libc.GSO_MAX_BYTES // size) if size else 1
        for begin in range(run_start, run_end, max(limit, 1)):
            end = min(begin + max(limit, 1), run_end)
            bounds.append(end)
            gso_sizes.append(size if end - begin > 1 else 0)
            if len(bounds) == max_messages:
                return bounds, gso_sizes
        run_start = run_end
    return bounds, gso_sizes


@lru_cache(maxsize=_libc.MAX_VLEN)
def _iovec_array(messages: int) -> struct.Struct:
    """A Struct packing ``messages`` iovecs (base, length) in one call."""
    return struct.Struct(f"={2 * messages}Q")
