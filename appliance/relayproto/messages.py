"""The relay ↔ edge control messages (interop.md 8.2, 8.3 direct mode, 13) and their codec.

Every message is a flat JSON object selected by ``type`` (interop.md 13), carried in one
length-prefixed frame (``framing.py``). Each ``type`` is one frozen pydantic model here, and
:data:`MESSAGE_MODELS` maps the type to its model:

===================  =========================  ==========================================
type                 direction                  fields
===================  =========================  ==========================================
``hello``            edge → relay, always first  ``protocol_version`` (2), ``software_version``
``hello_ack``        relay → edge               ``protocol_version``, ``software_version``
``identify``         edge → relay, before binds  ``edge_id`` (the manager's node_id)
``tunnel_bind``      edge → relay               ``tunnel_id, direction, protocol, bind_token?``
``tunnel_waiting``   relay → edge               ``tunnel_id``
``tunnel_ready``     relay → edge (both legs)    ``tunnel_id``
``tunnel_unbind``    edge → relay               ``tunnel_id``
``tunnel_down``      relay → edge               ``tunnel_id, reason``
``ping`` / ``pong``  edge → relay / relay → edge  (none)
``peer_auth``        dialler → listener (direct)  ``tunnel_id, token``
``peer_auth_ok``     listener → dialler          ``tunnel_id``
``peer_auth_error``  listener → dialler          ``reason`` (then the listener closes)
===================  =========================  ==========================================

A TCP data stream's header (interop.md 8.3, 13) is not a control message (it has no ``type``):
:class:`StreamHeader`, read with :func:`decode_stream_header`.

Reading is lenient about extra keys (ignored): interop.md 8.1 skips what it cannot use rather than
closing, and a newer peer adding a field must not cost a ``tunnel_ready``. :func:`decode` raises
:class:`ProtocolError` for bad JSON (``MALFORMED``), an unknown ``type`` (``UNKNOWN_TYPE``) and a
message that does not validate (``INVALID``); interop.md 8.1 says such a message "is logged and
skipped; the connection stays up", so the driver (or :mod:`session`) logs ``exc.message`` and goes
on. No error text holds a value from the frame (a frame may carry a bind token).
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from appliance.protocol._wire import WireSecret, describe_validation_error, load_json_object, parse_typed_json
from appliance.protocol.errors import ErrorKind, ProtocolError
from appliance.relayproto.framing import MAX_FRAME_BYTES, encode_frame

__all__ = [
    "ALPN_DIRECT",
    "ALPN_RELAY",
    "BIND_AUTH_FAILED",
    "DATAGRAM_BUFFER_BYTES",
    "EDGE_MESSAGE_TYPES",
    "IDLE_TIMEOUT_S",
    "KEEPALIVE_S",
    "MAX_BIDI_STREAMS",
    "MAX_UDP_PAYLOAD_BYTES",
    "MAX_UNI_STREAMS",
    "MESSAGE_MODELS",
    "PEER_MESSAGE_TYPES",
    "PING_INTERVAL_S",
    "PROTOCOL_MISMATCH",
    "PROTOCOL_VERSION",
    "RELAY_MESSAGE_TYPES",
    "REPLACED_BY_NEWER_BIND",
    "STREAM_COPY_BUFFER_BYTES",
    "TCP_EOF_PROPAGATION_S",
    "TUNNEL_LIMIT_EXCEEDED",
    "Direction",
    "HelloAckMessage",
    "HelloMessage",
    "IdentifyMessage",
    "Message",
    "PeerAuthErrorMessage",
    "PeerAuthMessage",
    "PeerAuthOkMessage",
    "PingMessage",
    "PongMessage",
    "StreamHeader",
    "TunnelBindMessage",
    "TunnelDownMessage",
    "TunnelProtocol",
    "TunnelReadyMessage",
    "TunnelUnbindMessage",
    "TunnelWaitingMessage",
    "decode",
    "decode_stream_header",
    "encode",
    "encode_stream_header",
]

# --------------------------------------------------------------------------- constants (interop.md 8.1)
ALPN_RELAY: Final = "mediaplane-relay"
"""interop.md 8.1: the ALPN from an edge to a relay."""
ALPN_DIRECT: Final = "mediaplane-direct"
"""interop.md 8.1: the ALPN from edge to edge (direct mode)."""
KEEPALIVE_S: Final = 5.0
"""interop.md 8.1: QUIC keep-alive, both sides."""
IDLE_TIMEOUT_S: Final = 25.0
"""interop.md 8.1: QUIC idle timeout, both sides."""
MAX_BIDI_STREAMS: Final = 1024
"""interop.md 8.1: bidirectional streams per connection."""
MAX_UNI_STREAMS: Final = 256
"""interop.md 8.1: unidirectional streams per connection."""
DATAGRAM_BUFFER_BYTES: Final = 2 * 1024 * 1024
"""interop.md 8.1: datagrams on, with 2 MiB datagram buffers."""
MAX_UDP_PAYLOAD_BYTES: Final = 1452
"""interop.md 8.1: the maximum UDP payload (aioquic's default is 1200)."""
PING_INTERVAL_S: Final = 15.0
"""interop.md 8.2: the edge sends ``ping`` every 15 s."""
STREAM_COPY_BUFFER_BYTES: Final = 64 * 1024
"""interop.md 8.3: the relay copies TCP stream bytes with 64 KiB buffers."""
TCP_EOF_PROPAGATION_S: Final = 5.0
"""interop.md 13: a FIN (or reset) on one side of a TCP tunnel reaches the other within 5 s."""
PROTOCOL_VERSION: Final = 2
"""interop.md 8.2: ``hello`` carries ``protocol_version: 2``."""

# ``tunnel_down`` reasons whose text interop.md fixes (8.1, 8.2, 8.4).
BIND_AUTH_FAILED: Final = "bind authentication failed"
TUNNEL_LIMIT_EXCEEDED: Final = "per-connection tunnel limit exceeded"
PROTOCOL_MISMATCH: Final = "protocol mismatch"
REPLACED_BY_NEWER_BIND: Final = "replaced by newer bind"

ID_MAX_CHARS: Final = 256
"""Not in interop.md: bounds a tunnel or edge id (tunnel ids are UUIDs, 36 chars)."""
TEXT_MAX_CHARS: Final = 4096
"""Not in interop.md: bounds versions, reasons and tokens read from a peer."""

Direction = Literal["ingress", "egress"]
TunnelProtocol = Literal["tcp", "udp"]
_Id = Annotated[str, Field(min_length=1, max_length=ID_MAX_CHARS)]
_Text = Annotated[str, Field(max_length=TEXT_MAX_CHARS)]
_Version = Annotated[int, Field(strict=True, ge=0)]
_Secret = Annotated[WireSecret, Field(min_length=1, max_length=TEXT_MAX_CHARS)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# --------------------------------------------------------------------------- edge ↔ relay (8.2)
class HelloMessage(_Model):
    """Edge → relay, always the first message on the control stream."""

    type: Literal["hello"] = "hello"
    protocol_version: _Version = PROTOCOL_VERSION
    software_version: _Text


class HelloAckMessage(_Model):
    """Relay → edge, the answer to ``hello``."""

    type: Literal["hello_ack"] = "hello_ack"
    protocol_version: _Version = PROTOCOL_VERSION
    software_version: _Text


class IdentifyMessage(_Model):
    """Edge → relay, optional, before any bind. Without it the relay names the edge
    ``<remote addr>#<counter>`` (interop.md 8.2 "Edge id")."""

    type: Literal["identify"] = "identify"
    edge_id: _Id


class TunnelBindMessage(_Model):
    """Edge → relay: bind this connection as one leg of a tunnel.

    ``bind_token`` (``bind.py``) is 64 hex on the wire; it is read as any bounded text, so that a
    malformed token fails the bind check (``tunnel_down`` ``bind authentication failed``) instead
    of being skipped as an invalid message with no answer. Left out of the JSON when None.
    """

    type: Literal["tunnel_bind"] = "tunnel_bind"
    tunnel_id: _Id
    direction: Direction
    protocol: TunnelProtocol
    bind_token: _Secret | None = None

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> object:
        data = handler(self)
        if isinstance(data, dict) and data.get("bind_token") is None:
            data.pop("bind_token", None)
        return data

    def token(self) -> str | None:
        """The bind token's text (None when the bind carries none)."""
        return None if self.bind_token is None else self.bind_token.get_secret_value()


class TunnelWaitingMessage(_Model):
    """Relay → edge: bound, but the peer leg is not bound yet."""

    type: Literal["tunnel_waiting"] = "tunnel_waiting"
    tunnel_id: _Id


class TunnelReadyMessage(_Model):
    """Relay → both edges, once the second leg binds."""

    type: Literal["tunnel_ready"] = "tunnel_ready"
    tunnel_id: _Id


class TunnelUnbindMessage(_Model):
    """Edge → relay: leave the tunnel."""

    type: Literal["tunnel_unbind"] = "tunnel_unbind"
    tunnel_id: _Id


class TunnelDownMessage(_Model):
    """Relay → edge: this leg is down; ``reason`` is free text (the fixed ones are the
    module's ``BIND_AUTH_FAILED`` … ``REPLACED_BY_NEWER_BIND``)."""

    type: Literal["tunnel_down"] = "tunnel_down"
    tunnel_id: _Id
    reason: _Text


class PingMessage(_Model):
    """Edge → relay every 15 s (and either direction in direct mode, after ``peer_auth_ok``)."""

    type: Literal["ping"] = "ping"


class PongMessage(_Model):
    """The answer to ``ping``."""

    type: Literal["pong"] = "pong"


# --------------------------------------------------------------------------- direct mode (8.3)
class PeerAuthMessage(_Model):
    """Dialling (egress) edge → listening (ingress) edge, first: ``token`` from
    :func:`appliance.relayproto.bind.peer_auth_token`."""

    type: Literal["peer_auth"] = "peer_auth"
    tunnel_id: _Id
    token: _Secret


class PeerAuthOkMessage(_Model):
    """Listener → dialler: the token checked out."""

    type: Literal["peer_auth_ok"] = "peer_auth_ok"
    tunnel_id: _Id


class PeerAuthErrorMessage(_Model):
    """Listener → dialler, then the listener closes the connection."""

    type: Literal["peer_auth_error"] = "peer_auth_error"
    reason: _Text


Message = (
    HelloMessage
    | HelloAckMessage
    | IdentifyMessage
    | TunnelBindMessage
    | TunnelWaitingMessage
    | TunnelReadyMessage
    | TunnelUnbindMessage
    | TunnelDownMessage
    | PingMessage
    | PongMessage
    | PeerAuthMessage
    | PeerAuthOkMessage
    | PeerAuthErrorMessage
)

MESSAGE_MODELS: Final[dict[str, type[_Model]]] = {
    "hello": HelloMessage,
    "hello_ack": HelloAckMessage,
    "identify": IdentifyMessage,
    "tunnel_bind": TunnelBindMessage,
    "tunnel_waiting": TunnelWaitingMessage,
    "tunnel_ready": TunnelReadyMessage,
    "tunnel_unbind": TunnelUnbindMessage,
    "tunnel_down": TunnelDownMessage,
    "ping": PingMessage,
    "pong": PongMessage,
    "peer_auth": PeerAuthMessage,
    "peer_auth_ok": PeerAuthOkMessage,
    "peer_auth_error": PeerAuthErrorMessage,
}
EDGE_MESSAGE_TYPES: Final = frozenset({"hello", "identify", "tunnel_bind", "tunnel_unbind", "ping"})
"""What an edge sends a relay (what the relay accepts)."""
RELAY_MESSAGE_TYPES: Final = frozenset({"hello_ack", "tunnel_waiting", "tunnel_ready", "tunnel_down", "pong"})
"""What a relay sends an edge (what the edge accepts)."""
PEER_MESSAGE_TYPES: Final = frozenset({"peer_auth", "peer_auth_ok", "peer_auth_error", "ping", "pong"})
"""What two edges send each other in direct mode."""


# --------------------------------------------------------------------------- TCP stream header (8.3, 13)
_NONCE = re.compile(r"[0-9a-fA-F]{32}")


class StreamHeader(BaseModel):
    """The first frame of a TCP data stream: ``{"tunnel_id", "stream_type": "tcp", "stream_nonce"}``.

    ``stream_nonce`` is 16 random bytes as 32 hex (used by interop.md 10), drawn by the caller.
    The relay writes the same header on the stream it opens to the peer, and none back on the
    originating stream (interop.md 13).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    tunnel_id: _Id
    stream_type: Literal["tcp"] = "tcp"
    stream_nonce: str = Field(pattern=_NONCE.pattern, min_length=32, max_length=32)

    def nonce_bytes(self) -> bytes:
        """The 16 nonce bytes."""
        return bytes.fromhex(self.stream_nonce)


# --------------------------------------------------------------------------- codec
def decode(body: bytes) -> Message:
    """Parse one frame body (the JSON, without its length prefix) into its message model.

    Raises :class:`ProtocolError`: ``MALFORMED`` (not UTF-8, not JSON, not an object, no string
    ``type``), :class:`UnknownMessageType`, or ``INVALID``. interop.md 8.1: log and skip each.
    """
    return cast("Message", parse_typed_json(body, MESSAGE_MODELS))


def encode(message: Message) -> bytes:
    """One whole frame: the u32 length, then compact JSON (secrets revealed: this is the wire).

    Raises :class:`~appliance.protocol.errors.LocalProtocolError` over 1 MiB.
    """
    return encode_frame(message.model_dump_json().encode("utf-8"), max_bytes=MAX_FRAME_BYTES)


def decode_stream_header(body: bytes) -> StreamHeader:
    """Parse a TCP data stream's header frame body. Raises :class:`ProtocolError`."""
    document = load_json_object(body)
    try:
        return StreamHeader.model_validate(document)
    except ValidationError as exc:
        raise ProtocolError(ErrorKind.INVALID, f"Invalid stream header: {describe_validation_error(exc, '')}") from None


def encode_stream_header(header: StreamHeader) -> bytes:
    """The header as one whole frame (u32 length, compact JSON)."""
    return encode_frame(header.model_dump_json().encode("utf-8"), max_bytes=MAX_FRAME_BYTES)
