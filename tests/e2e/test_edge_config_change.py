"""``update_config`` on a real engine: only what changed is touched (interop.md 6).

An in-process ``EdgeService`` (as ``mp-edge`` builds it, with its real worker process) runs
three RTP flows on loopback, all on one worker, with paced RTP going through each. The
change restarts flow 2 (a new name and a new destination) and hot-adds an output to flow
3; the sinks then show that flow 1 and flow 3's existing output lost not one packet
(RTP sequence numbers 0..n-1, each once, in order), that flow 3's new output and flow 2's
new destination receive, and the events show flow 2's stop and start and nothing for flow 1.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from appliance.config.store import EdgeConfigStore
from appliance.models.config import AppConfig
from appliance.models.stats import FlowState
from services.edge.service import EdgeService
from tests.helpers.edge import free_udp_port, write_config
from tests.helpers.media import UdpSink, rtp_stream

pytestmark = pytest.mark.e2e

PPS = 400  # per flow
SERVICE_EVENTS = {"flow starting", "flow started", "flow stopped", "flow updated", "flow created", "flow deleted"}
MAX_PACKETS = 8000  # a bound on each sender (20 s at PPS): the test stops them long before


def rtp_flow(flow_id: str, in_port: int, *outputs: tuple[str, int], **fields: Any) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{in_port}"},
        "outputs": [
            {"type": "rtp", "id": output_id, "name": output_id, "dest_addr": f"127.0.0.1:{port}"}
            for output_id, port in outputs
        ],
        **fields,
    }


def sequences(datagrams: list[bytes]) -> list[int]:
    return [int.from_bytes(d[2:4], "big") for d in datagrams]


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def send_rtp(packets: list[bytes], port: int, stop: trio.Event, sent: list[int]) -> None:
    """Paced ``packets`` (RTP seq 0, 1, ...) to 127.0.0.1:port until ``stop``.

    They are built beforehand: building them here would hold up the event loop the in-process
    edge shares with this task."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        start = trio.current_time()
        for index, packet in enumerate(packets):
            if stop.is_set():
                break
            await sock.sendto(packet, ("127.0.0.1", port))
            sent[0] = index + 1
            await trio.sleep_until(start + (index + 1) / PPS)


async def test_update_config_touches_only_what_changed(tmp_path: Path) -> None:
    ports = {name: free_udp_port() for name in ("in1", "in2", "in3")}
    sinks = {name: UdpSink(free_udp_port()) for name in ("s1", "s2", "s2b", "s3", "s3b")}
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    flows = [
        rtp_flow("f1", ports["in1"], ("o1", sinks["s1"].port)),
        rtp_flow("f2", ports["in2"], ("o1", sinks["s2"].port)),
        rtp_flow("f3", ports["in3"], ("o1", sinks["s3"].port)),
    ]
    write_config(tmp_path / "edge", {"server": {"listen_addr": "127.0.0.1"}, "flows": flows})
    store = EdgeConfigStore(tmp_path / "edge", machine_id_path=machine_id)
    service = EdgeService(
        store, store.load(), version="test", workers=1, log_level="warning", worker_nice=0, worker_realtime=0
    )
    packets = list(rtp_stream(MAX_PACKETS))
    sent = {flow_id: [0] for flow_id in ("f1", "f2", "f3")}
    stop = trio.Event()
    try:
        with trio.fail_after(25):
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                assert [service.state_of(f) for f in ("f1", "f2", "f3")] == [FlowState.RUNNING] * 3
                async with trio.open_nursery() as senders:
                    for flow_id, port in (("f1", "in1"), ("f2", "in2"), ("f3", "in3")):
                        senders.start_soon(send_rtp, packets, ports[port], stop, sent[flow_id])
                    for sink in ("s1", "s2", "s3"):
                        await until(lambda s=sink: len(sinks[s].datagrams) >= 200, 5, f"{sink} to receive")  # type: ignore[misc]

                    started_at = {f: service.lifecycle.status(f).started_at for f in ("f1", "f2", "f3")}
                    mark = service.events.last_id
                    new = [
                        rtp_flow("f1", ports["in1"], ("o1", sinks["s1"].port)),
                        rtp_flow("f2", ports["in2"], ("o1", sinks["s2b"].port), name="Flow f2 renamed"),
                        rtp_flow("f3", ports["in3"], ("o1", sinks["s3"].port), ("o2", sinks["s3b"].port)),
                    ]
                    body = AppConfig.model_validate({**service.public_config(), "flows": new})
                    public = await service.apply_config_change(body)
                    assert [f["id"] for f in public["flows"]] == ["f1", "f2", "f3"]

                    s2_at_change = len(sinks["s2"].datagrams)
                    await until(lambda: len(sinks["s2b"].datagrams) >= 200, 5, "flow 2's new destination")
                    await until(lambda: len(sinks["s3b"].datagrams) >= 200, 5, "flow 3's new output")
                    stop.set()

                # The senders are done: every packet sent must reach the untouched outputs.
                for sink, flow_id in (("s1", "f1"), ("s3", "f3")):
                    await until(
                        lambda s=sink, f=flow_id: len(sinks[s].datagrams) >= sent[f][0],  # type: ignore[misc]
                        3,
                        f"{sink} to drain",
                    )
                nursery.cancel_scope.cancel()
    finally:
        got = {name: sink.stop() for name, sink in sinks.items()}

    for sink, flow_id in (("s1", "f1"), ("s3", "f3")):
        assert sequences(got[sink]) == list(range(sent[flow_id][0])), f"{flow_id}: loss or reorder at {sink}"
    # The new output joined mid-stream and then saw every packet, in order.
    s3b = sequences(got["s3b"])
    assert s3b == list(range(s3b[0], s3b[0] + len(s3b)))
    assert len(got["s2"]) <= s2_at_change + 50  # the old destination was let go

    events = service.events.since(mark)
    # The service's own events (the worker's input and analysis events come and go with the media).
    texts = [(e.flow_id, e.message) for e in events if e.message in SERVICE_EVENTS or e.message.startswith("output '")]
    assert not [t for t in texts if t[0] == "f1"], texts
    assert [m for f, m in texts if f == "f2"] == ["flow updated", "flow stopped", "flow starting", "flow started"]
    assert [m for f, m in texts if f == "f3"] == ["output 'o2' added"], texts
    (last,) = [e for e in events if e.message == "config from the manager applied"]
    assert last.category == "config" and last.severity == "info"
    assert last.details is not None and last.details["flows_restarted"] == ["f2"]
    assert last.details["flows_outputs_changed"] == ["f3"]
    assert service.lifecycle.status("f1").started_at == started_at["f1"]
    assert service.lifecycle.status("f3").started_at == started_at["f3"]
    assert service.lifecycle.status("f2").started_at != started_at["f2"]
    persisted = store.read()
    assert [f.name for f in persisted.flows] == ["Flow f1", "Flow f2 renamed", "Flow f3"]
    assert [o.id for o in persisted.flows[2].outputs] == ["o1", "o2"]
