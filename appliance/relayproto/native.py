"""The native UDP plane's wire format (interop.md 9), shared by the relay and the edge.

``[16-byte tunnel UUID][payload]`` is media, forwarded byte for byte. A nil-UUID prefix is
followed by UTF-8 JSON of at most 2032 bytes: ``register`` from an edge, ``ack`` from the relay.
Sans-IO: bytes in, dataclasses out.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DIRECTIONS",
    "EDGE_DEAD_AFTER_S",
    "EDGE_REGISTER_INTERVAL_S",
    "EDGE_RETRY_INTERVAL_S",
    "MAX_CONTROL_JSON",
    "NIL_PREFIX",
    "PREFIX_LEN",
    "PROTOCOL_VERSION",
    "RECV_BUFFER_BYTES",
    "Ack",
    "ControlError",
    "Direction",
    "Register",
    "decode_ack",
    "decode_register",
    "encode_ack",
    "encode_register",
]

Direction = Literal["ingress", "egress"]
PREFIX_LEN: Final = 16
NIL_PREFIX: Final = bytes(PREFIX_LEN)
MAX_CONTROL_JSON: Final = 2032
RECV_BUFFER_BYTES: Final = 2048
PROTOCOL_VERSION: Final = 2
DIRECTIONS: Final[tuple[Direction, Direction]] = ("ingress", "egress")

# Edge timers (9 "Edge timers").
EDGE_REGISTER_INTERVAL_S: Final = 5.0
EDGE_DEAD_AFTER_S: Final = 25.0
EDGE_RETRY_INTERVAL_S: Final = 1.0


class ControlError(ValueError):
    """A control datagram that is not a well-formed message (text without input values)."""


# --------------------------------------------------------------------------- control messages


@dataclass(frozen=True, slots=True)
class Register:
    tunnel_id: uuid.UUID
    direction: Direction
    bind_token: str | None
    protocol_version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Ack:
    tunnel_id: uuid.UUID
    ready: bool


def _encode(obj: dict[str, object]) -> bytes:
    return NIL_PREFIX + json.dumps(obj, separators=(",", ":")).encode()


def encode_register(msg: Register) -> bytes:
    obj: dict[str, object] = {"type": "register", "tunnel_id": str(msg.tunnel_id), "direction": msg.direction}
    if msg.bind_token is not None:
        obj["bind_token"] = msg.bind_token
    obj["protocol_version"] = msg.protocol_version
    return _encode(obj)


def encode_ack(msg: Ack) -> bytes:
    return _encode({"type": "ack", "tunnel_id": str(msg.tunnel_id), "ready": msg.ready})


def _tunnel_id(value: object) -> uuid.UUID:
    if not isinstance(value, str):
        raise ControlError("tunnel_id must be a string")
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        raise ControlError("tunnel_id is not a UUID") from None
    if str(parsed) != value:
        raise ControlError("tunnel_id must be a lowercase hyphenated UUID")
    if parsed.int == 0:
        raise ControlError("tunnel_id must not be nil")
    return parsed


def _control_object(data: bytes) -> dict[str, object]:
    if len(data) < PREFIX_LEN or data[:PREFIX_LEN] != NIL_PREFIX:
        raise ControlError("not a control datagram")
    body = data[PREFIX_LEN:]
    if len(body) > MAX_CONTROL_JSON:
        raise ControlError("control message too long")
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ControlError("control message is not UTF-8 JSON") from None
    if not isinstance(obj, dict):
        raise ControlError("control message is not a JSON object")
    return obj


def _check_keys(obj: dict[str, object], required: set[str], optional: frozenset[str] = frozenset()) -> None:
    missing = required - obj.keys()
    if missing:
        raise ControlError("missing field: " + ", ".join(sorted(missing)))
    unknown = obj.keys() - required - optional
    if unknown:
        raise ControlError(f"{len(unknown)} unknown field(s)")


def decode_register(data: bytes) -> Register:
    """Parse a full datagram (nil prefix included) as a ``register``; ``ControlError`` otherwise."""
    obj = _control_object(data)
    if obj.get("type") != "register":
        raise ControlError("not a register")
    _check_keys(obj, {"type", "tunnel_id", "direction", "protocol_version"}, frozenset({"bind_token"}))
    direction = obj["direction"]
    if direction not in DIRECTIONS:
        raise ControlError("direction must be ingress or egress")
    token = obj.get("bind_token")
    if token is not None and not isinstance(token, str):
        raise ControlError("bind_token must be a string")
    version = obj["protocol_version"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ControlError("unsupported protocol_version")
    return Register(_tunnel_id(obj["tunnel_id"]), direction, token, version)


def decode_ack(data: bytes) -> Ack:
    """Parse a full datagram (nil prefix included) as an ``ack`` (the edge side); ``ControlError`` otherwise."""
    obj = _control_object(data)
    if obj.get("type") != "ack":
        raise ControlError("not an ack")
    _check_keys(obj, {"type", "tunnel_id", "ready"})
    ready = obj["ready"]
    if not isinstance(ready, bool):
        raise ControlError("ready must be a boolean")
    return Ack(_tunnel_id(obj["tunnel_id"]), ready)
