"""Command actions (interop.md 6 "Edge actions", "Relay actions")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from appliance.protocol import (
    EDGE_ACTION_TYPES,
    MUTATING_ACTION_TYPES,
    RELAY_ACTION_TYPES,
    AddOutput,
    AuthorizeTunnel,
    CommandMessage,
    CreateFlow,
    DeviceType,
    InvalidAction,
    KnownAction,
    RotateSecret,
    UnknownAction,
    UpdateConfig,
    action_types_for,
    decode,
    encode,
    parse_action,
)
from appliance.protocol.actions import ACTION_MODELS, wire_action
from tests.protocol.frames import command

FLOW = {"id": "cam1", "name": "Camera 1", "input": {"type": "rtp", "bind_addr": "0.0.0.0:5000"}, "outputs": []}
TUNNEL_ID = "6f1c0e5a-9b7d-4e2a-8c3f-1d2e3f4a5b6c"

# One canned action per type, argument names as interop.md 6 lists them.
ACTIONS: list[dict[str, Any]] = [
    {"type": "get_config"},
    {"type": "create_flow", "flow": FLOW},
    {"type": "update_flow", "flow_id": "cam1", "flow": FLOW},
    {"type": "delete_flow", "flow_id": "cam1"},
    {"type": "start_flow", "flow_id": "cam1"},
    {"type": "stop_flow", "flow_id": "cam1"},
    {"type": "restart_flow", "flow_id": "cam1"},
    {"type": "add_output", "flow_id": "cam1", "output": {"type": "udp", "id": "o1", "dest_addr": "10.0.0.1:5000"}},
    {"type": "remove_output", "flow_id": "cam1", "output_id": "o1"},
    {"type": "create_tunnel", "tunnel": {"id": TUNNEL_ID, "tunnel_psk": "psk-SECRET"}},
    {"type": "delete_tunnel", "tunnel_id": TUNNEL_ID},
    {"type": "update_config", "config": {"version": 1, "flows": [FLOW]}},
    {"type": "rotate_secret", "new_secret": "new-SECRET-1"},
    {"type": "disconnect_edge", "edge_id": "edge-7"},
    {"type": "close_tunnel", "tunnel_id": TUNNEL_ID},
    {"type": "close_udp_session", "tunnel_id": TUNNEL_ID},
    {"type": "list_tunnels"},
    {"type": "list_edges"},
    {"type": "list_udp_sessions"},
    {"type": "authorize_tunnel", "tunnel_id": TUNNEL_ID, "ingress_token": "in-SECRET", "egress_token": "eg-SECRET"},
    {"type": "revoke_tunnel", "tunnel_id": TUNNEL_ID},
]


def test_every_listed_action_has_a_model_and_a_canned_example() -> None:
    assert {a["type"] for a in ACTIONS} == set(ACTION_MODELS) == EDGE_ACTION_TYPES | RELAY_ACTION_TYPES


@pytest.mark.parametrize("raw", ACTIONS, ids=[a["type"] for a in ACTIONS])
def test_actions_parse_to_their_model_and_go_back_verbatim(raw: dict[str, Any]) -> None:
    action = parse_action(raw)
    assert type(action) is ACTION_MODELS[raw["type"]]
    assert wire_action(action) == raw  # interop.md 13: relayed verbatim
    message = decode(command(raw), max_bytes=1 << 20)
    assert isinstance(message, CommandMessage) and message.payload.action == action
    assert json.loads(encode(message))["payload"]["action"] == raw
    assert "SECRET" not in repr(action)  # secrets and object arguments are hidden from repr


def test_action_sets_per_device_type() -> None:
    assert action_types_for(DeviceType.EDGE) == EDGE_ACTION_TYPES
    assert action_types_for(DeviceType.RELAY) == RELAY_ACTION_TYPES
    assert EDGE_ACTION_TYPES & RELAY_ACTION_TYPES == {"get_config", "rotate_secret"}
    assert "get_config" not in MUTATING_ACTION_TYPES
    assert {"list_tunnels", "list_edges", "list_udp_sessions"}.isdisjoint(MUTATING_ACTION_TYPES)
    assert {"update_config", "start_flow", "authorize_tunnel", "rotate_secret"} <= MUTATING_ACTION_TYPES


def test_unknown_action_type_is_kept_and_answered_unknown_command() -> None:
    raw = {"type": "reboot", "delay": 5}
    action = parse_action(raw)
    assert isinstance(action, UnknownAction)
    assert action.error == "Unknown command: reboot"
    assert wire_action(action) == raw
    message = decode(command(raw), max_bytes=1 << 20)
    assert isinstance(message, CommandMessage) and message.payload.action == action
    assert json.loads(encode(message))["payload"]["action"] == raw


def test_a_known_type_outside_the_supported_set_is_unknown() -> None:
    action = parse_action({"type": "list_tunnels"}, supported=EDGE_ACTION_TYPES)
    assert isinstance(action, UnknownAction) and action.error == "Unknown command: list_tunnels"
    assert not isinstance(parse_action({"type": "list_tunnels"}, supported=RELAY_ACTION_TYPES), UnknownAction)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"type": "start_flow"}, "action.flow_id: Field required"),
        ({"type": "start_flow", "flow_id": 7}, "action.flow_id: Input should be a valid string"),
        ({"type": "start_flow", "flow_id": "cam1", "force": True}, "action: unknown key"),
        ({"type": "create_flow", "flow": ["not", "an", "object"]}, "action.flow: Input should be a valid dictionary"),
        ({"type": "rotate_secret"}, "action.new_secret: Field required"),
    ],
)
def test_invalid_arguments_become_invalid_action_with_a_safe_text(raw: dict[str, Any], expected: str) -> None:
    action = parse_action(raw)
    assert isinstance(action, InvalidAction)
    assert action.problem == expected
    assert action.error == f"Invalid command {raw['type']}: {expected}"
    assert wire_action(action) == raw


def test_invalid_action_text_does_not_echo_values() -> None:
    action = parse_action({"type": "authorize_tunnel", "tunnel_id": "t", "ingress_token": 5, "egress_token": "e"})
    assert isinstance(action, InvalidAction)
    action = parse_action({"type": "start_flow", "flow_id": "x", "leak-SECRET": "also-SECRET"})
    assert isinstance(action, InvalidAction) and "SECRET" not in action.error and "SECRET" not in repr(action)


@pytest.mark.parametrize("raw", [None, "start_flow", ["start_flow"], {"flow_id": "cam1"}, {"type": 3}])
def test_an_action_without_a_string_type_is_a_value_error(raw: object) -> None:
    with pytest.raises(ValueError):
        parse_action(raw)


def test_secret_arguments_are_revealed_only_on_the_wire() -> None:
    rotate = RotateSecret(new_secret="new-SECRET-2")
    assert "SECRET" not in repr(rotate) and "SECRET" not in str(rotate.model_dump())
    assert wire_action(rotate) == {"type": "rotate_secret", "new_secret": "new-SECRET-2"}
    authorize = AuthorizeTunnel(tunnel_id=TUNNEL_ID, ingress_token="i-SECRET", egress_token="e-SECRET")
    assert "SECRET" not in repr(authorize)


def test_models_build_with_their_type_default() -> None:
    built: list[KnownAction] = [
        CreateFlow(flow=FLOW),
        AddOutput(flow_id="cam1", output={"type": "udp"}),
        UpdateConfig(config={"version": 1}),
    ]
    assert [a.type for a in built] == ["create_flow", "add_output", "update_config"]
    assert "Camera 1" not in repr(built[0])  # object arguments hidden (they may hold passphrases)
