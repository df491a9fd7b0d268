"""Events the RTMP connections answer from :meth:`receive_data` (h11 style: plain frozen dataclasses).

Timestamps are milliseconds on the RTMP timeline of the message stream, extended from the 32-bit
wire value (RTMP 1.0 §5.3.1.2.1 lets it wrap after ~49.7 days) to an unbounded ``int``: each
value is placed within ±2**31 ms of the previous one on the same message stream, so a wrap
shows as a continued increase, never a jump back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .amf0 import AmfValue
from .flv import AudioTag, VideoTag


class Event:
    """Base class of every event."""

    __slots__ = ()


# ---------------------------------------------------------------------------- server side


@dataclass(frozen=True, slots=True)
class ClientConnected(Event):
    """The peer's ``connect`` (§7.2.1.1) was answered with NetConnection.Connect.Success."""

    app: str
    tc_url: str
    properties: dict[str, AmfValue] = field(default_factory=dict)  # the connect command object
    fourcc_list: tuple[str, ...] = ()  # Enhanced RTMP codecs the client announced


@dataclass(frozen=True, slots=True)
class PublishRequested(Event):
    """The peer sent ``publish`` (§7.2.2.6); answer with ``accept_publish`` or ``reject_publish``.

    ``stream_key`` is the publishing name up to any ``?``; ``query`` is what followed it.
    Media on this stream is already reported while the decision is pending.
    """

    app: str
    stream_key: str
    stream_id: int
    publish_type: str = "live"
    query: str = ""
    tc_url: str = ""


@dataclass(frozen=True, slots=True)
class StreamEnded(Event):
    """A publisher ended a stream: ``reason`` is "FCUnpublish", "closeStream", "deleteStream", or
    "closed" when the transport closed with the stream still publishing (ConnectionClosed follows)."""

    stream_id: int
    stream_key: str
    reason: str


# ---------------------------------------------------------------------------- both sides


@dataclass(frozen=True, slots=True)
class VideoData(Event):
    """A video message (type 9) and its parsed FLV tag body."""

    stream_id: int
    timestamp: int
    tag: VideoTag


@dataclass(frozen=True, slots=True)
class AudioData(Event):
    """An audio message (type 8) and its parsed FLV tag body."""

    stream_id: int
    timestamp: int
    tag: AudioTag


@dataclass(frozen=True, slots=True)
class Metadata(Event):
    """A data message (type 18/15), e.g. ``@setDataFrame onMetaData {...}`` with ``name='onMetaData'``."""

    stream_id: int
    timestamp: int
    name: str
    values: dict[str, AmfValue]


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """The peer closed the transport (``receive_data(b"")``). Nothing follows."""


# ---------------------------------------------------------------------------- client side


@dataclass(frozen=True, slots=True)
class Connected(Event):
    """The server answered ``connect`` with ``_result`` / NetConnection.Connect.Success."""

    properties: dict[str, AmfValue]  # fmsVer, capabilities ...
    information: dict[str, AmfValue]  # level, code, description, objectEncoding ...


@dataclass(frozen=True, slots=True)
class PublishStarted(Event):
    """onStatus NetStream.Publish.Start: send media with ``send_video``/``send_audio`` now."""

    stream_id: int
    stream_key: str


@dataclass(frozen=True, slots=True)
class PlayStarted(Event):
    """onStatus NetStream.Play.Start for a ``play`` request; media events follow."""

    stream_id: int
    stream_key: str


@dataclass(frozen=True, slots=True)
class ErrorReceived(Event):
    """The server answered with ``_error`` or an onStatus of level ``error``.

    ``command`` is the request it answers (``connect``, ``createStream``, ``publish`` ...).
    """

    command: str
    code: str
    description: str
    information: dict[str, AmfValue] = field(default_factory=dict)
