"""NMOS on a real mp-edge inside a network namespace the test makes (tests/helpers/netns.py):

- a controller moves a SMPTE 2022-7 receiver to new multicast groups (both legs, immediately and
  scheduled) and a 2022-7 sender to new destinations (both legs, scheduled), and real RTP
  arrives at the new addresses and no longer at the old ones;
- the edge finds two Registration APIs by mDNS (``_nmos-register._tcp`` advertised on the
  host's end of the veth), registers with the better one (``pri``), and fails over to the other
  when the first dies.

Skips only where namespaces are impossible (see tests/helpers/netns.py).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from zeroconf import ServiceInfo, Zeroconf

from services.edge.nmos.schemas import IS05, problems
from tests.helpers.edge import free_udp_port, wait_for
from tests.helpers.media import UdpSink, rtp_stream
from tests.helpers.netns import Net, NsEdge, edge_in_netns, ip, netns_pair, send_multicast
from tests.helpers.nmos_registry import NmosRegistry, run_registry

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

V = "/x-nmos/connection/v1.1"
PORT_1, PORT_2 = 5000, 5002  # the two legs' ports (each leg its own group too)


def api_get(edge: NsEdge, path: str, schema: str | None = None) -> Any:
    body = edge.get(path)
    if schema is not None:
        assert problems(IS05, schema, body) == [], path
    return body


def joined(net: Net) -> str:
    return ip("-n", net.name, "maddr", "show", "dev", net.ns_if).stdout


def delivered(sink: UdpSink, group: str, port: int, net: Net, *, first_seq: int) -> int:
    """Send 50 packets to ``group:port`` from the host side; how many reached ``sink`` (awaited)."""
    before = len(sink.datagrams)
    send_multicast(group, port, rtp_stream(50, first_seq=first_seq), net.host_addr)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: len(sink.datagrams) >= before + 50, timeout=5)
    return len(sink.datagrams) - before


def test_a_controller_moves_both_2022_7_legs_of_a_receiver_and_a_sender(tmp_path: Path) -> None:
    with netns_pair("nmc") as net:
        out = [free_udp_port() for _ in range(4)]
        config = {
            "version": 1,
            "setup_enabled": False,
            "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
            "flows": [
                {
                    "id": "cam",
                    "name": "Camera",
                    "input": {
                        "type": "rtp",
                        "bind_addr": f"239.10.0.1:{PORT_1}",
                        "interface_addr": net.ns_addr,
                        "redundancy": {"bind_addr": f"239.10.1.1:{PORT_2}", "interface_addr": net.ns_addr},
                    },
                    "outputs": [
                        {
                            "type": "rtp",
                            "id": "pgm",
                            "name": "Programme",
                            "dest_addr": f"{net.host_addr}:{out[0]}",
                            "redundancy": {"dest_addr": f"{net.host_addr}:{out[1]}"},
                        }
                    ],
                }
            ],
        }
        with contextlib.ExitStack() as stack:
            sinks = [stack.enter_context(UdpSink(port, host=net.host_addr)) for port in out]
            edge = stack.enter_context(edge_in_netns(net, tmp_path / "edge", config))
            sender = f"{V}/single/senders/{api_get(edge, f'{V}/single/senders/')[0]}"
            receiver = f"{V}/single/receivers/{api_get(edge, f'{V}/single/receivers/')[0]}"
            legs = api_get(edge, f"{receiver}active", "receiver-response-schema.json")["transport_params"]
            assert [leg["multicast_ip"] for leg in legs] == ["239.10.0.1", "239.10.1.1"]
            wait_for(lambda: "239.10.0.1" in joined(net) and "239.10.1.1" in joined(net), timeout=10)

            # ---- media on either leg reaches both sender legs
            assert delivered(sinks[0], "239.10.0.1", PORT_1, net, first_seq=0) == 50
            assert delivered(sinks[1], "239.10.1.1", PORT_2, net, first_seq=100) == 50
            assert len(sinks[1].datagrams) == 100  # leg 1's packets went out on both legs too

            # ---- the receiver's two legs move to new groups at once
            with httpx.Client(base_url=edge.url, timeout=10, trust_env=False) as api:
                answer = api.patch(
                    f"{receiver}staged",
                    json={
                        "transport_params": [{"multicast_ip": "239.10.0.2"}, {"multicast_ip": "239.10.1.2"}],
                        "activation": {"mode": "activate_immediate"},
                    },
                )
                assert answer.status_code == 200, answer.text
                assert problems(IS05, "receiver-response-schema.json", answer.json()) == []
            legs = api_get(edge, f"{receiver}active")["transport_params"]
            assert [leg["multicast_ip"] for leg in legs] == ["239.10.0.2", "239.10.1.2"]
            wait_for(lambda: "239.10.0.2" in joined(net) and "239.10.1.2" in joined(net), timeout=10)
            wait_for(lambda: "239.10.0.1" not in joined(net) and "239.10.1.1" not in joined(net), timeout=10)
            before = len(sinks[0].datagrams)
            # The old group first, then the new one on the same path: once the new packets are
            # through, the old ones would have been too; only the new ones arrive.
            send_multicast("239.10.0.1", PORT_1, rtp_stream(50, first_seq=200), net.host_addr)
            assert delivered(sinks[0], "239.10.1.2", PORT_2, net, first_seq=300) == 50
            assert len(sinks[0].datagrams) - before == 50
            assert delivered(sinks[0], "239.10.0.2", PORT_1, net, first_seq=400) == 50  # leg 1 moved too

            # ---- the sender's two legs move to new ports, scheduled 0.5 s ahead (relative)
            with httpx.Client(base_url=edge.url, timeout=10, trust_env=False) as api:
                answer = api.patch(
                    f"{sender}staged",
                    json={
                        "transport_params": [{"destination_port": out[2]}, {"destination_port": out[3]}],
                        "activation": {"mode": "activate_scheduled_relative", "requested_time": "0:500000000"},
                    },
                )
                assert answer.status_code == 202, answer.text
            wait_for(
                lambda: (
                    [leg["destination_port"] for leg in api_get(edge, f"{sender}active")["transport_params"]] == out[2:]
                ),
                timeout=10,
            )
            sdp = httpx.get(f"{edge.url}{sender}transportfile", timeout=5, trust_env=False).text
            assert f"m=video {out[2]} RTP/AVP 33" in sdp and f"m=video {out[3]} RTP/AVP 33" in sdp
            assert "a=group:DUP" in sdp  # RFC 7104: the two legs are duplicates
            old = [len(sinks[0].datagrams), len(sinks[1].datagrams)]
            assert delivered(sinks[2], "239.10.0.2", PORT_1, net, first_seq=500) == 50
            wait_for(lambda: len(sinks[3].datagrams) == 50, timeout=5)
            assert [len(sinks[0].datagrams), len(sinks[1].datagrams)] == old  # nothing more at the old ports

            # ---- the receiver moves again at an absolute TAI time (UTC + 37 s), 1 s ahead
            due = time.time_ns() + 37 * 10**9 + 10**9
            with httpx.Client(base_url=edge.url, timeout=10, trust_env=False) as api:
                answer = api.patch(
                    f"{receiver}staged",
                    json={
                        "transport_params": [{"multicast_ip": "239.10.0.3"}, {"multicast_ip": "239.10.1.3"}],
                        "activation": {
                            "mode": "activate_scheduled_absolute",
                            "requested_time": f"{due // 10**9}:{due % 10**9}",
                        },
                    },
                )
                assert answer.status_code == 202, answer.text
            assert "239.10.0.2" in joined(net)  # not yet
            wait_for(lambda: "239.10.0.3" in joined(net) and "239.10.1.3" in joined(net), timeout=10)
            assert api_get(edge, f"{receiver}active")["activation"]["mode"] == "activate_scheduled_absolute"
            assert delivered(sinks[3], "239.10.1.3", PORT_2, net, first_seq=600) == 50
            assert edge.stop() == 0, edge.log()


# --------------------------------------------------------------------------- registries by mDNS


def advertise_registry(address: str, port: int, pri: int) -> Zeroconf:
    """``_nmos-register._tcp`` for a registry at ``address:port`` on that address's interface only."""
    zc = Zeroconf(interfaces=[address])
    zc.register_service(
        ServiceInfo(
            "_nmos-register._tcp.local.",
            f"registry-{pri}._nmos-register._tcp.local.",
            addresses=[socket.inet_aton(address)],
            port=port,
            properties={"api_proto": "http", "api_ver": "v1.2,v1.3", "pri": str(pri)},
            server=f"registry-{pri}.local.",
        )
    )
    return zc


