"""--input / --output URLs to the API's input and output objects, checked by the shared model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from appliance.models.config import FlowConfig, OutputConfig
from cli.errors import UsageError
from cli.urls import next_output_id, parse_input, parse_output, validation_lines

INPUTS = [
    ("rtp://0.0.0.0:5000", {"type": "rtp", "bind_addr": "0.0.0.0:5000"}),
    ("rtp://:5000", {"type": "rtp", "bind_addr": "0.0.0.0:5000"}),
    (
        "udp://239.1.1.1:5000?interface_addr=10.0.0.5",
        {"type": "udp", "bind_addr": "239.1.1.1:5000", "interface_addr": "10.0.0.5"},
    ),
    (
        "rtp://239.1.1.1:5000?fec=10x5",
        {"type": "rtp", "bind_addr": "239.1.1.1:5000", "fec_decode": {"columns": 10, "rows": 5}},
    ),
    ("RTP://[::1]:5000", {"type": "rtp", "bind_addr": "[::1]:5000"}),
    ("srt://:9000", {"type": "srt", "mode": "listener", "local_addr": "0.0.0.0:9000"}),
    (
        "srt://0.0.0.0:9000?latency=200&passphrase=correct-horse-42",
        {
            "type": "srt",
            "mode": "listener",
            "local_addr": "0.0.0.0:9000",
            "latency_ms": 200,
            "passphrase": "correct-horse-42",
        },
    ),
    (
        "srt://203.0.113.7:9000?mode=caller&latency=120",
        {
            "type": "srt",
            "mode": "caller",
            "remote_addr": "203.0.113.7:9000",
            "local_addr": "0.0.0.0:0",
            "latency_ms": 120,
        },
    ),
    (
        "srt://relay.example:9000?streamid=%23!::r=cam1,m=request&pbkeylen=32&passphrase=correct-horse-42",
        {
            "type": "srt",
            "mode": "caller",
            "remote_addr": "relay.example:9000",
            "local_addr": "0.0.0.0:0",
            "stream_id": "#!::r=cam1,m=request",
            "aes_key_len": 32,
            "passphrase": "correct-horse-42",
        },
    ),
    (
        "srt://198.51.100.2:9000?mode=rendezvous",
        {"type": "srt", "mode": "rendezvous", "remote_addr": "198.51.100.2:9000", "local_addr": "0.0.0.0:9000"},
    ),
    (
        "rtmp://0.0.0.0:1935/live/s3cret-key",
        {"type": "rtmp", "listen_addr": "0.0.0.0:1935", "app": "live", "stream_key": "s3cret-key"},
    ),
    ("rtmp://:1936/studio", {"type": "rtmp", "listen_addr": "0.0.0.0:1936", "app": "studio", "stream_key": None}),
    (
        "rtmps://0.0.0.0/live/k?max_publishers=2",
        {
            "type": "rtmp",
            "listen_addr": "0.0.0.0:443",
            "app": "live",
            "stream_key": "k",
            "tls": True,
            "max_publishers": 2,
        },
    ),
    (
        "rtsp://adm%40in:p%3Ass@10.0.0.5:8554/Streaming/Channels/101?channel=1&transport=udp&timeout_secs=5",
        {
            "type": "rtsp",
            "rtsp_url": "rtsp://10.0.0.5:8554/Streaming/Channels/101?channel=1",
            "username": "adm@in",
            "password": "p:ss",
            "transport": "udp",
            "timeout_secs": 5,
        },
    ),
    ("rtsps://cam.example.net/live", {"type": "rtsp", "rtsp_url": "rtsps://cam.example.net/live"}),
]

OUTPUTS = [
    ("udp://239.1.1.1:5000", "out1", {"type": "udp", "id": "out1", "name": "out1", "dest_addr": "239.1.1.1:5000"}),
    (
        "rtp://10.2.0.9:6000?dscp=34&fec=10x10",
        "out2",
        {
            "type": "rtp",
            "id": "out2",
            "name": "out2",
            "dest_addr": "10.2.0.9:6000",
            "dscp": 34,
            "fec_encode": {"columns": 10, "rows": 10},
        },
    ),
    (
        "udp://127.0.0.1:5000?name=To%20studio",
        "a",
        {"type": "udp", "id": "a", "name": "To studio", "dest_addr": "127.0.0.1:5000"},
    ),
    (
        "srt://203.0.113.7:9000?mode=caller&latency=500&passphrase=correct-horse-42",
        "out-b",
        {
            "type": "srt",
            "id": "out-b",
            "name": "out-b",
            "mode": "caller",
            "remote_addr": "203.0.113.7:9000",
            "local_addr": "0.0.0.0:0",
            "latency_ms": 500,
            "passphrase": "correct-horse-42",
        },
    ),
    (
        "srt://:9001?mode=listener",
        "out3",
        {"type": "srt", "id": "out3", "name": "out3", "mode": "listener", "local_addr": "0.0.0.0:9001"},
    ),
    (
        "rtmps://live.example.net/app/s3cret-key?reconnect_delay_secs=2&name=YouTube",
        "out4",
        {
            "type": "rtmp",
            "id": "out4",
            "name": "YouTube",
            "dest_url": "rtmps://live.example.net/app",
            "stream_key": "s3cret-key",
            "reconnect_delay_secs": 2,
        },
    ),
    (
        "rtmp://10.0.0.7:1936/live/k",
        "out5",
        {"type": "rtmp", "id": "out5", "name": "out5", "dest_url": "rtmp://10.0.0.7:1936/live", "stream_key": "k"},
    ),
]


@pytest.mark.parametrize(("url", "expected"), INPUTS, ids=[u for u, _ in INPUTS])
def test_input_urls(url: str, expected: dict[str, Any]) -> None:
    got = parse_input(url)
    assert got == expected
    # and the shared model accepts it as a flow input
    FlowConfig.model_validate({"id": "f1", "name": "F", "input": got})


@pytest.mark.parametrize(("url", "output_id", "expected"), OUTPUTS, ids=[u for u, _, _ in OUTPUTS])
def test_output_urls(url: str, output_id: str, expected: dict[str, Any]) -> None:
    got = parse_output(url, output_id)
    assert got == expected
    TypeAdapter(OutputConfig).validate_python(got)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://0.0.0.0:5000", "scheme must be one of"),
        ("rtp://0.0.0.0", "has no port"),
        ("rtp://0.0.0.0:99999", "port must be 1-65535"),
        ("rtp://0.0.0.0:5000?fec=10", "COLUMNSxROWS"),
        ("rtp://0.0.0.0:5000?bogus=1", "unknown parameter 'bogus'"),
        ("srt://h:1?mode=push", "mode must be caller, listener or rendezvous"),
        ("srt://h:1?latency=soon", "whole number"),
        ("rtp://0.0.0.0:5000/path", "path is not allowed"),
    ],
)
def test_bad_input_urls_are_usage_errors(url: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_input(url)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("url", "message", "output"),
    [
        ("rtmp://0.0.0.0:1935/", "has no app", False),
        ("rtmp://0.0.0.0:1935/live/s3cret-key/more", "no more", False),
        ("rtmp://0.0.0.0:99999/live/s3cret-key", "port must be", False),
        ("rtmp://0.0.0.0:1935/live/s3cret-key?bogus=1", "unknown parameter", False),
        ("rtmp://live.example.net/app", "has no stream key", True),
        ("rtmp:///app/s3cret-key", "has no host", True),
    ],
)
def test_bad_rtmp_urls_never_repeat_the_key(url: str, message: str, output: bool) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_output(url, "o") if output else parse_input(url)
    assert "s3cret-key" not in str(info.value) and "s3cret-key" not in str(info.value.hint or "")


def test_an_output_needs_a_destination_host() -> None:
    with pytest.raises(UsageError, match="has no host"):
        parse_output("udp://:5000", "out1")


def test_unknown_parameter_hint_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as info:
        parse_output("udp://1.2.3.4:5?fec=1x4", "o")  # FEC is for rtp outputs only
    assert info.value.hint is not None and "dscp" in info.value.hint


def test_next_output_id() -> None:
    assert next_output_id(set()) == "out1"
    assert next_output_id({"out1", "out3"}) == "out2"


def test_validation_lines_name_the_field_and_never_echo_the_value() -> None:
    from pydantic import ValidationError

    body = {
        "id": "f1",
        "name": " ",
        "input": {
            "type": "srt",
            "mode": "caller",
            "local_addr": "0.0.0.0:0",
            "remote_addr": "1.2.3.4:9",
            "passphrase": "short-secret"[:5],
        },
    }
    with pytest.raises(ValidationError) as info:
        FlowConfig.model_validate(body)
    lines = validation_lines(info.value)
    assert any(line.startswith("name: ") for line in lines)
    assert any(line.startswith("input.passphrase: ") for line in lines)
    assert not any("short" in line for line in lines)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("rtsp://admin:s3cret-pw@/stream", "has no camera host"),
        ("rtsp://admin:s3cret-pw@cam/stream?timeout_secs=soon", "whole number"),
    ],
)
def test_bad_rtsp_urls_never_repeat_the_password(url: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_input(url)
    assert "s3cret-pw" not in str(info.value) and "s3cret-pw" not in str(info.value.hint or "")
