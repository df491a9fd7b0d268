"""The token cache and the client-credentials exchange (edge interface section 5).

Tokens live in `${XDG_CONFIG_HOME:-~/.config}/mp/tokens.json` (directory 0700, file
0600, written atomically), one entry per edge URL. An entry made by
`mp auth login` also keeps the client id and secret, because the
client-credentials grant has no refresh token: refreshing means asking again.
An entry made from credentials given by flag, environment or profile keeps only
the token, so the next `mp` run skips the exchange while the token is valid.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

REFRESH_MARGIN_S: Final = 15.0
"""A token this close to its expiry is replaced before it is used."""
CACHE_NAME: Final = "tokens.json"


@dataclass(slots=True)
class CachedToken:
    access_token: str
    expires_at: float
    role: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    """Kept only for `mp auth login` entries, so the token can be refreshed."""

    def fresh(self, now: float) -> bool:
        return now < self.expires_at - REFRESH_MARGIN_S

    def __repr__(self) -> str:  # no secret in a traceback
        return f"CachedToken(client_id={self.client_id!r}, role={self.role!r}, expires_at={self.expires_at!r})"


def jwt_claims(token: str) -> dict[str, Any]:
    """The JWT payload, unverified (for display and expiry only); {} when not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, UnicodeDecodeError):
        return {}
    return claims if isinstance(claims, dict) else {}


class TokenCache:
    """The on-disk token cache of one user."""

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / CACHE_NAME

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            with self.path.open("r", encoding="utf-8") as fh:
                document = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {}  # a damaged cache is only a cache: the next login rewrites it
        entries = document.get("entries") if isinstance(document, dict) else None
        return entries if isinstance(entries, dict) else {}

    def get(self, url: str) -> CachedToken | None:
        entry = self._load().get(url)
        if not isinstance(entry, dict):
            return None
        try:
            return CachedToken(
                access_token=str(entry["access_token"]),
                expires_at=float(entry["expires_at"]),
                role=entry.get("role"),
                client_id=entry.get("client_id"),
                client_secret=entry.get("client_secret"),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, url: str, token: CachedToken) -> None:
        entries = self._load()
        entries[url] = {k: v for k, v in asdict(token).items() if v is not None}
        self._write(entries)

    def remove(self, url: str | None) -> bool:
        """Forget one URL's entry, or every entry when url is None. True if anything went."""
        entries = self._load()
        if url is None:
            had = bool(entries)
            entries = {}
        else:
            had = entries.pop(url, None) is not None
        if had or self.path.exists():
            self._write(entries)
        return had

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = directory / f".{CACHE_NAME}.{os.getpid()}.tmp"
        data = json.dumps({"version": 1, "entries": entries}, indent=2).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask must not widen it
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


def token_from_response(body: Any, *, client_id: str, client_secret: str | None, now: float) -> CachedToken:
    """Build a cache entry from a `POST /oauth/token` answer (bare object, not the envelope)."""
    from cli.errors import Failure

    if not isinstance(body, dict) or not isinstance(body.get("access_token"), str):
        raise Failure("the edge answered /oauth/token without an access_token")
    try:
        expires_in = float(body.get("expires_in", 0))
    except (TypeError, ValueError):
        expires_in = 0.0
    if expires_in <= 0:
        exp = jwt_claims(body["access_token"]).get("exp")
        expires_in = float(exp) - now if isinstance(exp, int | float) else 60.0
    return CachedToken(
        access_token=body["access_token"],
        expires_at=now + expires_in,
        role=body.get("role") if isinstance(body.get("role"), str) else None,
        client_id=client_id,
        client_secret=client_secret,
    )


def now() -> float:
    return time.time()
