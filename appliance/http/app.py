"""quart-trio application factory, request-body handling and hypercorn serving.

Every service builds its app here so the envelope, the error mapping, the body
limit and the stack workarounds live in one place:

- quart-trio 0.12 can hang the next request on a keep-alive connection when a
  handler answers without reading the request body (reproduced here), so a
  ``before_request`` hook reads every body first.
- quart's ``get_json()`` answers HTML errors, so bodies are parsed with
  ``appliance.untrusted.load_json`` (64 levels at most) and validated with pydantic
  (``read_json``).
- Access logs are written by the app itself so that ``?token=`` is redacted
  (interop.md 4: the WebSocket token in the query never reaches a log): one line
  per HTTP request, and one per WebSocket connection when it ends (an ASGI wrapper,
  because quart-trio cancels the handler, and its after-websocket hooks, when the
  client goes away).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from pydantic import TypeAdapter, ValidationError
from quart import Response, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from appliance import errors
from appliance.http.envelope import ErrorBody, describe_validation_error, fail, status_for
from appliance.untrusted import JsonTooDeep, load_json

MAX_BODY_BYTES: Final = 1024 * 1024  # 1 MiB (interop.md 7: the manager's cap; the edge uses the same)
_log = logging.getLogger("mediaplane.http")
_access_log = logging.getLogger("mediaplane.access")


class _WithoutRunningOn(logging.Filter):
    """Drops hypercorn's ``Running on http://... (CTRL + C to quit)``: each service says it in its
    own words once it listens (``mp-edge <version> listening on ...``, ``mp-manager ...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("Running on "))


_hypercorn_log = logging.getLogger("hypercorn.error")
_hypercorn_log.addFilter(_WithoutRunningOn())

T = TypeVar("T")
_AsgiApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Coroutine[Any, Any, None]]


def create_app(name: str, *, error_body: ErrorBody = fail) -> QuartTrio:
    """A quart-trio app with the envelope error handlers and the body workaround."""
    app = QuartTrio(name)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = True
    app.url_map.strict_slashes = False
    app.asgi_app = _with_websocket_access_log(app.asgi_app)  # type: ignore[method-assign,assignment]

    @app.before_request
    async def _read_body() -> None:
        request.environ_started = time.monotonic()  # type: ignore[attr-defined]
        # quart-trio 0.12: a body left unread can hang the next request on the connection.
        await request.get_data(cache=True)

    @app.after_request
    async def _access(response: Response) -> Response:
        started = getattr(request, "environ_started", None)
        elapsed_ms = (time.monotonic() - started) * 1000 if started else 0.0
        query = "?<redacted>" if request.query_string else ""
        _access_log.info("%s %s%s %d %.1fms", request.method, request.path, query, response.status_code, elapsed_ms)
        return response

    @app.errorhandler(errors.ApplianceError)
    async def _appliance_error(exc: errors.ApplianceError) -> Response:
        status = status_for(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return error_body(exc.message, status, headers)

    @app.errorhandler(ValidationError)
    async def _validation_error(exc: ValidationError) -> Response:
        return error_body(f"Validation failed: {describe_validation_error(exc)}", 400, None)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        method, path = _method_and_path()
        message = {
            404: f"not found: {path}",
            405: f"method {method} not allowed on {path}",
            413: f"request body larger than {MAX_BODY_BYTES} bytes",
        }.get(status, exc.name)
        # A refused body is left unread: close the connection so the client stops sending
        # it and reads this answer (hypercorn closes when the request is not complete).
        headers = {"Connection": "close"} if status == 413 else None
        return error_body(message, status, headers)

    @app.errorhandler(Exception)
    async def _internal_error(exc: Exception) -> Response:
        _log.error("unhandled error on %s %s", *_method_and_path(), exc_info=exc)
        return error_body("internal error", 500, None)

    return app


def _method_and_path() -> tuple[str, str]:
    # The error handlers also answer WebSocket handshakes, where ``request`` is unbound.
    if has_websocket_context():
        return "GET", websocket.path
    return request.method, request.path


async def read_json_object() -> dict[str, Any]:
    """The request body as a JSON object; InvalidInput for anything else."""
    content_type = (request.mimetype or "").lower()
    if content_type != "application/json":
        raise errors.InvalidInput("Content-Type must be application/json")
    raw = await request.get_data(cache=True)
    try:
        body = load_json(raw)
    except JsonTooDeep as exc:
        raise errors.InvalidInput(str(exc)) from None
    except (ValueError, UnicodeDecodeError):
        raise errors.InvalidInput("malformed JSON body") from None
    if not isinstance(body, dict):
        raise errors.InvalidInput("the body must be a JSON object")
    return body


async def read_json(adapter: TypeAdapter[T], *, prefix: str = "") -> T:
    """Parse and validate the JSON body with ``adapter``; InvalidInput naming each JSON path."""
    body = await read_json_object()
    return validate(adapter, body, prefix=prefix)


def validate(adapter: TypeAdapter[T], data: Any, *, prefix: str = "") -> T:
    """Validate ``data``; InvalidInput (400) naming the JSON paths, never the values."""
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise errors.InvalidInput(f"Validation failed: {describe_validation_error(exc, prefix)}") from None
    except RecursionError:
        # load_json keeps bodies to 64 levels; this is the backstop for data from elsewhere.
        raise errors.InvalidInput("Validation failed: the body is nested too deeply") from None


def _with_websocket_access_log(asgi_app: _AsgiApp) -> _AsgiApp:
    """``asgi_app`` writing one access line per WebSocket connection, when it ends.

    The status is 101 once accepted, else the refusal's (an HTTP answer, or 403 for a close
    before the handshake, as hypercorn sends it). The line is written in ``finally``: a
    client that goes away cancels the connection's task.
    """

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "websocket":
            await asgi_app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500  # hypercorn's answer when the app ends without one

        async def watched_send(event: ASGISendEvent) -> None:
            nonlocal status
            if event["type"] == "websocket.accept":
                status = 101
            elif event["type"] == "websocket.http.response.start":
                status = event["status"]
            elif event["type"] == "websocket.close" and status == 500:
                status = 403  # closed before the handshake
            await send(event)

        try:
            await asgi_app(scope, receive, watched_send)
        finally:
            elapsed_ms = (time.monotonic() - started) * 1000
            query = "?<redacted>" if scope.get("query_string") else ""
            _access_log.info("WS %s%s %d %.1fms", scope.get("path", ""), query, status, elapsed_ms)

    return app


async def serve(
    app: QuartTrio,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with hypercorn on ``host:port``; reports the bound addresses when listening."""
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None  # the app writes its own, with the query redacted
    config.errorlog = _hypercorn_log  # its "Running on" line filtered out (above)
    config.keep_alive_timeout = 75
    config.graceful_timeout = 2
    if certfile and keyfile:
        config.certfile, config.keyfile = certfile, keyfile
    await hypercorn_serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)


def first_os_error(exc: BaseException) -> OSError | None:
    """The first OSError inside an exception (group), or None: why a listener could not bind."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_os_error(inner)
            if found is not None:
                return found
    return None


async def discard_client_messages(scope: trio.CancelScope) -> None:
    """Read and drop what a push-only WebSocket's client sends; cancel ``scope`` when it closes.

    Reading keeps quart's receive queue empty and is how the close is seen.
    """
    try:
        while True:
            await websocket.receive()
    finally:
        scope.cancel()
