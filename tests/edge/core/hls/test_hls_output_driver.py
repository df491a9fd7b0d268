"""``HlsOutputDriver`` in-process against the real HTTP sink: the ``failing`` state, its one
critical event and the recovery (``FAILING_AFTER_S`` shortened), and an unreachable server.
The e2e file covers the same driver inside a real mp-edge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import trio

from appliance.models.config import HlsOutput
from appliance.models.events import Event
from services.edge.engine.kinds import hls_output
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.kinds.hls_output import HlsOutputDriver
from tests.helpers.edge import free_port
from tests.helpers.http_sink import HttpSink

TOKEN = "driver-token-7f3a"


class FakeFlow:
    """What the driver uses of its flow: the id and the event bus."""

    flow_id = "f1"

    def __init__(self) -> None:
        self.events: list[Event] = []

    def publish(self, event: Event) -> None:
        self.events.append(event)


async def until(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Await ``predicate`` becoming truthy (checked every 20 ms), bounded by ``timeout``."""
    with trio.fail_after(timeout):
        while not (value := predicate()):
            await trio.sleep(0.02)
        return value


async def feed_forever(driver: HlsOutputDriver, ts: bytes) -> None:
    """The flow's side: the 6 s file in real time (40 ms of media per step), over and over."""
    step = len(ts) // 150 // 188 * 188
    while True:
        for i in range(0, len(ts), step):
            driver.offer(None, memoryview(ts[i : i + step]), trio.current_time())
            driver.flush()
            await trio.sleep(0.04)


def make_driver(url: str, flow: FakeFlow) -> HlsOutputDriver:
    config = HlsOutput(id="o1", name="o1", ingest_url=url, segment_duration_secs=1.0, auth_token=TOKEN)
    return HlsOutputDriver(config, cast(FlowPort, flow))


async def test_failing_then_recovered(h264_ts: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hls_output, "FAILING_AFTER_S", 2.0)
    failing = {"on": False}
    with HttpSink(fail=lambda path, index: failing["on"]) as sink:
        flow = FakeFlow()
        driver = make_driver(sink.url + "/x/", flow)
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.serve)
            nursery.start_soon(feed_forever, driver, h264_ts)
            await until(lambda: sink.latest("/x/index.m3u8"))
            assert driver.state == "active"
            failing["on"] = True
            await until(lambda: driver.state == "failing")
            failed_at = len(flow.events)
            await until(lambda: driver.segments_skipped >= failed_at + 2)  # failing: no more warnings
            failing["on"] = False
            await until(lambda: driver.state == "active")
            driver.close()
            nursery.cancel_scope.cancel()
    severities = [e.severity.value for e in flow.events]
    assert severities[-2:] == ["critical", "info"], severities
    assert set(severities[:-2]) == {"warning"} and len(severities) - 2 >= 2
    assert "HTTP 500" in flow.events[0].message and "seg_" in flow.events[0].message
    assert "nothing uploaded" in flow.events[-2].message
    assert all(e.flow_id == "f1" and e.details and e.details["output_id"] == "o1" for e in flow.events)
    assert all(TOKEN not in str(e) and "secret-server-detail" not in str(e) for e in flow.events)
    assert all(u.headers["authorization"] == f"Bearer {TOKEN}" for u in sink.all_uploads())
    counters = driver.counters()
    assert counters.packets_sent > 0 and counters.bytes_sent > 0 and counters.packets_dropped > 0


async def test_unreachable_server_names_the_error_not_the_secret(h264_ts: bytes) -> None:
    flow = FakeFlow()
    url = f"http://127.0.0.1:{free_port()}/live?key=querysecret"  # nobody listens there
    driver = make_driver(url, flow)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.serve)
        nursery.start_soon(feed_forever, driver, h264_ts)
        await until(lambda: flow.events)
        driver.close()
        nursery.cancel_scope.cancel()
    event = flow.events[0]
    assert event.severity.value == "warning"
    assert "ConnectError" in event.message and "seg_0.ts" in event.message
    assert "http://127.0.0.1:" in event.message and "querysecret" not in str(event)
