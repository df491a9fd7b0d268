"""secrets.json at rest (interop.md 2.8): format, key, legacy plaintext, tamper, key fallback."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from appliance.config.secrets import EdgeSecrets, TunnelSecrets, seal, unseal
from appliance.config.store import EdgeConfigStore
from appliance.errors import ConfigFileError, Internal
from appliance.models.config import TUNNEL_SECRET_FIELDS, ManagerConfig, TunnelConfig
from tests.appliance.conftest import (
    CLIENT_SECRET,
    DIRECT_PSK,
    DIRECT_TUNNEL_ID,
    JWT_SECRET,
    MACHINE_ID,
    NODE_SECRET,
    REGISTRATION_TOKEN,
    RELAY_BIND_SECRET,
    RELAY_KEY,
    RELAY_TUNNEL_ID,
    TLS_CERT_PATH,
    TLS_CERT_PEM,
    TLS_KEY_PATH,
    TLS_KEY_PEM,
    decrypt_file,
    full_config,
    key_for,
)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_the_file_is_v1_base64_of_aes_256_gcm_with_the_documented_key(store: EdgeConfigStore) -> None:
    store.save(full_config())
    content = store.secrets_path.read_bytes()

    assert content.startswith(b"v1:")
    assert b"\n" not in content
    payload = content[3:]
    assert base64.b64encode(base64.b64decode(payload, validate=True)) == payload  # standard, padded
    assert stat.S_IMODE(store.secrets_path.stat().st_mode) == 0o600

    data = decrypt_file(store.secrets_path)  # our own HKDF + AESGCM, straight from the document
    assert data == {
        "version": 1,
        "server_auth": {
            "enabled": True,
            "jwt_secret": JWT_SECRET,
            "token_lifetime_secs": 3600,
            "clients": [{"client_id": "ops", "client_secret": CLIENT_SECRET, "role": "admin"}],
            "public_metrics": True,
            "token_rate_limit_per_minute": 10,
        },
        "server_tls": {"cert_path": TLS_CERT_PATH, "key_path": TLS_KEY_PATH},
        "manager_node_secret": NODE_SECRET,
        "manager_registration_token": REGISTRATION_TOKEN,
        "tunnels": {
            RELAY_TUNNEL_ID: {
                "tunnel_encryption_key": RELAY_KEY,
                "tunnel_bind_secret": RELAY_BIND_SECRET,
                "tunnel_psk": None,
                "tls_cert_pem": None,
                "tls_key_pem": None,
            },
            DIRECT_TUNNEL_ID: {
                "tunnel_encryption_key": "c3" * 32,
                "tunnel_bind_secret": None,
                "tunnel_psk": DIRECT_PSK,
                "tls_cert_pem": TLS_CERT_PEM,
                "tls_key_pem": TLS_KEY_PEM,
            },
        },
    }


def test_every_write_uses_a_fresh_nonce(store: EdgeConfigStore) -> None:
    nonces = set()
    for _ in range(3):
        store.save(full_config())
        nonces.add(base64.b64decode(store.secrets_path.read_bytes()[3:])[:12])
    assert len(nonces) == 3


def test_a_file_sealed_elsewhere_is_read(store: EdgeConfigStore) -> None:
    """Another implementation's file, made with the documented construction only."""
    store.save(full_config().model_copy(update={"tunnels": []}))
    plaintext = json.dumps({"version": 1, "manager_node_secret": "other-node-secret", "tunnels": {}}).encode()
    nonce = os.urandom(12)
    key = key_for(MACHINE_ID)
    store.secrets_path.write_bytes(b"v1:" + base64.b64encode(nonce + AESGCM(key).encrypt(nonce, plaintext, None)))
    config = store.read()
    assert config.manager is not None and config.manager.node_secret is not None
    assert config.manager.node_secret.get_secret_value() == "other-node-secret"


@pytest.mark.parametrize("where", ["ciphertext", "tag", "nonce"])
def test_a_tampered_file_is_config_file_error_and_left_alone(store: EdgeConfigStore, where: str) -> None:
    store.save(full_config())
    blob = bytearray(base64.b64decode(store.secrets_path.read_bytes()[3:]))
    index = {"nonce": 0, "ciphertext": 20, "tag": len(blob) - 1}[where]
    blob[index] ^= 0x01
    store.secrets_path.write_bytes(b"v1:" + base64.b64encode(bytes(blob)))
    before = snapshot(store.config_dir)

    with pytest.raises(ConfigFileError) as info:
        store.load()

    assert snapshot(store.config_dir) == before
    message = info.value.message
    assert "secrets.json" in message and "cannot be decrypted" in message
    assert "machine-id" in message
    assert "\n" not in message


def test_a_cloned_image_with_a_new_machine_id_is_a_clear_error(
    store: EdgeConfigStore, machine_id_path: Path, config_dir: Path
) -> None:
    store.save(full_config())
    before = snapshot(config_dir)
    machine_id_path.write_text("ffffffffffffffffffffffffffffffff\n")

    with pytest.raises(ConfigFileError, match="cloned image or a new machine-id"):
        EdgeConfigStore(config_dir, machine_id_path=machine_id_path).load()
    with pytest.raises(Internal, match="cannot be decrypted"):
        EdgeConfigStore(config_dir, machine_id_path=machine_id_path).read()
    assert snapshot(config_dir) == before


