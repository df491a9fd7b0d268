"""The ``rtmp`` output kind: push the flow's MPEG-TS to an RTMP/RTMPS server (interop.md 2.5).

The flow offers raw TS; ``offer`` appends it to a bounded queue and never waits (a full queue
drops the new datagram and counts it, interop.md 11). The connection task opens TCP (``rtmp://``,
port 1935 by default) or TLS over TCP (``rtmps://``, port 443 by default; the server certificate
is checked against the system CA store, as ``ssl.create_default_context()`` does for the manager
link: the config has no switch to skip that), runs the RTMP handshake, ``connect`` (app = the
URL's path, tcUrl = the URL) and ``publish(stream_key)`` through the sans-IO
``RtmpClientConnection``, then demuxes the queue (``core.mux.to_flv.TsToFlv``: nothing before the
first video keyframe, sequence headers first) and sends FLV tags. A server that reads slowly
blocks only this task: the queue absorbs, then drops; a write stuck for ``WRITE_STALL_S`` ends
the connection (then reconnect).

Trouble is the output's ``state`` (``connecting``/``connected``/``reconnecting``/``failed``) and
``rtmp`` events, never a flow failure: the first failed attempt after a connection and every
disconnect is a warning, a connection an info, giving up (``max_reconnect_attempts`` retries
in a row failed; None retries forever) a critical. The stream key is a secret: it appears in no
log line, event or state text (every text is passed through ``redact``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import trio

from appliance.models.config import RtmpOutput
from appliance.models.events import Event, EventCategory, critical, info, warning
from services.edge.core.mux.to_flv import FlvTag, TsToFlv
from services.edge.core.rtmp import (
    ConnectionClosed,
    ErrorReceived,
    ProtocolError,
    PublishStarted,
    RtmpClientConnection,
    VideoTag,
)
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.kinds.dial import DialError, dial
from services.edge.engine.kinds.offered import OfferedTs, OfferedTsOutput
from services.edge.engine.udp import FlowStartError

_log = logging.getLogger("mediaplane.engine")

DEFAULT_PORTS: Final = {"rtmp": 1935, "rtmps": 443}
QUEUE_MAX_BYTES: Final = 8 * 1024 * 1024  # ~8 s at 8 Mbit/s, then new datagrams are dropped
CONNECT_TIMEOUT_S: Final = 10.0  # TCP + TLS + RTMP handshake + connect + publish
RECEIVE_SIZE: Final = 65536
BATCH_DATAGRAMS: Final = 256  # TS datagrams converted per write (~340 kB)
WRITE_STALL_S: Final = 30.0  # a server that takes nothing for this long is gone (a dead peer, no RST)
CLOSE_GRACE_S: Final = 1.0  # FCUnpublish/deleteStream on close, best effort


class RtmpPushError(Exception):
    """A connection attempt or a running push failed (the text is already redacted)."""


@dataclass(frozen=True, slots=True)
class RtmpTarget:
    """Where to push: from ``dest_url`` (the key is not part of it)."""

    scheme: str
    host: str
    port: int
    app: str
    tc_url: str

    @property
    def tls(self) -> bool:
        return self.scheme == "rtmps"

    @property
    def display(self) -> str:
        """``rtmp(s)://host:port/app`` for events and logs (no user info, no query)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/{self.app.split('?', 1)[0]}"


def parse_target(dest_url: str) -> RtmpTarget:
    """The target of an ``rtmp://`` / ``rtmps://`` URL; ValueError when it has no host or app."""
    parts = urlsplit(dest_url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError("dest_url must be rtmp:// or rtmps://")
    host = parts.hostname
    if not host:
        raise ValueError("dest_url has no host")
    port = parts.port or DEFAULT_PORTS[scheme]
    app = parts.path.strip("/")
    if not app:
        raise ValueError("dest_url has no application path (rtmp://host/app)")
    if parts.query:
        app = f"{app}?{parts.query}"  # librtmp/FFmpeg: the query travels with the app name
    tc_url = urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), parts.query, ""))
    return RtmpTarget(scheme, host, port, app, tc_url)


