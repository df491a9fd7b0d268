"""``POST /api/v1/tunnels``: the manager pairs two edges into a tunnel (issue 16; interop.md 2.6,
6, 8.4, 13).

The body names the two edges and, in relay mode, the relay; the manager makes the tunnel's id
(UUIDv4) and its secrets (``tunnel_encryption_key``, and ``tunnel_bind_secret`` in relay mode or
``tunnel_psk`` in direct mode: 32 random bytes as 64 hex, from :mod:`secrets`), then sends, in
this order and each waiting for its ack:

1. relay mode only: ``authorize_tunnel {tunnel_id, ingress_token, egress_token}`` to the relay
   (the tokens of 8.4, from the bind secret);
2. ``create_tunnel {tunnel}`` to the sink edge (``egress_node_id``, ``direction: ingress``);
3. ``create_tunnel {tunnel}`` to the source edge (``ingress_node_id``, ``direction: egress``).

interop.md 2.6: the manager's "ingress node" is the source and gets ``direction: egress``.

When a step fails, the steps done are undone in reverse order (``delete_tunnel`` on an edge,
``revoke_tunnel`` on the relay), the step that timed out included (its node may have applied it),
and the answer is the failing step's error: 502 (not connected), 504 (no ack in 10 s) or 422 (the
node's text), prefixed with the step and the node it failed on. A request cancelled mid-way
(the client went away) undoes the steps done and the one in flight, shielded and bounded. Success
is 201 with the tunnel's public fields; no answer, event or log line carries a key, a secret or a
token.

Checks follow interop.md 13: 401 → 403 CSRF → 403 role (operator+, the guard) → 403 node access
(every node named, read from the raw body before it is validated) → 413 (the app's body cap) →
400 body → 404 node → 400 device type → 502 a node not connected → the steps.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass
from typing import Any, Final, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, StrictStr, TypeAdapter, model_validator
from quart import Blueprint, Response

from appliance import errors
from appliance.http.app import read_json_object, validate
from appliance.http.envelope import json_response
from appliance.models.config import HostPort, SocketAddr
from appliance.relayproto import BindAuthorization
from services.manager import auth
from services.manager.api.auth_routes import current_principal, require, service
from services.manager.api.ws import node_hub
from services.manager.hub import CommandFailed, CommandTimedOut, NodeNotConnected
from services.manager.store import DeviceType, EventSeverity, JsonValue, NewEvent, Role

__all__ = ["TunnelCreate", "bp"]

bp = Blueprint("manager_tunnels", __name__)

_log = logging.getLogger("mediaplane.manager.tunnels")

NODE_FIELDS: Final = ("ingress_node_id", "egress_node_id", "relay_node_id")
"""The body's node references; the caller must have access to each one given."""
UNDO_LIMIT_S: Final = 35.0
"""The rollback's bound (at most three undo steps, each bounded by the hub's 10 s command timeout)."""


