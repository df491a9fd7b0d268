"""NMOS DNS-SD: the choice of Registration APIs from TXT records, and mDNS browsing for real
inside a network namespace the test makes (python-zeroconf on both ends of a veth pair)."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import textwrap

import pytest
import trio

from services.edge.nmos.discovery import DiscoveredService, MdnsBrowser, UnicastBrowser, registries_from_services
from tests.helpers.dns_server import DnsServer
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

            def on_change(services: list[DiscoveredService]) -> None:
                seen.append(registries_from_services(services))
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


# --------------------------------------------------------------------------- unicast DNS-SD

DOMAIN = "studio.example.test."


def unicast_records(port_a: int, port_b: int) -> dict[tuple[str, str], list[str]]:
    """Two registries (pri 20 and 5) and one that offers only https, in DOMAIN (RFC 6763 4, 6)."""
    ptr = f"_nmos-register._tcp.{DOMAIN}"
    return {
        (ptr, "PTR"): [f"reg-a.{ptr}", f"reg-b.{ptr}", f"reg-tls.{ptr}"],
        (f"reg-a.{ptr}", "SRV"): [f"0 0 {port_a} a.{DOMAIN}"],
        (f"reg-a.{ptr}", "TXT"): ['"api_proto=http" "api_ver=v1.2,v1.3" "pri=20"'],
        (f"reg-b.{ptr}", "SRV"): [f"0 0 {port_b} b.{DOMAIN}"],
        (f"reg-b.{ptr}", "TXT"): ['"api_proto=http" "api_ver=v1.3" "pri=5"'],
        (f"reg-tls.{ptr}", "SRV"): [f"0 0 443 a.{DOMAIN}"],
        (f"reg-tls.{ptr}", "TXT"): ['"api_proto=https" "api_ver=v1.3" "pri=0"'],
        (f"a.{DOMAIN}", "A"): ["192.0.2.10"],
        (f"b.{DOMAIN}", "A"): ["192.0.2.11"],
        (f"b.{DOMAIN}", "AAAA"): ["2001:db8::11"],
    }


async def test_unicast_dns_sd_finds_registries_through_a_real_dns_server() -> None:
    server = DnsServer(unicast_records(8235, 8236))
    seen: list[list[str]] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1")
        browser = UnicastBrowser(
            lambda services: seen.append(registries_from_services(services)),
            domains=[DOMAIN],
            nameservers=["127.0.0.1"],
            port=port,
            refresh_s=0.2,
        )
        assert browser.domains == ["studio.example.test"]
        await nursery.start(browser.run)
        with trio.fail_after(10):
            while not seen:
                await trio.sleep(0.02)
        assert seen[-1] == ["http://192.0.2.11:8236", "http://192.0.2.10:8235"]
        assert (f"_nmos-registration._tcp.{DOMAIN}", "PTR") in server.queries  # the pre-v1.3 name too

        # A registry withdrawn from the zone disappears at the next refresh; an unchanged answer
        # is not reported again.
        del server.records[(f"_nmos-register._tcp.{DOMAIN}", "PTR")]
        with trio.fail_after(10):
            while seen[-1] != []:
                await trio.sleep(0.02)
        reports, asked = len(seen), len(server.queries)
        with trio.fail_after(10):  # two more whole rounds (two PTR queries each) reach the server
            while len(server.queries) < asked + 4:
                await trio.sleep(0.02)
        assert len(seen) == reports
        nursery.cancel_scope.cancel()


async def test_unicast_dns_sd_without_an_answering_server_finds_nothing_and_does_not_fail() -> None:
    """A DNS server that is not there (a closed port): every lookup times out, the list is empty."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    browser = UnicastBrowser(
        lambda services: None, domains=[DOMAIN], nameservers=["127.0.0.1"], port=port, timeout_s=0.3
    )
    with trio.fail_after(10):
        assert await browser.browse() == []


def test_unicast_dns_sd_takes_the_search_domains_of_resolv_conf() -> None:
    """Without domains given, the browser searches resolv.conf's (none: it does not run)."""
    browser = UnicastBrowser(lambda services: None)
    assert all(not domain.endswith(".") and domain for domain in browser.domains)
