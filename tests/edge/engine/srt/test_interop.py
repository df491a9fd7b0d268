"""Interop with Debian's srt-live-transmit (srt-tools 1.5.1) as the far end, on loopback.

Every direction, with and without a passphrase:

* our caller sends      → srt-live-transmit listener → UDP → our sink
* srt-live-transmit caller (fed by our UDP) → our listener receives
* our listener sends    → srt-live-transmit caller   → UDP → our sink
* srt-live-transmit listener (fed by our UDP) → our caller receives

plus rendezvous, a wrong passphrase, and a far end that restarts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from appliance.models.config import SrtLeg
from services.edge.engine.srt import binding as b
from services.edge.engine.srt.aio import SrtConnectError, srt_connect
from services.edge.engine.srt.runner import SrtLegRunner, SrtLegState, SrtPeerConnected
from tests.helpers.ports import free_udp_port

from .conftest import PASSPHRASE, SltProcess, UdpSink, message, wait_until

pytestmark = pytest.mark.interop

MESSAGES = 500
RATE_PPS = 500  # ~5 Mbit/s of 1316-byte messages
LATENCY_MS = 400
MAX_UDP_GAPS = 5  # 1 % of a run; more only when the kernel counted that many UDP drops


def slt_srt_uri(srt_port: int, mode: str, passphrase: str | None, **extra: str | int) -> str:
    params: dict[str, str | int] = {"mode": mode, "latency": LATENCY_MS, **extra}
    if passphrase:
        params["passphrase"] = passphrase
        params["pbkeylen"] = 16
    return f"srt://127.0.0.1:{srt_port}?" + "&".join(f"{k}={v}" for k, v in params.items())


def check_stream(received: list[bytes], last: int | None = None) -> list[int]:
    """Every message intact and in order; returns the indices missing after the first.

    SRT itself loses nothing on loopback (the legs run with 400 ms of latency so a
    loaded 2-core box cannot make packets too late), but the plain UDP hops to and
    from srt-live-transmit overflow a socket buffer when a process is starved for
    ~0.3 s; ``assert_gaps_explained`` accepts gaps only when the kernel counted them.
    """
    assert received, "nothing arrived"
    indices = [int.from_bytes(m[:4], "big") for m in received]
    for m, i in zip(received, indices, strict=True):
        assert m == message(i), i
    assert indices == sorted(set(indices)), "reordered or duplicated"
    if last is not None:
        assert indices[-1] == last
    present = set(indices)
    return [i for i in range(indices[0], indices[-1] + 1) if i not in present]


def udp_rcvbuf_errors() -> int:
    """The kernel's count of UDP datagrams dropped for a full receive buffer."""
    rows = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Udp:")]
    return int(rows[1][rows[0].index("RcvbufErrors")])


def assert_gaps_explained(gaps: list[int], rcvbuf_errors_before: int) -> None:
    if len(gaps) > MAX_UDP_GAPS:
        dropped = udp_rcvbuf_errors() - rcvbuf_errors_before
        assert dropped >= len(gaps), f"{len(gaps)} missing, kernel UDP drops {dropped}: {gaps[:20]}"


def last_index(received: list[bytes]) -> int:
    return int.from_bytes(received[-1][:4], "big") if received else -1


async def send_paced(send, count: int = MESSAGES, rate: int = RATE_PPS) -> None:  # type: ignore[no-untyped-def]
    start = trio.current_time()
    for i in range(count):
        send(message(i))
        if i % 10 == 9:
            await trio.sleep_until(start + (i + 1) / rate)


async def keep_sending(runner: SrtLegRunner, every_s: float = 0.002) -> None:
    """Numbered messages to ``runner`` until cancelled (survives the leg breaking and returning)."""
    i = 0
    while True:
        runner.send_nowait(message(i % 100_000))
        i += 1
        await trio.sleep(every_s)


