"""The manager's app in process: /health, error bodies, security headers (interop.md 1.3, 7, 13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from appliance import __version__
from services.manager.app import build_app, with_security_headers
from services.manager.service import ManagerHealth, ManagerService
from services.manager.settings import TlsMode, resolve_settings
from services.manager.tls import ensure_certificate
from tests.manager.certs import NOW

ENV = {"MEDIAPLANE_JWT_SECRET": "ab" * 32, "MEDIAPLANE_MASTER_KEY": "cd" * 32}
ALWAYS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY"}
HSTS = "max-age=31536000"


def service(tmp_path: Path, mode: TlsMode) -> ManagerService:
    settings = resolve_settings(ENV, data_dir=tmp_path, tls_mode=mode)
    certificate = None
    if mode is TlsMode.DIRECT:
        certificate = ensure_certificate(settings.tls_dir, hostname="h", addresses=[], now=NOW)
    return ManagerService(settings, version=__version__, started_at=NOW, certificate=certificate)


@pytest.mark.parametrize(("mode", "self_signed"), [(TlsMode.DIRECT, True), (TlsMode.BEHIND_PROXY, False)])
async def test_health(tmp_path: Path, mode: TlsMode, self_signed: bool) -> None:
    client = build_app(service(tmp_path, mode)).test_client()
    r = await client.get("/health")
    assert r.status_code == 200
    assert r.content_type == "application/json"
    assert await r.get_json() == {
        "status": "ok",
        "service": "mediaplane-manager",
        "version": __version__,
        "self_signed_cert": self_signed,
    }


@pytest.mark.parametrize(("mode", "hsts"), [(TlsMode.DIRECT, True), (TlsMode.BEHIND_PROXY, False)])
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/health", 200), ("GET", "/nope", 404), ("DELETE", "/health", 405), ("OPTIONS", "/health", 200)],
)
async def test_security_headers_on_every_answer(
    tmp_path: Path, mode: TlsMode, hsts: bool, method: str, path: str, status: int
) -> None:
    client = build_app(service(tmp_path, mode)).test_client()
    r = await client.open(path, method=method)  # type: ignore[call-arg]  # quart.typing marks json required
    assert r.status_code == status
    for name, value in ALWAYS.items():
        assert r.headers.getlist(name) == [value]
    assert r.headers.getlist("strict-transport-security") == ([HSTS] if hsts else [])


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/nope", 404), ("PUT", "/health", 405)])
async def test_errors_are_bare_bodies(tmp_path: Path, method: str, path: str, status: int) -> None:
    client = build_app(service(tmp_path, TlsMode.BEHIND_PROXY)).test_client()
    r = await client.open(path, method=method)  # type: ignore[call-arg]  # quart.typing marks json required
    assert r.status_code == status
    body = await r.get_json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]


def test_the_health_model_is_exactly_four_fields() -> None:
    assert list(ManagerHealth.model_fields) == ["status", "service", "version", "self_signed_cert"]
    with pytest.raises(ValidationError):
        ManagerHealth.model_validate({"version": "1", "self_signed_cert": True, "extra": 1})


def test_the_service_object(tmp_path: Path) -> None:
    direct = service(tmp_path, TlsMode.DIRECT)
    assert direct.data_dir == tmp_path and direct.tls_mode is TlsMode.DIRECT
    assert direct.started_at == NOW and direct.self_signed_cert
    assert direct.secret_box.decrypt(direct.secret_box.encrypt("x")) == "x"
    assert service(tmp_path / "p", TlsMode.BEHIND_PROXY).certificate is None


# --------------------------------------------------------------------------- the ASGI wrapper itself

HEADERS = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"))


async def run_wrapped(scope_type: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        for event in events:
            await send(event)

    async def receive() -> dict[str, Any]:
        return {}

    async def send(event: Any) -> None:
        sent.append(event)

    await with_security_headers(inner, HEADERS)({"type": scope_type}, receive, send)  # type: ignore[arg-type]
    return sent


@pytest.mark.parametrize(
    ("scope_type", "event"),
    [
        ("websocket", {"type": "websocket.accept", "subprotocol": None}),
        ("websocket", {"type": "websocket.accept", "subprotocol": None, "headers": [(b"x-a", b"1")]}),
        ("websocket", {"type": "websocket.http.response.start", "status": 403, "headers": []}),
        ("http", {"type": "http.response.start", "status": 200, "headers": [(b"x-frame-options", b"SAMEORIGIN")]}),
        ("http", {"type": "http.response.start", "status": 200, "headers": [(b"X-Content-Type-Options", b"x")]}),
    ],
)
async def test_the_wrapper_sets_the_headers_once(scope_type: str, event: dict[str, Any]) -> None:
    (sent,) = await run_wrapped(scope_type, [event])
    names = [name.lower() for name, _ in sent["headers"]]
    assert names.count(b"x-frame-options") == 1 and names.count(b"x-content-type-options") == 1
    assert set(HEADERS) <= set(sent["headers"])
    assert [h for h in sent["headers"] if h[0] == b"x-a"] == [h for h in event.get("headers", []) if h[0] == b"x-a"]


async def test_the_wrapper_leaves_other_events_and_lifespan_alone() -> None:
    body = {"type": "http.response.body", "body": b"{}"}
    assert await run_wrapped("http", [body]) == [body]
    startup = {"type": "lifespan.startup.complete"}
    assert await run_wrapped("lifespan", [startup]) == [startup]
    assert "headers" not in (await run_wrapped("websocket", [{"type": "websocket.send", "text": "x"}]))[0]
