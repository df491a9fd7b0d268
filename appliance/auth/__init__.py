"""Edge authentication: client credentials, HS256 JWTs and roles (interop.md 4).

Sans-IO: every function takes the auth settings and ``now`` (Unix seconds) and
raises the shared error kinds; the HTTP layer only extracts headers and bodies.
Secrets are compared with ``hmac.compare_digest`` and never appear in a message.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import urllib.parse
from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

import jwt

from appliance import errors
from appliance.models.config import ServerAuth
from appliance.untrusted import JsonTooDeep, load_json

ISSUER: Final = "mediaplane-edge"
Role = Literal["admin", "monitor"]
_DUMMY_SECRET: Final = "x" * 32  # compared against when the client id is unknown, so timing does not tell


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the client id (JWT ``sub``) and its current role."""

    client_id: str
    role: Role


@dataclass(frozen=True, slots=True)
class TokenRequest:
    grant_type: str
    client_id: str
    client_secret: str


def parse_token_request(content_type: str, body: bytes, authorization: str | None) -> TokenRequest:
    """Read a client-credentials request from a JSON or form body and/or HTTP Basic auth.

    RFC 6749 §2.3.1 allows the credentials in a Basic header; when header and body
    both name them and disagree, the request is rejected (interop.md 4). A JSON body
    nested deeper than ``appliance.untrusted.MAX_JSON_DEPTH`` is InvalidInput, as any
    other malformed body (RFC 6749 §5.2 ``invalid_request``).
    """
    mimetype = content_type.split(";", 1)[0].strip().lower()
    fields: dict[str, str] = {}
    if mimetype == "application/json":
        try:
            parsed = load_json(body or b"{}")
        except JsonTooDeep as exc:
            raise errors.InvalidInput(str(exc)) from None
        except (ValueError, UnicodeDecodeError):
            raise errors.InvalidInput("malformed JSON body") from None
        if not isinstance(parsed, dict):
            raise errors.InvalidInput("the body must be a JSON object")
        for key in ("grant_type", "client_id", "client_secret"):
            value = parsed.get(key)
            if value is not None and not isinstance(value, str):
                raise errors.InvalidInput(f"{key} must be a string")
            if value is not None:
                fields[key] = value
    elif mimetype == "application/x-www-form-urlencoded":
        try:
            pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise errors.InvalidInput("malformed form body") from None
        for key, value in pairs:
            if key in ("grant_type", "client_id", "client_secret"):
                fields[key] = value
    elif body.strip():
        raise errors.InvalidInput("Content-Type must be application/json or application/x-www-form-urlencoded")

    if authorization and authorization[:6].lower() == "basic ":
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise errors.InvalidInput("malformed Basic credentials") from None
        basic_id, sep, basic_secret = decoded.partition(":")
        if not sep:
            raise errors.InvalidInput("malformed Basic credentials")
        basic_id, basic_secret = urllib.parse.unquote(basic_id), urllib.parse.unquote(basic_secret)
        for key, value in (("client_id", basic_id), ("client_secret", basic_secret)):
            if key in fields and not hmac.compare_digest(fields[key].encode(), value.encode()):
                raise errors.InvalidInput("credentials in the Authorization header and the body disagree")
            fields[key] = value

    grant_type = fields.get("grant_type")
    if not grant_type:
        raise errors.InvalidInput("grant_type is required")
    if grant_type != "client_credentials":
        raise errors.InvalidInput("unsupported grant_type: only client_credentials is accepted")
    if not fields.get("client_id") or not fields.get("client_secret"):
        raise errors.InvalidInput("client_id and client_secret are required")
    return TokenRequest(grant_type, fields["client_id"], fields["client_secret"])


