"""What both session state machines share: the ``Step`` they return, closes, dropped frames.

A session (``ManagerSession``, ``NodeSession``) is fed frames, timer ticks and the driver's
decisions, and answers every call that can produce something with a :class:`Step`:

- ``frames``: text frames to send, in order;
- ``close``: when set, close the WebSocket with ``close.code`` / ``close.reason`` after sending
  ``frames`` (the session is already ``CLOSED``);
- ``events``: what happened, for the driver to act on after sending the frames.

Each session keeps its state in one transition table ``(state, trigger) -> state`` (style H4,
like h11's ``_state.py``). The driver's calls are triggers too: a call with no row for the
current state raises :class:`LocalProtocolError`, a bug in the driver. The peer can never make a
session raise: every frame in every state has a row (often "drop it and count it").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Generic, TypeVar

from appliance.protocol.errors import ErrorKind, LocalProtocolError

__all__ = ["CLOSE_CODES", "CLOSE_REASON_MAX_BYTES", "Close", "CloseCause", "FrameDropped", "Step", "short_reason"]


class CloseCause(StrEnum):
    """Why a session closed itself."""

    AUTH_TIMEOUT = "auth_timeout"
    """Manager: no ``auth`` within 10 s. Node: no reply to ``auth`` within 10 s (interop.md 6)."""
    AUTH_FAILED = "auth_failed"
    """Manager: the driver rejected the credentials. Node: ``auth_error`` received."""
    PROTOCOL_VIOLATION = "protocol_violation"
    """The first frame was not a valid ``auth`` / the manager spoke out of turn before its reply."""
    IDLE = "idle"
    """Manager: nothing from the node for ``node_offline_threshold_secs`` (interop.md 6)."""


CLOSE_CODES: Final[dict[CloseCause, int]] = {
    # RFC 6455 §7.4.1. interop.md does not fix the codes; these are the standard meanings.
    CloseCause.AUTH_TIMEOUT: 1008,  # policy violation
    CloseCause.AUTH_FAILED: 1008,
    CloseCause.PROTOCOL_VIOLATION: 1002,  # protocol error
    CloseCause.IDLE: 1001,  # going away
}


CLOSE_REASON_MAX_BYTES: Final = 123
"""RFC 6455 §5.5: a control frame's payload is ≤ 125 bytes, 2 of them the close code."""


def short_reason(text: str) -> str:
    """``text`` cut to fit a WebSocket close reason (123 UTF-8 bytes, on a character boundary)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= CLOSE_REASON_MAX_BYTES:
        return text
    return data[:CLOSE_REASON_MAX_BYTES].decode("utf-8", "ignore")


@dataclass(frozen=True, slots=True)
class Close:
    """Close the WebSocket after sending the step's frames."""

    cause: CloseCause
    reason: str
    """A safe text, at most 123 UTF-8 bytes (:func:`short_reason`)."""

    @property
    def code(self) -> int:
        """The WebSocket close code (RFC 6455 §7.4.1)."""
        return CLOSE_CODES[self.cause]


@dataclass(frozen=True, slots=True)
class FrameDropped:
    """A received frame was not used (the connection stays up). Log ``reason`` and count ``kind``."""

    kind: ErrorKind
    reason: str
    """Safe to log: never holds frame content."""


E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class Step(Generic[E]):
    """What one session call produced: send ``frames``, then close if ``close``, then handle ``events``."""

    events: tuple[E, ...] = ()
    frames: tuple[str, ...] = ()
    close: Close | None = None


S = TypeVar("S", bound=StrEnum)
T = TypeVar("T", bound=StrEnum)


def transition(table: Mapping[tuple[S, T], S], state: S, trigger: T) -> S:
    """The next state, or :class:`LocalProtocolError` when the table has no row."""
    try:
        return table[(state, trigger)]
    except KeyError:
        raise LocalProtocolError(f"{trigger.value!r} is not allowed in state {state.value!r}") from None
