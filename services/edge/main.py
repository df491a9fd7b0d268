"""``mp-edge``: the media edge node (control process).

Startup order (interop.md 1.1): load or create the configuration (a file that
cannot be read or validated ends the process with status 2 and is never
overwritten), start the engine workers and every enabled flow, then serve the
API. SIGINT/SIGTERM stop it cleanly: the API drains, the workers exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from functools import partial
from pathlib import Path

import trio
from quart_trio import QuartTrio

from appliance import __version__, systemd
from appliance.config.store import EdgeConfigStore
from appliance.errors import ConfigFileError, PersistFailed
from appliance.http.app import create_app, serve
from appliance.logs import configure_service_logging
from services.edge.engine.supervisor import WORKER_NICE, WORKER_REALTIME, default_worker_count
from services.edge.metrics import EdgeMetrics
from services.edge.service import EdgeService
from services.edge.status.app import serve_monitor

_log = logging.getLogger("mediaplane.edge")


def build_app(service: EdgeService) -> QuartTrio:
    """The edge's quart-trio app around a service."""
    from services.edge.api.routes import bp
    from services.edge.nmos import connection_api, node_api

    app = create_app("mediaplane-edge")
    app.config["EDGE_SERVICE"] = service
    app.config["EDGE_METRICS"] = EdgeMetrics(service.snapshot, service.engine.worker_loads)
    app.register_blueprint(bp)
    app.register_blueprint(node_api.bp)  # /x-nmos/node/v1.3/ (interop.md 5)
    app.register_blueprint(connection_api.bp)  # /x-nmos/connection/v1.1/
    return app


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError("the port must be 1-65535")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mp-edge", description="Mediaplane media edge node")
    parser.add_argument("--config-dir", default="/var/lib/mediaplane/edge", help="holds config.json and secrets.json")
    parser.add_argument("--listen-addr", help="API bind address for this run (not written back)")
    parser.add_argument("--listen-port", type=_port, help="API port for this run (not written back)")
    parser.add_argument("--workers", type=int, default=default_worker_count(), help="engine worker processes")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--pin-cpus",
        action="store_true",
        help="pin the control process to the first CPU and each worker to one of the others, when there are "
        "enough (for a box whose cores are the edge's alone; default: the scheduler places them)",
    )
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=WORKER_NICE,
        help=f"niceness of the engine workers when they are not real-time (default {WORKER_NICE})",
    )
    parser.add_argument(
        "--worker-realtime",
        type=int,
        default=WORKER_REALTIME,
        metavar="PRIORITY",
        help=f"SCHED_FIFO priority of the engine workers (default {WORKER_REALTIME}; 0: normal scheduling at "
        "--worker-nice; refused without CAP_SYS_NICE or RLIMIT_RTPRIO, the workers fall back to the niceness)",
    )
    parser.add_argument("--version", action="version", version=f"mp-edge {__version__}")
    return parser.parse_args(argv)


async def run_edge(service: EdgeService, host: str, port: int, *, certfile: str | None, keyfile: str | None) -> None:
    """Run the service and the API until SIGINT or SIGTERM."""
    app = build_app(service)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.stop_on_signals, stop, _log)
        await nursery.start(service.run)
        await nursery.start(
            lambda task_status: serve(
                app,
                host,
                port,
                shutdown_trigger=stop.wait,
                certfile=certfile,
                keyfile=keyfile,
                task_status=task_status,
            )
        )
        if service.config.monitor is not None:
            # The read-only status page on its own listener (interop.md 2 `monitor`).
            monitor = service.config.monitor
            await nursery.start(
                partial(serve_monitor, service, monitor.listen_addr, monitor.listen_port, shutdown_trigger=stop)
            )
        scheme = "https" if certfile else "http"
        shown = f"[{host}]" if ":" in host else host
        service.listening, service.stop_process = (scheme, host, port), stop.set  # for GET /setup/runtime
        saved_addr, saved_port = service.listen_at_start
        saved = f"[{saved_addr}]:{saved_port}" if ":" in saved_addr else f"{saved_addr}:{saved_port}"
        note = (
            ""
            if (host, port) == (saved_addr, saved_port)
            else f" (--listen-addr/--listen-port; config.json says {saved})"
        )
        _log.info("mp-edge %s listening on %s://%s:%d%s", __version__, scheme, shown, port, note)
        systemd.ready_with_watchdog(nursery, f"listening on {scheme}://{shown}:{port}")
        await stop.wait()
        systemd.notify_stopping()
        # Let hypercorn finish its graceful shutdown, then stop the flows and workers.
        with trio.move_on_after(3):
            await trio.sleep(0.2)
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_service_logging(args.log_level)
    store = EdgeConfigStore(Path(args.config_dir))
    try:
        config = store.load()
    except ConfigFileError as exc:
        print(f"mp-edge: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None
    except PersistFailed as exc:  # e.g. a full disk while writing the first-start defaults
        print(f"mp-edge: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from None
    host = args.listen_addr or config.server.listen_addr
    port = args.listen_port or config.server.listen_port
    tls = config.server.tls

    async def _run() -> int:
        service = EdgeService(
            store,
            config,
            version=__version__,
            workers=max(1, args.workers),
            log_level=args.log_level,
            pin_cpus=args.pin_cpus,
            worker_nice=args.worker_nice,
            worker_realtime=args.worker_realtime,
        )
        if service.engine.control_cpus is not None:
            # The workers were planned on the other CPUs; the API and its clients stay here.
            os.sched_setaffinity(0, service.engine.control_cpus)
        await run_edge(
            service,
            host,
            port,
            certfile=tls.cert_path if tls else None,
            keyfile=tls.key_path if tls else None,
        )
        return service.exit_status  # 75 after POST /setup/restart, for systemd to start it again

    status = 0
    try:
        status = trio.run(_run)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        os_error = _first(exc, OSError)
        if os_error is None:
            raise
        print(f"mp-edge: cannot listen on {host}:{port}: {os_error.strerror or os_error}", file=sys.stderr)
        raise SystemExit(1) from None
    if status:
        raise SystemExit(status)


def _first(exc: BaseException, kind: type[OSError]) -> OSError | None:
    """The first ``kind`` inside an exception (group), or None."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    main()
