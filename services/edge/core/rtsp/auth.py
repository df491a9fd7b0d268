"""RTSP authentication: Basic (RFC 7617) and Digest (RFC 2617, RFC 7616), sans-IO.

RTSP 1.0 borrows HTTP authentication (RFC 2326 §12.5 Authorization, §12.44 WWW-Authenticate).
:func:`parse_challenges` reads every ``WWW-Authenticate`` header (one header may carry several
challenges, RFC 7235 §4.1), :func:`choose_challenge` picks the strongest one we support
(Digest SHA-256 > Digest MD5 > Basic), and :class:`Authenticator` builds ``Authorization``
values for it, counting ``nc`` per nonce (RFC 7616 §3.4). Digest algorithms: MD5, MD5-sess,
SHA-256, SHA-256-sess; qop ``auth`` (preferred), ``auth-int`` (over the request body) or none
(RFC 2069 compatibility). The client nonce comes from an injected callable: cores own no dice.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from .message import TEXT_ENCODING, TEXT_ERRORS

# RFC 7616 §3.4.1 algorithm -> hashlib name; "-sess" variants hash the session key (§3.4.2).
_DIGEST_ALGORITHMS: Final = {"MD5": "md5", "MD5-SESS": "md5", "SHA-256": "sha256", "SHA-256-SESS": "sha256"}
_TOKEN_CHARS: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True, slots=True)
class Challenge:
    """One challenge of a ``WWW-Authenticate`` header (RFC 7235 §2.1)."""

    scheme: str  # lower-cased: "basic", "digest", ...
    params: dict[str, str] = field(default_factory=dict)  # names lower-cased, values unquoted

    @property
    def algorithm(self) -> str:
        """The Digest algorithm, upper-cased (MD5 when absent, RFC 7616 §3.3)."""
        return self.params.get("algorithm", "MD5").strip().upper() or "MD5"

    @property
    def stale(self) -> bool:
        """RFC 7616 §3.3 ``stale=true``: the nonce expired, the credentials were fine."""
        return self.params.get("stale", "").strip().lower() == "true"

    @property
    def supported(self) -> bool:
        """True when :class:`Authenticator` can answer this challenge."""
        if self.scheme == "basic":
            return True
        if self.scheme != "digest" or not self.params.get("nonce"):
            return False
        if self.algorithm not in _DIGEST_ALGORITHMS:
            return False
        qops = _qop_options(self.params.get("qop"))
        return qops is None or "auth" in qops or "auth-int" in qops


def _qop_options(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [q.strip().lower() for q in value.split(",") if q.strip()]


class _Tokens:
    """A small scanner over one header value."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def token(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _TOKEN_CHARS:
            self.pos += 1
        return self.text[start : self.pos]

    def token68(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ", \t":
            self.pos += 1
        return self.text[start : self.pos]

    def quoted(self) -> str:
        """A quoted-string (RFC 7230 §3.2.6), after the opening quote; tolerates a missing close."""
        out: list[str] = []
        self.pos += 1
        while self.pos < len(self.text):
            c = self.text[self.pos]
            self.pos += 1
            if c == "\\" and self.pos < len(self.text):
                out.append(self.text[self.pos])
                self.pos += 1
            elif c == '"':
                break
            else:
                out.append(c)
        return "".join(out)


def parse_challenges(values: list[str]) -> list[Challenge]:
    """Every challenge in the given ``WWW-Authenticate`` header values, in order.

    ``challenge = auth-scheme [ 1*SP ( token68 / #auth-param ) ]`` (RFC 7235 §2.1); a header may
    hold several challenges separated by commas. Malformed parts are skipped, never raised.
    """
    challenges: list[Challenge] = []
    for value in values:
        scan = _Tokens(value)
        current: Challenge | None = None
        while scan.pos < len(scan.text):
            scan.skip_space()
            if scan.peek() == ",":
                scan.pos += 1
                continue
            start = scan.pos
            name = scan.token()
            if not name:
                scan.pos = start + 1  # a stray character: skip it
                continue
            scan.skip_space()
            if scan.peek() == "=" and current is not None:
                scan.pos += 1
                scan.skip_space()
                if scan.peek() == '"':
                    param = scan.quoted()
                else:
                    param = scan.token68()
                current.params.setdefault(name.lower(), param)
                continue
            # A new challenge: the scheme, then maybe a token68 (Basic realm-less forms).
            current = Challenge(name.lower(), {})
            challenges.append(current)
    return challenges


def choose_challenge(challenges: list[Challenge]) -> Challenge | None:
    """The strongest supported challenge: Digest SHA-256 > Digest MD5 > Basic (RFC 7616 §3.7)."""

    def rank(challenge: Challenge) -> int:
        if challenge.scheme == "basic":
            return 1
        return 3 if challenge.algorithm.startswith("SHA-256") else 2

    usable = [c for c in challenges if c.supported]
    if not usable:
        return None
    return max(usable, key=rank)  # max keeps the first of equal rank


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _hash(algorithm: str, text: str) -> str:
    return hashlib.new(algorithm, text.encode(TEXT_ENCODING, TEXT_ERRORS)).hexdigest()


def digest_response(
    *,
    algorithm: str,
    username: str,
    password: str,
    realm: str,
    nonce: str,
    method: str,
    uri: str,
    qop: str | None,
    nc: str,
    cnonce: str,
    body: bytes = b"",
) -> str:
    """The Digest ``response`` value (RFC 7616 §3.4.1, RFC 2617 §3.2.2.1; qop None: RFC 2069)."""
    algorithm = algorithm.upper()
    hname = _DIGEST_ALGORITHMS[algorithm]
    ha1 = _hash(hname, f"{username}:{realm}:{password}")
    if algorithm.endswith("-SESS"):  # §3.4.2: A1 = H(user:realm:pass):nonce:cnonce
        ha1 = _hash(hname, f"{ha1}:{nonce}:{cnonce}")
    if qop == "auth-int":  # §3.4.3: A2 = method:uri:H(entity-body)
        a2 = f"{method}:{uri}:{hashlib.new(hname, body).hexdigest()}"
    else:
        a2 = f"{method}:{uri}"
    ha2 = _hash(hname, a2)
    if qop is None:
        return _hash(hname, f"{ha1}:{nonce}:{ha2}")
    return _hash(hname, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


def basic_authorization(username: str, password: str) -> str:
    """``Basic base64(user:pass)`` (RFC 7617 §2, UTF-8)."""
    raw = f"{username}:{password}".encode(TEXT_ENCODING, TEXT_ERRORS)
    return "Basic " + base64.b64encode(raw).decode("ascii")


class Authenticator:
    """Answers one server's challenge on every request: Basic, or Digest with ``nc`` per nonce."""

    def __init__(self, username: str, password: str, cnonce: Callable[[], str]) -> None:
        self._username = username
        self._password = password
        self._cnonce = cnonce
        self.challenge: Challenge | None = None
        self._nonce_counts: dict[str, int] = {}

    def __repr__(self) -> str:  # never show the password
        scheme = self.challenge.scheme if self.challenge else None
        return f"Authenticator(scheme={scheme!r})"

    def use(self, challenge: Challenge) -> None:
        """Answer ``challenge`` from now on (a new nonce starts its own ``nc`` at 1)."""
        if not challenge.supported:
            raise ValueError(f"unsupported challenge {challenge.scheme!r}")
        self.challenge = challenge

    def authorization(self, method: str, uri: str, body: bytes = b"") -> str:
        """The ``Authorization`` value for a request; ``uri`` is the request URL exactly as sent."""
        challenge = self.challenge
        if challenge is None:
            raise RuntimeError("no challenge to answer yet")
        if challenge.scheme == "basic":
            return basic_authorization(self._username, self._password)
        params = challenge.params
        realm = params.get("realm", "")
        nonce = params["nonce"]
        qops = _qop_options(params.get("qop"))
        qop: str | None = None
        if qops is not None:
            qop = "auth" if "auth" in qops else "auth-int"
        count = self._nonce_counts.get(nonce, 0) + 1
        self._nonce_counts = {nonce: count}  # only the current nonce is ever reused
        nc = f"{count:08x}"
        cnonce = self._cnonce() if qop is not None or challenge.algorithm.endswith("-SESS") else ""
        response = digest_response(
            algorithm=challenge.algorithm,
            username=self._username,
            password=self._password,
            realm=realm,
            nonce=nonce,
            method=method,
            uri=uri,
            qop=qop,
            nc=nc,
            cnonce=cnonce,
            body=body,
        )
        parts = [
            f"username={_quote(self._username)}",
            f"realm={_quote(realm)}",
            f"nonce={_quote(nonce)}",
            f"uri={_quote(uri)}",
            f"response={_quote(response)}",
        ]
        if "algorithm" in params:  # echo only when named: some cameras reject an unexpected one
            parts.append(f"algorithm={params['algorithm'].strip()}")
        if "opaque" in params:
            parts.append(f"opaque={_quote(params['opaque'])}")
        if qop is not None:
            parts += [f"qop={qop}", f"nc={nc}", f"cnonce={_quote(cnonce)}"]
        elif cnonce:
            parts.append(f"cnonce={_quote(cnonce)}")
        return "Digest " + ", ".join(parts)


__all__ = [
    "Authenticator",
    "Challenge",
    "basic_authorization",
    "choose_challenge",
    "digest_response",
    "parse_challenges",
]
