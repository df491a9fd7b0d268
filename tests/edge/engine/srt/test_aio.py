"""The trio layer over real libsrt on loopback: our caller/rendezvous/listener sockets.

No MockClock here: libsrt runs its own threads and real time (style.md section 4).
"""

from __future__ import annotations

import resource
import threading

import pytest
import trio

from appliance.models.config import SrtLeg
from services.edge.engine.srt import binding as b
from services.edge.engine.srt.aio import (
    SrtConnectError,
    SrtConnectionLost,
    current_poller,
    srt_connect,
    srt_listen,
)
from tests.helpers.ports import free_udp_port

from .conftest import PASSPHRASE, message

STATS_KEYS = {
    "state",
    "rtt_ms",
    "send_rate_mbps",
    "recv_rate_mbps",
    "pkt_loss_total",
    "pkt_retransmit_total",
    "uptime_ms",
}


def listener_leg(port: int, **kw: object) -> SrtLeg:
    return SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", **kw)  # type: ignore[arg-type]


def caller_leg(port: int, **kw: object) -> SrtLeg:
    return SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", **kw)  # type: ignore[arg-type]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the whole process: libsrt's threads too
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize("passphrase", [None, PASSPHRASE], ids=["clear", "encrypted"])
async def test_caller_to_listener_carries_every_message_in_order(passphrase: str | None) -> None:
    port = free_udp_port()
    with trio.fail_after(10):
        with await srt_listen(listener_leg(port, passphrase=passphrase)) as listener:
            async with trio.open_nursery() as nursery:
                accepted: list = []

                async def accept() -> None:
                    accepted.append(await listener.accept())

                nursery.start_soon(accept)
                with await srt_connect(caller_leg(port, passphrase=passphrase)) as caller:
                    while not accepted:
                        await trio.sleep(0.01)
                    with accepted[0] as server:
                        expected_km = b.SRT_KM_S_SECURED if passphrase else b.SRT_KM_S_UNSECURED
                        assert caller.km_state == expected_km
                        for i in range(500):
                            await caller.send(message(i))
                        buf = bytearray(1500)
                        for i in range(500):
                            n = await server.recv_into(buf)
                            assert bytes(buf[:n]) == message(i)


async def test_rendezvous_pair_connects_and_carries_data() -> None:
    a_port, b_port = free_udp_port(), free_udp_port()
    leg_a = SrtLeg(mode="rendezvous", local_addr=f"127.0.0.1:{a_port}", remote_addr=f"127.0.0.1:{b_port}")
    leg_b = SrtLeg(mode="rendezvous", local_addr=f"127.0.0.1:{b_port}", remote_addr=f"127.0.0.1:{a_port}")
    socks: dict[str, object] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def connect(name: str, leg: SrtLeg) -> None:
                socks[name] = await srt_connect(leg)

            nursery.start_soon(connect, "a", leg_a)
            nursery.start_soon(connect, "b", leg_b)
        a, bb = socks["a"], socks["b"]
        with a, bb:  # type: ignore[attr-defined]
            assert a.state == bb.state == "connected"  # type: ignore[attr-defined]
            await a.send(message(7))  # type: ignore[attr-defined]
            buf = bytearray(1500)
            n = await bb.recv_into(buf)  # type: ignore[attr-defined]
            assert bytes(buf[:n]) == message(7)


async def test_wrong_passphrase_is_reported_not_hung() -> None:
    port = free_udp_port()
    with await srt_listen(listener_leg(port, passphrase=PASSPHRASE)):
        start = trio.current_time()
        with trio.fail_after(5), pytest.raises(SrtConnectError, match="wrong passphrase") as info:
            await srt_connect(caller_leg(port, passphrase="not-the-passphrase"))
        assert info.value.reject_reason == b.SRT_REJ_BADSECRET
        assert trio.current_time() - start < 2


async def test_missing_passphrase_is_reported() -> None:
    port = free_udp_port()
    with await srt_listen(listener_leg(port, passphrase=PASSPHRASE)):
        with trio.fail_after(5), pytest.raises(SrtConnectError, match="passphrase required on one side only"):
            await srt_connect(caller_leg(port))


async def test_no_listener_times_out_with_libsrt_connect_timeout() -> None:
    port = free_udp_port()
    start = trio.current_time()
    with trio.fail_after(5), pytest.raises(SrtConnectError, match="Connection timeout") as info:
        await srt_connect(caller_leg(port, connect_timeout_secs=1))
    assert info.value.reject_reason == b.SRT_REJ_TIMEOUT
    assert 0.9 < trio.current_time() - start < 3


async def test_cancelling_a_connect_closes_the_half_open_socket() -> None:
    port = free_udp_port()
    poller = current_poller()
    with trio.move_on_after(0.3) as scope:
        await srt_connect(caller_leg(port, connect_timeout_secs=5))
    assert scope.cancelled_caught
    assert poller._waiters == {}  # unregistered (and closed)


async def test_listener_bind_conflict_is_an_error_naming_the_address() -> None:
    port = free_udp_port()
    with await srt_listen(listener_leg(port)):
        with pytest.raises(b.SrtError, match=f"cannot listen on 127.0.0.1:{port}: .*already listening"):
            await srt_listen(listener_leg(port))


