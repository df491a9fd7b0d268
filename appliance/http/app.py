"""quart-trio application factory, request-body handling and hypercorn serving.

Every service builds its app here so the envelope, the error mapping, the body
limit and the stack workarounds live in one place:

- quart-trio 0.12 can hang the next request on a keep-alive connection when a
  handler answers without reading the request body (reproduced here), so a
  ``before_request`` hook reads every body first.
- quart's ``get_json()`` answers HTML errors, so bodies are parsed with
  ``json.loads`` and validated with pydantic (``read_json``).
- Access logs are written by the app itself so that ``?token=`` is redacted
  (interop.md 4: the WebSocket token in the query never reaches a log).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from pydantic import TypeAdapter, ValidationError
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from appliance import errors
from appliance.http.envelope import ErrorBody, describe_validation_error, fail, status_for

MAX_BODY_BYTES: Final = 1024 * 1024  # 1 MiB (interop.md 7: the manager's cap; the edge uses the same)
_log = logging.getLogger("mediaplane.http")
_access_log = logging.getLogger("mediaplane.access")

T = TypeVar("T")


def create_app(name: str, *, error_body: ErrorBody = fail) -> QuartTrio:
    """A quart-trio app with the envelope error handlers and the body workaround."""
    app = QuartTrio(name)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = True
    app.url_map.strict_slashes = False

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
        message = {
            404: f"not found: {request.path}",
            405: f"method {request.method} not allowed on {request.path}",
            413: f"request body larger than {MAX_BODY_BYTES} bytes",
        }.get(status, exc.name)
        # A refused body is left unread: close the connection so the client stops sending
        # it and reads this answer (hypercorn closes when the request is not complete).
        headers = {"Connection": "close"} if status == 413 else None
        return error_body(message, status, headers)

    @app.errorhandler(Exception)
    async def _internal_error(exc: Exception) -> Response:
        _log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
        return error_body("internal error", 500, None)

    return app


async def read_json_object() -> dict[str, Any]:
    """The request body as a JSON object; InvalidInput for anything else."""
    content_type = (request.mimetype or "").lower()
    if content_type != "application/json":
        raise errors.InvalidInput("Content-Type must be application/json")
    raw = await request.get_data(cache=True)
    try:
        body = json.loads(raw)
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
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    config.graceful_timeout = 2
    if certfile and keyfile:
        config.certfile, config.keyfile = certfile, keyfile
    await hypercorn_serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
