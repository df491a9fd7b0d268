"""``/api/v1/nodes`` and ``/api/v1/device-types`` (interop.md 6, 7.1, 7.2, 13).

- ``GET /api/v1/nodes[?device_type=edge|relay]`` (viewer+): a bare array, oldest first.
- ``POST /api/v1/nodes`` (admin+): ``{name, description?, device_type?, expires_at?, metadata?}``
  → 201 with the node's fields and ``registration_token`` (shown only here; stored as SHA-256).
- ``GET /api/v1/nodes/{id}`` (viewer+); ``PUT`` (admin+, partial); ``DELETE`` (admin+, 204,
  closes the live socket first).
- ``POST /api/v1/nodes/{id}/token`` (admin+): a new token; the node goes back to ``pending``, its
  secret is cleared and its live socket closed.
- ``GET /api/v1/device-types`` (viewer+): ``[{id, name, capabilities}]``.
- ``GET/PUT /api/v1/nodes/{id}/config`` (operator+): the hub's cached config as received; a new
  config (≤100 KiB) sent as ``update_config``. Both carry the bare config object.
- ``POST /api/v1/nodes/{id}/command`` (operator+): ``{"action": {...}}`` relayed verbatim.

Node access: a user below ``admin`` whose ``allowed_node_ids`` is a list sees and acts on those
nodes only (null: every node); any other ``{id}`` is 403, before it is looked up, so the answer
never tells whether the node exists. Checks follow interop.md 13: 401 → 403 CSRF → 403 role
(the guard) → 403 node access → 413 → 400 → 404 → 502/504. No answer or log line carries a
node secret or a token digest; the token appears in the create and token answers only.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any, Final, cast

import trio
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    TypeAdapter,
    field_validator,
    model_validator,
)
from quart import Blueprint, Response, request

from appliance import errors
from appliance.http.app import read_json_object, validate
from appliance.http.envelope import json_response
from appliance.protocol import (
    EDGE_ACTION_TYPES,
    MAX_ACTION_BYTES,
    MAX_CONFIG_BYTES,
    RELAY_ACTION_TYPES,
    InvalidAction,
    RotateSecret,
    UnknownAction,
    action_types_for,
    parse_action,
)
from appliance.protocol import DeviceType as ProtocolDeviceType
from services.manager import auth
from services.manager.api.auth_routes import current_principal, require, service
from services.manager.api.ws import node_hub
from services.manager.config_check import edge_config_problems
from services.manager.hub import (
    CommandFailed,
    CommandResult,
    CommandTimedOut,
    NodeNotConnected,
)
from services.manager.service import Principal, rfc3339
from services.manager.store import DeviceType, JsonObject, NewNode, NodeChanges, NodeRecord, Role

__all__ = ["DEVICE_TYPE_NAMES", "NodeCreate", "NodeOut", "NodeUpdate", "bp"]

bp = Blueprint("manager_nodes", __name__)

DEVICE_TYPE_NAMES: Final = {DeviceType.EDGE: "Edge node", DeviceType.RELAY: "Relay"}
CONFIG_POLL_INTERVAL_S: Final = 0.1
CONFIG_POLL_LIMIT_S: Final = 3.0
"""interop.md 6 "Config cache": the cache is polled every 100 ms for up to 3 s."""
DISCONNECT_WAIT_S: Final = 5.0
_ALL_ACTION_TYPES: Final = EDGE_ACTION_TYPES | RELAY_ACTION_TYPES
_UNSUPPORTED: Final = "action.type is not a command this device type runs"


# --------------------------------------------------------------------------- bodies
class NodeOut(BaseModel):
    """A node as the routes answer it: exactly interop.md 7.2's fields."""

    id: uuid.UUID
    name: str
    description: str | None
    device_type: DeviceType
    status: str
    last_seen_at: str | None
    last_health: Any
    software_version: str | None
    protocol_version: int | None
    metadata: Any
    expires_at: str | None
    created_at: str
    updated_at: str

    @classmethod
    def from_record(cls, record: NodeRecord) -> NodeOut:
        def when(value: datetime | None) -> str | None:
            return None if value is None else rfc3339(value)

        return cls(
            id=record.id,
            name=record.name,
            description=record.description,
            device_type=record.device_type,
            status=record.status.value,
            last_seen_at=when(record.last_seen_at),
            last_health=record.last_health,
            software_version=record.software_version,
            protocol_version=record.protocol_version,
            metadata=record.metadata,
            expires_at=when(record.expires_at),
            created_at=rfc3339(record.created_at),
            updated_at=rfc3339(record.updated_at),
        )


