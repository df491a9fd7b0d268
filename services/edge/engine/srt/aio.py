"""libsrt under trio: one poller thread, non-blocking SRT sockets, async waits.

libsrt sockets are not OS file descriptors, so trio's own I/O manager cannot watch
them. Instead, each trio run gets one **poller thread** (created on first use, stopped
when the run ends) blocked in ``srt_epoll_uwait`` on one SRT epoll set, GIL released.

The epoll subscriptions are **level-triggered with one-shot re-arm** (libsrt's
edge-triggered mode lost wake-ups under load; measured before this module was written):

* every socket is subscribed once, "parked" on ``SRT_EPOLL_UPDATE`` only, an event a
  plain socket never raises. A parked subscription keeps libsrt's readiness state;
* a task that would block arms the socket (``srt_epoll_update_usock`` with IN or OUT,
  plus ERR) and sleeps. libsrt re-checks the saved state on every update, so data
  that arrived between the failed call and the arming still produces an event;
* the poller reports, parks the socket again (so a readable socket nobody reads
  cannot spin the poller) and wakes the task through ``TrioToken.run_sync_soon``.

The epoll set has ``SRT_EPOLL_ENABLE_EMPTY``: without it an empty set makes
``srt_epoll_uwait`` fail at once, and a retry loop would spin a core. libsrt's wait
itself sleeps on a condition variable in 10 ms slices: an idle process costs
~nothing (``test_aio.py`` measures it).

Data-plane calls (``send_nowait``, ``recv_nowait_into``) never block and never await.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import threading
from collections.abc import Callable
from typing import Final

import trio

from appliance.models.config import SrtLeg, split_host_port

from . import binding as b
from .options import apply_options

_log = logging.getLogger("mediaplane.srt")

# A socket nobody waits on is watched for this only: never raised for a plain socket.
_PARKED: Final = b.SRT_EPOLL_UPDATE
_UWAIT_TIMEOUT_MS: Final = 200  # how soon the poller notices a stop request
_UWAIT_BATCH: Final = 256

STATS_MAX_AGE_S: Final = 1.0
"""``SrtSocket.stats()`` re-samples libsrt when its cached sample is older than this."""

_BROKEN_STATES: Final = frozenset({b.SRTS_BROKEN, b.SRTS_CLOSING, b.SRTS_CLOSED, b.SRTS_NONEXIST})
_LOST_CODES: Final = frozenset({b.SRT_ECONNLOST, b.SRT_ENOCONN, b.SRT_EINVSOCK})


class SrtConnectError(b.SrtError):
    """A caller or rendezvous connection failed; ``reject_reason`` is libsrt's SRT_REJ_* code."""

    def __init__(self, message: str, code: int, reject_reason: int) -> None:
        super().__init__(message, code)
        self.reject_reason = reject_reason


class SrtConnectionLost(b.SrtError):
    """The connection broke (peer closed, idle timeout, ...)."""


def state_name(sock_state: int) -> str:
    """libsrt's SRT_SOCKSTATUS as the interface's leg state: connecting, connected or broken."""
    if sock_state == b.SRTS_CONNECTED:
        return "connected"
    if sock_state in _BROKEN_STATES:
        return "broken"
    return "connecting"


# --------------------------------------------------------------------------- poller


class _Waiter:
    __slots__ = ("done", "events", "task")

    def __init__(self, task: trio.lowlevel.Task, events: int) -> None:
        self.task = task
        self.events = events
        self.done = False  # woken or aborted: must not be rescheduled again


def _wake(waiters: list[_Waiter]) -> None:
    for waiter in waiters:
        if not waiter.done:
            waiter.done = True
            trio.lowlevel.reschedule(waiter.task)


