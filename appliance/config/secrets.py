"""``secrets.json``: the edge's infrastructure secrets, encrypted at rest (interop.md 2.7, 2.8).

On disk the file is ``v1:`` + standard base64 (padded, no newline) of
``nonce(12) || ciphertext || tag(16)``: AES-256-GCM with a fresh random nonce per write
and no associated data. The key is HKDF-SHA256 (32 bytes) over the stripped ASCII text
of ``/etc/machine-id``, or of ``.secrets_key`` in the config directory when the machine
has no (or an empty) machine-id. A copied config directory is useless on another box;
this is not a defence against local root.

The plaintext is UTF-8 JSON, validated by :class:`EdgeSecrets`. A file starting with
``{`` is legacy plaintext: it is accepted, and the store rewrites it encrypted.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets as _random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import Field, SecretStr, Strict, ValidationError

from appliance.config._dump import revealed_json
from appliance.config._problems import FileProblem, describe_validation_error
from appliance.config.atomic import atomic_write
from appliance.errors import PersistFailed
from appliance.models.config import (
    TUNNEL_SECRET_FIELDS,
    AppConfig,
    Hex64Secret,
    ServerAuth,
    StrictModel,
    TlsConfig,
)
from appliance.untrusted import JsonTooDeep, load_json

__all__ = [
    "FORMAT_PREFIX",
    "HKDF_INFO",
    "HKDF_SALT",
    "KEY_FILE_NAME",
    "SECRETS_FILE_NAME",
    "EdgeSecrets",
    "LoadedSecrets",
    "SecretsFile",
    "TunnelSecrets",
    "derive_key",
    "seal",
    "secrets_of",
    "unseal",
]

SECRETS_FILE_NAME = "secrets.json"
KEY_FILE_NAME = ".secrets_key"
FORMAT_PREFIX = b"v1:"
HKDF_SALT = b"mediaplane-edge-secrets-v1"
HKDF_INFO = b"mediaplane-edge secrets.json aes-256-gcm"
_NONCE_BYTES = 12
_TAG_BYTES = 16


# --------------------------------------------------------------------------- the plaintext model


class TunnelSecrets(StrictModel):
    """The secret fields of one tunnel. Declared as in TunnelConfig (a test keeps them equal)."""

    tunnel_encryption_key: Hex64Secret | None = None
    tunnel_bind_secret: Hex64Secret | None = None
    tunnel_psk: SecretStr | None = Field(default=None, min_length=1, max_length=4096)
    tls_cert_pem: SecretStr | None = Field(default=None, max_length=65536)
    tls_key_pem: SecretStr | None = Field(default=None, max_length=65536)


class EdgeSecrets(StrictModel):
    """The plaintext of secrets.json (interop.md 2.7); unknown keys are errors."""

    version: Literal[1] = 1
    server_auth: ServerAuth | None = None
    server_tls: TlsConfig | None = None
    manager_node_secret: SecretStr | None = Field(default=None, max_length=4096)
    manager_registration_token: SecretStr | None = Field(default=None, max_length=4096)
    tunnels: dict[Annotated[uuid.UUID, Strict(False)], TunnelSecrets] = Field(default_factory=dict)


def secrets_of(config: AppConfig) -> EdgeSecrets:
    """The infrastructure secrets held in ``config``, as stored in secrets.json."""
    manager = config.manager
    return EdgeSecrets(
        server_auth=config.server.auth,
        server_tls=config.server.tls,
        manager_node_secret=manager.node_secret if manager else None,
        manager_registration_token=manager.registration_token if manager else None,
        tunnels={
            tunnel.id: TunnelSecrets(**{name: getattr(tunnel, name) for name in TUNNEL_SECRET_FIELDS})
            for tunnel in config.tunnels
        },
    )


# --------------------------------------------------------------------------- the format


def derive_key(ikm: bytes) -> bytes:
    """The AES-256-GCM key: HKDF-SHA256 over ``ikm`` with the interop.md 2.8 salt and info."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=HKDF_SALT, info=HKDF_INFO).derive(ikm)


def seal(plaintext: bytes, key: bytes, nonce: bytes) -> bytes:
    """The file content for ``plaintext``: ``v1:`` + base64(nonce || ciphertext || tag).

    ``nonce`` must be 12 fresh random bytes, never reused with the same key.
    """
    if len(nonce) != _NONCE_BYTES:
        raise ValueError("the nonce must be 12 bytes")
    sealed = AESGCM(key).encrypt(nonce, plaintext, None)
    return FORMAT_PREFIX + base64.b64encode(nonce + sealed)


