"""Batched UDP I/O for the data plane (Linux x86_64, ctypes on glibc), behind one small interface.

Receive::

    rx = BatchReceiver(sock, batch=64, slot_size=2048, timestamps=True)
    n = rx.recv_batch()          # never blocks; 0 when nothing is queued (EAGAIN never raises)
    for view, arrival, source in zip(rx.views, rx.arrivals, rx.sources):
        ...                      # views valid until the next recv_batch (copy what you keep)

- ``recvmmsg`` fills up to ``batch`` preallocated slots in one syscall, each with a kernel
  receive time (``SO_TIMESTAMPNS``, CLOCK_REALTIME: the ``time.time()`` domain, so IAT/PDV
  stay exact under batching). ``sources[i]`` is ``(host, port)`` for IPv4 and IPv6.
- Datagrams longer than ``slot_size`` are dropped and counted (``rx.truncated``).
- ``gro=True`` enables ``UDP_GRO`` and splits coalesced buffers back into datagrams.

Send::

    tx = BatchSender(sock)
    sent = tx.send_batch(datagrams, ("127.0.0.1", 5000))  # < len(datagrams) on EAGAIN/ENOBUFS

- One ``sendmmsg`` per call; each run of equal-size datagrams is one UDP GSO super-datagram
  (``UDP_SEGMENT`` cmsg). The datagrams are copied: buffers are the caller's again on return.

Fallbacks: each class switches for good to a per-packet path (``recvmsg_into``/``sendto``)
when the batched call is missing or answers ENOSYS/EINVAL; ``force_fallback=True`` selects it
(tests, comparisons); ``.batched`` tells which path is live. The sender drops GSO after an
EIO/EINVAL on a GSO message. Both work on blocking and non-blocking sockets (MSG_DONTWAIT);
a trio driver waits with ``trio.lowlevel.wait_readable(sock)`` / ``wait_writable(sock)``.

Helpers: ``set_socket_buffers``, ``set_dscp``, ``join_multicast``. Figures: ``docs/netio.md``.
"""

from appliance.netio.receiver import BatchReceiver
from appliance.netio.sender import BatchSender
from appliance.netio.sockopts import join_multicast, set_dscp, set_socket_buffers

__all__ = ["BatchReceiver", "BatchSender", "join_multicast", "set_dscp", "set_socket_buffers"]
