"""Sans-IO RTMP core (Adobe RTMP 1.0, AMF0, FLV tag bodies, Enhanced RTMP v1): see docs/rtmp-protocol.md.

Feed received bytes to :class:`RtmpServerConnection` / :class:`RtmpClientConnection` with
``receive_data`` and write ``data_to_send()``; the trio drivers live outside ``core``.
"""

from __future__ import annotations

from .amf0 import UNDEFINED, AmfDate, AmfValue, EcmaArray
from .chunk import MAX_MESSAGE_SIZE, ChunkReader, ChunkWriter, MessageType, RtmpMessage
from .connection import RtmpClientConnection, RtmpServerConnection
from .errors import AmfError, FlvError, ProtocolError
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
from .flv import AudioCodec, AudioTag, FrameType, PacketKind, VideoCodec, VideoTag

__all__ = [
    "MAX_MESSAGE_SIZE",
    "UNDEFINED",
    "AmfDate",
    "AmfError",
    "AmfValue",
    "AudioCodec",
    "AudioData",
    "AudioTag",
    "ChunkReader",
    "ChunkWriter",
    "ClientConnected",
    "Connected",
    "ConnectionClosed",
    "EcmaArray",
    "ErrorReceived",
    "Event",
    "FlvError",
    "FrameType",
    "MessageType",
    "Metadata",
    "PacketKind",
    "PlayStarted",
    "ProtocolError",
    "PublishRequested",
    "PublishStarted",
    "RtmpClientConnection",
    "RtmpMessage",
    "RtmpServerConnection",
    "StreamEnded",
    "VideoCodec",
    "VideoData",
    "VideoTag",
]
