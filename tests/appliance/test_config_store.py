"""EdgeConfigStore: start-up order, split and merge, migration, errors (interop.md 1.1, 2.7, 2.8)."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import appliance.config.atomic
from appliance.config.store import EdgeConfigStore
from appliance.errors import ConfigFileError, Internal, InvalidInput, PersistFailed
from appliance.models.config import AppConfig, default_config
from tests.appliance.conftest import (
    DIRECT_PSK,
    JWT_SECRET,
    NODE_SECRET,
    RELAY_KEY,
    SRT_PASSPHRASE,
    all_log_text,
    assert_no_secret,
    decrypt_file,
    full_config,
    full_config_data,
)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.iterdir()}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def record_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files atomic_write replaces, in order."""
    written: list[str] = []
    real = appliance.config.atomic.atomic_write

    def spy(path: Path, data: bytes, mode: int = 0o600) -> None:
        written.append(path.name)
        real(path, data, mode)

    monkeypatch.setattr("appliance.config.store.atomic_write", spy)
    monkeypatch.setattr("appliance.config.secrets.atomic_write", spy)
    return written


# --------------------------------------------------------------------------- first start, node_id


def test_first_start_creates_the_directory_and_a_default_config(store: EdgeConfigStore, config_dir: Path) -> None:
    config = store.load()

    assert mode_of(config_dir) == 0o700
    assert mode_of(store.config_path) == 0o600
    on_disk = json.loads(store.config_path.read_text())
    assert on_disk == {
        "version": 1,
        "node_id": str(config.node_id),
        "device_name": None,
        "setup_enabled": True,
        "server": {"listen_addr": "0.0.0.0", "listen_port": 8080},
        "monitor": None,
        "manager": None,
        "nmos": None,
        "flows": [],
    }  # interop.md 1.1 defaults; `tunnels` left out when empty
    assert config.node_id is not None and config.node_id.version == 4
    assert config == default_config().model_copy(update={"node_id": config.node_id})


def test_the_node_id_is_generated_once_and_stays(store: EdgeConfigStore, config_dir: Path) -> None:
    first = store.load().node_id
    assert EdgeConfigStore(config_dir, machine_id_path=Path("/nonexistent")).load().node_id == first
    assert store.read().node_id == first


def test_a_missing_node_id_is_generated_and_persisted(store: EdgeConfigStore) -> None:
    store.save(full_config())
    data = json.loads(store.config_path.read_text())
    del data["node_id"]
    write_json(store.config_path, data)

    config = store.load()

    assert config.node_id is not None and config.node_id.version == 4
    on_disk = json.loads(store.config_path.read_text())
    assert on_disk["node_id"] == str(config.node_id)
    assert on_disk["device_name"] == "ob-truck-3"  # everything else kept
    assert store.load().node_id == config.node_id


def test_an_existing_directory_is_used_as_it_is(store: EdgeConfigStore, config_dir: Path) -> None:
    config_dir.mkdir(parents=True, mode=0o750)
    os.chmod(config_dir, 0o750)
    store.load()
    assert mode_of(config_dir) == 0o750
    assert sorted(p.name for p in config_dir.iterdir()) == ["config.json"]


# --------------------------------------------------------------------------- save / load split


def test_save_then_load_round_trips_every_secret(store: EdgeConfigStore, config_dir: Path) -> None:
    config = full_config()
    store.save(config)
    assert store.load() == config
    assert store.read() == config
    assert mode_of(store.config_path) == 0o600
    assert mode_of(store.secrets_path) == 0o600
    assert sorted(p.name for p in config_dir.iterdir()) == ["config.json", "secrets.json"]


