"""aioquic's ``QuicConnection`` with the three things interop.md 8.1 and a relay need that it lacks.

- **Stream limits.** aioquic advertises 128 bidirectional and 128 unidirectional streams and has
  no setting for it; 8.1 fixes 1024 and 256. The limits are written into the transport
  parameters at the handshake, so they are set right after construction.
- **A bounded datagram queue.** ``send_datagram_frame`` appends to an unbounded deque, and a
  congestion-limited connection lets it grow without end (architecture.md "Relay"). Here the
  queue holds at most ``datagram_queue_limit`` datagrams; the oldest goes first (old media is
  worth least) and is counted in ``datagrams_dropped``.
- **Receive windows the application controls.** aioquic raises a stream's flow-control credit
  whenever the peer has used half of it (it doubles), whatever the application did with the
  data, so a fast sender can fill the relay's memory when the other leg is slow. For a stream
  put under :meth:`ManagedConnection.control_stream_window`, the credit is ``consumed +
  window`` instead (RFC 9000 section 4.1), where ``consumed`` advances only when the application
  says it has passed the bytes on (:meth:`ManagedConnection.consume`). This is the relay's TCP
  backpressure (issue 16): a leg that cannot drain stops the other leg's sender.

These reach into aioquic's private state (``_local_max_streams_*``, ``_datagrams_pending``,
``_write_stream_limits``); aioquic is pinned (requirements.lock) and ``tests/quic`` checks each
behaviour against the real library, so an upgrade that moves them fails there first.
"""

from __future__ import annotations

from typing import Any, Final

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicFrameType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import K_MICRO_SECOND, K_SECOND, QuicPacketPacer
from aioquic.quic.stream import QuicStream

__all__ = [
    "DEFAULT_DATAGRAM_QUEUE_LIMIT",
    "DEFAULT_STREAM_WINDOW",
    "MAX_BIDI_STREAMS",
    "MAX_UNI_STREAMS",
    "ManagedConnection",
]

MAX_BIDI_STREAMS: Final = 1024  # interop.md 8.1
MAX_UNI_STREAMS: Final = 256  # interop.md 8.1
DEFAULT_DATAGRAM_QUEUE_LIMIT: Final = 1024
"""About 1.4 MB of 1368-byte tunnel datagrams: under 40 ms at 300 Mbit/s, then the oldest go."""
DEFAULT_STREAM_WINDOW: Final = 256 * 1024
"""Credit a controlled stream keeps ahead of what the application has passed on."""
_MAX_STREAM_DATA_FRAME_CAPACITY: Final = 1 + 16  # frame type + two varints (stream id, offset)
PACING_BURST_PACKETS: Final = 64
"""Packets one pacing burst may hold (aioquic: 16). Each burst costs the driver a wake-up (a
trio timer, ~100 µs of Python); at 16 packets the wake-ups, not the packets, were the limit."""


class _BurstPacer(QuicPacketPacer):
    """aioquic's token-bucket pacer (RFC 9002 section 7.7) with a deeper bucket: still paced at
    cwnd/srtt, in bursts of up to :data:`PACING_BURST_PACKETS` (or half the window)."""

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        pacing_rate = congestion_window / max(smoothed_rtt, K_MICRO_SECOND)
        self.packet_time = max(K_MICRO_SECOND, min(self._max_datagram_size / pacing_rate, K_SECOND))
        burst = min(congestion_window // 2, PACING_BURST_PACKETS * self._max_datagram_size)
        self.bucket_max = max(2 * self._max_datagram_size, burst) / pacing_rate
        if self.bucket_time > self.bucket_max:
            self.bucket_time = self.bucket_max


class ManagedConnection(QuicConnection):
    """A ``QuicConnection`` with the 8.1 stream limits, a bounded datagram queue and
    application-controlled receive windows (see the module docstring)."""

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        datagram_queue_limit: int = DEFAULT_DATAGRAM_QUEUE_LIMIT,
        max_bidi_streams: int = MAX_BIDI_STREAMS,
        max_uni_streams: int = MAX_UNI_STREAMS,
        **kwargs: Any,
    ) -> None:
        super().__init__(configuration=configuration, **kwargs)
        self._local_max_streams_bidi.value = max_bidi_streams
        self._local_max_streams_uni.value = max_uni_streams
        self.datagram_queue_limit = datagram_queue_limit
        self.datagrams_dropped = 0
        """Datagrams dropped because the queue was full (the oldest each time)."""
        self._windows: dict[int, tuple[int, int]] = {}  # stream id -> (consumed, window)
        self._loss._pacer = _BurstPacer(max_datagram_size=configuration.max_datagram_size)

    # ------------------------------------------------------------------ datagrams
    def send_datagram_frame(self, data: bytes) -> None:
        """Queue one DATAGRAM frame; when the queue is full the oldest queued one is dropped."""
        pending = self._datagrams_pending
        if len(pending) >= self.datagram_queue_limit:
            pending.popleft()
            self.datagrams_dropped += 1
        pending.append(data)

    @property
    def datagrams_queued(self) -> int:
        return len(self._datagrams_pending)

    # ------------------------------------------------------------------ stream windows
    def control_stream_window(self, stream_id: int, window: int = DEFAULT_STREAM_WINDOW) -> None:
        """From now on, the peer may send on ``stream_id`` at most ``window`` bytes beyond what
        :meth:`consume` has released. Bytes already credited stay credited."""
        self._windows[stream_id] = (self._windows.get(stream_id, (0, window))[0], window)

    def consume(self, stream_id: int, count: int) -> None:
        """The application passed ``count`` more bytes of ``stream_id`` on: widen its credit.
        (The caller transmits afterwards so that the MAX_STREAM_DATA frame leaves.)"""
        entry = self._windows.get(stream_id)
        if entry is not None:
            self._windows[stream_id] = (entry[0] + count, entry[1])

    def forget_stream_window(self, stream_id: int) -> None:
        self._windows.pop(stream_id, None)

    def send_buffered(self, stream_id: int) -> int:
        """Bytes written to ``stream_id`` that the peer has not acknowledged yet (0 when unknown)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        sender = stream.sender
        return sender._buffer_stop - sender._buffer_start

    def stream_exists(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def _write_stream_limits(self, builder: QuicPacketBuilder, space: Any, stream: QuicStream) -> None:
        stream_id = stream.stream_id
        entry = None if stream_id is None else self._windows.get(stream_id)
        if stream_id is None or entry is None or not stream.max_stream_data_local:
            super()._write_stream_limits(builder, space, stream)
            return
        consumed, window = entry
        target = consumed + window
        # Only grow (credit is never taken back, RFC 9000 section 4.1), and in steps of a
        # quarter window so that a steady flow does not send a frame per packet.
        if target >= stream.max_stream_data_local + window // 4:
            stream.max_stream_data_local = target
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=_MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local
