"""A tiny sd_notify client: tells systemd a service is ready, alive, or what it is doing.

systemd passes `$NOTIFY_SOCKET` to a `Type=notify` service, and `$WATCHDOG_USEC` (with
`$WATCHDOG_PID`) when the unit sets `WatchdogSec=`. Outside systemd (a developer's shell, the
tests, `make run`) those variables are unset and every call here is a no-op, so callers never
check where they run. Nothing here raises on a send failure: a lost notification must never
take the service down (systemd then restarts it for a missed watchdog, which is the point).

Protocol: sd_notify(3). One datagram of newline-separated `KEY=VALUE` assignments sent to an
AF_UNIX datagram socket; a leading `@` names a socket in the abstract namespace.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Mapping

import trio

__all__ = [
    "notify",
    "notify_ready",
    "notify_status",
    "notify_stopping",
    "notify_watchdog",
    "ready_with_watchdog",
    "watchdog_interval",
]

_log = logging.getLogger(__name__)


def _socket_address(env: Mapping[str, str]) -> str | None:
    path = env.get("NOTIFY_SOCKET", "")
    if not path:
        return None
    if path.startswith("@"):
        # sd_notify(3): "@" stands for the abstract namespace, i.e. a leading NUL byte.
        return "\0" + path[1:]
    if path.startswith("/"):
        return path
    return None  # sd_notify(3) also allows vsock: addresses; the appliance never uses them


def notify(state: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Send one notification such as ``"READY=1"`` or ``"WATCHDOG=1\\nSTATUS=..."``.

    Returns True when the datagram was sent, False when there is no `$NOTIFY_SOCKET` (not run
    by systemd) or the send failed; failures are logged once at debug level and never raised.
    """
    address = _socket_address(os.environ if env is None else env)
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode("utf-8"), address)
    except OSError as exc:
        _log.debug("sd_notify to %r failed: %s", address, exc)
        return False
    return True


def notify_ready(status: str | None = None, *, env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd start-up is complete (call once the API listens)."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""), env=env)


def notify_watchdog(*, env: Mapping[str, str] | None = None) -> bool:
    """Keep-alive ping; send it about every half `watchdog_interval()` from the control loop."""
    return notify("WATCHDOG=1", env=env)


def notify_status(status: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Free-form one-line status shown by `systemctl status`."""
    return notify(f"STATUS={_one_line(status)}", env=env)


def notify_stopping(*, env: Mapping[str, str] | None = None) -> bool:
    """Tell systemd an orderly shutdown has begun."""
    return notify("STOPPING=1", env=env)


def watchdog_interval(*, env: Mapping[str, str] | None = None) -> float | None:
    """The service's watchdog timeout in seconds (`$WATCHDOG_USEC`, i.e. the unit's `WatchdogSec=`).

    Ping with WATCHDOG=1 at half this interval, as sd_watchdog_enabled(3) advises. None when the
    watchdog is off: the variable is unset or not a positive integer, or `$WATCHDOG_PID` names
    another process (the watchdog is then meant for that process).
    """
    env = os.environ if env is None else env
    raw_usec = env.get("WATCHDOG_USEC", "")
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    raw_pid = env.get("WATCHDOG_PID", "")
    if raw_pid:
        try:
            if int(raw_pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 1_000_000


def _one_line(text: str) -> str:
    # A newline would start a new KEY=VALUE assignment in the datagram.
    return " ".join(text.splitlines())


def ready_with_watchdog(nursery: trio.Nursery, status: str) -> None:
    """READY=1 with ``status``, then WATCHDOG=1 at half ``WatchdogSec`` from a task of ``nursery``.

    The pings come from the service's own event loop, so a loop that stalls stops them and
    systemd restarts the service (every Mediaplane service is one trio process).
    """
    notify_ready(status)
    interval = watchdog_interval()
    if interval:

        async def ping() -> None:
            while True:
                notify_watchdog()
                await trio.sleep(interval / 2)

        nursery.start_soon(ping)


async def stop_on_signals(
    stop: trio.Event, log: logging.Logger, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Set ``stop`` on the first SIGINT or SIGTERM (systemd's stop), saying which in the log.

    Started (``nursery.start``) before anything else, so a signal during start-up is caught too;
    later signals are taken and ignored while the service stops (the task ends when the
    service's nursery is cancelled), so a second Ctrl-C cannot cut a clean stop short."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        # Every signal is taken off the queue: trio re-raises the ones left in it when the
        # receiver closes, which would turn a second Ctrl-C into a KeyboardInterrupt at exit.
        async for signum in signals:
            name = signal.Signals(signum).name
            if stop.is_set():
                log.info("%s received while stopping: ignored", name)
            else:
                log.info("%s received: stopping", name)
                stop.set()
