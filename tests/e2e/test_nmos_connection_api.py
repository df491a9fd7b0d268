"""The IS-05 v1.1 Connection API of a real mp-edge (interop.md 5): routes, schemas, activations moving real RTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.edge.nmos.schemas import IS05, problems
from tests.helpers.edge import free_udp_port, running_edge, udp_port_bound, wait_for
from tests.helpers.media import UdpSink, rtp_stream, send_datagrams

pytestmark = pytest.mark.e2e
V = "/x-nmos/connection/v1.1"


def config(in_port: int, out_port: int) -> dict[str, Any]:
    return {
        "version": 1,
        "setup_enabled": False,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
        "flows": [
            {
                "id": "f1",
                "name": "cam",
                "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{in_port}"},
                "outputs": [{"type": "rtp", "id": "o1", "name": "out", "dest_addr": f"127.0.0.1:{out_port}"}],
            }
        ],
    }


def ok(api: httpx.Client, path: str, schema: str | None = None) -> Any:
    response = api.get(path)
    assert response.status_code == 200, (path, response.text)
    assert response.headers["access-control-allow-origin"] == "*"
    body = response.json()
    if schema is not None:
        assert problems(IS05, schema, body) == [], path
    return body


def arrives(sink: UdpSink, in_port: int, timeout: float = 5.0) -> bool:
    """Whether RTP sent to ``in_port`` reaches ``sink``: bursts of 50 until one lands or ``timeout``
    (a loaded host can take longer than one burst's 0.3 s to forward, or to finish a restart)."""
    before = len(sink.datagrams)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        send_datagrams(("127.0.0.1", in_port), rtp_stream(50), pps=1000)
        settle = time.monotonic() + 0.3
        while time.monotonic() < settle:
            if len(sink.datagrams) > before:
                _quiet(sink)  # the rest of the burst lands here, not in the caller's next check
                return True
            time.sleep(0.02)
    return False


def _quiet(sink: UdpSink, still: float = 0.15, limit: float = 3.0) -> None:
    """Until ``sink`` received nothing for ``still`` seconds (at most ``limit``)."""
    end = time.monotonic() + limit
    count, since = len(sink.datagrams), time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < still:
        time.sleep(0.02)
        if len(sink.datagrams) != count:
            count, since = len(sink.datagrams), time.monotonic()


def stays_away(sink: UdpSink, in_port: int) -> bool:
    """Whether RTP sent to ``in_port`` does NOT reach ``sink`` (one burst, then 0.5 s of silence:
    an absence can only be watched for a while)."""
    before = len(sink.datagrams)
    send_datagrams(("127.0.0.1", in_port), rtp_stream(50), pps=1000)
    time.sleep(0.5)
    return len(sink.datagrams) == before


def test_connection_api_routes_activations_and_media(tmp_path: Path) -> None:
    in1, in2, out1, out2, out3 = (free_udp_port() for _ in range(5))
    with (
        running_edge(tmp_path, config=config(in1, out1)) as edge,
        httpx.Client(base_url=edge.url, timeout=10) as api,
        UdpSink(out1) as sink1,
        UdpSink(out2) as sink2,
        UdpSink(out3) as sink3,
    ):
        # ---- listings, with and without the trailing slash
        assert ok(api, "/x-nmos/connection/") == ["v1.1/"]
        assert ok(api, "/x-nmos/connection") == ["v1.1/"]
        assert ok(api, f"{V}/") == ["bulk/", "single/"]
        assert ok(api, f"{V}/single/") == ok(api, f"{V}/single") == ["senders/", "receivers/"]
        senders = ok(api, f"{V}/single/senders/")
        receivers = ok(api, f"{V}/single/receivers")
        assert len(senders) == 1 and len(receivers) == 1
        sender, receiver = f"{V}/single/senders/{senders[0]}", f"{V}/single/receivers/{receivers[0]}"
        assert ok(api, sender) == ["constraints/", "staged/", "active/", "transportfile/", "transporttype/"]
        assert ok(api, receiver.rstrip("/")) == ["constraints/", "staged/", "active/", "transporttype/"]
        for base, role in ((sender, "sender"), (receiver, "receiver")):
            cons = ok(api, f"{base}constraints/", "constraints-schema.json")
            staged = ok(api, f"{base}staged", f"{role}-response-schema.json")
            active = ok(api, f"{base}active/", f"{role}-response-schema.json")
            assert ok(api, f"{base}transporttype/", "transporttype-response-schema.json") == "urn:x-nmos:transport:rtp"
            assert staged["transport_params"] == active["transport_params"]
            assert [set(leg) for leg in cons] == [set(leg) for leg in staged["transport_params"]]
            assert staged["activation"] == {"mode": None, "requested_time": None, "activation_time": None}
        assert active["transport_params"][0]["rtp_enabled"] is True
        sdp = api.get(f"{sender}transportfile/")
        assert sdp.status_code == 200 and sdp.headers["content-type"].startswith("application/sdp")
        assert "a=rtpmap:33 MP2T/90000" in sdp.text and f"m=video {out1} RTP/AVP 33" in sdp.text
        assert api.get(f"{receiver}transportfile/").status_code == 404

        # ---- errors, CORS preflight, bulk GET
        missing = api.get(f"{V}/single/senders/00000000-0000-4000-8000-000000000000/staged")
        assert missing.status_code == 404 and set(missing.json()) == {"code", "error", "debug"}
        assert missing.headers["access-control-allow-origin"] == "*"
        assert api.get(f"{V}/bulk/senders").status_code == 405
        pre = api.options(f"{sender}staged/")
        assert pre.status_code in (200, 204) and pre.headers["access-control-allow-origin"] == "*"
        before = ok(api, f"{sender}active/")
        bads: list[dict[str, Any]] = [
            {"transport_params": [{"destination_port": 70000}]},
            {"transport_params": [{}, {}]},
            {"x": 1},
        ]
        for bad in bads:
            response = api.patch(f"{sender}staged", json=bad)
            assert response.status_code == 400 and response.json()["code"] == 400
            assert "70000" not in response.text
        assert api.patch(f"{sender}staged", content=b"{nope").status_code == 400
        # an address another flow listens on: the config's clash rule (409 over REST) refuses it with 400
        other = free_udp_port()
        two = {"id": "f2", "name": "two", "enabled": False, "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{other}"}}
        assert api.post("/api/v1/flows", json=two).status_code == 200
        clash = api.patch(f"{receiver}staged", json={"transport_params": [{"destination_port": other}]})
        assert clash.status_code == 400 and "in use" in clash.text and str(other) not in clash.text
        assert api.delete("/api/v1/flows/f2").status_code == 200
        assert ok(api, f"{sender}active/") == before

        # ---- media flows to out1
        assert arrives(sink1, in1)

        # ---- stage only, then activate the sender on a new port
        staged_only = api.patch(f"{sender}staged", json={"transport_params": [{"destination_port": out2}]})
        assert staged_only.status_code == 200
        assert staged_only.json()["transport_params"][0]["destination_port"] == out2
        assert ok(api, f"{sender}active/")["transport_params"][0]["destination_port"] == out1
        response = api.patch(f"{sender}staged", json={"activation": {"mode": "activate_immediate"}})
        assert response.status_code == 200, response.text
        body = response.json()
        assert problems(IS05, "sender-response-schema.json", body) == []
        assert body["activation"]["mode"] == "activate_immediate" and body["activation"]["activation_time"]
        active = ok(api, f"{sender}active/", "sender-response-schema.json")
        assert active["transport_params"][0]["destination_port"] == out2
        assert active["activation"]["activation_time"] == body["activation"]["activation_time"]
        assert ok(api, f"{sender}staged/")["activation"]["mode"] is None
        count1 = len(sink1.datagrams)
        assert arrives(sink2, in1)
        assert len(sink1.datagrams) == count1  # nothing more at the old port
        assert f"m=video {out2} RTP/AVP 33" in api.get(f"{sender}transportfile").text
        assert f"127.0.0.1:{out2}" in (edge.config_dir / "config.json").read_text()  # persisted

        # ---- the receiver moves to a new port
        response = api.patch(
            f"{receiver}staged",
            json={"transport_params": [{"destination_port": in2}], "activation": {"mode": "activate_immediate"}},
        )
        assert response.status_code == 200, response.text
        assert ok(api, f"{receiver}active")["transport_params"][0]["destination_port"] == in2
        wait_for(lambda: udp_port_bound(in2), timeout=10)
        assert arrives(sink2, in2)

        # ---- scheduled relative activation: 202, 423 meanwhile, then applied
        response = api.patch(
            f"{sender}staged",
            json={
                "transport_params": [{"destination_port": out3}],
                "activation": {"mode": "activate_scheduled_relative", "requested_time": "1:0"},
            },
        )
        assert response.status_code == 202, response.text
        assert problems(IS05, "sender-response-schema.json", response.json()) == []
        pending = ok(api, f"{sender}staged")["activation"]
        assert pending["mode"] == "activate_scheduled_relative" and pending["requested_time"] == "1:0"
        locked = api.patch(f"{sender}staged", json={"master_enable": True})
        assert locked.status_code == 423 and locked.json()["code"] == 423
        wait_for(
            lambda: ok(api, f"{sender}active")["transport_params"][0]["destination_port"] == out3,
            timeout=10,
        )
        wait_for(lambda: ok(api, f"{sender}staged")["activation"]["mode"] is None, timeout=5)
        assert arrives(sink3, in2)

        # ---- a scheduled activation cancelled with mode null
        response = api.patch(
            f"{sender}staged",
            json={
                "transport_params": [{"destination_port": out1}],
                "activation": {"mode": "activate_scheduled_relative", "requested_time": "30:0"},
            },
        )
        assert response.status_code == 202
        assert api.patch(f"{sender}staged", json={"activation": {"mode": None}}).status_code == 200
        assert ok(api, f"{sender}staged")["activation"]["mode"] is None
        assert api.patch(f"{sender}staged", json={"master_enable": True}).status_code == 200
        assert ok(api, f"{sender}active")["transport_params"][0]["destination_port"] == out3

        # ---- scheduled absolute activation (TAI = UTC + 37 s), staged through the bulk route
        due = time.time_ns() + 37 * 10**9 + 10**9
        bulk = api.post(
            f"{V}/bulk/senders",
            json=[
                {
                    "id": senders[0].rstrip("/"),
                    "params": {
                        "transport_params": [{"destination_port": out1}],
                        "activation": {
                            "mode": "activate_scheduled_absolute",
                            "requested_time": f"{due // 10**9}:{due % 10**9}",
                        },
                    },
                },
                {"id": "00000000-0000-4000-8000-000000000000", "params": {}},
            ],
        )
        assert bulk.status_code == 200 and problems(IS05, "bulk-response-schema.json", bulk.json()) == []
        assert [item["code"] for item in bulk.json()] == [202, 404]
        assert ok(api, f"{sender}active")["transport_params"][0]["destination_port"] == out3
        wait_for(
            lambda: ok(api, f"{sender}active")["transport_params"][0]["destination_port"] == out1,
            timeout=10,
        )
        assert ok(api, f"{sender}active")["activation"]["mode"] == "activate_scheduled_absolute"
        assert arrives(sink1, in2)

        # ---- bulk
        bulk = api.post(f"{V}/bulk/receivers", json=[{"id": receivers[0].rstrip("/"), "params": {"sender_id": None}}])
        assert bulk.status_code == 200 and problems(IS05, "bulk-response-schema.json", bulk.json()) == []
        assert bulk.json()[0]["code"] == 200
        assert api.post(f"{V}/bulk/receivers", json={"not": "a list"}).status_code == 400

        # ---- IS-04 follows IS-05: the receiver's subscription names the sender it was given
        far_sender = "5b4f5b7e-0000-4000-8000-00000000cafe"
        response = api.patch(
            f"{receiver}staged", json={"sender_id": far_sender, "activation": {"mode": "activate_immediate"}}
        )
        assert response.status_code == 200, response.text
        node_receiver = ok(api, f"/x-nmos/node/v1.3/receivers/{receivers[0].rstrip('/')}")
        assert node_receiver["subscription"] == {"sender_id": far_sender, "active": True}
        assert ok(api, f"{receiver}active")["sender_id"] == far_sender


