"""The RTMPS listener's TLS context, in the worker process (interop.md 2.3).

An ``rtmp`` input with ``tls: true`` speaks RTMPS only, with the edge's certificate. The
worker has no config directory of its own: the control process names the certificate and key
files in the ``start_flow`` command (``rtmp_tls``: ``{"cert_path", "key_path"}``), which the
worker hands to :func:`configure`. Without them (no ``rtmp_tls`` in the command) the worker
makes a self-signed certificate once, in memory, for its lifetime: RTMPS still works (clients
must not verify, e.g. ``ffmpeg -tls_verify 0``) but the certificate changes with every worker.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Any

from appliance.tls_cert import generate_self_signed
from services.edge.engine.udp import FlowStartError

_log = logging.getLogger("mediaplane.engine")
_files: tuple[str, str] | None = None
_context: ssl.SSLContext | None = None


def configure(message: Any) -> None:
    """Take the ``rtmp_tls`` entry of a start command (a dict with the two paths, or None)."""
    global _files, _context
    files = None
    if isinstance(message, dict) and message.get("cert_path") and message.get("key_path"):
        files = (str(message["cert_path"]), str(message["key_path"]))
    if files is not None and files != _files:
        _files, _context = files, None


def server_context() -> ssl.SSLContext:
    """The context every RTMPS listener of this worker serves (FlowStartError when unusable)."""
    global _context
    if _context is not None:
        return _context
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if _files is not None:
            context.load_cert_chain(_files[0], _files[1])
        else:
            _load_ephemeral(context)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise FlowStartError(f"RTMPS: cannot load the edge's certificate: {exc}") from exc
    _context = context
    return context


def _load_ephemeral(context: ssl.SSLContext) -> None:
    cert_pem, key_pem = generate_self_signed(socket.gethostname(), [], dt.datetime.now(dt.UTC))
    with tempfile.TemporaryDirectory(prefix="mp-rtmps-") as tmp:
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert.write_bytes(cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        context.load_cert_chain(str(cert), str(key))
    _log.info("RTMPS: no certificate given to this worker; serving a self-signed one made in memory")


def reset() -> None:
    """Forget the files and the context (tests)."""
    global _files, _context
    _files, _context = None, None