async def feed_udp_until(port: int, done, rate: int = RATE_PPS, limit: int = 20 * RATE_PPS) -> int:  # type: ignore[no-untyped-def]
    """Send numbered datagrams to srt-live-transmit's UDP input until ``done()``; returns how many."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    with sock:
        start = trio.current_time()
        for i in range(limit):
            if done():
                return i
            await sock.sendto(message(i), ("127.0.0.1", port))
            if i % 10 == 9:
                await trio.sleep_until(start + (i + 1) / rate)
    return limit


@pytest.mark.parametrize("passphrase", [None, PASSPHRASE], ids=["clear", "encrypted"])
async def test_our_caller_sends_to_slt_listener(slt: SltProcess, udp_sink: UdpSink, passphrase: str | None) -> None:
    drops_before = udp_rcvbuf_errors()
    port = free_udp_port()
    sink = udp_sink
    slt.start(slt_srt_uri(port, "listener", passphrase), f"udp://127.0.0.1:{sink.port}")
    runner = SrtLegRunner(
        SrtLeg(
            mode="caller",
            local_addr="0.0.0.0:0",
            remote_addr=f"127.0.0.1:{port}",
            passphrase=passphrase,
            latency_ms=LATENCY_MS,
        )
    )
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.run)
            await nursery.start(runner.run)
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            await send_paced(runner.send_nowait)
            await wait_until(lambda: last_index(sink.datagrams) == MESSAGES - 1, 5)
            stats = runner.stats()
            nursery.cancel_scope.cancel()
    gaps = check_stream(sink.datagrams, last=MESSAGES - 1)
    assert len(sink.datagrams) + len(gaps) >= MESSAGES - 5  # everything sent once connected
    assert_gaps_explained(gaps, drops_before)
    assert runner.messages_dropped == 0
    assert stats["state"] == "connected" and stats["pkt_loss_total"] == 0


@pytest.mark.parametrize("passphrase", [None, PASSPHRASE], ids=["clear", "encrypted"])
async def test_slt_caller_sends_to_our_listener(slt: SltProcess, passphrase: str | None) -> None:
    drops_before = udp_rcvbuf_errors()
    port, udp_in = free_udp_port(), free_udp_port()
    got: list[bytes] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", passphrase=passphrase, latency_ms=LATENCY_MS),
        sink=lambda view: got.append(bytes(view)),
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            slt.start(f"udp://127.0.0.1:{udp_in}", slt_srt_uri(port, "caller", passphrase))
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            sent = await feed_udp_until(udp_in, lambda: len(got) >= 300)
            nursery.cancel_scope.cancel()
    assert len(got) >= 300, slt.log_text()
    gaps = check_stream(got)
    assert_gaps_explained(gaps, drops_before)
    assert sent - last_index(got) < 500  # only what was in flight: 400 ms of latency at 500/s, and slack


@pytest.mark.parametrize("passphrase", [None, PASSPHRASE], ids=["clear", "encrypted"])
async def test_our_listener_sends_to_slt_caller(slt: SltProcess, udp_sink: UdpSink, passphrase: str | None) -> None:
    drops_before = udp_rcvbuf_errors()
    port = free_udp_port()
    sink = udp_sink
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", passphrase=passphrase, latency_ms=LATENCY_MS)
    )
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.run)
            await nursery.start(runner.run)
            slt.start(slt_srt_uri(port, "caller", passphrase), f"udp://127.0.0.1:{sink.port}")
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            await send_paced(runner.send_nowait)
            await wait_until(lambda: last_index(sink.datagrams) == MESSAGES - 1, 5)
            nursery.cancel_scope.cancel()
    gaps = check_stream(sink.datagrams, last=MESSAGES - 1)
    assert len(sink.datagrams) + len(gaps) >= MESSAGES - 5  # everything sent once connected
    assert_gaps_explained(gaps, drops_before)


@pytest.mark.parametrize("passphrase", [None, PASSPHRASE], ids=["clear", "encrypted"])
async def test_slt_listener_sends_to_our_caller(slt: SltProcess, passphrase: str | None) -> None:
    drops_before = udp_rcvbuf_errors()
    port, udp_in = free_udp_port(), free_udp_port()
    slt.start(f"udp://127.0.0.1:{udp_in}", slt_srt_uri(port, "listener", passphrase))
    got: list[bytes] = []
    runner = SrtLegRunner(
        SrtLeg(
            mode="caller",
            local_addr="0.0.0.0:0",
            remote_addr=f"127.0.0.1:{port}",
            passphrase=passphrase,
            latency_ms=LATENCY_MS,
        ),
        sink=lambda view: got.append(bytes(view)),
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            await feed_udp_until(udp_in, lambda: len(got) >= 300)
            nursery.cancel_scope.cancel()
    assert len(got) >= 300, slt.log_text()
    assert_gaps_explained(check_stream(got), drops_before)


async def test_rendezvous_with_slt(slt: SltProcess, udp_sink: UdpSink) -> None:
    drops_before = udp_rcvbuf_errors()
    ours, theirs = free_udp_port(), free_udp_port()
    sink = udp_sink
    # srt-live-transmit: remote in the URI, its own port in `port=`
    slt.start(slt_srt_uri(ours, "rendezvous", None, port=theirs, adapter="127.0.0.1"), f"udp://127.0.0.1:{sink.port}")
    leg = SrtLeg(
        mode="rendezvous", local_addr=f"127.0.0.1:{ours}", remote_addr=f"127.0.0.1:{theirs}", latency_ms=LATENCY_MS
    )
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.run)
            with await srt_connect(leg) as sock:
                await send_paced(sock.send_nowait, count=200)
                await wait_until(lambda: last_index(sink.datagrams) == 199, 5)
            nursery.cancel_scope.cancel()
    assert_gaps_explained(check_stream(sink.datagrams, last=199), drops_before)


async def test_wrong_passphrase_against_slt_is_reported_quickly(slt: SltProcess) -> None:
    port = free_udp_port()
    slt.start(slt_srt_uri(port, "listener", PASSPHRASE), f"udp://127.0.0.1:{free_udp_port()}")
    await trio.sleep(0.3)  # let it bind (the caller's handshake retries cover a slow start)
    leg = SrtLeg(
        mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", passphrase="another-passphrase"
    )
    start = trio.current_time()
    with trio.fail_after(5), pytest.raises(SrtConnectError, match="wrong passphrase"):
        await srt_connect(leg)
    assert trio.current_time() - start < 3


async def test_our_caller_recovers_within_two_seconds_of_slt_restarting(slt: SltProcess, udp_sink: UdpSink) -> None:
    port = free_udp_port()
    sink = udp_sink
    uri = slt_srt_uri(port, "listener", PASSPHRASE)
    proc = slt.start(uri, f"udp://127.0.0.1:{sink.port}")
    runner = SrtLegRunner(
        SrtLeg(
            mode="caller",
            local_addr="0.0.0.0:0",
            remote_addr=f"127.0.0.1:{port}",
            passphrase=PASSPHRASE,
            peer_idle_timeout_secs=2,
        )
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.run)
            await nursery.start(runner.run)

            nursery.start_soon(keep_sending, runner)
            await wait_until(lambda: len(sink.datagrams) > 50, 5)

            slt.stop(proc)  # SIGTERM: the far end goes away
            await wait_until(lambda: runner.state is SrtLegState.BROKEN, 5)
            await trio.sleep(1.5)  # down long enough for failed attempts and backoff
            assert runner.state is SrtLegState.BROKEN

            before = len(sink.datagrams)
            slt.start(uri, f"udp://127.0.0.1:{sink.port}")  # ...and comes back
            back = trio.current_time()
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            connected_after = trio.current_time() - back
            await wait_until(lambda: len(sink.datagrams) > before + 20, 5)
            flowing_after = trio.current_time() - back
            nursery.cancel_scope.cancel()
    # "back" is when the process was started; it also needs time to bind its port.
    assert connected_after < 2.0, (connected_after, slt.log_text())
    assert flowing_after < 2.0
    assert runner.connects == 2


async def test_our_caller_recovers_after_slt_is_killed_and_restarted(slt: SltProcess, udp_sink: UdpSink) -> None:
    # SIGKILL sends no shutdown: our side sees the break only when the peer idle timeout
    # (1 s here) expires, then reconnects at once.
    port = free_udp_port()
    sink = udp_sink
    uri = slt_srt_uri(port, "listener", None)
    proc = slt.start(uri, f"udp://127.0.0.1:{sink.port}")
    runner = SrtLegRunner(
        SrtLeg(mode="caller", local_addr="0.0.0.0:0", remote_addr=f"127.0.0.1:{port}", peer_idle_timeout_secs=1)
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.run)
            await nursery.start(runner.run)

            nursery.start_soon(keep_sending, runner)
            await wait_until(lambda: len(sink.datagrams) > 50, 5)
            slt.kill(proc)
            await trio.sleep(0.3)
            before = len(sink.datagrams)
            slt.start(uri, f"udp://127.0.0.1:{sink.port}")
            back = trio.current_time()
            await wait_until(lambda: runner.connects == 2, 6)
            await wait_until(lambda: len(sink.datagrams) > before + 20, 5)
            flowing_after = trio.current_time() - back
            nursery.cancel_scope.cancel()
    # Without the runner's watchdog libsrt itself needs ~5 s here (measured 5.1 s).
    assert flowing_after < 1.0 + 2.0, (flowing_after, slt.log_text())  # idle timeout + the 2 s bar
    assert runner.connects == 2


async def test_our_input_takes_a_restarted_slt_caller_after_it_was_killed(slt: SltProcess) -> None:
    # The old connection is not timed out yet (peer idle timeout 30 s): the input listener
    # replaces the silent caller with the new one.
    port, udp_in = free_udp_port(), free_udp_port()
    got: list[bytes] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", latency_ms=LATENCY_MS),
        sink=lambda view: got.append(bytes(view)),
    )
    uri = slt_srt_uri(port, "caller", None)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            proc = slt.start(f"udp://127.0.0.1:{udp_in}", uri)
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            await feed_udp_until(udp_in, lambda: len(got) >= 50)
            slt.kill(proc)
            slt.start(f"udp://127.0.0.1:{udp_in}", uri)
            back = trio.current_time()
            await feed_udp_until(udp_in, lambda: runner.connects == 2)  # (400 ms still buffered)
            before = len(got)
            await feed_udp_until(udp_in, lambda: len(got) >= before + 50)
            flowing_after = trio.current_time() - back
            nursery.cancel_scope.cancel()
    assert runner.connects == 2
    assert flowing_after < 1.0 + 2.0 + LATENCY_MS / 1000, (flowing_after, slt.log_text())


async def test_packet_filter_fec_negotiates_with_slt(slt: SltProcess, udp_sink: UdpSink) -> None:
    # SRT's own FEC (packet_filter), configured on both ends: the connection is made with
    # the filter (libsrt rejects a caller whose filter conflicts) and carries data.
    drops_before = udp_rcvbuf_errors()
    port = free_udp_port()
    sink = udp_sink
    fec = "fec,cols:4,rows:2"
    slt.start(slt_srt_uri(port, "listener", None, packetfilter=fec), f"udp://127.0.0.1:{sink.port}")
    leg = SrtLeg(
        mode="caller",
        local_addr="0.0.0.0:0",
        remote_addr=f"127.0.0.1:{port}",
        packet_filter=fec,
        latency_ms=LATENCY_MS,
    )
    runner = SrtLegRunner(leg)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sink.run)
            await nursery.start(runner.run)
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            negotiated = str(runner._peers[0].getsockflag(b.SRTO_PACKETFILTER))
            await send_paced(runner.send_nowait, count=200)
            await wait_until(lambda: last_index(sink.datagrams) == 199, 5)
            nursery.cancel_scope.cancel()
    assert negotiated.startswith("fec,") and "cols:4" in negotiated, negotiated
    assert_gaps_explained(check_stream(sink.datagrams, last=199), drops_before)


async def test_slt_caller_stream_id_reaches_our_listener(slt: SltProcess) -> None:
    port, udp_in = free_udp_port(), free_udp_port()
    events: list[object] = []
    runner = SrtLegRunner(
        SrtLeg(mode="listener", local_addr=f"127.0.0.1:{port}", stream_id="#!::r=feed1,m=publish"),
        sink=lambda view: None,
        on_event=events.append,
    )
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            slt.start(f"udp://127.0.0.1:{udp_in}", slt_srt_uri(port, "caller", None, streamid="#!::r=feed1,m=publish"))
            await wait_until(lambda: runner.state is SrtLegState.CONNECTED, 5)
            nursery.cancel_scope.cancel()
    assert isinstance(events[0], SrtPeerConnected)
    assert events[0].stream_id == "#!::r=feed1,m=publish"
