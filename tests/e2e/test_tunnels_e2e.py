"""Tunnels end to end (issue 16): a real ``mp-relay`` and two real ``mp-edge`` processes on loopback.

An RTP flow on edge A sends into A's egress tunnel; edge B's ingress tunnel delivers into a flow
on B whose output a test sink reads. Carried through the relay over QUIC, through the relay's
native UDP plane, and edge to edge in direct mode; a TCP tunnel through the relay; the relay
restarted mid-stream with the edges rebinding on their own. A capturing UDP proxy in front of
the relay sees what crosses it: never the TS sync pattern of the payload.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, free_port, free_udp_port, start_edge, wait_for, wait_healthy
from tests.helpers.media import UdpSink, rtp_stream, send_datagrams
from tests.helpers.relay import Relay, start_relay

pytestmark = pytest.mark.e2e

SERVER = {"listen_addr": "127.0.0.1", "listen_port": 8080}  # the flags give the real port
KEY = "5a" * 32
BIND_SECRET = "c3" * 32
PSK = "correct horse battery staple"
COUNT = 2000


# --------------------------------------------------------------------------- a capturing proxy
@dataclass
class CapturingProxy:
    """A UDP proxy in front of the relay: one upstream socket per client, both ways, recording
    every datagram it carries (bounded: the first ``keep`` of each direction)."""

    upstream: tuple[str, int]
    keep: int = 5000
    port: int = 0
    seen: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._front.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        self._front.bind(("127.0.0.1", self.port))
        self.port = self._front.getsockname()[1]
        self._front.settimeout(0.1)
        self._backs: dict[tuple[str, int], socket.socket] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._forward, daemon=True)]
        self._threads[0].start()

    def _record(self, data: bytes) -> None:
        if len(self.seen) < 2 * self.keep:
            self.seen.append(data)

    def _forward(self) -> None:
        while not self._stop.is_set():
            try:
                data, client = self._front.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            back = self._backs.get(client)
            if back is None:
                back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                back.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
                back.bind(("127.0.0.1", 0))
                back.settimeout(0.1)
                self._backs[client] = back
                thread = threading.Thread(target=self._backward, args=(back, client), daemon=True)
                self._threads.append(thread)
                thread.start()
            self._record(data)
            try:
                back.sendto(data, self.upstream)
            except OSError:
                pass

    def _backward(self, back: socket.socket, client: tuple[str, int]) -> None:
        while not self._stop.is_set():
            try:
                data = back.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self._record(data)
            try:
                self._front.sendto(data, client)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2)
        self._front.close()
        for back in self._backs.values():
            back.close()


def assert_no_ts_payload(seen: list[bytes]) -> None:
    """No datagram carries MPEG-TS in the clear: 0x47 every 188 bytes (ISO/IEC 13818-1 2.4.3.2)."""
    assert len(seen) > 100
    for datagram in seen:
        for start in range(min(len(datagram), 188)):
            assert not all(datagram[k] == 0x47 for k in range(start, min(len(datagram), start + 7 * 188), 188)) or (
                len(datagram) - start < 3 * 188
            ), "a TS sync pattern crossed the relay in the clear"


# --------------------------------------------------------------------------- processes
def relay_config(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "relay" / "relay.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(fields))
    return path


@contextmanager
def relay_process(tmp_path: Path, quic_port: int, udp_port: int, **fields: Any) -> Iterator[Relay]:
    config = relay_config(tmp_path, **fields)
    relay = start_relay(
        config,
        "--api-addr",
        "127.0.0.1:0",
        "--quic-addr",
        f"127.0.0.1:{quic_port}",
        "--udp-addr",
        f"127.0.0.1:{udp_port}",
    )
    try:
        yield relay
    finally:
        relay.stop()


def tunnel_body(tunnel_id: str, direction: str, protocol: str, local: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": tunnel_id,
        "name": f"{protocol}-{direction}",
        "protocol": protocol,
        "direction": direction,
        "local_addr": local,
        **fields,
    }


def rtp_flow(flow_id: str, input_port: int, output_port: int) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": flow_id,
        "enabled": True,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{input_port}"},
        "outputs": [{"type": "rtp", "id": "out", "name": "out", "dest_addr": f"127.0.0.1:{output_port}"}],
    }


def tunnel_state(edge: Edge, tunnel_id: str) -> str:
    answer = httpx.get(f"{edge.url}/api/v1/tunnels/{tunnel_id}", timeout=5)
    return str(answer.json().get("state")) if answer.status_code == 200 else f"HTTP {answer.status_code}"


def wait_state(edge: Edge, tunnel_id: str, state: str, timeout: float = 40.0) -> None:
    wait_for(lambda: tunnel_state(edge, tunnel_id) == state, timeout=timeout, interval=0.1)


@dataclass
class Pair:
    a: Edge
    b: Edge
    tunnel_id: str
    a_input: int
    sink_port: int


@contextmanager
def edge_pair(tmp_path: Path, protocol: str, egress: dict[str, Any], ingress: dict[str, Any]) -> Iterator[Pair]:
    """Edge A: flow ``cam`` (RTP in) whose output goes into A's egress tunnel. Edge B: the ingress
    tunnel delivers into flow ``cam-b``, whose output the caller's sink reads on ``sink_port``."""
    tunnel_id = str(uuid.uuid4())
    entry, b_input, a_input, sink_port = free_udp_port(), free_udp_port(), free_udp_port(), free_udp_port()
    config_a = {
        "version": 1,
        "server": SERVER,
        "flows": [rtp_flow("cam", a_input, entry)],
        "tunnels": [tunnel_body(tunnel_id, "egress", protocol, f"127.0.0.1:{entry}", **egress)],
    }
    config_b = {
        "version": 1,
        "server": SERVER,
        "flows": [rtp_flow("cam-b", b_input, sink_port)],
        "tunnels": [tunnel_body(tunnel_id, "ingress", protocol, f"127.0.0.1:{b_input}", **ingress)],
    }
    with ExitStack() as stack:
        # Both started before either is awaited: they boot side by side instead of one after the other.
        a = start_edge(tmp_path / "edge-a", config=config_a, wait=False)
        stack.callback(a.stop)
        b = start_edge(tmp_path / "edge-b", config=config_b, wait=False)
        stack.callback(b.stop)
        wait_healthy(a)
        wait_healthy(b)
        yield Pair(a, b, tunnel_id, a_input, sink_port)


