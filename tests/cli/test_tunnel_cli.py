"""`mp tunnel list|show|create|delete` against a scripted edge (bare bodies, edge interface §4),
their exit codes, and TUNNEL id completion."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from cli.render import count
from tests.cli.helpers import MP
from tests.cli.stub import Request, stub_server
from tests.cli.test_client import run_mp

TID = "0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00"
KEY = "ab" * 32
COUNT_1234 = count(1234)
SUMMARY = {
    "id": TID,
    "name": "Studio link",
    "enabled": True,
    "protocol": "udp",
    "mode": "relay",
    "direction": "egress",
    "transport": "quic",
    "state": "Connected",
    "local_addr": "127.0.0.1:5000",
    "relay_addr": "relay.example:4433",
    "stats": {"bytes_sent": 1234, "bytes_received": 0, "replayed": 0, "decrypt_errors": 0},
}
FLAGS = [
    "--name",
    "Studio link",
    "--protocol",
    "udp",
    "--mode",
    "relay",
    "--direction",
    "egress",
    "--local",
    "127.0.0.1:5000",
    "--relay",
    "relay.example:4433",
]


def routes(created: list[Any]) -> dict[tuple[str, str], Any]:
    def create(req: Request) -> tuple[int, Any]:
        created.append(req.body)
        return 201, {"status": "created"}

    return {
        ("GET", "/api/v1/tunnels"): lambda req: (200, {"tunnels": [SUMMARY]}),
        ("GET", f"/api/v1/tunnels/{TID}"): lambda req: (200, SUMMARY),
        ("GET", "/api/v1/tunnels/nope"): lambda req: (404, {"error": "tunnel 'nope' not found"}),
        ("POST", "/api/v1/tunnels"): create,
        ("DELETE", f"/api/v1/tunnels/{TID}"): lambda req: (200, {"status": "deleted"}),
        ("DELETE", "/api/v1/tunnels/nope"): lambda req: (404, {"error": "tunnel 'nope' not found"}),
    }


@pytest.fixture
def edge(cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    created: list[Any] = []
    with stub_server(routes(created)) as stub:
        monkeypatch.setenv("MEDIAPLANE_URL", stub.url)
        stub.created = created  # type: ignore[attr-defined]
        yield stub


def test_list_as_a_table_json_and_ids(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_mp(["tunnel", "list", "-o", "table"], capsys)
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "PROTOCOL", "MODE", "DIRECTION", "STATE", "LOCAL", "RELAY"]
    assert TID in row and "Connected" in row and "relay.example:4433" in row
    code, out, _ = run_mp(["tunnel", "list", "--json"], capsys)
    assert code == 0 and json.loads(out) == {"tunnels": [SUMMARY]}
    code, out, _ = run_mp(["tunnel", "list", "-q"], capsys)
    assert (code, out) == (0, TID + "\n")


def test_show_and_not_found(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_mp(["tunnel", "show", TID, "-o", "table"], capsys)
    assert code == 0 and "Connected" in out
    assert any(line.split() == ["BYTES", "SENT", COUNT_1234] for line in out.splitlines()), out
    code, out, _ = run_mp(["tunnel", "show", TID, "-o", "json"], capsys)
    assert json.loads(out) == SUMMARY
    code, out, err = run_mp(["tunnel", "show", "nope"], capsys)
    assert (code, out) == (3, "") and err == "mp: tunnel 'nope' not found (try: mp tunnel list)\n"


def test_create_from_flags_validates_and_posts(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_mp(["tunnel", "create", *FLAGS, "--key", KEY, "--id", TID], capsys)
    assert code == 0, err
    assert err == f"tunnel {TID} created and started\n"
    assert edge.created == [
        {
            "id": TID,
            "name": "Studio link",
            "protocol": "udp",
            "mode": "relay",
            "direction": "egress",
            "local_addr": "127.0.0.1:5000",
            "relay_addr": "relay.example:4433",
            "tunnel_encryption_key": KEY,
        }
    ]


def test_create_generates_a_key_and_an_id(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_mp(["tunnel", "create", *FLAGS, "--generate-key", "--disabled"], capsys)
    assert code == 0, err
    body = edge.created[0]
    assert uuid.UUID(body["id"]).version == 4 and body["enabled"] is False
    key = body["tunnel_encryption_key"]
    assert len(key) == 64 and f"tunnel_encryption_key: {key}" in err and "(disabled)" in err


def test_create_from_a_file(edge: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = {**{k: v for k, v in SUMMARY.items() if k not in ("state", "stats")}, "tunnel_encryption_key": KEY}
    path = tmp_path / "tunnel.json"
    path.write_text(json.dumps(body))
    code, _, err = run_mp(["tunnel", "create", "-f", str(path)], capsys)
    assert code == 0, err
    assert edge.created == [body]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (FLAGS, "tunnel_encryption_key is required in relay mode"),
        ([*FLAGS, "--key", "zz" + KEY[2:]], "invalid tunnel: tunnel_encryption_key:"),
        (["--name", "x"], "missing --protocol, --mode, --direction, --local"),
        ([*FLAGS, "--key", KEY, "--generate-key"], "give --key or --generate-key, not both"),
    ],
)
def test_create_usage_errors_send_nothing_and_never_echo_a_key(
    edge: Any, args: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_mp(["tunnel", "create", *args], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("mp: ") and text in err and err.count("\n") == 1, err
    assert "zz" + KEY[2:] not in err
    assert edge.created == [] and edge.count("POST", "/api/v1/tunnels") == 0


def test_dry_run_hides_the_keys(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_mp(["tunnel", "create", *FLAGS, "--key", KEY, "--dry-run"], capsys)
    assert code == 0 and KEY not in out and json.loads(out)["relay_addr"] == "relay.example:4433"
    assert edge.created == []


def test_delete_and_not_found(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_mp(["tunnel", "delete", TID, "--yes"], capsys)
    assert (code, err) == (0, f"tunnel {TID} deleted\n")
    code, _, err = run_mp(["tunnel", "delete", "nope", "--yes"], capsys)
    assert code == 3 and "tunnel 'nope' not found" in err


def test_show_without_an_id_is_a_usage_error(edge: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_mp(["tunnel", "show"], capsys)
    assert (code, out) == (2, "") and "Missing argument 'TUNNEL'" in err


def test_tunnel_ids_complete_from_the_edge(edge: Any, cli_env: dict[str, str]) -> None:
    for words in (["mp", "tunnel", "show", ""], ["mp", "tunnel", "delete", "0f8"]):
        done = subprocess.run(
            [MP],
            env={
                **cli_env,
                "MEDIAPLANE_URL": edge.url,
                "_MP_COMPLETE": "complete_bash",
                "COMP_WORDS": " ".join(words),
                "COMP_CWORD": str(len(words) - 1),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert done.stdout.split() == [TID]
