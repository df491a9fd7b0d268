"""SrtLegRunner against our own SRT peers on loopback: viewers, limits, reconnects."""

from __future__ import annotations

import contextlib

import pytest
import trio

from appliance.errors import InvalidInput
from appliance.models.config import SrtLeg
from services.edge.engine.srt import binding as b
from services.edge.engine.srt.aio import SrtConnectError, srt_connect, srt_listen
from services.edge.engine.srt.runner import (
    SrtConnectFailed,
    SrtLegEvent,
    SrtLegRunner,
    SrtLegState,
    SrtPeerConnected,
    SrtPeerDisconnected,
    SrtPeerRefused,
)
from tests.helpers.ports import free_udp_port

from .conftest import PASSPHRASE, message, wait_until


def viewer_leg(port: int) -> SrtLeg:
    return SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", passphrase=PASSPHRASE)


async def test_listener_output_fans_out_to_two_viewers_and_refuses_a_third() -> None:
    port = free_udp_port()
    events: list[SrtLegEvent] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", passphrase=PASSPHRASE),
        max_peers=2,
        on_event=events.append,
    )
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            assert runner.state is SrtLegState.CONNECTING
            v1 = await srt_connect(viewer_leg(port))
            v2 = await srt_connect(viewer_leg(port))
            await wait_until(lambda: runner.peer_count == 2, 5)
            assert runner.state is SrtLegState.CONNECTED

            # The runner accepts, then closes a caller over the limit: the caller sees
            # either a failed handshake or a connection that breaks at once.
            with pytest.raises(b.SrtError):
                with await srt_connect(viewer_leg(port)) as v3:
                    while True:
                        await v3.recv_into(bytearray(1500))
            await wait_until(lambda: runner.refused == 1, 5)

            for i in range(200):
                assert runner.send_nowait(message(i)) == 2
                if i % 20 == 19:
                    await trio.sleep(0.002)
            buf = bytearray(1500)
            for viewer in (v1, v2):
                for i in range(200):
                    n = await viewer.recv_into(buf)
                    assert bytes(buf[:n]) == message(i)
            assert runner.messages_sent == 200
            assert runner.messages_dropped == 0

            stats = runner.stats()
            assert stats["state"] == "connected"
            await trio.sleep(1.1)  # one full stats interval at ~0 rate, then check totals stay sane
            assert runner.stats()["pkt_loss_total"] == 0

            v1.close()
            await wait_until(lambda: runner.peer_count == 1, 5)
            assert runner.state is SrtLegState.CONNECTED  # one viewer left
            v2.close()
            await wait_until(lambda: runner.peer_count == 0, 5)
            assert runner.state is SrtLegState.BROKEN
            assert runner.stats()["state"] == "broken"
            assert runner.send_nowait(message(0)) == 0
            nursery.cancel_scope.cancel()

    kinds = [type(e) for e in events]
    assert kinds.count(SrtPeerConnected) == 2
    assert kinds.count(SrtPeerRefused) == 1
    assert kinds.count(SrtPeerDisconnected) == 2
    refused = next(e for e in events if isinstance(e, SrtPeerRefused))
    assert refused.reason == "peer limit 2 reached"


async def test_listener_input_delivers_messages_to_the_sink() -> None:
    port = free_udp_port()
    got: list[bytes] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", stream_id="feed-1"),
        sink=lambda view: got.append(bytes(view)),
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            leg = SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", stream_id="feed-1")
            with await srt_connect(leg) as sender:
                for i in range(300):
                    await sender.send(message(i))
                await wait_until(lambda: len(got) == 300, 5)
            assert got == [message(i) for i in range(300)]
            assert runner.messages_received == 300
            assert runner.bytes_received == 300 * 1316
            nursery.cancel_scope.cancel()


async def test_listener_refuses_a_different_stream_id() -> None:
    port = free_udp_port()
    events: list[SrtLegEvent] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", stream_id="feed-1"),
        sink=lambda view: None,
        on_event=events.append,
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            leg = SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", stream_id="other")
            # Refused after the accept: the caller sees a failed handshake or a quick break.
            with contextlib.suppress(SrtConnectError):
                with await srt_connect(leg):
                    await wait_until(lambda: runner.refused == 1, 5)
            await wait_until(lambda: runner.refused == 1, 5)
            assert runner.peer_count == 0 and runner.connects == 0
            nursery.cancel_scope.cancel()
    assert events == [SrtPeerRefused(events[0].peer_addr, "stream id does not match")]  # type: ignore[union-attr]


