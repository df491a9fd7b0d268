"""A throwaway PostgreSQL cluster for tests, from Debian's ``postgresql`` package.

Usage (sync; the manager store's conftest wraps it in a session fixture)::

    with running_postgres() as cluster:
        url = cluster.create_database()      # a fresh, empty database per caller

``initdb`` refuses to run as root, and the tests run as root in CI, so every
PostgreSQL binary runs as an unprivileged user (``postgres`` when it exists, else
``nobody``) through ``runuser``. The cluster lives in its own directory under
``/tmp`` (not pytest's ``tmp_path``, whose parents are root-only), owned by that
user. The server listens only on a unix socket inside that directory: no port to
race for, nothing reachable from the network. ``fsync`` is off: the data is thrown
away at the end. Start to ready takes about a second.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

PG_ROOT = Path("/usr/lib/postgresql")
SUPERUSER = "postgres"
PORT = 5432  # only names the socket file (.s.PGSQL.5432); nothing listens on TCP


def require_postgres() -> Path:
    """The PostgreSQL binaries; skips when missing, but fails in CI, where a skip is a silent pass."""
    bin_dir = find_pg_bin()
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is missing in CI (no initdb under {PG_ROOT}/<ver>/bin; tools/ensure-debs.sh)")
        pytest.skip(f"PostgreSQL is not installed (no initdb under {PG_ROOT}/<ver>/bin)")
    return bin_dir


def find_pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<ver>/bin`` holding ``initdb`` and ``pg_ctl``, or None."""
    candidates = []
    for bin_dir in PG_ROOT.glob("*/bin"):
        if (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file() and bin_dir.parent.name.isdigit():
            candidates.append((int(bin_dir.parent.name), bin_dir))
    return max(candidates)[1] if candidates else None


def _server_user() -> str | None:
    """The unprivileged account the server runs as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' account exists")


@dataclass
class PostgresCluster:
    """One running cluster: its directory, socket directory and binaries."""

    root: Path
    bin_dir: Path
    run_as: str | None
    _names: Iterator[int] = field(default_factory=itertools.count)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL (psycopg 3 driver) for ``database`` over the unix socket."""
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.socket_dir}&port={PORT}"

    def conninfo(self, database: str = "postgres") -> str:
        """A libpq connection string, for psycopg used directly."""
        return f"host={self.socket_dir} port={PORT} user={SUPERUSER} dbname={database}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Runs one statement as the superuser, outside a transaction (CREATE DATABASE, TRUNCATE …)."""
        with psycopg.connect(self.conninfo(database), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, prefix: str = "test") -> str:
        """Creates a new, empty database and returns its SQLAlchemy URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({result.returncode}):\n{result.stdout}{result.stderr}\n{self.log()}")

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        options = " ".join(
            (
                f"-k {self.socket_dir}",
                "-p 5432",
                "-c listen_addresses=''",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=200",
            )
        )
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options, "-w", "-t", "30", "start"
        )

    def stop(self) -> None:
        """Stops the server at once (``-m immediate``: the data is thrown away)."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")


@contextlib.contextmanager
def running_postgres(bin_dir: Path | None = None) -> Iterator[PostgresCluster]:
    """Starts a throwaway cluster, yields it, then stops it and removes its directory."""
    bin_dir = bin_dir or find_pg_bin()
    if bin_dir is None:
        raise RuntimeError(f"no PostgreSQL binaries under {PG_ROOT}")
    run_as = _server_user()
    root = Path(tempfile.mkdtemp(prefix="mp-pg-"))
    try:
        (root / "sock").mkdir()
        if run_as is not None:
            account = pwd.getpwnam(run_as)
            for path in (root, root / "sock"):
                os.chown(path, account.pw_uid, account.pw_gid)
        cluster = PostgresCluster(root=root, bin_dir=bin_dir, run_as=run_as)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
