"""Hostile input at the edge's front door: nesting, loose types, dot ids, URLs, error texts.

Each test here failed before its fix (an attack campaign found the defects).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from appliance import auth, errors
from appliance.config._problems import describe_validation_error as describe_file_error
from appliance.http.app import validate
from appliance.http.envelope import describe_validation_error
from appliance.models.config import AppConfig, AuthClient, FlowConfig, OutputConfig, ServerAuth

_OUTPUT = TypeAdapter[OutputConfig](OutputConfig)


def nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def token_body(extra: str) -> bytes:
    return ('{"grant_type":"client_credentials","client_id":"a","client_secret":"b","x":' + extra + "}").encode()


def flow(**changes: Any) -> dict[str, Any]:
    return {
        "id": "f1",
        "name": "Flow 1",
        "input": {"type": "rtp", "bind_addr": "127.0.0.1:5000"},
        "outputs": [{"type": "udp", "id": "o1", "name": "out", "dest_addr": "127.0.0.1:6000"}],
        **changes,
    }


def output(**changes: Any) -> dict[str, Any]:
    return {"type": "rtp", "id": "o1", "name": "out", "dest_addr": "127.0.0.1:6000", **changes}


def error_text(adapter: Any, data: Any) -> str:
    with pytest.raises(ValidationError) as info:
        adapter.validate_python(data) if isinstance(adapter, TypeAdapter) else adapter.model_validate(data)
    return describe_validation_error(info.value)


# --------------------------------------------------------------------------- 1. nesting depth


@pytest.mark.parametrize("body", [nested_arrays(1000), nested_objects(1000), "[" * 100_000, nested_arrays(65)])
def test_a_token_request_nested_too_deep_is_invalid_input(body: str) -> None:
    with pytest.raises(errors.InvalidInput, match="JSON nested deeper than 64 levels"):
        auth.parse_token_request("application/json", token_body(body), None)


def test_a_token_request_nested_64_deep_is_not_refused_for_its_depth() -> None:
    # 63 levels in "x", inside the request object: 64 in all.
    request = auth.parse_token_request("application/json", token_body(nested_arrays(63)), None)
    assert request.client_id == "a"


def test_a_recursion_error_in_validation_is_invalid_input() -> None:
    class Recursing:
        def validate_python(self, data: Any) -> Any:
            raise RecursionError("maximum recursion depth exceeded")

    with pytest.raises(errors.InvalidInput, match="nested too deeply"):
        validate(Recursing(), {})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- 3a. strict numbers and booleans


@pytest.mark.parametrize(
    ("model", "data", "path"),
    [
        (_OUTPUT, output(dscp="46"), "dscp"),
        (_OUTPUT, output(dscp=True), "dscp"),
        (_OUTPUT, output(dscp=46.0), "dscp"),
        (_OUTPUT, output(fec_encode={"columns": "5", "rows": 5}), "fec_encode.columns"),
        (FlowConfig, flow(enabled="true"), "enabled"),
        (FlowConfig, flow(enabled=1), "enabled"),
        (FlowConfig, flow(media_analysis=0), "media_analysis"),
        (FlowConfig, flow(input={"type": "rtp", "bind_addr": "127.0.0.1:5000", "max_bitrate_mbps": "10"}), "input"),
        (FlowConfig, flow(input={"type": "rtp", "bind_addr": "127.0.0.1:5000", "max_bitrate_mbps": True}), "input"),
        (FlowConfig, flow(input={"type": "rtp", "bind_addr": "127.0.0.1:5000", "tr07_mode": "yes"}), "input"),
        (
            FlowConfig,
            flow(input={"type": "srt", "mode": "listener", "local_addr": "0.0.0.0:9000", "latency_ms": "120"}),
            "input.latency_ms",
        ),
        (
            AppConfig,
            {"server": {"listen_port": "8080"}},
            "server.listen_port",
        ),
        (AppConfig, {"server": {}, "setup_enabled": "false"}, "setup_enabled"),
        (ServerAuth, {"enabled": 1}, "enabled"),
        (ServerAuth, {"token_lifetime_secs": 600.0}, "token_lifetime_secs"),
    ],
)
def test_strings_and_booleans_are_not_numbers_and_numbers_are_not_booleans(model: Any, data: Any, path: str) -> None:
    assert path in error_text(model, data)


def test_ints_still_fill_float_fields_and_strings_still_fill_uuid_fields() -> None:
    rtp = FlowConfig.model_validate(
        flow(input={"type": "rtp", "bind_addr": "127.0.0.1:5000", "max_bitrate_mbps": 10})
    ).input
    assert rtp.type == "rtp" and rtp.max_bitrate_mbps == 10.0 and isinstance(rtp.max_bitrate_mbps, float)
    node_id = "0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00"
    tunnel_id = "3f0c6a52-8a1e-4d2b-9c3f-1e2d3c4b5a69"
    config = AppConfig.model_validate(
        {
            "node_id": node_id,
            "server": {"listen_port": 8080},
            "manager": {"url": "wss://m.example/ws/node", "node_id": node_id},
            "tunnels": [
                {
                    "id": tunnel_id,
                    "name": "t",
                    "protocol": "tcp",
                    "mode": "direct",
                    "direction": "egress",
                    "local_addr": "127.0.0.1:7000",
                    "tunnel_psk": "psk",
                }
            ],
        }
    )
    assert str(config.node_id) == node_id and str(config.tunnels[0].id) == tunnel_id
    assert config.manager is not None and str(config.manager.node_id) == node_id
    # A model's own dump validates again (the setup wizard and the store do this).
    assert AppConfig.model_validate(config.model_dump()) == config


# --------------------------------------------------------------------------- 3b. dot-only ids


@pytest.mark.parametrize("bad", [".", "..", "..."])
def test_ids_made_only_of_dots_are_refused_without_echo(bad: str) -> None:
    for model, data, path in (
        (FlowConfig, flow(id=bad), "id"),
        (FlowConfig, flow(outputs=[output(id=bad)]), "outputs.0.id"),
        (_OUTPUT, output(id=bad), "id"),
        (AuthClient, {"client_id": bad, "client_secret": "s" * 16, "role": "admin"}, "client_id"),
    ):
        text = error_text(model, data)
        assert text.startswith(f"{path}: ") and "dots" in text, text
        assert "'" + bad not in text and '"' + bad not in text


@pytest.mark.parametrize("good", ["a.b", ".a", "a..", "_", "-", "x" * 64])
def test_ids_with_a_dot_and_something_else_are_fine(good: str) -> None:
    assert FlowConfig.model_validate(flow(id=good)).id == good


# --------------------------------------------------------------------------- 3c. the manager URL


@pytest.mark.parametrize("char", ["\x00", "\x01", "\n", "\r", "\t", "\x1f", "\x7f", " "])
def test_a_manager_url_with_control_characters_or_whitespace_is_refused(char: str) -> None:
    text = error_text(AppConfig, {"server": {}, "manager": {"url": f"wss://a{char}b/ws/node"}})
    assert text.startswith("manager.url: ") and "control characters" in text


def test_a_plain_manager_url_is_fine() -> None:
    config = AppConfig.model_validate({"server": {}, "manager": {"url": "wss://mgr.example:8443/ws/node?x=1"}})
    assert config.manager is not None and config.manager.url == "wss://mgr.example:8443/ws/node?x=1"


# --------------------------------------------------------------------------- 3d. no length of a rejected input


LONG_SECRET = "s" * 300
LONG_PASSPHRASE = "p" * 97


def srt_output(passphrase: str) -> dict[str, Any]:
    return {
        "type": "srt",
        "id": "s1",
        "name": "s",
        "mode": "caller",
        "local_addr": "0.0.0.0:0",
        "remote_addr": "127.0.0.1:9000",
        "passphrase": passphrase,
    }


def rejected(model: Any, data: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        model.validate_python(data) if isinstance(model, TypeAdapter) else model.model_validate(data)
    return info.value


@pytest.mark.parametrize(
    ("model", "data", "limit", "actual"),
    [
        (AuthClient, {"client_id": "c", "client_secret": LONG_SECRET, "role": "admin"}, "256", "300"),
        (AuthClient, {"client_id": "c", "client_secret": "short-secret", "role": "admin"}, "16", "12"),
        (ServerAuth, {"jwt_secret": "j" * 290}, "256", "290"),
        (_OUTPUT, srt_output(LONG_PASSPHRASE), "79", "97"),
        (_OUTPUT, {**output(), "type": "rtmp", "dest_url": "rtmp://h/a", "stream_key": "k" * 4321}, "4096", "4321"),
        (AppConfig, {"server": {}, "manager": {"registration_token": "t" * 4444}}, "4096", "4444"),
        (FlowConfig, flow(outputs=[output(id=f"o{i}") for i in range(77)]), "64", "77"),
    ],
)
def test_a_validation_error_never_tells_the_rejected_length(model: Any, data: Any, limit: str, actual: str) -> None:
    exc = rejected(model, data)
    for text in (describe_validation_error(exc), describe_file_error(exc, data)):
        assert limit in text, text
        assert actual not in text, text
        assert "after validation" not in text


def test_a_too_long_list_of_auth_clients_keeps_its_limit_only() -> None:
    clients = [{"client_id": f"c{i}", "client_secret": "s" * 16, "role": "admin"} for i in range(300)]
    exc = rejected(ServerAuth, {"clients": clients})
    text = describe_validation_error(exc)
    assert text == "clients: List should have at most 256 items"
    assert "300" not in describe_file_error(exc, {"clients": clients})


def test_a_bad_union_tag_and_a_bad_uuid_are_not_echoed() -> None:
    exc = rejected(_OUTPUT, {**output(), "type": "carrier-pigeon"})
    assert "carrier-pigeon" not in describe_validation_error(exc)
    assert "carrier-pigeon" not in describe_file_error(exc, {**output(), "type": "carrier-pigeon"})
    data = {"server": {}, "node_id": "zz-not-a-uuid-zz"}
    exc = rejected(AppConfig, data)
    for text in (describe_validation_error(exc), describe_file_error(exc, data)):
        assert text.startswith(("node_id: ", "$.node_id: ")) and "found" not in text and "`z`" not in text, text
