"""RTSP 1.0 message framing (RFC 2326 §4, §6, §7, §10.12), sans-IO.

:class:`RtspReader` turns the byte stream a server sends on the RTSP connection into
:class:`RtspResponse`, :class:`RtspRequest` (server-to-client requests such as ``GET_PARAMETER``,
``OPTIONS``, ``SET_PARAMETER`` or ``ANNOUNCE``) and :class:`InterleavedFrame` (``$``-framed
RTP/RTCP, §10.12). :func:`build_request` and :func:`build_response` serialise what we send.

Leniency (cameras in the field): LF-only line ends, trailing whitespace, a missing reason phrase,
``RTSP/2.0`` (and ``HTTP/1.x``) start lines, header lines without a colon (dropped), blank lines
between messages, and garbage between messages, which is skipped up to the next ``$``, ``RTSP/``
or line start (:attr:`RtspReader.skipped_bytes` counts it). Strictness (bounded memory): a start
line of at most :data:`MAX_START_LINE` bytes, a header block of at most :data:`MAX_HEADER_BYTES`
bytes and :data:`MAX_HEADERS` lines, a body of at most :data:`MAX_BODY_BYTES` bytes, and at most
:data:`MAX_GARBAGE_BYTES` of consecutive garbage; beyond these :class:`RtspProtocolError`.
Each limit can be lowered per reader (tests use small ones). The reader therefore never holds
more than ``max(max_header_bytes + max_body_bytes, 4 + 65535)`` bytes plus the last chunk fed to
it (the second term: one ``$`` frame, whose 16-bit length bounds it).

Text is decoded as UTF-8 with ``surrogateescape``, so that non-UTF-8 bytes survive a round trip
(a Digest ``realm`` or ``nonce`` is hashed exactly as the server sent it) and decoding never fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_START_LINE: Final = 8 * 1024
MAX_HEADER_BYTES: Final = 16 * 1024  # start line + header lines + the blank line
MAX_HEADERS: Final = 100
MAX_BODY_BYTES: Final = 1024 * 1024
MAX_GARBAGE_BYTES: Final = 64 * 1024  # consecutive bytes skipped while resynchronising
TEXT_ENCODING: Final = "utf-8"
TEXT_ERRORS: Final = "surrogateescape"

# RFC 2326 §7.1 Status-Line = RTSP-Version SP Status-Code SP Reason-Phrase CRLF (reason may be absent).
_STATUS_LINE: Final = re.compile(rb"(?:RTSP|HTTP)/(\d{1,2}\.\d{1,2})[ \t]+(\d{3})(?:[ \t]+(.*?))?[ \t\r]*")
# RFC 2326 §6.1 Request-Line = Method SP Request-URI SP RTSP-Version CRLF.
_REQUEST_LINE: Final = re.compile(
    rb"([A-Za-z_][A-Za-z0-9_\-]{0,31})[ \t]+([^\x00-\x20\x7f]{1,4096})[ \t]+(?:RTSP|HTTP)/(\d{1,2}\.\d{1,2})[ \t\r]*"
)
# What an incomplete first line may look like and still become a request line.
_PARTIAL_REQUEST: Final = re.compile(rb"[A-Za-z_][A-Za-z0-9_\-]{0,31}(?:[ \t][^\x00-\x08\x0a-\x0c\x0e-\x1f\x7f]*)?")
_HEADER_END: Final = re.compile(rb"\n[ \t]*\r?\n")  # the empty line ending the header block (§4)
_DOLLAR: Final = 0x24  # §10.12: "$", channel, 16-bit length, data


class RtspProtocolError(Exception):
    """The server sent something this core cannot accept (malformed, over a limit, out of order).

    Every failure caused by received bytes is this class; the driver closes the connection.
    """


def _decode(raw: bytes) -> str:
    return raw.decode(TEXT_ENCODING, TEXT_ERRORS)


class _HeaderMixin:
    """Case-insensitive header lookup (RFC 2326 §4.2: field names are case-insensitive)."""

    __slots__ = ()
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    def get_all(self, name: str) -> list[str]:
        """Every value of header ``name`` (any case), in order: e.g. several WWW-Authenticate."""
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]

    @property
    def cseq(self) -> int | None:
        """The CSeq header (§12.17) as an int, or None when missing or not a number."""
        value = self.get("CSeq")
        if value is None:
            return None
        value = value.strip()
        if not value.isascii() or not value.isdigit() or len(value) > 10:
            return None
        return int(value)


@dataclass(frozen=True, slots=True)
class RtspResponse(_HeaderMixin):
    """A response from the server (RFC 2326 §7)."""

    version: str  # "1.0" (or "2.0", leniently)
    status: int  # §7.1.1 Status-Code
    reason: str  # Reason-Phrase as sent ("" when missing); never shown to users by this core
    headers: tuple[tuple[str, str], ...]  # in order, repeated names kept
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class RtspRequest(_HeaderMixin):
    """A request the server sent to us (RFC 2326 §6), e.g. GET_PARAMETER or OPTIONS as a keepalive."""

    method: str
    url: str
    version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class InterleavedFrame:
    """One ``$``-framed binary packet on the RTSP connection (RFC 2326 §10.12)."""

    channel: int
    data: bytes


RtspMessage = RtspResponse | RtspRequest | InterleavedFrame


@dataclass(slots=True)
class _Head:
    """A parsed start line and header block waiting for its body."""

    start: RtspResponse | RtspRequest
    head_length: int
    body_length: int


class RtspReader:
    """Incremental parser of the server-to-client byte stream of an RTSP connection."""

    def __init__(
        self,
        *,
        max_start_line: int = MAX_START_LINE,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_headers: int = MAX_HEADERS,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_garbage_bytes: int = MAX_GARBAGE_BYTES,
    ) -> None:
        self.max_start_line = min(max_start_line, max_header_bytes)
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.max_body_bytes = max_body_bytes
        self.max_garbage_bytes = max_garbage_bytes
        self._buffer = bytearray()
        self._head: _Head | None = None
        self._scan_from = 0  # where to resume looking for the end of the header block
        self._garbage_run = 0
        self.skipped_bytes = 0
        """Total garbage bytes skipped while resynchronising (blank lines not counted)."""

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a message."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[RtspResponse | RtspRequest | InterleavedFrame]:
        """Add received bytes; return every message now complete, in stream order.

        Raises :class:`RtspProtocolError` when a limit is passed or a header block is malformed.
        """
        self._buffer += data
        messages: list[RtspResponse | RtspRequest | InterleavedFrame] = []
        while (message := self._next()) is not None:
            messages.append(message)
        return messages

    # ------------------------------------------------------------------ internals

    def _next(self) -> RtspMessage | None:
        buf = self._buffer
        while buf:
            if self._head is not None:
                return self._finish_body(self._head)
            first = buf[0]
            if first == _DOLLAR:
                if len(buf) < 4:
                    return None
                length = int.from_bytes(buf[2:4], "big")
                if len(buf) < 4 + length:
                    return None
                frame = InterleavedFrame(buf[1], bytes(buf[4 : 4 + length]))
                del buf[: 4 + length]
                self._garbage_run = 0
                return frame
            if first in b"\r\n":
                del buf[:1]  # blank lines between messages: harmless, not counted
                continue
            eol = buf.find(b"\n", 0, self.max_start_line + 1)
            if eol < 0:
                if len(buf) > self.max_start_line or not self._plausible_start(bytes(buf[: self.max_start_line])):
                    self._skip_garbage()
                    continue
                return None
            start = self._parse_start_line(bytes(buf[:eol]))
            if start is None:
                self._skip_garbage()
                continue
            head = self._parse_head(start, eol)
            if head is None:
                return None
            self._head = head
        return None

    @staticmethod
    def _plausible_start(partial: bytes) -> bool:
        """Could this incomplete first line still become a status or request line?"""
        prefix = partial[:5]
        if b"RTSP/".startswith(prefix) or b"HTTP/".startswith(prefix):
            return True
        return _PARTIAL_REQUEST.fullmatch(partial) is not None

    @staticmethod
    def _parse_start_line(line: bytes) -> RtspResponse | RtspRequest | None:
        if m := _STATUS_LINE.fullmatch(line):
            reason = _decode(m.group(3) or b"").strip()
            return RtspResponse(_decode(m.group(1)), int(m.group(2)), reason, ())
        if m := _REQUEST_LINE.fullmatch(line):
            return RtspRequest(_decode(m.group(1)).upper(), _decode(m.group(2)), _decode(m.group(3)), ())
        return None

    def _skip_garbage(self) -> None:
        """Drop bytes up to the next plausible message start: ``$``, ``RTSP/`` or a line start."""
        buf = self._buffer
        candidates = [buf.find(b"$", 1), buf.find(b"RTSP/", 1)]
        eol = buf.find(b"\n")
        if eol >= 0:
            candidates.append(eol + 1)
        found = [c for c in candidates if c > 0]
        # Nothing yet: keep a tail that may be the start of "RTSP/" in the next chunk.
        skip = min(found) if found else max(1, len(buf) - 4)
        del buf[:skip]
        self._scan_from = 0
        self.skipped_bytes += skip
        self._garbage_run += skip
        if self._garbage_run > self.max_garbage_bytes:
            raise RtspProtocolError(f"more than {_size(self.max_garbage_bytes)} of unparseable data")

    def _parse_head(self, start: RtspResponse | RtspRequest, eol: int) -> _Head | None:
        buf = self._buffer
        m = _HEADER_END.search(buf, max(eol, self._scan_from), self.max_header_bytes)
        if m is None:
            if len(buf) >= self.max_header_bytes:
                raise RtspProtocolError(f"header block longer than {_size(self.max_header_bytes)}")
            self._scan_from = max(eol, buf.rfind(b"\n"))
            return None
        self._scan_from = 0
        headers: list[tuple[str, str]] = []
        for raw in bytes(buf[eol + 1 : m.start() + 1]).split(b"\n"):
            line = raw.rstrip(b"\r \t")
            if not line:
                continue
            if line[:1] in b" \t":  # obsolete line folding (RFC 2616 §2.2 LWS): continues the value
                if headers:
                    name, value = headers[-1]
                    headers[-1] = (name, f"{value} {_decode(line.strip())}".strip())
                continue
            raw_name, colon, raw_value = line.partition(b":")
            raw_name = raw_name.strip()
            if not colon or not raw_name:
                continue  # not a header line: dropped
            headers.append((_decode(raw_name), _decode(raw_value.strip())))
            if len(headers) > self.max_headers:
                raise RtspProtocolError(f"more than {self.max_headers} header lines")
        body_length = _content_length(headers, self.max_body_bytes)
        if isinstance(start, RtspResponse):
            start = RtspResponse(start.version, start.status, start.reason, tuple(headers))
        else:
            start = RtspRequest(start.method, start.url, start.version, tuple(headers))
        return _Head(start, m.end(), body_length)

    def _finish_body(self, head: _Head) -> RtspMessage | None:
        buf = self._buffer
        end = head.head_length + head.body_length
        if len(buf) < end:
            return None
        body = bytes(buf[head.head_length : end])
        del buf[:end]
        self._head = None
        self._garbage_run = 0
        start = head.start
        if isinstance(start, RtspResponse):
            return RtspResponse(start.version, start.status, start.reason, start.headers, body)
        return RtspRequest(start.method, start.url, start.version, start.headers, body)


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} bytes"


def _content_length(headers: list[tuple[str, str]], limit: int) -> int:
    """RFC 2326 §12.14: the body length; absent means no body."""
    values = {v.strip() for k, v in headers if k.lower() == "content-length"}
    if not values:
        return 0
    if len(values) > 1:
        raise RtspProtocolError("conflicting Content-Length headers")
    value = values.pop()
    if not value.isascii() or not value.isdigit():
        raise RtspProtocolError("invalid Content-Length")
    if len(value) > 10 or int(value) > limit:
        raise RtspProtocolError(f"body longer than {_size(limit)}")
    return int(value)


def _check_field(text: str, what: str) -> None:
    if any(c in text for c in "\r\n\x00"):
        raise ValueError(f"{what} contains a line break or NUL")


def _serialise(start_line: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [start_line]
    for name, value in headers:
        _check_field(name, "header name")
        _check_field(value, f"header {name}")
        if name.lower() == "content-length":
            continue  # computed from the body
        lines.append(f"{name}: {value}")
    if body:
        lines.append(f"Content-Length: {len(body)}")
    text = "\r\n".join(lines) + "\r\n\r\n"
    return text.encode(TEXT_ENCODING, TEXT_ERRORS) + body


def build_request(method: str, url: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """Serialise a request (RFC 2326 §6): ``METHOD url RTSP/1.0``, the headers, CRLF line ends.

    Content-Length is added for a non-empty body. ValueError on a field with CR, LF or NUL, or a
    method or URL with spaces (our own misuse, not the peer's).
    """
    if not method or any(c in method for c in " \t") or not url or any(c in url for c in " \t"):
        raise ValueError("method and URL must be non-empty and without spaces")
    _check_field(method, "method")
    _check_field(url, "URL")
    return _serialise(f"{method} {url} RTSP/1.0", headers, body)


def build_response(status: int, reason: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """Serialise a response (RFC 2326 §7) to a server-to-client request."""
    _check_field(reason, "reason")
    return _serialise(f"RTSP/1.0 {status:03d} {reason}", headers, body)


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_GARBAGE_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_START_LINE",
    "InterleavedFrame",
    "RtspMessage",
    "RtspProtocolError",
    "RtspReader",
    "RtspRequest",
    "RtspResponse",
    "build_request",
    "build_response",
]