def issue_token(auth: ServerAuth | None, request: TokenRequest, now: int) -> dict[str, object]:
    """Check the client's credentials and sign a token: the bare token response body."""
    if auth is None or not auth.enabled:
        raise errors.InvalidInput("authentication is not enabled on this node")
    client = auth.client(request.client_id)
    expected = client.client_secret.get_secret_value() if client is not None else _DUMMY_SECRET
    secret_ok = hmac.compare_digest(expected.encode(), request.client_secret.encode())
    if client is None or not secret_ok:
        raise errors.InvalidInput("invalid client credentials")
    if auth.jwt_secret is None:
        raise errors.Internal("token signing failed: no signing key")
    claims = {
        "sub": client.client_id,
        "role": client.role,
        "iat": now,
        "exp": now + auth.token_lifetime_secs,
        "iss": ISSUER,
    }
    try:
        token = jwt.encode(claims, auth.jwt_secret.get_secret_value(), algorithm="HS256", headers={"typ": "JWT"})
    except Exception as exc:  # pyjwt raises several types; the message carries no secret
        raise errors.Internal("token signing failed") from exc
    return {"access_token": token, "token_type": "bearer", "expires_in": auth.token_lifetime_secs, "role": client.role}


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def verify_token(auth: ServerAuth, token: str | None, now: int) -> Principal:
    """Verify an HS256 JWT: signature, ``iss`` and ``exp`` (no leeway), and a configured ``sub``.

    The role applied is the client's current role, not the one in the token.
    Raises AuthRequired (401).
    """
    if token is None:
        raise errors.AuthRequired("Missing Authorization header")
    if auth.jwt_secret is None:
        raise errors.AuthRequired("invalid token")
    try:
        claims = jwt.decode(
            token,
            auth.jwt_secret.get_secret_value(),
            algorithms=["HS256"],
            issuer=ISSUER,
            # The caller owns the clock: exp is checked below against `now`, with no leeway.
            options={
                "require": ["exp", "iat", "iss", "sub"],
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
            },
        )
    except jwt.InvalidTokenError:
        raise errors.AuthRequired("invalid token") from None
    exp = claims.get("exp")
    if not isinstance(exp, int) or exp <= now:
        raise errors.AuthRequired("token expired")
    sub = claims.get("sub")
    client = auth.client(sub) if isinstance(sub, str) else None
    if client is None:
        raise errors.AuthRequired("invalid token: unknown client")
    return Principal(client.client_id, client.role)


def require_role(principal: Principal, role: Literal["admin", "any"]) -> None:
    """NotAllowed (403) when an admin route is called with a monitor token."""
    if role == "admin" and principal.role != "admin":
        raise errors.NotAllowed("admin role required")


class TokenRateLimiter:
    """Sliding one-minute limit of token requests per client IP (interop.md 2.1).

    Loopback clients are exempt and a limit of 0 turns it off.
    """

    def __init__(self, max_tracked_ips: int = 4096) -> None:
        self._hits: dict[str, deque[float]] = {}
        self._max_tracked = max_tracked_ips

    def check(self, client_ip: str, limit_per_minute: int, now: float) -> None:
        """Record one request; RateLimited (429) when over the limit."""
        if limit_per_minute <= 0 or _is_loopback(client_ip):
            return
        hits = self._hits.get(client_ip)
        if hits is None:
            if len(self._hits) >= self._max_tracked:
                self._forget_idle(now)
            hits = self._hits[client_ip] = deque()
        while hits and hits[0] <= now - 60.0:
            hits.popleft()
        if len(hits) >= limit_per_minute:
            raise errors.RateLimited("too many token requests; try again in a minute")
        hits.append(now)

    def _forget_idle(self, now: float) -> None:
        for ip in [ip for ip, hits in self._hits.items() if not hits or hits[-1] <= now - 60.0]:
            del self._hits[ip]
        if len(self._hits) >= self._max_tracked:  # all busy: drop the oldest half
            for ip in list(self._hits)[: self._max_tracked // 2]:
                del self._hits[ip]


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "localhost") or ip.startswith("::ffff:127.")
