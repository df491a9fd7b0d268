"""NMOS DNS-SD over mDNS with python-zeroconf (IS-04 "Discovery": Registered and Peer to Peer).

- :func:`registries_from_services`: the pure part. Registration APIs (``_nmos-register._tcp``,
  and the pre-v1.3 name ``_nmos-registration._tcp``) whose TXT records offer ``api_proto=http``
  and ``api_ver`` with ``v1.3``, in priority order (``pri``: lower first; equal priorities in a
  random order, so that nodes spread over a cluster, IS-04 3.1).
- :class:`MdnsBrowser`: browses for them in python-zeroconf's own thread and hands each new
  list to trio (``trio.from_thread.run_sync`` with the trio token taken at start).
- :class:`NodeAdvertiser`: advertises ``_nmos-node._tcp`` (``api_proto``, ``api_ver``,
  ``api_auth``), for peer-to-peer operation when no registry is found (IS-04 3.2).

Unicast DNS-SD (a site DNS server's SRV/PTR records) is not done here: python-zeroconf speaks
mDNS only; a site without mDNS gives ``nmos.registry_url`` instead.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import trio

__all__ = [
    "NODE_SERVICE",
    "REGISTRATION_SERVICES",
    "DiscoveredService",
    "MdnsBrowser",
    "NodeAdvertiser",
    "registries_from_services",
]

REGISTRATION_SERVICES: Final = ("_nmos-register._tcp.local.", "_nmos-registration._tcp.local.")
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


class MdnsBrowser:
    """Browses for Registration APIs; ``on_change(urls)`` runs in trio with each new list."""

    def __init__(self, on_change: Callable[[list[str]], None], *, interfaces: list[str] | None = None) -> None:
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
            urls = registries_from_services(self._services.values())
        if self._token is not None:
            try:
                trio.from_thread.run_sync(self._on_change, urls, trio_token=self._token)
            except trio.RunFinishedError:
                pass


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
