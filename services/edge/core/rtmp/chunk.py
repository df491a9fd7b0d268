"""RTMP chunk stream (Adobe RTMP specification 1.0, §5.3) and protocol control messages (§5.4), sans-IO.

:class:`ChunkReader` takes received bytes in any split and answers whole :class:`RtmpMessage`\\ s.
It keeps per chunk-stream-id state (the previous message header, for header compression,
§5.3.1.2), reassembles messages split over chunks, applies Set Chunk Size (§5.4.1) and Abort
(§5.4.2) itself, and counts received bytes for Acknowledgements (§5.4.3, §5.4.4).

:class:`ChunkWriter` splits outgoing messages into chunks of the outgoing chunk size, choosing
the smallest message header type (fmt 0/1/2, fmt 3 for continuations).

Bounds (all raise :class:`ProtocolError` when crossed by the peer): a message's length
(``max_message_size``), the number of chunk stream ids in use (``max_chunk_streams``) and the
octets held in partly received messages together (``max_partial_bytes``). The reader never keeps
more than one chunk header (at most 18 octets) of unparsed input: chunk bodies are copied into
their message as they arrive.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from .errors import ProtocolError

DEFAULT_CHUNK_SIZE: Final = 128  # §5.4.1: "maximum chunk size defaults to 128 bytes"
MAX_CHUNK_SIZE: Final = 0xFFFFFF  # §5.4.1: sizes above 16777215 are equivalent (a message is at most that long)
MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024  # our cap on one message (the 24-bit length field allows 16 MiB - 1)
MAX_CHUNK_STREAMS: Final = 64  # distinct chunk stream ids one peer may use
MAX_HEADER_SIZE: Final = 3 + 11 + 4  # basic header + type 0 message header + extended timestamp
MIN_CHUNK_STREAM_ID: Final = 2  # §5.3.1.1: 0 and 1 select the 2- and 3-byte forms, 2 is the control stream
MAX_CHUNK_STREAM_ID: Final = 65599
CONTROL_CHUNK_STREAM_ID: Final = 2  # §5.4: protocol control messages use chunk stream id 2, message stream 0
EXTENDED_TIMESTAMP_MARK: Final = 0xFFFFFF  # §5.3.1.3
TIMESTAMP_MODULUS: Final = 1 << 32  # §5.3.1.2.1 / §3: timestamps are 32-bit and wrap


class MessageType(IntEnum):
    """RTMP message type ids (§5.4, §6.2 User Control, §7.1)."""

    SET_CHUNK_SIZE = 1
    ABORT = 2
    ACKNOWLEDGEMENT = 3
    USER_CONTROL = 4
    WINDOW_ACK_SIZE = 5
    SET_PEER_BANDWIDTH = 6
    AUDIO = 8
    VIDEO = 9
    DATA_AMF3 = 15
    SHARED_OBJECT_AMF3 = 16
    COMMAND_AMF3 = 17
    DATA_AMF0 = 18
    SHARED_OBJECT_AMF0 = 19
    COMMAND_AMF0 = 20
    AGGREGATE = 22


class UserControlEvent(IntEnum):
    """User Control message event types (§7.1.7)."""

    STREAM_BEGIN = 0
    STREAM_EOF = 1
    STREAM_DRY = 2
    SET_BUFFER_LENGTH = 3
    STREAM_IS_RECORDED = 4
    PING_REQUEST = 6
    PING_RESPONSE = 7


class PeerBandwidthLimit(IntEnum):
    """Set Peer Bandwidth limit types (§5.4.5)."""

    HARD = 0
    SOFT = 1
    DYNAMIC = 2


@dataclass(frozen=True, slots=True)
class RtmpMessage:
    """One reassembled RTMP message. ``timestamp`` is the 32-bit wire value (it wraps)."""

    chunk_stream_id: int
    type_id: int
    stream_id: int
    timestamp: int
    payload: bytes


@dataclass(slots=True)
class _InboundChunkStream:
    """What §5.3.1.2 lets later chunks on one chunk stream id omit, plus the message in progress."""

    timestamp: int = 0  # absolute, 32-bit
    timestamp_field: int = 0  # the last timestamp/delta field (fmt 3 re-applies it, §5.3.1.2.4)
    extended: bool = False  # the last fmt 0/1/2 header carried an extended timestamp
    length: int = 0
    type_id: int = 0
    stream_id: int = 0
    partial: bytearray | None = None  # the message being reassembled, None between messages


def _u24(data: bytes | bytearray, pos: int) -> int:
    return (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]


class ChunkReader:
    """Reassembles RTMP messages from received bytes (§5.3).

    Feed bytes with :meth:`feed`; it answers the messages they complete, control messages
    included (Set Chunk Size and Abort are already applied when they are answered, Window
    Acknowledgement Size sets :attr:`ack_window`).
    """

    def __init__(
        self,
        *,
        max_message_size: int = MAX_MESSAGE_SIZE,
        max_chunk_streams: int = MAX_CHUNK_STREAMS,
        max_partial_bytes: int | None = None,
    ) -> None:
        self.chunk_size = DEFAULT_CHUNK_SIZE
        self.max_message_size = max_message_size
        self.max_chunk_streams = max_chunk_streams
        self.max_partial_bytes = max_partial_bytes if max_partial_bytes is not None else 2 * max_message_size
        self.bytes_received = 0  # every octet fed, for Acknowledgement sequence numbers (§5.4.3)
        self.ack_window: int | None = None  # set by the peer's Window Acknowledgement Size (§5.4.4)
        self._last_ack_at = 0
        self._buffer = bytearray()  # an incomplete chunk header, never more than MAX_HEADER_SIZE octets
        self._streams: dict[int, _InboundChunkStream] = {}
        self._body_stream: _InboundChunkStream | None = None  # the chunk whose body is arriving
        self._body_cs_id = 0
        self._body_remaining = 0
        self._partial_bytes = 0

    @property
    def buffered_bytes(self) -> int:
        """Octets held: unparsed input plus partly reassembled messages."""
        return len(self._buffer) + self._partial_bytes

    def take_ack_due(self) -> int | None:
        """The sequence number to acknowledge when the peer's window has been crossed, else None (§5.4.3)."""
        if self.ack_window is None or self.ack_window <= 0:
            return None
        if self.bytes_received - self._last_ack_at < self.ack_window:
            return None
        self._last_ack_at = self.bytes_received
        return self.bytes_received % TIMESTAMP_MODULUS

    def feed(self, data: bytes | bytearray | memoryview) -> list[RtmpMessage]:
        """Consume ``data``; answer the messages it completes, in order. Raises ProtocolError."""
        self.bytes_received += len(data)
        view = memoryview(data)
        messages: list[RtmpMessage] = []
        pos = 0
        while True:
            if self._body_remaining:
                if pos >= len(view):
                    break
                take = min(self._body_remaining, len(view) - pos)
                self._append_body(view[pos : pos + take], messages)
                pos += take
                continue
            # Header: complete the buffered prefix with at most MAX_HEADER_SIZE new octets.
            room = MAX_HEADER_SIZE - len(self._buffer)
            head = bytes(self._buffer) + bytes(view[pos : pos + room])
            if not head:
                break
            used = self._parse_header(head, messages)
            if used is None:  # incomplete: keep what we have (bounded by MAX_HEADER_SIZE)
                self._buffer = bytearray(head)
                pos = len(view)
                break
            pos += used - len(self._buffer)
            self._buffer.clear()
        return messages

    def _stream(self, cs_id: int, create: bool) -> _InboundChunkStream:
        state = self._streams.get(cs_id)
        if state is None:
            if not create:
                raise ProtocolError(f"chunk stream {cs_id}: compressed header without a previous type 0 header")
            if len(self._streams) >= self.max_chunk_streams:
                raise ProtocolError(f"more than {self.max_chunk_streams} chunk streams in use")
            state = self._streams[cs_id] = _InboundChunkStream()
        return state

    def _parse_header(self, head: bytes, messages: list[RtmpMessage]) -> int | None:
        """Parse one chunk header at the start of ``head``; answer its length or None if incomplete."""
        fmt = head[0] >> 6
        cs_id = head[0] & 0x3F
        pos = 1
        # §5.3.1.1 basic header: 1, 2 or 3 octets.
        if cs_id == 0:
            if len(head) < 2:
                return None
            cs_id = head[1] + 64
            pos = 2
        elif cs_id == 1:
            if len(head) < 3:
                return None
            cs_id = head[2] * 256 + head[1] + 64
            pos = 3
        header_len = (11, 7, 3, 0)[fmt]  # §5.3.1.2.1-4
        if len(head) < pos + header_len:
            return None
        state = self._stream(cs_id, create=fmt == 0)
        new_message = fmt != 3 or state.partial is None
        if fmt == 3:
            field = state.timestamp_field
            extended = state.extended
        else:
            field = _u24(head, pos)
            extended = field == EXTENDED_TIMESTAMP_MARK
        if extended:
            # §5.3.1.3: the 32-bit timestamp follows; like librtmp and FFmpeg, fmt 3 chunks
            # after a header with an extended timestamp carry it too.
            if len(head) < pos + header_len + 4:
                return None
            ext = int.from_bytes(head[pos + header_len : pos + header_len + 4], "big")
        # Only now, with the whole header present, update the state.
        if fmt != 3:
            field = ext if extended else field
            state.extended = extended
            state.timestamp_field = field
            if fmt <= 1:
                length = _u24(head, pos + 3)
                if length > self.max_message_size:
                    raise ProtocolError(f"message of {length} octets exceeds the {self.max_message_size} cap")
                state.length = length
                state.type_id = head[pos + 6]
            if fmt == 0:
                state.stream_id = int.from_bytes(head[pos + 7 : pos + 11], "little")  # §5.3.1.2.1: little-endian
                state.timestamp = field
            else:
                state.timestamp = (state.timestamp + field) % TIMESTAMP_MODULUS
            if state.partial is not None:  # a new header drops an unfinished message on this chunk stream
                self._drop_partial(state)
        elif new_message:
            # §5.3.1.2.4: a type 3 chunk starting a new message repeats the previous delta.
            state.timestamp = (state.timestamp + state.timestamp_field) % TIMESTAMP_MODULUS
        used = pos + header_len + (4 if extended else 0)
        if new_message:
            state.partial = bytearray()
        self._body_stream = state
        self._body_cs_id = cs_id
        assert state.partial is not None
        self._body_remaining = min(self.chunk_size, state.length - len(state.partial))
        if self._body_remaining == 0:  # a zero-length message is complete at its header
            self._complete(cs_id, state, messages)
        return used

    def _append_body(self, chunk: memoryview, messages: list[RtmpMessage]) -> None:
        state = self._body_stream
        assert state is not None and state.partial is not None
        self._partial_bytes += len(chunk)
        if self._partial_bytes > self.max_partial_bytes:
            raise ProtocolError("partly received messages exceed the buffer cap")
        state.partial += chunk
        self._body_remaining -= len(chunk)
        if self._body_remaining == 0 and len(state.partial) >= state.length:
            self._complete(self._body_cs_id, state, messages)

    def _drop_partial(self, state: _InboundChunkStream) -> None:
        if state.partial is not None:
            self._partial_bytes -= len(state.partial)
            state.partial = None

    def _complete(self, cs_id: int, state: _InboundChunkStream, messages: list[RtmpMessage]) -> None:
        assert state.partial is not None
        payload = bytes(state.partial)
        self._drop_partial(state)
        message = RtmpMessage(cs_id, state.type_id, state.stream_id, state.timestamp, payload)
        self._apply_control(message)
        messages.append(message)

    def _apply_control(self, message: RtmpMessage) -> None:
        """Protocol control messages that change how the following chunks are read (§5.4)."""
        if message.type_id == MessageType.SET_CHUNK_SIZE:
            if len(message.payload) < 4:
                raise ProtocolError("Set Chunk Size message too short")
            size = int.from_bytes(message.payload[:4], "big") & 0x7FFFFFFF  # §5.4.1: bit 31 must be 0
            if size < 1:
                raise ProtocolError("Set Chunk Size of 0")
            self.chunk_size = min(size, MAX_CHUNK_SIZE)
        elif message.type_id == MessageType.ABORT:
            if len(message.payload) < 4:
                raise ProtocolError("Abort message too short")
            aborted = self._streams.get(int.from_bytes(message.payload[:4], "big"))
            if aborted is not None:
                self._drop_partial(aborted)
        elif message.type_id == MessageType.WINDOW_ACK_SIZE:
            if len(message.payload) < 4:
                raise ProtocolError("Window Acknowledgement Size message too short")
            self.ack_window = int.from_bytes(message.payload[:4], "big")