def unseal(content: bytes, key: bytes) -> bytes:
    """The plaintext of a ``v1:`` file. Raises ValueError (a message without content)."""
    if not content.startswith(FORMAT_PREFIX):
        raise ValueError("not a v1 encrypted secrets file")
    try:
        blob = base64.b64decode(content[len(FORMAT_PREFIX) :].strip(), validate=True)
    except binascii.Error:
        raise ValueError("the v1 payload is not valid base64") from None
    if len(blob) < _NONCE_BYTES + _TAG_BYTES:
        raise ValueError("the v1 payload is too short")
    try:
        return AESGCM(key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], None)
    except InvalidTag:
        raise ValueError("decryption failed") from None


# --------------------------------------------------------------------------- the file


@dataclass(frozen=True, slots=True)
class LoadedSecrets:
    """What :meth:`SecretsFile.read` found."""

    secrets: EdgeSecrets
    """The validated secrets; empty when the file does not exist."""
    exists: bool
    legacy_plaintext: bool
    """True when the file was plaintext JSON and should be rewritten encrypted."""


class SecretsFile:
    """secrets.json in one config directory, with its key source (blocking I/O)."""

    def __init__(self, config_dir: Path, machine_id_path: Path) -> None:
        self.config_dir = config_dir
        self.path = config_dir / SECRETS_FILE_NAME
        self.key_path = config_dir / KEY_FILE_NAME
        self.machine_id_path = machine_id_path

    def read(self) -> LoadedSecrets:
        """Read, decrypt and validate the file; never writes anything (not even a key).

        Raises FileProblem: ``invalid=False`` when the file or its key cannot be read or
        the content cannot be decrypted or parsed, ``invalid=True`` when the JSON is not
        valid secrets.
        """
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return LoadedSecrets(EdgeSecrets(), exists=False, legacy_plaintext=False)
        except OSError as exc:
            raise FileProblem(self.path, f"cannot read: {exc.strerror}", invalid=False) from exc

        legacy = content.lstrip().startswith(b"{")
        if legacy:
            plaintext = content
        else:
            ikm, source = self._ikm(create=False)
            if ikm is None:
                raise FileProblem(
                    self.path,
                    f"cannot be decrypted: {self.machine_id_path} is missing or empty and there is "
                    f"no {self.key_path} (copied from another machine?); restore the key source, or move "
                    "the file away and enter the secrets again",
                    invalid=False,
                )
            try:
                plaintext = unseal(content, derive_key(ikm))
            except ValueError as exc:
                raise FileProblem(
                    self.path,
                    f"cannot be decrypted with the key derived from {source} ({exc}): a cloned image or a "
                    "new machine-id gives a new key; restore the original key source, or move the file "
                    "away and enter the secrets again",
                    invalid=False,
                ) from exc

        try:
            data = load_json(plaintext.decode("utf-8"))
        except JsonTooDeep as exc:
            raise FileProblem(self.path, str(exc), invalid=False) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            # The messages carry a position only, never the document.
            raise FileProblem(self.path, f"the content is not JSON: {exc}", invalid=False) from exc
        try:
            secrets = EdgeSecrets.model_validate(data)
        except ValidationError as exc:
            # from None: the ValidationError's own text would echo the secret values.
            raise FileProblem(self.path, describe_validation_error(exc, data), invalid=True) from None
        return LoadedSecrets(secrets, exists=True, legacy_plaintext=legacy)

    def write(self, secrets: EdgeSecrets) -> None:
        """Encrypt and write ``secrets`` atomically at 0600, creating ``.secrets_key`` if needed.

        Raises PersistFailed; the old file is then intact.
        """
        try:
            ikm, _ = self._ikm(create=True)
        except FileProblem as problem:
            raise PersistFailed(f"cannot write {self.path}: {problem}") from problem
        assert ikm is not None  # create=True always yields a key
        plaintext = json.dumps(revealed_json(secrets), separators=(",", ":"), ensure_ascii=False).encode()
        atomic_write(self.path, seal(plaintext, derive_key(ikm), os.urandom(_NONCE_BYTES)), 0o600)

    def _ikm(self, *, create: bool) -> tuple[bytes | None, Path]:
        """The HKDF input and the file it came from (interop.md 2.8).

        The machine-id wins when it has content; else ``.secrets_key``, which is created
        (64 hex chars of 32 random bytes, mode 0600) only when ``create`` is true.
        """
        machine_id = self._stripped(self.machine_id_path)
        if machine_id:
            return machine_id, self.machine_id_path
        key_text = self._stripped(self.key_path)
        if key_text is None and create:
            atomic_write(self.key_path, _random.token_hex(32).encode("ascii"), 0o600)
            key_text = self._stripped(self.key_path)
        if key_text == b"":
            raise FileProblem(self.key_path, "is empty", invalid=False)
        return key_text, self.key_path

    @staticmethod
    def _stripped(path: Path) -> bytes | None:
        """The stripped ASCII content of ``path``; None when the file does not exist."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FileProblem(path, f"cannot read: {exc.strerror}", invalid=False) from exc
        try:
            return raw.decode("ascii").strip().encode("ascii")
        except UnicodeDecodeError:
            raise FileProblem(path, "is not ASCII text", invalid=False) from None
