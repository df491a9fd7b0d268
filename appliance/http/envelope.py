"""The response envelope and the one table that maps error kinds to HTTP status.

Success is ``{"success": true, "data": <payload>}``; failure is
``{"success": false, "error": "<text>"}`` with no ``data`` (edge interface §1).
Routes that use bare bodies (the token route, the tunnel routes) say so once,
through ``error_body``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel, ValidationError
from quart import Response

from appliance import errors
from appliance.models.kinds import UNION_TAGS
from appliance.untrusted import error_message

STATUS_BY_KIND: Final[tuple[tuple[type[errors.ApplianceError], int], ...]] = (
    (errors.InvalidInput, 400),
    (errors.AuthRequired, 401),
    (errors.NotAllowed, 403),
    (errors.NotFound, 404),
    (errors.Conflict, 409),
    (errors.PayloadTooLarge, 413),
    (errors.UnsupportedMediaType, 415),
    (errors.Unprocessable, 422),
    (errors.RateLimited, 429),
    (errors.Internal, 500),
    (errors.ConfigFileError, 500),
    (errors.BadGateway, 502),
    (errors.ServiceUnavailable, 503),
    (errors.GatewayTimeout, 504),
)


def status_for(exc: errors.ApplianceError) -> int:
    """The HTTP status of an error kind (500 for an unmapped kind)."""
    for kind, status in STATUS_BY_KIND:
        if isinstance(exc, kind):
            return status
    return 500


def _to_jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [_to_jsonable(item) for item in data]
    if isinstance(data, dict):
        return {key: _to_jsonable(value) for key, value in data.items()}
    return data


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON response of any body (pydantic models are dumped in JSON mode)."""
    text = json.dumps(_to_jsonable(body), separators=(",", ":"))
    response = Response(text, status=status, content_type="application/json")
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def ok(data: Any = None, status: int = 200) -> Response:
    """``{"success": true, "data": data}``."""
    return json_response({"success": True, "data": _to_jsonable(data)}, status)


def fail(message: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    """``{"success": false, "error": message}``."""
    return json_response({"success": False, "error": message}, status, headers)


def bare_fail(message: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    """``{"error": message}``: the error body of bare-body routes (tunnels, relay)."""
    return json_response({"error": message}, status, headers)


ErrorBody = Callable[[str, int, Mapping[str, str] | None], Response]


def validation_problems(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """Each pydantic error as ``(JSON path, message)``.

    Built from ``exc.errors(include_input=False)``, each message worded by
    ``appliance.untrusted.error_message``, which keeps a limit but never tells a rejected
    value or its length: never ``str(exc)``, which echoes the input values, secrets included.
    """
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = [str(p) for p in error.get("loc", ()) if not _is_union_tag(p)]
        path = ".".join(([prefix] if prefix else []) + loc) or "body"
        message = "unknown key" if error.get("type") == "extra_forbidden" else error_message(error)
        problems.append((path, message))
    return problems


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """A one-line description of a pydantic error naming each JSON path (the first five of
    :func:`validation_problems`)."""
    parts = [f"{path}: {message}" for path, message in validation_problems(exc, prefix)[:5]]
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _is_union_tag(part: object) -> bool:
    # Discriminated unions put the tag ("rtp", "srt"...) in the location; the
    # user's JSON path does not contain it.
    return isinstance(part, str) and part in UNION_TAGS
