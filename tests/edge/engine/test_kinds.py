"""The kind registry: walked whole, so a kind declared in one place and missing in another fails here."""

from __future__ import annotations

import typing

import pytest
from pydantic import TypeAdapter

from appliance import errors
from appliance.http.envelope import describe_validation_error
from appliance.models.config import FlowConfig, InputConfig, OutputConfig
from appliance.models.kinds import (
    INPUT_KINDS,
    IS05_TRANSPORTS,
    NMOS_RTP,
    NMOS_WEBSOCKET,
    OUTPUT_KINDS,
    UNION_TAGS,
    ListenAddress,
    find_clash,
    flow_addresses,
    vendor_transport,
)
from services.edge.engine.kinds import INPUT_DRIVERS, OUTPUT_DRIVERS, check_supported


def _union_members(union: object) -> set[type]:
    inner = typing.get_args(union)[0]  # Annotated[Union[...], Field(discriminator)]
    return set(typing.get_args(inner))


def test_every_config_model_is_declared_once_with_its_type() -> None:
    for kinds, union in ((INPUT_KINDS, InputConfig), (OUTPUT_KINDS, OutputConfig)):
        assert {kind.model for kind in kinds.values()} == _union_members(union)
        for type_, kind in kinds.items():
            assert kind.type == type_ and kind.model.model_fields["type"].default == type_
            assert kind.nmos_transport in (NMOS_RTP, NMOS_WEBSOCKET, vendor_transport(type_))
            assert kind.label and kind.description
            assert kind.url_scheme in (None, type_)
            for field, _ in kind.url_query.values():
                assert field in kind.model.model_fields, (type_, field)
    assert set(INPUT_KINDS) | set(OUTPUT_KINDS) == UNION_TAGS


def test_interop_labels_and_transports() -> None:
    # interop.md 11: rtp and udp outputs both report `udp`; interop.md 5: webrtc/whep are websocket.
    assert OUTPUT_KINDS["rtp"].label == OUTPUT_KINDS["udp"].label == "udp"
    assert INPUT_KINDS["webrtc"].nmos_transport == INPUT_KINDS["whep"].nmos_transport == NMOS_WEBSOCKET
    # Only RTP is urn:x-nmos:transport:rtp; the kinds NMOS has no transport for carry their own URN
    # (IS-04 allows one outside urn:x-nmos:) and so stay out of IS-05 (docs/nmos.md "Transports").
    assert INPUT_KINDS["rtp"].nmos_transport == OUTPUT_KINDS["rtp"].nmos_transport == NMOS_RTP
    for kind in ("udp", "srt", "rtmp", "rtsp", "hls"):
        for table in (INPUT_KINDS, OUTPUT_KINDS):
            if kind in table:
                assert table[kind].nmos_transport == f"urn:x-mediaplane:transport:{kind}"
                assert table[kind].nmos_transport not in IS05_TRANSPORTS


