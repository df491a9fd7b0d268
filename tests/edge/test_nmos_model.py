"""The IS-04 resource model (interop.md 5): ids, shapes, schema validity, versions, transports."""

from __future__ import annotations

import ipaddress
import re
import uuid
from pathlib import Path
from typing import Any

from appliance.models.config import AppConfig
from appliance.models.kinds import INPUT_KINDS, OUTPUT_KINDS
from services.edge.nmos import ids
from services.edge.nmos.model import HostInfo, Interface, Running, VersionTracker, build_resources
from services.edge.nmos.node_api import host_addresses, host_interfaces, primary_address
from services.edge.nmos.schemas import IS04, problems
from services.edge.nmos.tai import format_tai, tai_ns

NODE = uuid.UUID("0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00")
HOST = HostInfo(
    "edge-1", "192.0.2.10", 8080, (Interface("eth0", "02:42:AC:11:00:02"), Interface("eth1", "aa:bb:cc:dd:ee:ff"))
)
SCHEMA = {
    "self": "node.json",
    "devices": "device.json",
    "sources": "source.json",
    "flows": "flow.json",
    "senders": "sender.json",
    "receivers": "receiver.json",
}
BOOT = 1_700_000_000_000_000_000


def raw_config(device_name: str | None = "Studio edge") -> dict[str, Any]:
    return {
        "node_id": str(NODE),
        "device_name": device_name,
        "server": {},
        "flows": [
            {
                "id": "cam1",
                "name": "Camera 1",
                "input": {"type": "rtp", "bind_addr": "0.0.0.0:5000"},
                "outputs": [
                    {"id": "o-rtp", "name": "To studio", "type": "rtp", "dest_addr": "239.1.1.1:5004"},
                    {"id": "o-udp", "name": "To monitor", "type": "udp", "dest_addr": "192.0.2.20:6000"},
                ],
            },
            {
                "id": "cam2",
                "name": "Camera 2",
                "input": {"type": "srt", "mode": "listener", "local_addr": "0.0.0.0:9000"},
                "outputs": [
                    {
                        "id": "o-srt",
                        "name": "To cloud",
                        "type": "srt",
                        "mode": "caller",
                        "local_addr": "0.0.0.0:0",
                        "remote_addr": "192.0.2.30:9001",
                    },
                ],
            },
        ],
    }


def config(**kwargs: Any) -> AppConfig:
    return AppConfig.model_validate(raw_config(**kwargs))


RUNNING = Running(flows=frozenset({"cam1"}), outputs=frozenset({("cam1", "o-rtp")}))


def build(cfg: AppConfig | None = None, running: Running = RUNNING) -> Any:
    return build_resources(cfg or config(), running, HOST, version="1.2.3")


def test_ids_follow_interop_5() -> None:
    res = build()
    assert list(res.by_kind["self"]) == [str(NODE)]
    assert list(res.by_kind["devices"]) == [ids.device_id(NODE)]
    assert set(res.by_kind["sources"]) == {ids.source_id(NODE, "cam1"), ids.source_id(NODE, "cam2")}
    assert set(res.by_kind["flows"]) == {ids.flow_id(NODE, "cam1"), ids.flow_id(NODE, "cam2")}
    assert set(res.by_kind["receivers"]) == {ids.receiver_id(NODE, "cam1"), ids.receiver_id(NODE, "cam2")}
    assert set(res.by_kind["senders"]) == {
        ids.sender_id(NODE, "cam1", "o-rtp"),
        ids.sender_id(NODE, "cam1", "o-udp"),
        ids.sender_id(NODE, "cam2", "o-srt"),
    }
    for kind, resource_id, body in res.items():
        assert body["id"] == resource_id, kind


def test_every_stamped_body_validates_against_the_is04_schemas() -> None:
    res = VersionTracker(BOOT).stamp(build(), BOOT + 5)
    for kind, _, body in res.items():
        assert problems(IS04, SCHEMA[kind], body) == [], (kind, body)
        assert re.fullmatch(r"[0-9]+:[0-9]+", body["version"])
        assert body["tags"] == {}
    for kind in ("sources", "flows", "senders", "receivers", "devices"):
        assert problems(IS04, f"{kind}.json", list(res.by_kind[kind].values())) == []


