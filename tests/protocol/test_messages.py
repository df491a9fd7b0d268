"""The node protocol's messages and codec against interop.md 6 (canned frames, limits, error texts)."""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic import SecretStr

from appliance.models.events import EventCategory, Severity, warning
from appliance.models.stats import FlowState, FlowStats, Health, HealthStatus, InputStats
from appliance.protocol import (
    CATEGORY_MAX_CHARS,
    EVENT_MESSAGE_MAX_CHARS,
    MANAGER_FRAME_MAX_BYTES,
    MANAGER_MESSAGE_TYPES,
    MESSAGE_MODELS,
    NODE_FRAME_MAX_BYTES,
    NODE_MESSAGE_TYPES,
    AuthErrorMessage,
    AuthMessage,
    AuthOkMessage,
    CommandAckMessage,
    CommandMessage,
    ConfigResponseMessage,
    DashboardNode,
    DashboardPayload,
    DashboardUpdateMessage,
    DeviceType,
    ErrorKind,
    EventMessage,
    EventPayload,
    FrameTooLarge,
    HealthMessage,
    LocalProtocolError,
    NodeStatus,
    PingMessage,
    PongMessage,
    ProtocolError,
    RegisterAckMessage,
    SecretAuth,
    StartFlow,
    StatsMessage,
    TokenAuth,
    UnknownMessageType,
    decode,
    edge_health_payload,
    edge_stats_payload,
    encode,
    normalise_event,
    normalise_version,
)
from tests.protocol.frames import (
    ACK_FAILED,
    AUTH_ERROR,
    AUTH_OK,
    AUTH_SECRET,
    AUTH_TOKEN,
    COMMAND_ID,
    COMMAND_START,
    NODE_ID,
    NODE_SECRET,
    PING,
    PONG,
    REGISTER_ACK,
    TOKEN,
    TS,
    WALL,
    frame,
)

BIG = NODE_FRAME_MAX_BYTES

CANNED = [
    (AUTH_TOKEN, AuthMessage),
    (AUTH_SECRET, AuthMessage),
    (REGISTER_ACK, RegisterAckMessage),
    (AUTH_OK, AuthOkMessage),
    (AUTH_ERROR, AuthErrorMessage),
    (COMMAND_START, CommandMessage),
    (ACK_FAILED, CommandAckMessage),
    (PING, PingMessage),
    (PONG, PongMessage),
    (frame("stats", {"flows": [], "tunnels": [], "uptime_secs": 5, "active_flows": 0, "total_flows": 0}), StatsMessage),
    (frame("health", {"status": "ok", "version": "0.3.0", "uptime_secs": 5}), HealthMessage),
    (
        frame("event", {"severity": "info", "category": "flow", "message": "flow started", "flow_id": "cam1"}),
        EventMessage,
    ),
    (frame("config_response", {"version": 1, "flows": []}), ConfigResponseMessage),
    (
        frame(
            "command_ack",
            {"command_id": str(COMMAND_ID), "success": True, "error": None, "data": {"tunnels": []}},
        ),
        CommandAckMessage,
    ),
    (
        frame(
            "dashboard_update",
            {
                "nodes": [
                    {
                        "node_id": NODE_ID,
                        "name": "cam rack",
                        "device_type": "edge",
                        "status": "online",
                        "stats": {"flows": []},
                        "health": None,
                        "software_version": "0.3.0",
                        "protocol_version": 1,
                        "uptime_secs": 12,
                    }
                ],
                "online_count": 1,
            },
        ),
        DashboardUpdateMessage,
    ),
]


@pytest.mark.parametrize(("text", "model"), CANNED, ids=[m.__name__ + str(i) for i, (_, m) in enumerate(CANNED)])
def test_canned_frames_decode_to_their_model_and_reencode_equal(text: str, model: type) -> None:
    message = decode(text, max_bytes=BIG)
    assert type(message) is model
    again = encode(message)
    assert json.loads(again) == json.loads(text)
    assert again == json.dumps(json.loads(again), separators=(",", ":"), ensure_ascii=False)  # compact


