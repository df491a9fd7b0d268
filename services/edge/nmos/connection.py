"""IS-05 v1.1 Connection API state and rules, sans-IO (interop.md 5 "IS-05 routes" to "PATCH staged").

The senders and receivers here are those of the kinds whose transport IS-05 v1.1 knows: ``rtp``
(``urn:x-nmos:transport:rtp``) and the WebRTC kinds (``websocket``). Raw UDP, SRT, RTMP, RTSP and
HLS carry a ``urn:x-mediaplane:transport:`` URN and are announced through IS-04 only (see
``appliance.models.kinds.vendor_transport`` and docs/nmos.md "Transports").

- ``sender_legs`` / ``receiver_legs``: the ``transport_params`` legs of an output or a flow input
  (one per leg, two with SMPTE 2022-7), mapped from the config by the table of interop.md 5;
- ``sender_constraints`` / ``receiver_constraints``: one object per leg naming every staged key;
  ``rtp`` is editable (ports ``{minimum, maximum}``), a websocket kind (WebRTC) is pinned by an
  ``enum`` of its current values, so a PATCH that changes one fails;
- ``merge_patch``: a PATCH body checked against the stage schema and the constraints, merged into
  the staged body; the problems are texts without the input's values;
- ``output_with_legs`` / ``flow_with_legs``: the activated legs written back into the config;
- ``sender_sdp``: the ``transportfile`` of an ``rtp`` sender (RFC 4566, RFC 7104 ``DUP`` for 2022-7);
- ``ConnectionState``: the staged and active bodies and the pending scheduled activations.

``rtp_enabled`` and ``master_enable`` are runtime facts, never written into the config.
"""

from __future__ import annotations

import copy
import ipaddress
import uuid
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from jsonschema import Draft4Validator
from pydantic import ValidationError

from appliance.models.config import (
    FlowConfig,
    OutputConfig,
    RtpInput,
    RtpOutput,
    split_host_port,
)
from appliance.models.kinds import IS05_TRANSPORTS, input_kind, output_kind
from services.edge.nmos import ids
from services.edge.nmos.schemas import IS05, problems
from services.edge.nmos.tai import format_tai, parse_tai

__all__ = [
    "ConnectionState",
    "Endpoint",
    "PatchRejected",
    "endpoints",
    "flow_with_legs",
    "merge_patch",
    "output_with_legs",
    "receiver_constraints",
    "receiver_legs",
    "sender_constraints",
    "sender_legs",
    "sender_sdp",
]

Role = Literal["sender", "receiver"]
Leg = dict[str, Any]
PORT: Final[dict[str, Any]] = {"minimum": 1, "maximum": 65535}
SOURCE_PORT: Final[dict[str, Any]] = {"minimum": 0, "maximum": 65535}  # 0: an ephemeral source port


class PatchRejected(ValueError):
    """A PATCH that fails the schema, the constraints or the config rules (HTTP 400)."""

    def __init__(self, texts: list[str]) -> None:
        super().__init__("; ".join(texts))
        self.texts = texts


