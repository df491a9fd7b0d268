"""Defects found by an attack campaign on the edge, each checked against a real mp-edge.

Deeply nested JSON on every JSON route, hostile config files at start, stale temp files
of interrupted writes, loose types, dot-only ids, control characters in the manager URL,
and WebSocket connections in the access log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, free_udp_port, running_edge, start_edge, wait_for

pytestmark = pytest.mark.e2e

DEPTH_MESSAGE = "JSON nested deeper than 64 levels"


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    # Debug level: the access log is written (docs/edge.md), and every traceback would show.
    with running_edge(tmp_path_factory.mktemp("hardening"), extra_args=["--log-level", "debug"]) as edge:
        with edge.client() as api:
            flow = {
                "id": "keep",
                "name": "Kept flow",
                "enabled": False,
                "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
            }
            assert api.post("/api/v1/flows", json=flow).status_code == 200
        yield edge


def assert_envelope_error(r: httpx.Response, status: int, contains: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False and contains.lower() in body["error"].lower(), body


# --------------------------------------------------------------------------- 1. nesting depth

JSON_ROUTES = [
    ("POST", "/api/v1/flows"),
    ("PUT", "/api/v1/flows/keep"),
    ("POST", "/api/v1/flows/keep/outputs"),
    ("PUT", "/api/v1/config"),
    ("POST", "/oauth/token"),
    ("POST", "/setup"),
]
NESTED_BODIES = {
    "arrays": "[" * 1000 + "]" * 1000,
    "objects": '{"a":' * 1000 + "1" + "}" * 1000,
    "unclosed": "[" * 1000,
    "65-deep": '{"id":' + "[" * 64 + "]" * 64 + "}",
}


@pytest.mark.parametrize("kind", list(NESTED_BODIES))
@pytest.mark.parametrize(("method", "path"), JSON_ROUTES)
def test_nested_json_is_400_on_every_json_route(edge: Edge, method: str, path: str, kind: str) -> None:
    with edge.client() as api:
        r = api.request(
            method, path, content=NESTED_BODIES[kind].encode(), headers={"content-type": "application/json"}
        )
    assert_envelope_error(r, 400, DEPTH_MESSAGE)
    assert "Traceback" not in edge.log()
    assert "RecursionError" not in edge.log()


def test_the_flow_survived_the_nested_bodies(edge: Edge) -> None:
    with edge.client() as api:
        flow = api.get("/api/v1/flows/keep").json()["data"]
    assert flow["outputs"] == [] and flow["name"] == "Kept flow"


def exit_of(edge: Edge) -> tuple[int, list[str]]:
    code = edge.process.wait(30)
    return code, [line for line in edge.log().splitlines() if line.strip()]


@pytest.mark.parametrize(
    "config_text",
    ["[" * 1000 + "]" * 1000, '{"version":1,"server":{},"device_name":' + "[" * 500 + "]" * 500 + "}"],
)
def test_a_nested_config_json_at_start_exits_2_with_one_line(tmp_path: Path, config_text: str) -> None:
    config_dir = tmp_path / "edge"
    config_dir.mkdir(mode=0o700)
    (config_dir / "config.json").write_text(config_text)
    code, lines = exit_of(start_edge(config_dir, wait=False))
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("mp-edge: ") and str(config_dir / "config.json") in lines[0]
    assert DEPTH_MESSAGE in lines[0] and "[[" not in lines[0]
    assert (config_dir / "config.json").read_text() == config_text


def test_a_nested_secrets_plaintext_at_start_exits_2_with_one_line(tmp_path: Path) -> None:
    config_dir = tmp_path / "edge"
    config_dir.mkdir(mode=0o700)
    (config_dir / "config.json").write_text(json.dumps({"version": 1, "server": {}}))
    (config_dir / "secrets.json").write_text('{"version":1,"server_auth":' + "[" * 1000 + "]" * 1000 + "}")
    code, lines = exit_of(start_edge(config_dir, wait=False))
    assert code == 2, lines
    assert len(lines) == 1 and "secrets.json" in lines[0] and DEPTH_MESSAGE in lines[0], lines


# --------------------------------------------------------------------------- 2. stale temp files


def test_stale_temp_files_are_removed_when_the_edge_starts(tmp_path: Path) -> None:
    config_dir = tmp_path / "edge"
    config_dir.mkdir(mode=0o700)
    stale = [config_dir / ".config.json.k9x_2abq.tmp", config_dir / ".secrets.json.0o0o0o0o.tmp"]
    unrelated = config_dir / ".config.json.notes"
    for path in [*stale, unrelated]:
        path.write_text("{}")
    with running_edge(tmp_path) as edge:
        assert not any(path.exists() for path in stale)
        assert unrelated.read_text() == "{}"
        assert "removed 2 stale temp files" in edge.log()


# --------------------------------------------------------------------------- 3. smaller defects


def test_a_string_or_bool_dscp_is_400(edge: Edge) -> None:
    output = {"type": "rtp", "id": "o1", "name": "out", "dest_addr": "127.0.0.1:6000"}
    with edge.client() as api:
        for dscp in ("46", True):
            assert_envelope_error(api.post("/api/v1/flows/keep/outputs", json={**output, "dscp": dscp}), 400, "dscp")
        assert api.get("/api/v1/flows/keep").json()["data"]["outputs"] == []


@pytest.mark.parametrize("bad_id", [".", "..", "..."])
def test_a_dot_only_id_is_400(edge: Edge, bad_id: str) -> None:
    flow = {"id": bad_id, "name": "Dots", "enabled": False, "input": {"type": "rtp", "bind_addr": "127.0.0.1:5999"}}
    output = {"type": "udp", "id": bad_id, "name": "out", "dest_addr": "127.0.0.1:6000"}
    with edge.client() as api:
        assert_envelope_error(api.post("/api/v1/flows", json=flow), 400, "id: ")
        assert_envelope_error(api.post("/api/v1/flows/keep/outputs", json=output), 400, "id: ")
        ids = {f["id"] for f in api.get("/api/v1/flows").json()["data"]["flows"]}
    assert ids == {"keep"}


def test_setup_refuses_a_manager_url_with_a_nul(edge: Edge) -> None:
    files = {name: (edge.config_dir / name).read_bytes() for name in ("config.json", "secrets.json")}
    for url in ("wss://a\u0000b/ws/node", "wss://a b/ws/node", "wss://a/ws/node\r\nX: y"):
        r = httpx.post(edge.url + "/setup", json={"manager_url": url}, timeout=10)
        assert_envelope_error(r, 400, "manager.url")
        assert "control characters" in r.json()["error"]
    assert {name: (edge.config_dir / name).read_bytes() for name in files} == files


# --------------------------------------------------------------------------- 3e. WebSocket access log


def access_lines(edge: Edge, path: str) -> list[str]:
    return [line for line in edge.log().splitlines() if "mediaplane.access" in line and path in line]


async def test_a_websocket_connection_is_in_the_access_log_without_its_query(edge: Edge) -> None:
    import trio
    from trio_websocket import HandshakeError, open_websocket_url

    base = edge.url.replace("http", "ws")
    with trio.fail_after(10):
        async with open_websocket_url(f"{base}/api/v1/ws/stats?token=secret123") as ws:
            assert isinstance(json.loads(await ws.get_message()), list)
            await trio.sleep(0.2)
        with pytest.raises(HandshakeError) as info:
            async with open_websocket_url(f"{base}/api/v1/ws/nothing?token=secret123"):
                pass
        assert getattr(info.value, "status_code", None) == 404

    def logged() -> Any:
        stats = access_lines(edge, "/api/v1/ws/stats")
        refused = access_lines(edge, "/api/v1/ws/nothing")
        return (stats, refused) if stats and refused else None

    stats, refused = wait_for(logged)
    assert len(stats) == 1 and " WS /api/v1/ws/stats?<redacted> 101 " in stats[0], stats
    duration_ms = float(stats[0].rsplit(" ", 1)[1].removesuffix("ms"))
    assert duration_ms >= 200.0
    assert len(refused) == 1 and " WS /api/v1/ws/nothing?<redacted> 404 " in refused[0], refused
    assert "secret123" not in edge.log()
    assert "Traceback" not in edge.log()
