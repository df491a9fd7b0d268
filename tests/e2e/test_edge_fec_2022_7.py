"""SMPTE 2022-7 merge and 2022-1 FEC through a real mp-edge (interop.md 12)."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import pytest

from services.edge.core.fec import FecDecoder, FecEncoder
from tests.helpers.edge import free_udp_port, running_edge, wait_for
from tests.helpers.media import Pacer, UdpSink, rtp_stream
from tests.helpers.ports import free_port_block

pytestmark = pytest.mark.e2e


def send_paced(packets: list[tuple[bytes, int]], pps: float) -> None:
    pacer = Pacer(pps)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for data, port in packets:
            sock.sendto(data, ("127.0.0.1", port))
            pacer.sent_one()


def test_2022_7_merge_fills_independent_losses(tmp_path: Path) -> None:
    leg_a, leg_b, out = free_udp_port(), free_udp_port(), free_udp_port()
    flow = {
        "id": "h1",
        "name": "hitless",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{leg_a}", "redundancy": {"bind_addr": f"127.0.0.1:{leg_b}"}},
        "outputs": [{"type": "rtp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }
    packets = list(rtp_stream(2000, first_seq=65000))  # crosses the 16-bit wrap
    rng = random.Random(7)
    lost_a = {i for i in range(2000) if rng.random() < 0.05}
    lost_b = {i for i in range(2000) if rng.random() < 0.05} - lost_a  # every packet on >= 1 leg
    schedule = []
    for i, p in enumerate(packets):
        if i not in lost_a:
            schedule.append((p, leg_a))
        if i not in lost_b:
            schedule.append((p, leg_b))
    with running_edge(tmp_path) as edge, edge.client() as api, UdpSink(out) as sink:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
        send_paced(schedule, pps=4000)
        wait_for(lambda: len(sink.datagrams) >= 2000, timeout=10)
        time.sleep(0.3)
        stats = api.get("/api/v1/stats/h1").json()["data"]
    assert sink.datagrams == packets  # each packet exactly once, in order
    assert stats["input"]["packets_lost"] == 0
    assert stats["input"]["redundancy_switches"] > 0
    red = stats["media_analysis"]["redundancy"]
    assert red["standard"] == "SMPTE 2022-7" and red["lost_on_both"] == 0


def test_fec_decode_repairs_single_losses_bit_exact(tmp_path: Path) -> None:
    base, out = free_port_block(range(5)), free_udp_port()
    columns, rows = 5, 10
    flow = {
        "id": "fec1",
        "name": "fec",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{base}", "fec_decode": {"columns": columns, "rows": rows}},
        "outputs": [{"type": "rtp", "id": "o", "name": "o", "dest_addr": f"127.0.0.1:{out}"}],
    }
    packets = list(rtp_stream(columns * rows * 10))
    encoder = FecEncoder(columns, rows)
    schedule: list[tuple[bytes, int]] = []
    dropped = set()
    for i, p in enumerate(packets):
        encoder.on_media(memoryview(p), 0.0)
        # One loss in every row of every other matrix, each in a different column, so each
        # row and column loses one packet at most. (Not packet 0: a decoder anchors its
        # sequence on the first media packet it sees.)
        if (i % columns) == (i // columns + 1) % columns and i // (columns * rows) % 2 == 0:
            dropped.add(i)
        else:
            schedule.append((p, base))
        while (c := encoder.pop_column()) is not None:
            schedule.append((c, base + 2))
        while (r := encoder.pop_row()) is not None:
            schedule.append((r, base + 4))
    encoder.flush()
    while (c := encoder.pop_column()) is not None:
        schedule.append((c, base + 2))
    with running_edge(tmp_path) as edge, edge.client() as api, UdpSink(out) as sink:
        assert api.post("/api/v1/flows", json=flow).status_code == 200
        send_paced(schedule, pps=3000)
        wait_for(lambda: len(sink.datagrams) >= len(packets), timeout=10)
        stats = wait_for(
            lambda: (
                (s := api.get("/api/v1/stats/fec1").json()["data"])["input"]["packets_recovered_fec"] == len(dropped)
                and s
            )
        )
    assert sink.datagrams == packets  # the repaired stream is bit-identical to the source
    assert stats["input"]["packets_lost"] == 0
    assert stats["media_analysis"]["fec"]["recovered"] == len(dropped)


def test_fec_encode_output_is_decodable(tmp_path: Path) -> None:
    port_in, base_out = free_udp_port(), free_port_block(range(5))
    columns, rows = 4, 5
    flow = {
        "id": "enc1",
        "name": "enc",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{port_in}"},
        "outputs": [
            {
                "type": "rtp",
                "id": "o",
                "name": "o",
                "dest_addr": f"127.0.0.1:{base_out}",
                "fec_encode": {"columns": columns, "rows": rows},
            }
        ],
    }
    packets = list(rtp_stream(columns * rows * 6))
    with (
        running_edge(tmp_path) as edge,
        edge.client() as api,
        UdpSink(base_out) as media,
        UdpSink(base_out + 2) as col,
        UdpSink(base_out + 4) as row,
    ):
        assert api.post("/api/v1/flows", json=flow).status_code == 200
        send_paced([(p, port_in) for p in packets], pps=2000)
        wait_for(lambda: len(media.datagrams) >= len(packets), timeout=10)
        # The edge's count and what the sinks got agree once both have settled.
        wait_for(
            lambda: (
                api.get("/api/v1/stats/enc1").json()["data"]["outputs"][0]["fec_packets_sent"]
                == len(col.datagrams) + len(row.datagrams)
                > 0
            ),
            timeout=10,
        )
    # Our decoder rebuilds a dropped packet from the edge's FEC alone.
    decoder = FecDecoder(columns, rows)
    for i, p in enumerate(media.datagrams):
        if i != 27:
            decoder.on_media(memoryview(p), 0.0)
    for f in col.datagrams + row.datagrams:
        decoder.on_fec(memoryview(f), 0.0)
    decoder.flush()
    rebuilt = []
    while (p := decoder.pop_output()) is not None:
        rebuilt.append(p)
    assert decoder.counters.recovered >= 1
    assert packets[27] in rebuilt
