"""Fixtures for the edge persistence tests (tests/appliance/test_config_*.py)."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from appliance.config.store import EdgeConfigStore
from appliance.models.config import AppConfig

MACHINE_ID = "5f2b8c0d9e1a4b3c8d7e6f5a4b3c2d1e"

# Distinct, greppable values for every infrastructure secret (interop.md 2.7).
JWT_SECRET = "jwt-SECRET-0123456789abcdefghijklmnop"
CLIENT_SECRET = "client-SECRET-0123456789"
TLS_CERT_PATH = "/etc/mediaplane/SECRET-cert.pem"
TLS_KEY_PATH = "/etc/mediaplane/SECRET-key.pem"
NODE_SECRET = "node-SECRET-5678"
REGISTRATION_TOKEN = "reg-SECRET-9012"
RELAY_KEY = "a1" * 32
RELAY_BIND_SECRET = "b2" * 32
DIRECT_PSK = "psk-SECRET-3456"
DIRECT_KEY = "c3" * 32
TLS_CERT_PEM = "-----BEGIN CERTIFICATE-----\ncert-SECRET\n-----END CERTIFICATE-----\n"
TLS_KEY_PEM = "-----BEGIN PRIVATE KEY-----\nkey-SECRET\n-----END PRIVATE KEY-----\n"
SECRET_VALUES = (
    JWT_SECRET,
    CLIENT_SECRET,
    TLS_CERT_PATH,
    TLS_KEY_PATH,
    NODE_SECRET,
    REGISTRATION_TOKEN,
    RELAY_KEY,
    RELAY_BIND_SECRET,
    DIRECT_PSK,
    DIRECT_KEY,
    "cert-SECRET",
    "key-SECRET",
)
SRT_PASSPHRASE = "correct-horse-42"  # a user parameter: stays in config.json and GET /config
RELAY_TUNNEL_ID = "3f0c6a52-8a1e-4d2b-9c3f-1e2d3c4b5a69"
DIRECT_TUNNEL_ID = "7d9e0f1a-2b3c-4d5e-8f6a-7b8c9d0e1f2a"


def full_config_data() -> dict[str, Any]:
    """A config (raw JSON) that holds every kind of infrastructure secret."""
    return {
        "version": 1,
        "node_id": "0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00",
        "device_name": "ob-truck-3",
        "setup_enabled": False,
        "server": {
            "listen_addr": "0.0.0.0",
            "listen_port": 8080,
            "tls": {"cert_path": TLS_CERT_PATH, "key_path": TLS_KEY_PATH},
            "auth": {
                "enabled": True,
                "jwt_secret": JWT_SECRET,
                "clients": [{"client_id": "ops", "client_secret": CLIENT_SECRET, "role": "admin"}],
            },
        },
        "monitor": {"listen_addr": "127.0.0.1", "listen_port": 9090},
        "manager": {
            "enabled": True,
            "url": "wss://mgr.example:8443/ws/node",
            "node_id": "5b0c9d7e-1f2a-4b3c-8d4e-6f7a8b9c0d1e",
            "node_secret": NODE_SECRET,
            "registration_token": REGISTRATION_TOKEN,
        },
        "flows": [
            {
                "id": "cam1",
                "name": "Camera 1",
                "input": {"type": "rtp", "bind_addr": "239.10.0.1:5000", "interface_addr": "10.0.0.5"},
                "outputs": [
                    {
                        "type": "srt",
                        "id": "out-b",
                        "name": "To cloud",
                        "mode": "caller",
                        "local_addr": "0.0.0.0:0",
                        "remote_addr": "203.0.113.7:9000",
                        "passphrase": SRT_PASSPHRASE,
                    }
                ],
            }
        ],
        "tunnels": [
            {
                "id": RELAY_TUNNEL_ID,
                "name": "relay tunnel",
                "protocol": "udp",
                "mode": "relay",
                "direction": "egress",
                "local_addr": "127.0.0.1:7000",
                "relay_addr": "relay.example:4433",
                "tunnel_encryption_key": RELAY_KEY,
                "tunnel_bind_secret": RELAY_BIND_SECRET,
            },
            {
                "id": DIRECT_TUNNEL_ID,
                "name": "direct tunnel",
                "protocol": "tcp",
                "mode": "direct",
                "direction": "ingress",
                "local_addr": "127.0.0.1:7001",
                "direct_listen_addr": "0.0.0.0:4500",
                "tunnel_psk": DIRECT_PSK,
                "tunnel_encryption_key": DIRECT_KEY,
                "tls_cert_pem": TLS_CERT_PEM,
                "tls_key_pem": TLS_KEY_PEM,
            },
        ],
    }


def full_config() -> AppConfig:
    return AppConfig.model_validate(full_config_data())


def key_for(ikm_text: str) -> bytes:
    """The secrets.json key, derived here independently from interop.md 2.8."""
    return HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=b"mediaplane-edge-secrets-v1",
        info=b"mediaplane-edge secrets.json aes-256-gcm",
    ).derive(ikm_text.strip().encode("ascii"))


def decrypt_file(path: Path, ikm_text: str = MACHINE_ID) -> dict[str, Any]:
    """Decrypt secrets.json as another implementation would: v1: + base64(nonce||ct||tag)."""
    content = path.read_bytes()
    assert content.startswith(b"v1:")
    blob = base64.b64decode(content[3:], validate=True)
    plaintext = AESGCM(key_for(ikm_text)).decrypt(blob[:12], blob[12:], None)
    data: dict[str, Any] = json.loads(plaintext)
    return data


def assert_no_secret(text: str) -> None:
    for value in SECRET_VALUES:
        assert value not in text
    assert "**********" not in text


def all_log_text(records: list[Any]) -> str:
    return "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in records)


@pytest.fixture
def machine_id_path(tmp_path: Path) -> Path:
    path = tmp_path / "machine-id"
    path.write_text(MACHINE_ID + "\n")
    return path


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return tmp_path / "var" / "lib" / "mediaplane" / "edge"


@pytest.fixture
def store(config_dir: Path, machine_id_path: Path) -> EdgeConfigStore:
    return EdgeConfigStore(config_dir, machine_id_path=machine_id_path)


def new_uuid4() -> str:
    return str(uuid.uuid4())
