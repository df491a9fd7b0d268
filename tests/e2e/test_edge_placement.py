"""Flows are placed on the engine worker with the least measured load, not the fewest flows (issue 23).

A real ``mp-edge --workers 2``: one flow gets ~2,000 datagrams a second, then three idle flows
are created one after the other (each once the workers have reported). By count they would
alternate between the two workers; by load all three go to the worker that carries nothing.
The running flow never moves. Each worker's load shows in ``GET /api/v1/system/diagnostics``
and in the metrics, and each flow's worker in its stats.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, create_flow, flow_stats, free_udp_port, running_edge, wait_for
from tests.helpers.media import UdpSink, rtp_stream, send_datagrams

pytestmark = pytest.mark.e2e

HEAVY_PPS = 2000.0
HEAVY_SECONDS = 30  # the sender's bound; the test stops it long before


def rtp_flow(flow_id: str, in_port: int, out_port: int) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": flow_id,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{in_port}"},
        "outputs": [{"type": "rtp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out_port}"}],
    }


def workers(edge: Edge) -> list[dict[str, Any]]:
    with edge.client() as api:
        report = api.get("/api/v1/system/diagnostics").json()
    return list(report["engine"]["workers"])


def test_flows_go_to_the_least_loaded_worker_and_stay_there(tmp_path: Path) -> None:
    heavy_in, out = free_udp_port(), free_udp_port()
    with running_edge(tmp_path, extra_args=["--workers", "2"]) as edge, UdpSink(out) as sink:
        create_flow(edge, rtp_flow("heavy", heavy_in, out))
        stop = threading.Event()

        def feed() -> None:
            packets = (p for p in rtp_stream(int(HEAVY_PPS * HEAVY_SECONDS)) if not stop.is_set())
            send_datagrams(("127.0.0.1", heavy_in), packets, pps=HEAVY_PPS)

        sender = threading.Thread(target=feed, daemon=True)
        sender.start()
        try:
            heavy_worker = flow_stats(edge, "heavy")["worker"]
            assert heavy_worker in (0, 1)
            wait_for(lambda: workers(edge)[heavy_worker]["pps"] > HEAVY_PPS / 2, timeout=15)
            idle_worker = 1 - heavy_worker
            assert len(sink.datagrams) > 0

            placed = []
            for index in range(3):
                flow_id = f"light{index}"
                create_flow(edge, rtp_flow(flow_id, free_udp_port(), free_udp_port()))
                placed.append(flow_stats(edge, flow_id)["worker"])
                # The next placement sees this flow measured: wait for its worker's report that
                # counts it (its stats leave "starting"; the load comes in the same message).
                # Without it the flow's estimate (the mean measured flow, the heavy one's 2,000/s)
                # still sits on the idle worker, and a tie goes by count, then index (CI, once).
                wait_for(lambda f=flow_id: flow_stats(edge, f)["input"]["state"] != "starting", timeout=10)
            # By count: idle, heavy, idle. By load: all on the worker that carries nothing.
            assert placed == [idle_worker] * 3, placed
            assert flow_stats(edge, "heavy")["worker"] == heavy_worker  # nothing running moved

            loads = workers(edge)
            assert [w["index"] for w in loads] == [0, 1] and all(w["alive"] and w["pid"] for w in loads)
            assert loads[heavy_worker]["flows"] == 1 and loads[idle_worker]["flows"] == 3
            assert loads[heavy_worker]["pps"] > loads[idle_worker]["pps"]
            assert 0 < loads[heavy_worker]["cpu"] < 1.5 and 0.0 <= loads[heavy_worker]["tick_ms"] <= 8.0
            metrics = httpx.get(edge.url + "/metrics", timeout=10).text
            assert f'mediaplane_edge_engine_worker_flows{{worker="{idle_worker}"}} 3.0' in metrics
            assert f'mediaplane_edge_engine_worker_input_packets_per_second{{worker="{heavy_worker}"}}' in metrics
            assert "mediaplane_edge_engine_worker_cpu_ratio" in metrics
        finally:
            stop.set()
            sender.join(timeout=10)
