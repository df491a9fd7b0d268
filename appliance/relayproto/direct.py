"""Direct-mode (edge ↔ edge) peer authentication (interop.md 8.3, 2.6), as two sans-IO state machines.

The egress edge dials ``peer_addr`` (ALPN ``mediaplane-direct``) and runs :class:`DirectDialler`
on the control stream (the first bidirectional one); the ingress edge listens on
``direct_listen_addr`` and runs a :class:`DirectListener` per accepted connection. Both sides
know the tunnel's ``id`` and ``tunnel_psk`` from their config.

::

    dialler                                     listener
      start(now)  ── peer_auth {tunnel_id, token} ──▶  receive_data(…, now)
                  ◀── peer_auth_ok {tunnel_id} ───    (PeerAuthenticated)
      (PeerAuthenticated)
                  ◀── peer_auth_error {reason} ───    (PeerRejected, close)
      (PeerRejected, close)

States: ``idle`` → (``start``) ``authenticating`` → ``authenticated`` or ``closed``.

The token is :func:`~appliance.relayproto.bind.peer_auth_token` and the listener checks it
with :func:`~appliance.relayproto.bind.verify_peer_auth_token` (constant time). The dialler
authenticates itself only: interop.md 8.3 has no listener proof (certificates are not verified,
8.1), so ``peer_auth_ok`` is taken at its word.

Once ``authenticated`` the machine stops reading the control stream: the driver takes the
bytes that came after the auth frame (in the same chunk) with :meth:`take_remaining`, untouched,
and carries on with ``ping``/``pong`` and the data plane of 8.3 itself. Feeding it more bytes
then is the driver's mistake (:class:`LocalProtocolError`).

Decisions not in interop.md (it fixes neither a timeout nor the pre-auth rules):

- :data:`AUTH_TIMEOUT_S`: the listener closes a connection that has not authenticated in
  time (answering ``peer_auth_error``), and the dialler gives up on a listener that has not
  answered. Both deadlines run from :meth:`start`; pass ``now`` to every call, the machines read
  no clock.
- Data before authentication. The first control message is ``peer_auth`` (8.3), so on the
  listener any other first frame (another type, bad JSON, an invalid ``peer_auth``) is answered
  ``peer_auth_error`` and the connection closes; an unauthenticated peer gets none of 8.1's
  "log and skip". A data stream or datagram before authentication is refused: :meth:`admit_data`
  is false, and the driver resets the stream or drops the datagram (the connection stays up until
  the auth deadline). The dialler must not send data before ``peer_auth_ok``.
- On the dialler, a frame before the answer that is not ``peer_auth_ok``/``peer_auth_error`` is a
  :class:`~appliance.protocol.session.FrameDropped` (8.1); a ``peer_auth_ok`` for another tunnel
  closes the connection.
- The ``peer_auth_error`` reasons are the generic texts below: they never say whether the tunnel id
  or the token was wrong, and never hold anything from the frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from appliance.protocol.errors import ErrorKind, LocalProtocolError, ProtocolError
from appliance.protocol.session import FrameDropped
from appliance.relayproto.bind import peer_auth_token, verify_peer_auth_token
from appliance.relayproto.framing import FrameDecoder, FrameTooLarge
from appliance.relayproto.messages import (
    PeerAuthErrorMessage,
    PeerAuthMessage,
    PeerAuthOkMessage,
    decode,
    encode,
)

__all__ = [
    "AUTH_FAILED",
    "AUTH_TIMEOUT",
    "AUTH_TIMEOUT_S",
    "CONNECTION_LOST",
    "PEER_AUTH_EXPECTED",
    "WRONG_TUNNEL",
    "DirectClose",
    "DirectDialler",
    "DirectEvent",
    "DirectListener",
    "DirectState",
    "DirectStep",
    "PeerAuthenticated",
    "PeerRejected",
]

AUTH_TIMEOUT_S: Final = 10.0
"""Not in interop.md: how long either side waits for the peer's auth message after ``start``."""

AUTH_FAILED: Final = "authentication failed"
"""``peer_auth_error`` reason: wrong token or tunnel id (which one is not said)."""
AUTH_TIMEOUT: Final = "authentication timeout"
"""``peer_auth_error`` reason (listener) and local reason (dialler): the deadline passed."""
PEER_AUTH_EXPECTED: Final = "peer_auth expected first"
"""``peer_auth_error`` reason: the first control frame was not a valid ``peer_auth``."""
WRONG_TUNNEL: Final = "peer_auth_ok for another tunnel"
"""Local reason (dialler): the listener acknowledged a different tunnel id."""
CONNECTION_LOST: Final = "direct connection lost"
"""Local reason: the QUIC connection went before authentication finished."""