async def test_the_edge_finds_registries_by_mdns_and_fails_over(tmp_path: Path) -> None:
    with netns_pair("nmr") as net:
        first, second = NmosRegistry(), NmosRegistry()
        adverts: list[Zeroconf] = []
        stack = contextlib.ExitStack()
        try:
            async with trio.open_nursery() as nursery:
                first_scope = trio.CancelScope()

                async def run_first(task_status: trio.TaskStatus[NmosRegistry] = trio.TASK_STATUS_IGNORED) -> None:
                    with first_scope:
                        await run_registry(first, host=net.host_addr, task_status=task_status)

                await nursery.start(run_first)
                await nursery.start(functools.partial(run_registry, second, host=net.host_addr))
                for registry, pri in ((first, 10), (second, 20)):
                    port = int(registry.url.rsplit(":", 1)[1])
                    adverts.append(await trio.to_thread.run_sync(advertise_registry, net.host_addr, port, pri))
                config = {
                    "version": 1,
                    "setup_enabled": False,
                    "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
                    "nmos": {"enabled": True, "label": "found by mDNS"},
                    "flows": [
                        {
                            "id": "cam",
                            "name": "Camera",
                            "input": {"type": "rtp", "bind_addr": f"{net.ns_addr}:{PORT_1}"},
                            "outputs": [
                                {"type": "rtp", "id": "pgm", "name": "Pgm", "dest_addr": f"{net.host_addr}:{PORT_2}"}
                            ],
                        }
                    ],
                }
                edge = await trio.to_thread.run_sync(stack.enter_context, edge_in_netns(net, tmp_path / "edge", config))

                # The better registry (pri 10) gets everything; the other one nothing.
                await first.wait_for(lambda: len(first.of_type("receiver")) == 1, timeout=30)
                await first.wait_for(lambda: first.heartbeats >= 1, timeout=20)
                assert not first.rejected and not second.log
                node = next(iter(first.of_type("node").values()))
                assert node["label"] == "found by mDNS"
                assert node["href"] == f"http://{net.ns_addr}:18080/"

                # The first registry dies (its mDNS record stays, as after a crash): the next
                # heartbeat fails and the node registers with the second (IS-04 "Inability To Connect").
                first_scope.cancel()
                await second.wait_for(lambda: len(second.of_type("sender")) == 1, timeout=30)
                await second.wait_for(lambda: second.heartbeats >= 1, timeout=20)
                assert not second.rejected
                # It probes with a heartbeat (404: unknown here), then registers in dependency order.
                posts = [entry for entry in second.log if entry[1].startswith("resource")]
                assert second.log[0] == ("POST", "health", 404)
                assert [entry[1] for entry in posts][:2] == ["resource node", "resource device"]
                assert edge.stop() == 0, edge.log()
                nursery.cancel_scope.cancel()
        finally:
            for zc in adverts:
                await trio.to_thread.run_sync(zc.close)
            await trio.to_thread.run_sync(stack.close)


