"""Length-prefixed frames of the relay control stream and TCP stream headers, and UDP datagrams.

interop.md 8.1 "Framing": each control message is ``u32 big-endian length ‖ UTF-8 JSON object``,
the JSON at most 1 048 576 bytes; a longer frame closes the connection. interop.md 13: a TCP
data stream's header uses the same framing (the raw bytes of the stream follow it).
interop.md 8.3 "UDP": one QUIC datagram is ``[16-byte tunnel UUID][payload]``.

:class:`FrameDecoder` is fed arbitrary chunks of a stream and hands back whole frame bodies. It
rejects an oversize frame as soon as its 4-byte length prefix is in, before buffering the body:
:class:`FrameTooLarge` means "close the connection" (unlike the node protocol's 5 MiB limit,
which drops a frame and keeps the link).
"""

from __future__ import annotations

import uuid
from typing import Final

from appliance.protocol.errors import ErrorKind, LocalProtocolError, ProtocolError

__all__ = [
    "DATAGRAM_PREFIX_BYTES",
    "LENGTH_PREFIX_BYTES",
    "MAX_FRAME_BYTES",
    "FrameDecoder",
    "FrameTooLarge",
    "TruncatedFrame",
    "decode_datagram",
    "encode_datagram",
    "encode_frame",
]

MAX_FRAME_BYTES: Final = 1_048_576
"""interop.md 8.1: a frame's JSON is at most 1 048 576 bytes (the 4-byte prefix not counted)."""
LENGTH_PREFIX_BYTES: Final = 4
"""The ``u32`` big-endian length in front of every frame."""
DATAGRAM_PREFIX_BYTES: Final = 16
"""interop.md 8.3: the tunnel UUID (16 raw bytes) in front of each UDP datagram's payload."""


class FrameTooLarge(ProtocolError):
    """A frame's length prefix announces more than ``max_bytes``: close the QUIC connection
    (interop.md 8.1, 13: "A control message over 1 MiB closes the QUIC connection").

    ``closes_connection`` is always true; it is there so a driver's handler reads as the rule.
    """

    closes_connection: Final = True

    def __init__(self, max_bytes: int) -> None:
        super().__init__(ErrorKind.FRAME_TOO_LARGE, f"Frame larger than {max_bytes} bytes: closing the connection")
        self.max_bytes = max_bytes


class TruncatedFrame(ProtocolError):
    """The stream ended inside a frame (its prefix or body)."""

    def __init__(self) -> None:
        super().__init__(ErrorKind.MALFORMED, "Stream ended inside a frame")


def encode_frame(body: bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """``len(body)`` as a big-endian u32, then ``body``.

    Raises :class:`LocalProtocolError` when ``body`` is over ``max_bytes`` (we never send a frame
    that would make the peer close the connection).
    """
    if len(body) > max_bytes:
        raise LocalProtocolError(f"frame of {len(body)} bytes is over the {max_bytes}-byte limit")
    return len(body).to_bytes(LENGTH_PREFIX_BYTES, "big") + body


class FrameDecoder:
    """Incremental decoder of ``u32 length ‖ body`` frames, fed chunks of any size.

    - :meth:`feed` buffers a chunk and returns the bodies it completed, in order;
    - :meth:`next_frame` takes one body at a time (for a TCP data stream: take the header,
      then :meth:`take_remaining` for the raw bytes that followed it in the same chunk);
    - :meth:`end_of_stream` checks that the stream did not end inside a frame.

    After :class:`FrameTooLarge` the decoder is poisoned: every later call raises it again
    (the connection is closing; nothing more from it may be used).
    """

    def __init__(self, *, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned (a partial frame, or raw data after a header)."""
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        """Buffer ``data`` without parsing it (use :meth:`next_frame` afterwards)."""
        self._check_not_failed()
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None when more bytes are needed.

        Raises :class:`FrameTooLarge` as soon as an oversize length prefix is buffered.
        """
        self._check_not_failed()
        if len(self._buffer) < LENGTH_PREFIX_BYTES:
            return None
        length = int.from_bytes(self._buffer[:LENGTH_PREFIX_BYTES], "big")
        if length > self._max_bytes:
            self._failed = True
            self._buffer.clear()
            raise FrameTooLarge(self._max_bytes)
        end = LENGTH_PREFIX_BYTES + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[LENGTH_PREFIX_BYTES:end])
        del self._buffer[:end]
        return body

    def feed(self, data: bytes) -> list[bytes]:
        """Buffer ``data`` and return every frame body now complete (possibly none)."""
        self.receive_data(data)
        bodies: list[bytes] = []
        while (body := self.next_frame()) is not None:
            bodies.append(body)
        return bodies

    def take_remaining(self) -> bytes:
        """Everything buffered and not yet returned, emptying the buffer (the raw bytes that
        followed a TCP stream header)."""
        self._check_not_failed()
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def end_of_stream(self) -> None:
        """The stream ended: raise :class:`TruncatedFrame` if it ended inside a frame."""
        self._check_not_failed()
        if self._buffer:
            raise TruncatedFrame()

    def _check_not_failed(self) -> None:
        if self._failed:
            raise FrameTooLarge(self._max_bytes)


def encode_datagram(tunnel_id: uuid.UUID | str, payload: bytes) -> bytes:
    """One QUIC datagram: the tunnel's UUID as 16 raw bytes, then ``payload`` (interop.md 8.3).

    Raises ``ValueError`` when ``tunnel_id`` is not a UUID.
    """
    tunnel = tunnel_id if isinstance(tunnel_id, uuid.UUID) else uuid.UUID(tunnel_id)
    return tunnel.bytes + payload


def decode_datagram(datagram: bytes) -> tuple[uuid.UUID, bytes]:
    """Split a QUIC datagram into (tunnel UUID, payload).

    Raises :class:`ProtocolError` (``MALFORMED``) when it is shorter than the 16-byte prefix.
    """
    if len(datagram) < DATAGRAM_PREFIX_BYTES:
        raise ProtocolError(ErrorKind.MALFORMED, "Datagram shorter than its tunnel id")
    return uuid.UUID(bytes=bytes(datagram[:DATAGRAM_PREFIX_BYTES])), bytes(datagram[DATAGRAM_PREFIX_BYTES:])