def test_config_json_holds_no_secret_but_keeps_user_parameters(store: EdgeConfigStore) -> None:
    store.save(full_config())
    text = store.config_path.read_text()
    assert_no_secret(text)
    data = json.loads(text)
    assert data["server"] == {"listen_addr": "0.0.0.0", "listen_port": 8080}
    assert set(data["manager"]) == {"enabled", "url", "accept_self_signed_cert", "cert_fingerprint", "node_id"}
    for tunnel in data["tunnels"]:
        assert not {"tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk", "tls_cert_pem", "tls_key_pem"} & set(
            tunnel
        )
    assert data["flows"][0]["outputs"][0]["passphrase"] == SRT_PASSPHRASE  # a flow parameter (2.7)


def test_save_writes_secrets_first(store: EdgeConfigStore, monkeypatch: pytest.MonkeyPatch) -> None:
    written = record_writes(monkeypatch)
    store.save(full_config())
    assert written == ["secrets.json", "config.json"]


def test_save_leaves_tunnels_out_when_empty(store: EdgeConfigStore) -> None:
    store.save(full_config().model_copy(update={"tunnels": []}))
    assert "tunnels" not in json.loads(store.config_path.read_text())
    assert decrypt_file(store.secrets_path)["tunnels"] == {}


def test_save_drops_the_secrets_of_a_removed_tunnel(store: EdgeConfigStore) -> None:
    config = full_config()
    store.save(config)
    store.save(config.model_copy(update={"tunnels": config.tunnels[1:]}))
    assert list(decrypt_file(store.secrets_path)["tunnels"]) == [str(config.tunnels[1].id)]
    assert store.load().tunnels == config.tunnels[1:]


