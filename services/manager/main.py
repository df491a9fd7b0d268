"""``mp-manager serve``: start-up, serving, and a clean stop (interop.md 1.3, 13).

Start-up order, each step ending the process on failure with a one-line message:

1. Settings (``settings.resolve_settings``): ``MEDIAPLANE_JWT_SECRET``, then
   ``MEDIAPLANE_MASTER_KEY``, then the TLS mode and the flags. Exit 2.
2. The data directory, created 0700 when missing. Exit 2 when it cannot be.
3. ``direct`` mode: the certificate pair in ``DATA_DIR/tls``, generated self-signed when
   missing (``tls.ensure_certificate``). Exit 2 for a pair that cannot be served, 1 when
   writing a new pair fails (a full disk: a restart may help).
4. The store (``Store.open``: SQLite ``DATA_DIR/manager.db``, or ``--database-url`` /
   ``MEDIAPLANE_DATABASE_URL``, migrated to head), then every node marked ``offline``
   (none is connected yet). A URL the store does not take: exit 2; a database that cannot
   be opened: exit 1. The URL is never logged (it may carry a password).
5. Listen (HTTPS in ``direct`` mode, plain HTTP ``behind_proxy``), log
   ``mp-manager <version> listening on <url>``, tell systemd ``READY=1``, then
   ``WATCHDOG=1`` every half ``WatchdogSec`` when the unit sets one. A port that cannot be
   bound: exit 1.

SIGTERM or SIGINT (interop.md 13: every service closes its listeners and connections and
exits within 5 s): hypercorn closes the listeners at once, gives requests in flight
``graceful_timeout`` (2 s, ``appliance/http/app.py``) and then cancels their connections;
whatever still runs :data:`SHUTDOWN_GRACE_S` after the signal is cancelled; the store is
closed last. Exit 0.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final, NoReturn

import trio

from appliance import __version__, systemd
from appliance.errors import NotFound, PersistFailed
from appliance.http.app import first_os_error, serve
from appliance.logs import configure_service_logging
from services.manager import auth
from services.manager.api.ws import register_hub
from services.manager.app import build_app
from services.manager.fleet import Fleet, listen_conninfo
from services.manager.hub import NodeHub
from services.manager.local_addresses import IpAddress, local_addresses
from services.manager.paths import database_url, ensure_data_dir
from services.manager.retention import retention_loop
from services.manager.service import ManagerService
from services.manager.settings import LogLevel, ManagerSettings, StartupError, TlsMode
from services.manager.store import NewUser, Role, Store, StoreFailed, UnsupportedDatabaseUrl, UsersExist
from services.manager.tls import ensure_certificate

__all__ = [
    "SHUTDOWN_GRACE_S",
    "configure_logging",
    "create_first_super_admin",
    "database_url",
    "ensure_data_dir",
    "open_store",
    "prepare",
    "reset_user_password",
    "run_manager",
    "serve_main",
]

SHUTDOWN_GRACE_S: Final = 3.0
"""After a stop signal, how long hypercorn may take to finish before everything is cancelled;
hypercorn's own graceful_timeout (2 s) ends first, so this only bounds the unexpected."""

_log = logging.getLogger("mediaplane.manager")


def configure_logging(level: LogLevel) -> None:
    """Log to stderr (journald on the appliance), as every service does (appliance.logs)."""
    configure_service_logging(level.value)


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
    ensure_data_dir(settings.data_dir)
    certificate = None
    if settings.tls_mode is TlsMode.DIRECT:
        certificate = ensure_certificate(settings.tls_dir, hostname=hostname, addresses=addresses(), now=now)
    else:
        _log.info("TLS mode behind_proxy: plain HTTP, no HSTS; the proxy in front terminates TLS")
    return ManagerService(settings, version=__version__, started_at=now, certificate=certificate)


async def open_store(data_dir: Path, url: str | None) -> Store:
    """Step 4's store, migrated; StartupError (2: a URL not taken; 1: cannot open). Never logs the URL."""
    try:
        return await Store.open(database_url(data_dir, url))
    except UnsupportedDatabaseUrl as exc:
        raise StartupError(f"--database-url: {exc.message}") from None
    except StoreFailed as exc:
        raise StartupError(f"cannot open the database: {exc.message}", exit_code=1) from None


@contextlib.contextmanager
def sqlite_single_instance(database: Path) -> Iterator[None]:
    """Holds an exclusive lock beside the SQLite file while serving: SQLite is the one-box store,
    and two instances on one file would each mark the other's nodes offline and split the
    sockets with no way to route commands between them. A fleet runs on PostgreSQL."""
    lock_path = database.with_name(database.name + ".serve-lock")
    with open(lock_path, "a+b") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupError(
                f"another mp-manager is already serving {database}: SQLite serves one instance; "
                "run several on one PostgreSQL database (--database-url postgresql://...)"
            ) from None
        yield


