"""Keep one SRT leg alive: reconnecting caller, multi-viewer listener, stats, events.

``SrtLegRunner`` is what an engine input or output driver holds for each SRT leg
(interop.md 2.4; a redundant leg is a second runner). It owns every socket of the
leg and never lets a peer's failure escape: a broken connection is a state change
and an event, and the caller reconnects.

Roles:

* **receive** (an input): give a ``sink``; every message from every connected peer
  is passed to ``sink(view)`` synchronously, in a bounded batch per wake-up. The view
  is into the runner's buffer and valid only during the call (copy to keep it).
* **send** (an output): no sink; the driver calls ``send_nowait(message)``, which
  fans the message out to every connected peer and never awaits. A peer whose send
  buffer is full drops that message (counted per runner in ``messages_dropped``).

Modes: ``caller`` / ``rendezvous`` reconnect with backoff (``BACKOFF_INITIAL_S``
doubling to ``BACKOFF_MAX_S``; the first retry after a lost connection is immediate),
``listener`` accepts up to ``max_peers`` callers and refuses (closes) the rest; an
input holds an extra caller for ``contend_s`` and takes it once a current caller has
been silent for ``STALE_INPUT_S`` (a restarted encoder whose old connection has not
timed out yet).

Dead peers: libsrt 1.5.1 notices a peer that vanished without a shutdown only after
~5 s whatever SRTO_PEERIDLETIMEO says; in the send role a watchdog closes a peer that
answered nothing for ``peer_idle_timeout_secs`` while we were sending.

Leg state (``state``): ``connecting`` until the first connection, ``connected`` while
at least one peer is connected, ``broken`` after the last peer went away (the runner is
retrying or listening again). The flow stays Running throughout: that is the engine's.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from appliance.models.config import SrtLeg

from . import binding as b
from .aio import SinkFn, SrtConnectError, SrtConnectionLost, SrtListener, SrtSocket, srt_connect, srt_listen
from .options import check_supported

_log = logging.getLogger("mediaplane.srt")

BACKOFF_INITIAL_S: Final = 0.25
BACKOFF_MAX_S: Final = 1.5
"""Capped at 1.5 s so a caller is back within 2 s of its peer's return (the issue's bar)."""
STATS_INTERVAL_S: Final = 1.0
RECV_BATCH: Final = 64
"""Messages drained per wake-up before yielding to other tasks."""
STALE_INPUT_S: Final = 1.0
"""An input listener at its caller limit replaces a caller silent this long by a new one."""
CONTEND_S: Final = 5.0
WATCHDOG_INTERVAL_S: Final = 0.25


class SrtLegState(enum.StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    BROKEN = "broken"


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class SrtPeerConnected:
    """A connection came up: the caller connected, or the listener accepted ``peer_addr``."""

    peer_addr: str
    stream_id: str


@dataclass(frozen=True, slots=True)
class SrtPeerDisconnected:
    """A connected peer went away (closed, idle timeout, send failure)."""

    peer_addr: str
    reason: str


@dataclass(frozen=True, slots=True)
class SrtConnectFailed:
    """A caller/rendezvous attempt failed; the runner retries. ``attempt`` counts from 1
    after each outage, so a consumer can report the first failure only."""

    reason: str
    reject_reason: int
    attempt: int


@dataclass(frozen=True, slots=True)
class SrtPeerRefused:
    """The listener closed a caller at once: over ``max_peers``, or a different stream id."""

    peer_addr: str
    reason: str


SrtLegEvent = SrtPeerConnected | SrtPeerDisconnected | SrtConnectFailed | SrtPeerRefused
EventFn = Callable[[SrtLegEvent], None]


def _fmt(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class SrtLegRunner:
    """Run one SRT leg until cancelled. See the module docstring for roles and states.

    ``on_event`` is called synchronously from the runner's tasks: it must not block
    (hand the event to a bounded channel with ``send_nowait``).
    """

    def __init__(
        self,
        leg: SrtLeg,
        *,
        sink: SinkFn | None = None,
        batch_end: Callable[[], None] | None = None,
        max_peers: int = 1,
        on_event: EventFn | None = None,
    ) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be at least 1")
        self.leg = leg
        self._sink = sink
        self._batch_end = batch_end
        """Called after each batch handed to ``sink`` (the engine sends and analyses per batch)."""
        self.max_peers = max_peers if leg.mode == "listener" else 1
        self._on_event = on_event
        self._peers: list[SrtSocket] = []
        self.state = SrtLegState.CONNECTING
        self.last_error: str | None = None
        """The last connect failure or disconnect reason, for the UI; None once connected."""
        # plain int counters (style.md 7)
        self.messages_received = 0
        self.bytes_received = 0
        self.messages_sent = 0
        self.bytes_sent = 0
        self.messages_dropped = 0
        self.connects = 0
        self.disconnects = 0
        self.refused = 0
        self._retired_loss = 0  # totals of connections already gone
        self._retired_retransmits = 0
        self._last_rtt_ms = 0.0
        self._last_rx: dict[int, float] = {}  # socket id → when it last delivered (receive role)
        self._contenders: set[int] = set()
        self.contend_s = CONTEND_S
        """How long an input at its caller limit holds a new caller before refusing it."""
        self._close_reasons: dict[int, str] = {}  # socket id → why the runner closed it
        self._acks: dict[int, tuple[int, int, float]] = {}  # id → (sent, heard, when last heard)
        self._recv_buf = bytearray(b.SRT_LIVE_MAX_PLSIZE)

    # ---- data plane

    @property
    def peer_count(self) -> int:
        return len(self._peers)

    def send_nowait(self, message: bytes | bytearray | memoryview) -> int:
        """Send one message (≤ the leg's payload size, 1316 by default) to every connected
        peer; returns how many took it. Never blocks or awaits. A full send buffer drops
        the message for that peer (``messages_dropped``); a broken peer is dropped from
        the fan-out (its task reports it). No peer: returns 0 and counts nothing.
        """
        taken = 0
        for peer in self._peers:
            try:
                ok = peer.send_nowait(message)
            except (SrtConnectionLost, trio.ClosedResourceError):
                continue  # its peer task wakes on ERR and retires it
            if ok:
                taken += 1
            else:
                self.messages_dropped += 1
        if taken:
            self.messages_sent += 1
            self.bytes_sent += len(message)
        return taken

    # ---- statistics

    def stats(self) -> dict[str, float | int | str]:
        """The leg's SRT statistics (interface: SRT leg statistics).

        ``pkt_loss_total`` and ``pkt_retransmit_total`` count over the runner's life (every
        connection, so they never go back on a reconnect). The rest describes the current
        connection(s): several viewers sum their rates, report the worst ``rtt_ms`` and the
        longest ``uptime_ms``. No peer: zero rates and uptime, the last RTT, the leg state.
        """
        samples = [peer.stats() for peer in self._peers]
        if samples:
            rtt = max(float(s["rtt_ms"]) for s in samples)
        else:
            rtt = self._last_rtt_ms
        return {
            "state": str(self.state),
            "rtt_ms": rtt,
            "send_rate_mbps": sum(float(s["send_rate_mbps"]) for s in samples),
            "recv_rate_mbps": sum(float(s["recv_rate_mbps"]) for s in samples),
            "pkt_loss_total": self._retired_loss + sum(int(s["pkt_loss_total"]) for s in samples),
            "pkt_retransmit_total": self._retired_retransmits + sum(int(s["pkt_retransmit_total"]) for s in samples),
            "uptime_ms": max((int(s["uptime_ms"]) for s in samples), default=0),
        }

    # ---- lifetime

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the leg until cancelled.

        Reports readiness once the configuration is accepted by libsrt and, for a
        listener, once it is bound: option and bind errors come out of
        ``nursery.start()`` (InvalidInput / SrtError). After that nothing escapes but
        bugs: connection failures are states and events.
        """
        check_supported(self.leg)
        listener = None
        if self.leg.mode == "listener":  # outside the nursery: its errors come out unwrapped
            listener = await srt_listen(self.leg, backlog=max(8, self.max_peers))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sample_stats_periodically)
                if self._sink is None:
                    nursery.start_soon(self._watch_unanswered_peers)
                task_status.started()
                if listener is not None:
                    await self._accept_loop(listener, nursery)
                else:
                    await self._caller_loop()
        finally:
            if listener is not None:
                listener.close()
            for peer in list(self._peers):
                peer.close()
            self._peers.clear()

    async def _caller_loop(self) -> None:
        delay = 0.0
        attempt = 0
        while True:
            if delay:
                await trio.sleep(delay)
            attempt += 1
            try:
                sock = await srt_connect(self.leg)
            except b.SrtError as exc:
                reason = exc.message
                reject = exc.reject_reason if isinstance(exc, SrtConnectError) else 0
                self.last_error = reason
                if attempt == 1:
                    _log.warning("SRT %s %s: %s", self.leg.mode, self.leg.remote_addr, reason)
                self._emit(SrtConnectFailed(reason, reject, attempt))
                delay = min(BACKOFF_MAX_S, max(BACKOFF_INITIAL_S, delay * 2))
                continue
            attempt = 0
            delay = 0.0  # after a connection, the first retry is immediate
            await self._serve_peer(sock)

    async def _accept_loop(self, listener: SrtListener, nursery: trio.Nursery) -> None:
        while True:
            sock = await listener.accept()
            if self.leg.stream_id is not None and sock.stream_id != self.leg.stream_id:
                self._refuse(sock, "stream id does not match")
            elif len(self._peers) < self.max_peers or self._replace_a_silent_caller():
                nursery.start_soon(self._serve_peer, sock)
            elif self._sink is not None and len(self._contenders) < self.max_peers:
                self._contenders.add(sock.id)
                nursery.start_soon(self._contend, sock, nursery)
            else:
                self._refuse(sock, f"peer limit {self.max_peers} reached")

    def _refuse(self, sock: SrtSocket, reason: str) -> None:
        peer = _fmt(sock.peer_addr)
        sock.close()
        self.refused += 1
        self._emit(SrtPeerRefused(peer, reason))

    async def _contend(self, sock: SrtSocket, nursery: trio.Nursery) -> None:
        # An input at its limit holds a new caller for up to contend_s, discarding its
        # data, and takes it as soon as a current caller has been silent for
        # STALE_INPUT_S: a restarted encoder calls again while the old connection still
        # delivers its last latency's worth of buffered data.
        deadline = trio.current_time() + self.contend_s
        scratch = bytearray(b.SRT_LIVE_MAX_PLSIZE)
        try:
            while trio.current_time() < deadline:
                if len(self._peers) < self.max_peers or self._replace_a_silent_caller():
                    self._contenders.discard(sock.id)
                    nursery.start_soon(self._serve_peer, sock)
                    return
                try:
                    while sock.recv_nowait_into(scratch):
                        pass
                except SrtConnectionLost:
                    sock.close()  # it gave up first
                    return
                await trio.sleep(0.05)
            self._refuse(sock, f"peer limit {self.max_peers} reached")
        finally:
            if sock.id in self._contenders:
                self._contenders.discard(sock.id)
                sock.close()

    def _replace_a_silent_caller(self) -> bool:
        # An encoder that crashed and restarted calls again while its old connection
        # still looks alive (no shutdown was sent: it breaks only after the peer idle
        # timeout, 30 s by default). An input takes the new caller when an old one has
        # been silent for STALE_INPUT_S; an output cannot tell (viewers send nothing).
        if self._sink is None:
            return False
        now = trio.current_time()
        for peer in self._peers:
            if now - self._last_rx.get(peer.id, now) >= STALE_INPUT_S:
                self._close(peer, f"replaced by a new caller after {STALE_INPUT_S:g} s without data")
                return True
        return False

    async def _serve_peer(self, sock: SrtSocket) -> None:
        peer = _fmt(sock.peer_addr)
        self._peers.append(sock)
        self.connects += 1
        self.state = SrtLegState.CONNECTED
        self.last_error = None
        self._emit(SrtPeerConnected(peer, sock.stream_id))
        reason = "connection closed"
        self._last_rx[sock.id] = trio.current_time()
        try:
            if self._sink is not None:
                await self._receive(sock)
            else:
                await sock.wait_broken()
                reason = self._close_reasons.get(sock.id, "connection broken")
        except SrtConnectionLost as exc:
            reason = exc.message
        except trio.ClosedResourceError:
            if sock.id not in self._close_reasons:
                raise
            reason = self._close_reasons[sock.id]
        finally:
            self._close_reasons.pop(sock.id, None)
            self._acks.pop(sock.id, None)
            self._last_rx.pop(sock.id, None)
            self._retire(sock)
        self.disconnects += 1
        self.last_error = reason
        self._emit(SrtPeerDisconnected(peer, reason))

    def _retire(self, sock: SrtSocket) -> None:
        if sock in self._peers:
            self._peers.remove(sock)
        final = sock.sample_stats()
        self._retired_loss += int(final["pkt_loss_total"])
        self._retired_retransmits += int(final["pkt_retransmit_total"])
        self._last_rtt_ms = float(final["rtt_ms"])
        sock.close()
        if not self._peers and self.state is SrtLegState.CONNECTED:
            self.state = SrtLegState.BROKEN

    async def _receive(self, sock: SrtSocket) -> None:
        buf = self._recv_buf
        view = memoryview(buf)
        sink = self._sink
        assert sink is not None
        last_rx = self._last_rx
        while True:
            got = 0
            while got < RECV_BATCH:
                n = sock.recv_nowait_into(buf)
                if not n:
                    break
                got += 1
                self.messages_received += 1
                self.bytes_received += n
                sink(view[:n])
            if got:
                last_rx[sock.id] = trio.current_time()  # per batch, not per message
                if self._batch_end is not None:
                    self._batch_end()
            if got == RECV_BATCH:
                # A full batch: let other flows run, then drain on without a poller round
                # trip (libsrt's epoll wakes in 10 ms slices; one trip per batch capped a
                # receiver at ~6,000 msgs/s in a first version).
                await trio.lowlevel.checkpoint()
                continue
            await sock.wait_readable()

    def _close(self, peer: SrtSocket, reason: str) -> None:
        # Its task wakes with ClosedResourceError, reports ``reason`` and retires it.
        self._close_reasons[peer.id] = reason
        peer.close()
        if peer in self._peers:
            self._peers.remove(peer)

    async def _watch_unanswered_peers(self) -> None:
        # libsrt breaks a connection whose peer vanished without a shutdown (crash,
        # SIGKILL, cable) only after ~5 s whatever SRTO_PEERIDLETIMEO says (measured:
        # 5.1 s with 1 s configured). While we send, a live receiver ACKs every 10 ms,
        # so data sent but nothing heard for peer_idle_timeout_secs is a dead peer:
        # close it, and a caller reconnects at once.
        timeout = float(self.leg.peer_idle_timeout_secs)
        while True:
            await trio.sleep(WATCHDOG_INTERVAL_S)
            now = trio.current_time()
            for peer in list(self._peers):
                try:
                    perf = b.bistats(peer.id, clear=False)
                except b.SrtError:
                    continue  # gone: its own task reports it
                sent = int(perf.pktSentTotal)
                heard = int(perf.pktRecvACKTotal + perf.pktRecvNAKTotal + perf.pktRecvTotal)
                last = self._acks.get(peer.id)
                if last is None or heard != last[1] or sent == last[0]:
                    self._acks[peer.id] = (sent, heard, now)  # answered, or nothing to answer
                elif now - last[2] >= timeout:
                    self._close(peer, f"no answer from the peer for {timeout:g} s while sending")
                else:
                    self._acks[peer.id] = (sent, heard, last[2])

    async def _sample_stats_periodically(self) -> None:
        # srt_bistats fails once the peer has closed, so sample while it is up.
        while True:
            await trio.sleep(STATS_INTERVAL_S)
            for peer in self._peers:
                peer.sample_stats()

    def _emit(self, event: SrtLegEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