def test_node_and_device_shapes() -> None:
    res = build()
    node = res.node
    assert node["label"] == "Studio edge"
    assert node["description"] == "mediaplane-edge v1.2.3"
    assert node["href"] == "http://192.0.2.10:8080/"
    assert node["hostname"] == "edge-1"
    assert node["api"] == {
        "versions": ["v1.3"],
        "endpoints": [{"host": "192.0.2.10", "port": 8080, "protocol": "http", "authorization": False}],
    }
    assert node["services"] == [] and node["caps"] == {}
    assert node["clocks"] == [{"name": "clk0", "ref_type": "internal"}]
    assert node["interfaces"] == [
        {"chassis_id": None, "port_id": "02-42-ac-11-00-02", "name": "eth0"},
        {"chassis_id": None, "port_id": "aa-bb-cc-dd-ee-ff", "name": "eth1"},
    ]
    (device,) = res.by_kind["devices"].values()
    assert device["type"] == "urn:x-nmos:device:generic"
    assert device["node_id"] == str(NODE)
    assert device["senders"] == list(res.by_kind["senders"])
    assert device["receivers"] == list(res.by_kind["receivers"])
    assert device["controls"] == [
        {
            "type": "urn:x-nmos:control:sr-ctrl/v1.1",
            "href": "http://192.0.2.10:8080/x-nmos/connection/v1.1/",
            "authorization": False,
        }
    ]
    # Without a device name the label is the host name.
    assert build(config(device_name=None)).node["label"] == "edge-1"


def test_ipv6_api_host_is_bracketed_in_urls() -> None:
    host = HostInfo("edge-1", "2001:db8::1", 8080)
    res = build_resources(config(), RUNNING, host, version="1")
    assert res.node["href"] == "http://[2001:db8::1]:8080/"
    assert res.node["api"]["endpoints"][0]["host"] == "2001:db8::1"
    assert res.node["interfaces"] == []
    assert problems(IS04, "node.json", {**res.node, "version": "1:0"}) == []


def test_source_flow_sender_receiver_shapes_and_subscriptions() -> None:
    res = build()
    source = res.by_kind["sources"][ids.source_id(NODE, "cam1")]
    assert source["label"] == "Camera 1"
    assert source["format"] == "urn:x-nmos:format:mux" and source["caps"] == {}
    assert source["parents"] == [] and source["clock_name"] is None
    assert source["device_id"] == ids.device_id(NODE)
    flow = res.by_kind["flows"][ids.flow_id(NODE, "cam1")]
    assert flow["media_type"] == "video/MP2T" and flow["format"] == "urn:x-nmos:format:mux"
    assert flow["source_id"] == source["id"] and flow["parents"] == []

    rtp = res.by_kind["senders"][ids.sender_id(NODE, "cam1", "o-rtp")]
    udp = res.by_kind["senders"][ids.sender_id(NODE, "cam1", "o-udp")]
    srt = res.by_kind["senders"][ids.sender_id(NODE, "cam2", "o-srt")]
    assert rtp["label"] == "To studio"
    assert rtp["flow_id"] == flow["id"]
    assert rtp["manifest_href"] == (
        f"http://192.0.2.10:8080/x-nmos/connection/v1.1/single/senders/{rtp['id']}/transportfile"
    )
    assert udp["manifest_href"] is None and srt["manifest_href"] is None
    assert rtp["interface_bindings"] == ["eth0"]
    assert rtp["subscription"] == {"receiver_id": None, "active": True}
    assert udp["subscription"] == {"receiver_id": None, "active": False}
    assert srt["subscription"]["active"] is False

    r1 = res.by_kind["receivers"][ids.receiver_id(NODE, "cam1")]
    r2 = res.by_kind["receivers"][ids.receiver_id(NODE, "cam2")]
    assert r1["caps"] == {"media_types": ["video/MP2T"]} and r1["format"] == "urn:x-nmos:format:mux"
    assert r1["subscription"] == {"sender_id": None, "active": True}
    assert r2["subscription"] == {"sender_id": None, "active": False}
    assert r1["label"] == "Camera 1" and r1["interface_bindings"] == ["eth0"]


def test_subscriptions_name_the_is05_active_peers() -> None:
    """IS-04 v1.3: a receiver's subscription.sender_id and a sender's receiver_id are the IS-05
    active ones (AMWA IS-05-02 checks them after each activation); a change bumps the version."""
    receiver_id, sender_id = ids.receiver_id(NODE, "cam1"), ids.sender_id(NODE, "cam1", "o-rtp")
    far_sender, far_receiver = "1b3e2c4a-0000-4000-8000-000000000001", "1b3e2c4a-0000-4000-8000-000000000002"
    peers = {receiver_id: far_sender, sender_id: far_receiver}
    tracker = VersionTracker(BOOT)
    before = tracker.stamp(build(), BOOT)
    after = tracker.stamp(build(running=Running(RUNNING.flows, RUNNING.outputs, peers)), BOOT + 10**9)
    receiver, sender = after.by_kind["receivers"][receiver_id], after.by_kind["senders"][sender_id]
    assert receiver["subscription"] == {"sender_id": far_sender, "active": True}
    assert sender["subscription"] == {"receiver_id": far_receiver, "active": True}
    assert receiver["version"] != before.by_kind["receivers"][receiver_id]["version"]
    assert problems(IS04, "receiver_mux.json", receiver) == []
    assert problems(IS04, "sender.json", sender) == []
    other = after.by_kind["receivers"][ids.receiver_id(NODE, "cam2")]
    assert other["subscription"]["sender_id"] is None


