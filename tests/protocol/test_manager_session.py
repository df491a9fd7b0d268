"""The manager's side of a node socket: handshake, routing, commands, timers, transitions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from appliance.models.events import Severity
from appliance.protocol import (
    COMPATIBILITY_CATEGORY,
    MANAGER_TRANSITIONS,
    NODE_FRAME_MAX_BYTES,
    AuthRequest,
    Close,
    CloseCause,
    CommandAbandoned,
    CommandCompleted,
    CommandTimedOut,
    CompatibilityWarning,
    ConfigReceived,
    CredentialKind,
    ErrorKind,
    EventReceived,
    FrameDropped,
    GetConfig,
    HealthReceived,
    ListTunnels,
    LocalProtocolError,
    ManagerEvent,
    ManagerSession,
    ManagerState,
    ManagerTrigger,
    NodeAuthenticated,
    PongReceived,
    StartFlow,
    StatsReceived,
    Step,
)
from appliance.protocol.session import transition
from tests.protocol.frames import (
    AUTH_SECRET,
    AUTH_TOKEN,
    NODE_ID,
    NODE_SECRET,
    PING,
    PONG,
    TOKEN,
    TS,
    WALL,
    ack,
    frame,
    wall_clock,
)

T0 = 1000.0
CMD_A = uuid.UUID("11111111-1111-4111-8111-111111111111")
CMD_B = uuid.UUID("22222222-2222-4222-8222-222222222222")
CMD_C = uuid.UUID("33333333-3333-4333-8333-333333333333")
NEW_SECRET = "fresh-SECRET-0000"


def session(**kwargs: object) -> ManagerSession:
    return ManagerSession(now=T0, wall_clock=wall_clock, **kwargs)  # type: ignore[arg-type]


def authenticating(auth: str = AUTH_SECRET) -> tuple[ManagerSession, AuthRequest]:
    s = session()
    step = s.on_frame(auth, T0 + 1)
    (request,) = step.events
    assert isinstance(request, AuthRequest)
    return s, request


def authenticated(**kwargs: object) -> ManagerSession:
    s = session(**kwargs)
    s.on_frame(AUTH_SECRET, T0 + 1)
    s.accept(NODE_ID)
    return s


def only(step: Step[ManagerEvent]) -> ManagerEvent:
    assert not step.frames and step.close is None
    (event,) = step.events
    return event


def wire(text: str) -> dict[str, object]:
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


# --------------------------------------------------------------------------- handshake
def test_login_path_auth_ok() -> None:
    s, request = authenticating()
    assert s.state is ManagerState.AUTHENTICATING
    assert request.credential is CredentialKind.NODE_SECRET
    assert request.identifier == NODE_ID and request.node_id == NODE_ID
    assert request.secret.get_secret_value() == NODE_SECRET
    assert (request.software_version, request.protocol_version) == ("0.3.0", 1)
    assert NODE_SECRET not in repr(request)
    step = s.accept(NODE_ID)
    assert s.state is ManagerState.AUTHENTICATED and s.node_id == NODE_ID
    assert step.close is None
    assert [wire(f) for f in step.frames] == [{"type": "auth_ok", "timestamp": TS, "payload": None}]
    assert step.events == (NodeAuthenticated(NODE_ID, False, "0.3.0", 1),)


def test_registration_path_register_ack() -> None:
    s, request = authenticating(AUTH_TOKEN)
    assert request.credential is CredentialKind.REGISTRATION_TOKEN
    assert request.identifier == "token:" + TOKEN[:8] and request.node_id is None
    assert request.secret.get_secret_value() == TOKEN
    step = s.accept(NODE_ID, NEW_SECRET)
    assert [wire(f) for f in step.frames] == [
        {"type": "register_ack", "timestamp": TS, "payload": {"node_id": NODE_ID, "node_secret": NEW_SECRET}}
    ]
    assert step.events == (NodeAuthenticated(NODE_ID, True, "0.3.0", 1),)
    assert NEW_SECRET not in repr(step.events)


def test_reject_sends_auth_error_then_closes() -> None:
    s, _ = authenticating()
    step = s.reject("Invalid node secret")
    assert s.state is ManagerState.CLOSED
    assert [wire(f) for f in step.frames] == [
        {
            "type": "auth_error",
            "timestamp": TS,
            "message": "Invalid node secret",
            "payload": {"message": "Invalid node secret"},
        }
    ]
    assert step.close == Close(CloseCause.AUTH_FAILED, "Invalid node secret") and step.close.code == 1008
    assert step.events == ()


def test_accept_checks_the_driver_arguments_against_the_path() -> None:
    s, _ = authenticating(AUTH_TOKEN)
    with pytest.raises(LocalProtocolError):
        s.accept(NODE_ID)  # a registration needs the new secret
    s, _ = authenticating(AUTH_SECRET)
    with pytest.raises(LocalProtocolError):
        s.accept(NODE_ID, NEW_SECRET)  # a login is answered with auth_ok
    with pytest.raises(LocalProtocolError):
        s.accept("someone-else")
    assert s.state is ManagerState.AUTHENTICATING  # a refused call changes nothing
    s.accept(NODE_ID, None)
    assert s.state is ManagerState.AUTHENTICATED


def test_protocol_version_mismatch_is_allowed_with_a_compatibility_warning() -> None:
    auth = AUTH_SECRET.replace('"protocol_version":1', '"protocol_version":2')
    s, _ = authenticating(auth)
    step = s.accept(NODE_ID)
    assert s.state is ManagerState.AUTHENTICATED and len(step.frames) == 1
    authenticated_event, warning = step.events
    assert authenticated_event == NodeAuthenticated(NODE_ID, False, "0.3.0", 2)
    assert warning == CompatibilityWarning(node_protocol_version=2, manager_protocol_version=1)
    assert isinstance(warning, CompatibilityWarning)
    event = warning.event
    assert (
        (event.severity, event.category)
        == (Severity.WARNING, COMPATIBILITY_CATEGORY)
        == (
            Severity.WARNING,
            "compatibility",
        )
    )
    assert "2" in event.message and "1" in event.message


def test_long_software_version_is_truncated_to_256() -> None:
    _, request = authenticating(AUTH_SECRET.replace('"0.3.0"', '"' + "9" * 5000 + '"'))
    assert request.software_version == "9" * 256


@pytest.mark.parametrize(
    ("first", "kind"),
    [
        (PONG, ErrorKind.UNEXPECTED_TYPE),
        ("garbage", ErrorKind.MALFORMED),
        ('{"type":"auth","payload":{"software_version":"1","protocol_version":1}}', ErrorKind.INVALID),
        (frame("telemetry", {}), ErrorKind.UNKNOWN_TYPE),
    ],
)
def test_a_first_frame_that_is_not_a_valid_auth_is_refused(first: str, kind: ErrorKind) -> None:
    s = session()
    step = s.on_frame(first, T0 + 1)
    assert s.state is ManagerState.CLOSED
    (reply,) = step.frames
    assert wire(reply)["type"] == "auth_error"
    assert step.close is not None and step.close.cause is CloseCause.PROTOCOL_VIOLATION
    assert s.counters.frames_dropped[kind] == 1


def test_an_oversized_first_frame_is_refused_without_parsing() -> None:
    s = session()
    step = s.on_frame("x" * (NODE_FRAME_MAX_BYTES + 1), T0 + 1)
    assert s.state is ManagerState.CLOSED and step.close is not None
    assert s.counters.frames_dropped[ErrorKind.FRAME_TOO_LARGE] == 1


def test_auth_error_for_a_bad_auth_never_echoes_the_secret() -> None:
    bad = '{"type":"auth","payload":{"node_id":"n","node_secret":"leak-SECRET-42","protocol_version":1}}'
    step = session().on_frame(bad, T0 + 1)
    assert step.close is not None
    assert "SECRET" not in step.frames[0] and "SECRET" not in step.close.reason
    assert "software_version" in step.frames[0]  # but it says what is missing


def test_auth_deadline_is_10_s_after_accepting_the_socket() -> None:
    s = session()
    assert s.deadline() == T0 + 10
    assert s.on_timer(T0 + 9.999) == Step()
    assert s.state is ManagerState.AWAITING_AUTH
    step = s.on_timer(T0 + 10)
    assert s.state is ManagerState.CLOSED
    assert wire(step.frames[0])["message"] == "Authentication timed out"
    assert step.close is not None and step.close.cause is CloseCause.AUTH_TIMEOUT
    assert s.deadline() is None
    assert s.on_timer(T0 + 20) == Step()  # nothing more once closed


def test_no_deadline_while_the_driver_decides() -> None:
    s, _ = authenticating()
    assert s.deadline() is None
    assert s.on_timer(T0 + 100) == Step()
    assert s.state is ManagerState.AUTHENTICATING


def test_a_frame_before_the_auth_reply_is_dropped() -> None:
    s, _ = authenticating()
    event = only(s.on_frame(PONG, T0 + 2))
    assert isinstance(event, FrameDropped) and event.kind is ErrorKind.UNEXPECTED_TYPE
    assert s.state is ManagerState.AUTHENTICATING
    s.accept(NODE_ID)  # the driver can still answer


# --------------------------------------------------------------------------- routing
def test_frames_after_auth_become_events() -> None:
    s = authenticated()
    stats = only(s.on_frame(frame("stats", {"flows": [], "uptime_secs": 3}), T0 + 2))
    assert isinstance(stats, StatsReceived) and stats.stats.root == {"flows": [], "uptime_secs": 3}
    assert stats.timestamp == WALL
    health = only(s.on_frame(frame("health", {"status": "ok"}), T0 + 2))
    assert isinstance(health, HealthReceived) and health.health.root == {"status": "ok"}
    event = only(s.on_frame(frame("event", {"severity": "critical", "category": "flow", "message": "x" * 12000}), 0))
    assert isinstance(event, EventReceived)
    assert event.event.severity is Severity.CRITICAL and len(event.event.message) == 10_000
    pong = only(s.on_frame(PONG, T0 + 2))
    assert pong == PongReceived(WALL)
    assert s.state is ManagerState.AUTHENTICATED


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("x" * (NODE_FRAME_MAX_BYTES + 1), ErrorKind.FRAME_TOO_LARGE),
        ("{nope", ErrorKind.MALFORMED),
        (frame("telemetry", {}), ErrorKind.UNKNOWN_TYPE),
        (PING, ErrorKind.UNEXPECTED_TYPE),
        (AUTH_SECRET, ErrorKind.UNEXPECTED_TYPE),
        (frame("health", None), ErrorKind.INVALID),
    ],
)
def test_unusable_frames_after_auth_are_dropped_and_the_connection_stays(text: str, kind: ErrorKind) -> None:
    s = authenticated()
    event = only(s.on_frame(text, T0 + 2))
    assert isinstance(event, FrameDropped) and event.kind is kind
    assert s.state is ManagerState.AUTHENTICATED
    assert s.counters.frames_dropped[kind] == 1
    assert isinstance(only(s.on_frame(PONG, T0 + 3)), PongReceived)


# --------------------------------------------------------------------------- commands
def test_command_round_trip_matched_by_command_id() -> None:
    s = authenticated()
    text = s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0 + 5)
    assert wire(text) == {
        "type": "command",
        "timestamp": TS,
        "payload": {"command_id": str(CMD_A), "action": {"type": "start_flow", "flow_id": "cam1"}},
    }
    s.send_command(ListTunnels(), CMD_B, now=T0 + 5)
    assert s.waiting_commands == {CMD_A, CMD_B}
    done = only(s.on_frame(ack(CMD_B, data={"tunnels": []}), T0 + 6))
    assert done == CommandCompleted(CMD_B, "list_tunnels", True, None, {"tunnels": []})
    failed = only(s.on_frame(ack(CMD_A, success=False, error="Flow 'cam1' is already running"), T0 + 6))
    assert failed == CommandCompleted(CMD_A, "start_flow", False, "Flow 'cam1' is already running", None)
    assert s.waiting_commands == frozenset()
    assert s.counters.commands_sent == 2


def test_an_ack_for_an_unknown_command_id_is_ignored() -> None:
    s = authenticated()
    s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0)
    assert s.on_frame(ack(CMD_C), T0 + 1) == Step()
    assert s.counters.acks_unmatched == 1
    assert s.waiting_commands == {CMD_A}
    only(s.on_frame(ack(CMD_A), T0 + 1))
    assert s.on_frame(ack(CMD_A), T0 + 1) == Step()  # a duplicate ack: also ignored
    assert s.counters.acks_unmatched == 2


def test_get_config_completes_on_config_response_oldest_first() -> None:
    s = authenticated()
    text = s.get_config(CMD_A, now=T0)
    assert wire(text)["payload"] == {"command_id": str(CMD_A), "action": {"type": "get_config"}}
    s.send_command(StartFlow(flow_id="cam1"), CMD_B, now=T0)
    s.send_command(GetConfig(), CMD_C, now=T0)
    first = only(s.on_frame(frame("config_response", {"version": 1, "flows": []}), T0 + 1))
    assert isinstance(first, ConfigReceived) and first.command_id == CMD_A
    assert first.config.root == {"version": 1, "flows": []}
    second = only(s.on_frame(frame("config_response", {"version": 1}), T0 + 1))
    assert isinstance(second, ConfigReceived) and second.command_id == CMD_C
    unsolicited = only(s.on_frame(frame("config_response", {"version": 1}), T0 + 1))
    assert isinstance(unsolicited, ConfigReceived) and unsolicited.command_id is None
    assert s.waiting_commands == {CMD_B}


def test_a_failed_get_config_ack_completes_it() -> None:
    s = authenticated()
    s.get_config(CMD_A, now=T0)
    event = only(s.on_frame(ack(CMD_A, success=False, error="config unavailable"), T0 + 1))
    assert event == CommandCompleted(CMD_A, "get_config", False, "config unavailable", None)


def test_commands_time_out_after_10_s() -> None:
    s = authenticated(offline_threshold_s=None)
    s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0 + 2)
    s.send_command(StartFlow(flow_id="cam2"), CMD_B, now=T0 + 4)
    assert s.deadline() == T0 + 12
    assert s.on_timer(T0 + 11.9) == Step()
    assert only(s.on_timer(T0 + 12)) == CommandTimedOut(CMD_A, "start_flow")
    assert s.deadline() == T0 + 14
    assert only(s.on_timer(T0 + 20)) == CommandTimedOut(CMD_B, "start_flow")
    assert s.deadline() is None and s.counters.commands_timed_out == 2
    assert s.on_frame(ack(CMD_A), T0 + 21) == Step()  # too late: ignored
    assert s.state is ManagerState.AUTHENTICATED


def test_a_duplicate_command_id_is_a_local_error() -> None:
    s = authenticated()
    s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0)
    with pytest.raises(LocalProtocolError):
        s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0)


def test_ping_frame() -> None:
    s = authenticated()
    assert wire(s.ping()) == {"type": "ping", "timestamp": TS, "payload": None}


def test_idle_node_is_closed_after_the_offline_threshold() -> None:
    s = authenticated(offline_threshold_s=30.0)
    assert s.deadline() == T0 + 1 + 30  # from the last frame received (the auth)
    s.on_frame(PONG, T0 + 20)
    assert s.deadline() == T0 + 50
    s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0 + 45)
    assert s.deadline() == T0 + 50
    step = s.on_timer(T0 + 50)
    assert s.state is ManagerState.CLOSED
    assert step.close is not None and step.close.cause is CloseCause.IDLE
    assert step.events == (CommandAbandoned(CMD_A, "start_flow"),)


def test_close_abandons_waiting_commands_and_late_frames_are_ignored() -> None:
    s = authenticated()
    s.send_command(StartFlow(flow_id="cam1"), CMD_A, now=T0)
    s.get_config(CMD_B, now=T0)
    step = s.close()
    assert step.events == (CommandAbandoned(CMD_A, "start_flow"), CommandAbandoned(CMD_B, "get_config"))
    assert s.state is ManagerState.CLOSED and s.deadline() is None
    assert s.on_frame(ack(CMD_A), T0 + 1) == Step()
    assert s.close() == Step()  # idempotent


# --------------------------------------------------------------------------- the transition table
def _in_state(state: ManagerState) -> ManagerSession:
    if state is ManagerState.AWAITING_AUTH:
        return session()
    if state is ManagerState.AUTHENTICATING:
        return authenticating()[0]
    if state is ManagerState.AUTHENTICATED:
        return authenticated()
    s = session()
    s.close()
    return s


_TRIGGERS: dict[ManagerTrigger, Callable[[ManagerSession], object]] = {
    ManagerTrigger.AUTH_RECEIVED: lambda s: s.on_frame(AUTH_SECRET, T0 + 1),
    ManagerTrigger.BAD_FIRST_FRAME: lambda s: s.on_frame(PONG, T0 + 1),
    ManagerTrigger.AUTH_TIMEOUT: lambda s: s.on_timer(T0 + 10),
    ManagerTrigger.ACCEPT: lambda s: s.accept(NODE_ID),
    ManagerTrigger.REJECT: lambda s: s.reject("Invalid node secret"),
    ManagerTrigger.EARLY_FRAME: lambda s: s.on_frame(PONG, T0 + 2),
    ManagerTrigger.FRAME: lambda s: s.on_frame(PONG, T0 + 2),
    ManagerTrigger.SEND: lambda s: s.send_command(StartFlow(flow_id="f"), CMD_A, now=T0 + 2),
    ManagerTrigger.COMMAND_TIMEOUT: lambda s: (
        s.send_command(StartFlow(flow_id="f"), CMD_C, now=T0 + 2),
        s.on_timer(T0 + 12),
    ),
    ManagerTrigger.IDLE_TIMEOUT: lambda s: s.on_timer(T0 + 1 + 30),
    ManagerTrigger.CLOSE: lambda s: s.close(),
}
_DRIVER_TRIGGERS = (ManagerTrigger.ACCEPT, ManagerTrigger.REJECT, ManagerTrigger.SEND, ManagerTrigger.CLOSE)


def test_every_trigger_has_a_driver() -> None:
    assert set(_TRIGGERS) == set(ManagerTrigger)
    assert {trigger for _, trigger in MANAGER_TRANSITIONS} == set(ManagerTrigger)


@pytest.mark.parametrize(
    ("state", "trigger", "expected"),
    [(s, t, n) for (s, t), n in MANAGER_TRANSITIONS.items()],
    ids=[f"{s}-{t}" for s, t in MANAGER_TRANSITIONS],
)
def test_every_row_of_the_table(state: ManagerState, trigger: ManagerTrigger, expected: ManagerState) -> None:
    s = _in_state(state)
    assert s.state is state
    _TRIGGERS[trigger](s)
    assert s.state is expected


MISSING = [(s, t) for s in ManagerState for t in _DRIVER_TRIGGERS if (s, t) not in MANAGER_TRANSITIONS]


@pytest.mark.parametrize(("state", "trigger"), MISSING, ids=[f"{s}-{t}" for s, t in MISSING])
def test_a_driver_call_with_no_row_raises_and_changes_nothing(state: ManagerState, trigger: ManagerTrigger) -> None:
    s = _in_state(state)
    with pytest.raises(LocalProtocolError):
        _TRIGGERS[trigger](s)
    assert s.state is state


def test_missing_rows_exist_for_each_driver_call() -> None:
    assert {t for _, t in MISSING} == {ManagerTrigger.ACCEPT, ManagerTrigger.REJECT, ManagerTrigger.SEND}
    assert len(MISSING) >= 8
    with pytest.raises(LocalProtocolError):
        transition(MANAGER_TRANSITIONS, ManagerState.CLOSED, ManagerTrigger.AUTH_RECEIVED)


def test_ping_and_get_config_before_auth_raise() -> None:
    s = session()
    with pytest.raises(LocalProtocolError):
        s.ping()
    with pytest.raises(LocalProtocolError):
        s.get_config(CMD_A, now=T0)