def test_every_type_has_a_canned_frame_and_a_direction() -> None:
    assert {json.loads(t)["type"] for t, _ in CANNED} == set(MESSAGE_MODELS)
    assert NODE_MESSAGE_TYPES.isdisjoint(MANAGER_MESSAGE_TYPES)
    assert NODE_MESSAGE_TYPES | MANAGER_MESSAGE_TYPES | {"dashboard_update"} == set(MESSAGE_MODELS)


def test_auth_variants() -> None:
    token = decode(AUTH_TOKEN, max_bytes=BIG)
    assert isinstance(token, AuthMessage) and isinstance(token.payload, TokenAuth)
    assert token.payload.registration_token.get_secret_value() == TOKEN
    assert token.timestamp is None and "timestamp" not in encode(token)
    login = decode(AUTH_SECRET, max_bytes=BIG)
    assert isinstance(login, AuthMessage) and isinstance(login.payload, SecretAuth)
    assert login.payload.node_id == NODE_ID
    assert NODE_SECRET not in repr(login)  # SecretStr in repr
    assert NODE_SECRET in encode(login)  # the frame carries it


def test_auth_with_both_credentials_or_neither_is_invalid() -> None:
    both = json.loads(AUTH_SECRET)
    both["payload"]["registration_token"] = TOKEN
    neither = {"type": "auth", "payload": {"software_version": "1", "protocol_version": 1}}
    for document in (both, neither):
        with pytest.raises(ProtocolError) as info:
            decode(json.dumps(document), max_bytes=BIG)
        assert info.value.kind is ErrorKind.INVALID


def test_auth_may_carry_a_timestamp_other_messages_must() -> None:
    with_ts = json.loads(AUTH_TOKEN) | {"timestamp": TS}
    assert decode(json.dumps(with_ts), max_bytes=BIG).timestamp == WALL
    for text in (PING, REGISTER_ACK, ACK_FAILED):
        document = json.loads(text)
        del document["timestamp"]
        with pytest.raises(ProtocolError) as info:
            decode(json.dumps(document), max_bytes=BIG)
        assert info.value.kind is ErrorKind.INVALID
        assert "timestamp" in info.value.message


def test_timestamps_read_any_rfc3339_offset_and_write_utc_milliseconds() -> None:
    text = frame("ping", None).replace(TS, "2026-11-21T16:04:05.123456+01:00")
    message = decode(text, max_bytes=BIG)
    assert message.timestamp == WALL.replace(microsecond=123456)
    assert json.loads(encode(message))["timestamp"] == TS
    for bad in ("yesterday", 1764000000, "2026-11-21T15:04:05"):  # not RFC 3339; a number; no offset
        with pytest.raises(ProtocolError):
            decode(json.dumps({"type": "ping", "timestamp": bad, "payload": None}), max_bytes=BIG)


def test_auth_error_message_from_top_level_or_payload() -> None:
    both = decode(AUTH_ERROR, max_bytes=BIG)
    assert isinstance(both, AuthErrorMessage) and both.text == "Invalid node secret"
    top = decode(frame("auth_error", None, message="Token expired"), max_bytes=BIG)
    assert isinstance(top, AuthErrorMessage) and top.text == "Token expired"
    inner = json.loads(AUTH_ERROR)
    del inner["message"]
    only_payload = decode(json.dumps(inner), max_bytes=BIG)
    assert isinstance(only_payload, AuthErrorMessage) and only_payload.text == "Invalid node secret"
    with pytest.raises(ProtocolError):
        decode(frame("auth_error", None), max_bytes=BIG)


def test_fixed_shapes_forbid_unknown_keys() -> None:
    for text in (REGISTER_ACK, ACK_FAILED, COMMAND_START):
        document = json.loads(text)
        document["payload"]["surprise"] = 1
        with pytest.raises(ProtocolError) as info:
            decode(json.dumps(document), max_bytes=BIG)
        assert info.value.kind is ErrorKind.INVALID
        assert "unknown key" in info.value.message and "surprise" not in info.value.message
    envelope = json.loads(PING) | {"extra": True}
    with pytest.raises(ProtocolError):
        decode(json.dumps(envelope), max_bytes=BIG)


