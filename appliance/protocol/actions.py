"""Command actions: what the manager asks a node to do (interop.md 6 "Edge actions", "Relay actions").

A ``command`` frame carries ``{"command_id": "<uuid4>", "action": {"type": "<action>", ...args}}``.
Each action the interop document lists is one frozen model, tagged by ``type`` (a discriminated
union, :data:`KnownAction`). Two more shapes exist only on the receiving side, so that a node can
always answer a command it got (it holds a ``command_id``, so it owes a ``command_ack``):

- :class:`UnknownAction`: a ``type`` the protocol does not define, or one the node's role does not
  run (an edge asked to ``list_tunnels``). The node answers ``success:false`` with
  :attr:`UnknownAction.error`, ``"Unknown command: <type>"`` (interop.md 6 "Manager → node").
- :class:`InvalidAction`: a known ``type`` whose arguments do not validate. Its ``error`` names the
  JSON path and the problem, never a value.

Object arguments (``flow``, ``output``, ``tunnel``, ``config``) stay plain JSON objects here: the
manager relays an action verbatim (interop.md 13: "never normalised or default-filled"), and the
node validates them with the one model of each concept (``FlowConfig``, ``OutputConfig``...) in its
service layer, which words the errors exactly as its REST routes do (interop.md 6: "Other errors
reuse the REST error texts"). Their ``repr`` is hidden: flows and tunnels can hold secrets.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from appliance.protocol._wire import JsonObject, WireSecret, describe_validation_error

__all__ = [
    "ACTION_MODELS",
    "EDGE_ACTION_TYPES",
    "MUTATING_ACTION_TYPES",
    "RELAY_ACTION_TYPES",
    "AddOutput",
    "AnyAction",
    "AuthorizeTunnel",
    "CloseTunnel",
    "CloseUdpSession",
    "CreateFlow",
    "CreateTunnel",
    "DeleteFlow",
    "DeleteTunnel",
    "DeviceType",
    "DisconnectEdge",
    "GetConfig",
    "InvalidAction",
    "KnownAction",
    "ListEdges",
    "ListTunnels",
    "ListUdpSessions",
    "RemoveOutput",
    "RestartFlow",
    "RevokeTunnel",
    "RotateSecret",
    "StartFlow",
    "StopFlow",
    "UnknownAction",
    "UpdateConfig",
    "UpdateFlow",
    "action_types_for",
    "parse_action",
    "wire_action",
]


class DeviceType(StrEnum):
    """The two kinds of node (interop.md 7.2 ``device_type``)."""

    EDGE = "edge"
    RELAY = "relay"


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- shared
class GetConfig(_Action):
    """Answered by ``config_response`` (the config with secrets stripped), not ``command_ack``."""

    type: Literal["get_config"] = "get_config"


class RotateSecret(_Action):
    """The node stores ``new_secret`` and acks; the manager accepts both secrets until the ack."""

    type: Literal["rotate_secret"] = "rotate_secret"
    new_secret: WireSecret


# --------------------------------------------------------------------------- edge
class CreateFlow(_Action):
    type: Literal["create_flow"] = "create_flow"
    flow: JsonObject = Field(repr=False)


class UpdateFlow(_Action):
    type: Literal["update_flow"] = "update_flow"
    flow_id: str
    flow: JsonObject = Field(repr=False)


class DeleteFlow(_Action):
    type: Literal["delete_flow"] = "delete_flow"
    flow_id: str


class StartFlow(_Action):
    type: Literal["start_flow"] = "start_flow"
    flow_id: str


class StopFlow(_Action):
    type: Literal["stop_flow"] = "stop_flow"
    flow_id: str


class RestartFlow(_Action):
    type: Literal["restart_flow"] = "restart_flow"
    flow_id: str


class AddOutput(_Action):
    type: Literal["add_output"] = "add_output"
    flow_id: str
    output: JsonObject = Field(repr=False)


class RemoveOutput(_Action):
    type: Literal["remove_output"] = "remove_output"
    flow_id: str
    output_id: str


class CreateTunnel(_Action):
    type: Literal["create_tunnel"] = "create_tunnel"
    tunnel: JsonObject = Field(repr=False)


class DeleteTunnel(_Action):
    type: Literal["delete_tunnel"] = "delete_tunnel"
    tunnel_id: str


class UpdateConfig(_Action):
    """Diffed against the running config by the edge (interop.md 6 "Edge actions")."""

    type: Literal["update_config"] = "update_config"
    config: JsonObject = Field(repr=False)


# --------------------------------------------------------------------------- relay
class DisconnectEdge(_Action):
    type: Literal["disconnect_edge"] = "disconnect_edge"
    edge_id: str


class CloseTunnel(_Action):
    type: Literal["close_tunnel"] = "close_tunnel"
    tunnel_id: str


class CloseUdpSession(_Action):
    type: Literal["close_udp_session"] = "close_udp_session"
    tunnel_id: str


class ListTunnels(_Action):
    """``command_ack.data`` is ``{tunnels}`` in the relay's REST shape."""

    type: Literal["list_tunnels"] = "list_tunnels"


class ListEdges(_Action):
    """``command_ack.data`` is ``{edges}``."""

    type: Literal["list_edges"] = "list_edges"


class ListUdpSessions(_Action):
    """``command_ack.data`` is ``{sessions}``."""

    type: Literal["list_udp_sessions"] = "list_udp_sessions"


class AuthorizeTunnel(_Action):
    """Pre-registers the two bind tokens of a tunnel (relay interface, auth 5)."""

    type: Literal["authorize_tunnel"] = "authorize_tunnel"
    tunnel_id: str
    ingress_token: WireSecret
    egress_token: WireSecret


