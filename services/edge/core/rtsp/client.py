"""RTSP 1.0 client state machine (RFC 2326), sans-IO (h11/aioquic style): :class:`RtspClient`.

The client pulls one presentation from a camera or media server: OPTIONS, DESCRIBE, SETUP of
each chosen track, PLAY, then keepalives until TEARDOWN. It reads no sockets or clocks and draws
no random numbers; the driver owns the TCP (or TLS) connection, the UDP sockets, the timers and
the Digest client nonce.

Driver contract::

    client = RtspClient(url, username=..., password=..., transport="tcp", cnonce=lambda: secrets.token_hex(8))
    client.start()                              # queues OPTIONS
    sock.sendall(client.data_to_send())
    while data := sock.recv(65536):
        for event in client.receive_data(data): # RtspProtocolError: broken framing, close
            match event:
                case Described(tracks=tracks):  client.setup(chosen, ports)   # SETUP..., then PLAY
                case TrackReady():              ...   # per SETUP reply: channels / server ports
                case Playing(session_timeout=t): ...  # start keepalives every ~t/2: client.keepalive()
                case InterleavedData():         ...   # RTP/RTCP over TCP
                case Failed(reason=r):          ...   # terminal: close (client.teardown() first)
        sock.sendall(client.data_to_send())     # always drain after receive_data and after actions
    # RTCP receiver reports over TCP: client.send_interleaved(rtcp_channel, report)

Sequence (RFC 2326 §10, appendix A state table for the client):

==========  =============================================  =======================================
state       entered by                                     on the 2xx answer of its request
==========  =============================================  =======================================
idle        construction                                   -
options     ``start()``: OPTIONS (§10.1)                   note ``Public``; DESCRIBE
describing  DESCRIBE (§10.2), ``Accept: application/sdp``  parse SDP: :class:`Described`
described   a usable SDP                                   - (waits for ``setup()``)
setting_up  ``setup()``: SETUP of track 0 (§10.4)          :class:`TrackReady`; next SETUP or PLAY
starting    PLAY (§10.5), ``Range: npt=0.000-``            :class:`Playing`
playing     the PLAY answer                                keepalives: :class:`KeepaliveAnswered`
closed      ``teardown()``: TEARDOWN (§10.7)               answers ignored
failed      :class:`Failed`                                answers ignored
==========  =============================================  =======================================

Details and camera quirks handled:

* Every request carries ``CSeq`` (§12.17) and ``User-Agent``; responses are matched by CSeq,
  stray ones are counted (:attr:`RtspClient.stray_responses`) and ignored; a response without a
  CSeq answers the oldest outstanding request. 1xx answers are skipped.
* Authentication (RFC 2326 §12.5, RFC 7235): on 401 with credentials the request is sent again
  once with ``Authorization`` for the strongest supported challenge (Digest SHA-256 > Digest MD5 >
  Basic, :mod:`.auth`), and every later request is authenticated up front (Digest ``nc`` counts
  up per nonce). A 401 to a request sent with credentials up front is answered once more (some
  cameras rotate nonces without ``stale``); a 401 to that retry fails the session with
  ``auth=True`` unless it says ``stale=true`` (a new nonce, tried again without counting). 401
  without credentials, 403 and 407 fail with ``auth=True``, and so does a 401 offering no scheme
  we support. Digest's ``uri`` is the absolute request URL, as FFmpeg and live555 send it.
* A URL with ``user:pass@`` has the user info removed from every request (and from
  :attr:`RtspClient.display_url`); explicit ``username``/``password`` arguments win over it.
  :class:`Failed` reasons are our own fixed texts plus the status code and its RFC 2326 §7.1.1
  phrase (never the server's reason phrase or a URL; only the scheme tokens of an unsupported
  challenge come from the server), and are scrubbed of the credentials.
* OPTIONS answered with an error (other than 401, 403, 407 or 3xx) is not fatal: DESCRIBE follows
  anyway and gives the real answer. 3xx fails (``redirected to another server, not followed``) without echoing
  ``Location``.
* Control URLs (§C.1.1): the base is Content-Base, else Content-Location, else the request URL;
  relative ``a=control`` values are appended FFmpeg/live555 style (:func:`.sdp.resolve_control`).
  PLAY, keepalives and TEARDOWN go to the session-level control URL (the base when absent or ``*``).
* SETUP carries no ``Require`` header (servers reject it). TCP asks for
  ``RTP/AVP/TCP;unicast;interleaved=2i-2i+1`` (i: position in the ``setup()`` list), UDP for
  ``RTP/AVP;unicast;client_port=a-b``. A TCP reply without ``interleaved=`` gets the channels we
  asked for; ``ssrc=`` is parsed as hex; ``Session: id;timeout=N`` (§12.37) is split, the first
  SETUP reply's id is kept.
* RTP-Info (§12.33) URLs are matched to the tracks leniently (exact, relative, other host, path
  suffix at a ``/`` boundary, or a single entry for a single track) and keyed by the track's
  control URL; unmatched entries keep their own URL.
* Keepalive (§10.8/§10.1): GET_PARAMETER when the OPTIONS answer's ``Public`` listed it, else
  OPTIONS, with ``Session`` (a no-op before a SETUP answer gave one); any answer but 401 is
  :class:`KeepaliveAnswered`, and a non-2xx answer to GET_PARAMETER (405/501 from some cameras)
  switches later keepalives to OPTIONS.
* Server-to-client requests (§10): OPTIONS, GET_PARAMETER and SET_PARAMETER get ``200 OK`` with
  their CSeq, anything else (ANNOUNCE, REDIRECT, ...) ``501 Not Implemented``.
* ``$`` frames (§10.12) may arrive anywhere between messages, also before the PLAY answer; bytes
  may be split anywhere. Framing limits and resynchronisation are in :mod:`.message`.
* A framing error raises :class:`RtspProtocolError` from :meth:`RtspClient.receive_data` and
  every later call raises it again; ``teardown()`` and ``data_to_send()`` still work.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from .auth import Authenticator, choose_challenge, parse_challenges
from .events import (
    Described,
    Failed,
    InterleavedData,
    KeepaliveAnswered,
    Playing,
    RtspEvent,
    Track,
    TrackReady,
)
from .message import (
    InterleavedFrame,
    RtspProtocolError,
    RtspReader,
    RtspRequest,
    RtspResponse,
    build_request,
    build_response,
)
from .sdp import SdpError, SessionDescription, is_absolute_url, parse_sdp, resolve_control, url_path

DEFAULT_SESSION_TIMEOUT: Final = 60.0  # RFC 2326 §12.37: 60 seconds when the server says nothing
MAX_STALE_RETRIES: Final = 3  # stale=true answers in a row before we call it a failure
MAX_INTERLEAVED_PAYLOAD: Final = 0xFFFF  # §10.12: 16-bit length

# RFC 2326 §7.1.1 reason phrases: Failed texts use these, never the server's own phrase.
STATUS_PHRASES: Final = {
    100: "Continue",
    200: "OK",
    201: "Created",
    250: "Low on Storage Space",
    300: "Multiple Choices",
    301: "Moved Permanently",
    302: "Moved Temporarily",
    303: "See Other",
    304: "Not Modified",
    305: "Use Proxy",
    400: "Bad Request",
    401: "Unauthorized",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    407: "Proxy Authentication Required",
    408: "Request Time-out",
    410: "Gone",
    411: "Length Required",
    412: "Precondition Failed",
    413: "Request Entity Too Large",
    414: "Request-URI Too Large",
    415: "Unsupported Media Type",
    451: "Parameter Not Understood",
    452: "Conference Not Found",
    453: "Not Enough Bandwidth",
    454: "Session Not Found",
    455: "Method Not Valid in This State",
    456: "Header Field Not Valid for Resource",
    457: "Invalid Range",
    458: "Parameter Is Read-Only",
    459: "Aggregate Operation Not Allowed",
    460: "Only Aggregate Operation Allowed",
    461: "Unsupported Transport",
    462: "Destination Unreachable",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Time-out",
    505: "RTSP Version Not Supported",
    551: "Option Not Supported",
}

_SERVER_REQUESTS_OK: Final = frozenset({"OPTIONS", "GET_PARAMETER", "SET_PARAMETER"})
_SAFE_HEADER_VALUE: Final = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
_RTP_INFO_SPLIT: Final = re.compile(r",\s*(?=url\s*=)", re.IGNORECASE)
_PORT_PAIR: Final = re.compile(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?")
_HEX: Final = re.compile(r"\s*([0-9A-Fa-f]{1,8})\s*")
_TIMEOUT: Final = re.compile(r"\s*(\d{1,7})(?:\.\d*)?\s*")


class ClientState(StrEnum):
    """Where the dialogue is (see the module docstring's table)."""

    IDLE = "idle"
    OPTIONS = "options"
    DESCRIBING = "describing"
    DESCRIBED = "described"
    SETTING_UP = "setting_up"
    STARTING = "starting"
    PLAYING = "playing"
    CLOSED = "closed"
    FAILED = "failed"


class _Purpose(StrEnum):
    START_OPTIONS = "start_options"
    DESCRIBE = "describe"
    SETUP = "setup"
    PLAY = "play"
    KEEPALIVE = "keepalive"
    TEARDOWN = "teardown"


@dataclass(slots=True)
class _Pending:
    """A request waiting for its answer: enough to send it again with credentials."""

    purpose: _Purpose
    method: str
    url: str
    headers: list[tuple[str, str]] = field(default_factory=list)  # without CSeq/User-Agent/Authorization
    track_pos: int = -1
    auth_retry: bool = False  # this request is the retry after a 401
    stale_retries: int = 0


def status_text(status: int) -> str:
    """``"404 Not Found"``: the code and its RFC 2326 §7.1.1 phrase (``"status 499"`` if unknown)."""
    phrase = STATUS_PHRASES.get(status)
    return f"{status} {phrase}" if phrase else f"status {status}"


def _port_pair(value: str | None) -> tuple[int, int] | None:
    """``a-b`` (or a lone ``a``, meaning ``a-(a+1)``) from a Transport parameter (§12.39)."""
    if value is None:
        return None
    m = _PORT_PAIR.fullmatch(value)
    if m is None:
        return None
    first = int(m.group(1))
    second = int(m.group(2)) if m.group(2) else first + 1
    if first > 65535 or second > 65535:
        return None
    return first, second


def _transport_params(value: str) -> dict[str, str | None]:
    """The first transport-spec of a Transport header (§12.39) as lower-cased parameters."""
    first = value.split(",", 1)[0]
    params: dict[str, str | None] = {}
    for item in first.split(";")[1:]:
        key, eq, val = item.partition("=")
        key = key.strip().lower()
        if key and key not in params:
            params[key] = val.strip().strip('"') if eq else None
    return params


def _session_header(value: str) -> tuple[str | None, float | None]:
    """``Session: id[;timeout=N]`` (§12.37): the id and timeout, None where unusable."""
    ident, _, rest = value.partition(";")
    ident = ident.strip()
    if not ident or _SAFE_HEADER_VALUE.fullmatch(ident) is None:
        return None, None
    timeout: float | None = None
    for item in rest.split(";"):
        key, _, val = item.partition("=")
        if key.strip().lower() == "timeout" and (m := _TIMEOUT.fullmatch(val)) and int(m.group(1)) > 0:
            timeout = float(int(m.group(1)))
    return ident, timeout


def _clean_url(url: str) -> str:
    """Percent-encode spaces and control characters (a few cameras put them in a=control)."""
    return "".join(f"%{ord(c):02X}" if ord(c) <= 0x20 or ord(c) == 0x7F else c for c in url)


def _strip_userinfo(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, ""))