def test_failed_activation_rolls_back_and_master_enable_is_runtime(tmp_path: Path) -> None:
    in1, out1, out2 = free_udp_port(), free_udp_port(), free_udp_port()
    with (
        running_edge(tmp_path, config=config(in1, out1)) as edge,
        httpx.Client(base_url=edge.url, timeout=10) as api,
        UdpSink(out1) as sink,
        UdpSink(out2) as sink2,
    ):
        sender = f"{V}/single/senders/{ok(api, f'{V}/single/senders/')[0]}"
        receiver = f"{V}/single/receivers/{ok(api, f'{V}/single/receivers/')[0]}"
        saved = (edge.config_dir / "config.json").read_text()
        before = {base: ok(api, f"{base}active") for base in (sender, receiver)}
        immediate = {"mode": "activate_immediate"}
        # 192.0.2.1 (TEST-NET-1) is on no interface: binding there fails, so the activation does.
        for base, leg in ((receiver, {"interface_ip": "192.0.2.1"}), (sender, {"source_ip": "192.0.2.1"})):
            response = api.patch(f"{base}staged", json={"transport_params": [leg], "activation": immediate})
            assert response.status_code == 500, response.text
            assert response.json()["code"] == 500
            assert ok(api, f"{base}active") == before[base]
        assert (edge.config_dir / "config.json").read_text() == saved
        assert arrives(sink, in1)  # the flow and its output run as before

        # "auto" resolves to the current values: active never shows it (AMWA IS-05-01 11_02 / 12_02)
        for base, keys in (
            (sender, ("source_ip", "destination_ip", "source_port", "destination_port")),
            (receiver, ("interface_ip", "destination_port")),
        ):
            response = api.patch(
                f"{base}staged", json={"transport_params": [dict.fromkeys(keys, "auto")], "activation": immediate}
            )
            assert response.status_code == 200, response.text
            now = ok(api, f"{base}active")
            assert now["transport_params"] == before[base]["transport_params"]
            assert now["activation"]["mode"] == "activate_immediate"
        assert (edge.config_dir / "config.json").read_text() == saved

        # master_enable false: the output stops sending (config unchanged), then sends again
        off = api.patch(f"{sender}staged", json={"master_enable": False, "activation": immediate})
        assert off.status_code == 200, off.text
        active = ok(api, f"{sender}active", "sender-response-schema.json")
        assert active["master_enable"] is False and active["transport_params"][0]["rtp_enabled"] is False
        assert stays_away(sink, in1)
        # parked, it can still be moved (to out2), and it starts sending there when enabled again
        moved = api.patch(
            f"{sender}staged", json={"transport_params": [{"destination_port": out2}], "activation": immediate}
        )
        assert moved.status_code == 200, moved.text
        assert ok(api, f"{sender}active")["transport_params"][0]["rtp_enabled"] is False
        assert stays_away(sink2, in1) and stays_away(sink, in1)
        back = api.patch(
            f"{sender}staged",
            json={"master_enable": True, "transport_params": [{"destination_port": out1}], "activation": immediate},
        )
        assert back.status_code == 200, back.text
        assert arrives(sink, in1)
        assert (edge.config_dir / "config.json").read_text() == saved
        # the receiver: the flow stops and lets its port go, then listens again
        assert api.patch(f"{receiver}staged", json={"master_enable": False, "activation": immediate}).status_code == 200
        wait_for(lambda: not udp_port_bound(in1), timeout=10)
        assert ok(api, f"{receiver}active")["transport_params"][0]["rtp_enabled"] is False
        assert api.patch(f"{receiver}staged", json={"master_enable": True, "activation": immediate}).status_code == 200
        wait_for(lambda: udp_port_bound(in1), timeout=10)
        assert arrives(sink, in1)
        assert (edge.config_dir / "config.json").read_text() == saved