@pytest.mark.parametrize("garbage", [b"v1:not base64!!", b"v1:" + base64.b64encode(b"short"), b"v2:abcd", b""])
def test_a_malformed_file_is_config_file_error(store: EdgeConfigStore, garbage: bytes) -> None:
    store.save(full_config())
    store.secrets_path.write_bytes(garbage)
    with pytest.raises(ConfigFileError, match=r"secrets.json"):
        store.load()
    assert store.secrets_path.read_bytes() == garbage


def test_legacy_plaintext_is_read_then_rewritten_encrypted(store: EdgeConfigStore) -> None:
    store.save(full_config())
    plaintext = decrypt_file(store.secrets_path)
    store.secrets_path.write_text("  " + json.dumps(plaintext, indent=2))  # a hand-written legacy file
    store.secrets_path.chmod(0o644)

    assert store.read() == full_config()  # reload reads it and writes nothing
    assert store.secrets_path.read_bytes().lstrip().startswith(b"{")

    assert store.load() == full_config()
    assert store.secrets_path.read_bytes().startswith(b"v1:")
    assert decrypt_file(store.secrets_path) == plaintext
    assert stat.S_IMODE(store.secrets_path.stat().st_mode) == 0o600


@pytest.mark.parametrize("machine_id", [None, "", " \n"], ids=["missing", "empty", "blank"])
def test_without_a_machine_id_the_key_comes_from_dot_secrets_key(
    store: EdgeConfigStore, machine_id_path: Path, config_dir: Path, machine_id: str | None
) -> None:
    if machine_id is None:
        machine_id_path.unlink()
    else:
        machine_id_path.write_text(machine_id)

    store.save(full_config())

    key_path = config_dir / ".secrets_key"
    key_text = key_path.read_text()
    assert len(key_text.strip()) == 64 and int(key_text, 16) >= 0
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert decrypt_file(store.secrets_path, ikm_text=key_text)["manager_node_secret"] == NODE_SECRET
    assert store.load() == full_config()
    assert key_path.read_text() == key_text  # created once, then reused


def test_the_machine_id_wins_over_an_existing_dot_secrets_key(store: EdgeConfigStore, config_dir: Path) -> None:
    config_dir.mkdir(parents=True)
    (config_dir / ".secrets_key").write_text("d4" * 32)
    store.save(full_config())
    assert decrypt_file(store.secrets_path, ikm_text=MACHINE_ID)["manager_node_secret"] == NODE_SECRET


def test_no_key_at_all_is_an_error_and_no_key_is_invented(
    store: EdgeConfigStore, machine_id_path: Path, config_dir: Path
) -> None:
    store.save(full_config())
    machine_id_path.unlink()
    with pytest.raises(ConfigFileError, match="missing or empty"):
        store.load()
    with pytest.raises(Internal):
        store.read()
    assert not (config_dir / ".secrets_key").exists()


def test_invalid_secrets_content_names_the_file_and_json_path(store: EdgeConfigStore) -> None:
    store.save(full_config())
    bad = {
        "version": 1,
        "manager_node_secret": "n" * 5000,
        "tunnels": {RELAY_TUNNEL_ID: {"tunnel_psk": "", "tunnel_bind_secret": "bind-SECRET-not-hex"}},
        "bogus": 1,
    }
    store.secrets_path.write_bytes(seal(json.dumps(bad).encode(), key_for(MACHINE_ID), os.urandom(12)))
    with pytest.raises(ConfigFileError) as info:
        store.load()
    message = info.value.message
    assert "SECRET" not in message and "nnnnn" not in message
    assert "(and 1 more)" in message  # four problems, three shown
    cause = info.value.__cause__
    assert cause is not None and cause.__cause__ is None  # the ValidationError text is not chained
    assert str(store.secrets_path) in message
    assert f'$.tunnels["{RELAY_TUNNEL_ID}"].tunnel_psk' in message
    assert "$.manager_node_secret: Value should have at most 4096 items" in message


def test_unseal_rejects_a_wrong_key() -> None:
    sealed = seal(b"{}", key_for("a"), os.urandom(12))
    assert unseal(sealed, key_for("a")) == b"{}"
    with pytest.raises(ValueError, match="decryption failed"):
        unseal(sealed, key_for("b"))


def test_secret_declarations_match_the_config_models() -> None:
    """TunnelSecrets and EdgeSecrets repeat constraints of the config models: keep them equal."""
    assert set(TunnelSecrets.model_fields) == set(TUNNEL_SECRET_FIELDS)
    for name in TUNNEL_SECRET_FIELDS:
        ours, theirs = TunnelSecrets.model_fields[name], TunnelConfig.model_fields[name]
        assert (ours.annotation, ours.metadata, ours.default) == (theirs.annotation, theirs.metadata, theirs.default)
    for name in ("node_secret", "registration_token"):
        ours, theirs = EdgeSecrets.model_fields[f"manager_{name}"], ManagerConfig.model_fields[name]
        assert (ours.annotation, ours.metadata, ours.default) == (theirs.annotation, theirs.metadata, theirs.default)