class RtspClient:
    """An RTSP 1.0 client session to one URL (see the module docstring for the contract)."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        transport: Literal["tcp", "udp"] = "tcp",
        user_agent: str = "Mediaplane",
        cnonce: Callable[[], str],
    ) -> None:
        if transport not in ("tcp", "udp"):
            raise ValueError("transport must be 'tcp' or 'udp'")
        parts = urlsplit(url)
        url_user = unquote(parts.username) if parts.username is not None else None
        url_password = unquote(parts.password) if parts.password is not None else None
        self._userinfo = parts.netloc.rpartition("@")[0]
        self._url = _strip_userinfo(url)
        self._username = username if username is not None else url_user
        self._password = password if password is not None else (url_password or "")
        self._transport: Literal["tcp", "udp"] = transport
        self._user_agent = user_agent
        self._auth = Authenticator(self._username or "", self._password, cnonce)
        self._reader = RtspReader()
        self._out = bytearray()
        self._cseq = 1
        self._pending: dict[int, _Pending] = {}
        self._state = ClientState.IDLE
        self._error: str | None = None
        self._public: frozenset[str] | None = None  # methods from the OPTIONS answer's Public
        self._use_get_parameter = False
        self._session_id: str | None = None
        self._session_timeout = DEFAULT_SESSION_TIMEOUT
        self._base_url = self._url
        self._aggregate_url = self._url
        self._tracks: list[Track] = []
        self._client_ports: list[tuple[int, int]] | None = None
        self.description: SessionDescription | None = None
        """The parsed SDP of the DESCRIBE answer, once described."""
        self.stray_responses = 0
        """Responses whose CSeq matched no outstanding request (ignored)."""
        self.server_requests = 0
        """Requests the server sent us (answered 200 or 501)."""

    def __repr__(self) -> str:  # never the credentials
        return f"RtspClient({self._url!r}, state={self._state.value!r})"

    # ------------------------------------------------------------------ public surface

    @property
    def state(self) -> ClientState:
        """Where the dialogue is."""
        return self._state

    @property
    def session_id(self) -> str | None:
        """The Session id from the first SETUP answer, once known."""
        return self._session_id

    @property
    def session_timeout(self) -> float:
        """Seconds of silence the server allows (``Session: id;timeout=N``, default 60.0)."""
        return self._session_timeout

    @property
    def display_url(self) -> str:
        """The URL without user info (safe for logs and events); every request uses it."""
        return self._url

    @property
    def public_methods(self) -> frozenset[str] | None:
        """The methods the OPTIONS answer listed in ``Public`` (§12.28), None before it."""
        return self._public

    def start(self) -> None:
        """Queue OPTIONS (§10.1); DESCRIBE follows its answer automatically."""
        if self._state is not ClientState.IDLE:
            raise RuntimeError("start() may be called once")
        self._state = ClientState.OPTIONS
        self._request(_Pending(_Purpose.START_OPTIONS, "OPTIONS", self._url))

    def data_to_send(self) -> bytes:
        """Bytes to write to the connection now (and forget)."""
        data = bytes(self._out)
        self._out.clear()
        return data

    def receive_data(self, data: bytes) -> list[RtspEvent]:
        """Feed bytes from the connection; return what happened, in order.

        Raises :class:`RtspProtocolError` on malformed framing (then on every later call).
        """
        if self._error is not None:
            raise RtspProtocolError(self._error)
        try:
            messages = self._reader.feed(data)
        except RtspProtocolError as exc:
            self._error = str(exc)
            raise
        events: list[RtspEvent] = []
        for message in messages:
            if isinstance(message, InterleavedFrame):
                events.append(InterleavedData(message.channel, message.data))
            elif isinstance(message, RtspRequest):
                self._answer_server_request(message)
            else:
                self._on_response(message, events)
        return events

    def setup(self, tracks: list[Track], client_ports: list[tuple[int, int]] | None = None) -> None:
        """SETUP ``tracks`` in order (§10.4), then PLAY (§10.5), each after the previous answer.

        Call after :class:`Described`. ``client_ports`` (UDP only) holds one RTP/RTCP port pair per
        track. A no-op once failed or torn down.
        """
        if self._state in (ClientState.FAILED, ClientState.CLOSED):
            return
        if self._state is not ClientState.DESCRIBED:
            raise RuntimeError(f"setup() needs a described session, not {self._state.value}")
        if not tracks:
            raise ValueError("setup() needs at least one track")
        if self._transport == "udp":
            if client_ports is None or len(client_ports) != len(tracks):
                raise ValueError("UDP transport needs one client port pair per track")
            for rtp, rtcp in client_ports:
                if not (0 < rtp <= 65535 and 0 < rtcp <= 65535):
                    raise ValueError("client ports must be 1..65535")
        self._tracks = list(tracks)
        self._client_ports = list(client_ports) if client_ports is not None else None
        self._state = ClientState.SETTING_UP
        self._send_setup(0)

    def keepalive(self) -> None:
        """Queue a keepalive with the Session header: GET_PARAMETER (§10.8) when the OPTIONS
        answer listed it and no earlier one was refused, else OPTIONS (§10.1).

        A no-op without a session (before the first SETUP answer), once failed or after ``teardown()``.
        """
        if self._state in (ClientState.FAILED, ClientState.CLOSED) or self._session_id is None:
            return
        method = "GET_PARAMETER" if self._use_get_parameter else "OPTIONS"
        self._request(_Pending(_Purpose.KEEPALIVE, method, self._aggregate_url, self._session_headers()))

    def teardown(self) -> None:
        """Queue TEARDOWN (§10.7) for the session; a no-op without one or when already sent."""
        if self._session_id is None or self._state is ClientState.CLOSED:
            return
        self._state = ClientState.CLOSED
        self._request(_Pending(_Purpose.TEARDOWN, "TEARDOWN", self._aggregate_url, self._session_headers()))

    def send_interleaved(self, channel: int, data: bytes) -> None:
        """Queue a ``$`` frame (§10.12), e.g. an RTCP receiver report on a TCP track's RTCP channel."""
        if not 0 <= channel <= 255:
            raise ValueError("interleaved channel must be 0..255")
        if len(data) > MAX_INTERLEAVED_PAYLOAD:
            raise ValueError("interleaved frame longer than 65535 bytes")
        self._out += b"$" + bytes((channel,)) + len(data).to_bytes(2, "big") + data

    # ------------------------------------------------------------------ requests

    def _session_headers(self) -> list[tuple[str, str]]:
        return [("Session", self._session_id)] if self._session_id is not None else []

    def _request(self, pending: _Pending) -> None:
        cseq = self._cseq
        self._cseq += 1
        headers = [("CSeq", str(cseq)), ("User-Agent", self._user_agent)]
        if self._auth.challenge is not None:
            headers.append(("Authorization", self._auth.authorization(pending.method, pending.url)))
        headers += pending.headers
        self._out += build_request(pending.method, pending.url, headers)
        self._pending[cseq] = pending

    def _send_setup(self, pos: int) -> None:
        if self._transport == "tcp":
            transport = f"RTP/AVP/TCP;unicast;interleaved={2 * pos}-{2 * pos + 1}"
        else:
            assert self._client_ports is not None
            rtp, rtcp = self._client_ports[pos]
            transport = f"RTP/AVP;unicast;client_port={rtp}-{rtcp}"
        headers = [("Transport", transport), *self._session_headers()]  # no Require: servers reject it
        self._request(_Pending(_Purpose.SETUP, "SETUP", self._tracks[pos].control_url, headers, pos))

    def _send_play(self) -> None:
        self._state = ClientState.STARTING
        headers = [*self._session_headers(), ("Range", "npt=0.000-")]
        self._request(_Pending(_Purpose.PLAY, "PLAY", self._aggregate_url, headers))

    def _retry(self, pending: _Pending, *, stale: bool = False) -> None:
        stale_retries = pending.stale_retries + 1 if stale else pending.stale_retries
        again = _Pending(
            pending.purpose, pending.method, pending.url, pending.headers, pending.track_pos, True, stale_retries
        )
        self._request(again)

    # ------------------------------------------------------------------ server requests

    def _answer_server_request(self, request: RtspRequest) -> None:
        """§10: answer the camera's own requests so it does not drop the session."""
        self.server_requests += 1
        cseq = request.cseq
        headers = [("CSeq", str(cseq))] if cseq is not None else []
        session = request.get("Session")
        if session is not None and _SAFE_HEADER_VALUE.fullmatch(session):
            headers.append(("Session", session))
        if request.method in _SERVER_REQUESTS_OK:
            if request.method == "OPTIONS":
                headers.append(("Public", "OPTIONS, GET_PARAMETER, SET_PARAMETER"))
            self._out += build_response(200, "OK", headers)
        else:
            self._out += build_response(501, "Not Implemented", headers)

    # ------------------------------------------------------------------ responses

    def _on_response(self, response: RtspResponse, events: list[RtspEvent]) -> None:
        cseq = response.cseq
        if cseq is None and self._pending:
            cseq = min(self._pending)  # no CSeq (a few cameras): the oldest request
        pending = self._pending.get(cseq) if cseq is not None else None
        if cseq is None or pending is None:
            self.stray_responses += 1
            return
        status = response.status
        if status < 200:  # 1xx (§7.1.1 100 Continue): the final answer follows
            return
        del self._pending[cseq]
        if self._state in (ClientState.FAILED, ClientState.CLOSED) or pending.purpose is _Purpose.TEARDOWN:
            return
        if status == 401:
            self._on_unauthorized(pending, response, events)
            return
        if pending.purpose is _Purpose.KEEPALIVE:
            if pending.method == "GET_PARAMETER" and not 200 <= status < 300:
                self._use_get_parameter = False  # 405/501 from some cameras: OPTIONS from now on
            events.append(KeepaliveAnswered())
            return
        if 300 <= status < 400:
            self._fail(events, f"redirected to another server, not followed ({status_text(status)})", status)
            return
        if status >= 400:
            if pending.purpose is _Purpose.START_OPTIONS and status not in (403, 407):
                self._send_describe()  # OPTIONS is advisory; DESCRIBE gives the real answer
                return
            self._fail_status(pending, status, events)
            return
        handler = {
            _Purpose.START_OPTIONS: self._on_options,
            _Purpose.DESCRIBE: self._on_describe,
            _Purpose.SETUP: self._on_setup,
            _Purpose.PLAY: self._on_play,
        }[pending.purpose]
        handler(pending, response, events)

    def _on_unauthorized(self, pending: _Pending, response: RtspResponse, events: list[RtspEvent]) -> None:
        """401 (RFC 2326 §12.5, RFC 7235 §3.1): authenticate once, or fail with ``auth=True``."""
        if not self._username:
            self._fail(
                events, "authentication required (401 Unauthorized) but no credentials are configured", 401, True
            )
            return
        challenges = parse_challenges(response.get_all("WWW-Authenticate"))
        chosen = choose_challenge(challenges)
        if chosen is None:
            schemes = sorted({c.scheme for c in challenges})
            offered = ", ".join(schemes)[:80] or "none"
            reason = f"no supported authentication scheme offered (401 Unauthorized; offered: {offered})"
            self._fail(events, reason, 401, True)
            return
        if pending.auth_retry:
            # RFC 7616 §3.3 stale=true: the nonce expired but the credentials were right.
            if chosen.stale and pending.stale_retries < MAX_STALE_RETRIES:
                self._auth.use(chosen)
                self._retry(pending, stale=True)
                return
            self._fail(events, "authentication failed (401 Unauthorized)", 401, True)
            return
        self._auth.use(chosen)
        self._retry(pending)

    def _fail_status(self, pending: _Pending, status: int, events: list[RtspEvent]) -> None:
        text = status_text(status)
        method = pending.method
        auth = False
        if status == 403:
            reason, auth = f"access denied ({text})", True
        elif status == 407:
            reason, auth = f"proxy authentication required ({text}), not supported", True
        elif status == 404:
            reason = f"stream not found ({text})"
        elif status == 454:
            reason = f"session not found ({text})"
        elif status == 461:
            other = "udp" if self._transport == "tcp" else "tcp"
            lower = "TCP (interleaved)" if self._transport == "tcp" else "UDP"
            reason = f"the camera does not support RTP over {lower} ({text}): try transport {other}"
        elif status >= 500:
            reason = f"camera error on {method} ({text})"
        else:
            reason = f"{method} refused ({text})"
        self._fail(events, reason, status, auth)

    def _fail(self, events: list[RtspEvent], reason: str, status: int | None = None, auth: bool = False) -> None:
        for secret in (self._userinfo, self._password):
            if secret and len(secret) >= 4:  # belt and braces: our texts never hold them
                reason = reason.replace(secret, "***")
        self._state = ClientState.FAILED
        self._pending.clear()
        events.append(Failed(reason, status, auth))

    def _on_options(self, pending: _Pending, response: RtspResponse, events: list[RtspEvent]) -> None:
        public = ",".join(response.get_all("Public"))
        self._public = frozenset(m.strip().upper() for m in public.split(",") if m.strip())
        self._use_get_parameter = "GET_PARAMETER" in self._public
        self._send_describe()

    def _send_describe(self) -> None:
        self._state = ClientState.DESCRIBING
        self._request(_Pending(_Purpose.DESCRIBE, "DESCRIBE", self._url, [("Accept", "application/sdp")]))

    def _base_from(self, response: RtspResponse, request_url: str) -> str:
        """§C.1.1: Content-Base, else Content-Location, else the request URL."""
        for name in ("Content-Base", "Content-Location"):
            value = (response.get(name) or "").strip()
            if not value:
                continue
            try:
                url = value if is_absolute_url(value) else urljoin(request_url, value)
                return _clean_url(_strip_userinfo(url))
            except ValueError:
                continue
        return request_url

    def _on_describe(self, pending: _Pending, response: RtspResponse, events: list[RtspEvent]) -> None:
        base = self._base_from(response, pending.url)
        try:
            description = parse_sdp(response.body.decode("utf-8", "replace"))
        except SdpError:
            self._fail(events, "the DESCRIBE answer has no usable SDP (no media section)")
            return
        tracks: list[Track] = []
        for index, media in enumerate(description.media):
            if "RTP" not in media.proto.upper():
                continue
            pts = media.payload_types
            if not pts:
                continue
            pt = next((p for p in pts if p in media.rtpmaps), pts[0])
            rtpmap = media.rtpmaps.get(pt)
            tracks.append(
                Track(
                    index=index,
                    media=media.media,
                    payload_type=pt,
                    encoding=rtpmap.encoding.upper() if rtpmap else "",
                    clock_rate=rtpmap.clock_rate if rtpmap else 0,
                    channels=rtpmap.channels if rtpmap else None,
                    fmtp=dict(media.fmtps.get(pt, {})),
                    control_url=_clean_url(resolve_control(base, media.control)),
                )
            )
        if not tracks:
            self._fail(events, "the camera describes no RTP media")
            return
        self.description = description
        self._base_url = base
        self._aggregate_url = _clean_url(resolve_control(base, description.control))
        self._state = ClientState.DESCRIBED
        events.append(Described(description, tracks, base))

    def _on_setup(self, pending: _Pending, response: RtspResponse, events: list[RtspEvent]) -> None:
        session = response.get("Session")
        if session is not None:
            ident, timeout = _session_header(session)
            if self._session_id is None and ident is not None:
                self._session_id = ident
            if timeout is not None and (ident is None or ident == self._session_id):
                self._session_timeout = timeout
        pos = pending.track_pos
        track = self._tracks[pos]
        params = _transport_params(response.get("Transport") or "")
        interleaved = _port_pair(params.get("interleaved"))
        if interleaved is not None and (interleaved[0] > 255 or interleaved[1] > 255):
            interleaved = None
        if interleaved is None and self._transport == "tcp":
            interleaved = (2 * pos, 2 * pos + 1)  # quirk: reply without interleaved=, use what we asked
        source = params.get("source")
        if source is not None and _SAFE_HEADER_VALUE.fullmatch(source) is None:
            source = None
        ssrc_match = _HEX.fullmatch(params.get("ssrc") or "")
        ssrc = int(ssrc_match.group(1), 16) if ssrc_match else None
        server_ports = _port_pair(params.get("server_port"))
        events.append(TrackReady(track, interleaved, server_ports, source or None, ssrc))
        if pos + 1 < len(self._tracks):
            self._send_setup(pos + 1)
        else:
            self._send_play()

    def _on_play(self, pending: _Pending, response: RtspResponse, events: list[RtspEvent]) -> None:
        session = response.get("Session")
        if session is not None:
            ident, timeout = _session_header(session)
            if timeout is not None and (ident is None or ident == self._session_id):
                self._session_timeout = timeout
        rtp_info = self._rtp_info(",".join(response.get_all("RTP-Info")))
        self._state = ClientState.PLAYING
        events.append(Playing(rtp_info, self._session_timeout))

    def _rtp_info(self, value: str) -> dict[str, tuple[int | None, int | None]]:
        """RTP-Info (§12.33): ``url=...;seq=...;rtptime=...`` per track, keyed by control URL."""
        info: dict[str, tuple[int | None, int | None]] = {}
        entries: list[tuple[str, int | None, int | None]] = []
        for entry in _RTP_INFO_SPLIT.split(value):
            url: str | None = None
            seq: int | None = None
            rtptime: int | None = None
            for item in entry.split(";"):
                key, _, val = item.partition("=")
                key, val = key.strip().lower(), val.strip()
                if key == "url" and val:
                    url = val.strip('"')
                elif key == "seq" and val.isascii() and val.isdigit() and len(val) <= 5 and int(val) <= 0xFFFF:
                    seq = int(val)
                elif key == "rtptime" and val.isascii() and val.isdigit() and len(val) <= 10 and int(val) < 2**32:
                    rtptime = int(val)
            if url is not None:
                entries.append((url, seq, rtptime))
        controls = [t.control_url for t in self._tracks]
        for url, seq, rtptime in entries:
            key = self._match_control(url, controls, single=len(entries) == 1)
            info.setdefault(key or url, (seq, rtptime))
        return info

    def _match_control(self, url: str, controls: list[str], *, single: bool) -> str | None:
        """The track control URL an RTP-Info URL means: exact, relative, other host, suffix."""
        if url in controls:
            return url
        if not is_absolute_url(url):
            resolved = resolve_control(self._base_url, url)
            if resolved in controls:
                return resolved
        wanted = url_path(url).strip("/") if is_absolute_url(url) else url.strip("/")
        if wanted:
            for control in controls:
                path = url_path(control).strip("/")
                if path == wanted:
                    return control
            for control in controls:
                path = url_path(control).strip("/")
                shorter, longer = sorted((path, wanted), key=len)
                if shorter and longer.endswith(shorter) and longer[-len(shorter) - 1] == "/":
                    return control
        if single and len(controls) == 1:
            return controls[0]
        return None


__all__ = ["DEFAULT_SESSION_TIMEOUT", "ClientState", "RtspClient", "status_text"]