# --------------------------------------------------------------------------- the body
class TunnelCreate(BaseModel):
    """``POST /api/v1/tunnels``. ``ingress_node_id`` is the source edge (it takes local traffic on
    ``ingress_local_addr``), ``egress_node_id`` the sink edge (it delivers to ``egress_local_addr``)."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = Field(min_length=1, max_length=256)
    protocol: Literal["udp", "tcp"]
    mode: Literal["relay", "direct"] = "relay"
    transport: Literal["quic", "udp"] = "quic"
    ingress_node_id: uuid.UUID = Field(strict=False)
    egress_node_id: uuid.UUID = Field(strict=False)
    ingress_local_addr: SocketAddr
    egress_local_addr: SocketAddr
    relay_node_id: uuid.UUID | None = Field(default=None, strict=False)
    relay_addr: HostPort | None = None
    direct_listen_addr: SocketAddr | None = None
    peer_addr: HostPort | None = None

    @model_validator(mode="after")
    def _check_mode(self) -> TunnelCreate:
        if self.ingress_node_id == self.egress_node_id:
            raise ValueError("ingress_node_id and egress_node_id must be two different nodes")
        if self.transport == "udp" and (self.protocol != "udp" or self.mode != "relay"):
            raise ValueError("transport udp needs protocol udp and mode relay")
        if self.mode == "relay":
            missing = [name for name in ("relay_node_id", "relay_addr") if getattr(self, name) is None]
            extra = [name for name in ("direct_listen_addr", "peer_addr") if getattr(self, name) is not None]
            if missing:
                raise ValueError(f"{', '.join(missing)} required in relay mode")
            if extra:
                raise ValueError(f"{', '.join(extra)} only allowed in direct mode")
        else:
            missing = [name for name in ("direct_listen_addr", "peer_addr") if getattr(self, name) is None]
            extra = [name for name in ("relay_node_id", "relay_addr") if getattr(self, name) is not None]
            if missing:
                raise ValueError(f"{', '.join(missing)} required in direct mode")
            if extra:
                raise ValueError(f"{', '.join(extra)} only allowed in relay mode")
        return self


_CREATE: Final = TypeAdapter(TunnelCreate)


@dataclass(frozen=True, slots=True)
class _Secrets:
    encryption_key: str
    bind_secret: str | None
    psk: str | None

    def __repr__(self) -> str:  # never printed, whatever logs it
        return "_Secrets(<hidden>)"


def _new_secret() -> str:
    """32 random bytes as 64 hex chars (interop.md 2.6, 8.4)."""
    return secrets.token_hex(32)


def _tunnel(
    body: TunnelCreate, tunnel_id: str, keys: _Secrets, direction: Literal["ingress", "egress"]
) -> dict[str, Any]:
    """One edge's ``create_tunnel.tunnel`` (interop.md 2.6): ``ingress`` is the sink's."""
    sink = direction == "ingress"
    tunnel: dict[str, Any] = {
        "id": tunnel_id,
        "name": body.name,
        "enabled": True,
        "protocol": body.protocol,
        "mode": body.mode,
        "direction": direction,
        "local_addr": body.egress_local_addr if sink else body.ingress_local_addr,
        "transport": body.transport,
        "tunnel_encryption_key": keys.encryption_key,
    }
    if body.mode == "relay":
        tunnel["relay_addr"] = body.relay_addr
        tunnel["tunnel_bind_secret"] = keys.bind_secret
    elif sink:
        tunnel["direct_listen_addr"] = body.direct_listen_addr
        tunnel["tunnel_psk"] = keys.psk
    else:
        tunnel["peer_addr"] = body.peer_addr
        tunnel["tunnel_psk"] = keys.psk
    return tunnel


# --------------------------------------------------------------------------- checks
def _check_node_access(raw: dict[str, Any]) -> None:
    """403 unless the caller may act on every node the body names (before it is validated: a
    malformed id of a restricted caller is 403 too, so the answer never tells what exists)."""
    allowed = auth.visible_node_ids(current_principal().user)
    if allowed is None:
        return
    for name in NODE_FIELDS:
        value = raw.get(name)
        if value is None and name == "relay_node_id":
            continue
        try:
            uid = uuid.UUID(value) if isinstance(value, str) else None
        except ValueError:
            uid = None
        if uid is None or uid not in allowed:
            raise errors.NotAllowed("no access to this node")


async def _check_nodes(body: TunnelCreate) -> None:
    """404 for an unknown node, 400 for one of the wrong device type, 502 for one not connected."""
    store, hub = service().store, node_hub()
    wanted = [
        (body.ingress_node_id, DeviceType.EDGE, "source edge"),
        (body.egress_node_id, DeviceType.EDGE, "sink edge"),
    ]
    if body.relay_node_id is not None:
        wanted.append((body.relay_node_id, DeviceType.RELAY, "relay"))
    records = [(await store.get_node(uid), kind, role) for uid, kind, role in wanted]
    for record, _, role in records:
        if record is None:
            raise errors.NotFound(f"{role} node not found")
    for record, kind, role in records:
        assert record is not None
        if record.device_type is not kind:
            raise errors.InvalidInput(f"the {role} node must be of device type {kind.value}")
    for uid, _, role in wanted:
        if not hub.is_connected(uid):
            raise errors.BadGateway(f"{role} {uid}: Node is not connected")


# --------------------------------------------------------------------------- the steps
class _StepFailed(Exception):
    def __init__(self, error: errors.ApplianceError, applied: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.applied = applied
        """Whether the node may have applied the step (it timed out): then it is undone too."""


async def _step(node_id: uuid.UUID, role: str, action: dict[str, Any]) -> None:
    """Sends ``action``; a failure as the command route maps it, naming the step and the node."""
    prefix = f"{role} {node_id}: {action['type']} failed: "
    try:
        await node_hub().send_command(node_id, action)
    except NodeNotConnected as exc:
        raise _StepFailed(errors.BadGateway(prefix + exc.message), applied=False) from None
    except CommandTimedOut as exc:
        raise _StepFailed(errors.GatewayTimeout(prefix + exc.message), applied=True) from None
    except CommandFailed as exc:
        raise _StepFailed(errors.Unprocessable(prefix + exc.message), applied=False) from None
    except errors.ApplianceError as exc:  # InvalidCommand, CommandTooLarge: a bug here
        _log.error("tunnel pairing: the %s step %s was refused by the hub", role, action["type"])
        raise _StepFailed(errors.Internal("tunnel pairing failed"), applied=False) from exc


async def _undo(steps: list[tuple[uuid.UUID, str, dict[str, Any]]], tunnel_id: str) -> None:
    """Runs the undo actions, newest first; a failure is logged and the rest still run.

    Shielded, so that a cancelled request (the client went away) still cleans up; bounded by
    :data:`UNDO_LIMIT_S`. When the manager stops, the node sockets close and every waiting
    command ends at once (502), so this does not hold up the shutdown.
    """
    with trio.CancelScope(shield=True, deadline=trio.current_time() + UNDO_LIMIT_S):
        for node_id, role, action in reversed(steps):
            try:
                await node_hub().send_command(node_id, action)
            except errors.ApplianceError as exc:
                _log.warning(
                    "tunnel %s: rollback %s on %s %s failed: %s", tunnel_id, action["type"], role, node_id, exc.message
                )
            else:
                _log.info("tunnel %s: rolled back with %s on %s %s", tunnel_id, action["type"], role, node_id)


async def _pair(body: TunnelCreate, tunnel_id: str, keys: _Secrets) -> None:
    """The steps in order; on a failure the done ones are undone and the step's error raised."""
    steps: list[tuple[uuid.UUID, str, dict[str, Any], dict[str, Any]]] = []
    if body.relay_node_id is not None and keys.bind_secret is not None:
        tokens = BindAuthorization.from_secret(keys.bind_secret, tunnel_id)
        authorize = {
            "type": "authorize_tunnel",
            "tunnel_id": tunnel_id,
            "ingress_token": tokens.ingress_token,
            "egress_token": tokens.egress_token,
        }
        steps.append((body.relay_node_id, "relay", authorize, {"type": "revoke_tunnel", "tunnel_id": tunnel_id}))
    delete = {"type": "delete_tunnel", "tunnel_id": tunnel_id}
    sink = {"type": "create_tunnel", "tunnel": _tunnel(body, tunnel_id, keys, "ingress")}
    source = {"type": "create_tunnel", "tunnel": _tunnel(body, tunnel_id, keys, "egress")}
    steps.append((body.egress_node_id, "sink edge", sink, delete))
    steps.append((body.ingress_node_id, "source edge", source, delete))

    done: list[tuple[uuid.UUID, str, dict[str, Any]]] = []
    for node_id, role, action, undo in steps:
        try:
            await _step(node_id, role, action)
        except _StepFailed as failed:
            _log.warning("tunnel %s: pairing failed at the %s step (%s %s)", tunnel_id, action["type"], role, node_id)
            if failed.applied:
                done.append((node_id, role, undo))
            await _undo(done, tunnel_id)
            raise failed.error from None
        except BaseException:
            # Cancelled (the client went away, the manager is stopping) or a bug: the step in
            # flight may have been applied, so it is undone with the others.
            _log.warning(
                "tunnel %s: pairing interrupted at the %s step (%s %s)", tunnel_id, action["type"], role, node_id
            )
            await _undo([*done, (node_id, role, undo)], tunnel_id)
            raise
        done.append((node_id, role, undo))