async def run_manager(service: ManagerService) -> None:
    """Steps 4 and 5: open the store, serve until SIGINT or SIGTERM, stop within
    :data:`SHUTDOWN_GRACE_S`, close the store."""
    settings = service.settings
    url = settings.database_url.get_secret_value() if settings.database_url else None
    store = await open_store(settings.data_dir, url)
    try:
        service.attach_store(store)
        with contextlib.ExitStack() as held:
            if store.backend == "sqlite" and store.engine.url.database:
                held.enter_context(sqlite_single_instance(Path(store.engine.url.database)))
                offline = await store.mark_all_nodes_offline()
                _log.info("store open (%s); %d node(s) marked offline", store.backend, offline)
                await _serve_until_stopped(service, fleet=False)
            else:
                # PostgreSQL: other instances may be serving on the same database (a fleet,
                # docs/manager.md): only the nodes none of them holds are offline.
                offline = await store.fleet_mark_orphans_offline()
                _log.info("store open (%s); %d node(s) marked offline", store.backend, offline)
                await _serve_until_stopped(service, fleet=True)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


async def _serve_until_stopped(service: ManagerService, *, fleet: bool) -> None:
    settings = service.settings
    certificate = service.certificate
    app = build_app(service)
    # The node hub (interop.md 6): /ws/node; routes reach it through api.ws.node_hub().
    live = await service.runtime_settings()

    async def reapply_settings() -> None:
        # Another instance of the fleet changed them (interop.md 7.5: live everywhere).
        now = await service.runtime_settings()
        hub.apply_settings(
            keepalive_interval_s=now.ws_keepalive_interval_secs, offline_threshold_s=now.node_offline_threshold_secs
        )

    member = (
        Fleet(service.store, settings_changed=reapply_settings, conninfo=listen_conninfo(service.store))
        if fleet
        else None
    )
    hub = NodeHub(
        service.store,
        service.secret_box,
        keepalive_interval_s=live.ws_keepalive_interval_secs,
        offline_threshold_s=live.node_offline_threshold_secs,
        fleet=member,
    )
    register_hub(app, hub)
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

    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.stop_on_signals, stop, _log)
        # interop.md 7.3: the daily retention job, reading events_retention_days live.
        nursery.start_soon(retention_loop, service.store, service.runtime_settings)
        if member is not None:
            await nursery.start(member.run)
        binds = await nursery.start(serving)
        url = listening_url("https" if certificate else "http", settings.listen_addr, binds, settings.port)
        _log.info("mp-manager %s listening on %s", service.version, url)
        systemd.ready_with_watchdog(nursery, f"listening on {url}")
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
    except StartupError as exc:
        _die(exc.message, exc.exit_code)
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        pass
    except BaseException as exc:
        os_error = first_os_error(exc)
        if os_error is None:
            raise
        reason = os_error.strerror or str(os_error)
        _die(f"cannot listen on {settings.listen_addr}:{settings.port}: {reason}", 1)


# --- mp-manager setup and reset-password (interop.md 1.3) ---------------------------------


async def create_first_super_admin(data_dir: Path, url: str | None, username: str, password: str) -> None:
    """``mp-manager setup``: the first user, a ``super_admin``; UsersExist (409 kind) when any exists.

    Also creates the data directory (0700) when missing. StartupError for a store that
    cannot be opened.
    """
    ensure_data_dir(data_dir)
    password_hash = await trio.to_thread.run_sync(auth.hash_password, password)
    new = NewUser(username=username, password_hash=password_hash, role=Role.SUPER_ADMIN)
    async with await open_store(data_dir, url) as store:
        try:
            user = await store.create_first_user(new)
        except UsersExist:
            raise StartupError(
                "setup refused: a user already exists (mp-manager reset-password sets a password)", exit_code=1
            ) from None
    _log.info("created the first super_admin (id %s)", user.id)


async def reset_user_password(data_dir: Path, url: str | None, username: str, password: str) -> int:
    """``mp-manager reset-password``: a new hash, then every session of the user revoked; how many.

    NotFound when no user has this username.
    """
    if not data_dir.is_dir() and url is None:
        raise StartupError(f"the data directory {data_dir} does not exist (run mp-manager setup first)", exit_code=1)
    async with await open_store(data_dir, url) as store:
        user = await store.get_user_by_username(username)
        if user is None:
            raise NotFound("no user has this username")
        password_hash = await trio.to_thread.run_sync(auth.hash_password, password)
        await store.update_user(user.id, password_hash=password_hash)
        return await store.revoke_user_sessions(user.id)


def _die(message: str, status: int) -> NoReturn:
    print(f"mp-manager: {message}", file=sys.stderr)
    raise SystemExit(status)
