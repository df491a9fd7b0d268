"""IS-04 v1.3 Node API (``/x-nmos/node/v1.3/``, interop.md 5), and the ``/x-nmos/`` root.

Public routes (edge-http-interface.md 5.3): nothing here uses the API's ``guarded``. Each
request builds the resources from the service's config and running state
(``services.edge.nmos.model``) through the service's ``NmosNode`` (``services.edge.nmos.node``),
whose ``VersionTracker`` (started at boot) stamps the versions.

Every route answers with and without its trailing slash (the app has ``strict_slashes`` off and
the rules end in ``/``, so there is no redirect). Every response under ``/x-nmos/`` (the
Connection API's too) carries the CORS headers, and an error there has the NMOS body
``{code, error, debug}``: an envelope error of the app's handlers (the 404 of an unknown path,
a 405, a 413...) is rewritten, so no catch-all route shadows the Connection API's 405s.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from quart import Blueprint, Response, current_app, request

from services.edge.nmos.model import NmosResources
from services.edge.nmos.node import host_addresses, host_interfaces, primary_address

if TYPE_CHECKING:
    from services.edge.service import EdgeService

__all__ = ["bp", "error_response", "host_addresses", "host_interfaces", "nmos_resources", "primary_address"]

bp = Blueprint("nmos_node", __name__)
_View = Callable[..., Awaitable[Response]]

CORS_HEADERS: Final = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, PUT, POST, PATCH, DELETE, OPTIONS, HEAD",
    "Access-Control-Allow-Headers": "Content-Type, Accept, Authorization",
    "Access-Control-Max-Age": "3600",
}
_COLLECTIONS: Final = ("sources", "flows", "devices", "senders", "receivers")


def nmos_resources() -> NmosResources:
    """The service's IS-04 resources now, versions stamped (for this API and the IS-05 one)."""
    service: EdgeService = current_app.config["EDGE_SERVICE"]
    return service.nmos.resources()


# --------------------------------------------------------------------------- responses


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def error_response(code: int, error: str, debug: str | None = None) -> Response:
    """The NMOS error body (error.json)."""
    return _json({"code": code, "error": error, "debug": debug}, code)


@bp.after_app_request
async def _nmos_headers(response: Response) -> Response:
    if not request.path.startswith("/x-nmos"):
        return response
    for name, value in CORS_HEADERS.items():
        response.headers[name] = value
    wanted = request.headers.get("Access-Control-Request-Headers")
    if wanted:
        response.headers["Access-Control-Allow-Headers"] = f"{CORS_HEADERS['Access-Control-Allow-Headers']}, {wanted}"
    if response.status_code >= 400 and response.mimetype == "application/json":
        # The app's handlers answer with the envelope; NMOS wants {code, error, debug}.
        try:
            body = json.loads(await response.get_data())
        except ValueError:
            return response
        if isinstance(body, dict) and body.get("success") is False:
            nmos = error_response(response.status_code, str(body.get("error", "")))
            for name, value in response.headers.items():
                if name.lower() not in ("content-length", "content-type"):
                    nmos.headers[name] = value
            return nmos
    return response


# --------------------------------------------------------------------------- routes


def _get(rule: str, *, method: str = "GET") -> Callable[[_View], _View]:
    """Register ``rule`` (ending in ``/``) and its form without the slash: both answer, no
    redirect (werkzeug matches a bare form against a slashed rule for its methods, but then
    answers 404 instead of 405 to another method and an empty ``Allow`` to OPTIONS)."""

    def register(view: _View) -> _View:
        bp.add_url_rule(rule, view_func=view, methods=[method])
        bp.add_url_rule(rule.rstrip("/"), endpoint=f"{view.__name__}_bare", view_func=view, methods=[method])
        return view

    return register


@_get("/x-nmos/")
async def nmos_root() -> Response:
    return _json(["node/", "connection/"])


@_get("/x-nmos/node/")
async def node_versions() -> Response:
    return _json(["v1.3/"])


@_get("/x-nmos/node/v1.3/")
async def node_root() -> Response:
    return _json(["self/", "sources/", "flows/", "devices/", "senders/", "receivers/"])


@_get("/x-nmos/node/v1.3/self/")
async def node_self() -> Response:
    return _json(nmos_resources().node)


@_get("/x-nmos/node/v1.3/<any(sources, flows, devices, senders, receivers):kind>/")
async def collection(kind: str) -> Response:
    return _json(list(nmos_resources().by_kind[kind].values()))


@_get("/x-nmos/node/v1.3/<any(sources, flows, devices, senders, receivers):kind>/<resource_id>/")
async def resource(kind: str, resource_id: str) -> Response:
    body = nmos_resources().by_kind[kind].get(resource_id.lower())
    if body is None:
        return error_response(404, f"no {kind[:-1]} {resource_id}")
    return _json(body)


@_get("/x-nmos/node/v1.3/receivers/<resource_id>/target/", method="PUT")
async def receiver_target(resource_id: str) -> Response:
    """Deprecated in IS-04 v1.3 (IS-05 replaces it): the RAML's 501, after the 404 check."""
    if resource_id.lower() not in nmos_resources().by_kind["receivers"]:
        return error_response(404, f"no receiver {resource_id}")
    return error_response(501, "receiver target is deprecated in IS-04 v1.3: use the IS-05 Connection API")
