"""The manager's start-up settings: the ``serve`` flags and the environment (interop.md 1.3).

One resolver turns flags plus environment into :class:`ManagerSettings`, checking in this
order, and stopping at the first problem with :class:`StartupError` (exit status 2):

1. ``MEDIAPLANE_JWT_SECRET``, then ``MEDIAPLANE_MASTER_KEY``: required, exactly 64 hex
   characters each. The message names the variable, never its value (interop.md 1.3).
2. The TLS mode: ``--tls-mode`` when given, else ``MEDIAPLANE_TLS_MODE``, else ``direct``.
   A flag beats the environment, which beats the default (the order the ``mp`` CLI uses,
   style.md 5); with the flag given, the variable is not read at all.
3. ``--listen-addr`` must be an IP address (hypercorn would otherwise resolve a name).

Nothing here touches the disk or the network.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from pydantic import SecretStr

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_LISTEN_ADDR",
    "DEFAULT_PORT",
    "JWT_SECRET_ENV",
    "MASTER_KEY_ENV",
    "TLS_MODE_ENV",
    "LogLevel",
    "ManagerSettings",
    "StartupError",
    "TlsMode",
    "master_key_from_env",
    "resolve_settings",
]

DEFAULT_DATA_DIR: Final = Path("/var/lib/mediaplane/manager")
DEFAULT_LISTEN_ADDR: Final = "0.0.0.0"
DEFAULT_PORT: Final = 8443
JWT_SECRET_ENV: Final = "MEDIAPLANE_JWT_SECRET"
MASTER_KEY_ENV: Final = "MEDIAPLANE_MASTER_KEY"
TLS_MODE_ENV: Final = "MEDIAPLANE_TLS_MODE"

# interop.md 1.3: "64 hex chars". Either case is accepted: the value is used as it is
# (7.7 feeds the master key's *text* to HKDF), so it is never normalised either.
_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")


class TlsMode(StrEnum):
    """How the manager speaks HTTP (interop.md 1.3)."""

    DIRECT = "direct"
    """HTTPS on the manager's own port with ``DATA_DIR/tls``; HSTS on every response."""
    BEHIND_PROXY = "behind_proxy"
    """Plain HTTP behind a proxy that terminates TLS; no HSTS, no ``Secure`` cookies."""


class LogLevel(StrEnum):
    """``--log-level`` (interop.md 1: every service takes these four)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class StartupError(Exception):
    """The manager cannot start; ``message`` is one line, never holding a secret."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class ManagerSettings:
    """Everything ``mp-manager serve`` was started with. The secrets never show in a repr."""

    data_dir: Path
    listen_addr: str
    port: int
    """0 asks the kernel for a free port; the log line then names the one bound."""
    tls_mode: TlsMode
    jwt_secret: SecretStr
    """``MEDIAPLANE_JWT_SECRET``: signs the session JWTs (interop.md 7.1)."""
    master_key: SecretStr
    """``MEDIAPLANE_MASTER_KEY``: the at-rest key is derived from it (interop.md 7.7)."""
    database_url: SecretStr | None = None
    """``--database-url``; None means the embedded SQLite ``DATA_DIR/manager.db``. Secret
    because a PostgreSQL URL carries a password."""
    log_level: LogLevel = LogLevel.INFO

    @property
    def tls_dir(self) -> Path:
        """``DATA_DIR/tls``: ``cert.pem`` and ``key.pem`` (interop.md 1.3)."""
        return self.data_dir / "tls"


def resolve_settings(
    environ: Mapping[str, str],
    *,
    data_dir: Path = DEFAULT_DATA_DIR,
    listen_addr: str = DEFAULT_LISTEN_ADDR,
    port: int = DEFAULT_PORT,
    tls_mode: TlsMode | None = None,
    database_url: str | None = None,
    log_level: LogLevel = LogLevel.INFO,
) -> ManagerSettings:
    """The settings of one run from the flags and ``environ``; StartupError (status 2) on a problem."""
    jwt_secret = _hex64_secret(environ, JWT_SECRET_ENV)
    master_key = _hex64_secret(environ, MASTER_KEY_ENV)
    mode = tls_mode if tls_mode is not None else _tls_mode_from_env(environ)
    try:
        ipaddress.ip_address(listen_addr)
    except ValueError:
        raise StartupError("--listen-addr must be an IPv4 or IPv6 address") from None
    if not 0 <= port <= 65535:
        raise StartupError("--port must be 0-65535")
    return ManagerSettings(
        data_dir=data_dir,
        listen_addr=listen_addr,
        port=port,
        tls_mode=mode,
        jwt_secret=jwt_secret,
        master_key=master_key,
        database_url=SecretStr(database_url) if database_url else None,
        log_level=log_level,
    )


def master_key_from_env(environ: Mapping[str, str]) -> SecretStr:
    """``MEDIAPLANE_MASTER_KEY`` alone (``backup`` and ``restore`` need no other); StartupError (2)."""
    return _hex64_secret(environ, MASTER_KEY_ENV)


def _hex64_secret(environ: Mapping[str, str], name: str) -> SecretStr:
    value = environ.get(name)
    # interop.md 1.3: name the variable, never its value (nor its length, which narrows it).
    if value is None:
        raise StartupError(f"{name} is not set: it must hold exactly 64 hex characters")
    if not _HEX64.fullmatch(value):
        raise StartupError(f"{name} is malformed: it must hold exactly 64 hex characters")
    return SecretStr(value)


def _tls_mode_from_env(environ: Mapping[str, str]) -> TlsMode:
    raw = environ.get(TLS_MODE_ENV)
    if raw is None or raw == "":
        return TlsMode.DIRECT  # interop.md 1.3: the default
    try:
        return TlsMode(raw)
    except ValueError:
        # Not a secret, but not echoed either (interop.md 13: no rejected input in errors).
        raise StartupError(f"{TLS_MODE_ENV} must be 'direct' or 'behind_proxy'") from None