def test_a_failed_secrets_write_leaves_both_files(store: EdgeConfigStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.save(full_config())
    before = snapshot(store.config_dir)

    def broken(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(PersistFailed, match=r"secrets.json: No space left on device"):
        store.save(full_config().model_copy(update={"device_name": "changed"}))
    monkeypatch.undo()
    assert snapshot(store.config_dir) == before


# --------------------------------------------------------------------------- migration


def test_secrets_in_config_json_are_moved_out(
    store: EdgeConfigStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    write_json(store.config_path, full_config_data())  # an old or hand-edited file with everything inline
    written = record_writes(monkeypatch)

    with caplog.at_level(logging.DEBUG):
        config = store.load()

    assert config == full_config()
    assert written == ["secrets.json", "config.json"]  # secrets first (2.8)
    assert_no_secret(store.config_path.read_text())
    assert decrypt_file(store.secrets_path)["server_auth"]["jwt_secret"] == JWT_SECRET
    assert store.load() == full_config()

    logs = all_log_text(caplog.records)
    assert_no_secret(logs)
    for name in (
        "server.auth",
        "server.tls",
        "manager.node_secret",
        "manager.registration_token",
        "tunnels[0].tunnel_encryption_key",
        "tunnels[0].tunnel_bind_secret",
        "tunnels[1].tunnel_psk",
        "tunnels[1].tls_key_pem",
    ):
        assert name in logs


def test_a_secret_in_both_files_takes_the_config_json_value(store: EdgeConfigStore) -> None:
    store.save(full_config())  # secrets.json holds the old values
    data = json.loads(store.config_path.read_text())
    data["manager"]["node_secret"] = "hand-edited-node-secret"
    data["tunnels"][0]["tunnel_encryption_key"] = "e5" * 32
    write_json(store.config_path, data)

    config = store.load()

    assert config.manager is not None and config.manager.node_secret is not None
    assert config.manager.node_secret.get_secret_value() == "hand-edited-node-secret"
    assert config.tunnels[0].tunnel_encryption_key is not None
    assert config.tunnels[0].tunnel_encryption_key.get_secret_value() == "e5" * 32
    assert config.server.auth is not None and config.server.auth.jwt_secret is not None
    assert config.server.auth.jwt_secret.get_secret_value() == JWT_SECRET  # only in secrets.json: kept
    stored = decrypt_file(store.secrets_path)
    assert stored["manager_node_secret"] == "hand-edited-node-secret"
    assert stored["tunnels"][str(config.tunnels[0].id)]["tunnel_encryption_key"] == "e5" * 32
    assert "hand-edited" not in store.config_path.read_text()


def test_a_null_secret_in_config_json_does_not_wipe_the_stored_one(store: EdgeConfigStore) -> None:
    store.save(full_config())
    data = json.loads(store.config_path.read_text())
    data["server"]["auth"] = None
    data["manager"]["node_secret"] = None
    write_json(store.config_path, data)
    assert store.load() == full_config()


def test_reload_uses_secrets_in_config_json_without_moving_them(store: EdgeConfigStore) -> None:
    write_json(store.config_path, full_config_data())
    before = snapshot(store.config_dir)
    assert store.read() == full_config()
    assert snapshot(store.config_dir) == before


# --------------------------------------------------------------------------- jwt_secret


def test_auth_enabled_without_jwt_secret_gets_one_generated_and_kept(
    store: EdgeConfigStore, caplog: pytest.LogCaptureFixture
) -> None:
    data = full_config_data()
    del data["server"]["auth"]["jwt_secret"]
    store.save(AppConfig.model_validate(data))  # no migration: only the new jwt_secret needs a write

    with caplog.at_level(logging.DEBUG):
        config = store.load()

    assert config.server.auth is not None and config.server.auth.jwt_secret is not None
    secret = config.server.auth.jwt_secret.get_secret_value()
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert decrypt_file(store.secrets_path)["server_auth"]["jwt_secret"] == secret
    assert secret not in store.config_path.read_text()
    assert secret not in all_log_text(caplog.records)
    again = store.load().server.auth
    assert again is not None and again.jwt_secret is not None
    assert again.jwt_secret.get_secret_value() == secret


def test_auth_disabled_gets_no_jwt_secret(store: EdgeConfigStore) -> None:
    data = full_config_data()
    data["server"]["auth"] = {"enabled": False}
    write_json(store.config_path, data)
    auth = store.load().server.auth
    assert auth is not None and auth.jwt_secret is None


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"version": 1,', "not valid JSON: Expecting property name enclosed in double quotes: line 1"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "$: expected a JSON object"),
    ],
    ids=["truncated", "not-utf8", "array"],
)
def test_an_unparseable_config_json_is_config_file_error_and_untouched(
    store: EdgeConfigStore, content: bytes, expected: str
) -> None:
    store.config_path.parent.mkdir(parents=True)
    store.config_path.write_bytes(content)
    with pytest.raises(ConfigFileError) as info:
        store.load()
    assert info.value.message.startswith(f"{store.config_path}: ")
    assert expected in info.value.message
    assert store.config_path.read_bytes() == content
    assert not store.secrets_path.exists()


def invalid_cases() -> list[tuple[str, Any, str]]:
    def edit(change: Any) -> dict[str, Any]:
        data = full_config_data()
        del data["node_id"]  # must not be generated and written when the file is invalid
        change(data)
        return data

    return [
        ("unknown-top-level-key", edit(lambda d: d.update(colour="blue")), "$.colour: Extra inputs are not permitted"),
        (
            "unknown-key-in-an-input",
            edit(lambda d: d["flows"][0]["input"].update(bogus=1)),
            "$.flows[0].input.bogus: Extra inputs are not permitted",
        ),
        (
            "bad-address",
            edit(lambda d: d["flows"][0]["outputs"][0].update(remote_addr="203.0.113.7")),
            "$.flows[0].outputs[0].remote_addr: expected <ip>:<port>",
        ),
        (
            "missing-field",
            edit(lambda d: d["flows"][0]["input"].pop("bind_addr")),
            "$.flows[0].input.bind_addr: Field required",
        ),
        (
            "short-jwt-secret",
            edit(lambda d: d["server"]["auth"].update(jwt_secret="short-SECRET-value")),
            "$.server.auth.jwt_secret: Value should have at least 32 items",
        ),
        (
            "bad-tunnel-key",
            edit(lambda d: d["tunnels"][0].update(tunnel_encryption_key="zz-SECRET-not-hex")),
            "$.tunnels[0].tunnel_encryption_key: expected 64 hex characters",
        ),
        ("wrong-version", edit(lambda d: d.update(version=2)), "$.version: Input should be 1"),
    ]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in invalid_cases()], ids=[c[0] for c in invalid_cases()])
