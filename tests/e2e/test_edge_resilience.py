"""The edge survives its parts failing: a killed engine worker, a failed disk write."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers.edge import free_udp_port, running_edge, wait_for
from tests.helpers.media import UdpSink, rtp_stream, send_datagrams
from tests.helpers.procfs import engine_workers

pytestmark = pytest.mark.e2e


def flow(flow_id: str, port_in: int, port_out: int) -> dict[str, object]:
    return {
        "id": flow_id,
        "name": flow_id,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{port_in}"},
        "outputs": [{"type": "rtp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{port_out}"}],
    }


def test_a_killed_worker_takes_only_its_flows_down_and_they_come_back(tmp_path: Path) -> None:
    port_in, port_out = free_udp_port(), free_udp_port()
    with running_edge(tmp_path) as edge, edge.client() as api:
        assert api.post("/api/v1/flows", json=flow("w1", port_in, port_out)).status_code == 200
        workers = wait_for(lambda: [p for p in engine_workers(edge.process.pid)])
        os.kill(workers[0], signal.SIGKILL)
        # The API stays up; the flow goes to Error, then the control process restarts it.
        assert api.get("/health").status_code == 200
        wait_for(lambda: api.get("/api/v1/stats/w1").json()["data"]["state"] == "Error", timeout=10, interval=0.01)
        wait_for(lambda: api.get("/api/v1/stats/w1").json()["data"]["state"] == "Running", timeout=20)
        assert workers[0] not in engine_workers(edge.process.pid)
        with UdpSink(port_out) as sink:
            send_datagrams(("127.0.0.1", port_in), list(rtp_stream(50)), pps=1000)
            wait_for(lambda: len(sink.datagrams) == 50, timeout=5)


def test_a_failed_write_is_500_and_changes_nothing(tmp_path: Path) -> None:
    with running_edge(tmp_path) as edge, edge.client() as api:
        assert api.post("/api/v1/flows", json=flow("p1", free_udp_port(), free_udp_port())).status_code == 200
        config = edge.config_dir / "config.json"
        before = config.read_bytes()
        # A directory where the file's temp copy would be renamed to: the rename fails.
        config.unlink()
        config.mkdir()
        (config / "keep").write_text("x")
        try:
            r = api.post("/api/v1/flows", json=flow("p2", free_udp_port(), free_udp_port()))
            assert r.status_code == 500, r.text
            assert r.json()["success"] is False
            assert api.get("/api/v1/flows/p2").status_code == 404  # memory unchanged too
            assert api.delete("/api/v1/flows/p1").status_code == 500
            assert api.get("/api/v1/flows/p1").status_code == 200
        finally:
            (config / "keep").unlink()
            config.rmdir()
            config.write_bytes(before)
        assert api.post("/api/v1/flows", json=flow("p2", free_udp_port(), free_udp_port())).status_code == 200
