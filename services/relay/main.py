"""``mp-relay``: the relay (QUIC tunnels, the native UDP plane, the REST API, the manager link).

Startup (interop.md 1.2): read ``--config`` (default ``/etc/mediaplane/relay.json``; a missing
file means the built-in defaults; one that cannot be read or validated ends the process with
status 2 and is never overwritten), apply the flags for this run, bind QUIC, the UDP plane (a
busy port only drops the ``udp-relay`` capability) and the API, then log one ``listening`` line
with the bound addresses. SIGINT/SIGTERM close the listeners and connections and the process
exits within 5 s (interop.md 13).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import trio

from appliance import __version__, systemd
from appliance.errors import ConfigFileError
from appliance.http.app import first_os_error, serve
from appliance.logs import configure_service_logging
from appliance.models.config import split_host_port
from services.relay.api import build_app
from services.relay.config import DEFAULT_CONFIG_PATH, RelayConfigStore
from services.relay.service import RelayService

_log = logging.getLogger("mediaplane.relay")

SHUTDOWN_GRACE_S = 2.0
"""hypercorn's graceful close of API connections; everything else is cancelled at once."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mp-relay", description="Mediaplane relay (QUIC and native UDP)")
    parser.add_argument("--config", default=DEFAULT_CONFIG_PATH, help="relay.json (missing: built-in defaults)")
    parser.add_argument("--quic-addr", help="QUIC listen address ip:port for this run (overrides quic_addr)")
    parser.add_argument("--udp-addr", help="native UDP plane address ip:port for this run (udp_relay_addr)")
    parser.add_argument("--api-addr", help="REST API address ip:port for this run (api_addr)")
    parser.add_argument("--no-udp-relay", action="store_true", help="run without the native UDP plane")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"mp-relay {__version__}")
    return parser.parse_args(argv)


async def run_relay(service: RelayService) -> None:
    """Run the service and its API until SIGINT or SIGTERM."""
    api_host, api_port = split_host_port(service.config.api_addr)
    app = build_app(service)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.stop_on_signals, stop, _log)
        await nursery.start(service.run)
        bound = await nursery.start(
            lambda task_status: serve(app, api_host, api_port, shutdown_trigger=stop.wait, task_status=task_status)
        )
        api_url = bound[0] if bound else f"http://{service.config.api_addr}"
        _log.info(
            "mp-relay %s listening: api %s, quic %s, udp %s",
            __version__,
            api_url,
            service.quic_bound or "off",
            service.udp_bound or "off",
        )
        systemd.ready_with_watchdog(nursery, f"listening: api {api_url}")
        await stop.wait()
        systemd.notify_stopping()
        # The API closes gracefully (hypercorn's graceful_timeout); QUIC, the UDP plane and
        # the manager link are cancelled, which closes their sockets: well inside 5 s.
        with trio.move_on_after(SHUTDOWN_GRACE_S + 0.5):
            await trio.sleep(0.2)
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_service_logging(args.log_level)
    store = RelayConfigStore(Path(args.config))
    try:
        store.load()
        store.override(
            quic_addr=args.quic_addr,
            udp_relay_addr=args.udp_addr,
            api_addr=args.api_addr,
            no_udp_relay=args.no_udp_relay,
        )
    except ConfigFileError as exc:
        print(f"mp-relay: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None

    async def _run() -> None:
        await run_relay(RelayService(store, version=__version__))

    try:
        trio.run(_run)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        config_error = _first_config_error(exc)
        if config_error is not None:
            print(f"mp-relay: {config_error.message}", file=sys.stderr)
            raise SystemExit(2) from None
        os_error = first_os_error(exc)
        if os_error is None:
            raise
        print(f"mp-relay: cannot listen: {os_error.strerror or os_error}", file=sys.stderr)
        raise SystemExit(1) from None


def _first_config_error(exc: BaseException) -> ConfigFileError | None:
    if isinstance(exc, ConfigFileError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_config_error(inner)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    main()
