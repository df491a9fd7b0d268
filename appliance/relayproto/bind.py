"""Bind tokens (interop.md 8.4) and direct-mode peer tokens (interop.md 8.3).

::

    bind_token = hex(HMAC-SHA256(key = tunnel_bind_secret as ASCII bytes (the 64-char hex string
                                 itself, NOT hex-decoded), msg = "{tunnel_id}:{direction}"))
    peer token = base64("{tunnel_id}:" + hex(HMAC-SHA256(key = tunnel_psk as UTF-8, msg = tunnel_id)))

Every comparison is constant-time (``hmac.compare_digest``). Nothing here logs or returns a
secret in an error text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

from appliance.relayproto.messages import Direction

__all__ = [
    "BindAuthorization",
    "bind_allowed",
    "compute_bind_token",
    "peer_auth_token",
    "tokens_equal",
    "verify_bind_token",
    "verify_peer_auth_token",
]


def compute_bind_token(tunnel_bind_secret: str, tunnel_id: str, direction: Direction) -> str:
    """The 64-hex bind token of ``direction`` (the binding edge's own ``ingress``/``egress``).

    The key is the secret's text as ASCII (not hex-decoded). Raises ``ValueError`` for a
    secret that is not ASCII (the message names no value) or an unknown direction.
    """
    if direction not in ("ingress", "egress"):
        raise ValueError("direction must be 'ingress' or 'egress'")
    try:
        key = tunnel_bind_secret.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError("tunnel_bind_secret is not ASCII") from None
    message = f"{tunnel_id}:{direction}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def tokens_equal(expected: str, received: str | None) -> bool:
    """Constant-time comparison of two tokens; a missing one never matches."""
    if received is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), received.encode("utf-8"))


def verify_bind_token(tunnel_bind_secret: str, tunnel_id: str, direction: Direction, token: str | None) -> bool:
    """Whether ``token`` is the bind token of ``tunnel_id``/``direction`` under the secret (edge
    side or tests; the relay holds only the tokens, see :class:`BindAuthorization`)."""
    return tokens_equal(compute_bind_token(tunnel_bind_secret, tunnel_id, direction), token)


@dataclass(frozen=True, slots=True)
class BindAuthorization:
    """The relay's entry for one tunnel, from the manager's ``authorize_tunnel {tunnel_id,
    ingress_token, egress_token}`` (a later one overwrites it; ``revoke_tunnel`` removes it)."""

    tunnel_id: str
    ingress_token: str = field(repr=False)
    egress_token: str = field(repr=False)

    @classmethod
    def from_secret(cls, tunnel_bind_secret: str, tunnel_id: str) -> BindAuthorization:
        """What the manager computes for ``authorize_tunnel`` (interop.md 8.4 "Distribution")."""
        return cls(
            tunnel_id=tunnel_id,
            ingress_token=compute_bind_token(tunnel_bind_secret, tunnel_id, "ingress"),
            egress_token=compute_bind_token(tunnel_bind_secret, tunnel_id, "egress"),
        )

    def token_for(self, direction: Direction) -> str:
        """The expected token of ``direction``."""
        return self.ingress_token if direction == "ingress" else self.egress_token


def bind_allowed(
    authorization: BindAuthorization | None,
    direction: Direction,
    token: str | None,
    *,
    require_bind_auth: bool,
) -> bool:
    """The relay's check of one ``tunnel_bind`` (interop.md 8.4 "Checking a bind").

    - With an entry: the bind must carry its direction's token (constant-time); none fails.
    - Without one: allowed unless ``require_bind_auth`` (fail-closed).

    False means: answer ``tunnel_down`` with ``BIND_AUTH_FAILED``.
    """
    if authorization is None:
        return not require_bind_auth
    return tokens_equal(authorization.token_for(direction), token)


def peer_auth_token(tunnel_psk: str, tunnel_id: str) -> str:
    """The direct-mode ``peer_auth`` token (interop.md 8.3): standard base64 of
    ``"{tunnel_id}:{hex(HMAC-SHA256(key = tunnel_psk as UTF-8, msg = tunnel_id))}"``."""
    digest = hmac.new(tunnel_psk.encode("utf-8"), tunnel_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return base64.b64encode(f"{tunnel_id}:{digest}".encode()).decode("ascii")


def verify_peer_auth_token(tunnel_psk: str, tunnel_id: str, token: str | None) -> bool:
    """Whether a received ``peer_auth`` token is the one for ``tunnel_id`` (constant-time, on
    the base64 text: the encoding is canonical, so equal tokens are equal texts)."""
    return tokens_equal(peer_auth_token(tunnel_psk, tunnel_id), token)