def test_stats_and_health_are_read_loosely() -> None:
    newer = {"flows": [{"flow_id": "a", "brand_new_field": {"x": 1}}], "future": [1, 2], "uptime_secs": 1.5}
    message = decode(frame("stats", newer), max_bytes=BIG)
    assert isinstance(message, StatsMessage) and message.payload.root == newer
    relay = {"total_tunnels": 2, "udp_sessions_active": 1}
    assert decode(frame("stats", relay), max_bytes=BIG).payload.root == relay  # type: ignore[union-attr]
    health = {"status": "ok", "quic_addr": "0.0.0.0:4433", "capabilities": ["udp-relay"]}
    assert decode(frame("health", health), max_bytes=BIG).payload.root == health  # type: ignore[union-attr]
    with pytest.raises(ProtocolError):
        decode(frame("stats", [1, 2]), max_bytes=BIG)  # still a JSON object


def test_event_is_read_leniently_and_normalised_for_storage() -> None:
    payload = {
        "severity": "error",  # no such severity (interop.md 11): stored as info
        "category": "c" * 300,
        "message": "m" * 20_000,
        "details": {"pid": 256},
        "flow_id": "cam1",
        "from_a_newer_node": True,
    }
    message = decode(frame("event", payload), max_bytes=BIG)
    assert isinstance(message, EventMessage)
    stored = normalise_event(message.payload)
    assert stored.severity is Severity.INFO
    assert len(stored.category) == CATEGORY_MAX_CHARS == 256
    assert len(stored.message) == EVENT_MESSAGE_MAX_CHARS == 10_000
    assert stored.details == {"pid": 256} and stored.flow_id == "cam1"
    relay = normalise_event(EventPayload(severity="warning", category="edge", message="edge gone"))
    assert (relay.severity, relay.category, relay.flow_id) == (Severity.WARNING, "edge", None)
    assert normalise_version("v" * 1000) == "v" * 256
    assert normalise_version("0.3.0") == "0.3.0"


def test_event_payload_from_the_edge_event_model() -> None:
    event = warning(EventCategory.SRT, "SRT peer gone", flow_id="cam1", peer="10.0.0.2:9000")
    payload = EventPayload.from_event(event)
    wire = json.loads(encode(EventMessage(timestamp=WALL, payload=payload)))["payload"]
    assert wire == {
        "severity": "warning",
        "category": "srt",
        "message": "SRT peer gone",
        "details": {"peer": "10.0.0.2:9000"},
        "flow_id": "cam1",
    }
    bare = EventPayload.from_event(warning(EventCategory.MANAGER, "connection lost"))
    assert json.loads(encode(EventMessage(timestamp=WALL, payload=bare)))["payload"] == {
        "severity": "warning",
        "category": "manager",
        "message": "connection lost",
    }  # details? and flow_id? are left out, not null


def test_edge_payload_builders_use_the_shared_models() -> None:
    flow = FlowStats(
        flow_id="cam1",
        flow_name="Camera 1",
        state=FlowState.RUNNING,
        health=Health.HEALTHY,
        input=InputStats(input_type="rtp"),
    )
    stats = edge_stats_payload(flows=[flow], tunnels=[], uptime_secs=9, active_flows=1, total_flows=2)
    decoded = decode(encode(StatsMessage(timestamp=WALL, payload=stats)), max_bytes=BIG)
    assert isinstance(decoded, StatsMessage)
    flows = decoded.payload.root["flows"]
    assert isinstance(flows, list)
    assert FlowStats.model_validate(flows[0]) == flow
    assert set(decoded.payload.root) == {"flows", "tunnels", "uptime_secs", "active_flows", "total_flows"}
    health = edge_health_payload(
        HealthStatus(version="0.3.0", uptime_secs=9, active_flows=1, total_flows=2),
        api_addr="0.0.0.0:8080",
        monitor_addr=None,
    )
    assert health.root == {
        "status": "ok",
        "version": "0.3.0",
        "uptime_secs": 9,
        "active_flows": 1,
        "total_flows": 2,
        "api_addr": "0.0.0.0:8080",
        "monitor_addr": None,
    }


