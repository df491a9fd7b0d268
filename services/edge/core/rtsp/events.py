"""Events :meth:`RtspClient.receive_data` returns (h11 style: plain frozen dataclasses), and :class:`Track`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sdp import SessionDescription


@dataclass(frozen=True, slots=True)
class Track:
    """One media section of the DESCRIBE answer that can be SETUP (RFC 2326 §10.4)."""

    index: int  # position of its m= section in the session description
    media: str  # "video", "audio", "application", ...
    payload_type: int  # the first payload type of the m= line with a known mapping
    encoding: str  # upper-case rtpmap name: "H264", "H265", "MPEG4-GENERIC", "MP4A-LATM"; "" unknown
    clock_rate: int  # RTP clock rate in Hz; 0 when unknown
    channels: int | None  # audio channels from a=rtpmap, when given
    fmtp: dict[str, str] = field(default_factory=dict)  # a=fmtp parameters, keys lower-case
    control_url: str = ""  # absolute URL to SETUP (a=control resolved, RFC 2326 §C.1.1)


class RtspEvent:
    """Base class of every event."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Described(RtspEvent):
    """DESCRIBE answered with an SDP (RFC 2326 §10.2): choose tracks and call ``setup``."""

    description: SessionDescription
    tracks: list[Track]
    base_url: str  # Content-Base, else Content-Location, else the request URL


@dataclass(frozen=True, slots=True)
class TrackReady(RtspEvent):
    """A SETUP reply (RFC 2326 §10.4) with the transport the server chose (§12.39)."""

    track: Track
    interleaved: tuple[int, int] | None  # TCP: RTP and RTCP channels (the requested ones if omitted)
    server_ports: tuple[int, int] | None  # UDP: the server's RTP and RTCP ports
    source: str | None  # UDP: the address media comes from, when the server said
    ssrc: int | None  # the SSRC the server announced (hex in the Transport header)


@dataclass(frozen=True, slots=True)
class Playing(RtspEvent):
    """PLAY answered (RFC 2326 §10.5): media flows."""

    rtp_info: dict[str, tuple[int | None, int | None]]  # track control URL -> (seq, rtptime), §12.33
    session_timeout: float  # seconds (Session ``timeout=``, §12.37; 60 by default)


@dataclass(frozen=True, slots=True)
class InterleavedData(RtspEvent):
    """A ``$`` frame on the RTSP connection (RFC 2326 §10.12): RTP or RTCP of a TCP track."""

    channel: int
    data: bytes


@dataclass(frozen=True, slots=True)
class KeepaliveAnswered(RtspEvent):
    """The server answered a keepalive (any status: some cameras answer GET_PARAMETER 501)."""


@dataclass(frozen=True, slots=True)
class Failed(RtspEvent):
    """The session cannot go on (terminal): close the connection and maybe retry later.

    ``reason`` is a short text for a field engineer; it never holds credentials. ``auth`` is
    True when the credentials are missing or wrong (401, 403).
    """

    reason: str
    status: int | None = None  # the RTSP status code that failed it, if any
    auth: bool = False


__all__ = [
    "Described",
    "Failed",
    "InterleavedData",
    "KeepaliveAnswered",
    "Playing",
    "RtspEvent",
    "Track",
    "TrackReady",
]