# --------------------------------------------------------------------------- resources


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One IS-05 resource: a sender (an output) or a receiver (a flow's input)."""

    role: Role
    id: str
    flow_id: str
    output_id: str | None = None


def endpoints(node_id: uuid.UUID, flows: list[FlowConfig]) -> dict[str, Endpoint]:
    """Every sender and receiver of the config whose transport IS-05 v1.1 can connect (rtp and
    websocket; the other kinds are in IS-04 only, see ``vendor_transport``), by NMOS id
    (senders first, in config order)."""
    found: dict[str, Endpoint] = {}
    for flow in flows:
        for output in flow.outputs:
            if output_kind(output.type).nmos_transport in IS05_TRANSPORTS:
                sid = ids.sender_id(node_id, flow.id, output.id)
                found[sid] = Endpoint("sender", sid, flow.id, output.id)
    for flow in flows:
        if input_kind(flow.input.type).nmos_transport in IS05_TRANSPORTS:
            rid = ids.receiver_id(node_id, flow.id)
            found[rid] = Endpoint("receiver", rid, flow.id)
    return found


# --------------------------------------------------------------------------- config -> legs


def _host(addr: str) -> str:
    return split_host_port(addr)[0]


def _port(addr: str) -> int:
    return split_host_port(addr)[1]


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _any(host: str) -> str:
    return "::" if ":" in host else "0.0.0.0"


def _is_multicast(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_multicast
    except ValueError:
        return False


def _ws_uri(url: str | None) -> str | None:
    return url if url is not None and url.startswith(("ws://", "wss://")) else None


def _auth(config: Any) -> bool:
    return getattr(config, "bearer_token", None) is not None


def _rtp_sender_leg(dest_addr: str, bind_addr: str | None, interface_addr: str | None, enabled: bool) -> Leg:
    dest = _host(dest_addr)
    source = interface_addr or (_host(bind_addr) if bind_addr else _any(dest))
    return {
        "source_ip": source,
        "destination_ip": dest,
        "source_port": _port(bind_addr) if bind_addr else 0,
        "destination_port": _port(dest_addr),
        "rtp_enabled": enabled,
    }


def sender_legs(output: OutputConfig, enabled: bool) -> list[Leg]:
    """The ``transport_params`` of the sender of ``output``; ``enabled``: the output is sending."""
    if isinstance(output, RtpOutput):
        legs = [_rtp_sender_leg(output.dest_addr, output.bind_addr, output.interface_addr, enabled)]
        if output.redundancy is not None:
            red = output.redundancy
            legs.append(_rtp_sender_leg(red.dest_addr, red.bind_addr, red.interface_addr, enabled))
        return legs
    # webrtc (urn:x-nmos:transport:websocket): its WHIP/WHEP URL is http(s), which the schema's
    # connection_uri (ws:// or wss://) cannot carry, so connection_uri is null ("not configured").
    return [{"connection_uri": _ws_uri(getattr(output, "whip_url", None)), "connection_authorization": _auth(output)}]


def _rtp_receiver_leg(bind_addr: str, interface_addr: str | None, source: str | None, enabled: bool) -> Leg:
    host = _host(bind_addr)
    multicast = _is_multicast(host)
    return {
        "source_ip": source,
        "multicast_ip": host if multicast else None,
        "interface_ip": interface_addr or (_any(host) if multicast else host),
        "destination_port": _port(bind_addr),
        "rtp_enabled": enabled,
    }


def receiver_legs(flow: FlowConfig, enabled: bool) -> list[Leg]:
    """The ``transport_params`` of the receiver of ``flow``; ``enabled``: the flow is running."""
    source = flow.input
    if isinstance(source, RtpInput):
        allowed = source.allowed_sources
        first = allowed[0] if allowed else None
        legs = [_rtp_receiver_leg(source.bind_addr, source.interface_addr, first, enabled)]
        if source.redundancy is not None:
            red = source.redundancy
            legs.append(_rtp_receiver_leg(red.bind_addr, red.interface_addr, first, enabled))
        return legs
    # webrtc (a WHIP server) has no URL of its own; whep's is http(s): see sender_legs
    return [{"connection_uri": _ws_uri(getattr(source, "whep_url", None)), "connection_authorization": _auth(source)}]


# --------------------------------------------------------------------------- constraints


_AUTO_KEYS: Final = frozenset(
    {"source_ip", "destination_ip", "source_port", "destination_port", "interface_ip", "connection_uri"}
    | {"connection_authorization"}
)


def _pinned(legs: list[Leg]) -> list[dict[str, Any]]:
    """Every key of every leg pinned to its current value (``rtp_enabled`` stays free: it is runtime).

    Where the schema allows ``auto``, the enum takes it too: it resolves to the current value.
    """
    return [
        {
            key: {} if key == "rtp_enabled" else {"enum": [value, "auto"] if key in _AUTO_KEYS else [value]}
            for key, value in leg.items()
        }
        for leg in legs
    ]


def sender_constraints(output: OutputConfig) -> list[dict[str, Any]]:
    legs = sender_legs(output, True)
    if isinstance(output, RtpOutput):
        return [
            {
                "source_ip": {},
                "destination_ip": {},
                "source_port": SOURCE_PORT,
                "destination_port": PORT,
                "rtp_enabled": {},
            }
            for _ in legs
        ]
    return _pinned(legs)


def receiver_constraints(flow: FlowConfig) -> list[dict[str, Any]]:
    legs = receiver_legs(flow, True)
    if isinstance(flow.input, RtpInput):
        return [
            {"source_ip": {}, "multicast_ip": {}, "interface_ip": {}, "destination_port": PORT, "rtp_enabled": {}}
            for _ in legs
        ]
    return _pinned(legs)


# --------------------------------------------------------------------------- PATCH


def _constraint_problems(index: int, leg: Leg, constraints: dict[str, Any]) -> list[str]:
    found = []
    for key in leg:
        if key not in constraints:
            found.append(f"transport_params/{index}/{key}: not a parameter of this leg")
    schema = {"type": "object", "properties": constraints}
    for error in Draft4Validator(schema).iter_errors(leg):
        path = "/".join(str(part) for part in error.absolute_path)
        found.append(f"transport_params/{index}/{path}: constraint {error.validator} failed")
    return found


def _address_problems(index: int, leg: Leg) -> list[str]:
    """The ``*_ip`` values must be IP literals, ``auto`` or null (the schemas' ``format`` is not asserted)."""
    found = []
    for key, value in leg.items():
        if key.endswith("_ip") and isinstance(value, str) and value != "auto":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                found.append(f"transport_params/{index}/{key}: not an IP address")
    return found


def merge_patch(role: Role, staged: dict[str, Any], patch: Any, constraints: list[dict[str, Any]]) -> dict[str, Any]:
    """The staged body after ``patch`` (its ``activation`` kept as sent); PatchRejected if invalid."""
    texts = problems(IS05, f"{role}-stage-schema.json", patch)
    if texts:
        raise PatchRejected(texts)
    merged = copy.deepcopy(staged)
    for key in ("receiver_id", "sender_id", "master_enable"):
        if key in patch:
            merged[key] = patch[key]
    if "transport_file" in patch:
        tf = patch["transport_file"]
        if tf.get("data") is not None:
            raise PatchRejected(["transport_file: not supported; set transport_params instead"])
        merged["transport_file"] = {"data": None, "type": None}
    if "transport_params" in patch:
        legs = patch["transport_params"]
        if len(legs) != len(constraints):
            raise PatchRejected([f"transport_params: expected {len(constraints)} leg(s)"])
        found = []
        for index, (leg, limits) in enumerate(zip(legs, constraints, strict=True)):
            found += _constraint_problems(index, leg, limits)
            found += _address_problems(index, leg)
            merged["transport_params"][index].update(leg)
        if found:
            raise PatchRejected(found)
    return merged


def _resolve(leg: Leg, current: Leg) -> Leg:
    """``auto`` values take the current (active) value: the edge picks no address by itself."""
    return {key: (current.get(key, value) if value == "auto" else value) for key, value in leg.items()}


# --------------------------------------------------------------------------- legs -> config


def _with(model: Any, update: dict[str, Any]) -> Any:
    data = model.model_dump(mode="json", exclude_none=False)
    data.update(update)
    try:
        return type(model).model_validate(data)
    except ValidationError as exc:
        raise PatchRejected([f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]) from None


def _sender_update(leg: Leg, current: Leg, bind_addr: str | None, interface_addr: str | None) -> dict[str, Any]:
    update: dict[str, Any] = {"dest_addr": _join(leg["destination_ip"], int(leg["destination_port"]))}
    if (leg["source_ip"], leg["source_port"]) != (current["source_ip"], current["source_port"]):
        if interface_addr is not None:
            update["interface_addr"] = leg["source_ip"]
        if bind_addr is not None or leg["source_port"] != 0 or interface_addr is None:
            update["bind_addr"] = _join(leg["source_ip"], int(leg["source_port"]))
    return update


def output_with_legs(output: OutputConfig, legs: list[Leg]) -> OutputConfig:
    """``output`` with activated legs written in (interop.md 5 table); only rtp changes."""
    if not isinstance(output, RtpOutput):
        return output
    current = sender_legs(output, True)
    legs = [_resolve(leg, cur) for leg, cur in zip(legs, current, strict=True)]
    update = _sender_update(legs[0], current[0], output.bind_addr, output.interface_addr)
    if output.redundancy is not None:
        red = output.redundancy
        update["redundancy"] = _with(red, _sender_update(legs[1], current[1], red.bind_addr, red.interface_addr))
        update["redundancy"] = update["redundancy"].model_dump(mode="json")
    result: OutputConfig = _with(output, update)
    return result


def _receiver_update(leg: Leg, had_interface: bool) -> dict[str, Any]:
    port = int(leg["destination_port"])
    iface = leg["interface_ip"]
    if leg["multicast_ip"] is not None:
        unspecified = ipaddress.ip_address(iface).is_unspecified
        return {"bind_addr": _join(leg["multicast_ip"], port), "interface_addr": None if unspecified else iface}
    if had_interface:
        return {"bind_addr": _join(_any(iface), port), "interface_addr": iface}
    return {"bind_addr": _join(iface, port)}


def flow_with_legs(flow: FlowConfig, legs: list[Leg]) -> FlowConfig:
    """``flow`` with the activated receiver legs written into its input; only rtp changes."""
    source = flow.input
    if not isinstance(source, RtpInput):
        return flow
    current = receiver_legs(flow, True)
    legs = [_resolve(leg, cur) for leg, cur in zip(legs, current, strict=True)]
    if len(legs) > 1 and legs[1]["source_ip"] != legs[0]["source_ip"]:
        raise PatchRejected(["transport_params/1/source_ip: the source filter is shared by both legs"])
    update = _receiver_update(legs[0], source.interface_addr is not None)
    chosen = legs[0]["source_ip"]
    rest = [ip for ip in (source.allowed_sources or [])[1:] if ip != chosen]
    update["allowed_sources"] = None if chosen is None else [chosen, *rest]
    if source.redundancy is not None:
        red = source.redundancy
        update["redundancy"] = _with(red, _receiver_update(legs[1], red.interface_addr is not None)).model_dump(
            mode="json"
        )
    new_input = _with(source, update)
    result: FlowConfig = flow.model_copy(update={"input": new_input})
    return result


# --------------------------------------------------------------------------- SDP


def sender_sdp(output: RtpOutput, sender_id: str, session_version: int) -> str:
    """The SDP of an ``rtp`` sender: MP2T over RTP, one media section per leg (RFC 7104 DUP)."""
    legs = sender_legs(output, True)
    first = legs[0]
    family = "IP6" if ":" in first["destination_ip"] else "IP4"
    session_id = uuid.UUID(sender_id).int % 10**12
    lines = [
        "v=0",
        f"o=- {session_id} {session_version} IN {family} {first['source_ip']}",
        f"s={output.name}",
        "t=0 0",
    ]
    if len(legs) > 1:
        lines.append("a=group:DUP primary secondary")
    for index, leg in enumerate(legs):
        dest, src = leg["destination_ip"], leg["source_ip"]
        fam = "IP6" if ":" in dest else "IP4"
        multicast = _is_multicast(dest)
        lines.append(f"m=video {leg['destination_port']} RTP/AVP 33")
        lines.append(f"c=IN {fam} {dest}/32" if multicast and fam == "IP4" else f"c=IN {fam} {dest}")
        lines.append("a=rtpmap:33 MP2T/90000")
        if multicast and not ipaddress.ip_address(src).is_unspecified:
            lines.append(f"a=source-filter: incl IN {fam} {dest} {src}")
        if len(legs) > 1:
            lines.append(f"a=mid:{'primary' if index == 0 else 'secondary'}")
    return "\r\n".join(lines) + "\r\n"


# --------------------------------------------------------------------------- state


def _config_part(legs: list[Leg]) -> list[Leg]:
    return [{key: value for key, value in leg.items() if key != "rtp_enabled"} for leg in legs]


def idle_activation() -> dict[str, Any]:
    return {"mode": None, "requested_time": None, "activation_time": None}


@dataclass
class Pending:
    """A scheduled activation: the staged body to apply at ``due_tai_ns``."""

    due_tai_ns: int
    body: dict[str, Any]


@dataclass
class EndpointState:
    staged: dict[str, Any] | None = None  # None: equal to active (nothing staged yet)
    base: list[Leg] | None = None  # the active legs when ``staged`` was made (rtp_enabled left out)
    master_enable: bool = True
    peer: str | None = None  # receiver_id of a sender, sender_id of a receiver (active)
    activation: dict[str, Any] = field(default_factory=idle_activation)  # of the last activation
    pending: Pending | None = None
    applying: dict[str, Any] | None = None  # a scheduled activation due now, while it is applied


@dataclass
class ConnectionState:
    """The staged and active state of every sender and receiver, by NMOS id."""

    states: dict[str, EndpointState] = field(default_factory=dict)

    def of(self, endpoint_id: str) -> EndpointState:
        return self.states.setdefault(endpoint_id, EndpointState())

    def active_body(self, endpoint: Endpoint, legs: list[Leg]) -> dict[str, Any]:
        """``active``: the last activation over ``legs`` (the config's). While a scheduled
        activation is being applied (a flow restarting takes tens of milliseconds), its values
        show already: they are active from the activation time on (IS-05 "Activation"; AMWA
        IS-05-01 test_27/28 read ``active`` right at that time)."""
        state = self.of(endpoint.id)
        peer_key = "receiver_id" if endpoint.role == "sender" else "sender_id"
        applying = state.applying
        if applying is not None:
            legs = [_resolve(leg, cur) for leg, cur in zip(applying["transport_params"], legs, strict=False)]
        body: dict[str, Any] = {
            peer_key: applying.get(peer_key) if applying is not None else state.peer,
            "master_enable": bool(applying.get("master_enable", True)) if applying is not None else state.master_enable,
            "activation": dict(applying["activation"] if applying is not None else state.activation),
            "transport_params": copy.deepcopy(legs),
        }
        if endpoint.role == "receiver":
            body["transport_file"] = {"data": None, "type": None}
        return body

    def staged_body(self, endpoint: Endpoint, legs: list[Leg]) -> dict[str, Any]:
        state = self.of(endpoint.id)
        if state.staged is None or (state.pending is None and state.base != _config_part(legs)):
            # Nothing staged yet, or the config changed from outside (REST API, manager): start again from it.
            body = self.active_body(endpoint, legs)
            body["activation"] = idle_activation()
            state.staged, state.base = body, _config_part(legs)
        body = copy.deepcopy(state.staged)
        if state.pending is not None:
            body["activation"] = copy.deepcopy(state.pending.body["activation"])
        return body

    def stage(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        staged = copy.deepcopy(body)
        staged["activation"] = idle_activation()
        self.of(endpoint.id).staged = staged

    def rebase(self, endpoint: Endpoint, legs: list[Leg]) -> None:
        """After an activation: the staged body stays as activated, measured against the new active legs."""
        self.of(endpoint.id).base = _config_part(legs)

    def activated(self, endpoint: Endpoint, body: dict[str, Any], activation: dict[str, Any]) -> None:
        """Record an applied activation: ``active`` shows its peer, master_enable and times."""
        state = self.of(endpoint.id)
        state.peer = body.get("receiver_id" if endpoint.role == "sender" else "sender_id")
        state.master_enable = bool(body.get("master_enable", True))
        state.activation = dict(activation)
        state.pending = None
        self.stage(endpoint, body)

    def forget_unknown(self, known: set[str]) -> None:
        for endpoint_id in list(self.states):
            if endpoint_id not in known:
                del self.states[endpoint_id]


def activation_times(mode: str, requested: str | None, now_tai_ns: int) -> tuple[int, dict[str, Any]]:
    """The due TAI time and the activation object of a PATCH answer for ``mode``."""

    if mode == "activate_immediate":
        return now_tai_ns, {"mode": mode, "requested_time": None, "activation_time": format_tai(now_tai_ns)}
    if requested is None:
        raise PatchRejected(["activation/requested_time: required for a scheduled activation"])
    try:
        value = parse_tai(requested)
    except ValueError as exc:
        raise PatchRejected([f"activation/requested_time: {exc}"]) from None
    due = value if mode == "activate_scheduled_absolute" else now_tai_ns + value
    return due, {"mode": mode, "requested_time": requested, "activation_time": format_tai(due)}
