"""public_config, merge_kept_secrets, fill_kept_secrets, ensure_jwt_secret (interop.md 2.1, 2.7)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import SecretStr

from appliance.config import ensure_jwt_secret, fill_kept_secrets, merge_kept_secrets, public_config
from appliance.config._dump import public_json, revealed_json
from appliance.errors import Internal
from appliance.models.config import AppConfig, default_config
from tests.appliance.conftest import (
    DIRECT_PSK,
    DIRECT_TUNNEL_ID,
    JWT_SECRET,
    NODE_SECRET,
    REGISTRATION_TOKEN,
    RELAY_KEY,
    RELAY_TUNNEL_ID,
    SRT_PASSPHRASE,
    TLS_CERT_PATH,
    assert_no_secret,
    full_config,
    full_config_data,
    new_uuid4,
)

# --------------------------------------------------------------------------- public_config


def test_public_config_strips_every_infrastructure_secret() -> None:
    view = public_config(full_config())

    text = json.dumps(view)  # JSON-ready: no default= needed
    assert_no_secret(text)
    assert view["server"] == {"listen_addr": "0.0.0.0", "listen_port": 8080}
    assert view["manager"] == {
        "enabled": True,
        "url": "wss://mgr.example:8443/ws/node",
        "accept_self_signed_cert": False,
        "cert_fingerprint": None,
        "node_id": "5b0c9d7e-1f2a-4b3c-8d4e-6f7a8b9c0d1e",
    }
    assert [t["id"] for t in view["tunnels"]] == [RELAY_TUNNEL_ID, DIRECT_TUNNEL_ID]
    assert view["tunnels"][0]["relay_addr"] == "relay.example:4433"
    for tunnel in view["tunnels"]:
        assert not {"tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk", "tls_cert_pem", "tls_key_pem"} & set(
            tunnel
        )


def test_public_config_keeps_flows_complete_with_user_parameters() -> None:
    config = full_config()
    view = public_config(config)
    assert view["flows"] == [flow.model_dump(mode="json") for flow in config.flows]
    assert view["flows"][0]["outputs"][0]["passphrase"] == SRT_PASSPHRASE
    assert view["node_id"] == str(config.node_id) and view["version"] == 1
    assert view["monitor"] == {"listen_addr": "127.0.0.1", "listen_port": 9090}


def test_public_config_of_the_defaults() -> None:
    assert public_config(default_config()) == {
        "version": 1,
        "node_id": None,
        "device_name": None,
        "setup_enabled": True,
        "server": {"listen_addr": "0.0.0.0", "listen_port": 8080},
        "monitor": None,
        "manager": None,
        "nmos": None,
        "flows": [],
        "tunnels": [],
    }


def test_a_secret_that_escapes_the_exclude_list_is_refused_not_masked() -> None:
    config = full_config()
    with pytest.raises(Internal, match="a secret field reached a public dump"):
        public_json(config, {"server": {"tls"}})
    assert public_json(config.server, {"auth", "tls"}) == {"listen_addr": "0.0.0.0", "listen_port": 8080}


# --------------------------------------------------------------------------- merge_kept_secrets


def secrets_of_config(config: AppConfig) -> dict[str, Any]:
    """The revealed infrastructure secrets of a config, for comparing in the table."""
    data = revealed_json(config)
    manager = data["manager"] or {}
    return {
        "auth": data["server"]["auth"],
        "tls": data["server"]["tls"],
        "node_secret": manager.get("node_secret"),
        "registration_token": manager.get("registration_token"),
        "tunnels": {
            t["id"]: {k: t[k] for k in ("tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk")}
            for t in data["tunnels"]
        },
    }


STORED = secrets_of_config(full_config())
Edit = Callable[[dict[str, Any]], None]


def public_body() -> dict[str, Any]:
    """What a client PUTs back after GET /api/v1/config: no secrets at all."""
    return copy.deepcopy(public_config(full_config()))


def with_(**changes: Any) -> dict[str, Any]:
    expected = copy.deepcopy(STORED)
    expected.update(changes)
    return expected


def _set_auth(body: dict[str, Any], auth: dict[str, Any]) -> None:
    body["server"]["auth"] = auth


def _rename_tunnel(body: dict[str, Any]) -> None:
    body["tunnels"][1]["id"] = NEW_TUNNEL_ID
    body["tunnels"][1]["tunnel_psk"] = "new-tunnel-psk"


NEW_TUNNEL_ID = new_uuid4()
NEW_AUTH = {"enabled": True, "clients": [], "token_lifetime_secs": 600}
EXPECTED_NEW_AUTH = {
    "enabled": True,
    "jwt_secret": JWT_SECRET,
    "token_lifetime_secs": 600,
    "clients": [],
    "public_metrics": True,
    "token_rate_limit_per_minute": 10,
}

# (case id, edit of the echoed public body, expected secrets after the merge)
MERGE_CASES: list[tuple[str, Edit, dict[str, Any]]] = [
    ("everything-left-out-keeps-everything", lambda b: None, STORED),
    ("auth-null-keeps-auth", lambda b: _set_auth(b, None), STORED),  # type: ignore[arg-type]
    ("auth-without-jwt-keeps-the-jwt-only", lambda b: _set_auth(b, dict(NEW_AUTH)), with_(auth=EXPECTED_NEW_AUTH)),
    (
        "auth-disabled-turns-auth-off-keeping-the-jwt",
        lambda b: _set_auth(b, {"enabled": False}),
        with_(auth={**EXPECTED_NEW_AUTH, "enabled": False, "token_lifetime_secs": 3600}),
    ),
    (
        "a-present-jwt-replaces",
        lambda b: _set_auth(b, {**NEW_AUTH, "jwt_secret": "n" * 40}),
        with_(auth={**EXPECTED_NEW_AUTH, "jwt_secret": "n" * 40}),
    ),
    (
        "a-present-tls-replaces",
        lambda b: b["server"].update(tls={"cert_path": "/new.pem", "key_path": "/new.key"}),
        with_(tls={"cert_path": "/new.pem", "key_path": "/new.key"}),
    ),
    (
        "a-present-node-secret-replaces-the-token-is-kept",
        lambda b: b["manager"].update(node_secret="new-node-secret"),
        with_(node_secret="new-node-secret"),
    ),
    (
        "a-present-registration-token-replaces",
        lambda b: b["manager"].update(registration_token="new-token"),
        with_(registration_token="new-token"),
    ),
    (
        "a-removed-manager-takes-its-secrets",
        lambda b: b.update(manager=None),
        with_(node_secret=None, registration_token=None),
    ),
    (
        "tunnels-matched-by-id-not-position",
        lambda b: b["tunnels"].reverse(),
        with_(tunnels=dict(reversed(list(STORED["tunnels"].items())))),
    ),
    (
        "a-present-tunnel-secret-replaces-the-others-are-kept",
        lambda b: b["tunnels"][0].update(tunnel_encryption_key="f6" * 32),
        with_(
            tunnels={
                **STORED["tunnels"],
                RELAY_TUNNEL_ID: {**STORED["tunnels"][RELAY_TUNNEL_ID], "tunnel_encryption_key": "f6" * 32},
            }
        ),
    ),
    (
        "a-new-tunnel-id-keeps-nothing",
        _rename_tunnel,
        with_(
            tunnels={
                RELAY_TUNNEL_ID: STORED["tunnels"][RELAY_TUNNEL_ID],
                NEW_TUNNEL_ID: {
                    "tunnel_encryption_key": None,
                    "tunnel_bind_secret": None,
                    "tunnel_psk": "new-tunnel-psk",
                },
            }
        ),
    ),
    (
        "a-removed-tunnel-is-gone",
        lambda b: b["tunnels"].pop(0),
        with_(tunnels={DIRECT_TUNNEL_ID: STORED["tunnels"][DIRECT_TUNNEL_ID]}),
    ),
]


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in MERGE_CASES], ids=[c[0] for c in MERGE_CASES])
def test_fill_kept_secrets_then_validate(edit: Edit, expected: dict[str, Any]) -> None:
    body = public_body()
    edit(body)
    frozen = copy.deepcopy(body)

    merged = AppConfig.model_validate(fill_kept_secrets(body, full_config()))

    assert body == frozen  # the body is not modified
    assert secrets_of_config(merged) == expected


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in MERGE_CASES], ids=[c[0] for c in MERGE_CASES])
def test_merge_kept_secrets_on_validated_models(edit: Edit, expected: dict[str, Any]) -> None:
    body = public_body()
    edit(body)
    # A model cannot validate a relay tunnel without its key, so the required tunnel
    # secrets get placeholders for validation and are blanked again afterwards.
    new = AppConfig.model_validate(fill_only_required(body))
    new = new.model_copy(update={"tunnels": [blank_required(t, body) for t in new.tunnels]})
    current = full_config()
    current_before = revealed_json(current)

    merged = merge_kept_secrets(new, current)

    assert secrets_of_config(merged) == expected
    assert revealed_json(current) == current_before
    assert merged.flows == current.flows and merged.node_id == current.node_id


def fill_only_required(body: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(body)
    for tunnel in data["tunnels"]:
        if tunnel.get("mode") == "relay" and tunnel.get("tunnel_encryption_key") is None:
            tunnel["tunnel_encryption_key"] = "00" * 32
        if tunnel.get("mode") == "direct" and tunnel.get("tunnel_psk") is None:
            tunnel["tunnel_psk"] = "placeholder"
    return data


def blank_required(tunnel: Any, body: dict[str, Any]) -> Any:
    original = next(t for t in body["tunnels"] if t["id"] == str(tunnel.id))
    return tunnel.model_copy(
        update={name: None for name in ("tunnel_encryption_key", "tunnel_psk") if original.get(name) is None}
    )


def test_get_then_put_round_trips() -> None:
    """A client that PUTs back exactly what GET showed changes nothing."""
    current = full_config()
    merged = AppConfig.model_validate(fill_kept_secrets(public_config(current), current))
    assert merged == current


def test_without_stored_secrets_nothing_is_added() -> None:
    current = AppConfig.model_validate({"server": {}})
    body = full_config_data()
    body["server"]["auth"]["jwt_secret"] = None
    merged = merge_kept_secrets(AppConfig.model_validate(body), current)
    assert merged.server.auth is not None and merged.server.auth.jwt_secret is None
    assert AppConfig.model_validate(fill_kept_secrets(body, current)) == merged


@pytest.mark.parametrize("body", [None, [], "x", {"server": "x", "manager": 3, "tunnels": [1, {"id": "bad"}]}])
def test_fill_kept_secrets_leaves_odd_shapes_to_validation(body: Any) -> None:
    assert fill_kept_secrets(body, full_config()) == body


# --------------------------------------------------------------------------- ensure_jwt_secret


def test_ensure_jwt_secret_generates_64_hex_chars_when_auth_is_on_without_one() -> None:
    config = AppConfig.model_validate({"server": {"auth": {"enabled": True}}})
    first = ensure_jwt_secret(config)
    second = ensure_jwt_secret(config)
    assert first.server.auth is not None and first.server.auth.jwt_secret is not None
    secret = first.server.auth.jwt_secret.get_secret_value()
    assert len(secret) == 64 and int(secret, 16) >= 0 and secret == secret.lower()
    assert second.server.auth is not None and second.server.auth.jwt_secret != first.server.auth.jwt_secret
    assert config.server.auth is not None and config.server.auth.jwt_secret is None  # not modified


@pytest.mark.parametrize(
    "server",
    [{}, {"auth": {"enabled": False}}, {"auth": {"enabled": True, "jwt_secret": "k" * 32}}],
    ids=["no-auth", "auth-off", "has-one"],
)
def test_ensure_jwt_secret_leaves_other_configs_alone(server: dict[str, Any]) -> None:
    config = AppConfig.model_validate({"server": server})
    assert ensure_jwt_secret(config) is config


def test_secret_values_in_the_table_are_real() -> None:
    """Guard: the table compares real values, not masks or Nones."""
    assert STORED["auth"]["jwt_secret"] == JWT_SECRET
    assert STORED["tls"]["cert_path"] == TLS_CERT_PATH
    assert STORED["node_secret"] == NODE_SECRET and STORED["registration_token"] == REGISTRATION_TOKEN
    assert STORED["tunnels"][RELAY_TUNNEL_ID]["tunnel_encryption_key"] == RELAY_KEY
    assert STORED["tunnels"][DIRECT_TUNNEL_ID]["tunnel_psk"] == DIRECT_PSK
    assert isinstance(full_config().tunnels[0].tunnel_encryption_key, SecretStr)