class SrtPoller:
    """One thread blocked in ``srt_epoll_uwait`` for every SRT socket of a trio run.

    Use :func:`current_poller`; sockets register on creation and unregister on close.
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._eid = b.epoll_create()
        b.epoll_set_flags(self._eid, b.SRT_EPOLL_ENABLE_EMPTY)
        self._lock = threading.Lock()
        self._waiters: dict[int, list[_Waiter]] = {}
        self._stopping = False
        self._failure: str | None = None
        self.reports = 0  # srt_epoll_uwait returns with events (a spinning poller shows here)
        self.wakeups = 0  # of which woke at least one task
        self._thread = threading.Thread(target=self._run, name="srt-poller", daemon=True)
        self._thread.start()

    def register(self, sock: int) -> None:
        with self._lock:
            b.epoll_add(self._eid, sock, _PARKED)
            self._waiters[sock] = []

    def unregister(self, sock: int) -> None:
        """Forget ``sock``; tasks waiting on it wake (and find it closed). Trio thread only."""
        with self._lock:
            waiters = self._waiters.pop(sock, [])
            b.epoll_remove(self._eid, sock)
        _wake(waiters)

    async def wait(self, sock: int, events: int) -> None:
        """Sleep until ``sock`` reports one of ``events`` or ERR (or is unregistered).

        May return spuriously: callers retry their operation and wait again.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        waiter = _Waiter(trio.lowlevel.current_task(), events)
        with self._lock:
            if self._failure is not None:
                raise b.SrtError(f"the SRT poller thread failed: {self._failure}")
            waiters = self._waiters.get(sock)
            if waiters is None:
                raise trio.ClosedResourceError("the SRT socket was closed")
            waiters.append(waiter)
            if not self._arm(sock, waiters):
                # libsrt dropped the socket underneath: return at once, the retry sees why
                waiters.remove(waiter)
                return

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            with self._lock:
                current = self._waiters.get(sock)
                if current is not None and waiter in current:
                    current.remove(waiter)
                    self._arm(sock, current)
            waiter.done = True  # a wake already queued by the poller is now ignored
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _arm(self, sock: int, waiters: list[_Waiter]) -> bool:
        # Lock held. Level-triggered: the new mask is checked against libsrt's saved state.
        # False when libsrt no longer knows the socket.
        mask = _PARKED
        if waiters:
            mask = b.SRT_EPOLL_ERR
            for waiter in waiters:
                mask |= waiter.events
        try:
            b.epoll_update(self._eid, sock, mask)
        except b.SrtError:
            return False
        return True

    def stop(self) -> None:
        self._stopping = True
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        events = (b.SRT_EPOLL_EVENT * _UWAIT_BATCH)()
        try:
            while not self._stopping:
                n = b.epoll_uwait(self._eid, events, _UWAIT_TIMEOUT_MS)
                if n == 0:
                    continue
                self.reports += 1
                wake: list[_Waiter] = []
                with self._lock:
                    for i in range(min(n, _UWAIT_BATCH)):
                        sock, ev = events[i].fd, events[i].events
                        waiters = self._waiters.get(sock)
                        if waiters is None:
                            continue
                        keep = []
                        for waiter in waiters:
                            if ev & (waiter.events | b.SRT_EPOLL_ERR):
                                wake.append(waiter)
                            else:
                                keep.append(waiter)
                        if not self._arm(sock, keep):  # one shot: park (or narrow) until re-armed
                            wake.extend(keep)  # gone in libsrt: let every waiter retry and fail
                            keep = []
                        waiters[:] = keep
                if wake:
                    self.wakeups += 1
                    self._token.run_sync_soon(_wake, wake)
        except trio.RunFinishedError:
            pass
        except Exception as exc:  # must not die silently: every SRT wait would hang
            _log.exception("SRT poller thread failed")
            with self._lock:
                self._failure = str(exc) or type(exc).__name__
                stranded = [w for waiters in self._waiters.values() for w in waiters]
                for waiters in self._waiters.values():
                    waiters.clear()
            # Woken, each waiter retries its call and then waits again, which raises.
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(_wake, stranded)
        finally:
            b.epoll_release(self._eid)


_POLLER: trio.lowlevel.RunVar[SrtPoller] = trio.lowlevel.RunVar("mediaplane_srt_poller")


async def _stop_poller_at_run_end(poller: SrtPoller) -> None:
    try:
        await trio.sleep_forever()
    finally:
        poller.stop()


def current_poller() -> SrtPoller:
    """This trio run's poller, started on first use and stopped when the run ends."""
    try:
        return _POLLER.get()
    except LookupError:
        pass
    poller = SrtPoller(trio.lowlevel.current_trio_token())
    _POLLER.set(poller)
    trio.lowlevel.spawn_system_task(_stop_poller_at_run_end, poller, name="srt-poller-guard")
    return poller


# --------------------------------------------------------------------------- sockets


def _set_nonblocking(sock: int) -> None:
    b.setsockflag(sock, b.SRTO_SNDSYN, False)
    b.setsockflag(sock, b.SRTO_RCVSYN, False)


