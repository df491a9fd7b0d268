"""The edge's NMOS node: its resources (one ``VersionTracker`` from boot, shared by the Node API,
the Connection API and the registrar), the host facts they need, and registration.

:class:`NmosNode` belongs to the ``EdgeService`` (``service.nmos``). :meth:`NmosNode.run` runs
beside the service: with ``nmos.enabled`` it keeps the node registered (``nmos.registry_url``
first, then the Registration APIs DNS-SD finds when no URL is given) and, while no registry is
known, advertises ``_nmos-node._tcp`` for peer-to-peer operation (IS-04 3.2). Without an
``nmos`` block the Node and Connection APIs are served and nothing is registered or advertised
(no multicast leaves the box unless asked for).
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import logging
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from appliance.models.config import OutputConfig
from appliance.models.stats import FlowState
from services.edge.nmos import connection as c
from services.edge.nmos.discovery import (
    DiscoveredService,
    MdnsBrowser,
    NodeAdvertiser,
    UnicastBrowser,
    registries_from_services,
)
from services.edge.nmos.model import HostInfo, Interface, NmosResources, Running, VersionTracker, build_resources
from services.edge.nmos.registrar import Registrar
from services.edge.nmos.registration import Resources

if TYPE_CHECKING:
    from services.edge.service import EdgeService

__all__ = ["Connections", "NmosNode", "host_addresses", "host_interfaces", "primary_address"]

SYS_NET: Final = Path("/sys/class/net")
PROC_INET6: Final = Path("/proc/net/if_inet6")
_SIOCGIFADDR: Final = 0x8915
_ARPHRD_LOOPBACK: Final = "772"
_IDLE_OUTPUT_STATES: Final = frozenset({"idle", "stopped", "failed", "error"})
_REGISTRATION_KINDS: Final = {
    "node": "self",
    "device": "devices",
    "source": "sources",
    "flow": "flows",
    "sender": "senders",
    "receiver": "receivers",
}
_LISTENING_WAIT_S: Final = 10.0
DISCOVERY_SETTLE_S: Final = 1.5
"""How long the first DNS-SD answers are gathered before a registry is chosen from them."""
_log = logging.getLogger("mediaplane.nmos")


# --------------------------------------------------------------------------- host facts (IO)


def host_interfaces(sys_net: Path = SYS_NET) -> tuple[Interface, ...]:
    """The host's interfaces with a MAC, by name, loopback left out (``/sys/class/net``)."""
    found = []
    try:
        names = sorted(entry.name for entry in sys_net.iterdir())
    except OSError:
        return ()
    for name in names:
        try:
            if (sys_net / name / "type").read_text().strip() == _ARPHRD_LOOPBACK:
                continue
            mac = (sys_net / name / "address").read_text().strip().lower()
        except OSError:
            continue
        if len(mac.split(":")) == 6:
            found.append(Interface(name, mac))
    return tuple(found)


def host_addresses(family: int = 4, proc_inet6: Path = PROC_INET6) -> list[str]:
    """The host's global addresses: IPv4 (one per interface, ``SIOCGIFADDR``) or IPv6
    (``/proc/net/if_inet6``, global scope), loopback and link-local left out."""
    found: list[str] = []
    if family == 6:
        try:
            lines = proc_inet6.read_text().splitlines()
        except OSError:
            return []
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and fields[3] == "00":  # scope: global
                found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = ipaddress.IPv4Address(packed[20:24])
            if not address.is_loopback and not address.is_link_local:
                found.append(str(address))
    return found


def primary_address(family: int = 4) -> str | None:
    """The local address of the default route (a UDP ``connect`` to a documentation address
    only looks the route up; nothing is sent), None without one."""
    target = ("2001:db8::1", 9) if family == 6 else ("192.0.2.1", 9)
    try:
        with socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            return str(probe.getsockname()[0])
    except OSError:
        return None


# --------------------------------------------------------------------------- the node
@dataclass
class Connections:
    """The IS-05 state of the edge, its activation lock and the scopes of pending activations."""

    state: c.ConnectionState = field(default_factory=c.ConnectionState)
    lock: trio.Lock = field(default_factory=trio.Lock)
    scopes: dict[str, trio.CancelScope] = field(default_factory=dict)
    # Senders being hot-swapped (remove, then add): the output shown meanwhile, so that the sender
    # does not vanish from the API between the two steps.
    swapping: dict[str, tuple[c.Endpoint, OutputConfig]] = field(default_factory=dict)


