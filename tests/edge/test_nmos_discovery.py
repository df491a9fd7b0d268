"""NMOS DNS-SD: the choice of Registration APIs from TXT records, and mDNS browsing for real
inside a network namespace the test makes (python-zeroconf on both ends of a veth pair)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest
import trio

from services.edge.nmos.discovery import DiscoveredService, MdnsBrowser, registries_from_services
from tests.helpers.netns import netns_pair


def service(name: str, port: int, **txt: str) -> DiscoveredService:
    return DiscoveredService(name, ("192.0.2.1",), port, {"api_proto": "http", "api_ver": "v1.2,v1.3", **txt})


def test_priority_order_and_filters() -> None:
    found = registries_from_services(
        [
            service("late", 1, pri="50"),
            service("first", 2, pri="0"),
            service("https only", 3, pri="0", api_proto="https"),
            service("old only", 4, pri="0", api_ver="v1.0,v1.1"),
            DiscoveredService("no address", (), 5, {"pri": "0"}),
            service("no pri", 6),  # counted as 100
        ]
    )
    assert found == ["http://192.0.2.1:2", "http://192.0.2.1:1", "http://192.0.2.1:6"]


def test_equal_priorities_come_in_a_random_order() -> None:
    equal = [service(f"r{k}", k, pri="10") for k in range(1, 6)]
    orders = {tuple(registries_from_services(equal, random.Random(seed))) for seed in range(20)}
    assert len(orders) > 1  # spread over the cluster (IS-04 3.1)
    assert all(sorted(order) == sorted(next(iter(orders))) for order in orders)


ADVERTISE = textwrap.dedent(
    """
    import socket, sys, time
    from zeroconf import ServiceInfo, Zeroconf
    addr, port, pri = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    zc = Zeroconf(interfaces=[addr])
    info = ServiceInfo(
        "_nmos-register._tcp.local.", f"reg-{pri}._nmos-register._tcp.local.",
        addresses=[socket.inet_aton(addr)], port=port,
        properties={"api_proto": "http", "api_ver": "v1.3", "pri": pri}, server="reg.local.",
    )
    zc.register_service(info)
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.netns
async def test_mdns_finds_registries_in_priority_order_over_a_veth() -> None:
    with netns_pair("nmd") as net:
        advertisers = [
            subprocess.Popen(
                [*net.exec_prefix, sys.executable, "-c", ADVERTISE, net.ns_addr, str(port), pri],
                stdout=subprocess.PIPE,
                text=True,
            )
            for port, pri in ((8235, "20"), (8236, "5"))
        ]
        try:
            for advertiser in advertisers:
                assert advertiser.stdout is not None and advertiser.stdout.readline().strip() == "ready"
            seen: list[list[str]] = []
            changed = trio.Event()

            def on_change(urls: list[str]) -> None:
                seen.append(urls)
                changed.set()

            wanted = [f"http://{net.ns_addr}:8236", f"http://{net.ns_addr}:8235"]
            async with trio.open_nursery() as nursery:
                await nursery.start(MdnsBrowser(on_change, interfaces=[net.host_addr]).run)
                with trio.fail_after(20):
                    while not seen or seen[-1] != wanted:
                        changed = trio.Event()
                        await changed.wait()
                nursery.cancel_scope.cancel()
        finally:
            for advertiser in advertisers:
                advertiser.kill()
                advertiser.wait(5)
