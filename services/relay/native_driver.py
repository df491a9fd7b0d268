"""The trio driver of the native UDP plane (interop.md 9): one UDP socket around :class:`NativePlane`.

The latching, the checks and the counters are the sans-IO ``NativePlane``'s; this module owns
the socket and the clock:

- :func:`bind_native_socket` opens the socket with 32 MiB buffers (``SO_RCVBUFFORCE`` first,
  then the capped ``SO_RCVBUF``; the same for send). An ``OSError`` there means the relay runs
  without the ``udp-relay`` capability (interop.md 9 "fallback"); the caller decides.
- :meth:`NativeDriver.run` waits until the socket is readable, then drains what the kernel holds
  in a bounded batch of non-blocking ``recvfrom_into`` calls into one 2048-byte buffer (the 9
  receive buffer), feeding each datagram to the plane and sending its answers from the same
  socket at once (the ack "leaves from the relay socket the register arrived on"). A send that
  would block is dropped and counted: the plane never waits (style.md §7).
- The reaper runs every 10 s (``REAP_INTERVAL_S``).
- A refused ``register`` can be reported (``on_register_refused``) for the manager's
  ``tunnel`` events, at most once per tunnel, direction and reason a minute.
"""

from __future__ import annotations

import errno
import logging
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from appliance.models.config import split_host_port
from appliance.netio.sockopts import set_socket_buffers
from services.relay.native_plane import (
    NIL_PREFIX,
    PREFIX_LEN,
    REAP_INTERVAL_S,
    RECV_BUFFER_BYTES,
    SOCKET_BUFFER_BYTES,
    ControlError,
    NativePlane,
    decode_register,
)

__all__ = ["BATCH_MAX", "DriverCounters", "NativeDriver", "RegisterRefused", "bind_native_socket"]

_log = logging.getLogger("mediaplane.relay.native")

BATCH_MAX: Final = 64
"""Datagrams drained per wakeup before yielding to the other tasks (style.md §7)."""
REFUSAL_REPORT_INTERVAL_S: Final = 60.0
_REFUSALS_REMEMBERED: Final = 1024


@dataclass(frozen=True, slots=True)
class RegisterRefused:
    """A native ``register`` got no ack (interop.md 9 "Latching"); ``reason`` is the plane's
    rejection key (``auth``, ``loop``, ``takeover_grace``, ``per_ip_limit``, ``unlatchable``)."""

    tunnel_id: str
    direction: str
    source: str
    reason: str


@dataclass(slots=True)
class DriverCounters:
    """The socket's own counters (the plane's are in ``NativePlane.counters``)."""

    datagrams_received: int = 0
    datagrams_sent: int = 0
    send_dropped: int = 0  # the socket's send buffer was full
    send_errors: int = 0
    receive_errors: int = 0


def bind_native_socket(address: str) -> socket.socket:
    """A non-blocking UDP socket bound to ``address`` (``ip:port``) with 32 MiB buffers.

    Raises OSError when it cannot be bound (the port is taken, the address is not local).
    """
    host, port = split_host_port(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        # interop.md 9: socket buffers are 32 MiB (a burst of media from many sessions).
        set_socket_buffers(sock, rcvbuf=SOCKET_BUFFER_BYTES, sndbuf=SOCKET_BUFFER_BYTES)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _shown(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class NativeDriver:
    """Runs one :class:`NativePlane` on one socket. ``await run()`` in a nursery."""

    def __init__(
        self,
        plane: NativePlane,
        sock: socket.socket,
        *,
        on_register_refused: Callable[[RegisterRefused], None] | None = None,
    ) -> None:
        self.plane = plane
        self.sock = sock
        self.counters = DriverCounters()
        self._on_refused = on_register_refused
        self._refusals_reported: dict[tuple[str, str, str], float] = {}

    @property
    def local_address(self) -> str:
        """``host:port`` the socket is bound to."""
        name = self.sock.getsockname()
        return _shown((name[0], name[1]))

    def close_udp_session(self, tunnel_id: uuid.UUID) -> bool:
        """Admin DELETE / ``close_udp_session``: drop the session now; False when there was none."""
        return self.plane.close(tunnel_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Receive, forward and reap until cancelled; the socket is closed on the way out."""
        with self.sock:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reap)
                task_status.started()
                await self._receive()

    async def _reap(self) -> None:
        while True:
            await trio.sleep(REAP_INTERVAL_S)
            gone = self.plane.reap(trio.current_time())
            if gone:
                _log.debug("native plane: %d idle session(s) reaped", len(gone))

    async def _receive(self) -> None:
        sock, plane = self.sock, self.plane
        buf = bytearray(RECV_BUFFER_BYTES)
        view = memoryview(buf)
        counters = self.counters
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            for _ in range(BATCH_MAX):
                try:
                    n, source = sock.recvfrom_into(buf)
                except BlockingIOError:
                    break
                except OSError as exc:  # e.g. an ICMP error queued on the socket
                    counters.receive_errors += 1
                    if exc.errno in (errno.EBADF, errno.ENOTSOCK):
                        raise
                    continue
                counters.datagrams_received += 1
                data = bytes(view[:n])
                address = (source[0], source[1])
                control = n >= PREFIX_LEN and data[:PREFIX_LEN] == NIL_PREFIX
                # Control datagrams are rare (a register per edge every 5 s): copying the five
                # rejection counters around them tells which check refused it.
                rejected_before = dict(plane.counters.registers_rejected) if control else None
                for payload, destination in plane.on_datagram(data, address, now):
                    self._send(payload, destination)
                if rejected_before is not None and self._on_refused is not None:
                    for reason, count in plane.counters.registers_rejected.items():
                        if count != rejected_before.get(reason, 0):
                            self._report_refusal(data, address, reason, now)
            else:
                await trio.lowlevel.checkpoint()  # a full batch: let the API and QUIC run

    def _send(self, payload: bytes, destination: tuple[str, int]) -> None:
        try:
            self.sock.sendto(payload, destination)
        except BlockingIOError:
            self.counters.send_dropped += 1
        except OSError:
            self.counters.send_errors += 1
        else:
            self.counters.datagrams_sent += 1

    def _report_refusal(self, data: bytes, source: tuple[str, int], reason: str, now: float) -> None:
        """Tell the service about a refused register, rate-limited per (tunnel, direction, reason)."""
        if self._on_refused is None:
            return
        try:
            register = decode_register(data)
        except ControlError:
            return
        key = (str(register.tunnel_id), register.direction, reason)
        last = self._refusals_reported.get(key)
        if last is not None and now - last < REFUSAL_REPORT_INTERVAL_S:
            return
        if len(self._refusals_reported) >= _REFUSALS_REMEMBERED:
            self._refusals_reported.clear()
        self._refusals_reported[key] = now
        self._on_refused(RegisterRefused(key[0], register.direction, _shown(source), reason))
