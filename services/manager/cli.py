"""``mp-manager``: the manager's command line (interop.md 1.3).

``serve`` runs the service; ``setup`` creates the first ``super_admin``; ``reset-password``
sets a user's password and revokes their sessions; ``export`` writes the JSON of
``GET /api/v1/export`` to a file; ``backup`` and ``restore`` write and load an encrypted
snapshot of everything (services/manager/backup.py); ``--version`` prints the version
``/health`` reports.

Start-up stays light: trio, quart, hypercorn and cryptography are imported inside ``serve``.
No ``from __future__ import annotations`` here: Typer would then evaluate every annotation
string on every start (as in ``cli/main.py``).
"""

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from pydantic import SecretStr

from services.manager.settings import (
    DEFAULT_DATA_DIR,
    DEFAULT_LISTEN_ADDR,
    DEFAULT_PORT,
    LogLevel,
    StartupError,
    TlsMode,
    resolve_settings,
)

DATABASE_URL_ENV = "MEDIAPLANE_DATABASE_URL"
DATABASE_URL_HELP = (
    "Database of the store: postgresql://USER:PASSWORD@HOST/DB, or sqlite:////path/manager.db. "
    "Default: $MEDIAPLANE_DATABASE_URL, else SQLite DATA_DIR/manager.db. Never logged."
)
T = TypeVar("T")
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
            help=DATABASE_URL_HELP,
            metavar="URL",
            envvar=DATABASE_URL_ENV,
            show_default=False,
            show_envvar=False,
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


DataDirOption = Annotated[
    Path, typer.Option("--data-dir", help="Holds manager.db; created 0700 when missing.", metavar="DIR")
]
DatabaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help=DATABASE_URL_HELP,
        metavar="URL",
        envvar=DATABASE_URL_ENV,
        show_default=False,
        show_envvar=False,
    ),
]
PasswordStdinOption = Annotated[
    bool,
    typer.Option(
        "--password-stdin",
        help="Read the password from one line of stdin (its trailing newline stripped) instead of prompting.",
    ),
]


@app.command()
def setup(
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    database_url: DatabaseUrlOption = None,
    username: Annotated[
        str | None,
        typer.Option("--username", help="The first super_admin's username (prompted when missing).", metavar="U"),
    ] = None,
    password_stdin: PasswordStdinOption = False,
) -> None:
    """Create the first super_admin; refused (exit 1) when any user exists."""
    if password_stdin and username is None:
        _fail("--password-stdin needs --username", 2)
    if username is None:
        username = typer.prompt("Username")
    password = _read_password(password_stdin)
    _check_credentials(username, password)
    from services.manager.main import create_first_super_admin

    _run_admin(create_first_super_admin, data_dir, database_url, username, password)
    sys.stdout.write(f"created the super_admin {username}\n")


@app.command("reset-password")
def reset_password(
    username: Annotated[str, typer.Option("--username", help="Whose password to set.", metavar="U")],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    database_url: DatabaseUrlOption = None,
    password_stdin: PasswordStdinOption = False,
) -> None:
    """Set a user's password (prompted, or --password-stdin) and revoke all their sessions."""
    password = _read_password(password_stdin)
    _check_credentials(None, password)
    from services.manager.main import reset_user_password

    revoked = _run_admin(reset_user_password, data_dir, database_url, username, password)
    sys.stdout.write(f"password changed; {revoked} session(s) revoked\n")


