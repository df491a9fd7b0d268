"""The edge REST API, WebSocket stream, metrics and setup routes (edge interface §4).

Routes parse, authorise, call the service, and wrap the result in the envelope
(style H8); every rule lives in ``EdgeService``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from functools import wraps
from importlib import resources
from typing import Any, Literal, ParamSpec, TypeVar

import trio
from pydantic import TypeAdapter
from quart import Blueprint, Response, current_app, request, websocket

from appliance import auth, errors
from appliance.config.store import fill_kept_secrets
from appliance.http.app import discard_client_messages, read_json, read_json_object, validate
from appliance.http.envelope import fail, json_response, ok
from appliance.models.config import AppConfig, FlowConfig, OutputConfig
from appliance.models.stats import HealthStatus, StatsSnapshot
from services.edge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from services.edge.service import EdgeService

P = ParamSpec("P")
R = TypeVar("R")

bp = Blueprint("edge", __name__)
_FLOW = TypeAdapter(FlowConfig)
_OUTPUT = TypeAdapter[OutputConfig](OutputConfig)
_APP_CONFIG = TypeAdapter(AppConfig)
_rate_limiter = auth.TokenRateLimiter()


def edge() -> EdgeService:
    service: EdgeService = current_app.config["EDGE_SERVICE"]
    return service


def _authorise(role: Literal["any", "admin"], headers: Any, query_token: str | None = None) -> None:
    settings = edge().config.auth
    if settings is None:
        return  # auth off: every route is open (interop.md 2.1)
    header = headers.get("Authorization")
    token = auth.bearer_token(header) if header else query_token
    principal = auth.verify_token(settings, token, int(time.time()))
    auth.require_role(principal, role)


def guarded(role: Literal["any", "admin"]) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Require a valid token (any role, or admin) when auth is enabled."""

    def decorate(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @wraps(handler)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            _authorise(role, request.headers)
            return await handler(*args, **kwargs)

        return wrapper

    return decorate


# --------------------------------------------------------------------------- public


@bp.get("/health")
async def health() -> Response:
    """Liveness and a one-line summary (bare body, no envelope)."""
    service = edge()
    body = HealthStatus(
        version=service.version,
        uptime_secs=service.uptime_secs(),
        active_flows=service.active_flows(),
        total_flows=len(service.config.flows),
    )
    return json_response(body)


@bp.post("/oauth/token")
async def token() -> Response:
    """OAuth 2.0 client credentials (RFC 6749 §4.4): the bare token response."""
    service = edge()
    settings = service.config.server.auth
    client_ip = request.remote_addr or ""
    if settings is not None and settings.enabled:
        _rate_limiter.check(client_ip, settings.token_rate_limit_per_minute, trio.current_time())
    body = await request.get_data(cache=True, as_text=False)
    token_request = auth.parse_token_request(
        request.headers.get("Content-Type", ""),
        body if isinstance(body, bytes) else body.encode(),
        request.headers.get("Authorization"),
    )
    return json_response(auth.issue_token(settings, token_request, int(time.time())))


@bp.get("/metrics")
async def metrics() -> Response:
    """Prometheus text exposition 0.0.4; public unless ``public_metrics`` is false."""
    settings = edge().config.auth
    if settings is not None and not settings.public_metrics:
        _authorise("any", request.headers)
    body = current_app.config["EDGE_METRICS"].render()
    return Response(body, status=200, content_type=METRICS_CONTENT_TYPE)


# --------------------------------------------------------------------------- setup wizard (interop.md 3)


@bp.get("/setup")
async def setup_page() -> Response:
    """The first-boot wizard: a form while setup is enabled, a notice otherwise."""
    name = "page.html" if edge().config.setup_enabled else "disabled.html"
    html = resources.files("services.edge.setup").joinpath(name).read_text(encoding="utf-8")
    return Response(html, status=200, content_type="text/html; charset=utf-8")


@bp.get("/setup/status")
async def setup_status() -> Response:
    """The setup form's current values (bare body); ``registration_token`` is always null."""
    return json_response(edge().setup_status())


@bp.get("/setup/managed")
async def setup_managed() -> Response:
    """Whether the node is managed, for the "setup disabled" page (bare body; beyond the spec).

    Public like the other setup routes, so the page can read it without a token; it holds
    nothing secret: whether the node holds a node id and secret, the manager URL (which
    ``/setup/status`` shows too), the node id and the link's state.
    """
    link = edge().manager_link.status()
    return json_response(
        {
            "managed": link.registered,
            "manager_url": link.manager_url,
            "node_id": link.node_id,
            "state": link.state.value,
        }
    )


@bp.post("/setup")
async def setup_save() -> Response:
    """Save the wizard's settings; effective after a restart."""
    service = edge()
    if not service.config.setup_enabled:
        return fail("Setup wizard is disabled on this node", 403)
    body = await read_json_object()
    await service.save_setup(body)
    return json_response(
        {"success": True, "message": "Configuration saved. Restart mp-edge to apply the new settings."}
    )


@bp.get("/setup/runtime")
async def setup_runtime() -> Response:
    """What is in force in this process (bare body; beyond the spec, docs/edge.md): the address
    and port the API listens on, how to restart, ``allow_insecure``, the saved fingerprint."""
    return json_response(edge().setup_runtime())


@bp.post("/setup/restart")
async def setup_restart() -> Response:
    """The wizard's "Restart now" (beyond the spec, docs/edge.md): 202, then mp-edge stops and
    exits 75 for systemd to start it again. Public like ``POST /setup`` and only while it is
    allowed (403 otherwise); the body is ``{}`` as JSON, so a cross-site form cannot send it;
    409 when not under systemd (nothing would start it again)."""
    service = edge()
    if not service.config.setup_enabled:
        return fail("Setup wizard is disabled on this node", 403)
    body = await read_json_object()
    if body:
        raise errors.InvalidInput(f"unknown key: {sorted(body)[0]}")
    service.request_restart()
    return json_response(
        {"success": True, "message": "Restarting mp-edge: it stops now and systemd starts it again in a few seconds."},
        202,
    )


# --------------------------------------------------------------------------- flows


@bp.get("/api/v1/flows")
@guarded("any")
async def list_flows() -> Response:
    """Flow summaries."""
    flows = [
        {
            "id": f.id,
            "name": f.name,
            "enabled": f.enabled,
            "input_type": f.input.type,
            "output_count": len(f.outputs),
        }
        for f in edge().config.flows
    ]
    return ok({"flows": flows})


@bp.get("/api/v1/flows/<flow_id>")
@guarded("any")
async def get_flow(flow_id: str) -> Response:
    """One FlowConfig."""
    return ok(edge().flow(flow_id))


@bp.post("/api/v1/flows")
@guarded("admin")
async def create_flow() -> Response:
    """Validate, persist and (when enabled) start a flow."""
    flow = await read_json(_FLOW)
    return ok(await edge().create_flow(flow))


@bp.put("/api/v1/flows/<flow_id>")
@guarded("admin")
async def update_flow(flow_id: str) -> Response:
    """Replace a flow; the path id wins over the body's."""
    body = await read_json_object()
    body["id"] = flow_id
    flow = validate(_FLOW, body)
    return ok(await edge().update_flow(flow_id, flow))


@bp.delete("/api/v1/flows/<flow_id>")
@guarded("admin")
async def delete_flow(flow_id: str) -> Response:
    """Stop (if running) and remove a flow."""
    await edge().delete_flow(flow_id)
    return ok(None)


@bp.post("/api/v1/flows/<flow_id>/start")
@guarded("admin")
async def start_flow(flow_id: str) -> Response:
    await edge().start_flow(flow_id)
    return ok(None)


@bp.post("/api/v1/flows/<flow_id>/stop")
@guarded("admin")
async def stop_flow(flow_id: str) -> Response:
    await edge().stop_flow(flow_id)
    return ok(None)


@bp.post("/api/v1/flows/<flow_id>/restart")
@guarded("admin")
async def restart_flow(flow_id: str) -> Response:
    await edge().restart_flow(flow_id)
    return ok(None)


@bp.post("/api/v1/flows/<flow_id>/outputs")
@guarded("admin")
async def add_output(flow_id: str) -> Response:
    """Hot-add an output (the flow keeps running)."""
    edge().flow(flow_id)  # 404 before validating the body
    output = await read_json(_OUTPUT)
    return ok(await edge().add_output(flow_id, output))


@bp.delete("/api/v1/flows/<flow_id>/outputs/<output_id>")
@guarded("admin")
async def remove_output(flow_id: str, output_id: str) -> Response:
    """Hot-remove an output, then remove it from the config."""
    await edge().remove_output(flow_id, output_id)
    return ok(None)


# --------------------------------------------------------------------------- stats and config


@bp.get("/api/v1/stats")
@guarded("any")
async def stats() -> Response:
    """System stats and every configured flow's statistics."""
    return ok(edge().snapshot())


@bp.get("/api/v1/stats/<flow_id>")
@guarded("any")
async def flow_stats(flow_id: str) -> Response:
    service = edge()
    flow = service.flow(flow_id)
    return ok(service.stats.flow_stats(flow, trio.current_time()))


@bp.get("/api/v1/config")
@guarded("any")
async def get_config() -> Response:
    """The configuration with infrastructure secrets removed."""
    return ok(edge().public_config())


@bp.put("/api/v1/config")
@guarded("admin")
async def put_config() -> Response:
    """Replace the whole configuration (omitted secrets are kept)."""
    service = edge()
    # interop.md 2.7: secrets the client was never shown are filled in before validation,
    # so an echoed GET body with a relay tunnel (whose key is required) validates.
    body = fill_kept_secrets(await read_json_object(), service.config)
    return ok(await service.replace_config(validate(_APP_CONFIG, body)))


@bp.post("/api/v1/config/reload")
@guarded("admin")
async def reload_config() -> Response:
    """Re-read config.json and secrets.json and apply them."""
    return ok(await edge().reload_config())


@bp.get("/api/v1/manager")
@guarded("any")
async def manager_link() -> Response:
    """The manager link's state (beyond the spec, issue 14): disabled, connecting, registering,
    authenticating, connected (since when) or waiting, the last error, node id, manager URL."""
    return ok(edge().manager_link.status())


@bp.get("/api/v1/system/diagnostics")
@guarded("any")
async def diagnostics() -> Response:
    """The appliance tuning as the kernel reports it (sysctl values, NIC settings) and the engine
    workers' load (``engine.workers``: index, pid, alive, flows, pps, cpu, tick_ms); bare body."""
    from services.edge import diagnostics as diag

    report = await trio.to_thread.run_sync(diag.collect)
    report["engine"] = {"workers": edge().engine.worker_loads()}
    return json_response(report)


# --------------------------------------------------------------------------- events (an extension)

_EVENTS_LIMIT_MAX = 1000
_QUERY_INT_DIGITS = 18


def _query_int(name: str, default: int, low: int, high: int, rule: str) -> int:
    """A query parameter of decimal digits within [low, high]; InvalidInput naming the rule, never the value."""
    text = request.args.get(name)
    if text is None:
        return default
    # ASCII digits only: int() would also take "+1", " 1", "1_000" and other scripts' digits.
    if not (0 < len(text) <= _QUERY_INT_DIGITS and text.isascii() and text.isdigit()):
        raise errors.InvalidInput(f"{name} must be {rule}")
    value = int(text)
    if not low <= value <= high:
        raise errors.InvalidInput(f"{name} must be {rule}")
    return value


@bp.get("/api/v1/events")
@guarded("any")
async def events() -> Response:
    """The kept events with an id above ``since`` (default 0), oldest first, at most ``limit`` (1-1000).

    An extension beyond the interface: ``{"events": [...], "last_id": n}``. A
    client polls with ``since`` set to the last id it saw; ``last_id`` lower than
    that means the edge restarted (ids start again at 1).
    """
    since = _query_int("since", 0, 0, 10**_QUERY_INT_DIGITS - 1, "a non-negative integer")
    limit = _query_int("limit", _EVENTS_LIMIT_MAX, 1, _EVENTS_LIMIT_MAX, f"an integer from 1 to {_EVENTS_LIMIT_MAX}")
    bus = edge().events
    return ok({"events": bus.since(since, limit), "last_id": bus.last_id})


# --------------------------------------------------------------------------- WebSocket stats


class LatestSnapshot:
    """A one-slot mailbox: a newer snapshot replaces an unsent one (slow clients skip)."""

    def __init__(self) -> None:
        self._value: StatsSnapshot | None = None
        self._event = trio.Event()

    def put(self, value: StatsSnapshot) -> None:
        self._value = value
        self._event.set()

    async def take(self) -> StatsSnapshot:
        await self._event.wait()
        self._event = trio.Event()
        value, self._value = self._value, None
        assert value is not None
        return value


@bp.websocket("/api/v1/ws/stats")
async def ws_stats() -> Response | None:
    """Push a JSON array of flow statistics about every second (interop.md 4: ?token= or Bearer)."""
    try:
        _authorise("any", websocket.headers, websocket.args.get("token"))
    except errors.ApplianceError as exc:
        status = 401 if isinstance(exc, errors.AuthRequired) else 403
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return fail(exc.message, status, headers)
    await websocket.accept()
    service = edge()
    mailbox = LatestSnapshot()
    service.snapshot_listeners.append(mailbox.put)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(discard_client_messages, nursery.cancel_scope)
            mailbox.put(service.snapshot())  # the first frame at once
            while True:
                snapshot = await mailbox.take()
                frame = json.dumps([f.model_dump(mode="json") for f in snapshot.flows], separators=(",", ":"))
                await websocket.send(frame)
    finally:
        service.snapshot_listeners.remove(mailbox.put)
    return None


# --------------------------------------------------------------------------- tunnels (bare bodies)

# Nested here so the app registers one blueprint; imported last because it takes ``edge`` and
# ``guarded`` from this module.
from services.edge.api.tunnels import bp as _tunnels_bp  # noqa: E402

bp.register_blueprint(_tunnels_bp)

from services.edge.api.webrtc import bp as _webrtc_bp  # noqa: E402

bp.register_blueprint(_webrtc_bp)
