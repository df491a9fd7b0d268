"""IS-05 connection rules, sans-IO (interop.md 5): legs from configs, constraints, PATCH, config mapping, SDP."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import TypeAdapter

from appliance.models.config import FlowConfig, OutputConfig, RtpOutput
from services.edge.nmos import connection as c
from services.edge.nmos import ids
from services.edge.nmos.schemas import IS05, problems

NODE = uuid.UUID("0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00")
OUTPUT = TypeAdapter(OutputConfig)


def flow(**input_: Any) -> FlowConfig:
    return FlowConfig.model_validate(
        {
            "id": "f1",
            "name": "cam",
            "input": {"type": "rtp", "bind_addr": "0.0.0.0:5000", **input_},
            "outputs": [
                {"type": "rtp", "id": "o1", "name": "out", "dest_addr": "10.0.0.9:6000", "interface_addr": "10.0.0.1"},
                {"type": "srt", "id": "s1", "name": "srt", "mode": "listener", "local_addr": "0.0.0.0:9000"},
            ],
        }
    )


def redundant_output() -> RtpOutput:
    out = OUTPUT.validate_python(
        {
            "type": "rtp",
            "id": "o2",
            "name": "dup",
            "dest_addr": "239.1.1.1:5004",
            "interface_addr": "10.0.0.1",
            "redundancy": {"dest_addr": "239.2.1.1:5004", "interface_addr": "10.1.0.1"},
        }
    )
    assert isinstance(out, RtpOutput)
    return out


def test_endpoints_use_the_interop_ids_and_only_is05_transports() -> None:
    found = c.endpoints(NODE, [flow()])
    assert found[ids.sender_id(NODE, "f1", "o1")] == c.Endpoint("sender", ids.sender_id(NODE, "f1", "o1"), "f1", "o1")
    assert found[ids.receiver_id(NODE, "f1")].role == "receiver"
    assert len(found) == 2  # the srt output is IS-04 only (urn:x-mediaplane:transport:srt)
    webrtc = FlowConfig.model_validate(
        {
            "id": "w",
            "name": "w",
            "input": {"type": "webrtc"},
            "outputs": [{"type": "webrtc", "id": "e", "name": "e", "mode": "whep_server"}, *OTHER_OUTPUTS[:4]],
        }
    )
    udp = FlowConfig.model_validate({"id": "u", "name": "u", "input": {"type": "udp", "bind_addr": "0.0.0.0:5000"}})
    found = c.endpoints(NODE, [webrtc, udp])
    assert sorted(e.role for e in found.values()) == ["receiver", "sender"]
    assert ids.sender_id(NODE, "w", "e") in found and ids.receiver_id(NODE, "w") in found


def test_sender_legs_follow_the_table_and_2022_7_gives_two() -> None:
    out = flow().outputs[0]
    assert c.sender_legs(out, True) == [
        {
            "source_ip": "10.0.0.1",
            "destination_ip": "10.0.0.9",
            "source_port": 0,
            "destination_port": 6000,
            "rtp_enabled": True,
        }
    ]
    legs = c.sender_legs(redundant_output(), False)
    assert [leg["destination_ip"] for leg in legs] == ["239.1.1.1", "239.2.1.1"]
    assert [leg["source_ip"] for leg in legs] == ["10.0.0.1", "10.1.0.1"]
    assert all(leg["rtp_enabled"] is False for leg in legs)
    for legs in (c.sender_legs(out, True), c.sender_legs(flow().outputs[1], True)):
        body = {"receiver_id": None, "master_enable": True, "activation": c.idle_activation(), "transport_params": legs}
        assert problems(IS05, "sender-response-schema.json", body) == []


def test_receiver_legs_multicast_unicast_and_2022_7() -> None:
    mc = flow(bind_addr="239.0.0.5:5000", interface_addr="10.0.0.1", allowed_sources=["10.0.0.7"])
    assert c.receiver_legs(mc, True) == [
        {
            "source_ip": "10.0.0.7",
            "multicast_ip": "239.0.0.5",
            "interface_ip": "10.0.0.1",
            "destination_port": 5000,
            "rtp_enabled": True,
        }
    ]
    uc = flow(redundancy={"bind_addr": "127.0.0.1:5002"})
    legs = c.receiver_legs(uc, False)
    assert [(leg["multicast_ip"], leg["interface_ip"], leg["destination_port"]) for leg in legs] == [
        (None, "0.0.0.0", 5000),
        (None, "127.0.0.1", 5002),
    ]
    body = {
        "sender_id": None,
        "master_enable": True,
        "activation": c.idle_activation(),
        "transport_file": {"data": None, "type": None},
        "transport_params": legs,
    }
    assert problems(IS05, "receiver-response-schema.json", body) == []


def test_constraints_name_every_staged_key_per_leg() -> None:
    out = redundant_output()
    cons = c.sender_constraints(out)
    assert len(cons) == 2
    for leg, limits in zip(c.sender_legs(out, True), cons, strict=True):
        assert set(limits) == set(leg)
        assert limits["destination_port"] == {"minimum": 1, "maximum": 65535}
        assert problems(IS05, "constraints-schema-rtp.json", limits) == []
    rcons = c.receiver_constraints(flow(redundancy={"bind_addr": "127.0.0.1:5002"}))
    assert len(rcons) == 2 and set(rcons[0]) == set(c.receiver_legs(flow(), True)[0])
    whep = OUTPUT.validate_python(OTHER_OUTPUTS[5])
    pinned = c.sender_constraints(whep)[0]
    assert pinned == {"connection_uri": {"enum": [None, "auto"]}, "connection_authorization": {"enum": [False, "auto"]}}


def staged_sender(out: OutputConfig) -> dict[str, Any]:
    return {
        "receiver_id": None,
        "master_enable": True,
        "activation": c.idle_activation(),
        "transport_params": c.sender_legs(out, True),
    }


def test_patch_merges_and_rejects_without_echoing_values() -> None:
    out = flow().outputs[0]
    cons = c.sender_constraints(out)
    merged = c.merge_patch("sender", staged_sender(out), {"transport_params": [{"destination_port": 7000}]}, cons)
    assert merged["transport_params"][0]["destination_port"] == 7000
    assert merged["transport_params"][0]["destination_ip"] == "10.0.0.9"
    bad = [
        {"transport_params": [{"destination_port": 70000}]},  # schema maximum
        {"transport_params": [{}, {}]},  # wrong number of legs
        {"transport_params": [{"multicast_ip": "239.1.1.1"}]},  # a receiver key
        {"master_enable": "yes"},
        {"bogus": 1},
    ]
    for body in bad:
        with pytest.raises(c.PatchRejected) as info:
            c.merge_patch("sender", staged_sender(out), body, cons)
        assert "70000" not in str(info.value) and "yes" not in str(info.value)
    whep = OUTPUT.validate_python(OTHER_OUTPUTS[5])
    with pytest.raises(c.PatchRejected):  # a pinned kind: a change fails the enum
        c.merge_patch(
            "sender",
            staged_sender(whep),
            {"transport_params": [{"connection_uri": "ws://10.0.0.1/x"}]},
            c.sender_constraints(whep),
        )
    same = c.merge_patch(
        "sender", staged_sender(whep), {"transport_params": [{"connection_uri": None}]}, c.sender_constraints(whep)
    )
    assert same["transport_params"][0]["connection_uri"] is None


def test_activated_legs_map_back_to_the_config() -> None:
    out = flow().outputs[0]
    legs = c.sender_legs(out, True)
    legs[0].update(destination_ip="10.0.0.20", destination_port=6100)
    new = c.output_with_legs(out, legs)
    assert isinstance(new, RtpOutput)
    assert new.dest_addr == "10.0.0.20:6100" and new.interface_addr == "10.0.0.1" and new.bind_addr is None
    legs[0].update(source_port=7777)
    new = c.output_with_legs(out, legs)
    assert isinstance(new, RtpOutput) and new.bind_addr == "10.0.0.1:7777"
    auto = [{**c.sender_legs(out, True)[0], "destination_ip": "auto", "destination_port": "auto"}]
    assert c.output_with_legs(out, auto) == out
    dup = redundant_output()
    legs = c.sender_legs(dup, True)
    legs[1]["destination_port"] = 5006
    new_dup = c.output_with_legs(dup, legs)
    assert isinstance(new_dup, RtpOutput) and new_dup.redundancy is not None
    assert new_dup.redundancy.dest_addr == "239.2.1.1:5006" and new_dup.dest_addr == dup.dest_addr

    f = flow(allowed_sources=["10.0.0.7", "10.0.0.8"])
    rlegs = c.receiver_legs(f, True)
    rlegs[0].update(multicast_ip="239.0.0.9", interface_ip="10.0.0.1", destination_port=5010, source_ip="10.0.0.8")
    nf = c.flow_with_legs(f, rlegs)
    assert nf.input.bind_addr == "239.0.0.9:5010"  # type: ignore[union-attr]
    assert nf.input.interface_addr == "10.0.0.1"  # type: ignore[union-attr]
    assert nf.input.allowed_sources == ["10.0.0.8"]  # type: ignore[union-attr]
    rlegs = c.receiver_legs(f, True)
    rlegs[0].update(interface_ip="127.0.0.1", destination_port=5020, source_ip=None)
    nf = c.flow_with_legs(f, rlegs)
    assert nf.input.bind_addr == "127.0.0.1:5020" and nf.input.allowed_sources is None  # type: ignore[union-attr]
    assert nf.outputs == f.outputs


def test_sdp_of_a_unicast_and_a_2022_7_multicast_sender() -> None:
    out = flow().outputs[0]
    assert isinstance(out, RtpOutput)
    text = c.sender_sdp(out, ids.sender_id(NODE, "f1", "o1"), 3)
    lines = text.split("\r\n")
    assert lines[0] == "v=0" and lines[1].startswith("o=- ") and lines[1].endswith(" 3 IN IP4 10.0.0.1")
    assert "m=video 6000 RTP/AVP 33" in lines and "c=IN IP4 10.0.0.9" in lines
    assert "a=rtpmap:33 MP2T/90000" in lines and not any(line.startswith("a=source-filter") for line in lines)
    text = c.sender_sdp(redundant_output(), ids.sender_id(NODE, "f1", "o2"), 1)
    lines = text.split("\r\n")
    assert "a=group:DUP primary secondary" in lines
    assert [line for line in lines if line.startswith("m=")] == ["m=video 5004 RTP/AVP 33"] * 2
    assert "c=IN IP4 239.1.1.1/32" in lines
    assert "a=source-filter: incl IN IP4 239.1.1.1 10.0.0.1" in lines
    assert "a=source-filter: incl IN IP4 239.2.1.1 10.1.0.1" in lines
    assert lines.index("a=mid:primary") < lines.index("a=mid:secondary")


def test_state_stages_activates_and_schedules() -> None:
    f = flow()
    out = f.outputs[0]
    endpoint = c.endpoints(NODE, [f])[ids.sender_id(NODE, "f1", "o1")]
    state = c.ConnectionState()
    legs = c.sender_legs(out, True)
    staged = state.staged_body(endpoint, legs)
    assert staged["activation"] == c.idle_activation() and staged["transport_params"] == legs
    due, act = c.activation_times("activate_scheduled_relative", "2:500", 10_000_000_000)
    assert due == 12_000_000_500 and act == {
        "mode": "activate_scheduled_relative",
        "requested_time": "2:500",
        "activation_time": "12:500",
    }
    due, act = c.activation_times("activate_immediate", None, 5)
    assert act["requested_time"] is None and act["activation_time"] == "0:5"
    with pytest.raises(c.PatchRejected):
        c.activation_times("activate_scheduled_absolute", None, 5)
    state.activated(endpoint, {**staged, "master_enable": False}, act)
    active = state.active_body(endpoint, legs)
    assert active["master_enable"] is False and active["activation"] == act
    assert problems(IS05, "sender-response-schema.json", active) == []
    assert state.staged_body(endpoint, legs)["activation"]["mode"] is None


def test_a_scheduled_activation_being_applied_is_active_already() -> None:
    """From its due time a scheduled activation shows in ``active`` (AMWA IS-05-01 test_27/28),
    though applying it (a flow restart) takes a while; ``auto`` resolves to the current value."""
    out = flow().outputs[0]
    endpoint = c.endpoints(NODE, [flow()])[ids.sender_id(NODE, "f1", "o1")]
    state = c.ConnectionState()
    legs = c.sender_legs(out, True)
    due = {"mode": "activate_scheduled_relative", "requested_time": "0:200000000", "activation_time": "12:0"}
    body = {
        "receiver_id": "5b4f5b7e-0000-4000-8000-00000000cafe",
        "master_enable": True,
        "activation": due,
        "transport_params": [{**legs[0], "destination_port": 7100, "source_ip": "auto"}],
    }
    state.of(endpoint.id).applying = body
    shown = state.active_body(endpoint, legs)
    assert shown["activation"] == due and shown["receiver_id"] == body["receiver_id"]
    assert shown["transport_params"][0]["destination_port"] == 7100
    assert shown["transport_params"][0]["source_ip"] == legs[0]["source_ip"]
    assert problems(IS05, "sender-response-schema.json", shown) == []
    state.of(endpoint.id).applying = None
    assert state.active_body(endpoint, legs)["activation"] == c.idle_activation()


def test_addresses_must_be_ip_literals() -> None:
    out = flow().outputs[0]
    with pytest.raises(c.PatchRejected) as info:
        c.merge_patch(
            "sender",
            staged_sender(out),
            {"transport_params": [{"destination_ip": "not-an-ip"}]},
            c.sender_constraints(out),
        )
    assert info.value.texts == ["transport_params/0/destination_ip: not an IP address"]
    f = flow()
    staged = {
        "sender_id": None,
        "master_enable": True,
        "activation": c.idle_activation(),
        "transport_file": {"data": None, "type": None},
        "transport_params": c.receiver_legs(f, True),
    }
    for leg in ({"multicast_ip": "x"}, {"interface_ip": "10.0.0.300"}):
        with pytest.raises(c.PatchRejected):
            c.merge_patch("receiver", staged, {"transport_params": [leg]}, c.receiver_constraints(f))
    ok = c.merge_patch(
        "receiver",
        staged,
        {"transport_params": [{"interface_ip": "auto", "source_ip": None}]},
        c.receiver_constraints(f),
    )
    assert c.flow_with_legs(f, ok["transport_params"]) == f
    with pytest.raises(c.PatchRejected):
        c.merge_patch(
            "receiver",
            staged,
            {"transport_file": {"data": "v=0", "type": "application/sdp"}},
            c.receiver_constraints(f),
        )


def test_staged_starts_again_from_a_config_changed_elsewhere() -> None:
    f = flow()
    out = f.outputs[0]
    endpoint = c.endpoints(NODE, [f])[ids.sender_id(NODE, "f1", "o1")]
    state = c.ConnectionState()
    legs = c.sender_legs(out, True)
    staged = state.staged_body(endpoint, legs)
    staged["transport_params"][0]["destination_port"] = 7000
    state.stage(endpoint, staged)
    assert state.staged_body(endpoint, c.sender_legs(out, False))["transport_params"][0]["destination_port"] == 7000
    moved = OUTPUT.validate_python({**out.model_dump(mode="json"), "dest_addr": "10.0.0.9:6500"})
    assert state.staged_body(endpoint, c.sender_legs(moved, True))["transport_params"][0]["destination_port"] == 6500
    state.forget_unknown(set())
    assert state.states == {}


# The kinds IS-05 v1.1 has no transport for (the first four outputs, every input but webrtc and
# whep) are IS-04 only; the websocket ones are here, pinned.
OTHER_OUTPUTS = [
    {
        "type": "srt",
        "id": "a",
        "name": "a",
        "mode": "caller",
        "local_addr": "0.0.0.0:0",
        "remote_addr": "srt.example.net:9000",
    },
    {"type": "srt", "id": "b", "name": "b", "mode": "listener", "local_addr": "0.0.0.0:9001"},
    {"type": "rtmp", "id": "c", "name": "c", "dest_url": "rtmp://live.example.net/app", "stream_key": "k"},
    {"type": "hls", "id": "d", "name": "d", "ingest_url": "https://10.0.0.5:8443/in"},
    {"type": "webrtc", "id": "e", "name": "e", "whip_url": "https://whip.example.net/x", "bearer_token": "t"},
    {"type": "webrtc", "id": "f", "name": "f", "mode": "whep_server"},
]
OTHER_INPUTS = [
    {"type": "srt", "mode": "caller", "local_addr": "0.0.0.0:0", "remote_addr": "10.0.0.4:9000"},
    {"type": "srt", "mode": "listener", "local_addr": "0.0.0.0:9000"},
    {"type": "rtmp", "listen_addr": "0.0.0.0:1935"},
    {"type": "rtsp", "rtsp_url": "rtsp://cam.example.net/s"},
    {"type": "webrtc"},
    {"type": "whep", "whep_url": "https://10.0.0.3/whep"},
    {"type": "udp", "bind_addr": "239.1.1.1:5000"},
]


@pytest.mark.parametrize("data", OTHER_OUTPUTS[4:], ids=lambda d: f"{d['type']}-{d['id']}")
def test_other_sender_kinds_are_valid_pinned_and_never_auto(data: dict[str, Any]) -> None:
    out = OUTPUT.validate_python(data)
    legs = c.sender_legs(out, True)
    body = {"receiver_id": None, "master_enable": True, "activation": c.idle_activation(), "transport_params": legs}
    assert problems(IS05, "sender-response-schema.json", body) == []
    assert all("auto" not in leg.values() for leg in legs)
    cons = c.sender_constraints(out)
    assert [set(x) for x in cons] == [set(leg) for leg in legs]
    auto = {"transport_params": [{k: "auto" for k in leg if k != "rtp_enabled"} for leg in legs]}
    merged = c.merge_patch("sender", body, auto, cons)
    assert c.output_with_legs(out, merged["transport_params"]) == out
    with pytest.raises(c.PatchRejected):
        c.merge_patch("sender", body, {"transport_params": [{"connection_uri": "ws://10.9.9.9/"}]}, cons)


@pytest.mark.parametrize("data", OTHER_INPUTS[4:6], ids=lambda d: str(d["type"]))
def test_other_receiver_kinds_are_valid_and_never_auto(data: dict[str, Any]) -> None:
    f = FlowConfig.model_validate({"id": "f", "name": "f", "input": data})
    legs = c.receiver_legs(f, False)
    body = {
        "sender_id": None,
        "master_enable": True,
        "activation": c.idle_activation(),
        "transport_file": {"data": None, "type": None},
        "transport_params": legs,
    }
    assert problems(IS05, "receiver-response-schema.json", body) == []
    assert all("auto" not in leg.values() for leg in legs)
    assert [set(x) for x in c.receiver_constraints(f)] == [set(leg) for leg in legs]