@dataclass(slots=True)
class _OutboundChunkStream:
    stream_id: int
    type_id: int
    length: int
    timestamp: int


def encode_basic_header(fmt: int, cs_id: int) -> bytes:
    """§5.3.1.1: the 1-, 2- or 3-octet basic header."""
    if not MIN_CHUNK_STREAM_ID <= cs_id <= MAX_CHUNK_STREAM_ID:
        raise ValueError(f"chunk stream id {cs_id} outside 2..65599")
    if cs_id < 64:
        return bytes([(fmt << 6) | cs_id])
    if cs_id < 320:
        return bytes([fmt << 6, cs_id - 64])
    rest = cs_id - 64
    return bytes([(fmt << 6) | 1, rest & 0xFF, rest >> 8])


class ChunkWriter:
    """Splits outgoing messages into chunks (§5.3) with per chunk stream header compression."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        self.chunk_size = chunk_size
        self._streams: dict[int, _OutboundChunkStream] = {}

    def set_chunk_size(self, size: int) -> bytes:
        """Answer the Set Chunk Size message (§5.4.1) and use ``size`` for every later chunk."""
        if not 1 <= size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk size {size} outside 1..{MAX_CHUNK_SIZE}")
        data = self.write_control(MessageType.SET_CHUNK_SIZE, size.to_bytes(4, "big"))
        self.chunk_size = size
        return data

    def write_control(self, type_id: int, payload: bytes) -> bytes:
        """A protocol control or User Control message: chunk stream 2, message stream 0 (§5.4, §6.2)."""
        return self.write(CONTROL_CHUNK_STREAM_ID, type_id, 0, 0, payload)

    def write(self, cs_id: int, type_id: int, stream_id: int, timestamp: int, payload: bytes) -> bytes:
        """Chunk one message. ``timestamp`` is taken modulo 2**32 (it wraps on the wire)."""
        if len(payload) > 0xFFFFFF:
            raise ValueError(f"message of {len(payload)} octets does not fit the 24-bit length")
        timestamp %= TIMESTAMP_MODULUS
        prev = self._streams.get(cs_id)
        delta = (timestamp - prev.timestamp) % TIMESTAMP_MODULUS if prev is not None else 0
        if prev is None or prev.stream_id != stream_id or delta >= TIMESTAMP_MODULUS // 2:
            fmt, field = 0, timestamp  # first message, other stream, or timestamp went backwards
        elif prev.type_id == type_id and prev.length == len(payload):
            fmt, field = 2, delta
        else:
            fmt, field = 1, delta
        self._streams[cs_id] = _OutboundChunkStream(stream_id, type_id, len(payload), timestamp)
        extended = field >= EXTENDED_TIMESTAMP_MARK
        ext = field.to_bytes(4, "big") if extended else b""
        header = bytearray(encode_basic_header(fmt, cs_id))
        header += (EXTENDED_TIMESTAMP_MARK if extended else field).to_bytes(3, "big")
        if fmt <= 1:
            header += len(payload).to_bytes(3, "big") + bytes([type_id])
        if fmt == 0:
            header += stream_id.to_bytes(4, "little")
        header += ext
        out = bytearray(header)
        out += payload[: self.chunk_size]
        continuation = encode_basic_header(3, cs_id) + ext  # §5.3.1.3: ext timestamp repeated in fmt 3
        for start in range(self.chunk_size, len(payload), self.chunk_size):
            out += continuation
            out += payload[start : start + self.chunk_size]
        return bytes(out)


# §5.4 protocol control message bodies
def acknowledgement_payload(sequence_number: int) -> bytes:
    """§5.4.3 Acknowledgement: the bytes received so far (32-bit, wraps)."""
    return (sequence_number % TIMESTAMP_MODULUS).to_bytes(4, "big")


def window_ack_size_payload(window: int) -> bytes:
    """§5.4.4 Window Acknowledgement Size."""
    return window.to_bytes(4, "big")


def set_peer_bandwidth_payload(window: int, limit: PeerBandwidthLimit = PeerBandwidthLimit.DYNAMIC) -> bytes:
    """§5.4.5 Set Peer Bandwidth: window size and limit type."""
    return window.to_bytes(4, "big") + bytes([limit])


def user_control_payload(event: UserControlEvent, value: int, extra: int | None = None) -> bytes:
    """§7.1.7 User Control: event type (16 bit) and its data (a 32-bit value, two for Set Buffer Length)."""
    out = int(event).to_bytes(2, "big") + (value % TIMESTAMP_MODULUS).to_bytes(4, "big")
    if extra is not None:
        out += (extra % TIMESTAMP_MODULUS).to_bytes(4, "big")
    return out