class SrtSocket:
    """One connected SRT socket (live mode, message API), owned by one trio run.

    Buffers: ``recv_into``/``recv_nowait_into`` write into the caller's buffer and
    keep nothing; ``send``/``send_nowait`` copy the message into libsrt's send buffer.
    """

    def __init__(self, poller: SrtPoller, sock: int, peer_addr: tuple[str, int]) -> None:
        self._poller = poller
        self._sock = sock
        self.peer_addr = peer_addr
        self._closed = False
        self._rx_buf: bytearray | memoryview | None = None
        self._rx_cbuf: ctypes.Array[ctypes.c_char] | None = None
        self._stats: dict[str, float | int | str] | None = None
        self._stats_at = -1e9
        self._rcv_retrans_total = 0
        self._uptime_ms = 0
        self.max_payload = int(b.getsockflag(sock, b.SRTO_PAYLOADSIZE)) or b.SRT_LIVE_MAX_PLSIZE
        """Largest message ``send`` takes (SRTO_PAYLOADSIZE: 1316 unless configured)."""

    @property
    def id(self) -> int:
        """libsrt's socket id."""
        return self._sock

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def state(self) -> str:
        """``connecting``, ``connected`` or ``broken`` (libsrt's state, read now)."""
        if self._closed:
            return "broken"
        return state_name(b.getsockstate(self._sock))

    @property
    def stream_id(self) -> str:
        """The caller's SRTO_STREAMID (on an accepted socket: what the caller sent)."""
        return str(b.getsockflag(self._sock, b.SRTO_STREAMID))

    @property
    def km_state(self) -> int:
        """SRTO_KMSTATE: SRT_KM_S_SECURED, _UNSECURED, _BADSECRET (passphrase mismatch)..."""
        return int(b.getsockflag(self._sock, b.SRTO_KMSTATE))

    def getsockflag(self, opt: int) -> b.OptionValue:
        return b.getsockflag(self._sock, opt)

    # ---- receive

    def recv_nowait_into(self, buf: bytearray | memoryview) -> int:
        """One message into ``buf``; 0 when none is ready. Never blocks.

        The last buffer passed stays mapped for libsrt (a bytearray cannot be resized)
        until another buffer is passed or the socket is closed.

        Raises SrtConnectionLost when the connection is gone, trio.ClosedResourceError
        after ``close()``.
        """
        if self._closed:
            raise trio.ClosedResourceError("the SRT socket was closed")
        cbuf = self._rx_cbuf
        if buf is not self._rx_buf or cbuf is None:  # the data plane reuses one buffer: map it once
            cbuf = self._rx_cbuf = b.c_buffer(buf)
            self._rx_buf = buf
        try:
            return b.recvmsg(self._sock, cbuf)
        except b.SrtError as exc:
            raise self._translate(exc) from exc

    async def wait_readable(self) -> None:
        """Until a message is ready (or the socket breaks: the next receive raises)."""
        await self._poller.wait(self._sock, b.SRT_EPOLL_IN)

    async def recv_into(self, buf: bytearray | memoryview) -> int:
        """One message into ``buf`` (its length, > 0), waiting as needed."""
        while True:
            n = self.recv_nowait_into(buf)
            if n:
                await trio.lowlevel.checkpoint()
                return n
            await self.wait_readable()

    # ---- send

    def send_nowait(self, data: bytes | bytearray | memoryview) -> bool:
        """Queue one message; False (nothing sent) when libsrt's send buffer is full.

        Never blocks and never awaits: the data plane calls it. Raises ValueError for
        a message larger than ``max_payload`` (a caller bug), SrtConnectionLost when
        the connection is gone.
        """
        if len(data) > self.max_payload:
            raise ValueError(f"SRT message of {len(data)} bytes exceeds the payload size {self.max_payload}")
        if self._closed:
            raise trio.ClosedResourceError("the SRT socket was closed")
        try:
            return b.sendmsg(self._sock, data) > 0
        except b.SrtError as exc:
            raise self._translate(exc) from exc

    async def send(self, data: bytes | bytearray | memoryview) -> None:
        """Queue one message, waiting for room in the send buffer if needed."""
        while not self.send_nowait(data):
            await self._poller.wait(self._sock, b.SRT_EPOLL_OUT)
        await trio.lowlevel.checkpoint()

    async def wait_broken(self) -> None:
        """Return once the connection is broken or closed (ERR), for sockets nobody reads."""
        while not self._closed and b.getsockstate(self._sock) not in _BROKEN_STATES:
            try:
                await self._poller.wait(self._sock, 0)
            except trio.ClosedResourceError:
                return

    # ---- statistics

    def sample_stats(self) -> dict[str, float | int | str]:
        """Read libsrt's counters now (clearing its interval counters) and cache them.

        Rates cover the time since the previous sample. Once the socket is gone
        ``srt_bistats`` fails: the last sample is kept, with the state set to broken.
        """
        now = trio.current_time()
        state = self.state
        if not self._closed:
            try:
                perf = b.bistats(self._sock, clear=True)
            except b.SrtError:
                perf = None
            if perf is not None:
                self._rcv_retrans_total += perf.pktRcvRetrans
                if state == "connected":
                    self._uptime_ms = b.connection_age_ms(self._sock)
                up = state == "connected"  # a broken socket still reports its last interval's rates
                self._stats = {
                    "state": state,
                    "rtt_ms": float(perf.msRTT),
                    "send_rate_mbps": float(perf.mbpsSendRate) if up else 0.0,
                    "recv_rate_mbps": float(perf.mbpsRecvRate) if up else 0.0,
                    "pkt_loss_total": int(perf.pktSndLossTotal + perf.pktRcvLossTotal),
                    "pkt_retransmit_total": int(perf.pktRetransTotal + self._rcv_retrans_total),
                    "uptime_ms": self._uptime_ms,
                }
                self._stats_at = now
                return dict(self._stats)
        if self._stats is None:
            self._stats = {
                "state": state,
                "rtt_ms": 0.0,
                "send_rate_mbps": 0.0,
                "recv_rate_mbps": 0.0,
                "pkt_loss_total": 0,
                "pkt_retransmit_total": 0,
                "uptime_ms": 0,
            }
        self._stats["state"] = state
        if state != "connected":
            self._stats["send_rate_mbps"] = self._stats["recv_rate_mbps"] = 0.0
        self._stats_at = now
        return dict(self._stats)

    def stats(self) -> dict[str, float | int | str]:
        """The spec's SRT leg statistics: ``state`` (connecting/connected/broken),
        ``rtt_ms``, ``send_rate_mbps``, ``recv_rate_mbps``, ``pkt_loss_total``,
        ``pkt_retransmit_total``, ``uptime_ms``. Cached; re-sampled when older than
        ``STATS_MAX_AGE_S``. The state is always read now.
        """
        if self._stats is None or trio.current_time() - self._stats_at >= STATS_MAX_AGE_S:
            return self.sample_stats()
        snapshot = dict(self._stats)
        snapshot["state"] = state = self.state
        if state != "connected":
            snapshot["send_rate_mbps"] = snapshot["recv_rate_mbps"] = 0.0
        return snapshot

    # ---- lifetime

    def close(self) -> None:
        """Close now (live mode: no linger). Idempotent; waiting tasks wake and raise."""
        if self._closed:
            return
        self._closed = True
        self._rx_buf = self._rx_cbuf = None
        self._poller.unregister(self._sock)
        b.close(self._sock)

    def __enter__(self) -> SrtSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _translate(self, exc: b.SrtError) -> b.SrtError:
        if exc.code in _LOST_CODES or b.getsockstate(self._sock) in _BROKEN_STATES:
            return SrtConnectionLost(f"SRT connection with {_fmt(self.peer_addr)} lost: {exc.message}", exc.code)
        return exc


