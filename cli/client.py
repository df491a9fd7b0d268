"""The edge REST client of `mp`, and the one map from HTTP status to exit code.

One request per connection through `cli._http`, a small HTTP/1.1 client on a
plain socket: a command makes one or two requests, so pooling buys nothing, and
`httpx` costs about 200 ms of imports (it pulls in its own click/rich CLI) and
`http.client` about 30 ms, against a start-up budget of 120 ms for
`mp flow list` (bench/cli_start.py).

Statuses map to `MpError` kinds here and nowhere else (style guide section 3):

| status | error | exit |
|---|---|---|
| 400, 409, 415, 429, 5xx, other | Failure | 1 |
| 404 | NotFound | 3 |
| 401, 403 | AuthNeeded | 4 |
| no answer | ServiceUnreachable | 1 |
"""

from __future__ import annotations

import json
from typing import Any, Final

from cli.auth import CachedToken, TokenCache, now, token_from_response
from cli.errors import AuthNeeded, Failure, MpError, NotFound, ServiceUnreachable
from cli.settings import Settings

USER_AGENT: Final = "mp/0.1.0"
LOGIN_HINT: Final = "try: mp auth login"


def error_for_status(status: int, message: str, *, not_found_hint: str | None = None) -> MpError:
    """The `MpError` (and so the exit code) for a failed HTTP answer."""
    if status == 404:
        return NotFound(message, hint=not_found_hint)
    if status == 401:
        return AuthNeeded(message, hint=LOGIN_HINT)
    if status == 403:
        return AuthNeeded(message, hint="this needs an admin client: try: mp auth status")
    if status == 429:
        return Failure(message, hint="rate limited: wait a minute and try again")
    return Failure(message)


class Response:
    __slots__ = ("body", "reason", "status")

    def __init__(self, status: int, reason: str, body: Any) -> None:
        self.status = status
        self.reason = reason
        self.body = body