@app.command()
def export(
    output: Annotated[
        Path, typer.Option("--output", help="The file to write (atomically, mode 0600).", metavar="FILE")
    ],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Write the JSON of GET /api/v1/export (users, nodes, settings; no secrets) to FILE."""
    import trio

    from appliance.errors import ApplianceError

    if not data_dir.is_dir() and database_url is None:
        _fail(f"the data directory {data_dir} does not exist (run mp-manager setup first)", 1)
    try:
        counts = trio.run(_write_export, data_dir, database_url, output)
    except StartupError as exc:
        _fail(exc.message, exc.exit_code)
    except ApplianceError as exc:
        _fail(exc.message, 1)
    sys.stdout.write(f"exported {counts[0]} user(s), {counts[1]} node(s) and the settings to {output}\n")


async def _write_export(data_dir: Path, database_url: str | None, output: Path) -> tuple[int, int]:
    import datetime as dt

    import trio

    from appliance.config.atomic import atomic_write
    from services.manager.api.export import build_export, export_json
    from services.manager.main import open_store

    async with await open_store(data_dir, database_url) as store:
        document = await build_export(store, dt.datetime.now(dt.UTC))
    await trio.to_thread.run_sync(atomic_write, output, export_json(document), 0o600)
    return len(document.users), len(document.nodes)


@app.command()
def backup(
    output: Annotated[
        Path, typer.Option("--output", help="The backup file to write (atomically, mode 0600).", metavar="FILE")
    ],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Write an encrypted backup of everything (users, sessions, nodes and their secrets, events,
    settings, AI keys, the TLS pair) to FILE, while the manager keeps serving. Needs
    MEDIAPLANE_MASTER_KEY; restoring needs the same one."""
    from appliance import __version__
    from services.manager.backup import make_backup

    master_key = _master_key()
    if not data_dir.is_dir() and database_url is None:
        _fail(f"the data directory {data_dir} does not exist (nothing to back up)", 1)
    url = _database_url(data_dir, database_url)
    rows = _run_blocking(make_backup, url, data_dir, output, master_key, version=__version__)
    sys.stdout.write(f"backed up {rows} row(s) to {output}\n")


@app.command()
def restore(
    file: Annotated[Path, typer.Argument(help="A file written by mp-manager backup.", metavar="FILE")],
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Restore a backup into an empty data directory (or empty database): refused when it holds
    any data. Needs the MEDIAPLANE_MASTER_KEY the backup was made with; with the same
    MEDIAPLANE_JWT_SECRET, sessions from before the backup stay valid."""
    from services.manager.backup import restore_backup
    from services.manager.paths import ensure_data_dir

    master_key = _master_key()
    if not file.is_file():
        _fail(f"{file} is not a file", 2)
    try:
        ensure_data_dir(data_dir)
    except StartupError as exc:
        _fail(exc.message, 1)
    url = _database_url(data_dir, database_url)
    result = _run_blocking(restore_backup, file, url, data_dir, master_key)
    rows = result.snapshot.rows
    detail = ", ".join(f"{count} {table}" for table, count in rows.items())
    sys.stdout.write(
        f"restored a backup made {result.snapshot.created_at:%Y-%m-%d %H:%M:%S} UTC "
        f"(from {result.snapshot.source_backend}, mediaplane {result.snapshot.software_version}): {detail}\n"
    )
    if result.tls_restored:
        aside = " (the pair that was there is kept as *.before-restore)" if result.tls_set_aside else ""
        sys.stdout.write(f"restored the TLS pair into {data_dir / 'tls'}{aside}\n")


def _master_key() -> "SecretStr":
    from services.manager.settings import master_key_from_env

    try:
        return master_key_from_env(os.environ)
    except StartupError as exc:
        _fail(exc.message, exc.exit_code)


def _database_url(data_dir: Path, database_url: str | None) -> str:
    from services.manager.paths import database_url as resolve

    return resolve(data_dir, database_url)


def _run_blocking(operation: Callable[..., T], *args: object, **kwargs: object) -> T:
    """Runs a blocking store tool; the store's errors end the process with status 1 and their message."""
    from appliance.errors import ApplianceError

    try:
        return operation(*args, **kwargs)
    except ApplianceError as exc:
        _fail(exc.message, 1)


def _fail(message: str, status: int) -> NoReturn:
    sys.stderr.write(f"mp-manager: {message}\n")
    raise typer.Exit(status)


def _read_password(from_stdin: bool) -> str:
    if not from_stdin:
        password: str = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
        return password
    line = sys.stdin.readline()
    if line.endswith("\r\n"):
        return line[:-2]
    return line[:-1] if line.endswith("\n") else line


def _check_credentials(username: str | None, password: str) -> None:
    """The policy of interop.md 7.1; exit 2 with a message that quotes neither value."""
    from services.manager.auth import password_problem, username_problem

    problem = (username_problem(username) if username is not None else None) or password_problem(password)
    if problem:
        _fail(problem, 2)


def _run_admin(
    operation: Callable[[Path, str | None, str, str], Awaitable[T]],
    data_dir: Path,
    database_url: str | None,
    username: str,
    password: str,
) -> T:
    """Runs one store operation under trio; StartupError and the store's errors end the process."""
    import trio

    from appliance.errors import ApplianceError
    from services.manager.settings import StartupError

    try:
        return trio.run(operation, data_dir, database_url, username, password)
    except StartupError as exc:
        _fail(exc.message, exc.exit_code)
    except ApplianceError as exc:
        _fail(exc.message, 1)


def main() -> None:
    """The ``mp-manager`` console script."""
    app(prog_name="mp-manager")


if __name__ == "__main__":
    main()