def _fmt(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _resolve(text: str) -> tuple[str, int]:
    host, port = split_host_port(text)
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_DGRAM)
    except OSError as exc:
        raise SrtConnectError(f"cannot resolve {host}: {exc.strerror}", b.SRT_ENOSERVER, 0) from exc
    return str(infos[0][4][0]), port


def _is_any_port0(host: str, port: int) -> bool:
    return port == 0 and ipaddress.ip_address(host).is_unspecified


def _new_socket(poller: SrtPoller, leg: SrtLeg) -> int:
    sock = b.create_socket()
    try:
        apply_options(sock, leg)
        _set_nonblocking(sock)
        poller.register(sock)
    except BaseException:
        b.close(sock)
        raise
    return sock


async def srt_connect(leg: SrtLeg) -> SrtSocket:
    """Connect ``leg`` in caller or rendezvous mode and return the connected socket.

    Bounded by libsrt's connect timeout (``connect_timeout_secs``; libsrt's default is
    3 s for a caller, 30 s for rendezvous). Raises SrtConnectError with libsrt's reject
    reason, e.g. "wrong passphrase" (SRT_REJ_BADSECRET), "connection timeout". Options
    libsrt refuses raise SrtError. Cancelling closes the half-open socket.
    """
    if leg.mode == "listener" or leg.remote_addr is None:
        raise ValueError("srt_connect needs a caller or rendezvous leg")
    remote = await _resolve(leg.remote_addr)
    local = split_host_port(leg.local_addr)
    poller = current_poller()
    sock = _new_socket(poller, leg)
    try:
        try:
            if leg.mode == "rendezvous":
                b.rendezvous(sock, local, remote)
            else:
                if not _is_any_port0(*local):
                    b.bind(sock, *local)
                b.connect(sock, *remote)
        except b.SrtError as exc:
            raise _connect_error(sock, remote, exc.message) from exc
        while True:
            state = b.getsockstate(sock)
            if state == b.SRTS_CONNECTED:
                break
            if state in _BROKEN_STATES:
                raise _connect_error(sock, remote, None)
            await poller.wait(sock, b.SRT_EPOLL_OUT)  # OUT = connected, ERR = failed
    except BaseException:
        poller.unregister(sock)
        b.close(sock)
        raise
    return SrtSocket(poller, sock, remote)


