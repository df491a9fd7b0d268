"""The webrtc worker process: aiortc peers, in asyncio, beside the trio processes.

Started by the control process (``webrtc.supervisor``) as ``python -m services.edge.webrtc.worker
--fd N --socket PATH``. Two links, both in the project's IPC framing (``engine.ipc``: u32 length,
JSON object):

- **the control link** (``--fd``, a socketpair): requests with an ``id``, each answered
  ``reply {id, ok, status?, error?, ...}``:
  ``offer {flow_id, role: whip|whep|watch, sdp}`` -> ``{session_id, sdp, etag}``;
  ``delete {flow_id, role, session_id}``; ``patch {flow_id, role, session_id, if_match, body}``;
  ``watch_open {flow_id}`` -> ``{media_port}``; ``watch_close {flow_id}`` -> ``{}``, or ``{busy: true}``
  (kept) while the watch has viewers; ``shutdown``.
  Unprompted: ``ready`` once, and ``watch_idle {flow_id}`` when a watch's last viewer left (or its
  first viewer's offer was refused).
- **the kinds' socket** (``--socket``, a Unix stream socket in a 0700 directory): each engine
  kind that runs a WebRTC input or output connects, sends ``register {role, flow_id, output_id?,
  config, media_port?}`` and gets ``registered {media_port?}`` or ``refused {error}``; then this
  side pushes ``status {state, active, sessions}`` every second and at each change, and
  ``event {severity, message, details}``. The registration ends with the connection.

Offers for a flow find its registration: a flow that is not running has none (409).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from typing import Any, Final

from services.edge.engine.ipc import FrameDecoder, FrameError, encode_message
from services.edge.webrtc.rtc import install_codecs, install_ice
from services.edge.webrtc.sessions import (
    OfferRefused,
    Registration,
    WatchOutput,
    WhepServerOutput,
    WhipServerInput,
    create_registration,
    open_fanout,
)

_log = logging.getLogger("mediaplane.webrtc")
STATUS_INTERVAL_S: Final = 1.0
OFFER_TIMEOUT_S: Final = 20.0


class Link:
    """One framed connection (asyncio streams)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = FrameDecoder()
        self._ready: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any] | None:
        while not self._ready:
            data = await self.reader.read(65536)
            if not data:
                return None
            self._ready.extend(self._decoder.feed(data))
        return self._ready.pop(0)

    def send(self, message: dict[str, Any]) -> None:
        """Queue ``message`` (asyncio's writer buffers; the peers are local and read promptly)."""
        if not self.writer.is_closing():
            self.writer.write(encode_message(message))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class WebrtcWorker:
    def __init__(self, control: Link) -> None:
        self.control = control
        self.inputs: dict[str, Registration] = {}
        self.outputs: dict[tuple[str, str], Registration] = {}
        self.watches: dict[str, WatchOutput] = {}

    # ------------------------------------------------------------------ the kinds' socket
    async def on_kind(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(reader, writer)
        registration: Registration | None = None
        key: Any = None
        try:
            message = await link.receive()
            if message is None or message.get("op") != "register":
                return
            changed = asyncio.Event()

            def emit(severity: str, text: str, details: dict[str, Any]) -> None:
                link.send({"op": "event", "severity": severity, "message": text, "details": details})

            try:
                registration, extra = await create_registration(message, emit, changed.set)
            except (OfferRefused, KeyError, ValueError, OSError) as exc:
                link.send({"op": "refused", "error": str(exc)})
                return
            flow_id = registration.flow_id
            if message.get("role") == "input":
                key = flow_id
                previous = self.inputs.get(key)
                self.inputs[key] = registration
            else:
                key = (flow_id, str(message.get("output_id")))
                previous = self.outputs.get(key)
                self.outputs[key] = registration
            if previous is not None:
                await previous.close()
            link.send({"op": "registered", **extra})
            link.send(registration.status())
            reading = asyncio.ensure_future(link.receive())
            while True:
                changed.clear()
                waiter = asyncio.ensure_future(changed.wait())
                done, _ = await asyncio.wait(
                    {reading, waiter}, timeout=STATUS_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED
                )
                waiter.cancel()
                if reading in done:
                    break  # the kind closed the link (or sent something it should not): unregister
                if not done:
                    await registration.measure(STATUS_INTERVAL_S)
                link.send(registration.status())
                await writer.drain()
        except (ConnectionError, FrameError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the kind went away, or this worker is stopping
        finally:
            if registration is not None:
                if message is not None and message.get("role") == "input":
                    if self.inputs.get(key) is registration:
                        del self.inputs[key]
                elif self.outputs.get(key) is registration:
                    del self.outputs[key]
                with contextlib.suppress(asyncio.CancelledError):
                    await registration.close()
            link.close()

    # ------------------------------------------------------------------ the control link
    def _target(self, flow_id: str, role: str) -> Registration:
        if role == "whip":
            registration = self.inputs.get(flow_id)
            if not isinstance(registration, WhipServerInput):
                raise OfferRefused(409, "the flow is not running")
            return registration
        if role == "whep":
            for (flow, _output), registration in self.outputs.items():
                if flow == flow_id and isinstance(registration, WhepServerOutput):
                    return registration
            raise OfferRefused(409, "the flow is not running")
        if role == "watch":
            watch = self.watches.get(flow_id)
            if watch is None:
                raise OfferRefused(409, "the flow is not being watched")
            return watch
        raise OfferRefused(400, f"unknown role {role!r}")

    async def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        flow_id = str(message.get("flow_id"))
        role = str(message.get("role"))
        if op == "offer":
            target = self._target(flow_id, role)
            try:
                answer = await asyncio.wait_for(target.offer(str(message.get("sdp", ""))), OFFER_TIMEOUT_S)
            except BaseException:
                if isinstance(target, WatchOutput) and not target.sessions:
                    target.on_idle()  # a refused first viewer: nobody watches, the tap can go
                raise
            return {"status": 201, "session_id": answer.session_id, "sdp": answer.sdp, "etag": answer.etag}
        if op == "delete":
            await self._target(flow_id, role).delete(str(message.get("session_id")))
            return {"status": 200}
        if op == "patch":
            status = await self._target(flow_id, role).patch(
                str(message.get("session_id")), message.get("if_match"), str(message.get("body", ""))
            )
            return {"status": status}
        if op == "watch_open":
            return {"media_port": await self._watch_open(flow_id)}
        if op == "watch_close":
            watch = self.watches.get(flow_id)
            if watch is not None and watch.sessions:
                return {"busy": True}  # a viewer came after the idle notice: the watch stays
            self.watches.pop(flow_id, None)
            if watch is not None:
                await watch.close()
            return {}
        raise OfferRefused(400, f"unknown command {op!r}")

    async def _watch_open(self, flow_id: str) -> int:
        watch = self.watches.get(flow_id)
        if watch is not None:
            return int(watch.media_port)
        fanout, port = await open_fanout(video_only=False)

        def idle() -> None:
            self.control.send({"op": "watch_idle", "flow_id": flow_id})

        def nothing(*_args: Any) -> None:
            return None

        watch = WatchOutput(flow_id, fanout, nothing, lambda: None, idle)
        watch.media_port = port
        self.watches[flow_id] = watch
        return port

    async def answer(self, message: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"op": "reply", "id": message.get("id"), "ok": True}
        try:
            reply.update(await self.handle(message))
        except OfferRefused as exc:
            reply.update(ok=False, status=exc.status, error=str(exc), headers=exc.headers)
        except TimeoutError:
            reply.update(ok=False, status=504, error="the WebRTC session did not set up in time")
        except Exception as exc:
            _log.exception("command %s failed", message.get("op"))
            reply.update(ok=False, status=500, error=f"webrtc worker error ({type(exc).__name__})")
        self.control.send(reply)

    async def serve_control(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        while True:
            message = await self.control.receive()
            if message is None or message.get("op") == "shutdown":
                break
            task = asyncio.ensure_future(self.answer(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def close(self) -> None:
        for registration in [*self.inputs.values(), *self.outputs.values(), *self.watches.values()]:
            with contextlib.suppress(Exception):
                await registration.close()


async def _main(fd: int, socket_path: str) -> None:
    install_codecs()
    install_ice()
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    worker = WebrtcWorker(Link(reader, writer))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = await asyncio.start_unix_server(worker.on_kind, path=socket_path)
    os.chmod(socket_path, 0o600)
    worker.control.send({"op": "ready"})
    try:
        await worker.serve_control()
    except (ConnectionError, FrameError):
        pass  # the control process went away: so do we
    finally:
        server.close()
        await worker.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mediaplane-webrtc-worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--socket", required=True, help="the Unix socket the engine kinds register on")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s webrtc %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # aiortc and aioice log every ICE check and DTLS step at INFO.
    for noisy in ("aioice", "aiortc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the control process stops us, not the console
    asyncio.run(_main(args.fd, args.socket))


if __name__ == "__main__":
    main()