def test_every_declared_kind_has_a_driver_and_one_without_answers_400(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(INPUT_DRIVERS) == set(INPUT_KINDS) == {"rtp", "udp", "srt", "rtmp", "rtsp", "webrtc", "whep"}
    assert set(OUTPUT_DRIVERS) == set(OUTPUT_KINDS) == {"rtp", "udp", "srt", "rtmp", "hls", "webrtc"}
    whip = FlowConfig.model_validate({"id": "f", "name": "F", "input": {"type": "webrtc"}})
    check_supported(whip)
    # A build whose engine lacks a declared kind refuses it with a 400, never a crash.
    monkeypatch.delitem(INPUT_DRIVERS, "webrtc")
    with pytest.raises(errors.InvalidInput, match="input type 'webrtc' is not supported"):
        check_supported(whip)


def test_union_tags_stay_out_of_error_paths() -> None:
    adapter = TypeAdapter(FlowConfig)
    with pytest.raises(Exception) as caught:
        adapter.validate_python({"id": "f", "name": "F", "input": {"type": "srt", "mode": "caller"}})
    text = describe_validation_error(caught.value)  # type: ignore[arg-type]
    assert "input.local_addr" in text and "input.srt" not in text


def flow(flow_id: str, input_: dict[str, object], outputs: list[dict[str, object]] | None = None) -> FlowConfig:
    return FlowConfig.model_validate({"id": flow_id, "name": flow_id, "input": input_, "outputs": outputs or []})


def rtp(addr: str, **extra: object) -> dict[str, object]:
    return {"type": "rtp", "bind_addr": addr, **extra}


@pytest.mark.parametrize(
    ("a", "b", "clash"),
    [
        ("127.0.0.1:5000", "127.0.0.1:5000", True),
        ("0.0.0.0:5000", "127.0.0.1:5000", True),
        ("127.0.0.1:5000", "0.0.0.0:5000", True),
        ("127.0.0.1:5000", "127.0.0.2:5000", False),
        ("127.0.0.1:5000", "127.0.0.1:5001", False),
        ("239.1.1.1:5000", "239.1.1.1:5000", False),  # multicast: every socket gets a copy
        ("239.1.1.1:5000", "0.0.0.0:5000", True),  # a wildcard bind takes the group's datagrams
        ("239.1.1.1:5000", "127.0.0.1:5000", False),
        ("[::]:5000", "127.0.0.1:5000", True),  # dual-stack wildcard
        ("[::1]:5000", "0.0.0.0:5000", False),
    ],
)
def test_the_clash_rule(a: str, b: str, clash: bool) -> None:
    found = find_clash([flow("a", rtp(a)), flow("b", rtp(b))], changed=["b"])
    assert (found is not None) is clash
    if found is not None:
        assert found.flow_id == "b" and found.owner == "a" and "'a'" in found.message()


def rtmp_in(addr: str = "0.0.0.0:1935", **extra: object) -> dict[str, object]:
    return {"type": "rtmp", "listen_addr": addr, **extra}


@pytest.mark.parametrize(
    ("a", "b", "clash"),
    [
        (rtmp_in(stream_key="k1"), rtmp_in(stream_key="k2"), False),  # one listener, two routes
        (rtmp_in(app="live"), rtmp_in(app="backup"), False),  # different apps, any key each
        (rtmp_in(stream_key="k1"), rtmp_in(stream_key="k1"), True),  # the same route twice
        (rtmp_in(), rtmp_in(stream_key="k2"), True),  # "any key" would take k2's publisher too
        (rtmp_in(stream_key="k1"), rtmp_in(stream_key="k2", tls=True), True),  # RTMP and RTMPS: two sockets
        (rtmp_in(stream_key="k1"), rtmp_in("127.0.0.1:1935", stream_key="k2"), True),  # wildcard and specific
        (rtmp_in("127.0.0.1:1935"), rtmp_in("127.0.0.2:1935"), False),
        (rtmp_in(stream_key="k1"), {"type": "srt", "mode": "listener", "local_addr": "0.0.0.0:1935"}, False),  # udp
    ],
)
def test_rtmp_inputs_share_a_listener_by_route(a: dict[str, object], b: dict[str, object], clash: bool) -> None:
    """interop 2.3: flows on one RTMP listen_addr share it when no publisher could match both."""
    assert (find_clash([flow("a", a), flow("b", b)], changed=["b"]) is not None) is clash


def test_legs_fec_ports_srt_and_output_binds_count() -> None:
    base = flow(
        "a", rtp("127.0.0.1:5000", fec_decode={"columns": 5, "rows": 5}, redundancy={"bind_addr": "127.0.0.1:7000"})
    )
    assert [(a.port, a.role) for a in flow_addresses(base)] == [
        (5000, "input"),
        (7000, "2022-7 leg"),
        (5002, "column FEC"),
        (5004, "row FEC"),
    ]
    for addr in ("127.0.0.1:5002", "127.0.0.1:5004", "0.0.0.0:7000"):
        assert find_clash([base, flow("b", rtp(addr))], ["b"]) is not None, addr
    srt_listener = flow("b", {"type": "srt", "mode": "listener", "local_addr": "127.0.0.1:5000"})
    assert find_clash([base, srt_listener], ["b"]) is not None
    srt_caller = flow("b", {"type": "srt", "mode": "caller", "local_addr": "0.0.0.0:0", "remote_addr": "127.0.0.1:9"})
    assert find_clash([base, srt_caller], ["b"]) is None
    bound = flow(
        "b",
        rtp("127.0.0.1:6000"),
        [{"type": "udp", "id": "o", "name": "o", "dest_addr": "127.0.0.1:9", "bind_addr": "127.0.0.1:5000"}],
    )
    clash = find_clash([base, bound], ["b"])
    assert clash is not None and "output 'o'" in clash.message()
    # A flow's own legs clash too (its second leg on its own media port).
    own = flow("c", rtp("127.0.0.1:8000", redundancy={"bind_addr": "127.0.0.1:8000"}))
    assert find_clash([own]) is not None


def test_the_owner_is_the_unchanged_flow_and_a_thousand_flows_check_fast() -> None:
    import time

    flows = [flow(f"f{i}", rtp(f"127.0.0.1:{10000 + i}")) for i in range(1024)]
    started = time.perf_counter()
    assert find_clash(flows) is None
    assert time.perf_counter() - started < 2.0  # measured ~0.05 s; generous for a loaded CI box
    newcomer = flow("new", rtp("0.0.0.0:10500"))
    clash = find_clash([newcomer, *flows], changed=["new"])
    assert clash is not None and clash.flow_id == "new" and clash.owner == "f500"
    assert str(ListenAddress("udp", "::1", 5, "input")) == "udp [::1]:5"