def test_transports_come_from_the_kind_registry() -> None:
    res = build()
    cfg = config()
    for flow in cfg.flows:
        receiver = res.by_kind["receivers"][ids.receiver_id(NODE, flow.id)]
        assert receiver["transport"] == INPUT_KINDS[flow.input.type].nmos_transport
        for output in flow.outputs:
            sender = res.by_kind["senders"][ids.sender_id(NODE, flow.id, output.id)]
            assert sender["transport"] == OUTPUT_KINDS[output.type].nmos_transport
    assert {s["transport"] for s in res.by_kind["senders"].values()} == {
        "urn:x-nmos:transport:rtp",
        "urn:x-mediaplane:transport:udp",
        "urn:x-mediaplane:transport:srt",
    }
    for kind in ("senders", "receivers"):  # a URN outside urn:x-nmos: is valid IS-04 (sender.json)
        for body in res.by_kind[kind].values():
            assert problems(IS04, f"{kind[:-1]}.json", {**body, "version": "1:0"}) == []
    # A WebRTC output is a websocket sender (interop.md 5 "Transports").
    raw = raw_config()
    raw["flows"][0]["outputs"].append({"id": "o-web", "name": "Browser", "type": "webrtc", "mode": "whep_server"})
    res = build(AppConfig.model_validate(raw))
    sender = res.by_kind["senders"][ids.sender_id(NODE, "cam1", "o-web")]
    assert sender["transport"] == "urn:x-nmos:transport:websocket"
    assert problems(IS04, "sender.json", {**sender, "version": "1:0"}) == []


def test_versions_are_the_boot_time_then_bump_only_on_change() -> None:
    tracker = VersionTracker(BOOT)
    boot = format_tai(tai_ns(BOOT))
    first = tracker.stamp(build(), BOOT + 10**9)
    assert {body["version"] for _, _, body in first.items()} == {boot}

    # The same state later: no version moves.
    same = tracker.stamp(build(), BOOT + 5 * 10**9)
    assert [b["version"] for _, _, b in same.items()] == [b["version"] for _, _, b in first.items()]

    # A stopped flow: its receiver and its running output's sender change, nothing else.
    later = BOOT + 7 * 10**9
    stopped = tracker.stamp(build(running=Running()), later)
    changed = {(k, i) for k, i, b in stopped.items() if b["version"] != boot}
    assert changed == {
        ("receivers", ids.receiver_id(NODE, "cam1")),
        ("senders", ids.sender_id(NODE, "cam1", "o-rtp")),
    }
    assert stopped.by_kind["receivers"][ids.receiver_id(NODE, "cam1")]["version"] == format_tai(tai_ns(later))

    # A new output: a new sender, and the device (its senders list); the node keeps its version.
    raw = raw_config()
    raw["flows"][1]["outputs"].append({"id": "o-2", "name": "Second", "type": "udp", "dest_addr": "192.0.2.9:7000"})
    grown = tracker.stamp(build(AppConfig.model_validate(raw), Running()), later + 10**9)
    new = format_tai(tai_ns(later + 10**9))
    sender = grown.by_kind["senders"][ids.sender_id(NODE, "cam2", "o-2")]
    assert sender["version"] == new
    assert grown.by_kind["devices"][ids.device_id(NODE)]["version"] == new
    assert grown.node["version"] == boot
    assert grown.by_kind["flows"][ids.flow_id(NODE, "cam2")]["version"] == boot


def test_stamp_leaves_the_input_alone() -> None:
    res = build()
    VersionTracker(BOOT).stamp(res, BOOT)
    assert all("version" not in body for _, _, body in res.items())