class RevokeTunnel(_Action):
    type: Literal["revoke_tunnel"] = "revoke_tunnel"
    tunnel_id: str


KnownAction = Annotated[
    GetConfig
    | RotateSecret
    | CreateFlow
    | UpdateFlow
    | DeleteFlow
    | StartFlow
    | StopFlow
    | RestartFlow
    | AddOutput
    | RemoveOutput
    | CreateTunnel
    | DeleteTunnel
    | UpdateConfig
    | DisconnectEdge
    | CloseTunnel
    | CloseUdpSession
    | ListTunnels
    | ListEdges
    | ListUdpSessions
    | AuthorizeTunnel
    | RevokeTunnel,
    Field(discriminator="type"),
]
"""Every action interop.md 6 defines, discriminated on ``type``."""

KNOWN_ACTION: Final[TypeAdapter[KnownAction]] = TypeAdapter(KnownAction)

ACTION_MODELS: Final[dict[str, type[_Action]]] = {
    str(model.model_fields["type"].default): model
    for model in (
        GetConfig,
        RotateSecret,
        CreateFlow,
        UpdateFlow,
        DeleteFlow,
        StartFlow,
        StopFlow,
        RestartFlow,
        AddOutput,
        RemoveOutput,
        CreateTunnel,
        DeleteTunnel,
        UpdateConfig,
        DisconnectEdge,
        CloseTunnel,
        CloseUdpSession,
        ListTunnels,
        ListEdges,
        ListUdpSessions,
        AuthorizeTunnel,
        RevokeTunnel,
    )
}
"""``type`` -> model: the dispatch table (style H4)."""

# interop.md 6 "Edge actions".
EDGE_ACTION_TYPES: Final = frozenset(
    {
        "get_config",
        "create_flow",
        "update_flow",
        "delete_flow",
        "start_flow",
        "stop_flow",
        "restart_flow",
        "add_output",
        "remove_output",
        "create_tunnel",
        "delete_tunnel",
        "update_config",
        "rotate_secret",
    }
)
# interop.md 6 "Relay actions".
RELAY_ACTION_TYPES: Final = frozenset(
    {
        "get_config",
        "disconnect_edge",
        "close_tunnel",
        "close_udp_session",
        "list_tunnels",
        "list_edges",
        "list_udp_sessions",
        "authorize_tunnel",
        "revoke_tunnel",
        "rotate_secret",
    }
)
# interop.md 6 "Config cache": after a successful *mutating* command the manager drops its cached
# config and re-sends get_config. Reads (get_config, list_*) do not change the node's config.
MUTATING_ACTION_TYPES: Final = frozenset(
    t for t in EDGE_ACTION_TYPES | RELAY_ACTION_TYPES if t != "get_config" and not t.startswith("list_")
)


def action_types_for(device_type: DeviceType) -> frozenset[str]:
    """The action types a device type runs (the manager answers 400 for others, interop.md 7.2)."""
    return EDGE_ACTION_TYPES if device_type is DeviceType.EDGE else RELAY_ACTION_TYPES


_TYPE_SHOWN_MAX: Final = 256  # an unknown type is echoed in the ack; bound what is echoed


@dataclass(frozen=True, slots=True)
class UnknownAction:
    """An action with a ``type`` the node does not run. Kept verbatim in ``raw``."""

    type: str
    raw: JsonObject = field(repr=False, compare=True)

    @property
    def error(self) -> str:
        """The ``command_ack`` error text (interop.md 6: ``Unknown command: <type>``)."""
        return f"Unknown command: {self.type[:_TYPE_SHOWN_MAX]}"


@dataclass(frozen=True, slots=True)
class InvalidAction:
    """A known action type whose arguments do not validate. Kept verbatim in ``raw``."""

    type: str
    problem: str
    """JSON paths and problems, without values (e.g. ``action.flow_id: Field required``)."""
    raw: JsonObject = field(repr=False, compare=True)

    @property
    def error(self) -> str:
        """The ``command_ack`` error text."""
        return f"Invalid command {self.type}: {self.problem}"


AnyAction = KnownAction | UnknownAction | InvalidAction
"""What a received ``command`` carries: a known action, or one the node must refuse."""


def parse_action(raw: object, *, supported: Collection[str] | None = None) -> AnyAction:
    """Turn a received ``action`` object into a model (a model given is returned as it is).

    ``supported`` (the receiving node's :func:`action_types_for`) maps a known type the node does
    not run to :class:`UnknownAction`. Raises ValueError (a safe text) only when ``raw`` is not an
    object with a string ``type``: without a type there is nothing to answer.
    """
    if isinstance(raw, UnknownAction | InvalidAction):
        return raw
    if isinstance(raw, _Action):  # already a model (the manager building a command)
        return KNOWN_ACTION.validate_python(raw)
    if not isinstance(raw, dict):
        raise ValueError("action must be an object")
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ValueError("action.type must be a string")
    model = ACTION_MODELS.get(kind)
    if model is None or (supported is not None and kind not in supported):
        return UnknownAction(type=kind, raw=raw)
    try:
        return KNOWN_ACTION.validate_python(raw)
    except ValidationError as exc:
        return InvalidAction(type=kind, problem=describe_validation_error(exc, "action", tags=ACTION_MODELS), raw=raw)


def wire_action(action: AnyAction) -> JsonObject:
    """The JSON object of an action, as sent (secrets revealed: this is the frame)."""
    if isinstance(action, UnknownAction | InvalidAction):
        return action.raw
    return action.model_dump(mode="json")