def test_command_ack_data_is_optional_and_error_may_be_left_out() -> None:
    message = decode(frame("command_ack", {"command_id": str(COMMAND_ID), "success": True}), max_bytes=BIG)
    assert isinstance(message, CommandAckMessage)
    assert message.payload.error is None and message.payload.data is None
    assert json.loads(encode(message))["payload"] == {"command_id": str(COMMAND_ID), "success": True, "error": None}
    with pytest.raises(ProtocolError):  # success must be a JSON boolean
        decode(frame("command_ack", {"command_id": str(COMMAND_ID), "success": "yes", "error": None}), max_bytes=BIG)
    with pytest.raises(ProtocolError):
        decode(frame("command_ack", {"command_id": "not-a-uuid", "success": True, "error": None}), max_bytes=BIG)


def test_dashboard_update_model() -> None:
    node = DashboardNode(
        node_id=NODE_ID,
        name="relay 1",
        device_type=DeviceType.RELAY,
        status=NodeStatus.DEGRADED,
        stats=None,
        health=None,
        software_version=None,
        protocol_version=None,
        uptime_secs=None,
    )
    message = DashboardUpdateMessage(timestamp=WALL, payload=DashboardPayload(nodes=[node], online_count=1))
    wire = json.loads(encode(message))
    assert wire["type"] == "dashboard_update" and wire["timestamp"] == TS
    assert wire["payload"]["nodes"][0]["device_type"] == "relay"
    assert decode(encode(message), max_bytes=MANAGER_FRAME_MAX_BYTES) == message


# --------------------------------------------------------------------------- limits
def _padded_stats(size: int) -> str:
    head = '{"type":"stats","timestamp":"' + TS + '","payload":{"pad":"'
    tail = '"}}'
    return head + "x" * (size - len(head) - len(tail)) + tail


def test_a_node_frame_of_exactly_5_mib_is_accepted() -> None:
    text = _padded_stats(NODE_FRAME_MAX_BYTES)
    assert len(text.encode()) == 5 * 1024 * 1024
    assert isinstance(decode(text, max_bytes=NODE_FRAME_MAX_BYTES), StatsMessage)


def test_a_node_frame_of_5_mib_plus_one_is_the_drop_error() -> None:
    text = _padded_stats(NODE_FRAME_MAX_BYTES + 1)
    with pytest.raises(FrameTooLarge) as info:
        decode(text, max_bytes=NODE_FRAME_MAX_BYTES)
    assert info.value.kind is ErrorKind.FRAME_TOO_LARGE
    assert isinstance(info.value, ProtocolError)
    with pytest.raises(FrameTooLarge):
        decode(text.encode(), max_bytes=NODE_FRAME_MAX_BYTES)  # the same as a binary frame
    # Checked before parsing: an oversized frame that is not even JSON is still the size error.
    with pytest.raises(FrameTooLarge):
        decode("{" * (NODE_FRAME_MAX_BYTES + 1), max_bytes=NODE_FRAME_MAX_BYTES)


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    text = frame("event", {"severity": "info", "category": "flow", "message": "é" * 200})
    assert len(text) < 400 < len(text.encode())
    with pytest.raises(FrameTooLarge):
        decode(text, max_bytes=400)
    assert isinstance(decode(text, max_bytes=len(text.encode())), EventMessage)


def test_manager_frames_are_limited_to_1_mib_when_encoded() -> None:
    action = StartFlow(flow_id="x" * MANAGER_FRAME_MAX_BYTES)
    message = CommandMessage.model_validate(
        {"timestamp": TS, "payload": {"command_id": str(COMMAND_ID), "action": action.model_dump()}}
    )
    with pytest.raises(LocalProtocolError):
        encode(message, max_bytes=MANAGER_FRAME_MAX_BYTES)
    assert len(encode(message)) > MANAGER_FRAME_MAX_BYTES  # no limit unless asked


