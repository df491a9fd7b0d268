"""The IS-04 v1.3 resources of the edge (interop.md 5), built from the config: sans-IO.

``build_resources(config, running, host)`` answers the node, its one device, and per flow a
source, a flow and a receiver (its input), per output a sender, as dicts keyed by id whose
bodies are exactly those of interop.md 5, without ``version``. ``VersionTracker`` adds the
``version`` of each body: the boot time for what exists at boot, then the time of the change
each time a body (version excluded) changes. The caller passes the clock, the running state
(``Running``) and the host facts (``HostInfo``); nothing here reads the system.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.models.config import AppConfig, FlowConfig, OutputConfig, RtpInput, RtpOutput, split_host_port
from appliance.models.kinds import input_kind, output_kind
from services.edge.nmos import ids
from services.edge.nmos.tai import format_tai, tai_ns

__all__ = [
    "KINDS",
    "HostInfo",
    "Interface",
    "NmosResources",
    "Running",
    "VersionTracker",
    "build_resources",
    "connection_base",
    "transportfile_href",
]

Body = dict[str, Any]
KINDS: Final = ("self", "devices", "sources", "flows", "senders", "receivers")
"""The resource collections; ``self`` holds the one node."""

MUX: Final = "urn:x-nmos:format:mux"
MP2T: Final = "video/MP2T"
NMOS_RTP_KIND: Final = "rtp"  # the output kind whose sender has a transport file (SDP)


@dataclass(frozen=True, slots=True)
class Interface:
    """A network interface of the host: its name and MAC (``aa:bb:...`` or ``aa-bb-...``)."""

    name: str
    mac: str


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What the model needs of the host: its name, where the API answers, its interfaces."""

    hostname: str
    api_host: str  # an IP literal or a host name, without brackets
    api_port: int
    interfaces: tuple[Interface, ...] = ()
    protocol: str = "http"
    other_hosts: tuple[str, ...] = ()  # more addresses the API answers on (a wildcard listener)
    address_interfaces: Mapping[str, str] = field(default_factory=dict)  # IP -> the interface holding it


@dataclass(frozen=True, slots=True)
class Running:
    """Which flows run (by flow id), which outputs are active (``(flow id, output id)``), and the
    IS-05 active peer of each sender and receiver (by NMOS id: a sender's ``receiver_id``, a
    receiver's ``sender_id``; missing means none)."""

    flows: frozenset[str] = frozenset()
    outputs: frozenset[tuple[str, str]] = frozenset()
    peers: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(slots=True)
class NmosResources:
    """The resources of each kind, keyed by id (``self`` holds the node under its id)."""

    node_id: str
    by_kind: dict[str, dict[str, Body]] = field(default_factory=dict)

    @property
    def node(self) -> Body:
        return self.by_kind["self"][self.node_id]

    def items(self) -> Iterator[tuple[str, str, Body]]:
        """``(kind, id, body)`` of every resource."""
        for kind in KINDS:
            for resource_id, body in self.by_kind.get(kind, {}).items():
                yield kind, resource_id, body


def _url_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _base(host: HostInfo) -> str:
    return f"{host.protocol}://{_url_host(host.api_host)}:{host.api_port}/"


def connection_base(host: HostInfo) -> str:
    """The IS-05 Connection API base URL (``.../x-nmos/connection/v1.1/``)."""
    return f"{_base(host)}x-nmos/connection/v1.1/"


def transportfile_href(host: HostInfo, sender_id: str) -> str:
    """The IS-05 ``transportfile/`` URL of a sender."""
    return f"{connection_base(host)}single/senders/{sender_id}/transportfile"


def _port_id(mac: str) -> str:
    return mac.strip().lower().replace(":", "-")


def _local_host(addr: str | None) -> str | None:
    if addr is None:
        return None
    try:
        return split_host_port(addr)[0]
    except ValueError:
        return None


def _input_leg_addresses(flow: FlowConfig) -> list[str | None]:
    """The local address of each leg of a flow's input (two with 2022-7 redundancy)."""
    source = flow.input
    if isinstance(source, RtpInput):
        legs: list[Any] = [source, *([source.redundancy] if source.redundancy is not None else [])]
        return [leg.interface_addr or _local_host(leg.bind_addr) for leg in legs]
    return [None]


def _output_leg_addresses(output: OutputConfig) -> list[str | None]:
    """The local address of each leg of an output (two with 2022-7 redundancy)."""
    if isinstance(output, RtpOutput):
        legs: list[Any] = [output, *([output.redundancy] if output.redundancy is not None else [])]
        return [leg.interface_addr or _local_host(leg.bind_addr) for leg in legs]
    return [None]


def _common(resource_id: str, label: str, description: str) -> Body:
    return {"id": resource_id, "label": label, "description": description, "tags": {}}