class DirectState(StrEnum):
    IDLE = "idle"
    AUTHENTICATING = "authenticating"
    AUTHENTICATED = "authenticated"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class PeerAuthenticated:
    """The peer is authenticated for ``tunnel_id``: take the remaining bytes, start the data plane."""

    tunnel_id: str


@dataclass(frozen=True, slots=True)
class PeerRejected:
    """Authentication failed. ``local`` is false when the peer said so (the dialler got
    ``peer_auth_error``) and true when this side decided (listener check, timeout, lost
    connection). ``reason`` is safe to log."""

    reason: str
    local: bool


DirectEvent = PeerAuthenticated | PeerRejected | FrameDropped


@dataclass(frozen=True, slots=True)
class DirectClose:
    """Close the QUIC connection (the machine is ``closed`` already). ``reason`` is safe to log."""

    reason: str


@dataclass(frozen=True, slots=True)
class DirectStep:
    """Send ``data`` on the control stream, then close if ``close``, then handle ``events``."""

    events: tuple[DirectEvent, ...] = ()
    data: bytes = b""
    close: DirectClose | None = None


class _DirectPeer:
    """What both sides share: state, deadline, decoder, remaining bytes."""

    def __init__(self, *, tunnel_id: str, tunnel_psk: str, auth_timeout_s: float) -> None:
        if not tunnel_id:
            raise ValueError("tunnel_id is empty")
        if not tunnel_psk:
            raise ValueError("tunnel_psk is empty")
        if auth_timeout_s <= 0:
            raise ValueError("auth_timeout_s must be positive")
        self._tunnel_id = tunnel_id
        self._psk = tunnel_psk
        self._timeout = auth_timeout_s
        self._decoder = FrameDecoder()
        self._state = DirectState.IDLE
        self._deadline: float | None = None
        self._remaining = b""

    def __repr__(self) -> str:  # never the PSK
        return f"{type(self).__name__}(tunnel_id={self._tunnel_id!r}, state={self._state.value!r})"

    @property
    def state(self) -> DirectState:
        return self._state

    @property
    def tunnel_id(self) -> str:
        return self._tunnel_id

    @property
    def authenticated(self) -> bool:
        return self._state is DirectState.AUTHENTICATED

    def admit_data(self) -> bool:
        """Whether a data stream or datagram may be used now (only once authenticated).
        False: reset the stream / drop the datagram."""
        return self._state is DirectState.AUTHENTICATED

    def next_deadline(self) -> float | None:
        """When :meth:`tick` has something to do (None unless authenticating)."""
        return self._deadline if self._state is DirectState.AUTHENTICATING else None

    def take_remaining(self) -> bytes:
        """The control-stream bytes that followed the auth frame, untouched, once (then empty).

        Only once authenticated: raises :class:`LocalProtocolError` before.
        """
        if self._state is not DirectState.AUTHENTICATED:
            raise LocalProtocolError(f"'take_remaining' is not allowed in state {self._state.value!r}")
        rest, self._remaining = self._remaining, b""
        return rest

    def connection_lost(self) -> DirectStep:
        """The QUIC connection went. Before authentication that is a local :class:`PeerRejected`;
        after it (or when closed) nothing. Idempotent."""
        if self._state is DirectState.AUTHENTICATING:
            self._shut()
            return DirectStep(events=(PeerRejected(CONNECTION_LOST, local=True),))
        if self._state is not DirectState.CLOSED:
            self._shut()
        return DirectStep()

    def _begin(self, now: float, call: str) -> None:
        if self._state is not DirectState.IDLE:
            raise LocalProtocolError(f"{call!r} is not allowed in state {self._state.value!r}")
        self._state = DirectState.AUTHENTICATING
        self._deadline = now + self._timeout

    def _expired(self, now: float) -> bool:
        return self._deadline is not None and now >= self._deadline

    def _check_feedable(self) -> bool:
        """False when closed (bytes are ignored); raises when authenticated or not started."""
        if self._state is DirectState.CLOSED:
            return False
        if self._state is not DirectState.AUTHENTICATING:
            raise LocalProtocolError(f"'receive_data' is not allowed in state {self._state.value!r}")
        return True

    def _succeed(self) -> None:
        self._state = DirectState.AUTHENTICATED
        self._deadline = None
        self._remaining = self._decoder.take_remaining()

    def _shut(self) -> None:
        self._state = DirectState.CLOSED
        self._deadline = None
        self._remaining = b""


