"""Statuses to exit codes, the envelope, and the token cache, against a scripted server."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import cli.main
from cli.auth import CachedToken, TokenCache, jwt_claims
from cli.client import error_for_status
from cli.errors import AuthNeeded, Failure, NotFound
from tests.cli.stub import Request, fail, ok, stub_server


def run_mp(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    cli.main._debug = False
    try:
        cli.main.main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (400, Failure, 1),
        (401, AuthNeeded, 4),
        (403, AuthNeeded, 4),
        (404, NotFound, 3),
        (409, Failure, 1),
        (415, Failure, 1),
        (429, Failure, 1),
        (500, Failure, 1),
        (502, Failure, 1),
    ],
)
def test_status_to_exit_code(status: int, kind: type, code: int) -> None:
    err = error_for_status(status, "text")
    assert type(err) is kind
    assert err.exit_code == code


@pytest.mark.parametrize(
    ("status", "code", "expected_err"),
    [
        (404, 3, "mp: flow 'f9' not found (try: mp flow list)\n"),
        (401, 4, "mp: Missing Authorization header (try: mp auth login)\n"),
        (409, 1, "mp: flow 'f9' not found\n"),
        (500, 1, "mp: flow 'f9' not found\n"),
    ],
)
def test_api_errors_are_one_line_with_the_api_text(
    status: int, code: int, expected_err: str, cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = "Missing Authorization header" if status == 401 else "flow 'f9' not found"
    with stub_server({("GET", "/api/v1/flows/f9"): fail(status, text)}) as stub:
        got = run_mp(["--url", stub.url, "flow", "show", "f9"], capsys)
    assert got == (code, "", expected_err)


def test_json_output_is_the_data_payload(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    data = {"flows": [{"id": "f1", "name": "Cam 1", "enabled": True, "input_type": "rtp", "output_count": 1}]}
    with stub_server({("GET", "/api/v1/flows"): ok(data)}) as stub:
        code, out, err = run_mp(["--url", stub.url, "flow", "list"], capsys)  # piped: json by default
        assert (code, json.loads(out), err) == (0, data, "")
        code, out, _ = run_mp(["--url", stub.url, "flow", "list", "-o", "table"], capsys)
        assert out.splitlines() == ["ID  NAME   ENABLED  INPUT  OUTPUTS", "f1  Cam 1  yes      rtp    1"]
        code, out, _ = run_mp(["--url", stub.url, "flow", "list", "-q"], capsys)
        assert out == "f1\n"
        code, out, _ = run_mp(["--url", stub.url, "flow", "list", "-o", "yaml"], capsys)
        assert out.startswith("flows:\n- id: f1\n")


def test_a_service_that_is_down_is_one_clear_line(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.edge import free_port

    code, out, err = run_mp(["--url", f"http://127.0.0.1:{free_port()}", "flow", "list"], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("mp: cannot reach the edge at http://127.0.0.1:")
    assert "connection refused (is mp-edge running?" in err


def _token_routes(issued: list[int], lifetime: int = 3600) -> dict[tuple[str, str], Any]:
    def token(req: Request) -> tuple[int, Any]:
        body = req.body or {}
        if (body.get("client_id"), body.get("client_secret")) != ("ops", "ops-secret-0123456789"):
            return 400, {"success": False, "error": "invalid client credentials"}
        issued.append(1)
        return 200, {
            "access_token": f"tok{len(issued)}",
            "token_type": "bearer",
            "expires_in": lifetime,
            "role": "admin",
        }

    def flows(req: Request) -> tuple[int, Any]:
        if req.headers.get("authorization") != f"Bearer tok{len(issued)}" or not issued:
            return 401, {"success": False, "error": "invalid token"}
        return 200, {"success": True, "data": {"flows": []}}

    return {("POST", "/oauth/token"): token, ("GET", "/api/v1/flows"): flows}


def test_client_credentials_are_exchanged_once_and_cached_0600(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    issued: list[int] = []
    monkeypatch.setenv("MEDIAPLANE_CLIENT_ID", "ops")
    monkeypatch.setenv("MEDIAPLANE_CLIENT_SECRET", "ops-secret-0123456789")
    with stub_server(_token_routes(issued)) as stub:
        assert run_mp(["--url", stub.url, "flow", "list"], capsys)[0] == 0
        assert run_mp(["--url", stub.url, "flow", "list"], capsys)[0] == 0
        assert stub.count("POST", "/oauth/token") == 1  # the second run used the cache
    cache = Path(cli_env["XDG_CONFIG_HOME"]) / "mp" / "tokens.json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    entry = json.loads(cache.read_text())["entries"][stub.url]
    assert entry["access_token"] == "tok1" and "client_secret" not in entry


def test_login_keeps_the_secret_and_refreshes_an_expired_token(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    issued: list[int] = []
    with stub_server(_token_routes(issued)) as stub:
        monkeypatch.setenv("MEDIAPLANE_CLIENT_SECRET", "ops-secret-0123456789")
        code, out, err = run_mp(["--url", stub.url, "auth", "login", "--client-id", "ops"], capsys)
        assert (code, out) == (0, ""), err
        assert f"logged in to {stub.url} as ops (admin)" in err
        monkeypatch.delenv("MEDIAPLANE_CLIENT_SECRET")
        cache = TokenCache(Path(cli_env["XDG_CONFIG_HOME"]) / "mp")
        entry = cache.get(stub.url)
        assert entry is not None and entry.client_secret == "ops-secret-0123456789"
        entry.expires_at = time.time() - 1  # expired: the next command must get a new token by itself
        cache.put(stub.url, entry)
        assert run_mp(["--url", stub.url, "flow", "list"], capsys)[0] == 0
        assert stub.count("POST", "/oauth/token") == 2
        assert cache.get(stub.url).access_token == "tok2"  # type: ignore[union-attr]
        # a token the edge no longer accepts (revoked, new key) is replaced once, then the call is retried
        cache.put(stub.url, CachedToken("stale", time.time() + 3600, "admin", "ops", "ops-secret-0123456789"))
        assert run_mp(["--url", stub.url, "flow", "list"], capsys)[0] == 0
        assert stub.count("POST", "/oauth/token") == 3
        code, _, err = run_mp(["--url", stub.url, "auth", "logout"], capsys)
        assert (code, err) == (0, f"logged out of {stub.url}\n")
        assert cache.get(stub.url) is None
        code, _, err = run_mp(["--url", stub.url, "flow", "list"], capsys)
        assert (code, err) == (4, "mp: invalid token (try: mp auth login)\n")


def test_refused_credentials_exit_4_naming_the_client(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_server(_token_routes([])) as stub:
        code, out, err = run_mp(
            ["--url", stub.url, "--client-id", "ops", "--client-secret", "wrong-secret-000000", "flow", "list"], capsys
        )
    assert (code, out) == (4, "")
    assert err == "mp: the edge refused the client credentials for 'ops': invalid client credentials\n"


def test_jwt_claims_are_read_without_verifying() -> None:
    import base64

    payload = base64.urlsafe_b64encode(json.dumps({"sub": "ops", "exp": 5}).encode()).rstrip(b"=").decode()
    assert jwt_claims(f"e30.{payload}.sig") == {"sub": "ops", "exp": 5}
    assert jwt_claims("not-a-jwt") == {}
