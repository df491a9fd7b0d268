"""A test HTTP server that keeps every file uploaded to it (the ``hls`` output's peer).

``HttpSink`` runs the standard library's ``ThreadingHTTPServer`` on 127.0.0.1 in a thread:

* ``PUT``/``POST`` store the body under the request path; every version is kept, in arrival
  order, with the request headers (``uploads``); ``latest(path)`` is the newest body.
* ``fail`` decides, per upload, whether to answer 500 instead (the body is then not kept, the
  attempt is still logged with ``status`` 500).
* ``GET`` serves the newest version of an uploaded path, or a file given in ``static``
  (a page, a vendored script), with a content type from the name; 404 otherwise.

Usage::

    with HttpSink(static={"/vendor/hls.min.js": path}) as sink:
        url = sink.url + "/live/"
        ...
        sink.latest("/live/index.m3u8")
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

_TYPES = {
    ".m3u8": "application/vnd.apple.mpegurl",
    ".ts": "video/mp2t",
    ".js": "text/javascript",
    ".html": "text/html; charset=utf-8",
}


@dataclass(frozen=True)
class Upload:
    """One PUT/POST as the sink saw it."""

    method: str
    path: str  # without the query
    query: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int
    at: float  # time.monotonic() when the body was in
    index: int  # arrival order over all uploads


@dataclass
class HttpSink:
    """See the module docstring."""

    static: dict[str, Path | bytes] = field(default_factory=dict)
    fail: Callable[[str, int], bool] | None = None  # (path, index) -> answer 500
    uploads: list[Upload] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _answer(self, status: int, body: bytes = b"", content_type: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _store(self) -> None:
                body = self._body()
                parts = urlsplit(self.path)
                with sink._lock:
                    index = len(sink.uploads)
                    failing = sink.fail is not None and sink.fail(parts.path, index)
                    status = 500 if failing else 201
                    sink.uploads.append(
                        Upload(
                            self.command,
                            parts.path,
                            parts.query,
                            {k.lower(): v for k, v in self.headers.items()},
                            b"" if failing else body,
                            status,
                            time.monotonic(),
                            index,
                        )
                    )
                self._answer(status, b"secret-server-detail" if failing else b"")

            do_PUT = _store
            do_POST = _store

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                suffix = Path(path).suffix
                data = sink.latest(path)
                if data is None and path in sink.static:
                    item = sink.static[path]
                    data = item if isinstance(item, bytes) else item.read_bytes()
                if data is None:
                    self._answer(404, b"not found")
                    return
                self._answer(200, data, _TYPES.get(suffix, "application/octet-stream"))

            do_HEAD = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def stored(self) -> list[Upload]:
        """The successful uploads, in arrival order (a snapshot)."""
        with self._lock:
            return [u for u in self.uploads if u.status < 300]

    def all_uploads(self) -> list[Upload]:
        with self._lock:
            return list(self.uploads)

    def latest(self, path: str) -> bytes | None:
        """The newest stored body of ``path``, or None."""
        with self._lock:
            for upload in reversed(self.uploads):
                if upload.path == path and upload.status < 300:
                    return upload.body
        return None

    def save(self, directory: Path, prefix: str) -> dict[str, Path]:
        """Write the newest version of every stored file under ``prefix`` into ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        out: dict[str, Path] = {}
        for upload in self.stored():
            if upload.path.startswith(prefix):
                target = directory / upload.path[len(prefix) :].lstrip("/")
                target.write_bytes(upload.body)
                out[upload.path] = target
        return out


__all__ = ["HttpSink", "Upload"]
