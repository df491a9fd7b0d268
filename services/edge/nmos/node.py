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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

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
from services.edge.nmos.registrar import Registrar, registration_base
from services.edge.nmos.registration import Resources

if TYPE_CHECKING:
    from services.edge.service import EdgeService

__all__ = [
    "ADVERTISE_GRACE_S",
    "Connections",
    "NmosNode",
    "host_addresses",
    "host_interfaces",
    "primary_address",
    "registries_to_use",
]

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
ADVERTISE_GRACE_S: Final = 5.0
"""How long no registry must have been usable (registered with and heartbeating) before the node
advertises ``_nmos-node._tcp`` for peer-to-peer use. A registered node should not advertise
(IS-04 3.2; AMWA IS-04-01 test_12_01): a registry's DNS-SD records can vanish and come back
within moments (a registry restarting, re-advertised, or a switch to a new one), and a fail-over
takes a heartbeat to a timed-out registry (2 s) and a probe of the next one. Until this passes
without a usable registry, nothing is advertised; at boot it counts from the start of discovery."""
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


def host_address_interfaces(family: int = 4, proc_inet6: Path = PROC_INET6) -> dict[str, str]:
    """The host's global addresses and the interface holding each: IPv4 (one per interface,
    ``SIOCGIFADDR``) or IPv6 (``/proc/net/if_inet6``, global scope), loopback and link-local
    left out."""
    found: dict[str, str] = {}
    if family == 6:
        try:
            lines = proc_inet6.read_text().splitlines()
        except OSError:
            return {}
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and fields[3] == "00":  # scope: global
                found[str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))] = fields[5]
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = ipaddress.IPv4Address(packed[20:24])
            if not address.is_loopback and not address.is_link_local:
                found[str(address)] = name
    return found


def host_addresses(family: int = 4, proc_inet6: Path = PROC_INET6) -> list[str]:
    """The host's global addresses (see :func:`host_address_interfaces`)."""
    return list(host_address_interfaces(family, proc_inet6))


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


def registries_to_use(discovered: list[str], previous: list[str], registered_with: str | None) -> list[str]:
    """The Registration APIs to hand the registrar: ``discovered`` (best first), and the one in
    use (among ``previous``; ``registered_with`` is its API base) last while it still answers,
    even when its DNS-SD record went: losing an advert is no reason to leave a registry that
    works (the node stays registered there until it fails, then this drops it)."""
    if registered_with is None or any(registration_base(url) == registered_with for url in discovered):
        return list(discovered)
    held = [url for url in previous if registration_base(url) == registered_with]
    return [*discovered, *held[:1]]


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
        self._health_changed: Callable[[], None] | None = None  # set while discovering

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
        return HostInfo(
            socket.gethostname(),
            host,
            int(port),
            host_interfaces(),
            protocol=scheme,
            other_hosts=others,
            address_interfaces={**host_address_interfaces(4), **host_address_interfaces(6)},
        )

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

    def activated(self, role: str, endpoint_id: str) -> None:
        """An IS-05 activation was applied to a sender or receiver: its IS-04 version moves (even
        when its body does not) and the registry hears of it now."""
        self.tracker.touch("senders" if role == "sender" else "receivers", endpoint_id)
        self.changed()

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
        self.registrar = Registrar(self.registration_resources, static, on_health=self._on_health)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.registrar.run)
            if not static:
                await self._discover(nursery)

    def registered_with(self) -> str | None:
        """The Registration API (base URL) the node is registered with and heartbeating to."""
        return self.registrar.client.registered_with if self.registrar is not None else None

    def _on_health(self, registered_with: str | None) -> None:
        if self._health_changed is not None:
            self._health_changed()

    async def _discover(self, nursery: trio.Nursery) -> None:
        """Browse (mDNS and unicast DNS-SD) and hand the registrar each new list, best first.

        The first list is handed over after ``DISCOVERY_SETTLE_S``: answers to the first query
        arrive over some tens of milliseconds (RFC 6762 6: responders wait 20-120 ms), and a
        node that took the first one heard would stay with it even when a better one answers a
        moment later (the registry in use is kept while it works). The registry the node is
        registered with stays in the list while it answers, even once its DNS-SD record went
        (:func:`registries_to_use`). Once no registry has been usable for ``ADVERTISE_GRACE_S``
        (counted from now at boot), the node advertises itself for peer-to-peer use.
        """

        def advertise(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> Awaitable[None]:
            host = self.host_info()
            advertiser = NodeAdvertiser(
                name=f"mediaplane-{socket.gethostname()}", address=host.api_host, port=host.api_port
            )
            return advertiser.run(task_status=task_status)

        advertising = _Advertising(lambda: self.registered_with() is not None, advertise)
        by_source: dict[str, list[DiscoveredService]] = {"mdns": [], "unicast": []}
        settled = False

        def publish() -> None:
            discovered = registries_from_services([*by_source["mdns"], *by_source["unicast"]])
            self.registries = registries_to_use(discovered, self.registries, self.registered_with())
            assert self.registrar is not None
            self.registrar.set_registries(self.registries)
            advertising.update()

        def found(source: str, services: list[DiscoveredService]) -> None:
            by_source[source] = services
            if settled:
                publish()

        def health_changed() -> None:
            if settled:
                publish()  # a registry kept only while it answered is dropped once it fails
            advertising.update()

        self._health_changed = health_changed
        nursery.start_soon(advertising.keep)
        await nursery.start(MdnsBrowser(functools.partial(found, "mdns")).run)
        await nursery.start(UnicastBrowser(functools.partial(found, "unicast")).run)
        await trio.sleep(DISCOVERY_SETTLE_S)
        settled = True
        publish()


class _Advertiser(Protocol):
    def __call__(self, *, task_status: trio.TaskStatus[None] = ...) -> Awaitable[None]: ...


class _Advertising:
    """Advertises ``_nmos-node._tcp`` (IS-04 3.2) once no registry has been usable for
    ``grace_s`` (``usable()`` false all along), and withdraws it as soon as one is.

    ``advertise`` runs the advertisement (it reports started once advertised, and withdraws it
    when cancelled); :meth:`update` says ``usable()`` may have changed.
    """

    def __init__(self, usable: Callable[[], bool], advertise: _Advertiser, grace_s: float = ADVERTISE_GRACE_S) -> None:
        self._usable = usable
        self._advertise = advertise
        self._grace_s = grace_s
        self._changed = trio.Event()
        self.advertising = False

    def update(self) -> None:
        self._changed.set()

    async def _until(self, predicate: Callable[[], bool]) -> None:
        while True:
            self._changed = trio.Event()
            if predicate():
                return
            await self._changed.wait()

    def _unusable(self) -> bool:
        return not self._usable()

    async def keep(self) -> None:
        while True:
            await self._until(self._unusable)
            with trio.move_on_after(self._grace_s):
                await self._until(self._usable)
                continue  # a registry became usable within the grace period: nothing advertised
            async with trio.open_nursery() as nursery:
                try:
                    await nursery.start(self._advertise)
                except Exception as exc:  # mDNS unavailable here: the node still serves its APIs
                    _log.warning("NMOS: cannot advertise _nmos-node._tcp (%s)", type(exc).__name__)
                    nursery.cancel_scope.cancel()
                else:
                    self.advertising = True
                    try:
                        await self._until(self._usable)
                    finally:
                        self.advertising = False
                        nursery.cancel_scope.cancel()
            await self._until(self._usable)
