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

import itertools
import json
import logging
import socket
import struct
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio
from pydantic import ValidationError

from appliance.models.events import Event

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


# --------------------------------------------------------------------------- a worker process
class WorkerLinkError(Exception):
    """A request got no reply. ``reason``: ``restarting`` (the worker is gone), ``unreachable``
    (the link broke while sending) or ``no_answer`` (no reply in time, or the worker died)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: dict[str, Any] | None = None


class WorkerProcess:
    """One worker process (``python -m MODULE --fd N ARGS``) and its request/reply link: what the
    engine's and the tunnels' supervisors share. Requests carry an integer ``id`` that the
    worker's ``reply`` echoes; every other message goes to the reader's callback."""

    def __init__(self, process: trio.Process, link: MessageStream) -> None:
        self.process = process
        self.link = link
        self.alive = True
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)

    @classmethod
    async def spawn(cls, module: str, args: list[str]) -> WorkerProcess:
        """Start the worker with one end of a fresh socketpair passed as ``--fd``. It runs in a
        session of its own: a Ctrl-C at the console reaches the control process only, which
        stops the workers in order (they also exit on EOF if it dies)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", module, "--fd", str(child.fileno()), *args],
                pass_fds=(child.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return cls(process, MessageStream(trio.SocketStream(trio.socket.from_stdlib_socket(parent))))

    async def wait_ready(self, timeout: float) -> bool:
        """The worker's first message ("ready") within ``timeout``; False at EOF or timeout."""
        with trio.move_on_after(timeout):
            try:
                return await self.link.receive() is not None
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return False
        return False

    async def read(self, on_message: Callable[[dict[str, Any]], None]) -> None:
        """Deliver replies to their requests and every other message to ``on_message``, until
        the link ends."""
        while True:
            try:
                message = await self.link.receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, FrameError):
                return
            if message is None:
                return
            if message.get("op") == "reply":
                pending = self._pending.pop(int(message.get("id", -1)), None)
                if pending is not None:
                    pending.reply = message
                    pending.done.set()
            else:
                on_message(message)

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``message`` and wait for its reply (``ok`` and ``error`` are the caller's to read)."""
        if not self.alive:
            raise WorkerLinkError("restarting")
        request_id = next(self._ids)
        pending = _Pending()
        self._pending[request_id] = pending
        try:
            await self.link.send({**message, "id": request_id})
            with trio.move_on_after(timeout):
                await pending.done.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise WorkerLinkError("unreachable") from exc
        finally:
            self._pending.pop(request_id, None)
        if pending.reply is None:
            raise WorkerLinkError("no_answer")
        return pending.reply

    async def send_unanswered(self, message: dict[str, Any]) -> None:
        """Send without waiting for the reply (idempotent commands such as a stop); a broken
        link is ignored: the worker is gone and runs nothing."""
        if not self.alive:
            return
        try:
            await self.link.send({**message, "id": next(self._ids)})
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    def mark_dead(self) -> None:
        """The link ended: every request still waiting is answered with no reply."""
        self.alive = False
        for pending in self._pending.values():
            pending.done.set()

    async def close(self) -> None:
        """Close the link and reap the process (killed after 2 s); safe under cancellation."""
        self.mark_dead()
        with trio.CancelScope(shield=True):
            await self.link.aclose()
            await terminate(self.process)


async def terminate(process: trio.Process) -> None:
    """Wait up to 2 s for ``process`` to exit (it exits on EOF or ``shutdown``), then kill it."""
    with trio.move_on_after(2):
        await process.wait()
        return
    process.kill()
    await process.wait()


# --------------------------------------------------------------------------- the worker's side
CommandHandler = Callable[[dict[str, Any]], Awaitable[None]]


async def serve_commands(
    link: MessageStream,
    handlers: Mapping[str, CommandHandler],
    *,
    refused: tuple[type[BaseException], ...],
    refusal_text: Callable[[BaseException], str],
    internal_text: Callable[[BaseException], str],
    log: logging.Logger,
    log_traceback: bool = True,
) -> None:
    """A worker's command loop: each request answered ``reply {id, ok, error?}``, until
    ``shutdown`` or the end of the link. An exception of ``refused`` is the command's refusal
    (``refusal_text`` says why); any other is a bug, logged, answered with ``internal_text``,
    and the worker runs on (the command boundary). ``log_traceback`` false keeps the exception's
    text out of the log too (it may quote a secret)."""
    while True:
        message = await link.receive()
        if message is None or message.get("op") == "shutdown":
            return
        handler = handlers.get(str(message.get("op")))
        reply: dict[str, Any] = {"op": "reply", "id": message.get("id"), "ok": True}
        if handler is None:
            reply.update(ok=False, error=f"unknown command {message.get('op')!r}")
        else:
            try:
                await handler(message)
            except refused as exc:
                reply.update(ok=False, error=refusal_text(exc))
            except Exception as exc:
                trace = exc if log_traceback else None
                log.error("command %s failed (%s)", message.get("op"), type(exc).__name__, exc_info=trace)
                reply.update(ok=False, error=internal_text(exc))
        await link.send(reply)


def deliver_events(
    raws: object, on_event: Callable[[Event], object], on_invalid: Callable[[ValidationError], None]
) -> None:
    """A worker's ``events`` message: each event validated against the one contract
    (``appliance.models.events``) and handed on; one that does not validate goes to ``on_invalid``."""
    for raw in raws if isinstance(raws, list) else []:
        try:
            event = Event.model_validate(raw)
        except ValidationError as exc:
            on_invalid(exc)
            continue
        on_event(event)
