"""RTP/UDP input and output drivers of the engine worker (thin trio drivers).

The input drains its socket in bounded batches (recvmmsg with a kernel
timestamp per datagram, through ``appliance.netio``), hands each batch to the
flow, and the flow fans datagrams out to the outputs. Each output owns a
bounded queue of ``OUTPUT_QUEUE_PACKETS``: the input appends without waiting,
a full queue drops and counts (interop.md 11 ``packets_dropped``), and the
queue is sent at the end of every input batch with one ``sendmmsg``/GSO call.
When the kernel's send buffer is full the backlog waits for the socket to
become writable in the output's own task, so a slow output never stalls the
input or its siblings.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from collections import deque
from typing import Final

import trio

from appliance.models.config import RtpOutput, UdpOutput, split_host_port
from appliance.models.stats import OutputCounters
from appliance.netio import BatchSender, join_multicast, set_dscp, set_socket_buffers
from services.edge.core.fec import FecEncoder
from services.edge.core.rtp import PT_MP2T, build_rtp_header

OUTPUT_QUEUE_PACKETS: Final = 2048  # interop.md 11: each output has its own bounded queue of 2048 packets
# 32 MiB absorbs ~200 ms of a 1 Gbit/s burst while the worker is descheduled
# (the image raises net.core.rmem_max to match; SO_RCVBUFFORCE is used as root).
INPUT_RCVBUF_BYTES: Final = 32 * 1024 * 1024
OUTPUT_SNDBUF_BYTES: Final = 8 * 1024 * 1024
TS_PACKET: Final = 188
TS_PER_DATAGRAM: Final = 7
TS_DATAGRAM: Final = TS_PACKET * TS_PER_DATAGRAM  # 1316

_log = logging.getLogger("mediaplane.engine")


class FlowStartError(Exception):
    """A flow or output could not start (bind failed...); the text is user-facing."""


def sockaddr(addr: str) -> tuple[int, tuple[str, int]]:
    """``(family, (host, port))`` of an ``<ip>:<port>`` text."""
    host, port = split_host_port(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, (host, port)


def open_input_socket(bind_addr: str, interface_addr: str | None) -> socket.socket:
    """A non-blocking UDP socket bound to ``bind_addr``; a multicast IP joins the group.

    Binding to the group address (not the wildcard) makes Linux deliver only that
    group's datagrams to this socket, so two flows can share a port on two groups.
    """
    family, (host, port) = sockaddr(bind_addr)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        multicast = ipaddress.ip_address(host).is_multicast
        if multicast:
            # Only multicast shares an address: each socket bound to the group gets a copy
            # (ip(7)). A unicast input never does, so a second bind on its address fails
            # here instead of silently taking its feed (the service refuses it first: 409).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_socket_buffers(sock, rcvbuf=INPUT_RCVBUF_BYTES)
        sock.bind((host, port))
        if multicast:
            join_multicast(sock, host, interface_addr)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise FlowStartError(f"cannot listen on {bind_addr}: {exc.strerror or exc}") from exc
    return sock


class UdpOutputDriver:
    """An ``rtp`` or ``udp`` output: one destination (two with 2022-7 ``redundancy``)."""

    def __init__(self, config: RtpOutput | UdpOutput, *, ssrc: int) -> None:
        self.config = config
        self.output_id = config.id
        self.strip_rtp = config.type == "udp"
        self.packets_sent = 0
        self.bytes_sent = 0
        self.packets_dropped = 0
        self.fec_packets_sent = 0
        self.state = "starting"
        self._queue: deque[bytes | memoryview] = deque()
        self._legs: list[tuple[socket.socket, tuple[str, int], BatchSender]] = []
        self._blocked = False
        self._writable = trio.Event()
        self._closed = False
        # Re-packing buffer for TS that does not arrive in whole 1316-byte datagrams.
        self._ts_carry = bytearray()
        # RTP made for a raw-TS input (RFC 3550 §5.1; RFC 2250 §2: PT 33, 90 kHz clock).
        self._ssrc = ssrc
        self._sequence = int.from_bytes(os.urandom(2), "big")
        # SMPTE 2022-1 FEC (interop.md 12): column FEC to dest port + 2, row FEC to + 4.
        fec = getattr(config, "fec_encode", None)
        self._fec = FecEncoder(fec.columns, fec.rows) if fec is not None else None
        self._fec_columns: deque[bytes] = deque()
        self._fec_rows: deque[bytes] = deque()

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Open the socket(s); FlowStartError on failure."""
        legs = [(self.config.dest_addr, self.config.bind_addr, self.config.interface_addr, self.config.dscp)]
        redundancy = getattr(self.config, "redundancy", None)
        if redundancy is not None:
            legs.append(
                (
                    redundancy.dest_addr,
                    redundancy.bind_addr,
                    redundancy.interface_addr,
                    redundancy.dscp if redundancy.dscp is not None else self.config.dscp,
                )
            )
        try:
            for dest_addr, bind_addr, interface_addr, dscp in legs:
                self._legs.append(self._open_leg(dest_addr, bind_addr, interface_addr, dscp))
        except FlowStartError:
            self.close()
            raise
        self.state = "active"

    def _open_leg(
        self, dest_addr: str, bind_addr: str | None, interface_addr: str | None, dscp: int
    ) -> tuple[socket.socket, tuple[str, int], BatchSender]:
        family, dest = sockaddr(dest_addr)
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            set_socket_buffers(sock, sndbuf=OUTPUT_SNDBUF_BYTES)
            set_dscp(sock, dscp)
            if bind_addr is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(sockaddr(bind_addr)[1])
            elif interface_addr is not None:
                sock.bind((interface_addr, 0))
            if ipaddress.ip_address(dest[0]).is_multicast:
                if family == socket.AF_INET:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 16)
                    if interface_addr is not None:
                        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface_addr))
                else:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 16)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise FlowStartError(
                f"output {self.output_id!r}: cannot open a socket to {dest_addr}: {exc.strerror or exc}"
            ) from exc
        return sock, dest, BatchSender(sock)

    def close(self) -> None:
        self._closed = True
        for sock, _, _ in self._legs:
            sock.close()
        self._legs.clear()
        self._queue.clear()
        self._writable.set()
        self.state = "stopped"

    # ------------------------------------------------------------------ data path

    def offer(self, datagram: bytes | None, payload: memoryview, arrival: float) -> None:
        """Queue one input unit without waiting: an RTP ``datagram`` with ``payload`` its TS
        part, or ``datagram=None`` for raw TS (a udp input, an SRT message without RTP)."""
        if self.strip_rtp:
            if len(payload) == TS_DATAGRAM and not self._ts_carry:
                self._enqueue(payload)
            else:
                self._repack(payload)
        elif datagram is not None:
            self._enqueue(datagram)
            if self._fec is not None:
                self._protect(datagram, arrival)
        else:
            packet = bytearray(12 + len(payload))
            build_rtp_header(
                packet,
                payload_type=PT_MP2T,
                sequence=self._sequence,
                timestamp=int(arrival * 90000),
                ssrc=self._ssrc,
            )
            self._sequence = (self._sequence + 1) & 0xFFFF
            packet[12:] = payload
            made = bytes(packet)
            self._enqueue(made)
            if self._fec is not None:
                self._protect(made, arrival)

    def slot_layout(self, header_len: int, size: int) -> tuple[int, int] | None:
        """Where this output's datagrams lie in an input slot of ``size`` bytes whose TS payload
        starts at ``header_len`` (12 for RTP, 0 for raw TS): ``(offset, length)``, or None when
        the output must make its own packets (FEC, RTP made for raw TS, TS re-packing, SRT).
        """
        if self._fec is not None or self._closed:
            return None
        if self.strip_rtp:
            if self._ts_carry or size - header_len != TS_DATAGRAM:
                return None
            return header_len, size - header_len
        if header_len == 0:
            return None  # raw TS in, RTP out: each datagram needs a header of ours
        return 0, size

    def send_slots(self, buffer: bytearray, offset: int, stride: int, length: int, count: int) -> None:
        """Send ``count`` datagrams lying in place at ``offset + k * stride`` (see ``slot_layout``).

        Zero-copy when nothing is queued: the kernel reads the input slots directly. What the
        kernel does not take now (or everything, behind a backlog) is copied into the queue, so
        the input may reuse its slots as soon as this returns.
        """
        if self._closed:
            return
        sent = 0
        if not self._queue and not self._blocked and not self._fec_columns and not self._fec_rows:
            sent = count
            for index, (_, dest, sender) in enumerate(self._legs):
                try:
                    taken = sender.send_strided(buffer, offset, stride, length, count, dest)
                except OSError as exc:
                    if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                        raise
                    taken = count  # an ICMP error for an earlier datagram: this batch left
                if index == 0:
                    sent = taken
            self.packets_sent += sent
            self.bytes_sent += sent * length
        if sent < count:
            view = memoryview(buffer)
            for k in range(sent, count):
                start = offset + k * stride
                self._enqueue(bytes(view[start : start + length]))
            if not self._blocked:
                self.flush()

    def _protect(self, packet: bytes, now: float) -> None:
        """Feed the FEC encoder; its column/row packets go out with the next flush (paced by it)."""
        fec = self._fec
        assert fec is not None
        fec.on_media(memoryview(packet), now)
        while (column := fec.pop_column()) is not None:
            self._fec_columns.append(column)
        while (row := fec.pop_row()) is not None:
            self._fec_rows.append(row)

    def _repack(self, payload: memoryview) -> None:
        # interop.md 2.5: the udp output re-packs TS into 7 x 188 = 1316-byte datagrams.
        carry = self._ts_carry
        carry += payload
        while len(carry) >= TS_DATAGRAM:
            self._enqueue(bytes(carry[:TS_DATAGRAM]))
            del carry[:TS_DATAGRAM]

    def _enqueue(self, packet: bytes | memoryview) -> None:
        if len(self._queue) >= OUTPUT_QUEUE_PACKETS:
            self.packets_dropped += 1
            return
        self._queue.append(packet)

    def flush(self) -> None:
        """Send what is queued without blocking; a backlog waits for writability."""
        if self._blocked or self._closed:
            return
        if self._fec_columns or self._fec_rows:
            self._send_fec()
        if not self._queue:
            return
        queue = self._queue
        while queue:
            batch = list(queue) if len(queue) <= 64 else [queue[i] for i in range(64)]
            sent = self._send(batch)
            for _ in range(sent):
                packet = queue.popleft()
                self.packets_sent += 1
                self.bytes_sent += len(packet)
            if sent < len(batch):
                self._blocked = True
                self._writable.set()
                return

    def _send_fec(self) -> None:
        # FEC is best effort: what the kernel does not take now is dropped, never queued
        # ahead of media. Each leg gets its own FEC (2022-7 legs are independent paths).
        for queue, port_offset in ((self._fec_columns, 2), (self._fec_rows, 4)):
            if not queue:
                continue
            batch = list(queue)
            queue.clear()
            for index, (_, dest, sender) in enumerate(self._legs):
                try:
                    sent = sender.send_batch(batch, (dest[0], dest[1] + port_offset))
                except OSError:
                    sent = 0
                if index == 0:
                    self.fec_packets_sent += sent

    def _send(self, batch: list[bytes | memoryview]) -> int:
        """Send ``batch`` to every leg; the count the primary leg took."""
        sent_primary = 0
        for index, (_, dest, sender) in enumerate(self._legs):
            try:
                sent = sender.send_batch(batch, dest)
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                    # An ICMP error for an earlier datagram: the receiver is absent, the packet left.
                    sent = len(batch)
                else:
                    raise
            if index == 0:
                sent_primary = sent
        return sent_primary

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The output's task: ready at once (``open`` bound it), then drains backlogs."""
        task_status.started()
        await self.run_writer()

    async def run_writer(self) -> None:
        """Drain a backlog when the kernel buffer had no room (runs for the output's life)."""
        while not self._closed:
            await self._writable.wait()
            self._writable = trio.Event()
            if self._closed or not self._legs:
                return
            await trio.lowlevel.wait_writable(self._legs[0][0])
            self._blocked = False
            self.flush()

    def counters(self) -> OutputCounters:
        return OutputCounters(
            output_id=self.output_id,
            state=self.state,
            packets_sent=self.packets_sent,
            bytes_sent=self.bytes_sent,
            packets_dropped=self.packets_dropped,
            fec_packets_sent=self.fec_packets_sent,
        )
