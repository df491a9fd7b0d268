"""A NodeSession and a ManagerSession talking, frames moved by hand; then any input, no exception."""

from __future__ import annotations

import json
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from appliance.models.events import EventCategory, Severity, info
from appliance.protocol import (
    Authenticated,
    AuthRejected,
    AuthRequest,
    CommandCompleted,
    CommandReceived,
    ConfigReceived,
    CredentialKind,
    DeviceType,
    EventQueue,
    EventReceived,
    GetConfig,
    HealthReceived,
    ListTunnels,
    Lockout,
    ManagerSession,
    ManagerState,
    NodeAuthenticated,
    NodeCredentials,
    NodeSession,
    NodeState,
    PongReceived,
    ProtocolError,
    Registered,
    StartFlow,
    UnknownAction,
    decode,
)
from tests.protocol.frames import TOKEN, wall_clock

NODE_ID = "9d7f6e5c-4b3a-4291-8f7e-6d5c4b3a2910"
SECRET = "issued-SECRET-aaaa"
CMD_1 = uuid.UUID("a0000000-0000-4000-8000-000000000001")
CMD_2 = uuid.UUID("a0000000-0000-4000-8000-000000000002")
CMD_3 = uuid.UUID("a0000000-0000-4000-8000-000000000003")


def test_registration_then_commands_end_to_end() -> None:
    now = 0.0
    node = NodeSession(
        credentials=NodeCredentials(registration_token=SecretStr(TOKEN)),
        software_version="0.3.0",
        device_type=DeviceType.EDGE,
        wall_clock=wall_clock,
    )
    manager = ManagerSession(now=now, wall_clock=wall_clock)
    lockout = Lockout()

    # Handshake: the driver checks the lockout and the token, then accepts with a fresh secret.
    (request,) = manager.on_frame(node.start(now), now).events
    assert isinstance(request, AuthRequest) and request.credential is CredentialKind.REGISTRATION_TOKEN
    assert not lockout.is_locked(request.identifier, now)
    assert request.secret.get_secret_value() == TOKEN
    accepted = manager.accept(NODE_ID, SECRET)
    assert accepted.events == (NodeAuthenticated(NODE_ID, True, "0.3.0", 1),)
    (reply,) = accepted.frames
    registered, authenticated = node.on_frame(reply, now).events
    assert registered == Registered(NODE_ID, SecretStr(SECRET))
    assert authenticated == Authenticated(registered=True)

    # Queued events are flushed in order after health.
    queue: EventQueue[str] = EventQueue()
    queue.put(node.event(info(EventCategory.MANAGER, "registered")))
    health = manager.on_frame(node.health({"status": "ok", "version": "0.3.0"}), now + 0.1).events
    assert isinstance(health[0], HealthReceived)
    while (queued := queue.pop()) is not None:
        (received,) = manager.on_frame(queued, now + 0.2).events
        assert isinstance(received, EventReceived) and received.event.severity is Severity.INFO

    # The manager's get_config on connect, a command, an unknown command, a ping.
    (got,) = node.on_frame(manager.get_config(CMD_1, now=now + 1), now + 1).events
    assert isinstance(got, CommandReceived) and got.action == GetConfig()
    (config,) = manager.on_frame(node.config_response({"version": 1, "flows": []}), now + 1.1).events
    assert isinstance(config, ConfigReceived) and config.command_id == CMD_1
    assert config.config.root == {"version": 1, "flows": []}

    (start,) = node.on_frame(manager.send_command(StartFlow(flow_id="cam1"), CMD_2, now=now + 2), now + 2).events
    assert isinstance(start, CommandReceived) and start.action == StartFlow(flow_id="cam1")
    (done,) = manager.on_frame(node.command_ack(start.command_id, success=True), now + 2.1).events
    assert done == CommandCompleted(CMD_2, "start_flow", True, None, None)

    # The hub relays an action it only validated for its type (interop.md 13), here one the
    # edge does not run: the edge answers "Unknown command".
    (listed,) = node.on_frame(manager.send_command(ListTunnels(), CMD_3, now=now + 3), now + 3).events
    assert isinstance(listed, CommandReceived) and isinstance(listed.action, UnknownAction)
    (refused,) = manager.on_frame(
        node.command_ack(listed.command_id, success=False, error=listed.action.error), now + 3.1
    ).events
    assert refused == CommandCompleted(CMD_3, "list_tunnels", False, "Unknown command: list_tunnels", None)

    ping = manager.ping()
    (pong,) = node.on_frame(ping, now + 4).frames
    assert isinstance(manager.on_frame(pong, now + 4).events[0], PongReceived)
    assert manager.state is ManagerState.AUTHENTICATED and node.state is NodeState.AUTHENTICATED


def test_a_wrong_secret_is_rejected_and_counted_towards_the_lockout() -> None:
    lockout = Lockout()
    for attempt in range(6):
        now = float(attempt)
        node = NodeSession(
            credentials=NodeCredentials(node_id=NODE_ID, node_secret=SecretStr("wrong-SECRET")),
            software_version="0.3.0",
            device_type=DeviceType.RELAY,
            wall_clock=wall_clock,
        )
        manager = ManagerSession(now=now, wall_clock=wall_clock)
        (request,) = manager.on_frame(node.start(now), now).events
        assert isinstance(request, AuthRequest) and request.identifier == NODE_ID
        if lockout.is_locked(request.identifier, now):
            step = manager.reject("Too many failed attempts")
        else:
            lockout.record_failure(request.identifier, now)
            step = manager.reject("Invalid node secret")
        (reply,) = step.frames
        assert "SECRET" not in reply
        rejected = node.on_frame(reply, now).events
        expected = "Too many failed attempts" if attempt == 5 else "Invalid node secret"
        assert rejected == (AuthRejected(expected),)
        assert manager.state is ManagerState.CLOSED and node.state is NodeState.CLOSED


# --------------------------------------------------------------------------- any input
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
frames = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    st.builds(
        lambda t, p, ts: json.dumps({"type": t, "timestamp": ts, "payload": p}),
        st.sampled_from(
            ["auth", "stats", "health", "event", "command_ack", "config_response", "pong", "ping", "command", "x"]
        ),
        json_values,
        st.sampled_from(["2026-11-21T15:04:05.123Z", "nope", "2026-11-21T15:04:05+02:00"]),
    ),
)


@settings(max_examples=150)
@given(frames)
def test_decode_raises_only_protocol_errors(frame: str | bytes) -> None:
    try:
        decode(frame, max_bytes=1 << 20)
    except ProtocolError as exc:
        assert exc.kind is not None


@settings(max_examples=100)
@given(st.lists(frames, max_size=6))
def test_sessions_never_raise_on_peer_frames(sequence: list[str | bytes]) -> None:
    manager = ManagerSession(now=0.0, wall_clock=wall_clock)
    node = NodeSession(
        credentials=NodeCredentials(node_id=NODE_ID, node_secret=SecretStr(SECRET)),
        software_version="1",
        device_type=DeviceType.EDGE,
        wall_clock=wall_clock,
    )
    node.start(0.0)
    for i, item in enumerate(sequence):
        for event in manager.on_frame(item, float(i)).events:
            if isinstance(event, AuthRequest):
                if event.node_id is not None:
                    manager.accept(event.node_id)
                else:
                    manager.accept(NODE_ID, SECRET)
        node.on_frame(item, float(i))
        manager.on_timer(float(i))
        node.on_timer(float(i))