class RtmpOutputDriver(OfferedTsOutput):
    """An ``rtmp`` output: one push connection, reconnected after ``reconnect_delay_secs``."""

    def __init__(self, config: RtmpOutput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.output_id = config.id
        self._key = config.stream_key
        try:
            self.target = parse_target(config.dest_url)
        except ValueError as exc:
            raise FlowStartError(f"output {config.id!r}: {exc}") from None
        self.state = "connecting"
        self.packets_sent = 0  # TS datagrams handed to the converter on a live connection
        self.bytes_sent = 0  # octets written to the connection (RTMP, before TLS)
        self.connections = 0
        self.offered = OfferedTs(QUEUE_MAX_BYTES)  # a gap in it: the converter resumes at a keyframe
        self._accepting = False  # only a publishing connection queues: a new one starts at a keyframe
        self._writing = False
        self._scope = trio.CancelScope()

    # ------------------------------------------------------------------ the flow's side

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ready at once (TS offered before the push is up is not queued); then connect and push."""
        with self._scope:
            task_status.started()
            await self._run()

    def offer(self, datagram: bytes | None, payload: memoryview, arrival: float) -> None:
        """Queue the TS for the push task; never waits (a full queue drops the datagram, counted)."""
        if not self._accepting:
            return
        self.offered.put(payload)

    def close(self) -> None:
        self._accepting = False
        self._scope.cancel()

    def dropped(self) -> int:
        return self.offered.dropped_datagrams  # datagrams, as ``packets_sent`` counts them

    # ------------------------------------------------------------------ texts

    def redact(self, text: str) -> str:
        """``text`` with the stream key replaced (it is a secret)."""
        return text.replace(self._key, "***") if self._key else text

    def _event(self, make: Callable[..., Event], message: str) -> None:
        self.flow.publish(
            make(
                EventCategory.RTMP,
                self.redact(f"RTMP output {self.output_id}: {message}"),
                flow_id=self.flow.flow_id,
                output_id=self.output_id,
            )
        )

    # ------------------------------------------------------------------ the push

    async def _run(self) -> None:
        retries = 0  # reconnect attempts since the last successful publish
        max_retries = self.config.max_reconnect_attempts
        announced = False  # a warning went out for this outage
        while True:
            self.state = "connecting" if self.connections == 0 and retries == 0 else "reconnecting"
            try:
                published, reason = await self._push_once()
            except RtmpPushError as exc:
                published, reason = False, str(exc)
            finally:
                self._stop_accepting()
            if published:
                retries = 0
                self._event(warning, f"disconnected from {self.target.display} ({reason}); reconnecting")
                announced = True
            elif not announced:
                self._event(warning, f"connection to {self.target.display} failed ({reason})")
                announced = True
            else:
                _log.debug("flow %s rtmp output %s: %s", self.flow.flow_id, self.output_id, self.redact(reason))
            if max_retries is not None and retries >= max_retries:
                self.state = "failed"
                self._event(
                    critical,
                    f"giving up on {self.target.display} after {retries} reconnect attempt(s) ({reason})",
                )
                await trio.sleep_forever()
            self.state = "reconnecting"
            await trio.sleep(self.config.reconnect_delay_secs)
            retries += 1
            if published:
                announced = False  # the next failure (if any) is worth a warning again

    def _stop_accepting(self) -> None:
        self._accepting = False
        self.offered.clear()

    async def _open(self) -> trio.abc.Stream:
        try:
            stream, _ = await dial(self.target.host, self.target.port, tls=self.target.tls)
        except DialError as exc:
            raise RtmpPushError(str(exc)) from None
        return stream

    async def _push_once(self) -> tuple[bool, str]:
        """One connection: connect and publish (RtmpPushError when that fails), then push until it
        breaks: answers (True, why it ended)."""
        client = RtmpClientConnection(app=self.target.app, tc_url=self.target.tc_url, fourcc_list=("hvc1",))
        client.publish(self._key)
        with trio.move_on_after(CONNECT_TIMEOUT_S) as connect_scope:
            stream = await self._open()
        if connect_scope.cancelled_caught:
            raise RtmpPushError(f"no connection within {CONNECT_TIMEOUT_S:g} s")
        try:
            with trio.move_on_after(CONNECT_TIMEOUT_S) as publish_scope:
                await self._until_published(stream, client)
            if publish_scope.cancelled_caught:
                raise RtmpPushError(f"the server did not start the publish within {CONNECT_TIMEOUT_S:g} s")
            self.connections += 1
            self.state = "connected"
            self._event(info, f"connected to {self.target.display}, publishing")
            converter = TsToFlv()
            self._accepting = True
            failures: list[str] = []
            lock = trio.StrictFIFOLock()
            try:
                async with trio.open_nursery() as nursery:

                    async def guarded(run: Callable[[], Awaitable[None]]) -> None:
                        try:
                            await run()
                        except RtmpPushError as exc:
                            failures.append(str(exc))
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(guarded, partial(self._receive, stream, client, lock))
                    nursery.start_soon(guarded, partial(self._send_loop, stream, client, converter, lock))
            finally:
                self._accepting = False
                if not failures:  # cancelled (the output closes): say goodbye
                    await self._goodbye(stream, client, converter)
            return True, failures[0] if failures else "closed"
        finally:
            await trio.aclose_forcefully(stream)

    async def _until_published(self, stream: trio.abc.Stream, client: RtmpClientConnection) -> None:
        await self._write(stream, client)
        while True:
            data = await self._read(stream)
            try:
                events = client.receive_data(data)
            except ProtocolError as exc:
                raise RtmpPushError(f"protocol error: {exc}") from None
            await self._write(stream, client)
            for event in events:
                if isinstance(event, PublishStarted):
                    return
                if isinstance(event, ErrorReceived):
                    raise RtmpPushError(f"the server refused: {event.code} {event.description}".strip())
                if isinstance(event, ConnectionClosed):
                    raise RtmpPushError("the server closed the connection")

    async def _read(self, stream: trio.abc.Stream) -> bytes:
        try:
            return bytes(await stream.receive_some(RECEIVE_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise RtmpPushError(f"receive failed: {exc}") from None

    async def _write(self, stream: trio.abc.Stream, client: RtmpClientConnection) -> None:
        data = client.data_to_send()
        if not data:
            return
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise RtmpPushError(f"send failed: {exc.__cause__ or exc}") from None
        self.bytes_sent += len(data)

    async def _receive(self, stream: trio.abc.Stream, client: RtmpClientConnection, lock: trio.StrictFIFOLock) -> None:
        """Acks, pings and errors from the server while pushing."""
        while True:
            data = await self._read(stream)
            try:
                events = client.receive_data(data)
            except ProtocolError as exc:
                raise RtmpPushError(f"protocol error: {exc}") from None
            async with lock:
                await self._write(stream, client)
            for event in events:
                if isinstance(event, ConnectionClosed):
                    raise RtmpPushError("the server closed the connection")
                if isinstance(event, ErrorReceived):
                    raise RtmpPushError(f"the server sent an error: {event.code} {event.description}".strip())

    async def _send_loop(
        self, stream: trio.abc.Stream, client: RtmpClientConnection, converter: TsToFlv, lock: trio.StrictFIFOLock
    ) -> None:
        offered = self.offered
        while True:
            await offered.wait()
            while offered.chunks:
                # Convert what is queued (at most a bounded batch), then one write for all of it.
                for _ in range(min(len(offered.chunks), BATCH_DATAGRAMS)):
                    chunk = offered.pop()
                    if chunk is None:
                        converter.gap()
                        continue
                    self.packets_sent += 1
                    self._send_tags(client, converter.feed(chunk))
                async with lock:
                    self._writing = True
                    with trio.move_on_after(WRITE_STALL_S) as stall:
                        await self._write(stream, client)  # the queue keeps filling meanwhile (offer never waits)
                    if stall.cancelled_caught:
                        raise RtmpPushError(f"the server has not read anything for {WRITE_STALL_S:g} s")
                    self._writing = False

    @staticmethod
    def _send_tags(client: RtmpClientConnection, tags: list[FlvTag]) -> None:
        for tag in tags:
            if isinstance(tag.tag, VideoTag):
                client.send_video(tag.timestamp, tag.tag)
            else:
                client.send_audio(tag.timestamp, tag.tag)

    async def _goodbye(self, stream: trio.abc.Stream, client: RtmpClientConnection, converter: TsToFlv) -> None:
        """The tags the converter still holds, then FCUnpublish + deleteStream; best effort, bounded."""
        if self._writing:
            return  # a write was cut short: more octets would not make a valid message
        with trio.move_on_after(CLOSE_GRACE_S, shield=True):
            try:
                if client.publishing:
                    self._send_tags(client, converter.flush())
                    client.unpublish()
                data = client.data_to_send()
                if data:
                    await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError, RuntimeError):
                pass


__all__ = ["RtmpOutputDriver", "RtmpPushError", "RtmpTarget", "parse_target"]
