"""The edge REST API end to end: a real mp-edge on loopback, real requests, real packets.

Covers every route of the edge interface §4 implemented so far and the status
codes of §3, §4 and §7 (auth has its own file).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, free_udp_port, running_edge, start_edge, wait_for
from tests.helpers.media import UdpSink, rtp_packet, rtp_stream, send_datagrams

pytestmark = pytest.mark.e2e


def rtp_flow(
    flow_id: str, in_port: int, *out_ports: int, kind: str = "rtp", enabled: bool = True, **extra: Any
) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "enabled": enabled,
        "input": {"type": kind, "bind_addr": f"127.0.0.1:{in_port}", **extra},
        "outputs": [
            {"type": "udp" if i % 2 == 0 else "rtp", "id": f"o{i}", "name": f"out {i}", "dest_addr": f"127.0.0.1:{p}"}
            for i, p in enumerate(out_ports)
        ],
    }


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("api")) as edge:
        yield edge


@pytest.fixture
def api(edge: Edge) -> Iterator[httpx.Client]:
    with edge.client() as client:
        yield client


def stats(api: httpx.Client, flow_id: str) -> dict[str, Any]:
    r = api.get(f"/api/v1/stats/{flow_id}")
    assert r.status_code == 200, r.text
    return r.json()["data"]


def assert_error(r: httpx.Response, status: int, contains: str = "") -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["success"] is False and "data" not in body
    assert contains.lower() in body["error"].lower(), body


# --------------------------------------------------------------------------- health and errors


def test_health_is_bare(api: httpx.Client) -> None:
    r = api.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["version"] == "0.1.0"
    assert set(body) == {"status", "version", "uptime_secs", "active_flows", "total_flows"}


def test_unknown_route_and_wrong_method_use_the_envelope(api: httpx.Client) -> None:
    assert_error(api.get("/api/v1/nothing"), 404, "not found")
    assert_error(api.delete("/health"), 405, "not allowed")
    assert_error(api.get("/api/v1/flows/a/start"), 405)


def test_bad_bodies(api: httpx.Client) -> None:
    good = rtp_flow("bad1", free_udp_port(), enabled=False)
    assert_error(
        api.post("/api/v1/flows", content=b"{not json", headers={"content-type": "application/json"}), 400, "malformed"
    )
    assert_error(
        api.post("/api/v1/flows", content=json.dumps(good), headers={"content-type": "text/plain"}), 400, "content-type"
    )
    assert_error(api.post("/api/v1/flows", json=[good]), 400, "object")
    assert_error(api.post("/api/v1/flows", json={**good, "colour": "red"}), 400, "colour: unknown key")
    assert_error(api.post("/api/v1/flows", json={**good, "name": "  "}), 400, "name")
    assert_error(api.post("/api/v1/flows", json={**good, "id": ""}), 400, "id")
    bad_addr = {**good, "input": {"type": "rtp", "bind_addr": "not-an-ip:5000"}}
    assert_error(api.post("/api/v1/flows", json=bad_addr), 400, "input.bind_addr")
    bad_fec = {**good, "input": {**good["input"], "fec_decode": {"columns": 30, "rows": 2}}}
    r = api.post("/api/v1/flows", json=bad_fec)
    assert_error(r, 400, "fec_decode.columns")
    assert "rows" in r.json()["error"]
    huge = {**good, "name": "x" * (1024 * 1024 + 10)}
    assert_error(api.post("/api/v1/flows", json=huge), 413)
    assert api.get("/api/v1/flows/bad1").status_code == 404  # nothing was saved


def test_an_error_never_echoes_the_rejected_value(api: httpx.Client) -> None:
    flow = rtp_flow("echo1", free_udp_port(), enabled=False)
    flow["outputs"] = [
        {
            "type": "srt",
            "id": "s",
            "name": "s",
            "mode": "caller",
            "local_addr": "0.0.0.0:0",
            "remote_addr": "127.0.0.1:9000",
            "passphrase": "short-ppx",
        }
    ]
    r = api.post("/api/v1/flows", json=flow)
    assert_error(r, 400, "passphrase")
    assert "short-ppx" not in r.text


def test_unread_body_does_not_hang_the_connection(edge: Edge) -> None:
    # quart-trio 0.12 pitfall: a response sent before the body is read could hang the next
    # request on the same keep-alive connection.
    with httpx.Client(base_url=edge.url, timeout=5) as client:
        for _ in range(3):
            r = client.post("/api/v1/flows/missing/start", content=b"x" * 200_000)
            assert r.status_code == 404
            assert client.get("/health").status_code == 200


# --------------------------------------------------------------------------- flows CRUD


def test_flow_crud(api: httpx.Client) -> None:
    flow = rtp_flow("crud1", free_udp_port(), free_udp_port(), enabled=False)
    r = api.post("/api/v1/flows", json=flow)
    assert r.status_code == 200, r.text
    created = r.json()["data"]
    assert created["id"] == "crud1" and created["media_analysis"] is True and created["outputs"][0]["dscp"] == 46
    assert_error(api.post("/api/v1/flows", json=flow), 409, "crud1")

    listed = api.get("/api/v1/flows").json()["data"]["flows"]
    assert {"id": "crud1", "name": "Flow crud1", "enabled": False, "input_type": "rtp", "output_count": 1} in listed

    assert api.get("/api/v1/flows/crud1").json()["data"] == created
    assert_error(api.get("/api/v1/flows/none"), 404, "none")

    # PUT: the path id wins over the body's.
    r = api.put("/api/v1/flows/crud1", json={**flow, "id": "other", "name": "Renamed"})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["id"] == "crud1" and r.json()["data"]["name"] == "Renamed"
    assert api.get("/api/v1/flows/other").status_code == 404
    assert_error(api.put("/api/v1/flows/none", json=flow), 404)
    assert_error(api.put("/api/v1/flows/crud1", json={**flow, "name": ""}), 400)

    assert api.get("/api/v1/stats/crud1").json()["data"]["state"] == "Idle"
    r = api.delete("/api/v1/flows/crud1")
    assert r.status_code == 200 and r.json() == {"success": True, "data": None}
    assert_error(api.delete("/api/v1/flows/crud1"), 404)
    assert_error(api.get("/api/v1/stats/crud1"), 404)


# --------------------------------------------------------------------------- lifecycle


def test_start_stop_restart_and_their_conflicts(api: httpx.Client) -> None:
    port = free_udp_port()
    assert api.post("/api/v1/flows", json=rtp_flow("life1", port, enabled=False)).status_code == 200
    assert_error(api.post("/api/v1/flows/life1/stop"), 409, "not running")
    assert api.post("/api/v1/flows/life1/start").json() == {"success": True, "data": None}
    assert stats(api, "life1")["state"] == "Running"
    r = api.post("/api/v1/flows/life1/start")
    assert_error(r, 409, "already running")
    assert "life1" in r.json()["error"]
    assert api.post("/api/v1/flows/life1/restart").status_code == 200
    assert stats(api, "life1")["state"] == "Running"
    assert api.post("/api/v1/flows/life1/stop").status_code == 200
    s = stats(api, "life1")
    assert s["state"] == "Stopped" and s["health"] == "Healthy" and s["tr101290"] is None
    assert s["input"]["packets_received"] == 0
    assert api.post("/api/v1/flows/life1/restart").status_code == 200  # restart of a stopped flow starts it
    assert stats(api, "life1")["state"] == "Running"
    for op in ("start", "stop", "restart"):
        assert_error(api.post(f"/api/v1/flows/none/{op}"), 404, "none")
    assert api.delete("/api/v1/flows/life1").status_code == 200


def test_a_start_that_cannot_bind_is_500_and_error_state(api: httpx.Client) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        assert api.post("/api/v1/flows", json=rtp_flow("busy1", port, enabled=False)).status_code == 200
        r = api.post("/api/v1/flows/busy1/start")
        assert_error(r, 500, "address already in use")
        s = stats(api, "busy1")
        assert s["state"] == "Error" and s["health"] == "Critical"
    # Once the port is free the flow starts from Error.
    assert api.post("/api/v1/flows/busy1/start").status_code == 200
    assert api.delete("/api/v1/flows/busy1").status_code == 200


# --------------------------------------------------------------------------- data plane


def test_packets_flow_to_every_output_with_real_counters(api: httpx.Client) -> None:
    port_in, port_udp, port_rtp = free_udp_port(), free_udp_port(), free_udp_port()
    assert api.post("/api/v1/flows", json=rtp_flow("fwd1", port_in, port_udp, port_rtp)).status_code == 200
    sent = list(rtp_stream(1500))
    with UdpSink(port_udp) as udp_sink, UdpSink(port_rtp) as rtp_sink:
        sender = threading.Thread(target=send_datagrams, args=(("127.0.0.1", port_in), sent, 2000))
        sender.start()
        # IAT and jitter cover the last second: read them while the stream runs.
        live = wait_for(
            lambda: (x := stats(api, "fwd1"))["iat"] is not None and x["input"]["packets_received"] > 600 and x
        )
        sender.join(10)
        wait_for(lambda: len(udp_sink.datagrams) >= 1500 and len(rtp_sink.datagrams) >= 1500, timeout=5)
    assert live["iat"]["min_us"] <= live["iat"]["avg_us"] <= live["iat"]["max_us"]
    assert 250 < live["iat"]["avg_us"] < 1000  # sent at 2000 pps: ~500 us apart
    assert live["pdv_jitter_us"] is not None
    assert live["input"]["bitrate_bps"] > 0 and live["health"] == "Healthy"
    # rtp output: the RTP packets forwarded unchanged; udp output: RTP stripped, 1316-byte TS.
    assert rtp_sink.datagrams == sent
    assert udp_sink.datagrams == [p[12:] for p in sent]
    s = wait_for(lambda: (x := stats(api, "fwd1"))["input"]["packets_received"] == 1500 and x)
    assert s["state"] == "Running"
    assert s["input"]["bytes_received"] == sum(len(p) for p in sent)
    assert s["input"]["packets_lost"] == 0 and s["input"]["packets_filtered"] == 0
    o_udp, o_rtp = s["outputs"]
    assert (o_udp["output_type"], o_rtp["output_type"]) == ("udp", "udp")  # interop.md 11
    assert o_udp["packets_sent"] == 1500 and o_udp["bytes_sent"] == 1500 * 1316
    assert o_rtp["packets_sent"] == 1500 and o_rtp["packets_dropped"] == 0
    tr = s["tr101290"]
    assert tr["ts_packets_analyzed"] == 1500 * 7
    assert tr["pat_count"] == 1500 and tr["cc_errors"] == 0 and tr["sync_byte_errors"] == 0
    assert s["media_analysis"]["protocol"] == "rtp" and s["media_analysis"]["program_count"] == 1
    assert api.delete("/api/v1/flows/fwd1").status_code == 200


def test_loss_filtering_and_cc_errors_are_counted(api: httpx.Client) -> None:
    port_in, port_out = free_udp_port(), free_udp_port()
    flow = rtp_flow("cnt1", port_in, port_out, allowed_payload_types=[33])
    assert api.post("/api/v1/flows", json=flow).status_code == 200
    packets = list(rtp_stream(200))
    dropped = {50, 51, 52, 120}  # 4 RTP packets lost; each gap also breaks the TS continuity counters
    stream = [p for i, p in enumerate(packets) if i not in dropped]
    junk = [b"not rtp at all", rtp_packet(500, 0, b"\x47" + bytes(100))]  # not RTP; RTP but not whole TS packets
    wrong_pt = [rtp_packet(201, 0, packets[0][12:], pt=96)]
    with UdpSink(port_out) as sink:
        send_datagrams(("127.0.0.1", port_in), stream + junk + wrong_pt, pps=2000)
        wait_for(lambda: len(sink.datagrams) >= len(stream), timeout=5)
    s = wait_for(lambda: (x := stats(api, "cnt1"))["input"]["packets_received"] == len(stream) + 3 and x)
    assert s["input"]["packets_lost"] == 4
    assert s["input"]["packets_filtered"] == 3
    assert s["outputs"][0]["packets_sent"] == len(stream)
    # TR 101 290 1.4 on each gap: the 1-datagram gap breaks PAT, PMT and video (3 errors); the
    # 3-datagram gap breaks PAT and PMT, but skips 15 video packets, so the 4-bit video
    # counter lands 16 ahead, on its expected value: that loss cannot be seen (2 errors).
    assert s["tr101290"]["cc_errors"] == 3 + 2
    assert s["health"] in ("Error", "Critical")  # priority-1 errors in the last 10 s
    assert api.delete("/api/v1/flows/cnt1").status_code == 200


def test_allowed_sources_filter_whole_bursts_and_mixed_ones(api: httpx.Client) -> None:
    """interop.md 2.3: only listed senders pass, whether a batch is steady (handled in place) or mixed."""
    from appliance.netio import BatchSender

    port_in, port_out = free_udp_port(), free_udp_port()
    assert (
        api.post("/api/v1/flows", json=rtp_flow("src1", port_in, port_out, allowed_sources=["127.0.0.1"])).status_code
        == 200
    )
    good = list(rtp_stream(300))
    # The other sender replays the allowed stream's next datagrams (same SSRC, the sequence
    # numbers due next), so only the source check can tell them apart.
    bad = good[100:160] + good[200:230]
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as allowed,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other,
        UdpSink(port_out, host="127.0.0.1") as sink,
    ):
        allowed.bind(("127.0.0.1", 0))
        other.bind(("127.0.0.2", 0))
        dest = ("127.0.0.1", port_in)
        to_allowed, to_other = BatchSender(allowed), BatchSender(other)
        # Whole bursts from each sender (each read as one steady batch), then the two interleaved.
        plan = [(to_allowed, good[0:100]), (to_other, bad[0:60]), (to_allowed, good[100:200])]
        for k in range(30):  # one datagram from each in turn: mixed batches go packet by packet
            plan += [(to_allowed, good[200 + k : 201 + k]), (to_other, bad[60 + k : 61 + k])]
        plan += [(to_allowed, good[230:300])]
        for sender, burst in plan:
            assert sender.send_batch(burst, dest) == len(burst)
            time.sleep(0.002)
        wait_for(lambda: len(sink.datagrams) >= 300, timeout=5)
    assert sink.datagrams == [g[12:] for g in good]  # every allowed datagram (a udp output: TS only), in order
    s = wait_for(lambda: (x := stats(api, "src1"))["input"]["packets_received"] == 390 and x)
    assert s["input"]["packets_filtered"] == 90
    assert s["input"]["packets_lost"] == 0
    assert s["outputs"][0]["packets_sent"] == 300
    assert api.delete("/api/v1/flows/src1").status_code == 200


def test_raw_udp_input_to_rtp_output_wraps_ts(api: httpx.Client) -> None:
    port_in, port_out = free_udp_port(), free_udp_port()
    flow = {
        "id": "raw1",
        "name": "raw",
        "input": {"type": "udp", "bind_addr": f"127.0.0.1:{port_in}"},
        "outputs": [{"type": "rtp", "id": "r", "name": "r", "dest_addr": f"127.0.0.1:{port_out}"}],
    }
    assert api.post("/api/v1/flows", json=flow).status_code == 200
    ts = [p[12:] for p in rtp_stream(100)]
    with UdpSink(port_out) as sink:
        send_datagrams(("127.0.0.1", port_in), [*ts, b"\x00" * 100], pps=2000)
        wait_for(lambda: len(sink.datagrams) >= 100, timeout=5)
    seqs = [int.from_bytes(p[2:4], "big") for p in sink.datagrams]
    assert [(s - seqs[0]) & 0xFFFF for s in seqs] == list(range(100))
    assert all(p[0] == 0x80 and p[1] & 0x7F == 33 and p[12:] == t for p, t in zip(sink.datagrams, ts, strict=True))
    s = wait_for(lambda: (x := stats(api, "raw1"))["input"]["packets_received"] == 101 and x)
    assert s["input"]["input_type"] == "udp" and s["input"]["packets_filtered"] == 1
    assert api.delete("/api/v1/flows/raw1").status_code == 200


def test_hot_add_and_remove_outputs_without_a_gap(api: httpx.Client) -> None:
    port_in, port_a, port_b = free_udp_port(), free_udp_port(), free_udp_port()
    assert api.post("/api/v1/flows", json=rtp_flow("hot1", port_in, port_a)).status_code == 200
    new_output = {"type": "rtp", "id": "ob", "name": "B", "dest_addr": f"127.0.0.1:{port_b}"}

    packets = list(rtp_stream(3000))
    with UdpSink(port_a) as sink_a, UdpSink(port_b) as sink_b:
        sender = threading.Thread(target=send_datagrams, args=(("127.0.0.1", port_in), packets, 2000))
        sender.start()
        time.sleep(0.4)
        r = api.post("/api/v1/flows/hot1/outputs", json=new_output)
        assert r.status_code == 200 and r.json()["data"]["id"] == "ob"
        assert_error(api.post("/api/v1/flows/hot1/outputs", json=new_output), 409, "ob")
        assert_error(api.post("/api/v1/flows/none/outputs", json=new_output), 404)
        assert_error(api.post("/api/v1/flows/hot1/outputs", json={**new_output, "id": "oc", "dest_addr": "x"}), 400)
        time.sleep(0.4)
        assert api.delete("/api/v1/flows/hot1/outputs/ob").json() == {"success": True, "data": None}
        assert_error(api.delete("/api/v1/flows/hot1/outputs/ob"), 404, "ob")
        assert_error(api.delete("/api/v1/flows/none/outputs/ob"), 404)
        sender.join(10)
        wait_for(lambda: len(sink_a.datagrams) >= 3000, timeout=5)
    # Output A saw every packet, in order, while B came and went.
    assert sink_a.datagrams == [p[12:] for p in packets]
    assert 100 < len(sink_b.datagrams) < 3000
    first = int.from_bytes(sink_b.datagrams[0][2:4], "big")
    assert [int.from_bytes(p[2:4], "big") for p in sink_b.datagrams] == list(
        range(first, first + len(sink_b.datagrams))
    )
    assert [o["id"] for o in api.get("/api/v1/flows/hot1").json()["data"]["outputs"]] == ["o0"]
    assert api.delete("/api/v1/flows/hot1").status_code == 200


def test_put_of_a_running_flow_restarts_it_with_the_new_config(api: httpx.Client) -> None:
    port_in, port_a, port_b = free_udp_port(), free_udp_port(), free_udp_port()
    assert api.post("/api/v1/flows", json=rtp_flow("put1", port_in, port_a)).status_code == 200
    assert api.put("/api/v1/flows/put1", json=rtp_flow("put1", port_in, port_b)).status_code == 200
    assert stats(api, "put1")["state"] == "Running"
    with UdpSink(port_a) as sink_a, UdpSink(port_b) as sink_b:
        send_datagrams(("127.0.0.1", port_in), list(rtp_stream(50)), pps=2000)
        wait_for(lambda: len(sink_b.datagrams) == 50, timeout=5)
    assert sink_a.datagrams == []
    # Disabling through PUT stops it.
    assert api.put("/api/v1/flows/put1", json=rtp_flow("put1", port_in, port_b, enabled=False)).status_code == 200
    assert stats(api, "put1")["state"] == "Stopped"
    assert api.delete("/api/v1/flows/put1").status_code == 200


# --------------------------------------------------------------------------- stats, metrics, WebSocket


def test_stats_lists_every_configured_flow(api: httpx.Client) -> None:
    a, b = free_udp_port(), free_udp_port()
    api.post("/api/v1/flows", json=rtp_flow("st1", a))
    api.post("/api/v1/flows", json=rtp_flow("st2", b, enabled=False))
    data = api.get("/api/v1/stats").json()["data"]
    assert set(data["system"]) == {"uptime_secs", "total_flows", "active_flows", "version"}
    by_id = {f["flow_id"]: f for f in data["flows"]}
    assert by_id["st1"]["state"] == "Running" and by_id["st2"]["state"] == "Idle"
    assert by_id["st2"]["input"]["input_type"] == "rtp" and by_id["st2"]["iat"] is None
    assert data["system"]["active_flows"] >= 1
    for flow_id in ("st1", "st2"):
        api.delete(f"/api/v1/flows/{flow_id}")


def test_metrics_exposition(api: httpx.Client) -> None:
    port_in = free_udp_port()
    api.post("/api/v1/flows", json=rtp_flow("m1", port_in, free_udp_port()))
    api.post("/api/v1/flows", json=rtp_flow("m2", free_udp_port(), enabled=False))
    send_datagrams(("127.0.0.1", port_in), list(rtp_stream(20)), pps=2000)
    wait_for(lambda: stats(api, "m1")["input"]["packets_received"] == 20)
    r = api.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    for line in (
        'mediaplane_edge_info{version="0.1.0"} 1.0',
        'mediaplane_edge_flow_input_packets_total{flow_id="m1"} 20.0',
        "# TYPE mediaplane_edge_flow_input_packets_lost counter",
        'mediaplane_edge_flow_input_packets_lost{flow_id="m1"} 0.0',
        'mediaplane_edge_flow_output_packets_dropped{flow_id="m1",output_id="o0"} 0.0',
        'mediaplane_edge_tr101290_ts_packets_total{flow_id="m1"} 140.0',
        "# TYPE mediaplane_edge_uptime_seconds gauge",
    ):
        assert line in text, line
    # Only running flows emit the interface's series; flow state and health cover every flow.
    m2 = [line for line in text.splitlines() if 'flow_id="m2"' in line]
    assert m2 and all(line.startswith(("mediaplane_edge_flow_state{", "mediaplane_edge_flow_health{")) for line in m2)
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    expected = {
        "mediaplane_edge_info",
        "mediaplane_edge_uptime_seconds",
        "mediaplane_edge_flows_total",
        "mediaplane_edge_flows_active",
        "mediaplane_edge_flow_input_packets_total",
        "mediaplane_edge_flow_input_bytes_total",
        "mediaplane_edge_flow_input_bitrate_bps",
        "mediaplane_edge_flow_input_packets_lost",
        "mediaplane_edge_flow_input_fec_recovered_total",
        "mediaplane_edge_flow_input_redundancy_switches_total",
        "mediaplane_edge_flow_input_packets_filtered",
        "mediaplane_edge_flow_pdv_jitter_us",
        "mediaplane_edge_flow_iat_avg_us",
        "mediaplane_edge_flow_output_packets_total",
        "mediaplane_edge_flow_output_bytes_total",
        "mediaplane_edge_flow_output_bitrate_bps",
        "mediaplane_edge_flow_output_packets_dropped",
        "mediaplane_edge_flow_output_fec_sent_total",
        "mediaplane_edge_tr101290_ts_packets_total",
        "mediaplane_edge_tr101290_sync_byte_errors_total",
        "mediaplane_edge_tr101290_cc_errors_total",
        "mediaplane_edge_tr101290_pat_errors_total",
        "mediaplane_edge_tr101290_pmt_errors_total",
        "mediaplane_edge_tr101290_tei_errors_total",
        "mediaplane_edge_tr101290_pcr_discontinuity_errors_total",
        "mediaplane_edge_tr101290_pcr_accuracy_errors_total",
        "mediaplane_edge_media_total_bitrate_bps",
    }
    assert expected <= names, expected - names
    for flow_id in ("m1", "m2"):
        api.delete(f"/api/v1/flows/{flow_id}")


async def test_websocket_pushes_about_one_frame_a_second(edge: Edge) -> None:
    import trio
    from trio_websocket import open_websocket_url

    with edge.client() as api:
        api.post("/api/v1/flows", json=rtp_flow("ws1", free_udp_port()))
    frames = []
    async with open_websocket_url(edge.url.replace("http", "ws") + "/api/v1/ws/stats") as ws:
        await ws.send_message("ignored")  # client messages are ignored
        with trio.fail_after(6):
            start = trio.current_time()
            for _ in range(4):
                frames.append(json.loads(await ws.get_message()))
            elapsed = trio.current_time() - start
    assert 2.0 < elapsed < 5.0  # the first frame at once, then ~1 s apart
    assert all(isinstance(f, list) for f in frames)
    assert "ws1" in {f["flow_id"] for f in frames[-1]}
    assert set(frames[-1][0]) >= {"flow_id", "state", "health", "input", "outputs", "tr101290"}
    with edge.client() as api:
        api.delete("/api/v1/flows/ws1")


# --------------------------------------------------------------------------- config


def test_get_put_and_reload_config(edge: Edge, api: httpx.Client) -> None:
    cfg = api.get("/api/v1/config").json()["data"]
    assert cfg["version"] == 1 and cfg["server"] == {"listen_addr": "0.0.0.0", "listen_port": 8080}
    port = free_udp_port()
    cfg["flows"] = [rtp_flow("cfg1", port), rtp_flow("cfg2", free_udp_port(), enabled=False)]
    r = api.put("/api/v1/config", json=cfg)
    assert r.status_code == 200, r.text
    assert [f["id"] for f in r.json()["data"]["flows"]] == ["cfg1", "cfg2"]
    assert stats(api, "cfg1")["state"] == "Running" and stats(api, "cfg2")["state"] == "Idle"
    duplicate = {**cfg, "flows": [rtp_flow("dup", free_udp_port()), rtp_flow("dup", free_udp_port())]}
    assert_error(api.put("/api/v1/config", json=duplicate), 400, "duplicate flow id")
    assert_error(api.put("/api/v1/config", json={**cfg, "version": 2}), 400, "version")
    assert [f["id"] for f in api.get("/api/v1/config").json()["data"]["flows"]] == ["cfg1", "cfg2"]

    # Reload picks up a hand edit of config.json.
    path = edge.config_dir / "config.json"
    on_disk = json.loads(path.read_text())
    on_disk["flows"][1]["name"] = "Edited by hand"
    path.write_text(json.dumps(on_disk))
    r = api.post("/api/v1/config/reload")
    assert r.status_code == 200, r.text
    assert r.json()["data"]["flows"][1]["name"] == "Edited by hand"
    assert stats(api, "cfg1")["state"] == "Running"

    # An invalid file is 400, an unparseable one 500; neither changes the running state.
    path.write_text(json.dumps({**on_disk, "flows": [{"id": "x"}]}))
    assert_error(api.post("/api/v1/config/reload"), 400)
    path.write_text("{ not json")
    assert_error(api.post("/api/v1/config/reload"), 500)
    assert stats(api, "cfg1")["state"] == "Running"
    path.write_text(json.dumps(on_disk))
    empty = {**cfg, "flows": []}
    assert api.put("/api/v1/config", json=empty).status_code == 200
    assert_error(api.get("/api/v1/stats/cfg1"), 404)


# --------------------------------------------------------------------------- persistence across restarts


def test_a_restart_keeps_every_flow(tmp_path: Path) -> None:
    in_port, out_port = free_udp_port(), free_udp_port()
    edge = start_edge(tmp_path / "edge")
    try:
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=rtp_flow("keep1", in_port, out_port)).status_code == 200
            assert api.post("/api/v1/flows", json=rtp_flow("keep2", free_udp_port(), enabled=False)).status_code == 200
            node_id = api.get("/api/v1/config").json()["data"]["node_id"]
    finally:
        assert edge.stop() == 0
    edge = start_edge(tmp_path / "edge")
    try:
        with edge.client() as api:
            assert [f["id"] for f in api.get("/api/v1/flows").json()["data"]["flows"]] == ["keep1", "keep2"]
            assert api.get("/api/v1/config").json()["data"]["node_id"] == node_id
            assert wait_for(lambda: stats(api, "keep1")["state"] == "Running")
            assert stats(api, "keep2")["state"] == "Idle"
            with UdpSink(out_port) as sink:
                send_datagrams(("127.0.0.1", in_port), list(rtp_stream(20)), pps=1000)
                wait_for(lambda: len(sink.datagrams) == 20, timeout=5)
    finally:
        edge.stop()
