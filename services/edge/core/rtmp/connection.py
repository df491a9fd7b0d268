"""RTMP connections, sans-IO (h11/aioquic style): :class:`RtmpServerConnection` accepts a publisher,
:class:`RtmpClientConnection` pushes to a server (or plays from one).

Driver contract (both classes)::

    conn = RtmpServerConnection()          # or RtmpClientConnection(app=..., tc_url=...)
    sock.sendall(conn.data_to_send())      # the client has C0+C1 queued from the start
    while True:
        data = sock.recv(65536)
        events = conn.receive_data(data)   # b"" means the peer closed: -> [ConnectionClosed()]
        for event in events: ...           # the application may call actions here
        sock.sendall(conn.data_to_send())  # always drain after receive_data and after actions
        if conn.closed: break              # after reject_publish / close(), flush then close

``receive_data`` raises :class:`ProtocolError` on anything the peer got wrong; the connection
is then failed and every later call raises too. Nothing here reads clocks, sockets or randomness:
pass ``handshake_random`` (1528 octets, e.g. ``os.urandom(1528)``) to put entropy in C1/S1.

Memory is bounded by the peer-independent caps: the handshake buffer (two handshake packets),
one chunk header of unparsed input, ``max_message_size`` per message and twice that for all
partly received messages (see :mod:`.chunk`). Events are returned, not queued.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Final

from . import amf0
from .amf0 import UNDEFINED, AmfValue, EcmaArray
from .chunk import (
    MAX_MESSAGE_SIZE,
    TIMESTAMP_MODULUS,
    ChunkReader,
    ChunkWriter,
    MessageType,
    RtmpMessage,
    UserControlEvent,
    acknowledgement_payload,
    set_peer_bandwidth_payload,
    user_control_payload,
    window_ack_size_payload,
)
from .errors import FlvError, ProtocolError
from .events import (
    AudioData,
    ClientConnected,
    Connected,
    ConnectionClosed,
    ErrorReceived,
    Event,
    Metadata,
    PlayStarted,
    PublishRequested,
    PublishStarted,
    StreamEnded,
    VideoData,
)
from .flv import (
    TAG_AUDIO,
    TAG_SCRIPT,
    TAG_VIDEO,
    AudioTag,
    VideoTag,
    build_audio_tag,
    build_video_tag,
    parse_audio_tag,
    parse_video_tag,
)

RTMP_VERSION: Final = 3  # §5.2.2 C0/S0: version 3 (plain RTMP)
HANDSHAKE_SIZE: Final = 1536  # §5.2.3 C1/S1, §5.2.4 C2/S2
HANDSHAKE_RANDOM_SIZE: Final = HANDSHAKE_SIZE - 8
DEFAULT_WINDOW_ACK_SIZE: Final = 2_500_000
DEFAULT_OUT_CHUNK_SIZE: Final = 4096
MAX_STREAMS: Final = 16  # createStream calls one connection may make
MAX_AMF_VALUES: Final = 64  # values in one command/data message

# Chunk stream ids we send on (any 3..65599 is legal; these match common encoders).
CS_COMMAND: Final = 3  # NetConnection commands
CS_AUDIO: Final = 4
CS_STREAM: Final = 5  # NetStream commands (publish, onStatus) and data messages
CS_VIDEO: Final = 6

SERVER_PROPERTIES: Final[dict[str, AmfValue]] = {"fmsVer": "FMS/3,5,7,7009", "capabilities": 31.0, "mode": 1.0}
SUPPORTED_FOURCCS: Final = ("hvc1", "av01", "vp09")


def _default_random() -> bytes:
    """A fixed, recognisable filler: the spec asks for bytes that tell the peers apart, not secrecy."""
    pattern = b"mediaplane-rtmp-sans-io-"
    return (pattern * (HANDSHAKE_RANDOM_SIZE // len(pattern) + 1))[:HANDSHAKE_RANDOM_SIZE]


class _State(Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"
    FAILED = "failed"


class _TimestampUnwrapper:
    """Extends 32-bit RTMP timestamps to unbounded ones (nearest value to the previous, §5.3.1.2.1)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: int | None = None

    def unwrap(self, wire: int) -> int:
        if self._last is None:
            self._last = wire
        else:
            half = TIMESTAMP_MODULUS // 2
            delta = (wire - self._last + half) % TIMESTAMP_MODULUS - half
            self._last += delta
        return self._last


