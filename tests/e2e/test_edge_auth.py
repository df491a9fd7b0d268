"""Edge authentication end to end (edge interface §5, interop.md 2.1, 2.7, 2.8, 4)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from tests.helpers.edge import ADMIN, JWT_SECRET, MONITOR, Edge, auth_section, running_edge

pytestmark = pytest.mark.e2e

FLOW = {
    "id": "a1",
    "name": "Auth flow",
    "enabled": False,
    "input": {"type": "rtp", "bind_addr": "127.0.0.1:45999"},
    "outputs": [],
}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    config = {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section(public_metrics=False)},
    }
    with running_edge(tmp_path_factory.mktemp("auth"), config=config) as edge:
        yield edge


def token_request(edge: Edge, **kwargs: object) -> httpx.Response:
    return httpx.post(edge.url + "/oauth/token", timeout=10, **kwargs)  # type: ignore[arg-type]


def test_token_by_json_form_and_basic(edge: Edge) -> None:
    body = {"grant_type": "client_credentials", "client_id": ADMIN[0], "client_secret": ADMIN[1]}
    for r in (
        token_request(edge, json=body),
        token_request(edge, data=body),
        token_request(edge, data={"grant_type": "client_credentials"}, auth=ADMIN),
    ):
        assert r.status_code == 200, r.text
        answer = r.json()
        assert set(answer) == {"access_token", "token_type", "expires_in", "role"}
        assert answer["token_type"] == "bearer" and answer["expires_in"] == 3600 and answer["role"] == "admin"
        header = jwt.get_unverified_header(answer["access_token"])
        assert header == {"alg": "HS256", "typ": "JWT"}
        claims = jwt.decode(answer["access_token"], JWT_SECRET, algorithms=["HS256"], issuer="mediaplane-edge")
        assert claims["sub"] == ADMIN[0] and claims["role"] == "admin" and claims["exp"] - claims["iat"] == 3600


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"json": {"grant_type": "password", "client_id": ADMIN[0], "client_secret": ADMIN[1]}}, "grant_type"),
        (
            {
                "json": {
                    "grant_type": "client_credentials",
                    "client_id": ADMIN[0],
                    "client_secret": "wrong-secret-000000",
                }
            },
            "invalid client",
        ),
        (
            {"json": {"grant_type": "client_credentials", "client_id": "nobody", "client_secret": ADMIN[1]}},
            "invalid client",
        ),
        ({"json": {"grant_type": "client_credentials"}}, "required"),
        ({"content": b"{oops", "headers": {"content-type": "application/json"}}, "malformed"),
        ({"content": b"grant_type=client_credentials", "headers": {"content-type": "text/plain"}}, "content-type"),
        (
            {
                "data": {"grant_type": "client_credentials", "client_id": MONITOR[0], "client_secret": MONITOR[1]},
                "auth": ADMIN,
            },
            "disagree",
        ),
    ],
)
def test_token_errors_are_400(edge: Edge, kwargs: dict[str, object], message: str) -> None:
    r = token_request(edge, **kwargs)
    assert r.status_code == 400, r.text
    assert r.json()["success"] is False and message in r.json()["error"].lower()
    assert ADMIN[1] not in r.text


def test_missing_bad_and_expired_tokens_are_401(edge: Edge) -> None:
    r = httpx.get(edge.url + "/api/v1/flows", timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"success": False, "error": "Missing Authorization header"}
    now = int(time.time())

    def forged(secret: str = JWT_SECRET, **claims: object) -> str:
        base = {"sub": ADMIN[0], "role": "admin", "iat": now, "exp": now + 60, "iss": "mediaplane-edge"}
        return jwt.encode({**base, **claims}, secret, algorithm="HS256")

    for token in (
        "not-a-jwt",
        forged(secret="another-secret-another-secret-xx"),  # bad signature
        forged(exp=now - 1),  # expired
        forged(iss="someone-else"),
        forged(sub="deleted-client"),
        jwt.encode(
            {"sub": ADMIN[0], "role": "admin", "iat": now, "exp": now + 60, "iss": "mediaplane-edge"},
            None,
            algorithm="none",
        ),
    ):
        r = httpx.get(edge.url + "/api/v1/flows", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 401, token
        assert r.json()["success"] is False
    # A valid forged-by-us token works: the check is the signature, not the issuing call.
    r = httpx.get(edge.url + "/api/v1/flows", headers={"Authorization": f"Bearer {forged()}"}, timeout=10)
    assert r.status_code == 200


def test_the_current_role_of_the_client_applies(edge: Edge) -> None:
    now = int(time.time())
    # A token claiming admin for the monitor client still gets the monitor's rights.
    token = jwt.encode(
        {"sub": MONITOR[0], "role": "admin", "iat": now, "exp": now + 60, "iss": "mediaplane-edge"},
        JWT_SECRET,
        algorithm="HS256",
    )
    r = httpx.post(edge.url + "/api/v1/flows", json=FLOW, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 403


def test_monitor_reads_admin_writes(edge: Edge) -> None:
    with edge.client("monitor") as monitor, edge.client("admin") as admin:
        for path in ("/api/v1/flows", "/api/v1/stats", "/api/v1/config", "/metrics"):
            assert monitor.get(path).status_code == 200, path
        r = monitor.post("/api/v1/flows", json=FLOW)
        assert r.status_code == 403 and r.json() == {"success": False, "error": "admin role required"}
        for method, path in (
            ("PUT", "/api/v1/flows/a1"),
            ("DELETE", "/api/v1/flows/a1"),
            ("POST", "/api/v1/flows/a1/start"),
            ("POST", "/api/v1/flows/a1/stop"),
            ("POST", "/api/v1/flows/a1/restart"),
            ("POST", "/api/v1/flows/a1/outputs"),
            ("DELETE", "/api/v1/flows/a1/outputs/o1"),
            ("PUT", "/api/v1/config"),
            ("POST", "/api/v1/config/reload"),
        ):
            assert monitor.request(method, path, json={}).status_code == 403, (method, path)
        assert admin.post("/api/v1/flows", json=FLOW).status_code == 200
        assert monitor.get("/api/v1/flows/a1").status_code == 200
        assert admin.delete("/api/v1/flows/a1").status_code == 200


def test_public_routes_stay_public(edge: Edge) -> None:
    for path in ("/health", "/setup", "/setup/status"):
        assert httpx.get(edge.url + path, timeout=10).status_code == 200, path
    # public_metrics is false on this edge.
    assert httpx.get(edge.url + "/metrics", timeout=10).status_code == 401


async def test_websocket_token_in_header_or_query(edge: Edge) -> None:
    import trio
    from trio_websocket import HandshakeError, open_websocket_url

    base = edge.url.replace("http", "ws") + "/api/v1/ws/stats"
    token = edge.token("monitor")
    with trio.fail_after(10):
        async with open_websocket_url(f"{base}?token={token}") as ws:
            assert isinstance(json.loads(await ws.get_message()), list)
        async with open_websocket_url(base, extra_headers=[("Authorization", f"Bearer {token}")]) as ws:
            assert isinstance(json.loads(await ws.get_message()), list)
        for url in (base, f"{base}?token=bogus"):
            with pytest.raises(HandshakeError) as info:
                async with open_websocket_url(url):
                    pass
            assert getattr(info.value, "status_code", None) == 401
    # The token in the query is never written to the log.
    assert token not in edge.log()


def test_secrets_stay_on_the_box(edge: Edge) -> None:
    with edge.client("admin") as admin:
        text = admin.get("/api/v1/config").text
    config = json.loads(text)["data"]
    assert config["server"] == {"listen_addr": "127.0.0.1", "listen_port": 8080}
    for secret in (JWT_SECRET, ADMIN[1], MONITOR[1]):
        assert secret not in text
        assert secret not in (edge.config_dir / "config.json").read_text()
        assert secret not in (edge.config_dir / "secrets.json").read_text()
        assert secret not in edge.log()
    raw = (edge.config_dir / "secrets.json").read_text()
    assert raw.startswith("v1:") and base64.b64decode(raw[3:])
    for name in ("config.json", "secrets.json"):
        assert (edge.config_dir / name).stat().st_mode & 0o777 == 0o600
    assert edge.config_dir.stat().st_mode & 0o777 == 0o700


def test_put_config_keeps_secrets_it_does_not_name(edge: Edge) -> None:
    with edge.client("admin") as admin:
        config = admin.get("/api/v1/config").json()["data"]
        assert admin.put("/api/v1/config", json=config).status_code == 200
    # Auth is still on, with the same clients: a fresh token works, no token does not.
    assert httpx.get(edge.url + "/api/v1/flows", timeout=10).status_code == 401
    edge.tokens.clear()
    with edge.client("monitor") as monitor:
        assert monitor.get("/api/v1/flows").status_code == 200


def test_token_route_is_400_when_auth_is_off(tmp_path: Path) -> None:
    with running_edge(tmp_path) as edge:
        r = token_request(edge, json={"grant_type": "client_credentials", "client_id": "x", "client_secret": "y" * 16})
        assert r.status_code == 400 and "not enabled" in r.json()["error"]
        assert httpx.get(edge.url + "/api/v1/flows", timeout=10).status_code == 200  # every route open


def test_auth_turned_on_through_put_works_at_once(tmp_path: Path) -> None:
    with running_edge(tmp_path) as edge:
        with edge.client() as api:
            config = api.get("/api/v1/config").json()["data"]
            auth = auth_section()
            del auth["jwt_secret"]  # the edge generates one (interop.md 2.1)
            config["server"]["auth"] = auth
            assert api.put("/api/v1/config", json=config).status_code == 200
        assert httpx.get(edge.url + "/api/v1/flows", timeout=10).status_code == 401
        with edge.client("admin") as admin:
            assert admin.get("/api/v1/flows").status_code == 200


def test_an_echoed_config_with_a_relay_tunnel_keeps_its_key(tmp_path: Path) -> None:
    tunnel = {
        "id": "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b",
        "name": "t",
        "protocol": "udp",
        "mode": "relay",
        "direction": "egress",
        "local_addr": "127.0.0.1:7000",
        "relay_addr": "relay.example:4433",
        "tunnel_encryption_key": "ab" * 32,
    }
    config = {"version": 1, "server": {"listen_addr": "127.0.0.1", "listen_port": 8080}, "tunnels": [tunnel]}
    with running_edge(tmp_path, config=config) as edge, edge.client() as api:
        echoed = api.get("/api/v1/config").json()["data"]
        assert "tunnel_encryption_key" not in echoed["tunnels"][0]
        r = api.put("/api/v1/config", json=echoed)
        assert r.status_code == 200, r.text
    assert "ab" * 32 not in (edge.config_dir / "config.json").read_text()
