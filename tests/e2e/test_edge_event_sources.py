"""The events a running flow raises, end to end: a real mp-edge, real UDP and SRT peers.

Each transition is one event (interop.md 11): input receiving / lost / restored, a TR 101 290
alarm raised and cleared, a 2022-7 leg lost and restored, an SRT peer connected and gone.
Read through ``GET /api/v1/events`` and, for one of them, ``mp events --follow -o json``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import MP
from tests.helpers.edge import Edge, free_udp_port, running_edge, wait_for
from tests.helpers.media import VIDEO_PID, Pacer, TsSource, rtp_packet
from tests.helpers.srt import SLT, Slt, require

pytestmark = pytest.mark.e2e
MAX_PACKETS = 60_000  # every sender below stops by this count (and by its stop flag)


class Sender:
    """A paced RTP/TS sender thread to one or more destinations, until stopped (bounded)."""

    def __init__(self, dests: list[tuple[str, int]], pps: float = 500.0) -> None:
        import socket

        self.dests = dests
        self.pps = pps
        self.source = TsSource()
        self.seq = 0
        self.paused: set[int] = set()  # indices of dests not sent to
        self.cc_jump = threading.Event()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pacer = Pacer(self.pps)
        for _ in range(MAX_PACKETS):
            if self._stop.is_set():
                return
            if self.cc_jump.is_set():  # TS continuity broken, RTP sequence intact (TR 101 290 1.4)
                self.cc_jump.clear()
                self.source.cc[VIDEO_PID] = (self.source.cc[VIDEO_PID] + 5) & 0x0F
            datagram = rtp_packet(self.seq, self.seq * 900, self.source.datagram())
            self.seq += 1
            for index, dest in enumerate(self.dests):
                if index not in self.paused:
                    self._sock.sendto(datagram, dest)
            pacer.sent_one()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("event-sources")) as started:
        yield started


def events_of(edge: Edge, flow_id: str) -> list[dict[str, Any]]:
    with edge.client() as api:
        data = api.get("/api/v1/events").json()["data"]
    return [e for e in data["events"] if e.get("flow_id") == flow_id]


def wait_event(
    edge: Edge, flow_id: str, match: Callable[[dict[str, Any]], bool], timeout: float = 10.0
) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: next((e for e in events_of(edge, flow_id) if match(e)), None), timeout=timeout, interval=0.1
    )
    return found


def message(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: text in e["message"]


def create(edge: Edge, flow: dict[str, Any]) -> None:
    with edge.client() as api:
        r = api.post("/api/v1/flows", json=flow)
        assert r.status_code == 200, r.text


def test_input_lost_and_restored_and_a_tr101290_alarm_raised_then_cleared(edge: Edge) -> None:
    port = free_udp_port()
    follow = subprocess.Popen(
        [str(MP), "--url", edge.url, "events", "--follow", "--flow", "sig", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    create(edge, {"id": "sig", "name": "Signal", "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{port}"}})
    sender = Sender([("127.0.0.1", port)])
    try:
        wait_event(edge, "sig", message("flow started"))
        receiving = wait_event(edge, "sig", message("input receiving"))
        assert receiving["severity"] == "info" and receiving["category"] == "flow"
        sender.cc_jump.set()
        raised = wait_event(edge, "sig", message("alarm raised: continuity count error"))
        assert raised["severity"] == "critical" and raised["category"] == "analysis"
        assert raised["details"]["indicator"] == "cc_errors" and raised["details"]["priority"] == 1
    finally:
        sender.stop()
    lost = wait_event(edge, "sig", message("input lost"))
    assert lost["severity"] == "critical" and lost["id"] > raised["id"]
    sender = Sender([("127.0.0.1", port)])  # a stream again (its restart is one more CC jump, inside the alarm)
    try:
        restored = wait_event(edge, "sig", message("input restored"))
        assert restored["severity"] == "info" and restored["id"] > lost["id"]
        # The alarm clears once the indicator has not counted for the 10 s health window.
        cleared = wait_event(edge, "sig", message("alarm cleared: continuity count error"), timeout=20)
        assert cleared["severity"] == "info" and cleared["id"] > raised["id"]
    finally:
        sender.stop()
    # One event per transition: each of these exactly once.
    texts = [e["message"] for e in events_of(edge, "sig")]
    for text in ("input receiving", "input lost", "input restored", "flow started"):
        assert texts.count(text) == 1, texts
    assert sum("alarm raised: continuity" in t for t in texts) == 1
    # mp events --follow saw them too, one JSON object per line.
    follow.send_signal(signal.SIGINT)
    out, _ = follow.communicate(timeout=10)
    followed = [json.loads(line)["message"] for line in out.splitlines() if line.strip()]
    assert "input lost" in followed and "input restored" in followed and follow.returncode == 130


def test_a_2022_7_leg_lost_and_restored(edge: Edge) -> None:
    leg1, leg2 = free_udp_port(), free_udp_port()
    create(
        edge,
        {
            "id": "hitless",
            "name": "Hitless",
            "input": {
                "type": "rtp",
                "bind_addr": f"127.0.0.1:{leg1}",
                "redundancy": {"bind_addr": f"127.0.0.1:{leg2}"},
            },
        },
    )
    sender = Sender([("127.0.0.1", leg1), ("127.0.0.1", leg2)])
    try:
        wait_event(edge, "hitless", message("input receiving"))
        sender.paused.add(1)
        lost = wait_event(edge, "hitless", message("leg 2 lost"))
        assert lost["severity"] == "warning" and lost["category"] == "redundancy"
        sender.paused.clear()
        restored = wait_event(edge, "hitless", message("leg 2 restored"))
        assert restored["severity"] == "info" and restored["id"] > lost["id"]
        sender.paused.update({0, 1})
        both = wait_event(edge, "hitless", message("both legs lost"))
        assert both["severity"] == "critical"
    finally:
        sender.stop()


def test_an_srt_peer_connected_then_gone(edge: Edge, tmp_path: Path) -> None:
    require(SLT, "srt-live-transmit")
    srt_port, udp_in = free_udp_port(), free_udp_port()
    create(
        edge,
        {
            "id": "srtev",
            "name": "SRT events",
            "input": {"type": "srt", "mode": "listener", "local_addr": f"127.0.0.1:{srt_port}"},
        },
    )
    slt = Slt(tmp_path / "slt.log", f"udp://127.0.0.1:{udp_in}", f"srt://127.0.0.1:{srt_port}?mode=caller&latency=80")
    try:
        connected = wait_event(edge, "srtev", message("connected to"))
        assert connected["severity"] == "info" and connected["category"] == "srt"
    finally:
        slt.stop()
    gone = wait_event(edge, "srtev", message("disconnected"), timeout=20)
    assert gone["severity"] == "warning" and gone["category"] == "srt" and gone["id"] > connected["id"]