class DirectDialler(_DirectPeer):
    """The egress edge's side: send ``peer_auth`` first, wait for the listener's answer."""

    def __init__(self, *, tunnel_id: str, tunnel_psk: str, auth_timeout_s: float = AUTH_TIMEOUT_S) -> None:
        super().__init__(tunnel_id=tunnel_id, tunnel_psk=tunnel_psk, auth_timeout_s=auth_timeout_s)

    def start(self, now: float) -> DirectStep:
        """The control stream is open: send ``peer_auth`` (the first control message)."""
        self._begin(now, "start")
        message = PeerAuthMessage.model_validate(
            {"tunnel_id": self._tunnel_id, "token": peer_auth_token(self._psk, self._tunnel_id)}
        )
        return DirectStep(data=encode(message))

    def tick(self, now: float) -> DirectStep:
        """Give up when the listener has not answered by the deadline."""
        if self._state is DirectState.AUTHENTICATING and self._expired(now):
            self._shut()
            return DirectStep(events=(PeerRejected(AUTH_TIMEOUT, local=True),), close=DirectClose(AUTH_TIMEOUT))
        return DirectStep()

    def receive_data(self, data: bytes, now: float) -> DirectStep:
        """Bytes from the control stream, in chunks of any size, until authenticated."""
        if not self._check_feedable():
            return DirectStep()
        timed_out = self.tick(now)
        if timed_out.close is not None:
            return timed_out
        events: list[DirectEvent] = []
        try:
            self._decoder.receive_data(data)
            while (body := self._decoder.next_frame()) is not None:
                try:
                    message = decode(body)
                except ProtocolError as exc:
                    events.append(FrameDropped(exc.kind, exc.message))
                    continue
                if isinstance(message, PeerAuthOkMessage):
                    if message.tunnel_id != self._tunnel_id:
                        self._shut()
                        events.append(PeerRejected(WRONG_TUNNEL, local=True))
                        return DirectStep(events=tuple(events), close=DirectClose(WRONG_TUNNEL))
                    self._succeed()
                    events.append(PeerAuthenticated(self._tunnel_id))
                    return DirectStep(events=tuple(events))
                if isinstance(message, PeerAuthErrorMessage):
                    self._shut()
                    events.append(PeerRejected(message.reason, local=False))
                    return DirectStep(events=tuple(events), close=DirectClose("peer_auth_error from the listener"))
                events.append(FrameDropped(ErrorKind.UNEXPECTED_TYPE, f"Unexpected {message.type} before peer_auth_ok"))
        except FrameTooLarge as exc:
            self._shut()
            events.append(PeerRejected(exc.message, local=True))
            return DirectStep(events=tuple(events), close=DirectClose(exc.message))
        return DirectStep(events=tuple(events))


class DirectListener(_DirectPeer):
    """The ingress edge's side of one accepted connection: check ``peer_auth``, answer, or close."""

    def __init__(self, *, tunnel_id: str, tunnel_psk: str, auth_timeout_s: float = AUTH_TIMEOUT_S) -> None:
        super().__init__(tunnel_id=tunnel_id, tunnel_psk=tunnel_psk, auth_timeout_s=auth_timeout_s)

    def start(self, now: float) -> DirectStep:
        """The connection is accepted: the auth deadline starts. Sends nothing."""
        self._begin(now, "start")
        return DirectStep()

    def tick(self, now: float) -> DirectStep:
        """Answer ``peer_auth_error`` and close when no ``peer_auth`` came by the deadline."""
        if self._state is DirectState.AUTHENTICATING and self._expired(now):
            return self._reject(AUTH_TIMEOUT)
        return DirectStep()

    def receive_data(self, data: bytes, now: float) -> DirectStep:
        """Bytes from the control stream, in chunks of any size, until authenticated."""
        if not self._check_feedable():
            return DirectStep()
        timed_out = self.tick(now)
        if timed_out.close is not None:
            return timed_out
        try:
            self._decoder.receive_data(data)
            body = self._decoder.next_frame()
        except FrameTooLarge as exc:
            self._shut()
            return DirectStep(events=(PeerRejected(exc.message, local=True),), close=DirectClose(exc.message))
        if body is None:
            return DirectStep()
        try:
            message = decode(body)
        except ProtocolError:
            return self._reject(PEER_AUTH_EXPECTED)
        if not isinstance(message, PeerAuthMessage):
            return self._reject(PEER_AUTH_EXPECTED)
        # Both checks always run; the token names its tunnel id, so it is checked against ours.
        token_ok = verify_peer_auth_token(self._psk, self._tunnel_id, message.token.get_secret_value())
        tunnel_ok = message.tunnel_id == self._tunnel_id
        if not (token_ok and tunnel_ok):
            return self._reject(AUTH_FAILED)
        self._succeed()
        return DirectStep(
            events=(PeerAuthenticated(self._tunnel_id),),
            data=encode(PeerAuthOkMessage(tunnel_id=self._tunnel_id)),
        )

    def _reject(self, reason: str) -> DirectStep:
        self._shut()
        return DirectStep(
            events=(PeerRejected(reason, local=True),),
            data=encode(PeerAuthErrorMessage(reason=reason)),
            close=DirectClose(reason),
        )
