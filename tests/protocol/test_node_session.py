"""A node's side of its manager socket: auth frame, replies, deadline, commands, builders, transitions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest
from pydantic import SecretStr

from appliance.models.events import EventCategory, critical
from appliance.protocol import (
    MANAGER_FRAME_MAX_BYTES,
    NODE_FRAME_MAX_BYTES,
    NODE_TRANSITIONS,
    Authenticated,
    AuthRejected,
    AuthTimedOut,
    CloseCause,
    CommandReceived,
    DeviceType,
    ErrorKind,
    EventPayload,
    FrameDropped,
    InvalidAction,
    LocalProtocolError,
    NodeCredentials,
    NodeSession,
    NodeSessionEvent,
    NodeState,
    NodeTrigger,
    Registered,
    StartFlow,
    Step,
    UnknownAction,
)
from appliance.protocol.session import transition
from tests.protocol.frames import (
    AUTH_ERROR,
    AUTH_OK,
    COMMAND_ID,
    COMMAND_START,
    NODE_ID,
    NODE_SECRET,
    PING,
    PONG,
    REGISTER_ACK,
    TOKEN,
    TS,
    command,
    frame,
    wall_clock,
)

T0 = 500.0
LOGIN = NodeCredentials(node_id=NODE_ID, node_secret=SecretStr(NODE_SECRET))
TOKEN_ONLY = NodeCredentials(registration_token=SecretStr(TOKEN))


def node(credentials: NodeCredentials = LOGIN, device_type: DeviceType = DeviceType.EDGE) -> NodeSession:
    return NodeSession(
        credentials=credentials, software_version="0.3.0", device_type=device_type, wall_clock=wall_clock
    )


def online(device_type: DeviceType = DeviceType.EDGE) -> NodeSession:
    s = node(device_type=device_type)
    s.start(T0)
    s.on_frame(AUTH_OK, T0 + 0.1)
    assert s.state is NodeState.AUTHENTICATED
    return s


def wire(text: str) -> dict[str, object]:
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


def only(step: Step[NodeSessionEvent]) -> NodeSessionEvent:
    assert not step.frames and step.close is None
    (event,) = step.events
    return event


# --------------------------------------------------------------------------- the auth frame
def test_auth_with_node_id_and_secret() -> None:
    assert wire(node().start(T0)) == {
        "type": "auth",
        "payload": {"node_id": NODE_ID, "node_secret": NODE_SECRET, "software_version": "0.3.0", "protocol_version": 1},
    }


def test_auth_with_a_registration_token() -> None:
    assert wire(node(TOKEN_ONLY).start(T0)) == {
        "type": "auth",
        "payload": {"registration_token": TOKEN, "software_version": "0.3.0", "protocol_version": 1},
    }


def test_node_id_and_secret_win_over_a_token() -> None:
    both = NodeCredentials(node_id=NODE_ID, node_secret=SecretStr(NODE_SECRET), registration_token=SecretStr(TOKEN))
    payload = wire(node(both).start(T0))["payload"]
    assert isinstance(payload, dict) and payload["node_id"] == NODE_ID and "registration_token" not in payload
    half = NodeCredentials(node_id=NODE_ID, registration_token=SecretStr(TOKEN))  # no secret: the token
    payload = wire(node(half).start(T0))["payload"]
    assert isinstance(payload, dict) and payload["registration_token"] == TOKEN and "node_id" not in payload


def test_no_credentials_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        node(NodeCredentials(node_id=NODE_ID))
    assert NODE_SECRET not in repr(LOGIN) and TOKEN not in repr(TOKEN_ONLY)


# --------------------------------------------------------------------------- replies
def test_register_ack_surfaces_the_credentials_to_persist() -> None:
    s = node(TOKEN_ONLY)
    s.start(T0)
    step = s.on_frame(REGISTER_ACK, T0 + 1)
    assert step.frames == () and step.close is None
    assert step.events == (Registered(NODE_ID, SecretStr(NODE_SECRET)), Authenticated(registered=True))
    assert NODE_SECRET not in repr(step.events)
    assert s.state is NodeState.AUTHENTICATED
    assert s.credentials == NodeCredentials(node_id=NODE_ID, node_secret=SecretStr(NODE_SECRET))


def test_auth_ok() -> None:
    s = node()
    s.start(T0)
    assert only(s.on_frame(AUTH_OK, T0 + 1)) == Authenticated(registered=False)
    assert s.deadline() is None


def test_auth_error_takes_the_message_from_the_top_level_or_the_payload() -> None:
    s = node()
    s.start(T0)
    step = s.on_frame(AUTH_ERROR, T0 + 1)
    assert step.events == (AuthRejected("Invalid node secret"),)
    assert step.close is not None and step.close.cause is CloseCause.AUTH_FAILED
    assert s.state is NodeState.CLOSED
    s = node()
    s.start(T0)
    payload_only = frame("auth_error", {"message": "Registration token expired"})
    assert s.on_frame(payload_only, T0 + 1).events == (AuthRejected("Registration token expired"),)


def test_auth_error_while_online_closes_too() -> None:
    s = online()
    step = s.on_frame(AUTH_ERROR, T0 + 5)
    assert step.events == (AuthRejected("Invalid node secret"),) and step.close is not None
    assert s.state is NodeState.CLOSED


def test_the_reply_deadline_is_10_s() -> None:
    s = node()
    assert s.deadline() is None
    s.start(T0)
    assert s.deadline() == T0 + 10
    assert s.on_timer(T0 + 9.9) == Step()
    step = s.on_timer(T0 + 10)
    assert step.events == (AuthTimedOut(),)
    assert step.close is not None and step.close.cause is CloseCause.AUTH_TIMEOUT and step.close.code == 1008
    assert s.state is NodeState.CLOSED and s.deadline() is None
    assert s.on_timer(T0 + 30) == Step()


@pytest.mark.parametrize("reply", [PING, COMMAND_START, "not json", frame("mystery", None)])
def test_anything_but_an_auth_reply_while_waiting_closes(reply: str) -> None:
    s = node()
    s.start(T0)
    step = s.on_frame(reply, T0 + 1)
    assert step.events == () and step.frames == ()
    assert step.close is not None and step.close.cause is CloseCause.PROTOCOL_VIOLATION
    assert s.state is NodeState.CLOSED


def test_the_manager_speaking_before_auth_closes() -> None:
    s = node()
    step = s.on_frame(AUTH_OK, T0)
    assert step.close is not None and s.state is NodeState.CLOSED


# --------------------------------------------------------------------------- online
def test_ping_is_answered_with_pong() -> None:
    s = online()
    step = s.on_frame(PING, T0 + 1)
    assert step.events == () and step.close is None
    assert [wire(f) for f in step.frames] == [{"type": "pong", "timestamp": TS, "payload": None}]
    assert s.counters.pings_answered == 1


def test_a_command_becomes_command_received() -> None:
    s = online()
    event = only(s.on_frame(COMMAND_START, T0 + 1))
    assert event == CommandReceived(COMMAND_ID, StartFlow(flow_id="cam1"))


def test_unknown_and_unsupported_actions_are_answered_unknown_command() -> None:
    s = online(DeviceType.EDGE)
    unknown = only(s.on_frame(command({"type": "reboot"}), T0 + 1))
    assert isinstance(unknown, CommandReceived) and isinstance(unknown.action, UnknownAction)
    assert unknown.action.error == "Unknown command: reboot"
    relay_only = only(s.on_frame(command({"type": "list_tunnels"}), T0 + 1))
    assert isinstance(relay_only, CommandReceived) and isinstance(relay_only.action, UnknownAction)
    assert relay_only.action.error == "Unknown command: list_tunnels"
    # A relay-only type with bad arguments is unknown to an edge, not invalid.
    bad_relay = only(s.on_frame(command({"type": "authorize_tunnel"}), T0 + 1))
    assert isinstance(bad_relay, CommandReceived) and isinstance(bad_relay.action, UnknownAction)
    relay = online(DeviceType.RELAY)
    flow_cmd = only(relay.on_frame(command({"type": "start_flow", "flow_id": "x"}), T0 + 1))
    assert isinstance(flow_cmd, CommandReceived) and isinstance(flow_cmd.action, UnknownAction)
    # The driver's answer:
    frame_text = s.command_ack(unknown.command_id, success=False, error=unknown.action.error)
    assert wire(frame_text)["payload"] == {
        "command_id": str(COMMAND_ID),
        "success": False,
        "error": "Unknown command: reboot",
    }


def test_invalid_arguments_are_answered_with_the_problem() -> None:
    s = online()
    event = only(s.on_frame(command({"type": "start_flow"}), T0 + 1))
    assert isinstance(event, CommandReceived) and isinstance(event.action, InvalidAction)
    assert event.action.error == "Invalid command start_flow: action.flow_id: Field required"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("x" * (MANAGER_FRAME_MAX_BYTES + 1), ErrorKind.FRAME_TOO_LARGE),
        ("[]", ErrorKind.MALFORMED),
        (frame("mystery", None), ErrorKind.UNKNOWN_TYPE),
        (PONG, ErrorKind.UNEXPECTED_TYPE),
        (AUTH_OK, ErrorKind.UNEXPECTED_TYPE),
        (REGISTER_ACK, ErrorKind.UNEXPECTED_TYPE),
        (frame("command", {"command_id": str(COMMAND_ID), "action": "start"}), ErrorKind.INVALID),
    ],
)
def test_unusable_frames_online_are_dropped(text: str, kind: ErrorKind) -> None:
    s = online()
    event = only(s.on_frame(text, T0 + 1))
    assert isinstance(event, FrameDropped) and event.kind is kind
    assert s.state is NodeState.AUTHENTICATED and s.counters.frames_dropped[kind] == 1


# --------------------------------------------------------------------------- builders
def test_frame_builders() -> None:
    s = online()
    assert wire(s.stats({"flows": [], "uptime_secs": 1})) == {
        "type": "stats",
        "timestamp": TS,
        "payload": {"flows": [], "uptime_secs": 1},
    }
    assert wire(s.health({"status": "ok"}))["payload"] == {"status": "ok"}
    edge_event = critical(EventCategory.FLOW, "input lost", flow_id="cam1")
    assert wire(s.event(edge_event))["payload"] == {
        "severity": "critical",
        "category": "flow",
        "message": "input lost",
        "flow_id": "cam1",
    }
    relay_event = EventPayload(severity="info", category="edge", message="edge connected")
    assert wire(s.event(relay_event))["payload"] == {
        "severity": "info",
        "category": "edge",
        "message": "edge connected",
    }
    assert wire(s.command_ack(COMMAND_ID, success=True))["payload"] == {
        "command_id": str(COMMAND_ID),
        "success": True,
        "error": None,
    }
    with_data = wire(s.command_ack(COMMAND_ID, success=True, data={"edges": []}))["payload"]
    assert isinstance(with_data, dict) and with_data["data"] == {"edges": []}
    assert wire(s.config_response({"version": 1, "flows": []})) == {
        "type": "config_response",
        "timestamp": TS,
        "payload": {"version": 1, "flows": []},
    }


def test_command_ack_arguments_are_checked() -> None:
    s = online()
    with pytest.raises(LocalProtocolError):
        s.command_ack(COMMAND_ID, success=True, error="but why")
    with pytest.raises(LocalProtocolError):
        s.command_ack(COMMAND_ID, success=False)


def test_a_frame_over_5_mib_is_refused_before_sending() -> None:
    s = online()
    with pytest.raises(LocalProtocolError):
        s.stats({"pad": "x" * NODE_FRAME_MAX_BYTES})
    assert s.state is NodeState.AUTHENTICATED


@pytest.mark.parametrize("state", [NodeState.IDLE, NodeState.AWAITING_REPLY, NodeState.CLOSED])
def test_builders_need_an_authenticated_session(state: NodeState) -> None:
    s = _in_state(state)
    for build in (
        lambda: s.stats({}),
        lambda: s.health({}),
        lambda: s.event(EventPayload(severity="info", category="x", message="y")),
        lambda: s.command_ack(COMMAND_ID, success=True),
        lambda: s.config_response({}),
    ):
        with pytest.raises(LocalProtocolError):
            build()
        assert s.state is state


# --------------------------------------------------------------------------- the transition table
def _in_state(state: NodeState) -> NodeSession:
    s = node()
    if state is NodeState.IDLE:
        return s
    if state is NodeState.CLOSED:
        s.close()
        return s
    s.start(T0)
    if state is NodeState.AUTHENTICATED:
        s.on_frame(AUTH_OK, T0 + 1)
    return s


_TRIGGERS: dict[NodeTrigger, Callable[[NodeSession], object]] = {
    NodeTrigger.SEND_AUTH: lambda s: s.start(T0),
    NodeTrigger.REGISTERED: lambda s: s.on_frame(REGISTER_ACK, T0 + 1),
    NodeTrigger.AUTH_OK: lambda s: s.on_frame(AUTH_OK, T0 + 1),
    NodeTrigger.AUTH_ERROR: lambda s: s.on_frame(AUTH_ERROR, T0 + 1),
    NodeTrigger.REPLY_TIMEOUT: lambda s: s.on_timer(T0 + 10),
    NodeTrigger.UNEXPECTED_FRAME: lambda s: s.on_frame(PING, T0 + 1),
    NodeTrigger.FRAME: lambda s: s.on_frame(PING, T0 + 1),
    NodeTrigger.SEND: lambda s: s.stats({}),
    NodeTrigger.CLOSE: lambda s: s.close(),
}
_DRIVER_TRIGGERS = (NodeTrigger.SEND_AUTH, NodeTrigger.SEND, NodeTrigger.CLOSE)


def test_every_trigger_has_a_driver() -> None:
    assert set(_TRIGGERS) == set(NodeTrigger)
    assert {trigger for _, trigger in NODE_TRANSITIONS} == set(NodeTrigger)


@pytest.mark.parametrize(
    ("state", "trigger", "expected"),
    [(s, t, n) for (s, t), n in NODE_TRANSITIONS.items()],
    ids=[f"{s}-{t}" for s, t in NODE_TRANSITIONS],
)
def test_every_row_of_the_table(state: NodeState, trigger: NodeTrigger, expected: NodeState) -> None:
    s = _in_state(state)
    assert s.state is state
    _TRIGGERS[trigger](s)
    assert s.state is expected


MISSING = [(s, t) for s in NodeState for t in _DRIVER_TRIGGERS if (s, t) not in NODE_TRANSITIONS]


@pytest.mark.parametrize(("state", "trigger"), MISSING, ids=[f"{s}-{t}" for s, t in MISSING])
def test_a_driver_call_with_no_row_raises(state: NodeState, trigger: NodeTrigger) -> None:
    s = _in_state(state)
    with pytest.raises(LocalProtocolError):
        _TRIGGERS[trigger](s)
    assert s.state is state


def test_missing_rows_exist() -> None:
    assert {t for _, t in MISSING} == {NodeTrigger.SEND_AUTH, NodeTrigger.SEND}
    with pytest.raises(LocalProtocolError):
        transition(NODE_TRANSITIONS, NodeState.CLOSED, NodeTrigger.AUTH_OK)
    assert uuid.UUID(str(COMMAND_ID)).version == 4
