"""The relay's REST API and metrics (relay interface §4, §5, §7; interop.md 1.2 and 13).

Bare JSON bodies (no envelope); every error is ``{"error": "<text>"}`` and a 401 also carries
``WWW-Authenticate: Bearer``. Authorisation, in this order for every route:

1. ``GET /health`` is public, whatever token is sent (or none).
2. With ``api_token`` set, every other route needs ``Authorization: Bearer <api_token>``,
   compared in constant time (``hmac.compare_digest``); otherwise 401, before any 404 or 400.
3. Without ``api_token``, the read routes are open and the two DELETE routes answer 403
   (fail-closed), whatever token is presented.

Routes only parse, authorise, call :class:`~services.relay.service.RelayService` and wrap
(style.md H8). ``/metrics`` is built at scrape time from the same numbers as ``/api/v1/stats``
by a collector in a registry of its own.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Blueprint, Response, current_app, request
from quart.typing import ResponseReturnValue
from quart_trio import QuartTrio

from appliance import errors
from appliance.http.app import create_app
from appliance.http.envelope import bare_fail, json_response
from services.relay.service import RelayService

__all__ = ["CONTENT_TYPE", "RelayCollector", "build_app"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
P: Final = "mediaplane_relay_"
_BEARER: Final = "bearer "

bp = Blueprint("relay", __name__)


def _service() -> RelayService:
    service: RelayService = current_app.config["RELAY_SERVICE"]
    return service


def _presented_token() -> str | None:
    header = request.headers.get("Authorization", "")
    if header[: len(_BEARER)].lower() != _BEARER:
        return None
    return header[len(_BEARER) :].strip()


def _token_matches() -> bool:
    """Whether the request carries the configured token (constant-time; relay interface §5.2)."""
    configured = _service().config.api_token
    if configured is None:
        return True
    presented = _presented_token()
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), configured.get_secret_value().encode("utf-8"))


def _require_reader() -> None:
    """Read routes: a Bearer token when ``api_token`` is set (§5.2, §5.3)."""
    if not _token_matches():
        raise errors.AuthRequired("a valid bearer token is required")


def _require_admin() -> None:
    """DELETE routes: fail-closed 403 without ``api_token`` (§5.4); 401 before any 404 (13)."""
    if _service().config.api_token is None:
        raise errors.NotAllowed("administrative routes are disabled: no api_token is configured")
    _require_reader()


@bp.get("/health")
async def health() -> ResponseReturnValue:
    """The Health object; public whatever token is sent (interop.md 13)."""
    return json_response(_service().health())


@bp.get("/metrics")
async def metrics() -> ResponseReturnValue:
    """Prometheus exposition text (relay interface §4, interop.md 1.2 extras)."""
    _require_reader()
    registry: CollectorRegistry = current_app.config["RELAY_METRICS"]
    return Response(generate_latest(registry), status=200, content_type=CONTENT_TYPE)


@bp.get("/api/v1/stats")
async def stats() -> ResponseReturnValue:
    """The Stats object."""
    _require_reader()
    return json_response(_service().stats())


@bp.get("/api/v1/tunnels")
async def tunnels() -> ResponseReturnValue:
    """``{tunnels: [<tunnel entry>]}``."""
    _require_reader()
    return json_response({"tunnels": _service().tunnel_list()})


@bp.get("/api/v1/edges")
async def edges() -> ResponseReturnValue:
    """``{edges: [<edge entry>]}``."""
    _require_reader()
    return json_response({"edges": _service().edge_list()})


@bp.get("/api/v1/udp-sessions")
async def udp_sessions() -> ResponseReturnValue:
    """``{sessions: [<UDP session entry>]}``."""
    _require_reader()
    return json_response({"sessions": _service().session_list()})


@bp.delete("/api/v1/tunnels/<tunnel_id>")
async def delete_tunnel(tunnel_id: str) -> ResponseReturnValue:
    """Revoke the tunnel's bind authorization and force-remove its live entry (§3)."""
    _require_admin()
    deleted = _service().delete_tunnel(tunnel_id)
    return json_response({"status": "deleted", "id": deleted})


@bp.delete("/api/v1/udp-sessions/<tunnel_id>")
async def delete_udp_session(tunnel_id: str) -> ResponseReturnValue:
    """Remove a native UDP session (§3)."""
    _require_admin()
    deleted = _service().delete_udp_session(tunnel_id)
    return json_response({"status": "deleted", "id": deleted})


class RelayCollector(Collector):
    """Every ``mediaplane_relay_*`` family, read from the service at scrape time."""

    def __init__(self, service: RelayService) -> None:
        self._service = service

    def collect(self) -> Iterable[Metric]:
        service = self._service
        stats = service.stats()
        health = service.health()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(P + name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(P + name, doc, value=value)

        yield gauge("uptime_seconds", "Seconds since the relay started", stats["uptime_secs"])
        yield gauge("edges_connected", "Edges with a live QUIC connection", stats["connected_edges"])
        yield gauge("tunnels_active", "Tunnels with both legs bound", stats["active_tunnels"])
        # A gauge despite the suffix: the tunnels that exist now, half-bound included (interop.md 13).
        yield gauge("tunnels_total", "Tunnels that exist now, half-bound included", stats["total_tunnels"])
        yield counter(
            "bytes_ingress_total", "Payload bytes from ingress legs (QUIC and native UDP)", stats["total_bytes_ingress"]
        )
        yield counter(
            "bytes_egress_total", "Payload bytes from egress legs (QUIC and native UDP)", stats["total_bytes_egress"]
        )
        yield counter(
            "bytes_forwarded_total", "Payload bytes forwarded, both directions", stats["total_bytes_forwarded"]
        )
        yield gauge("peak_tunnels", "Most tunnels at once since start", stats["peak_tunnels"])
        yield gauge("peak_edges", "Most connected edges at once since start", stats["peak_edges"])
        yield gauge("udp_sessions_active", "Native UDP sessions with both sides latched", health["udp_sessions_active"])
        yield counter(
            "udp_datagrams_forwarded_total",
            "Datagrams forwarded by the native UDP plane, both directions",
            service.plane.counters.datagrams_forwarded,
        )
        yield gauge(
            "manager_connected",
            "1 once authenticated with the manager, else 0",
            1 if service.manager_connected() else 0,
        )


def build_app(service: RelayService) -> QuartTrio:
    """The relay's quart-trio app around a service (bare ``{"error"}`` bodies)."""
    app = create_app("mediaplane-relay", error_body=bare_fail)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(service))
    app.config["RELAY_SERVICE"] = service
    app.config["RELAY_METRICS"] = registry
    app.register_blueprint(bp)
    return app
