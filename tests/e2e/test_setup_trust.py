"""The wizard you can trust, and the edge's log (issue 15 items 3 and 6), against a real ``mp-edge``.

- ``POST /setup`` refuses a manager URL without a host or a valid port (400, never quoting it)
  and leaves both files as they were.
- ``GET /setup/runtime`` says what is in force in this process (the listen address and port,
  how a restart is done, whether ``MEDIAPLANE_ALLOW_INSECURE`` is set, the pinned fingerprint),
  beside what ``/setup/status`` says is saved.
- ``POST /setup/restart`` (only while setup is enabled, only under systemd): 202, then the
  process stops cleanly and exits with status 75 so that ``Restart=on-failure`` starts it again.
- The log: one ``mediaplane.edge: change: ...`` line per mutating operation, no secret in the
  log, our own ``mp-edge <version> listening on ...`` line and no hypercorn ``Running on`` line.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.edge import Edge, free_udp_port, running_edge, start_edge

pytestmark = pytest.mark.e2e

NOT_SYSTEMD = {"INVOCATION_ID": "", "NOTIFY_SOCKET": ""}  # even when the test itself runs in a unit
RESTART_EXIT_STATUS = 75
TOKEN = "reg-token-0123456789abcdef-SECRET"
PASSPHRASE = "srt-pass-SECRET-42"
FINGERPRINT = ":".join(["5A"] * 32)


def config(**fields: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "setup_enabled": True,
        "server": {"listen_addr": "0.0.0.0", "listen_port": 8080},
        "manager": None,
        "flows": [],
        **fields,
    }


def files(edge: Edge) -> dict[str, bytes | None]:
    paths = {name: edge.config_dir / name for name in ("config.json", "secrets.json")}
    return {name: path.read_bytes() if path.exists() else None for name, path in paths.items()}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    tmp = tmp_path_factory.mktemp("setup-trust")
    with running_edge(tmp, config=config(), extra_env=NOT_SYSTEMD) as edge:
        yield edge


# --------------------------------------------------------------------------- POST /setup: the manager URL


@pytest.mark.parametrize(
    "url",
    [
        "wss://",
        "wss://not a url",
        "wss://:0/x",
        "wss://mgr.example:0/ws",
        "wss://mgr.example:70000/ws",
        "wss://:8443/ws",
    ],
)
def test_a_manager_url_without_a_host_or_port_is_400_and_nothing_is_saved(edge: Edge, url: str) -> None:
    before = files(edge)
    r = httpx.post(edge.url + "/setup", json={"manager_url": url, "registration_token": TOKEN}, timeout=10)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["success"] is False and body["error"].startswith("Validation failed: manager.url: ")
    assert url.removeprefix("wss://") not in body["error"] or url == "wss://"
    assert TOKEN not in r.text
    assert files(edge) == before


# --------------------------------------------------------------------------- GET /setup/runtime


def test_runtime_shows_what_is_in_force_beside_what_is_saved(edge: Edge) -> None:
    status = httpx.get(edge.url + "/setup/status", timeout=10).json()
    runtime = httpx.get(edge.url + "/setup/runtime", timeout=10).json()
    # Saved: config.json's values. In force: the test's --listen-addr/--listen-port.
    assert (status["listen_addr"], status["listen_port"]) == ("0.0.0.0", 8080)
    assert runtime["listen_addr"] == "127.0.0.1" and runtime["listen_port"] == edge.port
    assert runtime["scheme"] == "http" and runtime["listen_from"] == "command line"
    assert runtime["systemd"] is False
    cmd = runtime["restart_command"]
    assert "mp-edge" in cmd and f"--listen-port {edge.port}" in cmd and str(edge.config_dir) in cmd
    assert runtime["allow_insecure"] is False and runtime["cert_fingerprint"] is None
    assert set(runtime) == {
        "scheme",
        "listen_addr",
        "listen_port",
        "listen_from",
        "systemd",
        "restart_command",
        "allow_insecure",
        "cert_fingerprint",
    }


def test_restart_is_refused_when_not_under_systemd(edge: Edge) -> None:
    r = httpx.post(edge.url + "/setup/restart", json={}, timeout=10)
    assert r.status_code == 409, r.text
    assert r.json()["success"] is False and "systemd" in r.json()["error"]
    assert edge.process.poll() is None


def test_restart_takes_an_empty_json_object_only(edge: Edge) -> None:
    # JSON only, as POST /setup: a cross-site form post cannot restart the node.
    r = httpx.post(edge.url + "/setup/restart", content=b"", timeout=10)
    assert r.status_code == 400 and "Content-Type" in r.json()["error"]
    r = httpx.post(edge.url + "/setup/restart", json={"now": True}, timeout=10)
    assert r.status_code == 400 and r.json()["error"] == "unknown key: now"


def test_the_wizard_saves_a_fingerprint_pin(tmp_path: Path) -> None:
    with running_edge(tmp_path, config=config(), extra_env=NOT_SYSTEMD) as edge:
        body = {
            "manager_url": "wss://mgr.example:8443/ws/node",
            "accept_self_signed_cert": True,
            "cert_fingerprint": FINGERPRINT.lower(),
        }
        r = httpx.post(edge.url + "/setup", json=body, timeout=10)
        assert r.status_code == 200, r.text
        saved = json.loads((edge.config_dir / "config.json").read_text())
        assert saved["manager"]["cert_fingerprint"] == FINGERPRINT
        assert saved["manager"]["enabled"] is True
        # The form's value (/setup/status cannot carry it); the link takes it at restart.
        assert httpx.get(edge.url + "/setup/runtime", timeout=10).json()["cert_fingerprint"] == FINGERPRINT
        with edge.client() as api:
            assert api.get("/api/v1/manager").json()["data"]["state"] == "disabled"  # saved, not applied
        r = httpx.post(edge.url + "/setup", json={**body, "cert_fingerprint": "AB:CD"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"].startswith("cert_fingerprint must be the SHA-256")


# --------------------------------------------------------------------------- POST /setup/restart under systemd


def test_restart_now_under_systemd_exits_75_after_answering_202(tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(sock_path))
    notify.settimeout(20)
    try:
        env = {"INVOCATION_ID": "0123456789abcdef0123456789abcdef", "NOTIFY_SOCKET": str(sock_path)}
        edge = start_edge(tmp_path / "edge", config=config(), extra_env=env)
        try:
            assert notify.recv(4096).startswith(b"READY=1")
            runtime = httpx.get(edge.url + "/setup/runtime", timeout=10).json()
            assert runtime["systemd"] is True and runtime["restart_command"] == "systemctl restart mp-edge"
            r = httpx.post(edge.url + "/setup/restart", json={}, timeout=10)
            assert r.status_code == 202, r.text
            assert r.json() == {
                "success": True,
                "message": "Restarting mp-edge: it stops now and systemd starts it again in a few seconds.",
            }
            assert edge.process.wait(30) == RESTART_EXIT_STATUS
            assert b"STOPPING=1" in notify.recv(4096)
            log = edge.log()
            assert log.count("mediaplane.edge: change: restart requested from the setup wizard") == 1
            assert "Traceback" not in log
        finally:
            edge.stop()
    finally:
        notify.close()


def test_restart_is_403_once_setup_is_disabled(tmp_path: Path) -> None:
    env = {"INVOCATION_ID": "0123456789abcdef0123456789abcdef", "NOTIFY_SOCKET": ""}
    with running_edge(tmp_path, config=config(setup_enabled=False), extra_env=env) as edge:
        r = httpx.post(edge.url + "/setup/restart", json={}, timeout=10)
        assert r.status_code == 403
        assert r.json() == {"success": False, "error": "Setup wizard is disabled on this node"}
        time.sleep(0.5)
        assert edge.process.poll() is None


# --------------------------------------------------------------------------- the log


def change_lines(edge: Edge) -> list[str]:
    return [
        line.split("mediaplane.edge: change: ", 1)[1]
        for line in edge.log().splitlines()
        if "mediaplane.edge: change: " in line
    ]


def test_each_mutation_is_logged_once_without_secrets(tmp_path: Path) -> None:
    in_port, out_port, out2, srt_port = free_udp_port(), free_udp_port(), free_udp_port(), free_udp_port()
    rtp = {
        "id": "f1",
        "name": "Flow 1",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{in_port}"},
        "outputs": [{"type": "udp", "id": "o1", "name": "o1", "dest_addr": f"127.0.0.1:{out_port}"}],
    }
    srt = {
        "id": "s1",
        "name": "SRT 1",
        "enabled": False,
        "input": {"type": "srt", "mode": "listener", "local_addr": f"127.0.0.1:{srt_port}", "passphrase": PASSPHRASE},
        "outputs": [{"type": "udp", "id": "o1", "name": "o1", "dest_addr": f"127.0.0.1:{out2}"}],
    }
    with running_edge(tmp_path, config=config(), extra_env=NOT_SYSTEMD) as edge, edge.client() as api:
        assert change_lines(edge) == []  # starting is not a change

        def ok(r: httpx.Response) -> None:
            assert r.status_code == 200, r.text

        ok(api.post("/api/v1/flows", json=rtp))
        ok(api.post("/api/v1/flows/f1/stop"))
        ok(api.post("/api/v1/flows/f1/start"))
        ok(api.post("/api/v1/flows/f1/restart"))
        out = {"type": "udp", "id": "o9", "name": "o9", "dest_addr": f"127.0.0.1:{out2}"}
        ok(api.post("/api/v1/flows/f1/outputs", json=out))
        ok(api.delete("/api/v1/flows/f1/outputs/o9"))
        ok(api.put("/api/v1/flows/f1", json={**rtp, "name": "Flow one"}))
        ok(api.post("/api/v1/flows", json=srt))
        ok(api.delete("/api/v1/flows/f1"))
        assert api.delete("/api/v1/flows/nope").status_code == 404  # refused: not a change
        assert api.post("/api/v1/flows", json=srt).status_code == 409
        whole = api.get("/api/v1/config").json()["data"]
        ok(api.put("/api/v1/config", json=whole))
        ok(api.post("/api/v1/config/reload"))
        setup = {"manager_url": "wss://mgr.example:8443/ws/node", "registration_token": TOKEN, "listen_port": 8081}
        ok(httpx.post(edge.url + "/setup", json=setup, timeout=10))
        assert httpx.post(edge.url + "/setup", json={"manager_url": "wss://"}, timeout=10).status_code == 400

        deadline = time.monotonic() + 5
        expected = [
            "flow created flow=f1",
            "flow stopped flow=f1",
            "flow started flow=f1",
            "flow restarted flow=f1",
            "output added flow=f1 output=o9",
            "output removed flow=f1 output=o9",
            "flow updated flow=f1",
            "flow created flow=s1",
            "flow deleted flow=f1",
            "config replaced flows=1",
            "config reloaded flows=1",
            "setup saved listen=0.0.0.0:8081 manager_changed=yes new_token=yes (effective at restart)",
        ]
        while change_lines(edge) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert change_lines(edge) == expected
        log = edge.log()
        for line in log.splitlines():
            if "mediaplane.edge: change: " in line:
                assert " INFO mediaplane.edge: change: " in line
        assert TOKEN not in log and PASSPHRASE not in log


def test_startup_says_mp_edge_listening_and_hypercorn_does_not(edge: Edge) -> None:
    log = edge.log()
    lines = [line for line in log.splitlines() if re.search(r"INFO mediaplane\.edge: mp-edge \S+ listening on ", line)]
    assert len(lines) == 1, log
    assert f"listening on http://127.0.0.1:{edge.port} " in lines[0] + " "
    # --listen-addr/--listen-port differ from config.json: the line says so.
    assert "(--listen-addr/--listen-port; config.json says 0.0.0.0:8080)" in lines[0]
    assert "Running on" not in log
    assert "hypercorn.error" not in log