async def test_peer_close_breaks_the_reader_and_stats_report_broken() -> None:
    port = free_udp_port()
    with trio.fail_after(10):
        with await srt_listen(listener_leg(port)) as listener:
            caller = await srt_connect(caller_leg(port))
            server = await listener.accept()
            await caller.send(message(1))
            buf = bytearray(1500)
            assert await server.recv_into(buf) == 1316
            stats = server.sample_stats()
            assert set(stats) == STATS_KEYS
            assert stats["state"] == "connected"
            caller.close()
            with pytest.raises(SrtConnectionLost):
                while True:
                    await server.recv_into(buf)
            after = server.stats()
            assert after["state"] == "broken"
            assert after["recv_rate_mbps"] == 0.0
            server.close()


async def test_stats_are_plausible_after_a_transfer() -> None:
    port = free_udp_port()
    with trio.fail_after(10):
        with await srt_listen(listener_leg(port)) as listener:
            with await srt_connect(caller_leg(port)) as caller, await listener.accept() as server:
                caller.sample_stats()
                server.sample_stats()
                buf = bytearray(1500)
                start = trio.current_time()
                for i in range(1000):  # ~10 Mbit/s for ~1 s
                    await caller.send(message(i))
                    if i % 10 == 9:
                        await trio.sleep_until(start + (i + 1) / 1000)
                        while server.recv_nowait_into(buf):
                            pass
                await trio.sleep(0.3)
                while server.recv_nowait_into(buf):
                    pass
                sent, received = caller.sample_stats(), server.sample_stats()
    assert set(sent) == set(received) == STATS_KEYS
    assert sent["state"] == received["state"] == "connected"
    assert 0 < float(sent["rtt_ms"]) < 100  # loopback; libsrt starts from 100 ms before the first ACK
    assert 5 < float(sent["send_rate_mbps"]) < 20
    assert 5 < float(received["recv_rate_mbps"]) < 20
    assert sent["pkt_loss_total"] == received["pkt_loss_total"] == 0
    assert 900 < int(sent["uptime_ms"]) < 5000
    assert received["pkt_retransmit_total"] == 0


async def test_idle_open_sockets_do_not_busy_poll() -> None:
    # One listener, one connected pair and a task blocked in recv_into: for 1 s of
    # idleness the whole process (libsrt's threads included) must stay near idle, and
    # the poller must not wake trio for nothing.
    port = free_udp_port()
    with await srt_listen(listener_leg(port)) as listener:
        with await srt_connect(caller_leg(port)) as caller, await listener.accept() as server:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.recv_into, bytearray(1500))
                await trio.sleep(0.2)
                poller = current_poller()
                reports, cpu = poller.reports, cpu_seconds()
                await trio.sleep(1.0)
                idle_cpu = cpu_seconds() - cpu
                idle_reports = poller.reports - reports
                nursery.cancel_scope.cancel()
            assert caller.state == "connected"
    # Measured ~0.025 s here (libsrt's own threads wake in 10 ms slices); a busy poll
    # costs a whole core (~1 s). The margin absorbs a loaded 2-core machine.
    assert idle_cpu < 0.15, f"{idle_cpu:.3f} s of CPU in 1 s idle"
    assert idle_reports == 0


async def test_a_readable_socket_nobody_reads_does_not_spin_the_poller() -> None:
    # One shot: once the poller has reported a socket it parks it until a task re-arms
    # it. Level-triggered without that, a readable socket would be reported on every
    # srt_epoll_uwait pass, as fast as the poller thread can loop.
    port = free_udp_port()
    with trio.fail_after(10):
        with await srt_listen(listener_leg(port)) as listener:
            with await srt_connect(caller_leg(port)) as caller, await listener.accept() as server:
                poller = current_poller()
                await caller.send(message(1))
                await server.wait_readable()  # reported once...
                reports, cpu = poller.reports, cpu_seconds()
                await trio.sleep(0.5)  # ...then left unread
                assert poller.reports - reports == 0
                assert cpu_seconds() - cpu < 0.1
                assert server.recv_nowait_into(bytearray(1500)) == 1316  # still there


async def test_empty_poller_does_not_spin() -> None:
    poller = current_poller()
    assert poller._waiters == {}
    cpu, reports = cpu_seconds(), poller.reports
    await trio.sleep(0.5)
    assert cpu_seconds() - cpu < 0.1  # a spinning uwait would cost ~0.5 s
    assert poller.reports == reports
    assert any(t.name == "srt-poller" for t in threading.enumerate())


async def test_send_nowait_refuses_an_oversized_message() -> None:
    port = free_udp_port()
    with trio.fail_after(10):
        with await srt_listen(listener_leg(port)) as listener:
            with await srt_connect(caller_leg(port)) as caller, await listener.accept():
                assert caller.max_payload == 1316
                with pytest.raises(ValueError, match="exceeds the payload size"):
                    caller.send_nowait(bytes(1317))
                assert caller.send_nowait(bytes(1316))


async def test_closing_a_socket_wakes_its_waiting_reader() -> None:
    port = free_udp_port()
    with trio.fail_after(10):
        with await srt_listen(listener_leg(port)) as listener:
            with await srt_connect(caller_leg(port)), await listener.accept() as server:
                async with trio.open_nursery() as nursery:
                    raised: list[BaseException] = []

                    async def reader() -> None:
                        try:
                            await server.recv_into(bytearray(1500))
                        except trio.ClosedResourceError as exc:
                            raised.append(exc)

                    nursery.start_soon(reader)
                    await trio.sleep(0.1)
                    server.close()
                assert raised
