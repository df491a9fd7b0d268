"""The edge's configuration directory: ``config.json`` + ``secrets.json`` (interop.md 1.1, 2.7, 2.8).

``config.json`` holds the AppConfig without its infrastructure secrets; ``secrets.json``
holds those secrets, encrypted (see :mod:`appliance.config.secrets`). The store splits a
config on save, merges the two files on load, and migrates secrets it finds in
``config.json``. Every write is atomic; ``secrets.json`` is always written before
``config.json``, so a crash between the two never loses a secret.

All methods block on disk I/O: call them through ``trio.to_thread.run_sync``. One store
per config directory and one caller at a time (the edge service owns it).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import secrets as _random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from appliance.config._dump import Exclude, public_json, revealed_json
from appliance.config._problems import FileProblem, describe_validation_error
from appliance.config.atomic import atomic_write, remove_stale_temp_files
from appliance.config.secrets import (
    KEY_FILE_NAME,
    SECRETS_FILE_NAME,
    EdgeSecrets,
    LoadedSecrets,
    SecretsFile,
    secrets_of,
)
from appliance.errors import ConfigFileError, Internal, InvalidInput, PersistFailed
from appliance.models.config import TUNNEL_SECRET_FIELDS, AppConfig, default_config
from appliance.untrusted import JsonTooDeep, load_json

__all__ = [
    "CONFIG_FILE_NAME",
    "DEFAULT_MACHINE_ID_PATH",
    "EdgeConfigStore",
    "ensure_jwt_secret",
    "fill_kept_secrets",
    "merge_kept_secrets",
    "public_config",
]

CONFIG_FILE_NAME = "config.json"
DEFAULT_MACHINE_ID_PATH = Path("/etc/machine-id")

log = logging.getLogger(__name__)

# interop.md 2.7: the infrastructure secrets, as they sit inside an AppConfig.
_SERVER_SECRETS = ("auth", "tls")
_MANAGER_SECRETS = ("node_secret", "registration_token")
_SECRET_EXCLUDE: Exclude = {
    "server": set(_SERVER_SECRETS),
    "manager": set(_MANAGER_SECRETS),
    "tunnels": {"__all__": set(TUNNEL_SECRET_FIELDS)},
}


# --------------------------------------------------------------------------- views and merging


def public_config(config: AppConfig) -> dict[str, Any]:
    """The ``GET /api/v1/config`` view: JSON-ready, with every infrastructure secret removed.

    ``server`` keeps only ``listen_addr`` and ``listen_port`` (no ``auth``, no ``tls``);
    ``manager`` loses ``node_secret`` and ``registration_token``; tunnels lose their key,
    bind secret, PSK and certificate. Flows are complete: their user parameters (SRT
    passphrase, stream keys, RTSP credentials, bearer tokens) are returned (interop.md 2.7).
    Never contains a ``**********`` mask: a secret field that escapes the exclude list
    raises Internal instead.
    """
    data: dict[str, Any] = public_json(config, _SECRET_EXCLUDE)
    return data


def merge_kept_secrets(new: AppConfig, current: AppConfig) -> AppConfig:
    """``new`` with the stored secrets it leaves out taken from ``current`` (interop.md 2.7).

    For ``PUT /api/v1/config`` and the manager's ``update_config``: a client that echoes
    ``GET /api/v1/config`` back must not wipe secrets it was never shown.

    - ``server.auth`` absent (or null): the stored auth object is kept. Present without
      ``jwt_secret``: the stored ``jwt_secret`` is kept. To turn auth off, send
      ``{"enabled": false}``.
    - ``server.tls`` absent: the stored TLS setting is kept.
    - ``manager.node_secret`` / ``manager.registration_token`` absent: kept, when both
      configs have a manager object (a removed manager object takes its secrets along).
    - Tunnel secret fields absent: kept from the stored tunnel with the same id.

    A value that is present always replaces the stored one. ``new`` and ``current`` are not
    modified. A body that fails validation because a tunnel secret is missing (relay mode
    needs ``tunnel_encryption_key``) needs :func:`fill_kept_secrets` before validation.
    """
    stored_auth = current.server.auth
    auth = new.server.auth
    if auth is None:
        auth = stored_auth
    elif auth.jwt_secret is None and stored_auth is not None and stored_auth.jwt_secret is not None:
        auth = auth.model_copy(update={"jwt_secret": stored_auth.jwt_secret})
    tls = new.server.tls if new.server.tls is not None else current.server.tls
    server = new.server.model_copy(update={"auth": auth, "tls": tls})

    manager = new.manager
    if manager is not None and current.manager is not None:
        kept = _kept(manager, current.manager, _MANAGER_SECRETS)
        if kept:
            manager = manager.model_copy(update=kept)

    stored_tunnels = {tunnel.id: tunnel for tunnel in current.tunnels}
    tunnels = []
    for tunnel in new.tunnels:
        stored = stored_tunnels.get(tunnel.id)
        kept = _kept(tunnel, stored, TUNNEL_SECRET_FIELDS) if stored is not None else {}
        tunnels.append(tunnel.model_copy(update=kept) if kept else tunnel)

    return new.model_copy(update={"server": server, "manager": manager, "tunnels": tunnels})


def fill_kept_secrets(body: Any, current: AppConfig) -> Any:
    """A deep copy of the raw JSON ``body`` with left-out stored secrets filled in.

    The same rules as :func:`merge_kept_secrets`, applied before validation, so that a
    relay-mode tunnel echoed back without its ``tunnel_encryption_key`` (which
    ``GET /api/v1/config`` never shows) validates. A body that is not a JSON object, or
    parts of it that have the wrong shape, are left for validation to report.
    """
    filled = copy.deepcopy(body)
    if isinstance(filled, dict):
        _fill_secrets(filled, secrets_of(current))
    return filled


def ensure_jwt_secret(config: AppConfig) -> AppConfig:
    """``config`` with a new 64-hex-char ``jwt_secret`` when auth is enabled without one.

    interop.md 2.1. Returns ``config`` itself (the same object) when nothing was needed;
    the caller persists a changed config.
    """
    auth = config.server.auth
    if auth is None or not auth.enabled or auth.jwt_secret is not None:
        return config
    auth = auth.model_copy(update={"jwt_secret": SecretStr(_random.token_hex(32))})
    return config.model_copy(update={"server": config.server.model_copy(update={"auth": auth})})


def _kept(new: Any, stored: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: getattr(stored, name)
        for name in names
        if getattr(new, name) is None and getattr(stored, name) is not None
    }


def _fill_secrets(raw: dict[str, Any], secrets: EdgeSecrets) -> None:
    """Fill the secrets ``raw`` (a config JSON object) leaves out or sets to null, in place."""
    stored = revealed_json(secrets)
    server = raw.get("server")
    if isinstance(server, dict):
        auth = server.get("auth")
        stored_auth = stored["server_auth"]
        if auth is None:
            if stored_auth is not None:
                server["auth"] = stored_auth
        elif isinstance(auth, dict) and auth.get("jwt_secret") is None and stored_auth is not None:
            if stored_auth.get("jwt_secret") is not None:
                auth["jwt_secret"] = stored_auth["jwt_secret"]
        if server.get("tls") is None and stored["server_tls"] is not None:
            server["tls"] = stored["server_tls"]
    manager = raw.get("manager")
    if isinstance(manager, dict):
        for name in _MANAGER_SECRETS:
            value = stored[f"manager_{name}"]
            if manager.get(name) is None and value is not None:
                manager[name] = value
    tunnels = raw.get("tunnels")
    if isinstance(tunnels, list):
        for tunnel in tunnels:
            if not isinstance(tunnel, dict):
                continue
            try:
                tunnel_id = str(uuid.UUID(str(tunnel.get("id"))))
            except ValueError:
                continue  # validation reports the bad id
            stored_tunnel = stored["tunnels"].get(tunnel_id, {})
            for name in TUNNEL_SECRET_FIELDS:
                if tunnel.get(name) is None and stored_tunnel.get(name) is not None:
                    tunnel[name] = stored_tunnel[name]


def _secret_names(raw: dict[str, Any]) -> list[str]:
    """The JSON paths of the (non-null) infrastructure secrets present in a config object."""
    names: list[str] = []
    for section, fields in (("server", _SERVER_SECRETS), ("manager", _MANAGER_SECRETS)):
        part = raw.get(section)
        if isinstance(part, dict):
            names.extend(f"{section}.{name}" for name in fields if part.get(name) is not None)
    tunnels = raw.get("tunnels")
    if isinstance(tunnels, list):
        for index, tunnel in enumerate(tunnels):
            if isinstance(tunnel, dict):
                names.extend(
                    f"tunnels[{index}].{name}" for name in TUNNEL_SECRET_FIELDS if tunnel.get(name) is not None
                )
    return names


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True, slots=True)
class _Assembled:
    config: AppConfig
    moved: list[str]
    """Secrets found in config.json (JSON paths), to be moved to secrets.json."""
    secrets: LoadedSecrets


class EdgeConfigStore:
    """The edge configuration directory (``--config-dir``): config.json, secrets.json, .secrets_key.

    Files are written 0600 and atomically; the directory is created 0700. The machine-id
    path is injectable so that tests (and images) can point it elsewhere.
    """

    def __init__(self, config_dir: Path, *, machine_id_path: Path = DEFAULT_MACHINE_ID_PATH) -> None:
        self.config_dir = config_dir
        self.config_path = config_dir / CONFIG_FILE_NAME
        self._secrets = SecretsFile(config_dir, machine_id_path)

    @property
    def secrets_path(self) -> Path:
        """Where secrets.json lives."""
        return self._secrets.path

    def load(self) -> AppConfig:
        """Load the configuration at start, in the order of interop.md 1.1.

        Creates the directory (0700) and a default config.json when missing; generates
        and persists ``node_id`` when absent; removes the temp files left by interrupted
        writes (logging how many); reads secrets.json (rewriting a legacy
        plaintext file encrypted); moves secrets found in config.json into secrets.json
        (secrets.json written first, the moved field names logged, never the values; a
        secret in both files takes the config.json value); generates a ``jwt_secret``
        when auth is enabled without one. Returns the merged config, secrets included.

        Raises ConfigFileError (one line naming the file and the JSON path, never a value)
        when a file cannot be read, decrypted or validated; that file is not touched.
        Raises PersistFailed when a needed write fails.
        """
        try:
            self._ensure_dir()
            self._remove_stale_temp_files()
            raw = self._read_config_json(create_default=True)
            assembled = self._assemble(raw)
        except FileProblem as problem:
            raise ConfigFileError(str(problem)) from problem

        config = assembled.config
        write_secrets = write_config = False
        if config.node_id is None:
            config = config.model_copy(update={"node_id": uuid.uuid4()})
            log.info("generated node_id %s", config.node_id)
            write_config = True
        with_jwt = ensure_jwt_secret(config)
        if with_jwt is not config:
            config = with_jwt
            log.info("generated server.auth.jwt_secret")
            write_secrets = True
        if assembled.moved:
            log.warning(
                "moving secrets from %s to %s: %s", self.config_path, self.secrets_path, ", ".join(assembled.moved)
            )
            write_secrets = write_config = True
        if assembled.secrets.legacy_plaintext:
            log.warning("%s is plaintext; rewriting it encrypted", self.secrets_path)
            write_secrets = True

        # interop.md 2.8: secrets.json first, so a crash in between leaves every secret on disk.
        if write_secrets:
            self._secrets.write(secrets_of(config))
        if write_config:
            self._write_config_json(config)
        return config

    def read(self) -> AppConfig:
        """Re-read and merge both files without writing anything (``POST /api/v1/config/reload``).

        Secrets still in config.json are used (config.json wins) but not moved; a missing
        ``node_id`` or ``jwt_secret`` is not generated (see :func:`ensure_jwt_secret`).
        Raises InvalidInput ("loaded config invalid: <JSON path>: <message> (<file>)") when
        a file parses but does not validate; Internal when a file is missing, unreadable,
        cannot be decrypted or is not JSON.
        """
        try:
            return self._assemble(self._read_config_json(create_default=False)).config
        except FileProblem as problem:
            if problem.invalid:
                raise InvalidInput(f"loaded config invalid: {problem.detail} ({problem.path.name})") from problem
            raise Internal(f"cannot load {problem.path.name}: {problem.detail}") from problem

    def save(self, config: AppConfig) -> None:
        """Persist ``config``: its secrets to secrets.json (first), the rest to config.json.

        Both writes are atomic (0600). config.json never holds an infrastructure secret
        and leaves ``tunnels`` out when there are none. Raises PersistFailed; when the
        second write fails, secrets.json is already new and config.json still old.
        """
        try:
            self._ensure_dir()
        except FileProblem as problem:
            raise PersistFailed(str(problem)) from problem
        self._secrets.write(secrets_of(config))
        self._write_config_json(config)

    # ----------------------------------------------------------------------- internals

    def _ensure_dir(self) -> None:
        if self.config_dir.is_dir():
            return
        try:
            self.config_dir.mkdir(mode=0o700, parents=True)
            os.chmod(self.config_dir, 0o700)  # mkdir's mode is filtered by the umask
        except OSError as exc:
            raise FileProblem(self.config_dir, f"cannot create the directory: {exc.strerror}", invalid=False) from exc
        log.info("created %s", self.config_dir)

    def _remove_stale_temp_files(self) -> None:
        # Only at start: the edge is the directory's only writer, and it is not writing yet.
        removed = remove_stale_temp_files(self.config_dir, (CONFIG_FILE_NAME, SECRETS_FILE_NAME, KEY_FILE_NAME))
        if removed:
            noun = "temp file" if removed == 1 else "temp files"
            log.info("removed %d stale %s of interrupted writes from %s", removed, noun, self.config_dir)

    def _read_config_json(self, *, create_default: bool) -> dict[str, Any]:
        path = self.config_path
        try:
            content = path.read_bytes()
        except FileNotFoundError as exc:
            if not create_default:
                raise FileProblem(path, "the file does not exist", invalid=False) from exc
            # interop.md 1.1 steps 1 and 2: defaults, with a node_id, in one write.
            config = default_config().model_copy(update={"node_id": uuid.uuid4()})
            self._write_config_json(config)
            log.info("wrote a default %s (node_id %s)", path, config.node_id)
            return _config_file_data(config)
        except OSError as exc:
            raise FileProblem(path, f"cannot read: {exc.strerror}", invalid=False) from exc
        try:
            data = load_json(content.decode("utf-8"))
        except JsonTooDeep as exc:
            raise FileProblem(path, str(exc), invalid=False) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            # Both messages carry a position, never the document.
            raise FileProblem(path, f"not valid JSON: {exc}", invalid=False) from exc
        if not isinstance(data, dict):
            raise FileProblem(path, "$: expected a JSON object", invalid=True)
        return data

    def _assemble(self, raw: dict[str, Any]) -> _Assembled:
        loaded = self._secrets.read()
        merged = copy.deepcopy(raw)
        _fill_secrets(merged, loaded.secrets)  # only fills gaps: a config.json secret wins
        try:
            config = AppConfig.model_validate(merged)
        except ValidationError as exc:
            # from None: the ValidationError's own text would echo values, secrets included.
            raise FileProblem(self.config_path, describe_validation_error(exc, merged), invalid=True) from None
        return _Assembled(config, _secret_names(raw), loaded)

    def _write_config_json(self, config: AppConfig) -> None:
        text = json.dumps(_config_file_data(config), indent=2, ensure_ascii=False) + "\n"
        atomic_write(self.config_path, text.encode("utf-8"), 0o600)


def _config_file_data(config: AppConfig) -> dict[str, Any]:
    """config.json's content: the public view, without ``tunnels`` when empty (interop.md 2)."""
    data = public_config(config)
    if not config.tunnels:
        del data["tunnels"]
    return data
