"""The UDP output driver with real sockets: bounded queue, drops counted, repacking, 2022-7 legs."""

from __future__ import annotations

import socket

from appliance.models.config import RtpOutput, UdpOutput
from services.edge.engine.udp import OUTPUT_QUEUE_PACKETS, UdpOutputDriver


def receiver() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(1)
    return sock, sock.getsockname()[1]


def drain(sock: socket.socket) -> list[bytes]:
    out = []
    sock.settimeout(0.2)
    try:
        while True:
            out.append(sock.recv(4096))
    except TimeoutError:
        return out


def test_a_full_queue_drops_and_counts() -> None:
    sock, port = receiver()
    driver = UdpOutputDriver(UdpOutput(id="o", name="o", dest_addr=f"127.0.0.1:{port}"), ssrc=1)
    driver.open()
    payload = memoryview(b"\x47" + bytes(1315))
    for _ in range(OUTPUT_QUEUE_PACKETS + 500):  # the input never waits: the overflow is dropped
        driver.offer(b"rtp", payload, 0.0)
    assert driver.packets_dropped == 500
    driver.flush()
    assert driver.packets_sent == OUTPUT_QUEUE_PACKETS
    assert len(drain(sock)) == OUTPUT_QUEUE_PACKETS
    driver.close()
    sock.close()


def test_udp_output_repacks_ts_into_1316_byte_datagrams() -> None:
    sock, port = receiver()
    driver = UdpOutputDriver(UdpOutput(id="o", name="o", dest_addr=f"127.0.0.1:{port}"), ssrc=1)
    driver.open()
    ts = bytes(range(188)) * 10
    for chunk in (ts[: 188 * 3], ts[188 * 3 : 188 * 10]):  # 3 then 7 TS packets
        driver.offer(None, memoryview(chunk), 0.0)
    driver.flush()
    got = drain(sock)
    assert got == [ts[:1316]]  # 3 packets stay in the carry until 7 are there
    driver.close()
    sock.close()


def test_rtp_output_with_redundancy_sends_to_both_legs() -> None:
    a, port_a = receiver()
    b, port_b = receiver()
    config = RtpOutput(
        id="o", name="o", dest_addr=f"127.0.0.1:{port_a}", redundancy={"dest_addr": f"127.0.0.1:{port_b}"}
    )
    driver = UdpOutputDriver(config, ssrc=1)
    driver.open()
    packets = [bytes([0x80, 33, 0, i]) + bytes(8) + b"\x47" * 188 for i in range(10)]
    for p in packets:
        driver.offer(p, memoryview(p)[12:], 0.0)
    driver.flush()
    assert drain(a) == packets and drain(b) == packets
    driver.close()
    a.close()
    b.close()