def flow_lost(edge: Edge, flow_id: str) -> int:
    stats = httpx.get(f"{edge.url}/api/v1/stats/{flow_id}", timeout=5).json()["data"]
    return int(stats["input"]["packets_lost"])


def carry_rtp(pair: Pair, count: int = COUNT, first_seq: int = 0) -> list[bytes]:
    """``count`` RTP datagrams into flow A; what B's flow output delivered."""
    with UdpSink(pair.sink_port) as sink:
        send_datagrams(("127.0.0.1", pair.a_input), rtp_stream(count, first_seq=first_seq), pps=2000)
        try:
            wait_for(lambda: len(sink.datagrams) >= count, timeout=20)
        except AssertionError:
            tunnels = [httpx.get(f"{edge.url}/api/v1/tunnels", timeout=5).json() for edge in (pair.a, pair.b)]
            flows = [httpx.get(f"{edge.url}/api/v1/stats", timeout=5).json() for edge in (pair.a, pair.b)]
            raise AssertionError(
                f"{len(sink.datagrams)} of {count} delivered; tunnels {tunnels}; flows {flows}"
            ) from None
        return list(sink.datagrams)


def assert_zero_loss(pair: Pair, delivered: list[bytes], count: int = COUNT, first_seq: int = 0) -> None:
    sequences = [int.from_bytes(d[2:4], "big") for d in delivered]
    assert sequences == [(first_seq + k) & 0xFFFF for k in range(count)]
    assert flow_lost(pair.b, "cam-b") == 0


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("transport", ["quic", "udp"])
def test_rtp_flow_through_a_relay_tunnel_zero_loss_and_ciphertext_only(tmp_path: Path, transport: str) -> None:
    quic_port, udp_port = free_udp_port(), free_udp_port()
    with relay_process(tmp_path, quic_port, udp_port) as relay:
        proxy = CapturingProxy(("127.0.0.1", udp_port if transport == "udp" else quic_port))
        try:
            through = {
                "mode": "relay",
                "transport": transport,
                "relay_addr": f"127.0.0.1:{proxy.port}",
                "tunnel_encryption_key": KEY,
                "tunnel_bind_secret": BIND_SECRET,
            }
            with edge_pair(tmp_path, "udp", through, through) as pair:
                wait_state(pair.a, pair.tunnel_id, "Connected")
                wait_state(pair.b, pair.tunnel_id, "Connected")
                try:
                    delivered = carry_rtp(pair)
                except AssertionError as exc:
                    relay_tunnels = httpx.get(relay.url + "/api/v1/tunnels", timeout=5).json()
                    raise AssertionError(f"{str(exc)[:60]} relay: {relay_tunnels}") from None
                assert_zero_loss(pair, delivered)
                shown = httpx.get(f"{pair.a.url}/api/v1/tunnels", timeout=5).json()["tunnels"]
                assert KEY not in json.dumps(shown) and BIND_SECRET not in json.dumps(shown)
                if transport == "quic":
                    listed = httpx.get(relay.url + "/api/v1/tunnels", timeout=5).json()["tunnels"]
                    assert [t["status"] for t in listed] == ["active"]
                    assert listed[0]["stats"]["udp_datagrams_total"] >= COUNT
                else:
                    sessions = httpx.get(relay.url + "/api/v1/udp-sessions", timeout=5).json()["sessions"]
                    assert [s["status"] for s in sessions] == ["active"]
        finally:
            proxy.close()
        assert_no_ts_payload(proxy.seen)


