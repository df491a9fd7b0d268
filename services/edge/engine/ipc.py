"""Control ↔ engine-worker link: length-prefixed JSON messages over a socketpair.

Framing is ``u32 big-endian length ‖ UTF-8 JSON object``. ``FrameDecoder`` is
sans-IO (bytes in, messages out); ``MessageStream`` is the thin trio driver.

Messages (every request carries an integer ``id``; its reply echoes it):

control → worker: ``start_flow {flow}``, ``stop_flow {flow_id}``,
``add_output {flow_id, output}``, ``remove_output {flow_id, output_id}``,
``shutdown``.

worker → control: ``reply {id, ok, error?}``; ``stats {flows: {flow_id: FlowCounters}}``
every ``STATS_INTERVAL_S`` (the typed contract of ``appliance.models.stats``, validated on
arrival); ``events {events: [Event]}`` (``appliance.models.events``) just before it when
anything happened; ``flow_failed {flow_id, error}`` when a running flow's input dies.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Final

import trio

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
STATS_INTERVAL_S: Final = 0.25
_LEN: Final = struct.Struct("!I")


class FrameError(Exception):
    """The peer sent a frame we cannot read (a bug: the link is internal)."""


def encode_message(message: dict[str, Any]) -> bytes:
    """One frame: length prefix and compact JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"message of {len(body)} bytes exceeds the frame limit")
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    """Sans-IO: feed bytes, take whole messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[dict[str, Any]]:
        """Append received bytes; return every message now complete."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= 4:
            (length,) = _LEN.unpack_from(self._buffer, 0)
            if length > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {length} bytes exceeds the limit")
            if len(self._buffer) < 4 + length:
                break
            body = bytes(self._buffer[4 : 4 + length])
            del self._buffer[: 4 + length]
            try:
                message = json.loads(body)
            except ValueError as exc:
                raise FrameError("frame is not JSON") from exc
            if not isinstance(message, dict):
                raise FrameError("frame is not a JSON object")
            messages.append(message)
        return messages


class MessageStream:
    """trio driver around a stream: send and receive whole messages."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._decoder = FrameDecoder()
        self._ready: list[dict[str, Any]] = []
        self._send_lock = trio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        data = encode_message(message)
        async with self._send_lock:
            await self._stream.send_all(data)

    async def receive(self) -> dict[str, Any] | None:
        """The next message, or None at end of stream."""
        while not self._ready:
            data = await self._stream.receive_some(65536)
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.pop(0)

    async def aclose(self) -> None:
        await self._stream.aclose()
