"""Canned frames copied from interop.md 6 (the "…" filled with concrete values) and test clocks."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

WALL = datetime(2026, 11, 21, 15, 4, 5, 123000, tzinfo=UTC)
TS = "2026-11-21T15:04:05.123Z"


def wall_clock() -> datetime:
    return WALL


NODE_ID = "5b0c2f7e-8d1a-4c3b-9e6f-0a1b2c3d4e5f"
NODE_SECRET = "e1d2-node-SECRET-4f7a"
TOKEN = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
COMMAND_ID = uuid.UUID("0b6e1a52-3f5d-4c1e-9a57-2d0c1b7e9f10")

# interop.md 6 "Handshake".
AUTH_TOKEN = (
    '{"type":"auth","payload":{"registration_token":"' + TOKEN + '","software_version":"0.3.0","protocol_version":1}}'
)
AUTH_SECRET = (
    '{"type":"auth","payload":{"node_id":"'
    + NODE_ID
    + '","node_secret":"'
    + NODE_SECRET
    + '","software_version":"0.3.0","protocol_version":1}}'
)
REGISTER_ACK = (
    '{"type":"register_ack","timestamp":"'
    + TS
    + '","payload":{"node_id":"'
    + NODE_ID
    + '","node_secret":"'
    + NODE_SECRET
    + '"}}'
)
AUTH_OK = '{"type":"auth_ok","timestamp":"' + TS + '","payload":null}'
AUTH_ERROR = (
    '{"type":"auth_error","timestamp":"'
    + TS
    + '","message":"Invalid node secret","payload":{"message":"Invalid node secret"}}'
)
# interop.md 6 "Manager → node".
COMMAND_START = (
    '{"type":"command","timestamp":"'
    + TS
    + '","payload":{"command_id":"'
    + str(COMMAND_ID)
    + '","action":{"type":"start_flow","flow_id":"cam1"}}}'
)
ACK_FAILED = (
    '{"type":"command_ack","timestamp":"'
    + TS
    + '","payload":{"command_id":"'
    + str(COMMAND_ID)
    + '","success":false,"error":"Flow \'cam1\' is already running"}}'
)
PING = '{"type":"ping","timestamp":"' + TS + '","payload":null}'
PONG = '{"type":"pong","timestamp":"' + TS + '","payload":null}'


def frame(type_: str, payload: Any, **extra: Any) -> str:
    """A frame with the test timestamp."""
    return json.dumps(
        {"type": type_, "timestamp": TS, "payload": payload, **extra}, separators=(",", ":"), ensure_ascii=False
    )


def command(action: dict[str, Any], command_id: uuid.UUID = COMMAND_ID) -> str:
    return frame("command", {"command_id": str(command_id), "action": action})


def ack(command_id: uuid.UUID, *, success: bool = True, error: str | None = None, **more: Any) -> str:
    return frame("command_ack", {"command_id": str(command_id), "success": success, "error": error, **more})
