"""``mp-manager``: the manager's command line (interop.md 1.3).

``serve`` runs the service; ``--version`` prints the version ``/health`` reports. The other
commands of interop.md 1.3 (``setup``, ``reset-password``, ``export``) come with the store.

Start-up stays light: trio, quart, hypercorn and cryptography are imported inside ``serve``.
No ``from __future__ import annotations`` here: Typer would then evaluate every annotation
string on every start (as in ``cli/main.py``).
"""

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from services.manager.settings import (
    DEFAULT_DATA_DIR,
    DEFAULT_LISTEN_ADDR,
    DEFAULT_PORT,
    LogLevel,
    StartupError,
    TlsMode,
    resolve_settings,
)

EPILOG = (
    "Environment: MEDIAPLANE_JWT_SECRET and MEDIAPLANE_MASTER_KEY (required, 64 hex characters each), "
    "MEDIAPLANE_TLS_MODE (direct or behind_proxy; --tls-mode wins).  Exit codes: 0 stopped cleanly, "
    "1 failure (cannot listen, cannot write), 2 usage or configuration error.  See docs/manager.md."
)

app = typer.Typer(
    name="mp-manager",
    help="Mediaplane manager: registers edge and relay nodes, relays commands, serves the dashboard.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    # Locals hold the secrets read from the environment (style.md 5).
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from appliance import __version__

        sys.stdout.write(f"mp-manager {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Mediaplane manager: registers edge and relay nodes, relays commands, serves the dashboard."""


@app.command()
def serve(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Holds manager.db and tls/; created 0700 when missing.", metavar="DIR")
    ] = DEFAULT_DATA_DIR,
    listen_addr: Annotated[
        str, typer.Option("--listen-addr", help="IP address to listen on.", metavar="ADDR")
    ] = DEFAULT_LISTEN_ADDR,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="TCP port (0: any free port, named in the log).")
    ] = DEFAULT_PORT,
    tls_mode: Annotated[
        TlsMode | None,
        typer.Option(
            "--tls-mode",
            help="direct: HTTPS with DATA_DIR/tls (self-signed when missing); behind_proxy: plain HTTP behind a "
            "TLS-terminating proxy. Default: $MEDIAPLANE_TLS_MODE, else direct.",
            show_default=False,
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="SQLAlchemy URL of the store (default: SQLite DATA_DIR/manager.db). Not used until the store lands.",
            metavar="URL",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option("--log-level", help="Logs go to stderr.")] = LogLevel.INFO,
) -> None:
    """Run the manager until SIGTERM or SIGINT (then it stops within 5 s)."""
    try:
        settings = resolve_settings(
            os.environ,
            data_dir=data_dir,
            listen_addr=listen_addr,
            port=port,
            tls_mode=tls_mode,
            database_url=database_url,
            log_level=log_level,
        )
    except StartupError as exc:
        sys.stderr.write(f"mp-manager: {exc.message}\n")
        raise typer.Exit(exc.exit_code) from None

    from services.manager.main import serve_main

    serve_main(settings)


def main() -> None:
    """The ``mp-manager`` console script."""
    app(prog_name="mp-manager")


if __name__ == "__main__":
    main()
