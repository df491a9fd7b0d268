"""A minimal HTTP/1.1 client for `mp`: one request per connection, `Connection: close`.

Why not `http.client`: it imports the `email` package to parse headers, and
`ssl` even for plain http; with `encodings.idna` (pulled in by resolving a str
host) that is about 30 ms of every `mp` start on this machine, a quarter of the
budget of `mp flow list` (bench/cli_start.py). `mp` talks to one known server,
sends small JSON bodies and reads small JSON answers, so this is enough:

- the request always carries `Content-Length` (or no body) and `Connection: close`;
- the answer is read up to `Content-Length`, through `Transfer-Encoding: chunked`,
  or to EOF (RFC 9112 §6.3); a `1xx` interim answer is skipped;
- `https://` wraps the socket with `ssl.create_default_context()` (imported then only).

`parse_response()` is sans-IO (bytes in, a `RawResponse` or None out) and is
tested with canned bytes; `request()` is the thin socket driver around it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Final

MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
"""A whole configuration with 1024 flows fits many times over; more is a broken peer."""


class ProtocolError(Exception):
    """The peer did not answer with well-formed HTTP/1.x."""


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    reason: str
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its last value."""
    body: bytes


def parse_response(data: bytes, *, eof: bool) -> RawResponse | None:
    """The response in `data` if complete (None: read more). Raises ProtocolError.

    With `eof`, a body without a length ends where the data ends (RFC 9112 §6.3 item 8).
    """
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            if eof:
                raise ProtocolError("the answer ended inside its header")
            return None
        lines = data[:head_end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError("a header line without a colon")
            headers[name.strip().lower()] = value.strip()
        rest = data[head_end + 4 :]
        if 100 <= status < 200:  # RFC 9112 §4: an interim answer; the real one follows
            data = rest
            continue
        break
    reason = parts[2] if len(parts) > 2 else ""
    if status in (204, 304):
        return RawResponse(status, reason, headers, b"")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(rest)
        if body is None:
            if eof:
                raise ProtocolError("the answer ended inside a chunk")
            return None
        return RawResponse(status, reason, headers, body)
    length_text = headers.get("content-length")
    if length_text is not None:
        if not length_text.isdigit():
            raise ProtocolError("a bad Content-Length")
        length = int(length_text)
        if len(rest) < length:
            if eof:
                raise ProtocolError("the answer ended before its Content-Length")
            return None
        return RawResponse(status, reason, headers, rest[:length])
    return RawResponse(status, reason, headers, rest) if eof else None


def _dechunk(data: bytes) -> bytes | None:
    """The body of a complete chunked encoding, or None when more is needed (RFC 9112 §7.1)."""
    body = bytearray()
    pos = 0
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size_text = data[pos:line_end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError("a bad chunk size") from None
        pos = line_end + 2
        if size == 0:
            # trailer section: zero or more field lines, then an empty line
            end = data.find(b"\r\n", pos) if data[pos : pos + 2] == b"\r\n" else data.find(b"\r\n\r\n", pos)
            return bytes(body) if end >= 0 else None
        if len(data) < pos + size + 2:
            return None
        body += data[pos : pos + size]
        pos += size + 2


def request(
    method: str,
    host: str,
    port: int,
    target: str,
    *,
    headers: dict[str, str],
    body: bytes | None,
    timeout_s: float,
    tls: bool,
) -> RawResponse:
    """Send one request and read the whole answer. Raises OSError (incl. TimeoutError) or ProtocolError.

    `timeout_s` bounds the connect and every wait for data.
    """
    # A bytes host skips the idna codec that resolving a str host imports; IPs and ASCII names are the rule.
    address: str | bytes = host.encode("ascii") if host.isascii() else host
    sock = socket.create_connection((address, port), timeout=timeout_s)  # type: ignore[arg-type]  # bytes work
    try:
        if tls:
            import ssl

            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        host_header = f"[{host}]" if ":" in host else host
        default_port = 443 if tls else 80
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}" + ("" if port == default_port else f":{port}")]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: close")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                done = parse_response(data, eof=True)
                assert done is not None
                return done
            data += chunk
            if len(data) > MAX_RESPONSE_BYTES:
                raise ProtocolError("the answer is too large")
            done = parse_response(data, eof=False)
            if done is not None:
                return done
    finally:
        sock.close()