def test_host_interfaces_read_sys_class_net(tmp_path: Path) -> None:
    def iface(name: str, kind: str, mac: str) -> None:
        (tmp_path / name).mkdir()
        (tmp_path / name / "type").write_text(f"{kind}\n")
        (tmp_path / name / "address").write_text(f"{mac}\n")

    iface("lo", "772", "00:00:00:00:00:00")
    iface("eth1", "1", "AA:BB:CC:DD:EE:01")
    iface("eth0", "1", "aa:bb:cc:dd:ee:00")
    iface("tun0", "65534", "")  # no MAC: left out
    (tmp_path / "broken").mkdir()  # unreadable entries are skipped
    assert host_interfaces(tmp_path) == (
        Interface("eth0", "aa:bb:cc:dd:ee:00"),
        Interface("eth1", "aa:bb:cc:dd:ee:01"),
    )
    assert host_interfaces(tmp_path / "missing") == ()


def test_primary_address_is_an_ip_or_none() -> None:
    for family in (4, 6):
        found = primary_address(family)
        assert found is None or ipaddress.ip_address(found).version == family


def test_other_hosts_are_more_endpoints_once_each() -> None:
    host = HostInfo("edge-1", "192.0.2.10", 8080, other_hosts=("192.0.2.10", "198.51.100.7", "2001:db8::7"))
    node = build_resources(config(), RUNNING, host, version="1").node
    assert [e["host"] for e in node["api"]["endpoints"]] == ["192.0.2.10", "198.51.100.7", "2001:db8::7"]
    assert node["href"] == "http://192.0.2.10:8080/"
    assert problems(IS04, "node.json", {**node, "version": "1:0"}) == []


def test_host_addresses(tmp_path: Path) -> None:
    inet6 = tmp_path / "if_inet6"
    inet6.write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n"
        "20010db8000000000000000000000002 04 40 00 80     eth0\n"
    )
    assert host_addresses(6, inet6) == ["2001:db8::2"]
    assert host_addresses(6, tmp_path / "missing") == []
    for address in host_addresses(4):  # this host's: IPv4, neither loopback nor link-local
        parsed = ipaddress.ip_address(address)
        assert parsed.version == 4 and not parsed.is_loopback and not parsed.is_link_local


def test_interface_bindings_name_one_interface_per_leg() -> None:
    """IS-05: as many interface_bindings as transport_params legs (AMWA IS-05-02 test_12); each
    the interface holding the leg's local address, else the first one."""
    raw = raw_config()
    raw["flows"][0]["input"] = {
        "type": "rtp",
        "bind_addr": "239.1.1.1:5000",
        "interface_addr": "198.51.100.2",
        "redundancy": {"bind_addr": "239.2.1.1:5000", "interface_addr": "203.0.113.2"},
    }
    raw["flows"][0]["outputs"][0]["redundancy"] = {"dest_addr": "239.2.1.1:5004", "interface_addr": "203.0.113.2"}
    host = HostInfo(
        "edge-1",
        "192.0.2.10",
        8080,
        HOST.interfaces,
        address_interfaces={"198.51.100.2": "eth0", "203.0.113.2": "eth1", "127.0.0.1": "lo"},
    )
    res = build_resources(AppConfig.model_validate(raw), RUNNING, host, version="1")
    receiver = res.by_kind["receivers"][ids.receiver_id(NODE, "cam1")]
    sender = res.by_kind["senders"][ids.sender_id(NODE, "cam1", "o-rtp")]
    assert receiver["interface_bindings"] == ["eth0", "eth1"]
    assert sender["interface_bindings"] == ["eth0", "eth1"]  # no address on leg 1: the first interface
    srt = res.by_kind["senders"][ids.sender_id(NODE, "cam2", "o-srt")]
    assert srt["interface_bindings"] == ["eth0"]
    nobody = build_resources(AppConfig.model_validate(raw), RUNNING, HostInfo("e", "192.0.2.10", 8080), version="1")
    assert nobody.by_kind["receivers"][ids.receiver_id(NODE, "cam1")]["interface_bindings"] == []


def test_an_activation_moves_the_version_though_the_body_is_the_same() -> None:
    """AMWA IS-05-02 test_05/06: an activation increments the IS-04 version."""
    tracker = VersionTracker(BOOT)
    sender = ids.sender_id(NODE, "cam1", "o-rtp")
    first = tracker.stamp(build(), BOOT)
    tracker.touch("senders", sender)
    later = BOOT + 3 * 10**9
    second = tracker.stamp(build(), later)
    assert second.by_kind["senders"][sender]["version"] == format_tai(tai_ns(later))
    moved = {(k, i) for k, i, b in second.items() if b["version"] != first.by_kind[k][i]["version"]}
    assert moved == {("senders", sender)}
    third = tracker.stamp(build(), later + 10**9)  # touched once: it stays now
    assert third.by_kind["senders"][sender]["version"] == format_tai(tai_ns(later))
