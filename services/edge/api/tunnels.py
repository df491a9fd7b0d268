"""The tunnel routes (edge interface §4, "Tunnel routes"): bare bodies, no envelope.

- ``GET /api/v1/tunnels``: 200 ``{tunnels: [<tunnel summary>]}``;
- ``GET /api/v1/tunnels/{id}``: 200 the summary; 404 ``{error}``;
- ``POST /api/v1/tunnels``: the body is a TunnelConfig; 201 ``{status: "created"}``; 400, 409;
- ``DELETE /api/v1/tunnels/{id}``: 200 ``{status: "deleted"}``; 404.

Errors are ``{error: <text>}`` (edge interface §7): this blueprint declares that once, with
its own handlers. A token is needed only when auth is enabled (§5 rule 4): any role to read,
admin to change. A summary never holds a secret, and validation errors name fields, never
values (``describe_validation_error``), so a rejected key is not echoed back.

The blueprint is nested in ``services.edge.api.routes.bp`` (registered there).
"""

from __future__ import annotations

import logging
from typing import Final

from pydantic import TypeAdapter, ValidationError
from quart import Blueprint, Response
from werkzeug.exceptions import HTTPException

from appliance import errors
from appliance.http.app import read_json
from appliance.http.envelope import bare_fail, describe_validation_error, json_response, status_for
from appliance.models.config import TunnelConfig
from services.edge.api.routes import edge, guarded

bp = Blueprint("tunnels", __name__)
_TUNNEL: Final = TypeAdapter(TunnelConfig)
_log = logging.getLogger("mediaplane.http")


@bp.errorhandler(errors.ApplianceError)
async def _appliance_error(exc: errors.ApplianceError) -> Response:
    status = status_for(exc)
    return bare_fail(exc.message, status, {"WWW-Authenticate": "Bearer"} if status == 401 else None)


@bp.errorhandler(ValidationError)
async def _validation_error(exc: ValidationError) -> Response:
    return bare_fail(f"Validation failed: {describe_validation_error(exc)}", 400)


@bp.errorhandler(HTTPException)
async def _http_error(exc: HTTPException) -> Response:
    return bare_fail(exc.name, exc.code or 500)


@bp.errorhandler(Exception)
async def _internal_error(exc: Exception) -> Response:
    _log.error("unhandled error on a tunnel route", exc_info=exc)
    return bare_fail("internal error", 500)


@bp.get("/api/v1/tunnels")
@guarded("any")
async def list_tunnels() -> Response:
    """Every tunnel's summary: id, name, protocol, mode, direction, state, local_addr, relay_addr."""
    return json_response({"tunnels": edge().tunnels()})


@bp.get("/api/v1/tunnels/<tunnel_id>")
@guarded("any")
async def get_tunnel(tunnel_id: str) -> Response:
    """One tunnel's summary."""
    return json_response(edge().tunnel(tunnel_id))


@bp.post("/api/v1/tunnels")
@guarded("admin")
async def create_tunnel() -> Response:
    """Validate, persist (secrets to secrets.json) and, when enabled, start a tunnel."""
    tunnel = await read_json(_TUNNEL)
    await edge().create_tunnel(tunnel)
    return json_response({"status": "created"}, 201)


@bp.delete("/api/v1/tunnels/<tunnel_id>")
@guarded("admin")
async def delete_tunnel(tunnel_id: str) -> Response:
    """Stop (if running) and remove a tunnel, with its secrets."""
    await edge().delete_tunnel(tunnel_id)
    return json_response({"status": "deleted"})
