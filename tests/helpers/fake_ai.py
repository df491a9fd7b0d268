"""A local stand-in for an AI provider: answers in OpenAI's, Anthropic's or Gemini's JSON shape.

Usage::

    with FakeAi("anthropic") as fake:      # listens on 127.0.0.1, a free port
        env = {"MEDIAPLANE_ANTHROPIC_BASE_URL": fake.base_url}
        fake.reply_text = '{"action": "info", "message": "hi"}'
        ...
        seen = fake.requests[-1]           # path, query, headers (lower-case names), JSON body

``status`` makes it answer that status with an error body; ``garbage`` answers 200 with a body
that is not JSON; ``delay_s`` holds the answer back (a closing server wakes held answers).
It runs in a thread, so it serves sync tests and trio tests alike.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

Provider = Literal["openai", "anthropic", "gemini"]


@dataclass
class SeenRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


def reply_body(provider: Provider, text: str) -> dict[str, Any]:
    """A successful reply carrying ``text`` at the provider's reply path."""
    if provider == "openai":
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    if provider == "anthropic":
        return {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
        }
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}]}


@dataclass
class FakeAi:
    provider: Provider
    reply_text: str = '{"action": "info", "message": "fake"}'
    status: int = 200
    garbage: bool = False
    delay_s: float = 0.0
    raw_body: bytes | None = None
    """When set, answered as is with status 200 (a reply missing the expected path)."""
    requests: list[SeenRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _closing: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeAi:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                parts = urlsplit(self.path)
                fake.requests.append(
                    SeenRequest("POST", parts.path, parts.query, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                if fake.delay_s and fake._closing.wait(fake.delay_s):
                    return
                if fake.raw_body is not None:
                    self._send(200, fake.raw_body)
                elif fake.garbage:
                    self._send(200, b"<html>definitely not json")
                elif fake.status != 200:
                    self._send(fake.status, json.dumps({"error": {"message": "fake failure"}}).encode())
                else:
                    self._send(200, json.dumps(reply_body(fake.provider, fake.reply_text)).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