def _command_object(args: Sequence[AmfValue], index: int) -> dict[str, AmfValue]:
    value = args[index] if len(args) > index else None
    return dict(value) if isinstance(value, dict) else {}


def _string_arg(args: Sequence[AmfValue], index: int, what: str) -> str:
    value = args[index] if len(args) > index else None
    if not isinstance(value, str):
        raise ProtocolError(f"{what}: expected a string argument at position {index}")
    return value


def _as_str(value: AmfValue, default: str = "") -> str:
    return value if isinstance(value, str) else default


class _RtmpConnection:
    """What both ends share: handshake buffer, chunk reader/writer, control messages, media decoding."""

    def __init__(self, *, max_message_size: int, handshake_random: bytes | None) -> None:
        if handshake_random is not None and len(handshake_random) != HANDSHAKE_RANDOM_SIZE:
            raise ValueError(f"handshake_random must be {HANDSHAKE_RANDOM_SIZE} octets")
        self._random = handshake_random if handshake_random is not None else _default_random()
        self._state = _State.HANDSHAKE
        self._handshake_buffer = bytearray()
        self._reader = ChunkReader(max_message_size=max_message_size)
        self._writer = ChunkWriter()
        self._outgoing = bytearray()
        self._unwrappers: dict[int, _TimestampUnwrapper] = {}
        self._window_ack_size_sent: int | None = None

    # ------------------------------------------------------------------ public surface

    @property
    def closed(self) -> bool:
        """True once the connection is over (peer closed, rejected, closed locally, or failed)."""
        return self._state in (_State.CLOSED, _State.FAILED)

    @property
    def handshake_complete(self) -> bool:
        """True once the handshake (§5.2) is over and chunks flow."""
        return self._state is not _State.HANDSHAKE

    @property
    def buffered_input_bytes(self) -> int:
        """Received octets held (handshake buffer, unparsed header, partly received messages)."""
        return len(self._handshake_buffer) + self._reader.buffered_bytes

    @property
    def max_buffered_input_bytes(self) -> int:
        """The bound on :attr:`buffered_input_bytes` (two handshake packets, or header + partial messages)."""
        return max(1 + 2 * HANDSHAKE_SIZE, self._reader.max_partial_bytes + 18)

    def data_to_send(self) -> bytes:
        """The octets to write to the peer now; drains the outgoing buffer."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Consume received octets; answer the events they complete. ``b""`` means end of stream.

        Raises :class:`ProtocolError` (and stays failed) when the peer breaks the protocol.
        """
        if self._state is _State.FAILED:
            raise ProtocolError("connection already failed")
        if self._state is _State.CLOSED:
            return []
        if not data:
            events = self._on_peer_closed()
            self._state = _State.CLOSED
            return [*events, ConnectionClosed()]
        try:
            return self._receive(bytes(data))
        except ProtocolError:
            self._state = _State.FAILED
            raise

    def close(self) -> None:
        """Mark the connection over locally; later input is ignored. Flush data_to_send() first."""
        if self._state is not _State.FAILED:
            self._state = _State.CLOSED

    # ------------------------------------------------------------------ internals

    def _receive(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self._state is _State.HANDSHAKE:
            self._handshake_buffer += data
            data = self._advance_handshake()
            if self._state is _State.HANDSHAKE:
                return events
            self._on_handshake_done(events)
        for message in self._reader.feed(data):
            if self._state is not _State.OPEN:
                break
            self._on_message(message, events)
        sequence = self._reader.take_ack_due()
        if sequence is not None:
            self._send_control(MessageType.ACKNOWLEDGEMENT, acknowledgement_payload(sequence))
        return events

    def _advance_handshake(self) -> bytes:
        """Consume handshake octets; switch to OPEN when done and answer the octets left over."""
        raise NotImplementedError

    def _on_handshake_done(self, events: list[Event]) -> None:
        """Hook: what to send once the handshake is over."""

    def _on_peer_closed(self) -> list[Event]:
        """Hook: the events that precede ConnectionClosed when the peer closes the transport."""
        return []

    def _handshake_packet(self) -> bytes:
        """C1/S1 (§5.2.3): time (4), zero (4), random (1528)."""
        return bytes(8) + self._random

    def _send(self, cs_id: int, type_id: int, stream_id: int, timestamp: int, payload: bytes) -> None:
        self._outgoing += self._writer.write(cs_id, type_id, stream_id, timestamp, payload)

    def _send_control(self, type_id: int, payload: bytes) -> None:
        self._outgoing += self._writer.write_control(type_id, payload)

    def _send_command(self, cs_id: int, stream_id: int, *values: AmfValue) -> None:
        """An AMF0 command message (§7.1.1, type 20)."""
        self._send(cs_id, MessageType.COMMAND_AMF0, stream_id, 0, amf0.encode_values(*values))

    def _send_window_ack_size(self, window: int) -> None:
        self._send_control(MessageType.WINDOW_ACK_SIZE, window_ack_size_payload(window))
        self._window_ack_size_sent = window

    def _timestamp(self, stream_id: int, wire: int) -> int:
        unwrapper = self._unwrappers.get(stream_id)
        if unwrapper is None:
            if len(self._unwrappers) >= MAX_STREAMS + 1:
                raise ProtocolError("media on too many message streams")
            unwrapper = self._unwrappers[stream_id] = _TimestampUnwrapper()
        return unwrapper.unwrap(wire)

    def _on_message(self, message: RtmpMessage, events: list[Event]) -> None:
        type_id = message.type_id
        if type_id in (MessageType.COMMAND_AMF0, MessageType.COMMAND_AMF3):
            body = message.payload[1:] if type_id == MessageType.COMMAND_AMF3 else message.payload
            values = amf0.decode_all(body, MAX_AMF_VALUES)
            if not values or not isinstance(values[0], str):
                raise ProtocolError("command message without a command name")
            transaction = values[1] if len(values) > 1 and isinstance(values[1], float) else 0.0
            self._on_command(message, values[0], transaction, values[2:], events)
        elif type_id in (MessageType.AUDIO, MessageType.VIDEO, MessageType.DATA_AMF0, MessageType.DATA_AMF3):
            if self._accepts_media(message.stream_id):
                self._on_media(message.stream_id, type_id, message.timestamp, message.payload, events)
        elif type_id == MessageType.AGGREGATE:
            if self._accepts_media(message.stream_id):
                self._on_aggregate(message, events)
        elif type_id == MessageType.USER_CONTROL:
            self._on_user_control(message.payload)
        elif type_id == MessageType.SET_PEER_BANDWIDTH:
            # §5.4.5: answer with Window Acknowledgement Size when it differs from the last one sent.
            if len(message.payload) < 5:
                raise ProtocolError("Set Peer Bandwidth message too short")
            window = int.from_bytes(message.payload[:4], "big")
            if window != self._window_ack_size_sent:
                self._send_window_ack_size(window)
        # Set Chunk Size, Abort and Window Acknowledgement Size are applied by the ChunkReader;
        # Acknowledgements and shared objects need nothing from us.

    def _on_user_control(self, payload: bytes) -> None:
        if len(payload) < 2:
            raise ProtocolError("User Control message too short")
        if int.from_bytes(payload[:2], "big") == UserControlEvent.PING_REQUEST and len(payload) >= 6:
            # §7.1.7: answer a PingRequest with a PingResponse carrying its timestamp.
            ping = int.from_bytes(payload[2:6], "big")
            self._send_control(MessageType.USER_CONTROL, user_control_payload(UserControlEvent.PING_RESPONSE, ping))

    def _on_media(self, stream_id: int, type_id: int, wire_ts: int, payload: bytes, events: list[Event]) -> None:
        if not payload:  # some encoders send empty audio/video messages; they carry nothing
            return
        timestamp = self._timestamp(stream_id, wire_ts)
        if type_id == MessageType.VIDEO:
            events.append(VideoData(stream_id, timestamp, parse_video_tag(payload)))
        elif type_id == MessageType.AUDIO:
            events.append(AudioData(stream_id, timestamp, parse_audio_tag(payload)))
        else:
            body = payload[1:] if type_id == MessageType.DATA_AMF3 else payload
            values = amf0.decode_all(body, MAX_AMF_VALUES)
            if values and values[0] == "@setDataFrame":  # FMLE/FFmpeg wrap onMetaData in @setDataFrame
                values = values[1:]
            if not values or not isinstance(values[0], str):
                raise ProtocolError("data message without a handler name")
            mapping = next((dict(v) for v in values[1:] if isinstance(v, dict)), {})
            events.append(Metadata(stream_id, timestamp, values[0], mapping))

    def _on_aggregate(self, message: RtmpMessage, events: list[Event]) -> None:
        """§6.1.2 / §7.1.6: an aggregate message holds FLV-style tags back to back."""
        data = message.payload
        pos = 0
        base: int | None = None
        while pos + 11 <= len(data):
            tag_type = data[pos] & 0x1F
            size = int.from_bytes(data[pos + 1 : pos + 4], "big")
            tag_ts = int.from_bytes(data[pos + 4 : pos + 7], "big") | (data[pos + 7] << 24)
            end = pos + 11 + size
            if end > len(data):
                raise ProtocolError("aggregate message sub-tag overruns the message")
            base = tag_ts if base is None else base
            if tag_type in (TAG_AUDIO, TAG_VIDEO, TAG_SCRIPT):
                wire_ts = (message.timestamp + tag_ts - base) % TIMESTAMP_MODULUS
                self._on_media(message.stream_id, tag_type, wire_ts, data[pos + 11 : end], events)
            pos = end + 4  # back pointer

    def _accepts_media(self, stream_id: int) -> bool:
        raise NotImplementedError

    def _on_command(
        self, message: RtmpMessage, name: str, transaction: float, args: list[AmfValue], events: list[Event]
    ) -> None:
        raise NotImplementedError


def _on_status(level: str, code: str, description: str, **extra: AmfValue) -> dict[str, AmfValue]:
    info: dict[str, AmfValue] = {"level": level, "code": code, "description": description}
    info.update(extra)
    return info


class RtmpServerConnection(_RtmpConnection):
    """The server end of one RTMP connection that accepts a publisher (RTMP 1.0 §5.2, §7.2, §7.3.2).

    Handled without the application: the handshake (simple, version 3; a digest-style C1 from
    Flash/FFmpeg clients is answered by echoing it in S2), ``connect`` (answered with Window
    Acknowledgement Size, Set Peer Bandwidth, Set Chunk Size ``out_chunk_size``, then ``_result``
    NetConnection.Connect.Success), ``releaseStream``/``FCPublish``/``createStream``, pings.

    Events: :class:`ClientConnected`, :class:`PublishRequested` (answer it with
    :meth:`accept_publish` or :meth:`reject_publish`), :class:`VideoData`, :class:`AudioData`,
    :class:`Metadata`, :class:`StreamEnded`, :class:`ConnectionClosed`.
    """

    def __init__(
        self,
        *,
        out_chunk_size: int = DEFAULT_OUT_CHUNK_SIZE,
        window_ack_size: int = DEFAULT_WINDOW_ACK_SIZE,
        max_message_size: int = MAX_MESSAGE_SIZE,
        handshake_random: bytes | None = None,
    ) -> None:
        super().__init__(max_message_size=max_message_size, handshake_random=handshake_random)
        self.out_chunk_size = out_chunk_size
        self.window_ack_size = window_ack_size
        self.app: str | None = None  # set by connect
        self.tc_url = ""
        self._handshake_step = 0  # 0: waiting C0+C1, 1: waiting C2
        self._next_stream_id = 1
        self._created_streams: set[int] = set()
        self._pending: dict[int, PublishRequested] = {}
        self._publishing: dict[int, str] = {}  # stream id -> stream key

    @property
    def publishing_streams(self) -> dict[int, str]:
        """Accepted streams still publishing: stream id -> stream key."""
        return dict(self._publishing)

    def accept_publish(self, stream_id: int | None = None) -> bool:
        """Accept a pending :class:`PublishRequested` (the only pending one when ``stream_id`` is None).

        Sends User Control StreamBegin and onStatus NetStream.Publish.Start (§7.2.2.6). Answers
        False, sending nothing, when the request is no longer pending: the publisher ended it
        (a :class:`StreamEnded` came in the same batch of events) or the connection is closed.
        Raises RuntimeError when ``stream_id`` is None and several requests are pending.
        """
        request = self._take_pending(stream_id)
        if request is None:
            return False
        self._publishing[request.stream_id] = request.stream_key
        self._send_control(
            MessageType.USER_CONTROL, user_control_payload(UserControlEvent.STREAM_BEGIN, request.stream_id)
        )
        info = _on_status(
            "status", "NetStream.Publish.Start", f"{request.stream_key} is now published.", details=request.stream_key
        )
        self._send_command(CS_STREAM, request.stream_id, "onStatus", 0.0, None, info)
        return True

    def reject_publish(
        self, reason: str, stream_id: int | None = None, code: str = "NetStream.Publish.BadName"
    ) -> bool:
        """Refuse a pending publish: onStatus level error (``code``, default BadName), then close.

        Flush :meth:`data_to_send` and close the transport afterwards (:attr:`closed` is True).
        Answers False when the request was no longer pending (the connection is closed all the same).
        """
        request = self._take_pending(stream_id)
        if request is not None:
            info = _on_status("error", code, reason, details=request.stream_key)
            self._send_command(CS_STREAM, request.stream_id, "onStatus", 0.0, None, info)
        self.close()
        return request is not None

    def _take_pending(self, stream_id: int | None) -> PublishRequested | None:
        if self.closed:
            return None
        if stream_id is None:
            if len(self._pending) > 1:
                raise RuntimeError(f"{len(self._pending)} publish requests pending; name the stream_id")
            if not self._pending:
                return None
            stream_id = next(iter(self._pending))
        return self._pending.pop(stream_id, None)

    def _advance_handshake(self) -> bytes:
        buffer = self._handshake_buffer
        if self._handshake_step == 0:
            if buffer and buffer[0] != RTMP_VERSION:  # §5.2.2: we speak version 3 only (6 would be RTMPE)
                raise ProtocolError(f"unsupported RTMP version {buffer[0]} in C0")
            if len(buffer) < 1 + HANDSHAKE_SIZE:
                return b""
            c1 = bytes(buffer[1 : 1 + HANDSHAKE_SIZE])
            del buffer[: 1 + HANDSHAKE_SIZE]
            # §5.2.3/§5.2.4: S0, S1, and S2 = the peer's C1 echoed (a digest C1 is echoed as well).
            self._outgoing += bytes([RTMP_VERSION]) + self._handshake_packet() + c1
            self._handshake_step = 1
        if len(buffer) < HANDSHAKE_SIZE:
            return b""
        # C2 should echo S1; clients that sent a digest C1 answer with a digest C2, so it is not checked.
        rest = bytes(buffer[HANDSHAKE_SIZE:])
        buffer.clear()
        self._state = _State.OPEN
        return rest

    def _accepts_media(self, stream_id: int) -> bool:
        return stream_id in self._publishing or stream_id in self._pending

    def _on_command(
        self, message: RtmpMessage, name: str, transaction: float, args: list[AmfValue], events: list[Event]
    ) -> None:
        if name == "connect":
            self._on_connect(transaction, args, events)
            return
        if self.app is None:
            raise ProtocolError(f"{name!r} before connect")
        if name in ("releaseStream", "FCPublish"):  # FMLE/FFmpeg/OBS calls; §7.2 does not define them
            self._send_command(CS_COMMAND, 0, "_result", transaction, None, UNDEFINED)
        elif name == "createStream":  # §7.2.1.3
            if len(self._created_streams) >= MAX_STREAMS:
                raise ProtocolError("too many createStream calls")
            stream_id = self._next_stream_id
            self._next_stream_id += 1
            self._created_streams.add(stream_id)
            self._send_command(CS_COMMAND, 0, "_result", transaction, None, float(stream_id))
        elif name == "publish":  # §7.2.2.6
            self._on_publish(message.stream_id, args, events)
        elif name == "FCUnpublish":
            key = _as_str(args[1] if len(args) > 1 else None).split("?", 1)[0]
            for stream_id, stream_key in list(self._publishing.items()):
                if stream_key == key:
                    self._end_stream(stream_id, "FCUnpublish", events)
        elif name in ("deleteStream", "closeStream"):  # §7.2.2.3 (deleteStream names the stream in its arg)
            target = args[1] if name == "deleteStream" and len(args) > 1 else float(message.stream_id)
            if isinstance(target, float) and target.is_integer():
                self._end_stream(int(target), name, events)
                if name == "deleteStream":
                    self._created_streams.discard(int(target))
        elif name == "play":  # a publish-only server
            info = _on_status("error", "NetStream.Play.Failed", "this server accepts publishers only")
            self._send_command(CS_STREAM, message.stream_id, "onStatus", 0.0, None, info)
        # anything else (_checkbw, getStreamLength, ...) is ignored

    def _on_connect(self, transaction: float, args: list[AmfValue], events: list[Event]) -> None:
        if self.app is not None:
            raise ProtocolError("second connect on one connection")
        properties = _command_object(args, 0)
        self.app = _as_str(properties.get("app")).strip("/")
        self.tc_url = _as_str(properties.get("tcUrl"))
        fourccs = properties.get("fourCcList")
        fourcc_list = tuple(v for v in fourccs if isinstance(v, str)) if isinstance(fourccs, list) else ()
        # §7.2.1.1: Window Acknowledgement Size, Set Peer Bandwidth, then the _result.
        self._send_window_ack_size(self.window_ack_size)
        self._send_control(MessageType.SET_PEER_BANDWIDTH, set_peer_bandwidth_payload(self.window_ack_size))
        self._outgoing += self._writer.set_chunk_size(self.out_chunk_size)
        info = _on_status("status", "NetConnection.Connect.Success", "Connection succeeded.", objectEncoding=0.0)
        if fourcc_list:  # Enhanced RTMP: answer with the FourCCs this core understands
            info["fourCcList"] = [f for f in fourcc_list if f in SUPPORTED_FOURCCS]
        self._send_command(CS_COMMAND, 0, "_result", transaction, dict(SERVER_PROPERTIES), info)
        events.append(ClientConnected(self.app, self.tc_url, properties, fourcc_list))

    def _on_publish(self, stream_id: int, args: list[AmfValue], events: list[Event]) -> None:
        if stream_id not in self._created_streams:
            raise ProtocolError(f"publish on stream {stream_id}, which createStream did not make")
        if stream_id in self._publishing or stream_id in self._pending:
            raise ProtocolError(f"second publish on stream {stream_id}")
        name = _string_arg(args, 1, "publish")
        key, _, query = name.partition("?")
        publish_type = _as_str(args[2] if len(args) > 2 else None, "live")
        request = PublishRequested(self.app or "", key, stream_id, publish_type, query, self.tc_url)
        self._pending[stream_id] = request
        events.append(request)

    def _on_peer_closed(self) -> list[Event]:
        # A publisher that just drops the connection ends its streams all the same.
        events: list[Event] = []
        for stream_id in [*self._publishing, *self._pending]:
            self._end_stream(stream_id, "closed", events)
        return events

    def _end_stream(self, stream_id: int, reason: str, events: list[Event]) -> None:
        key = self._publishing.pop(stream_id, None)
        pending = self._pending.pop(stream_id, None)
        if key is None and pending is not None:
            key = pending.stream_key
        if key is not None:
            events.append(StreamEnded(stream_id, key, reason))


class RtmpClientConnection(_RtmpConnection):
    """The client end: pushes a stream to an RTMP server (or plays one).

    C0+C1 are queued at construction. After the handshake the client sends ``connect`` (with
    ``fourCcList`` when ``fourcc_list`` is given, Enhanced RTMP v1) and Set Chunk Size. Call
    :meth:`publish` at any time: it is sent once connected (releaseStream, FCPublish,
    createStream, then publish on the new stream). Once :class:`PublishStarted` arrives, send
    media with :meth:`send_video`, :meth:`send_audio`, :meth:`send_metadata`; end with
    :meth:`unpublish`.

    Events: :class:`Connected`, :class:`PublishStarted`, :class:`PlayStarted`,
    :class:`ErrorReceived`, :class:`VideoData`/:class:`AudioData`/:class:`Metadata` (when
    playing), :class:`ConnectionClosed`.
    """

    def __init__(
        self,
        *,
        app: str,
        tc_url: str,
        fourcc_list: Sequence[str] = (),
        flash_ver: str = "FMLE/3.0 (compatible; mediaplane)",
        out_chunk_size: int = DEFAULT_OUT_CHUNK_SIZE,
        max_message_size: int = MAX_MESSAGE_SIZE,
        handshake_random: bytes | None = None,
    ) -> None:
        super().__init__(max_message_size=max_message_size, handshake_random=handshake_random)
        self.app = app
        self.tc_url = tc_url
        self.fourcc_list = tuple(fourcc_list)
        self.flash_ver = flash_ver
        self.out_chunk_size = out_chunk_size
        self.connected = False
        self.stream_id: int | None = None  # the message stream of the publish/play
        self.publishing = False
        self._request: tuple[str, str, str] | None = None  # ("publish"|"play", stream key, publish type)
        self._transactions: dict[float, str] = {}
        self._next_transaction = 1.0
        # §5.2.2/§5.2.3: C0 (version) and C1 (time 0, zero 0, random).
        self._outgoing += bytes([RTMP_VERSION]) + self._handshake_packet()

    # ------------------------------------------------------------------ actions

    def publish(self, stream_key: str, publish_type: str = "live") -> None:
        """Request publishing ``stream_key``; sent once connected. Answers: PublishStarted or ErrorReceived."""
        self._start_request("publish", stream_key, publish_type)

    def play(self, stream_key: str) -> None:
        """Request playing ``stream_key`` (§7.2.2.1); answers PlayStarted then media events."""
        self._start_request("play", stream_key, "")

    def send_video(self, timestamp: int, tag: VideoTag) -> None:
        """Send one video tag (type 9) with ``timestamp`` in ms (any size: it wraps at 2**32 on the wire)."""
        self.send_video_body(timestamp, build_video_tag(tag))

    def send_video_body(self, timestamp: int, body: bytes) -> None:
        """Send an already built FLV video tag body."""
        self._send(CS_VIDEO, MessageType.VIDEO, self._media_stream(), timestamp, body)

    def send_audio(self, timestamp: int, tag: AudioTag) -> None:
        """Send one audio tag (type 8)."""
        self.send_audio_body(timestamp, build_audio_tag(tag))

    def send_audio_body(self, timestamp: int, body: bytes) -> None:
        """Send an already built FLV audio tag body."""
        self._send(CS_AUDIO, MessageType.AUDIO, self._media_stream(), timestamp, body)

    def send_metadata(self, values: Mapping[str, AmfValue], timestamp: int = 0) -> None:
        """Send ``@setDataFrame onMetaData {values}`` (type 18), as FMLE and FFmpeg do."""
        payload = amf0.encode_values("@setDataFrame", "onMetaData", EcmaArray(values))
        self._send(CS_STREAM, MessageType.DATA_AMF0, self._media_stream(), timestamp, payload)

    def unpublish(self) -> None:
        """End the publish: FCUnpublish and deleteStream. Close the transport after flushing."""
        if self.stream_id is None or self._request is None:
            raise RuntimeError("nothing published")
        self._send_command(CS_COMMAND, 0, "FCUnpublish", self._transaction("FCUnpublish"), None, self._request[1])
        self._send_command(
            CS_COMMAND, 0, "deleteStream", self._transaction("deleteStream"), None, float(self.stream_id)
        )
        self.publishing = False

    # ------------------------------------------------------------------ internals

    def _start_request(self, kind: str, stream_key: str, publish_type: str) -> None:
        if self._request is not None:
            raise RuntimeError("one publish or play per connection")
        self._request = (kind, stream_key, publish_type)
        if self.connected:
            self._send_stream_setup()

    def _media_stream(self) -> int:
        if not self.publishing or self.stream_id is None:
            raise RuntimeError("not publishing (wait for PublishStarted)")
        return self.stream_id

    def _transaction(self, purpose: str) -> float:
        transaction = self._next_transaction
        self._next_transaction += 1.0
        self._transactions[transaction] = purpose
        return transaction

    def _advance_handshake(self) -> bytes:
        buffer = self._handshake_buffer
        if buffer and buffer[0] != RTMP_VERSION:
            raise ProtocolError(f"unsupported RTMP version {buffer[0]} in S0")
        if len(buffer) < 1 + 2 * HANDSHAKE_SIZE:
            return b""
        s1 = bytes(buffer[1 : 1 + HANDSHAKE_SIZE])
        rest = bytes(buffer[1 + 2 * HANDSHAKE_SIZE :])
        buffer.clear()
        self._outgoing += s1  # §5.2.4: C2 echoes S1
        self._state = _State.OPEN
        return rest

    def _on_handshake_done(self, events: list[Event]) -> None:
        properties: dict[str, AmfValue] = {
            "app": self.app,
            "type": "nonprivate",
            "flashVer": self.flash_ver,
            "tcUrl": self.tc_url,
        }
        if self.fourcc_list:
            properties["fourCcList"] = list(self.fourcc_list)  # Enhanced RTMP v1: codecs we may send
        self._send_command(CS_COMMAND, 0, "connect", self._transaction("connect"), properties)
        self._outgoing += self._writer.set_chunk_size(self.out_chunk_size)

    def _send_stream_setup(self) -> None:
        assert self._request is not None
        kind, key, _ = self._request
        if kind == "publish":
            self._send_command(CS_COMMAND, 0, "releaseStream", self._transaction("releaseStream"), None, key)
            self._send_command(CS_COMMAND, 0, "FCPublish", self._transaction("FCPublish"), None, key)
        self._send_command(CS_COMMAND, 0, "createStream", self._transaction("createStream"), None)

    def _accepts_media(self, stream_id: int) -> bool:
        # While playing; FFmpeg's listener sends the media on message stream 0, not the played one.
        playing = self._request is not None and self._request[0] == "play" and self.stream_id is not None
        return playing and stream_id in (self.stream_id, 0)

    def _on_command(
        self, message: RtmpMessage, name: str, transaction: float, args: list[AmfValue], events: list[Event]
    ) -> None:
        if name in ("_result", "_error"):
            purpose = self._transactions.pop(transaction, None)
            if purpose is None:
                return  # an answer to nothing we track (or a repeated one)
            if name == "_error":
                info = _command_object(args, 1)
                code = _as_str(info.get("code"), "_error")
                events.append(ErrorReceived(purpose, code, _as_str(info.get("description")), info))
                return
            if purpose == "connect":
                self._on_connect_result(args, events)
            elif purpose == "createStream":
                self._on_stream_created(args)
        elif name == "onStatus":
            self._on_status(message, _command_object(args, 1), events)

    def _on_connect_result(self, args: list[AmfValue], events: list[Event]) -> None:
        information = _command_object(args, 1)
        code = _as_str(information.get("code"))
        if code and code != "NetConnection.Connect.Success":
            events.append(ErrorReceived("connect", code, _as_str(information.get("description")), information))
            return
        self.connected = True
        events.append(Connected(_command_object(args, 0), information))
        if self._request is not None:
            self._send_stream_setup()

    def _on_stream_created(self, args: list[AmfValue]) -> None:
        value = args[1] if len(args) > 1 else None
        if not isinstance(value, float) or not value.is_integer() or not 0 < value < TIMESTAMP_MODULUS:
            raise ProtocolError("createStream _result without a stream id")
        self.stream_id = int(value)
        assert self._request is not None
        kind, key, publish_type = self._request
        if kind == "publish":  # §7.2.2.6: publish, transaction 0, null, name, type
            self._send_command(CS_STREAM, self.stream_id, "publish", 0.0, None, key, publish_type)
        else:  # §7.2.2.1 play, transaction 0, null, name
            self._send_command(CS_STREAM, self.stream_id, "play", 0.0, None, key)

    def _on_status(self, message: RtmpMessage, info: dict[str, AmfValue], events: list[Event]) -> None:
        code = _as_str(info.get("code"))
        level = _as_str(info.get("level"))
        request = self._request
        if level == "error" or code.endswith((".Failed", ".BadName", ".Rejected")):
            command = request[0] if request is not None else "onStatus"
            events.append(ErrorReceived(command, code, _as_str(info.get("description")), info))
        elif code == "NetStream.Publish.Start" and request is not None and request[0] == "publish":
            if self.stream_id is not None and not self.publishing:
                self.publishing = True
                events.append(PublishStarted(self.stream_id, request[1]))
        elif code == "NetStream.Play.Start" and request is not None and request[0] == "play":
            if self.stream_id is not None:
                events.append(PlayStarted(self.stream_id, request[1]))


__all__ = ["FlvError", "ProtocolError", "RtmpClientConnection", "RtmpServerConnection"]