async def test_without_a_registry_the_edge_advertises_itself_until_one_appears(tmp_path: Path) -> None:
    """IS-04 3.2 peer to peer: ``_nmos-node._tcp`` while no registry is known, withdrawn once one is."""
    from zeroconf import ServiceBrowser, ServiceStateChange

    with netns_pair("nmp") as net:
        registry = NmosRegistry()
        seen: dict[str, ServiceInfo | None] = {}
        changed = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def note(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
            info = (
                zeroconf.get_service_info(service_type, name, timeout=2000) if state_change.name != "Removed" else None
            )
            seen[name] = info
            trio.from_thread.run_sync(changed.set, trio_token=token)

        async def until(predicate: Any, timeout: float) -> None:
            nonlocal changed
            with trio.fail_after(timeout):
                while not predicate():
                    changed = trio.Event()
                    await changed.wait()

        browser_zc = await trio.to_thread.run_sync(lambda: Zeroconf(interfaces=[net.host_addr]))
        browser = ServiceBrowser(browser_zc, "_nmos-node._tcp.local.", handlers=[note])
        stack = contextlib.ExitStack()
        advert: Zeroconf | None = None
        try:
            config = {
                "version": 1,
                "setup_enabled": False,
                "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
                "nmos": {"enabled": True},
                "flows": [],
            }
            edge = await trio.to_thread.run_sync(stack.enter_context, edge_in_netns(net, tmp_path / "edge", config))
            await until(lambda: any(info is not None for info in seen.values()), timeout=20)
            info = next(info for info in seen.values() if info is not None)
            assert info.parsed_addresses() == [net.ns_addr] and info.port == 18080
            assert {k.decode(): (v or b"").decode() for k, v in info.properties.items()} == {
                "api_proto": "http",
                "api_ver": "v1.3",
                "api_auth": "false",
            }
            assert httpx.get(f"http://{net.ns_addr}:18080/x-nmos/node/v1.3/self", trust_env=False).status_code == 200

            async with trio.open_nursery() as nursery:
                await nursery.start(functools.partial(run_registry, registry, host=net.host_addr))
                port = int(registry.url.rsplit(":", 1)[1])
                advert = await trio.to_thread.run_sync(advertise_registry, net.host_addr, port, 10)
                await registry.wait_for(lambda: len(registry.of_type("device")) == 1, timeout=30)
                await until(lambda: all(info is None for info in seen.values()), timeout=20)  # withdrawn
                assert edge.stop() == 0, edge.log()
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(browser.cancel)
            await trio.to_thread.run_sync(browser_zc.close)
            if advert is not None:
                await trio.to_thread.run_sync(advert.close)
            await trio.to_thread.run_sync(stack.close)