# --------------------------------------------------------------------------- malformed frames
@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", ErrorKind.MALFORMED),
        ("not json", ErrorKind.MALFORMED),
        ("[1,2]", ErrorKind.MALFORMED),
        ('{"payload":null}', ErrorKind.MALFORMED),
        ('{"type":7}', ErrorKind.MALFORMED),
        ("[" * 100 + "]" * 100, ErrorKind.MALFORMED),
        ('{"type":"telemetry","timestamp":"' + TS + '","payload":{}}', ErrorKind.UNKNOWN_TYPE),
        ('{"type":"ping","timestamp":"' + TS + '","payload":{"x":1}}', ErrorKind.INVALID),
    ],
)
def test_malformed_frames_raise_protocol_error_kinds(text: str, kind: ErrorKind) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(text, max_bytes=BIG)
    assert info.value.kind is kind


def test_unknown_type_is_its_own_class_and_does_not_repeat_the_type() -> None:
    with pytest.raises(UnknownMessageType) as info:
        decode(frame("telemetry-SECRET-type", {}), max_bytes=BIG)
    assert "SECRET" not in str(info.value)


def test_invalid_utf8_binary_frame() -> None:
    with pytest.raises(ProtocolError) as info:
        decode(b'{"type":"ping","x":"\xff"}', max_bytes=BIG)
    assert info.value.kind is ErrorKind.MALFORMED


FAKE_SECRET = "fake-SECRET-d41d8cd98f00b204"


@pytest.mark.parametrize(
    "text",
    [
        # invalid field next to the secret (protocol_version a string)
        '{"type":"auth","payload":{"node_id":"n1","node_secret":"'
        + FAKE_SECRET
        + '","software_version":"1","protocol_version":"1"}}',
        # the secret as an unknown key, and as a value of the wrong type
        '{"type":"auth","payload":{"registration_token":"t","software_version":"1","protocol_version":1,"'
        + FAKE_SECRET
        + '":1}}',
        '{"type":"register_ack","timestamp":"' + TS + '","payload":{"node_id":"' + FAKE_SECRET + '","node_secret":7}}',
        # the secret in a field that is too long, and where the timestamp should be
        '{"type":"auth","payload":{"node_id":"n","node_secret":"' + FAKE_SECRET * 500 + '","software_version":"1",'
        '"protocol_version":1}}',
        '{"type":"ping","timestamp":"' + FAKE_SECRET + '","payload":null}',
        # broken JSON around the secret
        '{"type":"auth","payload":{"node_secret":"' + FAKE_SECRET + '"',
        # the secret as the action of a command and as the type
        '{"type":"command","timestamp":"' + TS + '","payload":{"command_id":"x","action":"' + FAKE_SECRET + '"}}',
        '{"type":"' + FAKE_SECRET + '","payload":null}',
    ],
)
def test_error_text_never_contains_frame_content(text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(text, max_bytes=BIG)
    error = info.value
    for shown in (str(error), repr(error), error.message, *map(str, error.args)):
        assert "SECRET" not in shown
    # Nothing chained either: a JSONDecodeError keeps the document, a ValidationError the values.
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_secrets_are_masked_outside_the_frame() -> None:
    message = decode(REGISTER_ACK, max_bytes=BIG)
    assert isinstance(message, RegisterAckMessage)
    assert NODE_SECRET not in repr(message) and NODE_SECRET not in str(message.model_dump())
    assert message.payload.node_secret == SecretStr(NODE_SECRET)


def test_decode_accepts_a_uuid_in_any_case_and_writes_lowercase() -> None:
    upper = COMMAND_START.replace(str(COMMAND_ID), str(COMMAND_ID).upper())
    message = decode(upper, max_bytes=BIG)
    assert isinstance(message, CommandMessage) and message.payload.command_id == COMMAND_ID
    assert str(COMMAND_ID) in encode(message)
    assert uuid.UUID(json.loads(encode(message))["payload"]["command_id"]).version == 4
