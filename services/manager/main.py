"""``mp-manager serve``: start-up, serving, and a clean stop (interop.md 1.3, 13).

Start-up order, each step ending the process on failure with a one-line message:

1. Settings (``settings.resolve_settings``): ``MEDIAPLANE_JWT_SECRET``, then
   ``MEDIAPLANE_MASTER_KEY``, then the TLS mode and the flags. Exit 2.
2. The data directory, created 0700 when missing. Exit 2 when it cannot be.
3. ``direct`` mode: the certificate pair in ``DATA_DIR/tls``, generated self-signed when
   missing (``tls.ensure_certificate``). Exit 2 for a pair that cannot be served, 1 when
   writing a new pair fails (a full disk: a restart may help).
4. Listen (HTTPS in ``direct`` mode, plain HTTP ``behind_proxy``), log
   ``mp-manager <version> listening on <url>``, tell systemd ``READY=1``, then
   ``WATCHDOG=1`` every half ``WatchdogSec`` when the unit sets one. A port that cannot be
   bound: exit 1.

SIGTERM or SIGINT (interop.md 13: every service closes its listeners and connections and
exits within 5 s): hypercorn closes the listeners at once, gives requests in flight
``graceful_timeout`` (2 s, ``appliance/http/app.py``) and then cancels their connections;
whatever still runs :data:`SHUTDOWN_GRACE_S` after the signal is cancelled. Exit 0.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, NoReturn

import trio

from appliance import __version__, systemd
from appliance.errors import PersistFailed
from appliance.http.app import serve
from services.manager.app import build_app
from services.manager.local_addresses import IpAddress, local_addresses
from services.manager.service import ManagerService
from services.manager.settings import LogLevel, ManagerSettings, StartupError, TlsMode
from services.manager.tls import ensure_certificate

__all__ = ["SHUTDOWN_GRACE_S", "configure_logging", "prepare", "run_manager", "serve_main"]

SHUTDOWN_GRACE_S: Final = 3.0
"""After a stop signal, how long hypercorn may take to finish before everything is cancelled;
hypercorn's own graceful_timeout (2 s) ends first, so this only bounds the unexpected."""

_log = logging.getLogger("mediaplane.manager")


def configure_logging(level: LogLevel) -> None:
    """Log to stderr (journald on the appliance), the edge's format (interop.md 1)."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    # One line per request only at --log-level debug: journald stays readable.
    logging.getLogger("mediaplane.access").setLevel(logging.DEBUG if level is LogLevel.DEBUG else logging.WARNING)


def prepare(
    settings: ManagerSettings,
    *,
    now: dt.datetime,
    hostname: str,
    addresses: Callable[[], Iterable[IpAddress]] = local_addresses,
) -> ManagerService:
    """Steps 2 and 3: the data directory and the certificate, then the service object.

    Blocking. Raises StartupError (exit 2) or PersistFailed (exit 1).
    """
    _ensure_data_dir(settings.data_dir)
    certificate = None
    if settings.tls_mode is TlsMode.DIRECT:
        certificate = ensure_certificate(settings.tls_dir, hostname=hostname, addresses=addresses(), now=now)
    else:
        _log.info("TLS mode behind_proxy: plain HTTP, no HSTS; the proxy in front terminates TLS")
    return ManagerService(settings, version=__version__, started_at=now, certificate=certificate)


def _ensure_data_dir(data_dir: Path) -> None:
    if not data_dir.exists():
        try:
            data_dir.mkdir(mode=0o700, parents=True)
            os.chmod(data_dir, 0o700)  # mkdir's mode is filtered by the umask
        except OSError as exc:
            raise StartupError(f"cannot create the data directory {data_dir}: {exc.strerror}") from exc
        _log.info("created the data directory %s (0700)", data_dir)
        return
    if not data_dir.is_dir():
        raise StartupError(f"the data directory {data_dir} is not a directory")
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:
        _log.warning("the data directory %s is open to other users (mode %04o): it should be 0700", data_dir, mode)


async def run_manager(service: ManagerService) -> None:
    """Step 4: serve until SIGINT or SIGTERM, then stop within :data:`SHUTDOWN_GRACE_S`."""
    settings = service.settings
    certificate = service.certificate
    app = build_app(service)
    stop = trio.Event()
    served = trio.Event()

    async def serving(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve(
                app,
                settings.listen_addr,
                settings.port,
                shutdown_trigger=stop.wait,
                certfile=str(certificate.cert_path) if certificate else None,
                keyfile=str(certificate.key_path) if certificate else None,
                task_status=task_status,
            )
        finally:
            served.set()
            stop.set()  # hypercorn ending on its own ends the process too

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    _log.info("%s received: stopping", signal.Signals(signum).name)
                    stop.set()
                    return

            nursery.start_soon(watch_signals)
            binds = await nursery.start(serving)
            url = listening_url("https" if certificate else "http", settings.listen_addr, binds, settings.port)
            _log.info("mp-manager %s listening on %s", service.version, url)
            _notify_ready(nursery, f"listening on {url}")
            await stop.wait()
            systemd.notify_stopping()
            with trio.move_on_after(SHUTDOWN_GRACE_S):
                await served.wait()
            nursery.cancel_scope.cancel()
    _log.info("stopped")


def listening_url(scheme: str, host: str, binds: list[str], port: int) -> str:
    """``scheme://HOST:PORT`` with the port hypercorn bound (``--port 0`` picks a free one)."""
    if binds:
        port = int(binds[0].rsplit(":", 1)[1])
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def _notify_ready(nursery: trio.Nursery, status: str) -> None:
    """sd_notify READY=1 once listening, and watchdog pings from the event loop (as the edge)."""
    systemd.notify_ready(status)
    interval = systemd.watchdog_interval()
    if interval:

        async def ping() -> None:
            # A stalled event loop stops the pings, and systemd restarts the service.
            while True:
                systemd.notify_watchdog()
                await trio.sleep(interval / 2)

        nursery.start_soon(ping)


def serve_main(settings: ManagerSettings) -> None:
    """Run ``mp-manager serve`` with resolved settings; SystemExit with the documented status."""
    configure_logging(settings.log_level)
    try:
        service = prepare(settings, now=dt.datetime.now(dt.UTC), hostname=socket.gethostname())
    except StartupError as exc:
        _die(exc.message, exc.exit_code)
    except PersistFailed as exc:
        _die(exc.message, 1)
    try:
        trio.run(run_manager, service)
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        pass
    except BaseException as exc:
        os_error = _first_os_error(exc)
        if os_error is None:
            raise
        reason = os_error.strerror or str(os_error)
        _die(f"cannot listen on {settings.listen_addr}:{settings.port}: {reason}", 1)


def _die(message: str, status: int) -> NoReturn:
    print(f"mp-manager: {message}", file=sys.stderr)
    raise SystemExit(status)


def _first_os_error(exc: BaseException) -> OSError | None:
    """The first OSError inside an exception (group), or None."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_os_error(inner)
            if found is not None:
                return found
    return None
