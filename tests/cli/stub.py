"""A scripted HTTP server on loopback for tests that need no real edge."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Handler = Callable[["Request"], tuple[int, Any]]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Stub:
    url: str
    routes: dict[tuple[str, str], Handler]
    requests: list[Request] = field(default_factory=list)

    def count(self, method: str, path: str) -> int:
        return sum(1 for r in self.requests if (r.method, r.path) == (method, path))


@contextmanager
def stub_server(routes: dict[tuple[str, str], Handler]) -> Iterator[Stub]:
    stub = Stub("", routes)

    class _Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            req = Request(
                self.command,
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                json.loads(raw) if raw else None,
            )
            stub.requests.append(req)
            handler = stub.routes.get((self.command, self.path))
            status, body = handler(req) if handler else (404, {"success": False, "error": f"no route {self.path}"})
            data = json.dumps(body).encode() if not isinstance(body, bytes) else body
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def ok(data: Any) -> Handler:
    return lambda req: (200, {"success": True, "data": data})


def fail(status: int, error: str) -> Handler:
    return lambda req: (status, {"success": False, "error": error})
