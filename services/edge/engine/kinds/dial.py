"""Dialling a server for the kinds that pull or push over TCP (``rtmp`` output, ``rtsp`` input):
TCP, and TLS on top for ``rtmps://`` / ``rtsps://``.

The server's certificate is checked against the system CA store, as
``ssl.create_default_context()`` does for the manager link (``SSL_CERT_FILE``/``SSL_CERT_DIR``
honoured): no config switch skips that. Failures are ``DialError`` with a short text for an
event ("TCP connect failed: Connection refused", "TLS handshake failed: certificate verify
failed..."), never a traceback.
"""

from __future__ import annotations

import ssl

import trio


class DialError(Exception):
    """The connection could not be made; ``str()`` says why, for an event."""


async def dial(host: str, port: int, *, tls: bool) -> tuple[trio.abc.Stream, trio.SocketStream]:
    """``(stream, tcp)``: the stream to speak on (the TLS one when ``tls``) and the TCP under it
    (its socket has the addresses)."""
    try:
        tcp = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        raise DialError(f"TCP connect failed: {exc.strerror or exc}") from None
    if not tls:
        return tcp, tcp
    context = ssl.create_default_context()  # the system CA store (SSL_CERT_FILE/DIR honoured)
    stream = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
    try:
        await stream.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
        await trio.aclose_forcefully(tcp)
        cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
        detail = getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or str(cause)
        raise DialError(f"TLS handshake failed: {detail}") from None
    return stream, tcp


__all__ = ["DialError", "dial"]