class EdgeClient:
    """Talks to one edge. Adds the bearer token, unwraps the envelope, raises `MpError`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._token: str | None = settings.token
        self._token_refreshable = False
        self._auth_problem: MpError | None = None
        self._auth_resolved = settings.token is not None

    # ------------------------------------------------------------------ transport

    def _send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Response:
        import socket
        from urllib.parse import urlsplit

        from cli._http import ProtocolError, request

        url = self.settings.url
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        tls = parts.scheme == "https"
        try:
            port = parts.port or (443 if tls else 80)
        except ValueError:
            raise Failure(f"the edge URL {url} has an invalid port") from None
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **headers}
        try:
            raw = request(
                method,
                host,
                port,
                parts.path.rstrip("/") + path,
                headers=headers,
                body=body,
                timeout_s=self.settings.timeout_s,
                tls=tls,
            )
        except ConnectionRefusedError:
            raise ServiceUnreachable(
                f"cannot reach the edge at {url}: connection refused",
                hint="is mp-edge running? try: systemctl status mp-edge",
            ) from None
        except TimeoutError:
            raise ServiceUnreachable(
                f"no answer from the edge at {url} within {self.settings.timeout_s:g} s",
                hint="try: --timeout 30",
            ) from None
        except socket.gaierror as exc:
            raise ServiceUnreachable(f"cannot resolve the edge host {host!r}: {exc.strerror}") from None
        except ProtocolError as exc:
            raise ServiceUnreachable(f"the edge at {url} did not answer in HTTP: {exc}") from None
        except OSError as exc:  # reset, unreachable, TLS failures (ssl.SSLError is an OSError)
            raise ServiceUnreachable(f"cannot reach the edge at {url}: {exc.strerror or exc}") from None
        parsed: Any = None
        if raw.body:
            try:
                parsed = json.loads(raw.body)
            except ValueError:
                parsed = raw.body.decode("utf-8", "replace")
        return Response(raw.status, raw.reason, parsed)

    # ------------------------------------------------------------------ auth

    def _exchange(self, client_id: str, client_secret: str) -> CachedToken:
        """POST /oauth/token with client credentials; raises AuthNeeded on refusal."""
        body = json.dumps(
            {"grant_type": "client_credentials", "client_id": client_id, "client_secret": client_secret}
        ).encode()
        resp = self._send("POST", "/oauth/token", body, {"Content-Type": "application/json"})
        if resp.status != 200:
            text = _error_text(resp)
            if resp.status == 429:
                raise Failure(f"token request refused: {text}", hint="rate limited: wait a minute")
            raise AuthNeeded(f"the edge refused the client credentials for {client_id!r}: {text}")
        return token_from_response(resp.body, client_id=client_id, client_secret=None, now=now())

    def _resolve_token(self, *, force_refresh: bool = False) -> None:
        """Find a token: settings, then client credentials (cached), then the login cache."""
        if self._auth_resolved and not force_refresh:
            return
        self._auth_resolved = True
        s = self.settings
        if s.token is not None:
            self._token = s.token
            return
        cache = TokenCache(s.config_dir)
        if s.client_id is not None or s.client_secret is not None:
            if s.client_id is None or s.client_secret is None:
                missing = "client secret" if s.client_secret is None else "client id"
                flag = "--client-secret" if s.client_secret is None else "--client-id"
                env = "MEDIAPLANE_CLIENT_SECRET" if s.client_secret is None else "MEDIAPLANE_CLIENT_ID"
                self._auth_problem = AuthNeeded(f"the {missing} is missing", hint=f"set {flag} or {env}")
                return
            cached = cache.get(s.url)
            if not force_refresh and cached and cached.client_id == s.client_id and cached.fresh(now()):
                self._token, self._token_refreshable = cached.access_token, True
                return
            try:
                token = self._exchange(s.client_id, s.client_secret)
            except AuthNeeded as exc:
                self._auth_problem = exc  # reported only if a route turns out to need auth
                return
            if cached is None or cached.client_secret is None:
                cache.put(s.url, token)  # never overwrite a login entry with a secret-less one
            self._token, self._token_refreshable = token.access_token, True
            return
        cached = cache.get(s.url)
        if cached is None:
            return
        if cached.fresh(now()) and not force_refresh:
            self._token, self._token_refreshable = cached.access_token, cached.client_secret is not None
            return
        if cached.client_id and cached.client_secret:
            try:
                token = self._exchange(cached.client_id, cached.client_secret)
            except AuthNeeded as exc:
                self._auth_problem = AuthNeeded(exc.message, hint=LOGIN_HINT)
                return
            token.client_secret = cached.client_secret
            cache.put(s.url, token)
            self._token, self._token_refreshable = token.access_token, True

    def login(self, client_id: str, client_secret: str) -> CachedToken:
        """Exchange the credentials and cache token and credentials for this URL."""
        token = self._exchange(client_id, client_secret)
        token.client_secret = client_secret
        TokenCache(self.settings.config_dir).put(self.settings.url, token)
        return token

    @property
    def token(self) -> str | None:
        """The bearer token to send (None: none known); may exchange credentials first."""
        self._resolve_token()
        return self._token

    @property
    def auth_problem(self) -> MpError | None:
        """Why no token could be had (refused credentials), reported if a route needs one."""
        return self._auth_problem

    def refresh_token(self) -> bool:
        """Get a fresh token from the credentials, if the token came from them; True if it did."""
        if not self._token_refreshable:
            return False
        self._resolve_token(force_refresh=True)
        return True

    # ------------------------------------------------------------------ requests

    def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        envelope: bool = True,
        auth: bool = True,
        not_found_hint: str | None = None,
    ) -> Any:
        """Send one request; return the envelope's `data` (or the bare body); raise MpError."""
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        retried = False
        while True:
            sent_headers = dict(headers)
            if auth:
                self._resolve_token()
                if self._token is not None:
                    sent_headers["Authorization"] = f"Bearer {self._token}"
            resp = self._send(method, path, body, sent_headers)
            if resp.status == 401 and auth and self._token_refreshable and not retried:
                retried = True  # the cached token was revoked or the clock is off: ask once more
                self._resolve_token(force_refresh=True)
                continue
            break
        if 200 <= resp.status < 300:
            if envelope and isinstance(resp.body, dict) and "success" in resp.body:
                if resp.body.get("success") is False:
                    raise Failure(_error_text(resp))
                return resp.body.get("data")
            return resp.body
        if resp.status in (401, 403) and self._auth_problem is not None:
            raise self._auth_problem
        raise error_for_status(resp.status, _error_text(resp), not_found_hint=not_found_hint)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, payload: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, payload, **kw)

    def put(self, path: str, payload: Any = None, **kw: Any) -> Any:
        return self.request("PUT", path, payload, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)


def _error_text(resp: Response) -> str:
    """The API's `error` text, or the HTTP status when the body has none."""
    body = resp.body
    if isinstance(body, dict):
        for key in ("error", "message", "detail"):
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key])
    if isinstance(body, str) and body.strip() and len(body) < 200 and "<" not in body:
        return body.strip()
    return f"HTTP {resp.status} {resp.reason}".strip()


def quote(segment: str) -> str:
    """A path segment, percent-encoded (ids are [A-Za-z0-9_.-], but typos are not)."""
    from urllib.parse import quote as _quote

    return _quote(segment, safe="")
