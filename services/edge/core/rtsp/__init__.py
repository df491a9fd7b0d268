"""Sans-IO RTSP 1.0 client (RFC 2326): framing, SDP (RFC 8866), Basic/Digest auth, the client dialogue.

Feed bytes from the camera to :class:`RtspClient` with ``receive_data`` and write
``data_to_send()``; the trio driver lives in ``services/edge/engine/kinds/rtsp.py``.
"""

from __future__ import annotations

from .auth import Authenticator, Challenge, choose_challenge, digest_response, parse_challenges
from .client import DEFAULT_SESSION_TIMEOUT, ClientState, RtspClient, status_text
from .events import (
    Described,
    Failed,
    InterleavedData,
    KeepaliveAnswered,
    Playing,
    RtspEvent,
    Track,
    TrackReady,
)
from .message import (
    InterleavedFrame,
    RtspProtocolError,
    RtspReader,
    RtspRequest,
    RtspResponse,
    build_request,
    build_response,
)
from .sdp import MediaDescription, RtpMap, SdpError, SessionDescription, parse_sdp, resolve_control

__all__ = [
    "DEFAULT_SESSION_TIMEOUT",
    "Authenticator",
    "Challenge",
    "ClientState",
    "Described",
    "Failed",
    "InterleavedData",
    "InterleavedFrame",
    "KeepaliveAnswered",
    "MediaDescription",
    "Playing",
    "RtpMap",
    "RtspClient",
    "RtspEvent",
    "RtspProtocolError",
    "RtspReader",
    "RtspRequest",
    "RtspResponse",
    "SdpError",
    "SessionDescription",
    "Track",
    "TrackReady",
    "build_request",
    "build_response",
    "choose_challenge",
    "digest_response",
    "parse_challenges",
    "parse_sdp",
    "resolve_control",
    "status_text",
]