class NmosNode:
    """One edge's NMOS resources and registration (see the module docstring)."""

    def __init__(self, service: EdgeService) -> None:
        self._service = service
        self.tracker = VersionTracker(time.time_ns())  # at boot: every resource starts here
        self.connections = Connections()
        """The IS-05 staged/active state (the Connection API's; the IS-04 subscriptions read it)."""
        self.registrar: Registrar | None = None
        self.registries: list[str] = []
        """The Registration APIs in use, in priority order (static first, then DNS-SD's)."""

    def host_info(self) -> HostInfo:
        """Where this node's APIs answer: the listening address, or, listening on every
        address, the default route's (a stable href, so the node's version does not move with
        the client), with every global address of the host among the endpoints (a client finds
        the one it used there)."""
        service = self._service
        scheme, host, port = service.listening or ("http", *service.listen_at_start)
        try:
            wildcard = ipaddress.ip_address(host).is_unspecified
        except ValueError:
            wildcard = False
        others: tuple[str, ...] = ()
        if wildcard:
            families = (6, 4) if ":" in host else (4,)  # "::" is dual-stack
            host = primary_address(families[0]) or ("::1" if ":" in host else "127.0.0.1")
            others = tuple(address for family in families for address in host_addresses(family))
        return HostInfo(socket.gethostname(), host, int(port), host_interfaces(), protocol=scheme, other_hosts=others)

    def running(self) -> Running:
        snapshot = self._service.snapshot()
        flows = frozenset(f.flow_id for f in snapshot.flows if f.state is FlowState.RUNNING)
        outputs = frozenset(
            (f.flow_id, o.output_id)
            for f in snapshot.flows
            if f.flow_id in flows
            for o in f.outputs
            if o.state not in _IDLE_OUTPUT_STATES
        )
        # A parked endpoint (master_enable false) is subscribed to nothing (AMWA IS-05-02 test_08).
        peers = {
            endpoint_id: st.peer if st.master_enable else None
            for endpoint_id, st in self.connections.state.states.items()
        }
        return Running(flows, outputs, peers)

    def resources(self) -> NmosResources:
        """The IS-04 resources now, versions stamped."""
        service = self._service
        built = build_resources(service.config, self.running(), self.host_info(), version=service.version)
        return self.tracker.stamp(built, time.time_ns())

    def registration_resources(self) -> Resources:
        """The resources as the registration client takes them (``{type: {id: body}}``)."""
        by_kind = self.resources().by_kind
        return {kind: dict(by_kind.get(collection, {})) for kind, collection in _REGISTRATION_KINDS.items()}

    def changed(self) -> None:
        """The config or the running state changed: tell the registry now."""
        if self.registrar is not None:
            self.registrar.changed()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # nothing waits for registration (and the API starts after this)
        settings = self._service.config.nmos
        if settings is None or not settings.enabled:
            return
        # The API's address is known once it listens (main sets ``listening``; a port given on
        # the command line is not in the config): register with it, not with the config's.
        with trio.move_on_after(_LISTENING_WAIT_S):
            while self._service.listening is None:
                await trio.sleep(0.05)
        static = [settings.registry_url] if settings.registry_url else []
        self.registries = list(static)
        self.registrar = Registrar(self.registration_resources, static)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.registrar.run)
            if not static:
                await self._discover(nursery)

    async def _discover(self, nursery: trio.Nursery) -> None:
        """Browse (mDNS and unicast DNS-SD) and hand the registrar each new list, best first.

        The first list is handed over after ``DISCOVERY_SETTLE_S``: answers to the first query
        arrive over some tens of milliseconds (RFC 6762 6: responders wait 20-120 ms), and a
        node that took the first one heard would stay with it even when a better one answers a
        moment later (the registry in use is kept while it works). Until then, and whenever no
        registry is known, the node advertises itself for peer-to-peer use.
        """
        advertiser = _Advertising(self)
        by_source: dict[str, list[DiscoveredService]] = {"mdns": [], "unicast": []}
        settled = False

        def publish() -> None:
            self.registries = registries_from_services([*by_source["mdns"], *by_source["unicast"]])
            assert self.registrar is not None
            self.registrar.set_registries(self.registries)
            advertiser.update()

        def found(source: str, services: list[DiscoveredService]) -> None:
            by_source[source] = services
            if settled:
                publish()

        await nursery.start(MdnsBrowser(functools.partial(found, "mdns")).run)
        await nursery.start(UnicastBrowser(functools.partial(found, "unicast")).run)
        await trio.sleep(DISCOVERY_SETTLE_S)
        settled = True
        publish()
        nursery.start_soon(advertiser.keep)


class _Advertising:
    """Advertises ``_nmos-node._tcp`` while no Registration API is known (IS-04 3.2)."""

    def __init__(self, node: NmosNode) -> None:
        self._node = node
        self._changed = trio.Event()

    def update(self) -> None:
        self._changed.set()

    async def keep(self) -> None:
        while True:
            self._changed = trio.Event()
            if self._node.registries:
                await self._changed.wait()
                continue
            host = self._node.host_info()
            advertiser = NodeAdvertiser(
                name=f"mediaplane-{socket.gethostname()}", address=host.api_host, port=host.api_port
            )
            async with trio.open_nursery() as nursery:
                try:
                    await nursery.start(advertiser.run)
                except Exception as exc:  # mDNS unavailable here: the node still serves its APIs
                    _log.warning("NMOS: cannot advertise _nmos-node._tcp (%s)", type(exc).__name__)
                    nursery.cancel_scope.cancel()
                    await self._changed.wait()
                    continue
                await self._changed.wait()
                nursery.cancel_scope.cancel()
