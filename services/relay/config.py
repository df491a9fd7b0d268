"""``relay.json``: the relay's one configuration file (interop.md 1.2).

:class:`RelayConfig` is the one model of the file. :class:`RelayConfigStore` loads it (a missing
file means the built-in defaults; a file that cannot be read or validated is a
:class:`~appliance.errors.ConfigFileError`, exit status 2, and is never overwritten), applies the
command-line overrides for one run (never written back), and rewrites the file atomically at
0600 when the manager link changes the credentials (``register_ack``, ``rotate_secret``).

Secrets (``api_token``, ``manager.registration_token``, ``manager.node_secret``) are
``SecretStr``: only :meth:`RelayConfigStore.save` reveals them, into the file itself; no error
text or log line carries one.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any, Final

from pydantic import Field, SecretStr, ValidationError, model_validator

from appliance.config._dump import public_json, revealed_json
from appliance.config._problems import describe_validation_error
from appliance.config.atomic import atomic_writer
from appliance.errors import ConfigFileError
from appliance.models.config import BindAddr, HostPort, ManagerConfig, StrictModel
from appliance.untrusted import JsonTooDeep, load_json

__all__ = [
    "DEFAULT_API_ADDR",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_QUIC_ADDR",
    "DEFAULT_UDP_RELAY_ADDR",
    "SECRET_KEYS",
    "RelayConfig",
    "RelayConfigStore",
]

_log = logging.getLogger("mediaplane.relay.config")

DEFAULT_CONFIG_PATH: Final = "/etc/mediaplane/relay.json"
DEFAULT_QUIC_ADDR: Final = "0.0.0.0:4433"
DEFAULT_UDP_RELAY_ADDR: Final = "0.0.0.0:4434"
DEFAULT_API_ADDR: Final = "0.0.0.0:4480"
FILE_MODE: Final = 0o600  # interop.md 1.2: relay.json holds the node secret, kept at 0600
SECRET_KEYS: Final = ("api_token", "manager.registration_token", "manager.node_secret")
"""What ``get_config`` leaves out (interop.md 6 ``config_response``: secrets stripped)."""


class RelayConfig(StrictModel):
    """``relay.json`` (interop.md 1.2). Unknown keys are errors; every key has its default.

    The three listen addresses accept port 0 (an ephemeral port, which the relay logs once it is
    bound): the tests use it; the appliance never does.
    """

    quic_addr: BindAddr = Field(default=DEFAULT_QUIC_ADDR, description="QUIC listener (UDP), interop.md 8.")
    udp_relay_addr: BindAddr = Field(default=DEFAULT_UDP_RELAY_ADDR, description="Native UDP plane, interop.md 9.")
    api_addr: BindAddr = Field(default=DEFAULT_API_ADDR, description="REST API and /metrics (HTTP).")
    udp_relay_enabled: bool = True
    public_quic_addr: HostPort | None = Field(default=None, description="Reported in health behind NAT.")
    public_udp_addr: HostPort | None = Field(default=None, description="Reported in health behind NAT.")
    tls_cert_path: str | None = Field(default=None, min_length=1, max_length=4096)
    tls_key_path: str | None = Field(default=None, min_length=1, max_length=4096)
    api_token: SecretStr | None = Field(default=None, min_length=32, max_length=128)
    require_bind_auth: bool = False
    max_connections_per_ip: int = Field(default=64, ge=1, le=1_000_000)
    max_tunnels_per_connection: int = Field(default=100, ge=1, le=1_000_000)
    manager: ManagerConfig | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> RelayConfig:
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ValueError("tls_cert_path and tls_key_path go together: set both or neither")
        return self

    def public(self) -> dict[str, Any]:
        """The config as ``get_config`` answers it: secrets left out entirely (interop.md 6)."""
        exclude: dict[str, Any] = {"api_token": True}
        if self.manager is not None:
            exclude["manager"] = {"registration_token": True, "node_secret": True}
        data: dict[str, Any] = public_json(self, exclude)
        return data


def _file_data(config: RelayConfig) -> dict[str, Any]:
    """What :meth:`RelayConfigStore.save` writes: secrets revealed, null keys left out."""
    data: dict[str, Any] = revealed_json(config)

    def drop_none(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: drop_none(item) for key, item in value.items() if item is not None}
        return value

    result: dict[str, Any] = drop_none(data)
    return result


class RelayConfigStore:
    """The relay's ``relay.json``: load once at start, rewrite on a credential change.

    ``file_config`` is the file as loaded (and as last written); ``config`` is what this run
    uses, the command-line overrides applied on top. Saving starts from ``file_config``, so an
    override never reaches the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file_config = RelayConfig()
        self.config = self.file_config
        self._overrides: dict[str, Any] = {}

    def load(self) -> RelayConfig:
        """Read the file (missing: defaults). Raises ConfigFileError naming the file and the
        JSON path, never a value; the file is then left as it is."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            _log.info("%s does not exist: using the built-in defaults", self.path)
            self.file_config = RelayConfig()
        except OSError as exc:
            raise ConfigFileError(f"{self.path}: cannot read: {exc.strerror or type(exc).__name__}") from exc
        else:
            self.file_config = parse_relay_json(self.path, raw)
        self.config = self._apply(self.file_config)
        return self.config

    def override(
        self,
        *,
        quic_addr: str | None = None,
        udp_relay_addr: str | None = None,
        api_addr: str | None = None,
        no_udp_relay: bool = False,
    ) -> RelayConfig:
        """Command-line overrides for this run only (interop.md 1.2). Raises ConfigFileError
        (the flag named) for an invalid address."""
        overrides: dict[str, Any] = {
            key: value
            for key, value in (("quic_addr", quic_addr), ("udp_relay_addr", udp_relay_addr), ("api_addr", api_addr))
            if value is not None
        }
        if no_udp_relay:
            overrides["udp_relay_enabled"] = False
        self._overrides = overrides
        self.config = self._apply(self.file_config)
        return self.config

    def _apply(self, base: RelayConfig) -> RelayConfig:
        if not self._overrides:
            return base
        data = {**revealed_json(base), **self._overrides}
        try:
            return RelayConfig.model_validate(data)
        except ValidationError as exc:
            flags = {"quic_addr": "--quic-addr", "udp_relay_addr": "--udp-addr", "api_addr": "--api-addr"}
            problem = describe_validation_error(exc, data)
            for key, flag in flags.items():
                problem = problem.replace(f"$.{key}", flag)
            raise ConfigFileError(f"invalid command-line override: {problem}") from None

    # ------------------------------------------------------------------ writes
    def save(self, config: RelayConfig) -> None:
        """Replace the file with ``config`` atomically at 0600 (blocking: run it in a thread).
        Raises PersistFailed (the file and the OS reason); the old file then stays."""
        data = _file_data(config)

        with atomic_writer(self.path, FILE_MODE) as out:
            out.write((json.dumps(data, indent=2) + "\n").encode())
        self.file_config = config
        self.config = self._apply(config)

    def with_credentials(self, node_id: str, node_secret: SecretStr) -> RelayConfig:
        """The file config after a ``register_ack`` (interop.md 1.2): ``manager.node_id`` and
        ``manager.node_secret`` set, ``registration_token`` cleared."""
        manager = self.file_config.manager or ManagerConfig()
        updated = manager.model_copy(
            update={"node_id": uuid.UUID(node_id), "node_secret": node_secret, "registration_token": None}
        )
        return self.file_config.model_copy(update={"manager": updated})

    def with_secret(self, node_secret: SecretStr) -> RelayConfig:
        """The file config after ``rotate_secret``."""
        manager = self.file_config.manager or ManagerConfig()
        return self.file_config.model_copy(update={"manager": manager.model_copy(update={"node_secret": node_secret})})


def parse_relay_json(path: Path, raw: bytes) -> RelayConfig:
    """Validate the bytes of ``relay.json``; ConfigFileError (file and JSON path, no value)."""
    try:
        data = load_json(raw)
    except JsonTooDeep as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigFileError(f"{path}: not valid JSON") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: $: expected a JSON object")
    try:
        return RelayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigFileError(f"{path}: {describe_validation_error(exc, data)}") from None