def _future(value: datetime | None) -> datetime | None:
    if value is not None and value <= datetime.now(UTC):
        raise ValueError("must be in the future")
    return value


class NodeCreate(BaseModel):
    """``POST /api/v1/nodes`` (interop.md 7.2)."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(min_length=1, max_length=128)
    description: StrictStr | None = Field(None, max_length=512)
    device_type: DeviceType = DeviceType.EDGE
    expires_at: AwareDatetime | None = None
    metadata: dict[str, Any] | None = None

    _expires = field_validator("expires_at")(_future)


_NOT_NULL: Final = ("name",)


class NodeUpdate(BaseModel):
    """``PUT /api/v1/nodes/{id}``: any subset of ``name``, ``description``, ``expires_at``, ``metadata``."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr | None = Field(None, min_length=1, max_length=128)
    description: StrictStr | None = Field(None, max_length=512)
    expires_at: AwareDatetime | None = None
    metadata: dict[str, Any] | None = None

    _expires = field_validator("expires_at")(_future)

    @model_validator(mode="after")
    def _no_null_name(self) -> NodeUpdate:
        nulls = [name for name in _NOT_NULL if name in self.model_fields_set and getattr(self, name) is None]
        if nulls:
            raise ValueError(f"{', '.join(nulls)} cannot be null")
        return self

    def changes(self) -> NodeChanges:
        """The keys sent (null clears ``description``, ``expires_at`` and ``metadata``)."""
        changes: NodeChanges = {}
        sent = self.model_fields_set
        if self.name is not None:
            changes["name"] = self.name
        if "description" in sent:
            changes["description"] = self.description
        if "expires_at" in sent:
            changes["expires_at"] = self.expires_at
        if "metadata" in sent:
            changes["metadata"] = cast(JsonObject | None, self.metadata)
        return changes


_CREATE: Final = TypeAdapter(NodeCreate)
_UPDATE: Final = TypeAdapter(NodeUpdate)