def test_direct_tunnel_carries_a_flow(tmp_path: Path) -> None:
    listen = free_udp_port()
    egress = {"mode": "direct", "peer_addr": f"127.0.0.1:{listen}", "tunnel_psk": PSK, "tunnel_encryption_key": KEY}
    ingress = {
        "mode": "direct",
        "direct_listen_addr": f"127.0.0.1:{listen}",
        "tunnel_psk": PSK,
        "tunnel_encryption_key": KEY,
    }
    with edge_pair(tmp_path, "udp", egress, ingress) as pair:
        wait_state(pair.b, pair.tunnel_id, "Connected")
        wait_state(pair.a, pair.tunnel_id, "Connected")
        assert_zero_loss(pair, carry_rtp(pair))


def test_tcp_tunnel_through_the_relay(tmp_path: Path) -> None:
    quic_port, udp_port = free_udp_port(), free_udp_port()
    entry, target = free_port(), free_port()
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", target))
    server.listen()
    body = os.urandom(2 * 1024 * 1024)

    def echo_once() -> None:
        connection, _ = server.accept()
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    echo = threading.Thread(target=echo_once, daemon=True)
    echo.start()
    tunnel_id = str(uuid.uuid4())
    with relay_process(tmp_path, quic_port, udp_port) as relay, ExitStack() as stack:
        through = {"mode": "relay", "relay_addr": f"127.0.0.1:{quic_port}", "tunnel_encryption_key": KEY}
        a = start_edge(
            tmp_path / "edge-a",
            config={
                "version": 1,
                "server": SERVER,
                "tunnels": [tunnel_body(tunnel_id, "egress", "tcp", f"127.0.0.1:{entry}", **through)],
            },
            wait=False,
        )
        stack.callback(a.stop)
        b = start_edge(
            tmp_path / "edge-b",
            config={
                "version": 1,
                "server": SERVER,
                "tunnels": [tunnel_body(tunnel_id, "ingress", "tcp", f"127.0.0.1:{target}", **through)],
            },
            wait=False,
        )
        stack.callback(b.stop)
        wait_healthy(a)
        wait_healthy(b)
        wait_state(a, tunnel_id, "Connected")
        with socket.create_connection(("127.0.0.1", entry), timeout=20) as client:
            sender = threading.Thread(target=lambda: (client.sendall(body), client.shutdown(socket.SHUT_WR)))
            sender.start()
            got = bytearray()
            while data := client.recv(65536):  # ends on the echo server's FIN, carried back
                got += data
            sender.join(10)
        assert bytes(got) == body
        stats = httpx.get(relay.url + "/api/v1/stats", timeout=5).json()
        assert stats["total_tcp_streams"] == 1
    server.close()


def test_relay_restarted_mid_stream_edges_rebind(tmp_path: Path) -> None:
    quic_port, udp_port = free_udp_port(), free_udp_port()
    through = {"mode": "relay", "relay_addr": f"127.0.0.1:{quic_port}", "tunnel_encryption_key": KEY}
    relay = start_relay(
        relay_config(tmp_path),
        "--api-addr",
        "127.0.0.1:0",
        "--quic-addr",
        f"127.0.0.1:{quic_port}",
        "--udp-addr",
        f"127.0.0.1:{udp_port}",
    )
    try:
        with edge_pair(tmp_path, "udp", through, through) as pair:
            wait_state(pair.a, pair.tunnel_id, "Connected")
            wait_state(pair.b, pair.tunnel_id, "Connected")
            assert_zero_loss(pair, carry_rtp(pair, 500), 500)
            assert relay.stop() == 0
            wait_state(pair.a, pair.tunnel_id, "Connecting")
            relay = start_relay(
                relay.log_path.with_suffix(".json"),
                "--api-addr",
                "127.0.0.1:0",
                "--quic-addr",
                f"127.0.0.1:{quic_port}",
                "--udp-addr",
                f"127.0.0.1:{udp_port}",
            )
            wait_state(pair.a, pair.tunnel_id, "Connected", timeout=60)
            wait_state(pair.b, pair.tunnel_id, "Connected", timeout=60)
            delivered = carry_rtp(pair, 500, first_seq=500)
            sequences = [int.from_bytes(d[2:4], "big") for d in delivered]
            assert sequences == list(range(500, 1000))
            events = httpx.get(f"{pair.a.url}/api/v1/events", timeout=5).json()
            texts = json.dumps(events)
            assert "tunnel" in texts
    finally:
        relay.stop()