# --------------------------------------------------------------------------- the route
@bp.post("/api/v1/tunnels")
@require(Role.OPERATOR)
async def create_tunnel() -> Response:
    """Pairs the two edges (and authorises the relay): 201 with the tunnel's public fields."""
    raw = await read_json_object()
    _check_node_access(raw)
    body = validate(_CREATE, raw)
    await _check_nodes(body)

    tunnel_id = str(uuid.uuid4())
    relay = body.mode == "relay"
    keys = _Secrets(
        encryption_key=_new_secret(),
        bind_secret=_new_secret() if relay else None,
        psk=None if relay else _new_secret(),
    )
    await _pair(body, tunnel_id, keys)

    public: dict[str, Any] = {
        "id": tunnel_id,
        "name": body.name,
        "protocol": body.protocol,
        "mode": body.mode,
        "transport": body.transport,
        "ingress_node_id": str(body.ingress_node_id),
        "egress_node_id": str(body.egress_node_id),
        "relay_node_id": None if body.relay_node_id is None else str(body.relay_node_id),
    }
    details: JsonValue = {
        "tunnel_id": tunnel_id,
        **{key: public[key] for key in ("ingress_node_id", "egress_node_id", "relay_node_id")},
    }
    await service().store.add_event(
        NewEvent(
            node_id=body.ingress_node_id,
            severity=EventSeverity.INFO,
            category="tunnel",
            message="Tunnel paired",
            details=details,
        )
    )
    _log.info(
        "tunnel %s paired: source %s, sink %s, relay %s",
        tunnel_id,
        body.ingress_node_id,
        body.egress_node_id,
        body.relay_node_id,
    )
    return json_response(public, 201)