# --------------------------------------------------------------------------- helpers
def _node_id(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _restriction(principal: Principal) -> frozenset[uuid.UUID] | None:
    """The nodes a caller may see, or None for every node (``auth.visible_node_ids``)."""
    return auth.visible_node_ids(principal.user)


def _check_node_access(text: str) -> uuid.UUID | None:
    """The ``{id}`` as a UUID (None if malformed); 403 when the caller may not touch that node."""
    uid = _node_id(text)
    allowed = _restriction(current_principal())
    if allowed is not None and (uid is None or uid not in allowed):
        raise errors.NotAllowed("no access to this node")
    return uid


async def _find(uid: uuid.UUID | None) -> NodeRecord | None:
    return None if uid is None else await service().store.get_node(uid)


def _not_found() -> errors.NotFound:
    return errors.NotFound("node not found")


def _new_token() -> tuple[str, str]:
    """A fresh registration token (UUIDv4, interop.md 6) and its SHA-256 hex digest (7.7)."""
    token = str(uuid.uuid4())
    return token, hashlib.sha256(token.encode("utf-8")).hexdigest()


async def _raw_body() -> bytes:
    data = await request.get_data(cache=True)
    return data.encode("utf-8") if isinstance(data, str) else data


async def _relay(node_id: uuid.UUID, action: dict[str, Any], *, max_bytes: int) -> CommandResult:
    """``hub.send_command`` with its node errors as the shared kinds (502, 504, 422)."""
    try:
        return await node_hub().send_command(node_id, action, max_bytes=max_bytes)
    except NodeNotConnected as exc:
        raise errors.BadGateway(exc.message) from None
    except CommandTimedOut as exc:
        raise errors.GatewayTimeout(exc.message) from None
    except CommandFailed as exc:
        raise errors.Unprocessable(exc.message) from None


# --------------------------------------------------------------------------- nodes
@bp.get("/api/v1/nodes")
@require(Role.VIEWER)
async def list_nodes() -> Response:
    """Every node the caller may see, a bare array; ``?device_type=edge|relay`` filters."""
    wanted = request.args.get("device_type")
    device_type: DeviceType | None = None
    if wanted is not None:
        try:
            device_type = DeviceType(wanted)
        except ValueError:
            raise errors.InvalidInput("device_type must be edge or relay") from None
    allowed = _restriction(current_principal())
    found = await service().store.list_nodes(device_type)
    return json_response([NodeOut.from_record(n) for n in found if allowed is None or n.id in allowed])


@bp.post("/api/v1/nodes")
@require(Role.ADMIN)
async def create_node() -> Response:
    """Creates a ``pending`` node: 201 with its fields and its one-time ``registration_token``."""
    body = validate(_CREATE, await read_json_object())
    token, digest = _new_token()
    record = await service().store.create_node(
        NewNode(
            name=body.name,
            description=body.description,
            device_type=body.device_type,
            expires_at=body.expires_at,
            metadata=cast(JsonObject | None, body.metadata),
            registration_token_digest=digest,
        )
    )
    out = NodeOut.from_record(record).model_dump(mode="json")
    return json_response({**out, "registration_token": token}, 201, {"Cache-Control": "no-store"})


@bp.get("/api/v1/device-types")
@require(Role.VIEWER)
async def device_types() -> Response:
    """The device types and the command names each runs (interop.md 13)."""
    return json_response(
        [
            {
                "id": kind.value,
                "name": DEVICE_TYPE_NAMES[kind],
                "capabilities": sorted(action_types_for(ProtocolDeviceType(kind.value))),
            }
            for kind in DeviceType
        ]
    )


@bp.get("/api/v1/nodes/<node_id>")
@require(Role.VIEWER)
async def get_node(node_id: str) -> Response:
    """One node's fields."""
    found = await _find(_check_node_access(node_id))
    if found is None:
        raise _not_found()
    return json_response(NodeOut.from_record(found))


@bp.put("/api/v1/nodes/<node_id>")
@require(Role.ADMIN)
async def update_node(node_id: str) -> Response:
    """A partial update of the node's metadata fields."""
    uid = _check_node_access(node_id)
    body = validate(_UPDATE, await read_json_object())
    if uid is None or await _find(uid) is None:
        raise _not_found()
    updated = await service().store.update_node(uid, **body.changes())
    return json_response(NodeOut.from_record(updated))


@bp.delete("/api/v1/nodes/<node_id>")
@require(Role.ADMIN)
async def delete_node(node_id: str) -> Response:
    """Closes the node's live socket (its offline bookkeeping first), then deletes it: 204."""
    uid = _check_node_access(node_id)
    if uid is None or await _find(uid) is None:
        raise _not_found()
    hub = node_hub()
    if await hub.disconnect(uid):
        await hub.wait_disconnected(uid, DISCONNECT_WAIT_S)
    await service().store.delete_node(uid)
    return Response("", status=204)


@bp.post("/api/v1/nodes/<node_id>/token")
@require(Role.ADMIN)
async def new_token(node_id: str) -> Response:
    """A new registration token; the node is ``pending`` again, without a secret or a socket."""
    uid = _check_node_access(node_id)
    if uid is None or await _find(uid) is None:
        raise _not_found()
    token, digest = _new_token()
    # The secret is cleared first, so the node cannot log in again between the two steps.
    await service().store.reset_registration_token(uid, digest)
    hub = node_hub()
    if await hub.disconnect(uid):
        # The close's ``offline`` is written behind and cannot move the node out of ``pending``
        # (Store.record_node_reports), so it is pending until it registers.
        await hub.wait_disconnected(uid, DISCONNECT_WAIT_S)
    return json_response({"registration_token": token}, headers={"Cache-Control": "no-store"})


# --------------------------------------------------------------------------- history
HISTORY_SECONDS_MAX: Final = 3600


@bp.get("/api/v1/nodes/<node_id>/history")
@require(Role.VIEWER)
async def get_history(node_id: str) -> Response:
    """The node's flows' bit rates over the last minutes (``?seconds=N``, default the whole window
    of ten minutes), kept by the hub from the ``stats`` frames: ``{window_secs, flows: [{flow_id,
    flow_name, t: [Unix s], input_bps: [...], output_bps: [...]}]}``. Beyond the interface: the
    dashboard's charts start from it (docs/dashboard.md)."""
    uid = _check_node_access(node_id)
    if uid is None or await _find(uid) is None:
        raise _not_found()
    raw = request.args.get("seconds")
    seconds = None
    if raw is not None:
        if not raw.isdigit() or not 1 <= int(raw) <= HISTORY_SECONDS_MAX:
            raise errors.InvalidInput(f"seconds must be a whole number from 1 to {HISTORY_SECONDS_MAX}")
        seconds = int(raw)
    hub = node_hub()
    return json_response(hub.history.series(uid, hub.wall_time(), seconds))


# --------------------------------------------------------------------------- config
@bp.get("/api/v1/nodes/<node_id>/config")
@require(Role.OPERATOR)
async def get_config(node_id: str) -> Response:
    """The connected node's cached config, as received; 502 when it is not connected, or no
    config arrives within 3 s."""
    uid = _check_node_access(node_id)
    if uid is None or await _find(uid) is None:
        raise _not_found()
    hub, store = node_hub(), service().store
    with trio.move_on_after(CONFIG_POLL_LIMIT_S):
        while True:
            if not hub.is_connected(uid):
                raise errors.BadGateway("Node is not connected")
            cached = await store.get_cached_config(uid)
            if cached is not None:
                return Response(cached.config_json, status=200, content_type="application/json")
            await trio.sleep(CONFIG_POLL_INTERVAL_S)
    raise errors.BadGateway("Node has not reported its config")


@bp.put("/api/v1/nodes/<node_id>/config")
@require(Role.OPERATOR)
async def put_config(node_id: str) -> Response:
    """Sends the config (≤100 KiB) as ``update_config``; 200 with the config as sent."""
    uid = _check_node_access(node_id)
    if len(await _raw_body()) > MAX_CONFIG_BYTES:
        raise errors.PayloadTooLarge("Config exceeds 100 KiB")
    config = await read_json_object()
    if uid is None or await _find(uid) is None:
        raise _not_found()
    action = {"type": "update_config", "config": config}
    await _relay(uid, action, max_bytes=MAX_CONFIG_BYTES + 64)  # + the action's own keys
    return Response(await _raw_body(), status=200, content_type="application/json")


@bp.post("/api/v1/nodes/<node_id>/config/validate")
@require(Role.OPERATOR)
async def validate_config(node_id: str) -> Response:
    """Checks an edge config (≤100 KiB) against the edge's model without sending it: 200
    ``{valid, errors: [{path, message}]}`` (services/manager/config_check.py). Beyond the
    interface: the dashboard's config editor checks before it sends (docs/dashboard.md)."""
    uid = _check_node_access(node_id)
    if len(await _raw_body()) > MAX_CONFIG_BYTES:
        raise errors.PayloadTooLarge("Config exceeds 100 KiB")
    config = await read_json_object()
    found = await _find(uid)
    if found is None:
        raise _not_found()
    if found.device_type is not DeviceType.EDGE:
        raise errors.InvalidInput("only an edge's config is checked here")
    problems = edge_config_problems(config)
    return json_response({"valid": not problems, "errors": problems})


# --------------------------------------------------------------------------- commands
def _check_action(action: object, device_type: DeviceType | None) -> dict[str, Any]:
    """400 unless ``action`` is an object with a ``type`` the device type runs, and valid arguments.

    Without the node (``device_type`` None, a 404 to come) any known type passes here.
    """
    if not isinstance(action, dict):
        raise errors.InvalidInput("action must be an object")
    kind = action.get("type")
    if not isinstance(kind, str):
        raise errors.InvalidInput("action.type is required and must be a string")
    supported = _ALL_ACTION_TYPES if device_type is None else action_types_for(ProtocolDeviceType(device_type.value))
    parsed = parse_action(action, supported=supported)
    if isinstance(parsed, UnknownAction):
        raise errors.InvalidInput(_UNSUPPORTED)
    if isinstance(parsed, InvalidAction):
        raise errors.InvalidInput(f"Validation failed: {parsed.problem}")
    return action


@bp.post("/api/v1/nodes/<node_id>/command")
@require(Role.OPERATOR)
async def command(node_id: str) -> Response:
    """Relays ``action`` and waits for the node: 200 ``{command_id, success, data?}``."""
    uid = _check_node_access(node_id)
    body = await read_json_object()
    action = body.get("action")
    try:
        size = len(json.dumps(action, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError):
        size = 0
    if size > MAX_ACTION_BYTES:
        raise errors.PayloadTooLarge("Command action exceeds 50 KiB")
    record = await _find(uid)
    checked = _check_action(action, None if record is None else record.device_type)
    if uid is None or record is None:
        raise _not_found()
    parsed = parse_action(checked)
    if isinstance(parsed, RotateSecret):
        # interop.md 6: until the ack, the old and the new secret both work.
        ciphertext = service().secret_box.encrypt(parsed.new_secret.get_secret_value())
        await service().store.begin_secret_rotation(uid, ciphertext)
    result = await _relay(uid, checked, max_bytes=MAX_ACTION_BYTES)
    answer: dict[str, Any] = {"command_id": str(result.command_id), "success": True}
    if result.data is not None:
        answer["data"] = result.data
    return json_response(answer)
