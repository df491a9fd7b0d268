"""``relay.json`` (interop.md 1.2): defaults, validation, flags for one run, the 0600 rewrite
after ``register_ack``, and ``get_config`` without secrets."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from appliance.errors import ConfigFileError
from services.relay.config import RelayConfig, RelayConfigStore
from services.relay.main import main

TOKEN = "relay-api-token-" + "7" * 24  # 40 chars
REG_TOKEN = "0e0b7f64-1c3a-4f0e-9a51-2d3c4b5a6978"
SECRET = "e1d2c3b4-a596-4788-99aa-bbccddeeff00"
NODE_ID = "5b0c7a1e-2f3d-4c5b-8a69-7e8f90a1b2c3"


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def manager_block(**extra: object) -> dict[str, object]:
    return {"enabled": True, "url": "wss://127.0.0.1:8443/ws/node", "registration_token": REG_TOKEN, **extra}


def test_a_missing_file_means_the_defaults(tmp_path: Path) -> None:
    store = RelayConfigStore(tmp_path / "relay.json")
    config = store.load()
    assert config == RelayConfig()
    assert (config.quic_addr, config.udp_relay_addr, config.api_addr) == (
        "0.0.0.0:4433",
        "0.0.0.0:4434",
        "0.0.0.0:4480",
    )
    assert config.udp_relay_enabled is True and config.require_bind_auth is False
    assert (config.max_connections_per_ip, config.max_tunnels_per_connection) == (64, 100)
    assert config.api_token is None and config.manager is None
    assert config.public_quic_addr is None and config.public_udp_addr is None
    assert config.tls_cert_path is None and config.tls_key_path is None
    assert not (tmp_path / "relay.json").exists()  # nothing written


def test_every_key_of_interop_1_2_is_read(tmp_path: Path) -> None:
    data = {
        "quic_addr": "127.0.0.1:14433",
        "udp_relay_addr": "127.0.0.1:14434",
        "api_addr": "127.0.0.1:14480",
        "udp_relay_enabled": False,
        "public_quic_addr": "relay.example.net:4433",
        "public_udp_addr": "203.0.113.7:4434",
        "tls_cert_path": "/etc/mediaplane/relay.crt",
        "tls_key_path": "/etc/mediaplane/relay.key",
        "api_token": TOKEN,
        "require_bind_auth": True,
        "max_connections_per_ip": 8,
        "max_tunnels_per_connection": 5,
        "manager": manager_block(cert_fingerprint="AA:" * 31 + "AA"),
    }
    config = RelayConfigStore(write(tmp_path / "relay.json", data)).load()
    assert config.api_token is not None and config.api_token.get_secret_value() == TOKEN
    assert config.manager is not None and config.manager.registration_token is not None
    dumped = json.loads(config.model_dump_json())
    assert set(dumped) == set(data)


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"api_token": "x" * 31}, "$.api_token"),
        ({"api_token": "x" * 129}, "$.api_token"),
        ({"quic_addr": "not an address"}, "$.quic_addr"),
        ({"max_connections_per_ip": "64"}, "$.max_connections_per_ip"),
        ({"surprise": 1}, "$.surprise"),
        ({"manager": {"enabled": True}}, "$.manager"),
        ({"manager": {"enabled": True, "url": "http://m/ws/node"}}, "$.manager.url"),
        ({"tls_cert_path": "/a.crt"}, "$"),
    ],
)
def test_a_bad_file_is_a_config_error_naming_the_path(tmp_path: Path, data: dict[str, object], path: str) -> None:
    file = write(tmp_path / "relay.json", data)
    with pytest.raises(ConfigFileError) as caught:
        RelayConfigStore(file).load()
    assert str(file) in caught.value.message and path in caught.value.message
    assert "xxxxxxxx" not in caught.value.message  # never the value


def test_api_token_bounds_are_32_and_128() -> None:
    assert RelayConfig(api_token=SecretStr("t" * 32)).api_token is not None
    assert RelayConfig(api_token=SecretStr("t" * 128)).api_token is not None
    with pytest.raises(ValidationError):
        RelayConfig(api_token=SecretStr("t" * 31))


def test_main_exits_2_on_a_bad_file_and_leaves_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "relay.json"
    file.write_text('{"api_token": "' + "s3cr3t" * 3 + '"}')
    before = file.read_bytes()
    with pytest.raises(SystemExit) as caught:
        main(["--config", str(file)])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mp-relay: ") and str(file) in err and "$.api_token" in err
    assert "s3cr3t" not in err
    assert file.read_bytes() == before

    file.write_text("{not json")
    with pytest.raises(SystemExit) as caught:
        main(["--config", str(file)])
    assert caught.value.code == 2


def test_main_exits_2_on_a_bad_flag_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--config", str(tmp_path / "missing.json"), "--api-addr", "nowhere"])
    assert caught.value.code == 2
    assert "--api-addr" in capsys.readouterr().err


def test_flags_override_for_this_run_only(tmp_path: Path) -> None:
    file = write(tmp_path / "relay.json", {"api_token": TOKEN, "manager": manager_block()})
    store = RelayConfigStore(file)
    store.load()
    config = store.override(
        quic_addr="127.0.0.1:1", udp_relay_addr="127.0.0.1:2", api_addr="127.0.0.1:3", no_udp_relay=True
    )
    assert (config.quic_addr, config.udp_relay_addr, config.api_addr) == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    assert config.udp_relay_enabled is False
    assert store.file_config.api_addr == "0.0.0.0:4480"
    # A credential rewrite starts from the file, so no flag reaches it.
    store.save(store.with_credentials(NODE_ID, SecretStr(SECRET)))
    written = json.loads(file.read_text())
    assert "quic_addr" not in written or written["quic_addr"] == "0.0.0.0:4433"
    assert written["api_addr"] == "0.0.0.0:4480" and written["udp_relay_enabled"] is True
    assert store.config.api_addr == "127.0.0.1:3"  # the run keeps its flags


def test_register_ack_rewrites_the_file_at_0600(tmp_path: Path) -> None:
    file = write(tmp_path / "relay.json", {"api_token": TOKEN, "manager": manager_block()})
    os.chmod(file, 0o644)
    store = RelayConfigStore(file)
    store.load()
    store.save(store.with_credentials(NODE_ID, SecretStr(SECRET)))
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    written = json.loads(file.read_text())
    assert written["manager"]["node_id"] == NODE_ID
    assert written["manager"]["node_secret"] == SECRET
    assert "registration_token" not in written["manager"]
    assert written["api_token"] == TOKEN  # the other secret kept, in clear: this is its file
    reloaded = RelayConfigStore(file).load()
    assert reloaded.manager is not None and reloaded.manager.node_id == uuid.UUID(NODE_ID)
    assert list(tmp_path.iterdir()) == [file]  # no temp file left behind


def test_public_config_leaves_every_secret_out() -> None:
    config = RelayConfig.model_validate(
        {"api_token": TOKEN, "manager": manager_block(node_id=NODE_ID, node_secret=SECRET)}
    )
    public = config.public()
    text = json.dumps(public)
    assert "api_token" not in public
    assert "registration_token" not in public["manager"] and "node_secret" not in public["manager"]
    assert TOKEN not in text and SECRET not in text and REG_TOKEN not in text
    assert public["manager"]["node_id"] == NODE_ID
    assert TOKEN not in repr(config) and SECRET not in repr(config)
