"""The manager's quart-trio app: the shared bootstrap, security headers and ``GET /health``.

Built with ``appliance.http.app.create_app`` (body limit, error mapping, access log, the
quart-trio body workaround), answering errors as ``{"error": "<text>"}`` (interop.md 7:
the manager's bodies are bare, hence ``bare_fail``); an unknown route is 404 in that shape.

Security headers (interop.md 1.3, 13): every answer carries ``X-Content-Type-Options:
nosniff`` and ``X-Frame-Options: DENY``, and in ``direct`` mode ``Strict-Transport-Security:
max-age=31536000``. They are added by an ASGI wrapper around the app rather than quart's
``after_request``: one place then covers HTTP answers (error handlers included), WebSocket
handshake acceptances (``after_websocket`` runs too late to touch the 101) and WebSocket
refusals alike.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, cast

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from quart import Blueprint, Response, current_app
from quart_trio import QuartTrio

from appliance.http.app import create_app
from appliance.http.envelope import bare_fail, json_response
from services.manager.api import register_api
from services.manager.service import SERVICE_CONFIG_KEY, SERVICE_NAME, ManagerService
from services.manager.settings import TlsMode
from services.manager.web import register_web

__all__ = ["HSTS", "SERVICE_KEY", "build_app", "manager_service", "security_headers", "with_security_headers"]

SERVICE_KEY: Final = SERVICE_CONFIG_KEY
HSTS: Final = (b"strict-transport-security", b"max-age=31536000")
_ALWAYS: Final = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"))
# The ASGI events that open an answer, each carrying its headers.
_ANSWER_STARTS: Final = frozenset({"http.response.start", "websocket.accept", "websocket.http.response.start"})

AsgiApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Coroutine[Any, Any, None]]

bp = Blueprint("manager", __name__)


def build_app(service: ManagerService) -> QuartTrio:
    """The manager's app around ``service`` (found by routes through :func:`manager_service`)."""
    app = create_app(SERVICE_NAME, error_body=bare_fail)
    app.config[SERVICE_KEY] = service
    headers = security_headers(hsts=service.tls_mode is TlsMode.DIRECT)
    app.asgi_app = with_security_headers(app.asgi_app, headers)  # type: ignore[method-assign,assignment]
    app.register_blueprint(bp)
    register_api(app)
    register_web(app)  # the dashboard's pages (issue 21), clients of the API above
    return app


def manager_service() -> ManagerService:
    """The service of the app answering the current request."""
    service = current_app.config[SERVICE_KEY]
    assert isinstance(service, ManagerService)
    return service


def security_headers(*, hsts: bool) -> tuple[tuple[bytes, bytes], ...]:
    """The headers every answer carries (interop.md 1.3; HSTS in ``direct`` mode only, 13)."""
    return (*_ALWAYS, HSTS) if hsts else _ALWAYS


def with_security_headers(asgi_app: AsgiApp, headers: tuple[tuple[bytes, bytes], ...]) -> AsgiApp:
    """``asgi_app`` with ``headers`` set on every HTTP answer and WebSocket handshake answer.

    A header of the same name that the app set is replaced, never doubled.
    """
    names = {name for name, _ in headers}

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "lifespan":
            await asgi_app(scope, receive, send)
            return

        async def send_with_headers(event: ASGISendEvent) -> None:
            if event["type"] in _ANSWER_STARTS:
                answer = cast(dict[str, Any], event)
                own: Iterable[tuple[bytes, bytes]] = answer.get("headers") or ()
                kept = [(name, value) for name, value in own if name.lower() not in names]
                event = cast(ASGISendEvent, {**answer, "headers": [*kept, *headers]})
            await send(event)

        await asgi_app(scope, receive, send_with_headers)

    return app


@bp.get("/health")
async def health() -> Response:
    """Public health check: ``{status, service, version, self_signed_cert}`` (interop.md 1.3)."""
    return json_response(manager_service().health())
