"""The two kinds of error of the node protocol (style H5): the peer's and ours.

- :class:`ProtocolError` (and its subclasses): a frame *the peer* sent cannot be used. Its
  text is safe to show and to log: it names the problem and, for a message that does not
  validate, the JSON path, but never a value from the frame (a frame may carry a node secret,
  a registration token or a bind token; interop.md conventions: "Secrets never appear in a
  response, a log line or an error text"). The sessions never let one escape: they turn it into
  a ``FrameDropped`` event or a close.
- :class:`LocalProtocolError`: *we* misused a session (a call its state does not allow, a frame
  we were about to send that breaks a limit). That is a bug in the driver, so it is raised.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ErrorKind", "FrameTooLarge", "LocalProtocolError", "ProtocolError", "UnknownMessageType"]


class ErrorKind(StrEnum):
    """Why a received frame was not used. The values are stable, for logs and counters."""

    FRAME_TOO_LARGE = "frame_too_large"
    """Over the size limit of its direction (interop.md 6 "Limits"). Dropped; the link stays up."""
    MALFORMED = "malformed"
    """Not UTF-8, not JSON, nested too deep, not an object, or no string ``type``."""
    UNKNOWN_TYPE = "unknown_type"
    """A ``type`` this protocol version does not define (a newer peer): dropped and counted."""
    UNEXPECTED_TYPE = "unexpected_type"
    """A defined type that this side never receives, or not in this state."""
    INVALID = "invalid"
    """A known type whose envelope or payload does not validate."""


class ProtocolError(Exception):
    """A received frame cannot be used. ``message`` never holds anything from the frame."""

    kind: ErrorKind

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class FrameTooLarge(ProtocolError):
    """The frame exceeds ``max_bytes`` (UTF-8 bytes). The manager logs it and keeps the socket
    (interop.md 6: "Node frames over 5 MiB are dropped and logged (the connection stays up)")."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(ErrorKind.FRAME_TOO_LARGE, f"Frame larger than {max_bytes} bytes dropped")
        self.max_bytes = max_bytes


class UnknownMessageType(ProtocolError):
    """The frame's ``type`` is not one this protocol defines (its value is not repeated)."""

    def __init__(self) -> None:
        super().__init__(ErrorKind.UNKNOWN_TYPE, "Unknown message type")


class LocalProtocolError(Exception):
    """This side misused the protocol: a session call its state does not allow (no row in the
    transition table), or a frame to send that breaks a limit. A bug in the caller."""