def build_resources(config: AppConfig, running: Running, host: HostInfo, *, version: str) -> NmosResources:
    """The IS-04 resources of ``config`` (bodies without ``version``; see ``VersionTracker``).

    ``version`` is the application version, for the node's description.
    """
    if config.node_id is None:
        raise ValueError("the config has no node_id (the store writes one at load)")
    node_uuid = config.node_id
    node_id = str(node_uuid)
    device_id = ids.device_id(node_uuid)
    nmos_label = config.nmos.label if config.nmos is not None else None
    label = nmos_label or config.device_name or host.hostname
    named = {iface.name for iface in host.interfaces}
    default = host.interfaces[0].name if host.interfaces else None

    def bindings(addresses: list[str | None]) -> list[str]:
        """One interface per leg (IS-05: ``interface_bindings`` has as many entries as
        ``transport_params``): the one holding the leg's local address, else the first."""
        found = []
        for address in addresses:
            name = host.address_interfaces.get(address or "")
            found.append(name if name in named else default)
        return [name for name in found if name is not None]

    base = _base(host)

    node: Body = {
        **_common(node_id, label, f"mediaplane-edge v{version}"),
        "href": base,
        "hostname": host.hostname,
        "caps": {},
        "api": {
            "versions": ["v1.3"],
            "endpoints": [
                {"host": api_host, "port": host.api_port, "protocol": host.protocol, "authorization": False}
                for api_host in dict.fromkeys((host.api_host, *host.other_hosts))
            ],
        },
        "services": [],
        "clocks": [{"name": "clk0", "ref_type": "internal"}],
        "interfaces": [
            {"chassis_id": None, "port_id": _port_id(iface.mac), "name": iface.name} for iface in host.interfaces
        ],
    }
    sources: dict[str, Body] = {}
    flows: dict[str, Body] = {}
    senders: dict[str, Body] = {}
    receivers: dict[str, Body] = {}
    for flow in config.flows:
        source_id = ids.source_id(node_uuid, flow.id)
        flow_id = ids.flow_id(node_uuid, flow.id)
        receiver_id = ids.receiver_id(node_uuid, flow.id)
        sources[source_id] = {
            **_common(source_id, flow.name, f"source of flow {flow.name}"),
            "format": MUX,
            "caps": {},
            "device_id": device_id,
            "parents": [],
            "clock_name": None,
        }
        flows[flow_id] = {
            **_common(flow_id, flow.name, f"MPEG-TS of flow {flow.name}"),
            "format": MUX,
            "media_type": MP2T,
            "source_id": source_id,
            "device_id": device_id,
            "parents": [],
        }
        receivers[receiver_id] = {
            **_common(receiver_id, flow.name, f"{flow.input.type} input of flow {flow.name}"),
            "format": MUX,
            "caps": {"media_types": [MP2T]},
            "transport": input_kind(flow.input.type).nmos_transport,
            "device_id": device_id,
            "interface_bindings": bindings(_input_leg_addresses(flow)),
            # IS-04 v1.3 receiver.json: the Sender it is configured for (IS-05 active sender_id) and
            # whether it is receiving (the flow runs; master_enable false stops it).
            "subscription": {"sender_id": running.peers.get(receiver_id), "active": flow.id in running.flows},
        }
        for output in flow.outputs:
            sender_id = ids.sender_id(node_uuid, flow.id, output.id)
            senders[sender_id] = {
                **_common(sender_id, output.name, f"{output.type} output of flow {flow.name}"),
                "flow_id": flow_id,
                "transport": output_kind(output.type).nmos_transport,
                "device_id": device_id,
                "manifest_href": transportfile_href(host, sender_id) if output.type == NMOS_RTP_KIND else None,
                "interface_bindings": bindings(_output_leg_addresses(output)),
                "caps": {},
                "subscription": {
                    "receiver_id": running.peers.get(sender_id),
                    "active": (flow.id, output.id) in running.outputs,
                },
            }
    device: Body = {
        **_common(device_id, label, "mediaplane-edge media device"),
        "type": "urn:x-nmos:device:generic",
        "node_id": node_id,
        "senders": list(senders),
        "receivers": list(receivers),
        "controls": [
            {"type": "urn:x-nmos:control:sr-ctrl/v1.1", "href": connection_base(host), "authorization": False}
        ],
    }
    return NmosResources(
        node_id,
        {
            "self": {node_id: node},
            "devices": {device_id: device},
            "sources": sources,
            "flows": flows,
            "senders": senders,
            "receivers": receivers,
        },
    )


class VersionTracker:
    """Keeps each resource's ``version``: the boot time for what exists at the first ``stamp``,
    then the TAI time of the ``stamp`` that first saw a new resource or a changed body.

    Resources are told apart by ``(kind, id)``; one that disappears is forgotten (it gets a new
    version if it comes back). The clock is the caller's (UTC nanoseconds).
    """

    def __init__(self, boot_utc_ns: int) -> None:
        self._boot = format_tai(tai_ns(boot_utc_ns))
        self._seen: dict[tuple[str, str], tuple[Body, str]] = {}
        self._first = True
        self._touched: set[tuple[str, str]] = set()

    def touch(self, kind: str, resource_id: str) -> None:
        """Give ``(kind, id)`` a new version at the next ``stamp`` even if its body is unchanged:
        an IS-05 activation is a change of the resource (AMWA IS-05-02 test_05/06), though a new
        destination port shows nowhere in the IS-04 body."""
        self._touched.add((kind, resource_id))

    def stamp(self, resources: NmosResources, now_utc_ns: int) -> NmosResources:
        """``resources`` with a ``version`` in every body (a copy; the input is left as it is)."""
        now = self._boot if self._first else format_tai(tai_ns(now_utc_ns))
        self._first = False
        seen: dict[tuple[str, str], tuple[Body, str]] = {}
        stamped: dict[str, dict[str, Body]] = {kind: {} for kind in KINDS}
        for kind, resource_id, body in resources.items():
            key = (kind, resource_id)
            previous = self._seen.get(key)
            unchanged = previous is not None and previous[0] == body and key not in self._touched
            version = previous[1] if unchanged and previous is not None else now
            seen[key] = (copy.deepcopy(body), version)
            stamped[kind][resource_id] = {**body, "version": version}
        self._seen = seen
        self._touched.clear()
        return NmosResources(resources.node_id, stamped)
