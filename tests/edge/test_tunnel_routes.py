"""The tunnel routes (edge interface §4 "Tunnel routes", §5 rule 4, §7) on an in-process edge.

The app is mp-edge's (``build_app``) around a real ``EdgeService`` whose tunnel worker runs the
fake runner of ``tunnel_fakes``. Bodies are bare; errors are ``{error}``; secrets go to
secrets.json only and never come back in a response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from quart import typing as quart_typing

from appliance.models.stats import TunnelState
from services.edge.main import build_app
from services.edge.service import EdgeService
from tests.edge.tunnel_edge import BIND_SECRET, KEY, PSK, direct_tunnel, relay_tunnel, running_service, runs, until
from tests.helpers.edge import ADMIN, MONITOR, auth_section

SUMMARY_KEYS = {"id", "name", "protocol", "mode", "direction", "state", "local_addr", "relay_addr"}
SECRETS = (KEY, BIND_SECRET, PSK)


@dataclass
class Api:
    client: quart_typing.TestClientProtocol
    service: EdgeService
    tmp_path: Path

    async def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["json"] = body
        response = await self.client.open(path, method=method, **kwargs)
        text = (await response.get_data()).decode()
        for secret in SECRETS:
            assert secret not in text, f"a secret in the answer to {method} {path}"
        return response.status_code, json.loads(text) if text else None

    async def token(self, client: tuple[str, str]) -> str:
        body = {"grant_type": "client_credentials", "client_id": client[0], "client_secret": client[1]}
        status, answer = await self.call("POST", "/oauth/token", body)
        assert status == 200, answer
        return str(answer["access_token"])

    def files(self) -> tuple[str, str]:
        """config.json and the decrypted secrets (as the store merges them: secrets only)."""
        config_text = (self.tmp_path / "edge" / "config.json").read_text()
        read = self.service.store.read()
        secrets = {
            str(t.id): {
                name: value.get_secret_value()
                for name in ("tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk")
                if (value := getattr(t, name)) is not None
            }
            for t in read.tunnels
        }
        return config_text, json.dumps(secrets)


@asynccontextmanager
async def _api(tmp_path: Path, config: dict[str, Any] | None) -> AsyncIterator[Api]:
    async with running_service(tmp_path, config) as service:
        yield Api(build_app(service).test_client(), service, tmp_path)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with _api(tmp_path, None) as value:
        yield value


@pytest.fixture
async def auth_api(tmp_path: Path) -> AsyncIterator[Api]:
    config = {"server": {"listen_addr": "127.0.0.1", "auth": auth_section()}}
    async with _api(tmp_path, config) as value:
        yield value


async def test_create_list_show_and_delete_with_auth_off(api: Api) -> None:
    body = relay_tunnel()
    tunnel_id = body["id"]
    assert await api.call("POST", "/api/v1/tunnels", body) == (201, {"status": "created"})

    status, listed = await api.call("GET", "/api/v1/tunnels")
    assert status == 200 and list(listed) == ["tunnels"] and len(listed["tunnels"]) == 1
    summary = listed["tunnels"][0]
    assert SUMMARY_KEYS <= set(summary)
    assert {k: summary[k] for k in SUMMARY_KEYS - {"state"}} == {
        "id": tunnel_id,
        "name": "Studio link",
        "protocol": "udp",
        "mode": "relay",
        "direction": "egress",
        "local_addr": "127.0.0.1:7000",
        "relay_addr": "relay.example:4433",
    }
    assert summary["state"] in ("Connecting", "Connected")  # started: the fake runner connects when told
    assert set(summary["stats"]) >= {"bytes_sent", "bytes_received", "replayed", "decrypt_errors"}
    await until(lambda: runs(api.tmp_path, str(tunnel_id)) == 1, "the tunnel to start")

    (api.tmp_path / "fake" / f"{tunnel_id}.state").write_text("Connected")
    await until(lambda: api.service.tunnel(str(tunnel_id)).state is TunnelState.CONNECTED, "Connected")
    status, shown = await api.call("GET", f"/api/v1/tunnels/{tunnel_id}")
    assert status == 200 and shown["state"] == "Connected" and shown["id"] == tunnel_id
    assert (await api.call("GET", f"/api/v1/tunnels/{str(tunnel_id).upper()}"))[0] == 200  # the same UUID

    # interop.md 2.7: the secrets are in secrets.json, never in config.json or GET /api/v1/config.
    config_text, secrets = api.files()
    assert tunnel_id in config_text and all(secret not in config_text for secret in SECRETS)
    assert KEY in secrets and BIND_SECRET in secrets
    status, config = await api.call("GET", "/api/v1/config")
    assert status == 200 and "tunnel_encryption_key" not in json.dumps(config)

    # The stats snapshot carries the tunnels (for the manager's stats payload and Prometheus);
    # GET /api/v1/stats keeps the interface's {system, flows}.
    assert [t.id for t in api.service.snapshot().tunnels] == [tunnel_id]
    status, stats = await api.call("GET", "/api/v1/stats")
    assert status == 200 and set(stats["data"]) == {"system", "flows"}

    assert await api.call("DELETE", f"/api/v1/tunnels/{tunnel_id}") == (200, {"status": "deleted"})
    assert await api.call("GET", "/api/v1/tunnels") == (200, {"tunnels": []})
    config_text, secrets = api.files()
    assert tunnel_id not in config_text and KEY not in secrets
    assert api.service.tunnel_supervisor.state(str(tunnel_id)) is TunnelState.STOPPED
    assert not api.service.tunnel_supervisor.is_running(str(tunnel_id))


async def test_direct_mode_has_no_relay_addr_and_a_disabled_tunnel_is_stopped(api: Api) -> None:
    direct = direct_tunnel(enabled=False)
    assert (await api.call("POST", "/api/v1/tunnels", direct))[0] == 201
    status, shown = await api.call("GET", f"/api/v1/tunnels/{direct['id']}")
    assert status == 200
    assert shown["relay_addr"] is None and shown["mode"] == "direct" and shown["state"] == "Stopped"
    assert runs(api.tmp_path, str(direct["id"])) == 0
    _, secrets = api.files()
    assert PSK in secrets


async def test_errors_are_bare_and_never_echo_the_input(api: Api) -> None:
    body = relay_tunnel()
    assert (await api.call("POST", "/api/v1/tunnels", body))[0] == 201
    status, answer = await api.call("POST", "/api/v1/tunnels", body)
    assert (status, answer) == (409, {"error": f"tunnel '{body['id']}' already exists"})

    missing_key = relay_tunnel()
    del missing_key["tunnel_encryption_key"]
    status, answer = await api.call("POST", "/api/v1/tunnels", missing_key)
    assert status == 400 and list(answer) == ["error"]
    assert answer["error"].startswith("Validation failed:") and "tunnel_encryption_key" in answer["error"]

    not_hex = relay_tunnel(tunnel_encryption_key="zz" + KEY[2:], tunnel_psk="p" * 5000)
    status, answer = await api.call("POST", "/api/v1/tunnels", not_hex)
    assert status == 400 and list(answer) == ["error"]
    assert "zz" + KEY[2:] not in answer["error"] and "ppppp" not in answer["error"]

    status, answer = await api.call("POST", "/api/v1/tunnels", [1, 2])
    assert status == 400 and list(answer) == ["error"]
    response = await api.client.post("/api/v1/tunnels", data=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and list(await response.get_json()) == ["error"]

    unknown = "0b8a1c1e-1111-4222-8333-444455556666"
    assert await api.call("GET", f"/api/v1/tunnels/{unknown}") == (404, {"error": f"tunnel '{unknown}' not found"})
    assert await api.call("DELETE", f"/api/v1/tunnels/{unknown}") == (404, {"error": f"tunnel '{unknown}' not found"})
    assert await api.call("GET", "/api/v1/tunnels/not-a-uuid") == (404, {"error": "tunnel 'not-a-uuid' not found"})
    # Nothing of the refused bodies was persisted.
    assert [str(t.id) for t in api.service.config.tunnels] == [body["id"]]


async def test_auth_on_any_role_reads_admin_changes(auth_api: Api) -> None:
    api = auth_api
    body = relay_tunnel()
    status, answer = await api.call("GET", "/api/v1/tunnels")
    assert status == 401 and list(answer) == ["error"]
    assert (await api.call("POST", "/api/v1/tunnels", body))[0] == 401
    monitor, admin = await api.token(MONITOR), await api.token(ADMIN)

    status, answer = await api.call("POST", "/api/v1/tunnels", body, token=monitor)
    assert status == 403 and list(answer) == ["error"]
    assert await api.call("POST", "/api/v1/tunnels", body, token=admin) == (201, {"status": "created"})
    status, listed = await api.call("GET", "/api/v1/tunnels", token=monitor)
    assert status == 200 and [t["id"] for t in listed["tunnels"]] == [body["id"]]
    assert (await api.call("GET", f"/api/v1/tunnels/{body['id']}", token=monitor))[0] == 200
    assert (await api.call("DELETE", f"/api/v1/tunnels/{body['id']}", token=monitor))[0] == 403
    assert await api.call("DELETE", f"/api/v1/tunnels/{body['id']}", token=admin) == (200, {"status": "deleted"})


async def test_enabled_tunnels_start_at_boot_and_secrets_survive_a_restart(tmp_path: Path) -> None:
    body, off = relay_tunnel(), relay_tunnel("Spare", enabled=False)
    async with _api(tmp_path, None) as api:
        for tunnel in (body, off):
            assert (await api.call("POST", "/api/v1/tunnels", tunnel))[0] == 201
    with trio.fail_after(30):
        async with _api(tmp_path, None) as api:
            await until(lambda: runs(tmp_path, str(body["id"])) == 2, "the enabled tunnel to start at boot")
            assert (tmp_path / "fake" / f"{body['id']}.secret").read_text() == KEY  # from secrets.json
            assert runs(tmp_path, str(off["id"])) == 0
            assert api.service.tunnel(str(off["id"])).state is TunnelState.STOPPED


async def test_metrics_per_tunnel(api: Api) -> None:
    running, spare = relay_tunnel("Running"), relay_tunnel("Spare", enabled=False)
    for body in (running, spare):
        assert (await api.call("POST", "/api/v1/tunnels", body))[0] == 201
    (api.tmp_path / "fake" / f"{running['id']}.state").write_text("Connected")
    tid = str(running["id"])
    await until(lambda: api.service.tunnel(tid).stats.bytes_sent > 0, "Connected with counters")
    response = await api.client.get("/metrics")
    text = (await response.get_data()).decode()

    def value(name: str, labels: str) -> float:
        prefix = f"{name}{{{labels}}} "
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        assert len(lines) == 1, (prefix, lines)
        return float(lines[0].removeprefix(prefix))

    run, off = f'tunnel_id="{tid}"', f'tunnel_id="{spare["id"]}"'
    assert value("mediaplane_edge_tunnel_connected", run) == 1.0
    assert value("mediaplane_edge_tunnel_connected", off) == 0.0
    assert value("mediaplane_edge_tunnel_state", 'state="Connected",' + run) == 1.0
    assert value("mediaplane_edge_tunnel_state", 'state="Stopped",' + off) == 1.0
    assert value("mediaplane_edge_tunnel_bytes_sent_total", run) > 0
    assert value("mediaplane_edge_tunnel_bytes_received_total", run) > 0
    assert value("mediaplane_edge_tunnel_replayed_total", run) == 3.0
    assert value("mediaplane_edge_tunnel_decrypt_errors_total", run) == 2.0
    assert "# TYPE mediaplane_edge_tunnel_bytes_sent_total counter" in text
    assert f"mediaplane_edge_tunnel_bytes_sent_total{{{off}}}" not in text  # no counters while Stopped
