"""NMOS DNS-SD (IS-04 "Discovery": Registered and Peer to Peer): mDNS with python-zeroconf and
unicast DNS-SD (RFC 6763 over the site's DNS) with dnspython.

- :func:`registries_from_services`: the pure part. Registration APIs (``_nmos-register._tcp``,
  and the pre-v1.3 name ``_nmos-registration._tcp``) whose TXT records offer ``api_proto=http``
  and ``api_ver`` with ``v1.3``, in priority order (``pri``: lower first; equal priorities in a
  random order, so that nodes spread over a cluster, IS-04 3.1).
- :class:`MdnsBrowser`: browses for them in python-zeroconf's own thread and hands each new
  list of services to trio (``trio.from_thread.run_sync`` with the trio token taken at start).
- :class:`UnicastBrowser`: asks the DNS servers of ``/etc/resolv.conf`` (or given ones) for the
  same services in the search domains (PTR, then SRV, TXT and A/AAAA per instance, RFC 6763 4
  and 6), natively in trio (dnspython's trio backend), again every ``refresh_s``.
- :class:`NodeAdvertiser`: advertises ``_nmos-node._tcp`` (``api_proto``, ``api_ver``,
  ``api_auth``), for peer-to-peer operation when no registry is found (IS-04 3.2).
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import dns.asyncresolver
import dns.exception
import dns.name
import dns.resolver
import trio

__all__ = [
    "NODE_SERVICE",
    "REGISTRATION_SERVICES",
    "DiscoveredService",
    "MdnsBrowser",
    "NodeAdvertiser",
    "UnicastBrowser",
    "registries_from_services",
]

REGISTRATION_TYPES: Final = ("_nmos-register._tcp", "_nmos-registration._tcp")
REGISTRATION_SERVICES: Final = tuple(f"{kind}.local." for kind in REGISTRATION_TYPES)
NODE_SERVICE: Final = "_nmos-node._tcp.local."
_log = logging.getLogger("mediaplane.nmos")


@dataclass(frozen=True, slots=True)
class DiscoveredService:
    """One resolved DNS-SD service: its addresses, port and TXT record."""

    name: str
    addresses: tuple[str, ...]
    port: int
    txt: dict[str, str]


def _priority(service: DiscoveredService) -> int:
    try:
        return int(service.txt.get("pri", "100"))
    except ValueError:
        return 100


def registries_from_services(services: Iterable[DiscoveredService], rng: random.Random | None = None) -> list[str]:
    """Registration API base URLs (``http://addr:port``) that offer HTTP and v1.3, best first."""
    rng = rng or random.Random()
    usable = [
        s
        for s in services
        if s.addresses
        and s.txt.get("api_proto", "http") == "http"
        and "v1.3" in s.txt.get("api_ver", "v1.3").split(",")
    ]
    rng.shuffle(usable)  # equal priorities in a random order (a stable sort keeps the shuffle)
    usable.sort(key=_priority)
    urls = []
    for service in usable:
        address = service.addresses[0]
        host = f"[{address}]" if ":" in address else address
        urls.append(f"http://{host}:{service.port}")
    return list(dict.fromkeys(urls))


def _txt(properties: dict[bytes, bytes | None]) -> dict[str, str]:
    return {key.decode(errors="replace"): (value or b"").decode(errors="replace") for key, value in properties.items()}


OnChange = Callable[[list["DiscoveredService"]], None]


class MdnsBrowser:
    """Browses for Registration APIs; ``on_change(services)`` runs in trio with each new list."""

    def __init__(self, on_change: OnChange, *, interfaces: list[str] | None = None) -> None:
        self._on_change = on_change
        self._interfaces = interfaces
        self._services: dict[str, DiscoveredService] = {}
        self._lock = threading.Lock()
        self._token: trio.lowlevel.TrioToken | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from zeroconf import InterfaceChoice, ServiceBrowser, ServiceStateChange, Zeroconf

        self._token = trio.lowlevel.current_trio_token()
        zc = await trio.to_thread.run_sync(lambda: Zeroconf(interfaces=self._interfaces or InterfaceChoice.All))

        def handler(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
            # Called in zeroconf's thread: resolve there (it blocks), then tell trio.
            if state_change is ServiceStateChange.Removed:
                with self._lock:
                    self._services.pop(name, None)
            else:
                info = zeroconf.get_service_info(service_type, name, timeout=2000)
                if info is None:
                    return
                found = DiscoveredService(
                    name, tuple(info.parsed_addresses()), int(info.port or 0), _txt(info.properties)
                )
                with self._lock:
                    self._services[name] = found
            self._publish()

        browser = ServiceBrowser(zc, list(REGISTRATION_SERVICES), handlers=[handler])
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(browser.cancel)
                await trio.to_thread.run_sync(zc.close)

    def _publish(self) -> None:
        with self._lock:
            services = list(self._services.values())
        if self._token is not None:
            try:
                trio.from_thread.run_sync(self._on_change, services, trio_token=self._token)
            except trio.RunFinishedError:
                pass


class UnicastBrowser:
    """Unicast DNS-SD for Registration APIs (IS-04 "Discovery"; RFC 6763 over ordinary DNS).

    In each search domain (``domains``, else those of ``/etc/resolv.conf``: ``search`` and
    ``domain``) it asks for ``_nmos-register._tcp.<domain>`` PTR records, then each instance's
    SRV (host and port), TXT (``api_proto``, ``api_ver``, ``pri``) and the host's A/AAAA, and
    calls ``on_change(services)`` whenever the answer differs from the last one. It asks again
    every ``refresh_s``. A domain that does not answer (NXDOMAIN, timeout, no server) counts as
    having no registry; nothing here raises.
    """

    def __init__(
        self,
        on_change: OnChange,
        *,
        domains: list[str] | None = None,
        nameservers: list[str] | None = None,
        port: int = 53,
        refresh_s: float = 30.0,
        timeout_s: float = 3.0,
    ) -> None:
        self._on_change = on_change
        self._resolver = dns.asyncresolver.Resolver(configure=nameservers is None)
        if nameservers is not None:
            self._resolver.nameservers = list(nameservers)
        self._resolver.port = port
        self._resolver.lifetime = timeout_s
        if domains is not None:
            self._domains = [dns.name.from_text(domain) for domain in domains]
        else:
            configured = [*self._resolver.search, self._resolver.domain]
            self._domains = [name for name in dict.fromkeys(configured) if name != dns.name.root]
        self._refresh_s = refresh_s
        self._last: list[DiscoveredService] | None = None

    @property
    def domains(self) -> list[str]:
        """The domains searched (without the trailing dot)."""
        return [name.to_text(omit_final_dot=True) for name in self._domains]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self._domains:
            return  # no search domain: unicast DNS-SD has nowhere to look
        while True:
            services = await self.browse()
            if services != self._last:
                self._last = services
                self._on_change(services)
            await trio.sleep(self._refresh_s)

    async def browse(self) -> list[DiscoveredService]:
        """One round over every domain and registration service type."""
        found: list[DiscoveredService] = []
        for domain in self._domains:
            for kind in REGISTRATION_TYPES:
                for instance in await self._records(dns.name.from_text(kind, origin=domain), "PTR"):
                    service = await self._service(instance.target)
                    if service is not None:
                        found.append(service)
        return found

    async def _records(self, qname: dns.name.Name | str, rdtype: str) -> list[Any]:
        try:
            answer = await self._resolver.resolve(qname, rdtype, search=False, raise_on_no_answer=False)
        except (dns.exception.DNSException, OSError) as exc:
            _log.debug("NMOS unicast DNS-SD: %s %s: %s", qname, rdtype, type(exc).__name__)
            return []
        return list(answer.rrset) if answer.rrset is not None else []

    async def _service(self, instance: dns.name.Name) -> DiscoveredService | None:
        srv = await self._records(instance, "SRV")
        if not srv:
            return None
        record = min(srv, key=lambda r: (r.priority, -r.weight))  # RFC 2782: lowest priority first
        txt: dict[str, str] = {}
        for rdata in await self._records(instance, "TXT"):
            for item in rdata.strings:  # RFC 6763 6.3: key=value, a key alone means present
                key, _, value = item.decode(errors="replace").partition("=")
                txt.setdefault(key.lower(), value)
        addresses: list[str] = []
        for rdtype in ("A", "AAAA"):
            addresses += [rdata.address for rdata in await self._records(record.target, rdtype)]
        return DiscoveredService(instance.to_text(), tuple(addresses), int(record.port), txt)


class NodeAdvertiser:
    """Advertises this node's Node API as ``_nmos-node._tcp`` while :meth:`run` runs."""

    def __init__(self, *, name: str, address: str, port: int, interfaces: list[str] | None = None) -> None:
        self._name = name
        self._address = address
        self._port = port
        self._interfaces = interfaces

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from zeroconf import InterfaceChoice, ServiceInfo, Zeroconf

        info = ServiceInfo(
            NODE_SERVICE,
            f"{self._name}.{NODE_SERVICE}",
            addresses=[socket.inet_pton(socket.AF_INET6 if ":" in self._address else socket.AF_INET, self._address)],
            port=self._port,
            properties={"api_proto": "http", "api_ver": "v1.3", "api_auth": "false"},
            server=f"{socket.gethostname()}.local.",
        )
        zc = await trio.to_thread.run_sync(lambda: Zeroconf(interfaces=self._interfaces or InterfaceChoice.All))
        try:
            await trio.to_thread.run_sync(zc.register_service, info)
            task_status.started()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(zc.unregister_service, info)
                await trio.to_thread.run_sync(zc.close)
