"""The manager's authentication core (interop.md 7.1): passwords, session JWTs, CSRF, roles.

No I/O and no clock of its own: every function takes what it needs (the secret, ``now``)
and raises the shared error kinds of ``appliance.errors``, so the service layer and the
routes stay thin and these rules are tested without a server. Messages are fixed texts:
never a username, a password, a token or a secret (interop.md 13).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Final
from uuid import UUID

import jwt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from appliance import errors
from services.manager.store import ROLE_RANK, Role, UserRecord

__all__ = [
    "CSRF_COOKIE",
    "CSRF_HEADER",
    "ISSUER",
    "MAX_PASSWORD_CHARS",
    "MAX_USERNAME_CHARS",
    "SESSION_COOKIE",
    "STATE_CHANGING_METHODS",
    "SessionClaims",
    "check_csrf",
    "decode_session_jwt",
    "dummy_verify",
    "encode_session_jwt",
    "has_role",
    "hash_password",
    "password_hasher",
    "password_problem",
    "user_usable",
    "username_problem",
    "verify_password",
]

ISSUER: Final = "mediaplane-manager"
ALGORITHM: Final = "HS256"
SESSION_COOKIE: Final = "session"
CSRF_COOKIE: Final = "csrf_token"
CSRF_HEADER: Final = "X-CSRF-Token"
STATE_CHANGING_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_USERNAME_CHARS: Final = 64
MIN_PASSWORD_CHARS: Final = 8
MAX_PASSWORD_CHARS: Final = 128
_USERNAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")


# --- passwords -------------------------------------------------------------------------


@cache
def password_hasher() -> PasswordHasher:
    """Argon2id, m = 19456 KiB, t = 2, p = 1 (interop.md 7.1), PHC strings."""
    return PasswordHasher(time_cost=2, memory_cost=19456, parallelism=1)


def hash_password(password: str) -> str:
    """The Argon2id PHC string of ``password`` (blocking: about 20-50 ms of CPU)."""
    return password_hasher().hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` matches the stored PHC string; a damaged hash matches nothing."""
    try:
        return password_hasher().verify(password_hash, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


@cache
def _dummy_hash() -> str:
    return hash_password("Dummy-password-0")


def dummy_verify(password: str) -> None:
    """Spends the time of one real verification (an unknown username, interop.md 7.1)."""
    verify_password(_dummy_hash(), password)


def password_problem(password: str) -> str | None:
    """Why ``password`` breaks the policy of interop.md 7.1, or None. Never quotes it."""
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        return f"the password must be {MIN_PASSWORD_CHARS}-{MAX_PASSWORD_CHARS} characters long"
    if not (
        any(c.isupper() for c in password) and any(c.islower() for c in password) and any(c.isdigit() for c in password)
    ):
        return "the password needs at least one upper-case letter, one lower-case letter and one digit"
    return None


def username_problem(username: str) -> str | None:
    """Why ``username`` is not 1-64 characters of ``[A-Za-z0-9_.-]``, or None. Never quotes it."""
    if _USERNAME.fullmatch(username) is None:
        return "the username must be 1-64 characters of A-Z, a-z, 0-9, '_', '.' and '-'"
    return None


# --- users and roles -------------------------------------------------------------------


def user_usable(user: UserRecord, now: datetime) -> bool:
    """Active and not past its ``expires_at`` (a temporary account)."""
    return user.is_active and (user.expires_at is None or now < user.expires_at)


def has_role(role: Role, at_least: Role) -> bool:
    """``viewer`` < ``operator`` < ``admin`` < ``super_admin``, compared as "at least"."""
    return ROLE_RANK[role] >= ROLE_RANK[at_least]


def visible_node_ids(user: UserRecord) -> frozenset[UUID] | None:
    """The nodes ``user`` may see and act on; None: every node.

    The one node-access rule (interop.md 7.1, 13 "403 role or node access") for every route,
    the dashboard stream and the AI context: below ``admin``, a list in ``allowed_node_ids``
    limits the user to those nodes (null: all); admins and super_admins see every node.
    """
    if has_role(user.role, Role.ADMIN) or user.allowed_node_ids is None:
        return None
    return frozenset(user.allowed_node_ids)


# --- session JWTs ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionClaims:
    """The claims of a session JWT that verified (signature, ``iss``, ``exp``)."""

    user_id: UUID
    session_id: UUID
    role: str
    expires_at: datetime


def encode_session_jwt(
    secret: str, *, user_id: UUID, role: Role, session_id: UUID, now: datetime, lifetime: timedelta
) -> str:
    """HS256 ``{sub, role, jti, iat, exp, iss: "mediaplane-manager"}`` (interop.md 7.1)."""
    issued = int(now.timestamp())
    claims = {
        "sub": str(user_id),
        "role": role.value,
        "jti": str(session_id),
        "iat": issued,
        "exp": issued + int(lifetime.total_seconds()),
        "iss": ISSUER,
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def decode_session_jwt(secret: str, token: str, now: datetime) -> SessionClaims:
    """The claims of ``token``; AuthRequired for a bad signature, issuer, expiry or shape."""
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            issuer=ISSUER,
            options={"require": ["sub", "role", "jti", "iat", "exp", "iss"], "verify_exp": False},
        )
        expires = int(claims["exp"])
        if expires <= int(now.timestamp()):
            raise errors.AuthRequired("session expired")
        return SessionClaims(
            user_id=UUID(str(claims["sub"])),
            session_id=UUID(str(claims["jti"])),
            role=str(claims["role"]),
            expires_at=datetime.fromtimestamp(expires, tz=now.tzinfo),
        )
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):
        raise errors.AuthRequired("invalid session") from None


# --- CSRF ------------------------------------------------------------------------------


def check_csrf(method: str, header: str | None, cookie: str | None) -> None:
    """NotAllowed (403) unless a state-changing request carries a matching ``X-CSRF-Token``.

    The header must be non-empty; when the ``csrf_token`` cookie was sent it must equal it
    (compared in constant time), without the cookie (a Bearer client) the header is enough.
    """
    if method.upper() not in STATE_CHANGING_METHODS:
        return
    if not header:
        raise errors.NotAllowed("missing X-CSRF-Token header")
    if cookie is not None and not hmac.compare_digest(header.encode(), cookie.encode()):
        raise errors.NotAllowed("X-CSRF-Token does not match the csrf_token cookie")