async def test_caller_reports_a_wrong_passphrase_and_keeps_retrying() -> None:
    port = free_udp_port()
    events: list[SrtLegEvent] = []
    with await srt_listen(SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", passphrase=PASSPHRASE)):
        runner = SrtLegRunner(
            SrtLeg(
                mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", passphrase="wrong-passphrase"
            ),
            on_event=events.append,
        )
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(runner.run)
                await wait_until(lambda: len(events) >= 2, 5)
                nursery.cancel_scope.cancel()
    assert all(isinstance(e, SrtConnectFailed) for e in events)
    first = events[0]
    assert isinstance(first, SrtConnectFailed)
    assert first.attempt == 1 and events[1].attempt == 2  # type: ignore[union-attr]
    assert first.reject_reason == b.SRT_REJ_BADSECRET
    assert "wrong passphrase" in first.reason
    assert runner.state is SrtLegState.CONNECTING
    assert runner.last_error is not None and "wrong passphrase" in runner.last_error


async def test_caller_reconnects_within_two_seconds_of_the_listener_coming_back() -> None:
    port = free_udp_port()
    events: list[SrtLegEvent] = []
    runner = SrtLegRunner(
        SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", connect_timeout_secs=1),
        on_event=events.append,
    )
    listen_leg = SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = await srt_listen(listen_leg)
            await nursery.start(runner.run)
            server = await listener.accept()
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)

            server.close()  # the far end goes away...
            listener.close()
            await wait_until(lambda: runner.state is SrtLegState.BROKEN, 5)
            await trio.sleep(2.5)  # ...long enough for failed attempts and a full backoff
            assert runner.state is SrtLegState.BROKEN
            assert any(isinstance(e, SrtConnectFailed) for e in events)

            listener = await srt_listen(listen_leg)  # ...and comes back
            back = trio.current_time()
            with listener:
                server = await listener.accept()
                took = await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
                assert trio.current_time() - back < 2.0, took
                # the new connection carries data
                assert runner.send_nowait(message(5)) == 1
                buf = bytearray(1500)
                n = await server.recv_into(buf)
                assert bytes(buf[:n]) == message(5)
                server.close()
            nursery.cancel_scope.cancel()
    assert [type(e) for e in events].count(SrtPeerConnected) == 2


async def test_start_reports_an_unsupported_leg() -> None:
    leg = SrtLeg(
        mode="caller", local_addr="0.0.0.0:0", remote_addr="127.0.0.1:9", passphrase=PASSPHRASE, crypto_mode="aes-gcm"
    )
    if b.library_info().aes_gcm:
        pytest.skip("this libsrt supports aes-gcm")
    async with trio.open_nursery() as nursery:
        with pytest.raises(InvalidInput, match="aes-gcm"):
            await nursery.start(SrtLegRunner(leg).run)


async def test_start_reports_a_listener_port_in_use() -> None:
    port = free_udp_port()
    with await srt_listen(SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}")):
        async with trio.open_nursery() as nursery:
            with pytest.raises(b.SrtError, match=f"cannot listen on 127.0.0.1:{port}"):
                await nursery.start(SrtLegRunner(SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}")).run)


async def test_input_listener_replaces_a_silent_caller_but_refuses_while_it_sends() -> None:
    # A crashed encoder sends no shutdown: its old connection looks alive until the peer
    # idle timeout (30 s by default). When it calls again, the input takes the new call
    # once the old one has been silent for STALE_INPUT_S, and refuses it after contend_s
    # if the old one keeps sending.
    port = free_udp_port()
    got: list[bytes] = []
    events: list[SrtLegEvent] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}"),
        sink=lambda view: got.append(bytes(view)),
        on_event=events.append,
    )
    runner.contend_s = 0.5
    leg = SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}")
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            old = await srt_connect(leg)
            await old.send(message(1))
            await wait_until(lambda: len(got) == 1, 5)

            # still sending: a second caller is held for contend_s, then refused
            async def keep_sending() -> None:
                for i in range(2, 40):
                    await old.send(message(i))
                    await trio.sleep(0.02)

            nursery.start_soon(keep_sending)
            with contextlib.suppress(SrtConnectError):
                with await srt_connect(leg):
                    await wait_until(lambda: runner.refused == 1, 5)
            await wait_until(lambda: runner.refused == 1, 5)
            await wait_until(lambda: len(got) == 39, 5)  # the sender stopped: now it is silent

            await trio.sleep(1.2)
            new = await srt_connect(leg)
            await wait_until(lambda: runner.connects == 2, 5)
            await new.send(message(100))
            await wait_until(lambda: got[-1] == message(100), 5)
            assert runner.peer_count == 1
            with pytest.raises(b.SrtError):  # the old connection was closed by the runner
                while True:
                    await old.recv_into(bytearray(1500))
            old.close()
            new.close()
            nursery.cancel_scope.cancel()
    replaced = [e for e in events if isinstance(e, SrtPeerDisconnected)]
    assert replaced and replaced[0].reason.startswith("replaced by a new caller")


async def test_rendezvous_runner_reconnects_each_time_the_far_end_comes_back() -> None:
    a_port, b_port = free_udp_port(), free_udp_port()
    runner = SrtLegRunner(
        SrtLeg(mode="rendezvous", local_addr=f"127.0.0.1:{a_port}", remote_addr=f"127.0.0.1:{b_port}")
    )
    far = SrtLeg(mode="rendezvous", local_addr=f"127.0.0.1:{b_port}", remote_addr=f"127.0.0.1:{a_port}")
    buf = bytearray(1500)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            for round_ in range(3):
                with await srt_connect(far) as sock:
                    await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
                    assert runner.send_nowait(message(round_)) == 1
                    n = await sock.recv_into(buf)
                    assert bytes(buf[:n]) == message(round_)
                await wait_until(lambda: runner.state is SrtLegState.BROKEN, 5)
            nursery.cancel_scope.cancel()
    assert runner.connects == 3