_REJECT_HINTS: Final = {
    b.SRT_REJ_BADSECRET: "wrong passphrase",
    b.SRT_REJ_UNSECURE: "passphrase required on one side only",
    b.SRT_REJ_TIMEOUT: "no answer from the peer",
}


def _connect_error(sock: int, remote: tuple[str, int], detail: str | None) -> SrtConnectError:
    reason, text = b.getrejectreason(sock)
    if reason == b.SRT_REJ_UNKNOWN and detail is None:
        text = "the peer closed the connection during the handshake"
    hint = _REJECT_HINTS.get(reason)
    message = f"SRT connection to {_fmt(remote)} failed: {text}"
    if hint:
        message += f" ({hint})"
    if detail and reason == b.SRT_REJ_UNKNOWN:
        message += f": {detail}"
    return SrtConnectError(message, b.SRT_ECONNREJ, reason)


class SrtListener:
    """A listening SRT socket; ``accept()`` returns connected callers.

    Callers' sockets inherit the listener's options (passphrase, latency...).
    """

    def __init__(self, poller: SrtPoller, sock: int, local_addr: tuple[str, int]) -> None:
        self._poller = poller
        self._sock = sock
        self.local_addr = local_addr
        self._closed = False

    async def accept(self) -> SrtSocket:
        """The next connected caller. Raises trio.ClosedResourceError after close()."""
        while True:
            # Wait first: libsrt logs every srt_accept that finds nothing pending as an
            # error. Level-triggered, so a caller already queued wakes us at once.
            await self._poller.wait(self._sock, b.SRT_EPOLL_IN)
            if self._closed:
                raise trio.ClosedResourceError("the SRT listener was closed")
            if b.getsockstate(self._sock) != b.SRTS_LISTENING:
                raise b.SrtError("the SRT listener stopped listening", b.SRT_ENOCONN)
            got = b.accept(self._sock)
            if got is not None:
                sock, peer = got
                try:
                    self._poller.register(sock)
                    conn = SrtSocket(self._poller, sock, peer)
                except BaseException:
                    b.close(sock)
                    raise
                return conn

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._poller.unregister(self._sock)
        b.close(self._sock)

    def __enter__(self) -> SrtListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def srt_listen(leg: SrtLeg, backlog: int = 8) -> SrtListener:
    """Bind and listen on ``leg.local_addr`` (listener mode).

    Raises SrtError "cannot bind <addr>: <libsrt reason>" when the port is taken.
    """
    await trio.lowlevel.checkpoint()
    local = split_host_port(leg.local_addr)
    poller = current_poller()
    sock = _new_socket(poller, leg)
    try:
        b.bind(sock, *local)
        b.listen(sock, backlog)
        bound = b.getsockname(sock)
    except b.SrtError as exc:
        poller.unregister(sock)
        b.close(sock)
        raise b.SrtError(f"cannot listen on {leg.local_addr}: {exc.message}", exc.code) from exc
    except BaseException:
        poller.unregister(sock)
        b.close(sock)
        raise
    return SrtListener(poller, sock, bound)


SinkFn = Callable[[memoryview], None]
