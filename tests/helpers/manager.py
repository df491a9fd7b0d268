"""Run a real ``mp-manager serve`` for tests: a temp data dir, port 0, a log file.

Usage (sync, from any test)::

    with running_manager(tmp_path) as manager:
        with manager.client() as client:        # trusts DATA_DIR/tls/cert.pem in direct mode
            r = client.get("/health")

The manager listens on ``127.0.0.1`` port 0 and the helper reads the port it bound from its
``listening on`` log line, so parallel tests never race for a port.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

MANAGER_BIN = Path(sys.executable).with_name("mp-manager")
# Distinct, greppable values: a test can look for them in logs and error texts.
JWT_SECRET = "5eC7e7a15eC7e7a1" * 4
MASTER_KEY = "0badc0de" * 8
_LISTENING = re.compile(r"mp-manager \S+ listening on (https?)://127\.0\.0\.1:(\d+)")


def manager_env(**overrides: str | None) -> dict[str, str]:
    """The process environment with both required secrets; ``NAME=None`` removes a variable."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEDIAPLANE_")}
    env["MEDIAPLANE_JWT_SECRET"] = JWT_SECRET
    env["MEDIAPLANE_MASTER_KEY"] = MASTER_KEY
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def tls_context(cert_path: Path) -> ssl.SSLContext:
    """A client context trusting only ``cert_path`` (the manager's own certificate)."""
    return ssl.create_default_context(cafile=str(cert_path))


@dataclass
class Manager:
    data_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    scheme: str = ""
    port: int = 0
    ca_path: Path | None = None
    """What the test client trusts in direct mode; None: the manager's own cert.pem."""
    log_offset: int = 0
    """Where this run's lines start in the log file (a restart appends to it)."""

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def cert_path(self) -> Path:
        return self.data_dir / "tls" / "cert.pem"

    @property
    def key_path(self) -> Path:
        return self.data_dir / "tls" / "key.pem"

    def log(self) -> str:
        """The log file, earlier runs' lines included."""
        return self.log_path.read_text(errors="replace")

    def run_log(self) -> str:
        """This run's lines only."""
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    def client(self, timeout: float = 10.0, **kwargs: Any) -> httpx.Client:
        trusted = self.ca_path or self.cert_path
        verify: ssl.SSLContext | bool = tls_context(trusted) if self.scheme == "https" else True
        return httpx.Client(base_url=self.url, verify=verify, timeout=timeout, **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return int(self.process.returncode)


def start_manager(
    data_dir: Path,
    *,
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    port: int = 0,
    ca_path: Path | None = None,
    wait: bool = True,
) -> Manager:
    """Start ``mp-manager serve`` on 127.0.0.1 and (with ``wait``) wait until /health answers."""
    log_path = data_dir.parent / f"{data_dir.name}-manager.log"
    with log_path.open("ab") as log:
        offset = log.tell()
        process = subprocess.Popen(
            [
                str(MANAGER_BIN),
                "serve",
                "--data-dir",
                str(data_dir),
                "--listen-addr",
                "127.0.0.1",
                "--port",
                str(port),
                *(extra_args or []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=manager_env() if env is None else env,
            start_new_session=True,
        )
    manager = Manager(data_dir, process, log_path, ca_path=ca_path, log_offset=offset)
    if wait:
        wait_listening(manager)
    return manager


def wait_listening(manager: Manager, timeout: float = 30.0) -> None:
    """Wait for the ``listening on`` line, then for /health to answer 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if manager.process.poll() is not None:
            raise RuntimeError(f"mp-manager exited with {manager.process.returncode}:\n{manager.log()}")
        found = _LISTENING.search(manager.run_log())
        if found:
            manager.scheme, manager.port = found.group(1), int(found.group(2))
            break
        time.sleep(0.05)
    else:
        manager.stop()
        raise RuntimeError(f"mp-manager did not log 'listening on' in {timeout}s:\n{manager.log()}")
    with manager.client(timeout=2) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/health").status_code == 200:
                    return
            time.sleep(0.05)
    manager.stop()
    raise RuntimeError(f"mp-manager did not answer /health in {timeout}s:\n{manager.log()}")


@contextlib.contextmanager
def running_manager(tmp_path: Path, name: str = "manager", **kwargs: Any) -> Iterator[Manager]:
    """A started manager with its data dir in ``tmp_path/name``; stopped on exit."""
    manager = start_manager(tmp_path / name, **kwargs)
    try:
        yield manager
    finally:
        manager.stop()


def run_manager_cli(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``mp-manager ARGS`` to completion; stdout and stderr captured as text."""
    return subprocess.run(
        [str(MANAGER_BIN), *args],
        env=manager_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- users and sessions ------------------------------------------------------------------

ADMIN_USER = "root"
ADMIN_PASSWORD = "Root-Passw0rd-9f3c"
"""The first super_admin of :func:`setup_super_admin`: distinct, so a test can grep for it."""


def setup_super_admin(
    data_dir: Path, username: str = ADMIN_USER, password: str = ADMIN_PASSWORD, *, extra_args: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``mp-manager setup --username U --password-stdin`` on ``data_dir``; the completed process."""
    return subprocess.run(
        [
            str(MANAGER_BIN),
            "setup",
            "--data-dir",
            str(data_dir),
            "--username",
            username,
            "--password-stdin",
            *(extra_args or []),
        ],
        input=password + "\n",
        env=manager_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def login(client: httpx.Client, username: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> httpx.Response:
    """``POST /api/v1/auth/login``; on success the client holds both cookies, and sends the
    ``X-CSRF-Token`` header from then on."""
    response = client.post("/api/v1/auth/login", json={"username": username, "password": password})
    if response.status_code == 200:
        client.headers["X-CSRF-Token"] = response.json()["csrf_token"]
    return response


def manager_fingerprint(manager: Manager) -> str:
    """``AA:BB:…``: the SHA-256 of the manager's certificate, for an edge's ``cert_fingerprint``."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from appliance.manager_client import fingerprint_of

    cert = x509.load_pem_x509_certificate(manager.cert_path.read_bytes())
    return fingerprint_of(cert.public_bytes(Encoding.DER))
