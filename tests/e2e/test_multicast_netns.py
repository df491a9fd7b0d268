"""Multicast RTP into a real ``mp-edge`` running inside a network namespace.

The test builds its own little network (style.md 4: "multicast runs in a
network namespace the test creates")::

    host netns                         test netns (mp-edge runs here)
    ----------                         ------------------------------
    sender  --IP_MULTICAST_IF-->  veth (host end) <==> veth (ns end)  --> rtp input joined
    UdpSink <------------------------------------------------------ rtp output (unicast)
    httpx   ----------------------- REST API on the ns veth address ----

Addresses are a random /30 of 10.213.0.0/16 (tests/helpers/netns.py). The edge joins
239.10.0.1 on the namespace's veth address (``interface_addr``) and forwards to
a unicast receiver on the host end. A second flow joins 239.10.0.2 on the same
port, so a datagram to that group does reach the namespace's stack: the test
then proves it is counted by its own flow only, not by the first one.

Skips only where namespaces are impossible (not root, ``ip netns add`` answers
EPERM). A missing ``ip`` tool skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import free_udp_port, wait_for
from tests.helpers.media import UdpSink, rtp_stream
from tests.helpers.netns import NsEdge, edge_in_netns, ip, netns_pair, send_multicast

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

GROUP_A = "239.10.0.1"
GROUP_B = "239.10.0.2"
MCAST_PORT = 5000


def _flow_stats(edge: NsEdge, flow_id: str) -> dict[str, Any]:
    stats: dict[str, Any] = edge.get(f"/api/v1/stats/{flow_id}")["data"]
    return stats


def _metric(edge: NsEdge, name: str, flow_id: str) -> float:
    """The value of one ``name{flow_id="..."}`` sample from /metrics."""
    text = httpx.get(edge.url + "/metrics", timeout=5, trust_env=False).text
    prefix = f'{name}{{flow_id="{flow_id}"}} '
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    assert len(values) == 1, (name, flow_id, text)
    return values[0]


def test_multicast_group_joined_on_interface_is_forwarded_and_counted(tmp_path: Path) -> None:
    with netns_pair() as net:
        sink_port = free_udp_port()
        config = {
            "version": 1,
            "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
            "flows": [
                {
                    "id": "mc-a",
                    "name": "Multicast A",
                    "input": {"type": "rtp", "bind_addr": f"{GROUP_A}:{MCAST_PORT}", "interface_addr": net.ns_addr},
                    "outputs": [
                        {"type": "rtp", "id": "to-host", "name": "To host", "dest_addr": f"{net.host_addr}:{sink_port}"}
                    ],
                },
                {
                    "id": "mc-b",
                    "name": "Multicast B, same port",
                    "input": {"type": "rtp", "bind_addr": f"{GROUP_B}:{MCAST_PORT}", "interface_addr": net.ns_addr},
                    "outputs": [],
                },
            ],
        }
        with UdpSink(sink_port, host=net.host_addr) as sink, edge_in_netns(net, tmp_path / "edge", config) as edge:
            for flow_id in ("mc-a", "mc-b"):
                stats = _flow_stats(edge, flow_id)
                assert stats["state"] == "Running", (flow_id, stats, edge.log())
                assert stats["input"]["packets_received"] == 0

            # The joins happened on the namespace's veth (interface_addr), not on lo.
            maddr = ip("-n", net.name, "maddr", "show", "dev", net.ns_if).stdout
            assert GROUP_A in maddr and GROUP_B in maddr, maddr

            packets = list(rtp_stream(200))
            assert send_multicast(GROUP_A, MCAST_PORT, packets, net.host_addr) == len(packets)

            wait_for(lambda: len(sink.datagrams) >= len(packets), timeout=10)
            a = wait_for(
                lambda: (s := _flow_stats(edge, "mc-a"))["input"]["packets_received"] >= len(packets) and s,
                timeout=10,
            )
            assert a["input"]["packets_received"] == len(packets)
            assert a["input"]["bytes_received"] == sum(len(p) for p in packets)
            assert a["input"]["packets_filtered"] == 0
            assert a["input"]["packets_lost"] == 0
            assert a["outputs"][0]["output_id"] == "to-host"
            assert a["outputs"][0]["packets_sent"] == len(packets)
            assert sink.datagrams == packets  # unicast, byte for byte, in order
            assert _flow_stats(edge, "mc-b")["input"]["packets_received"] == 0

            # Same port, the other group: it reaches the namespace (flow B counts it),
            # but flow A's socket, bound to its group, never sees it.
            other = list(rtp_stream(20, first_seq=5000, ssrc=0x0BADF00D))
            assert send_multicast(GROUP_B, MCAST_PORT, other, net.host_addr) == len(other)
            wait_for(lambda: _flow_stats(edge, "mc-b")["input"]["packets_received"] >= len(other), timeout=10)
            time.sleep(1.5)  # one more stats interval: a late count for A would show now
            b = _flow_stats(edge, "mc-b")
            a = _flow_stats(edge, "mc-a")
            assert b["input"]["packets_received"] == len(other)
            assert a["input"]["packets_received"] == len(packets)
            assert a["input"]["packets_filtered"] == 0
            assert a["outputs"][0]["packets_sent"] == len(packets)
            assert len(sink.datagrams) == len(packets)

            assert _metric(edge, "mediaplane_edge_flow_input_packets_total", "mc-a") == len(packets)
            assert _metric(edge, "mediaplane_edge_flow_input_packets_total", "mc-b") == len(other)
            assert edge.stop() == 0, edge.log()


def test_teardown_leaves_nothing_behind(tmp_path: Path) -> None:
    """The namespace, the veth pair and every process in it are gone after the block."""
    with netns_pair() as net:
        probe = subprocess.Popen(["ip", "netns", "exec", net.name, sys.executable, "-c", "import time; time.sleep(60)"])
        wait_for(lambda: str(probe.pid) in ip("netns", "pids", net.name).stdout, timeout=10)
        name, host_if = net.name, net.host_if
    assert probe.wait(10) == -signal.SIGKILL
    assert name not in ip("netns", "list").stdout
    assert ip("link", "show", host_if, check=False).returncode != 0