def test_an_invalid_config_json_names_file_and_json_path_and_no_value(
    store: EdgeConfigStore, data: dict[str, Any], expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    write_json(store.config_path, data)
    before = snapshot(store.config_dir)

    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigFileError) as info:
        store.load()

    message = info.value.message
    assert message.startswith(f"{store.config_path}: ")
    assert expected in message
    assert "\n" not in message
    assert_no_secret(message)
    assert "SECRET" not in message and "203.0.113.7" not in message
    assert info.value.__cause__ is not None and info.value.__cause__.__cause__ is None  # no ValidationError text
    assert snapshot(store.config_dir) == before  # never overwritten, no secrets.json made
    assert "SECRET" not in all_log_text(caplog.records)

    with pytest.raises(InvalidInput) as reload_info:
        store.read()
    assert reload_info.value.message.startswith("loaded config invalid: ")
    assert expected in reload_info.value.message
    assert reload_info.value.message.endswith("(config.json)")
    assert "SECRET" not in reload_info.value.message


def test_the_union_tag_is_not_part_of_the_path(store: EdgeConfigStore) -> None:
    data = full_config_data()
    data["flows"][0]["outputs"][0]["mode"] = "listener"
    data["flows"][0]["outputs"][0]["local_addr"] = "0.0.0.0:0"
    write_json(store.config_path, data)
    with pytest.raises(ConfigFileError) as info:
        store.load()
    assert "$.flows[0].outputs[0]: local_addr port 0 is allowed only in caller mode" in info.value.message


def test_reload_of_a_missing_or_broken_file_is_internal(store: EdgeConfigStore) -> None:
    with pytest.raises(Internal, match=r"cannot load config.json: the file does not exist"):
        store.read()
    assert not store.config_dir.exists()
    store.save(full_config())
    store.config_path.write_text("{")
    with pytest.raises(Internal, match=r"cannot load config.json: not valid JSON"):
        store.read()


def test_reload_never_writes(store: EdgeConfigStore) -> None:
    data = full_config_data()
    del data["node_id"]
    del data["server"]["auth"]["jwt_secret"]
    store.save(AppConfig.model_validate(data))
    before = snapshot(store.config_dir)
    config = store.read()
    assert config.node_id is None
    assert snapshot(store.config_dir) == before


def test_an_unreadable_config_json_is_config_file_error(store: EdgeConfigStore) -> None:
    store.config_path.mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(ConfigFileError, match=r"config.json: cannot read: Is a directory"):
        store.load()


# --------------------------------------------------------------------------- no secret in logs or errors


def test_no_secret_reaches_a_log_record(
    store: EdgeConfigStore, config_dir: Path, machine_id_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        write_json(store.config_path, full_config_data())
        store.load()
        store.save(full_config())
        store.read()
        plaintext = decrypt_file(store.secrets_path)
        store.secrets_path.write_text(json.dumps(plaintext))
        store.load()
        machine_id_path.write_text("0" * 32)
        with pytest.raises(ConfigFileError) as info:
            EdgeConfigStore(config_dir, machine_id_path=machine_id_path).load()
    assert caplog.records  # the migration and the legacy rewrite were logged
    assert_no_secret(all_log_text(caplog.records))
    assert_no_secret(info.value.message)
    for value in (NODE_SECRET, DIRECT_PSK, RELAY_KEY):
        assert value not in repr(full_config())
