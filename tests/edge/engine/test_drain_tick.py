"""The worker's drain tick (services/edge/engine/drain.py) with real UDP sockets on loopback."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
import trio

from services.edge.engine.drain import BUSY_HIGH, MAX_TICK_S, SMALL_BATCH, TICK_S, DrainTick


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened = []
    for _ in range(2):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        opened.append(sock)
    yield opened
    for sock in opened:
        sock.close()


def reader(sock: socket.socket, got: list[bytes]) -> Callable[[], int]:
    def take() -> int:
        count = 0
        while True:
            try:
                got.append(sock.recv(2048))
            except BlockingIOError:
                return count
            count += 1

    return take


def send(sock: socket.socket, *payloads: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        for payload in payloads:
            tx.sendto(payload, sock.getsockname())


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not condition():
            await trio.sleep(0.005)


async def test_every_ready_socket_is_drained_and_a_failing_one_fails_alone(sockets: list[socket.socket]) -> None:
    tick = DrainTick()
    good: list[bytes] = []
    failure: list[BaseException] = []

    def broken() -> int:
        raise ValueError("a bug in one flow")

    async def serve_broken() -> None:
        try:
            await tick.serve(sockets[1], broken)
        except ValueError as exc:  # raised here, in the flow's own task
            failure.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick.run)
        nursery.start_soon(tick.serve, sockets[0], reader(sockets[0], good))
        nursery.start_soon(serve_broken)
        await until(lambda: tick.socket_count == 2)
        send(sockets[0], b"a", b"b")
        send(sockets[1], b"boom")
        await until(lambda: len(good) == 2 and len(failure) == 1)
        assert str(failure[0]) == "a bug in one flow"
        await until(lambda: tick.socket_count == 1)  # the failed socket left the tick
        send(sockets[0], b"c")  # the others go on
        await until(lambda: good == [b"a", b"b", b"c"])
        nursery.cancel_scope.cancel()
    assert tick.socket_count == 0


async def test_a_cancelled_socket_leaves_the_tick(sockets: list[socket.socket]) -> None:
    tick = DrainTick()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick.run)
        async with trio.open_nursery() as flow:  # one flow's tasks
            flow.start_soon(tick.serve, sockets[0], reader(sockets[0], got))
            await until(lambda: tick.socket_count == 1)
            flow.cancel_scope.cancel()
        assert tick.socket_count == 0
        nursery.cancel_scope.cancel()


def test_the_tick_grows_only_for_a_busy_worker_with_small_calls_and_shrinks_back() -> None:
    tick = DrainTick()
    assert tick.tick_s == 0.0  # immediate: one fat flow keeps its latency
    tick._adapt(busy_share=0.9, per_call=SMALL_BATCH * 4)  # busy, but the calls are full already
    assert tick.tick_s == 0.0
    tick._adapt(busy_share=BUSY_HIGH / 2, per_call=1)  # small calls, but not busy
    assert tick.tick_s == 0.0
    grown = []
    for _ in range(6):  # many modest flows on a busy worker
        tick._adapt(busy_share=0.9, per_call=1)
        grown.append(tick.tick_s)
    assert grown == [TICK_S, 2 * TICK_S, 4 * TICK_S, MAX_TICK_S, MAX_TICK_S, MAX_TICK_S]
    tick._adapt(busy_share=0.3, per_call=1)  # between the thresholds: it holds
    assert tick.tick_s == MAX_TICK_S
    shrunk = []
    for _ in range(5):  # the load went away
        tick._adapt(busy_share=0.05, per_call=1)
        shrunk.append(tick.tick_s)
    assert shrunk == [4 * TICK_S, 2 * TICK_S, TICK_S, 0.0, 0.0]
